"""Call a graph compiled by ``torch._inductor.standalone_compile`` through Inductor's
generated host function, without AOT autograd's runtime wrappers around it.

The in-place NUTS chunk and the in-place SVI block are short calls made thousands of times
with the same buffers. What ``standalone_compile`` returns runs each call through several
Python layers before Inductor's generated ``call(args)``: the compiled artifact, Dynamo's
disable wrapper, AOT autograd's runtime wrapper (grad mode, version counters of mutated
inputs, output handling) and the prepending of the graph module's lifted constants. For
these graphs (no input needs a gradient, mutations happen inside the generated code, the
outputs are fresh tensors) none of that changes what is computed; on eight schools' NUTS
chunk (4 chains, one core) it was 16 of 59 us per call.

:func:`direct_call` binds the generated ``call`` to the constants AOT autograd prepends (the
graph module's parameters, then its buffers) and accepts it only after one call on copies
of the inputs, from the same random state, gives bit for bit the outputs and written inputs
that the compiled artifact gives; otherwise (another layout of wrappers in a later torch,
a non-CPU device, ``PROBTORCH_DIRECT_CALL=0``) callers keep the artifact.

With its buffers pooled (:class:`BufferPool`, :class:`ViewPool`) the generated ``call``
does the same thing on every call but for its inputs and what library calls return, so the
NUTS chunk goes one step further: :class:`CallTape` records one call as the kernel and
library calls it makes, and :func:`replay_call` accepts replaying them (without the
generated Python) after a replay gave bit for bit what the generated code gives.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from . import call_program, matvec_op, potential_hole  # noqa: F401  (define probtorch ops)

__all__ = [
    "BufferPool",
    "CallTape",
    "ViewPool",
    "compile_graph",
    "compiled_call",
    "load_graph",
    "direct_call",
    "generated_module",
    "replay_call",
]

_FALSE = {"0", "false", "no", "off"}
_SAME_SIZE_INT = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def generated_module(modules) -> object | None:
    """The one Inductor-generated host module (it has a ``call``) among ``modules`` (those a
    compile loaded), or None."""
    found = [m for m in modules if callable(getattr(m, "call", None))]
    return found[0] if len(found) == 1 else None


def lifted_constants(gm: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors AOT autograd passes before a graph module's inputs: its parameters,
    then its buffers, duplicates kept."""
    return [
        *dict(gm.named_parameters(remove_duplicate=False)).values(),
        *dict(gm.named_buffers(remove_duplicate=False)).values(),
    ]


def _nothing() -> None:
    pass


def _graph_fakes(gm: torch.fx.GraphModule) -> list:
    """The fake inputs of ``gm`` (traced with symbolic sizes), for ``standalone_compile``'s
    ``"from_graph"``: compiled on them, in the trace's fake mode, every size keeps its
    trace's symbol and every guard the compile adds (Inductor's choices by size: "fewer
    than 32 chains", say) lands in the trace's ``ShapeEnv``, where a kept graph's guards
    are read from (:func:`probtorch.inference.mcmc.sampler_cache.save`). Given real
    inputs, the compile would make sizes of its own in a ``ShapeEnv`` of its own, and give
    sizes that happen to be equal one symbol. ``standalone_compile`` finds the trace's
    fake mode from the outputs' ``example_value``, which ``make_fx`` does not set."""
    output = next(iter(reversed(gm.graph.nodes)))
    outputs = output.args[0]
    for node in [outputs] if isinstance(outputs, torch.fx.Node) else outputs:
        if isinstance(node, torch.fx.Node) and "val" in node.meta:
            node.meta.setdefault("example_value", node.meta["val"])
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


def compile_graph(
    gm: torch.fx.GraphModule,
    example: list,
    options: dict,
    written: Sequence[int],
    pool_buffers: bool = False,
    replay: bool = False,
    dynamic_shapes: str = "from_example_inputs",
    on_compiled: Callable[[object], None] | None = None,
) -> tuple[Callable[[list], object], BufferPool | None]:
    """``gm`` compiled by ``torch._inductor.standalone_compile`` for ``example`` (its
    ``options`` passed on), as a function of its inputs list that calls the generated code
    directly where :func:`direct_call` accepts it, and the pool of its intermediate buffers
    (``pool_buffers``; None otherwise or where the generated module has none: then
    :meth:`BufferPool.start` need not run). ``written``: the input positions the graph
    writes. With ``replay`` (and ``pool_buffers``) the function has a ``bind(inputs)``
    method where :func:`replay_call` accepts a :class:`CallTape` of the call: it returns a
    function of no arguments for repeated calls on the same inputs list, which need no
    :meth:`BufferPool.start`. ``dynamic_shapes``: ``standalone_compile``'s (``"from_graph"``
    for a graph traced with symbolic sizes). ``on_compiled``: called with the compiled
    artifact (to save it, say)."""
    from torch._inductor.codecache import PyCodeCache

    from .combined_kernels import combined_cpp_kernels
    from .compile import note_direct_compile

    loaded = len(PyCodeCache.modules)
    inputs = _graph_fakes(gm) if dynamic_shapes == "from_graph" else example
    with combined_cpp_kernels():
        compiled = torch._inductor.standalone_compile(
            gm, inputs, dynamic_shapes=dynamic_shapes, options=options
        )
    note_direct_compile()
    if on_compiled is not None:
        on_compiled(compiled)
    module = generated_module(PyCodeCache.modules[loaded:])
    return compiled_call(compiled, gm, module, example, written, pool_buffers, replay)


def load_graph(
    load: Callable[[], tuple[Callable, torch.nn.Module] | None],
    example: list,
    written: Sequence[int],
    pool_buffers: bool = False,
    replay: bool = False,
    *,
    config_patches: dict,
) -> tuple[Callable[[list], object], BufferPool | None] | None:
    """:func:`compile_graph` for an artifact compiled earlier: ``load()`` returns it and a
    module holding its lifted constants (or None: nothing to load). ``config_patches``:
    the Inductor options it was compiled with. Loading builds (or finds) its C++ kernels,
    and Inductor derives their compiler flags, hence their cache keys, from the options in
    force: a graph compiled as scalar code (``cpp.simdlen=1``) and loaded with Inductor's
    defaults had its kernels compiled again with AVX-512 flags (and a precompiled header for
    them): eight schools' whole run on a kept graph took 13.2 s that way, 3.6-3.9 s now."""
    from torch._inductor import config as inductor_config
    from torch._inductor.codecache import PyCodeCache

    from .combined_kernels import combined_cpp_kernels

    loaded = len(PyCodeCache.modules)
    with combined_cpp_kernels(), inductor_config.patch(config_patches):
        found = load()
    if found is None:
        return None
    compiled, constants = found
    module = generated_module(PyCodeCache.modules[loaded:])
    return compiled_call(compiled, constants, module, example, written, pool_buffers, replay)


def compiled_call(
    compiled: Callable,
    gm: torch.nn.Module,
    module,
    example: list,
    written: Sequence[int],
    pool_buffers: bool = False,
    replay: bool = False,
) -> tuple[Callable[[list], object], BufferPool | None]:
    """What :func:`compile_graph` returns, for ``compiled`` (of ``gm``, whose generated
    host module is ``module``)."""
    pool = BufferPool.attach(module) if pool_buffers else None
    before_call = pool.start if pool is not None else _nothing
    direct = direct_call(compiled, gm, module, example, written, before_call=before_call)
    if direct is not None and replay and pool is not None:
        constants = lifted_constants(gm)
        tape = replay_call(direct, module, constants, example, written, before_call)
        if tape is not None:
            direct.bind = tape.bind

    def through_artifact(inputs: list):
        return compiled(*inputs)

    return direct or through_artifact, pool


def direct_call(
    compiled: Callable,
    gm: torch.nn.Module,
    module,
    inputs: Sequence,
    written: Sequence[int],
    before_call: Callable[[], None] = _nothing,
) -> Callable[[list], object] | None:
    """``compiled`` (a ``standalone_compile`` of ``gm``) as a function of its inputs list
    that calls the generated ``module.call`` directly, or None where that cannot be shown to
    compute the same.

    The check calls both once on copies of ``inputs`` (``written``: the positions the graph
    writes; the others are shared), each after ``before_call`` and from the same CPU random
    state, which is restored afterwards; outputs and written inputs must agree bit for bit.

    Example::

        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> from torch._inductor.codecache import PyCodeCache
        >>> def double_in_place(x):
        ...     x.mul_(2)
        ...     return (x.sum(),)
        >>> x = torch.ones(3)
        >>> gm = make_fx(double_in_place)(x.clone())
        >>> loaded = len(PyCodeCache.modules)
        >>> compiled = torch._inductor.standalone_compile(
        ...     gm, [x], dynamic_shapes="from_example_inputs")
        >>> call = direct_call(compiled, gm, generated_module(PyCodeCache.modules[loaded:]),
        ...                    [x], written=[0])
        >>> call([x])[0], x
        (tensor(6.), tensor([2., 2., 2.]))
    """
    if module is None or os.environ.get("PROBTORCH_DIRECT_CALL", "1").strip().lower() in _FALSE:
        return None
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in inputs):
        return None  # the check below forks the CPU random state only
    call = module.call
    constants = lifted_constants(gm)

    def copies() -> list:
        out = list(inputs)
        for i in written:
            out[i] = inputs[i].clone()
        return out

    expected_inputs, got_inputs = copies(), copies()
    try:
        with torch.random.fork_rng(devices=[]):
            rng = torch.get_rng_state()
            before_call()
            expected = compiled(*expected_inputs)
            torch.set_rng_state(rng)
            before_call()
            got = call([*constants, *got_inputs])
    except Exception:  # noqa: BLE001 - the wrappers pass other arguments: keep them
        return None
    same = _bitwise_equal(expected, got) and all(
        _bitwise_equal(expected_inputs[i], got_inputs[i]) for i in written
    )
    if not same:
        return None

    def run(args: list):
        return call([*constants, *args])

    return run


def _bitwise_equal(a, b) -> bool:
    """Equal structure and tensors equal bit for bit (NaNs included)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() and a.element_size() in _SAME_SIZE_INT:
            integer = _SAME_SIZE_INT[a.element_size()]
            a, b = a.view(integer), b.view(integer)
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_bitwise_equal(x, y) for x, y in zip(a, b))
    return a == b


def _handout(next_buffer):
    def empty_strided_cpu(size, stride, dtype):
        return next_buffer()

    return empty_strided_cpu


class ViewPool:
    """Give each ``reinterpret_tensor`` call site of an Inductor-generated ``call`` the same
    view object while its base tensor, size, stride and offset are the same.

    The generated code makes its views of buffers and inputs anew on each call (17 on
    the 100-dimensional Gaussian's NUTS chunk, about 1 us each); with pooled buffers and
    the loop's fixed inputs they are the same views every call: 119 -> 96 us per call
    there, 32 -> 23 us on eight schools (one core, this session's slower machine).
    ``call`` is straight-line code, so views are kept by their position in the call
    (:meth:`start` before each call) and handed out again only for the same base object,
    size, stride and offset. The generated code passes views to kernels and to library
    calls as arguments of their exact shape and never changes their metadata in place.
    """

    def __init__(self, module):
        self._make = module.reinterpret_tensor
        self._views: list[tuple] = []  # per position: (base, size, stride, offset, view)
        self._position = 0
        module.reinterpret_tensor = self

    def start(self) -> None:
        self._position = 0

    def __call__(self, base, size, stride, offset):
        k = self._position
        self._position = k + 1
        if k < len(self._views):
            old = self._views[k]
            if old[0] is base and old[1] == size and old[2] == stride and old[3] == offset:
                return old[4]
        view = self._make(base, size, stride, offset)
        entry = (base, size, stride, offset, view)
        if k < len(self._views):
            self._views[k] = entry
        else:
            self._views.append(entry)
        return view


class BufferPool:
    """Give each allocation site of an Inductor-generated ``call`` the same buffer on every
    call, instead of a new one.

    Inductor's host code for a CPU graph allocates (and frees) every intermediate buffer on
    each call, 63 of them in eight schools' NUTS chunk: with the pool a call takes 21.5
    instead of 44 us there (hier_reg 52 instead of 77 us), around a 4 us kernel. ``call``
    is straight-line code, so the k-th allocation of a call always asks for the same size,
    stride and dtype: the pool records the buffers of the first call, checks that the second
    asks for the same ones (any difference turns it off for good: fresh buffers from then
    on), and from the third on hands them out in order. Inductor's buffers are
    uninitialized memory either way, and buffers it reuses within a call stay the same
    objects. :meth:`start` must run before each call; calls must not overlap (one thread),
    and a buffer the call returns is overwritten by the next call.
    ``PROBTORCH_POOL_BUFFERS=0`` turns pooling off.
    """

    def __init__(self, module):
        self._allocate = module.empty_strided_cpu
        self._module = module
        self._buffers: list[torch.Tensor] = []
        self._position = 0
        self._calls = 0
        self.enabled = True
        module.empty_strided_cpu = self
        has_views = callable(getattr(module, "reinterpret_tensor", None))
        self._views = ViewPool(module) if has_views else None

    @classmethod
    def attach(cls, module) -> BufferPool | None:
        """A pool for a generated module (None: no module, or one that does not allocate
        through ``empty_strided_cpu``)."""
        if os.environ.get("PROBTORCH_POOL_BUFFERS", "1").strip().lower() in _FALSE:
            return None
        if not callable(getattr(module, "empty_strided_cpu", None)):
            return None
        return cls(module)

    def start(self) -> None:
        """Before each call: the first call records its buffers, the second checks that it
        asks for the same ones, later calls get them without checks."""
        self._position = 0
        if self._views is not None:
            self._views.start()
        if self.enabled and self._calls >= 2:
            self._module.empty_strided_cpu = _handout(iter(self._buffers).__next__)
        else:
            self._module.empty_strided_cpu = self
        self._calls += 1

    def __call__(self, size, stride, dtype):
        k = self._position
        self._position += 1
        if not self.enabled:
            return self._allocate(size, stride, dtype)
        if k == len(self._buffers):
            self._buffers.append(self._allocate(size, stride, dtype))
        buffer = self._buffers[k]
        same = (tuple(buffer.shape), buffer.stride(), buffer.dtype) == (
            tuple(size),
            tuple(stride),
            dtype,
        )
        self.enabled = same
        return buffer if same else self._allocate(size, stride, dtype)


# --- replaying a recorded call -----------------------------------------------------------
#
# Provenance of a value in a recorded call: ("s", value) a value that stays the same from
# call to call (a pooled buffer, a lifted constant, a view of either, a Python scalar);
# ("i", k) the k-th argument of ``call``; ("o", j, k) the k-th tensor returned by the j-th
# library call; ("v", base, size, stride, offset) a view of another value.


class _OpRecorder(TorchDispatchMode):
    """Passes every aten call the generated code makes to ``on_op`` (it makes the call)."""

    def __init__(self, on_op):
        super().__init__()
        self._on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._on_op(func, args, kwargs or {})


def _is_kernel(name: str, value) -> bool:
    """A compiled kernel among a generated module's globals (torch's own helpers, such as
    ``empty_strided_cpu`` or ``reinterpret_tensor``, are builtins of ``torch`` modules)."""
    module = getattr(value, "__module__", None) or ""
    return (
        isinstance(value, types.BuiltinFunctionType)
        and not name.startswith("_")
        and not module.startswith("torch")
    )


class CallTape:
    """One call of an Inductor-generated ``call``, recorded as the compiled kernels and
    library (aten) calls it made and the arguments each got, to be made again without the
    generated Python code around them.

    The generated code is straight-line: it takes its buffers from a :class:`BufferPool`,
    makes views, calls kernels with the buffers' and inputs' addresses, calls library
    functions (a triangular solve, say) and frees what it no longer needs. With the
    buffers pooled, all of that is the same on every call except the inputs and what the
    library calls return. :meth:`bind` resolves everything that depends only on the inputs
    once (kernel arguments become ``functools.partial`` objects), so a call is the kernels
    and the library calls alone. NUTS chunk per call, one core, both ways alternating in
    one process (medians): eight schools 17.0 -> 8.1 us, hier_reg 92 -> 76 us, the
    100-dimensional Gaussian 121 -> 87 us. :func:`replay_call` accepts a tape only after
    its replay gave bit for bit what the generated code gives.

    A library call that the generated code makes without ``out=`` (Inductor's fallbacks,
    such as ``linalg_solve_triangular`` or ``linalg_cholesky_ex``) is replayed through its
    ``out=`` overload into buffers allocated once per :meth:`bind`, where the recording
    showed that overload to give the same result bit for bit (:func:`_out_plan`): no
    allocation per call, and the kernels that read the result get fixed arguments too.
    Library calls go through torch's Python bindings (``torch.linalg.solve_triangular``
    rather than the ``OpOverload``; :func:`_python_binding`) where a second call through
    the binding gave the recorded result bit for bit: they parse their arguments in C++,
    3-4 us sooner per call. Triangular solves, matrix products and Cholesky factors are
    made through :mod:`.library_kernels`' direct BLAS calls where the recording showed them
    to give torch's bits; where then every call is a C function with fixed arguments, the
    bound call also carries a :mod:`.call_program` program (``run.program``), which
    :func:`replay_call` checked once against the Python replay.

    Example (:func:`compile_graph` records and checks the tape)::

        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> def step(x):
        ...     x.copy_(torch.tanh(x) + 1.0)
        ...     return (x.sum(),)
        >>> x = torch.zeros(3)
        >>> call, pool = compile_graph(make_fx(step)(x.clone()), [x], {}, written=[0],
        ...                            pool_buffers=True, replay=True)
        >>> run = call.bind([x])  # for as many calls on this inputs list as wanted
        >>> run(); run()
        (tensor(3.),)
        (tensor(5.2848),)
        >>> x
        tensor([1.7616, 1.7616, 1.7616])
    """

    def __init__(self, steps, outputs, out_spec, constants, make_view):
        self._steps = steps  # ("k", kernel, provenances) or ("op", func, provenances, spec)
        self._outputs = outputs
        self._out_spec = out_spec
        self._constants = constants
        self._make_view = make_view
        self.num_kernels = sum(step[0] == "k" for step in steps)
        self.num_library_calls = len(steps) - self.num_kernels
        self.num_out_calls = len(self._out_calls())
        self.use_program = True  # replay_call clears it where the program computes otherwise

    @classmethod
    def record(cls, module, constants: list, inputs: list) -> tuple[CallTape, object]:
        """Call ``module.call([*constants, *inputs])`` once, recording it; returns the tape
        and what the call returned."""
        args = [*constants, *inputs]
        known: dict[int, tuple] = {}
        alive: list = []  # keeps every recorded object alive, so that ids stay unique
        steps: list = []
        num_ops = [0]

        def provenance(x):
            if not isinstance(x, torch.Tensor):
                return ("s", x)
            entry = known.get(id(x))
            if entry is not None and entry[1] is x:
                return entry[0]
            alive.append(x)
            known[id(x)] = (("s", x), x)
            return ("s", x)

        for k, x in enumerate(args):
            if isinstance(x, torch.Tensor):
                alive.append(x)
                known[id(x)] = (("i", k), x)

        def kernel_recorder(kernel):
            def record_kernel(*kernel_args):
                steps.append(("k", kernel, [provenance(a) for a in kernel_args]))
                return kernel(*kernel_args)

            return record_kernel

        def on_op(func, op_args, op_kwargs):
            flat, spec = pytree.tree_flatten((op_args, op_kwargs))
            provenances = [provenance(a) for a in flat]
            drawn = func in _RANDOM_INTO  # random numbers: the generator's state is kept
            before = torch.random.get_rng_state() if drawn else None
            out = func(*op_args, **op_kwargs)
            if drawn:
                plan = _random_plan(func, op_args, op_kwargs, out, before)
            else:
                plan = _out_plan(func, op_args, op_kwargs, out)
            binding = _same_binding(func, op_args, op_kwargs, out)
            direct = _direct_out_call(func, op_args, op_kwargs) if binding else None
            steps.append(("op", func, provenances, spec, plan, binding, direct))
            j = num_ops[0]
            num_ops[0] += 1
            for k, t in enumerate(pytree.tree_leaves(out)):
                if isinstance(t, torch.Tensor) and not (id(t) in known and known[id(t)][1] is t):
                    alive.append(t)
                    known[id(t)] = (("o", j, k), t)
            return out

        old_views = module.reinterpret_tensor
        make_view = getattr(old_views, "_make", old_views)

        def record_view(base, size, stride, offset):
            view = make_view(base, size, stride, offset)
            origin = provenance(base)
            if origin[0] != "s":
                alive.append(view)
                known[id(view)] = (("v", origin, tuple(size), tuple(stride), offset), view)
            return view

        kernels = {n: v for n, v in vars(module).items() if _is_kernel(n, v)}
        try:
            for name, kernel in kernels.items():
                setattr(module, name, kernel_recorder(kernel))
            module.reinterpret_tensor = record_view
            with _OpRecorder(on_op):
                out = module.call(list(args))
        finally:
            for name, kernel in kernels.items():
                setattr(module, name, kernel)
            module.reinterpret_tensor = old_views
        leaves, out_spec = pytree.tree_flatten(out)
        tape = cls(steps, [provenance(x) for x in leaves], out_spec, list(constants), make_view)
        return tape, out

    def _out_calls(self) -> dict[int, list]:
        """The library calls replayed through ``out=``, by call index: those with an out
        plan whose result (or a view of it) the call does not return."""
        returned = set()

        def note(p):
            if p[0] == "o":
                returned.add(p[1])
            elif p[0] == "v":
                note(p[1])

        for p in self._outputs:
            note(p)
        ops = [step for step in self._steps if step[0] == "op"]
        return {
            j: step[4][2] for j, step in enumerate(ops) if step[4] is not None and j not in returned
        }

    def _out_buffers(self) -> dict[int, tuple]:
        """Fresh ``out=`` buffers for :meth:`_out_calls`."""
        return {
            j: tuple(torch.empty_strided(n, st, dtype=dt, device=dv) for n, st, dt, dv in metas)
            for j, metas in self._out_calls().items()
        }

    def bind(self, inputs: list) -> Callable[[], object]:
        """A function of no arguments that makes the recorded call for ``inputs`` (the same
        list, or one with the same tensors' layouts, each call)."""
        args = [*self._constants, *inputs]
        make_view = self._make_view
        fixed = self._out_buffers()

        def settle(p):  # what depends on the inputs only, resolved now
            kind = p[0]
            if kind == "i":
                return ("s", args[p[1]])
            if kind == "o" and p[1] in fixed:
                return ("s", fixed[p[1]][p[2]])
            if kind == "v":
                base = settle(p[1])
                if base[0] == "s":
                    return ("s", make_view(base[1], p[2], p[3], p[4]))
                return ("v", base, *p[2:])
            return p

        def value(p, slots):
            kind = p[0]
            if kind == "s":
                return p[1]
            if kind == "o":
                return slots[p[1]][p[2]]
            return make_view(value(p[1], slots), p[2], p[3], p[4])

        calls = []
        c_steps: list | None = []  # (binding, arguments) of C functions, while all are
        op_index = 0
        for step in self._steps:
            settled = [settle(p) for p in step[2]]
            if step[0] == "k":
                calls.append(_kernel_call(step[1], settled, value))
                fixed_args = all(p[0] == "s" for p in settled)
                if c_steps is not None and fixed_args:
                    c_steps.append((step[1], [p[1] for p in settled]))
                else:
                    c_steps = None
                continue
            if op_index in fixed:
                overload, names, _, binding, direct = step[4]
                outs = dict(zip(names, fixed[op_index]))
                calls.append(
                    _library_call_out(overload, settled, step[3], value, outs, binding, direct)
                )
            else:
                calls.append(_library_call(step[5] or step[1], settled, step[3], value, step[6]))
            through = getattr(calls[-1], "direct", None)
            python = getattr(calls[-1], "python", None)
            if c_steps is not None and through is not None:
                c_steps.append((through.func, list(through.args)))
            elif c_steps is not None and python is not None:  # a Python call in the loop
                c_steps.append((call_program.PYTHON, python))
            else:
                c_steps = None
            op_index += 1
        outputs = [settle(p) for p in self._outputs]
        out_spec = self._out_spec
        if all(p[0] == "s" for p in outputs):
            result = pytree.tree_unflatten([p[1] for p in outputs], out_spec)

            def run():
                slots: list = []
                for call in calls:
                    call(slots)
                return result

            # the same calls as one C++ loop (call_program.py), where they are all C functions
            if c_steps is not None and self.use_program and call_program.available():
                run.program = call_program.program(c_steps)
                run.result = result

        else:

            def run():
                slots: list = []
                for call in calls:
                    call(slots)
                return pytree.tree_unflatten([value(p, slots) for p in outputs], out_spec)

        return run


class _Later:
    """A library call's argument known only when the call is made."""

    def __init__(self, provenance):
        self.provenance = provenance


def _kernel_call(kernel, settled: list, value) -> Callable[[list], None]:
    """One kernel call of a bound tape: its arguments are fixed but for those that are (views
    of) what an earlier library call returned, put in place each call."""
    arguments = [p[1] if p[0] == "s" else None for p in settled]
    later = [(i, p) for i, p in enumerate(settled) if p[0] != "s"]
    if not later:
        return functools.partial(_call_fixed, functools.partial(kernel, *arguments))

    def call(slots):
        for i, p in later:
            arguments[i] = value(p, slots)
        kernel(*arguments)

    return call


def _call_fixed(bound, slots):
    bound()


def _library_call(
    func, settled: list, spec, value, direct: Callable | None = None
) -> Callable[[list], None]:
    """One library call of a bound tape; what it returns goes to the next slot. ``direct``
    (:func:`_direct_out_call`): the same call as a C function, used where every argument
    is known when binding."""
    if direct is not None and all(p[0] == "s" for p in settled):
        args, kwargs = pytree.tree_unflatten([p[1] for p in settled], spec)
        through = direct(args, kwargs)
        if through is not None:
            out = kwargs["out"]

            def call_direct(slots):
                through()
                slots.append((out,))

            call_direct.direct = through
            return call_direct
    marks = [p[1] if p[0] == "s" else _Later(p) for p in settled]
    args, kwargs = pytree.tree_unflatten(marks, spec)
    args = list(args)
    later_args = [(i, a.provenance) for i, a in enumerate(args) if isinstance(a, _Later)]
    later_kwargs = [(k, a.provenance) for k, a in kwargs.items() if isinstance(a, _Later)]
    if len(later_args) + len(later_kwargs) == sum(isinstance(m, _Later) for m in marks):

        def call(slots):
            for i, p in later_args:
                args[i] = value(p, slots)
            for k, p in later_kwargs:
                kwargs[k] = value(p, slots)
            out = func(*args, **kwargs)
            slots.append((out,) if isinstance(out, torch.Tensor) else pytree.tree_leaves(out))

        return call

    def call_nested(slots):  # a later value inside a list argument
        values = [value(p, slots) for p in settled]
        nested_args, nested_kwargs = pytree.tree_unflatten(values, spec)
        slots.append(pytree.tree_leaves(func(*nested_args, **nested_kwargs)))

    return call_nested


def _out_plan(func, args, kwargs, result) -> tuple | None:
    """``(out overload, its out argument names, [(size, stride, dtype, device)], binding,
    direct)`` for a library call whose ``out=`` overload writes ``result`` bit for bit into
    buffers of ``result``'s layout (tried once, here); ``binding``: the faster
    :func:`_out_binding` or None; ``direct``: :func:`_direct_library_call` or None. None
    for anything else: calls that mutate or alias their inputs, draw random numbers, or
    return non-tensors."""
    schema = getattr(func, "_schema", None)
    if schema is None or schema.is_mutable or any(r.alias_info for r in schema.returns):
        return None
    if torch.Tag.nondeterministic_seeded in func.tags:
        return None
    results = (result,) if isinstance(result, torch.Tensor) else result
    if not isinstance(results, (tuple, list)) or not all(
        isinstance(t, torch.Tensor) and t.layout == torch.strided for t in results
    ):
        return None
    inputs = [a.name for a in schema.arguments]
    for name in func.overloadpacket.overloads():
        overload = getattr(func.overloadpacket, name)
        arguments = overload._schema.arguments
        names = [a.name for a in arguments if a.is_out]
        if len(names) != len(results) or [a.name for a in arguments if not a.is_out] != inputs:
            continue

        def into(buffers, overload=overload, names=names):
            overload(*args, **kwargs, **dict(zip(names, buffers)))

        same = _writes_bit_for_bit(into, results)
        if same is None:  # this overload does not take these arguments
            continue
        if same:
            metas = [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in results]
            binding = _out_binding(overload, names, args, kwargs, results)
            direct = _direct_library_call(func, args, kwargs, results)
            return overload, names, metas, binding, direct
        return None
    return None


def _normal_into(self, mean=0.0, std=1.0, *, generator=None, out):
    """``aten.normal_functional`` (a copy of ``self`` filled with normal draws) written
    into ``out``: the draws of ``out.normal_``, which takes the generator's numbers as the
    functional form does (checked per call when recording, :func:`_random_plan`)."""
    out.normal_(mean, std, generator=generator)


# Random library calls replayed into fixed buffers: op -> the call that fills ``out``.
_RANDOM_INTO = {torch.ops.aten.normal_functional.default: _normal_into}


def _random_plan(func, args, kwargs, result, before: torch.Tensor) -> tuple | None:
    """The :func:`_out_plan` of a random call (:data:`_RANDOM_INTO`) of torch's default CPU
    generator, which drew ``result`` from the generator state ``before``: the fill-in-place
    call where, from the same state, it writes the same bits and leaves the generator in
    the same state; else None. The generator's state is as after the recorded call."""
    into = _RANDOM_INTO[func]
    if kwargs.get("generator") is not None or not isinstance(result, torch.Tensor):
        return None
    if result.device.type != "cpu":
        return None
    after = torch.random.get_rng_state()
    try:
        torch.random.set_rng_state(before)
        same = _writes_bit_for_bit(lambda buffers: into(*args, **kwargs, out=buffers[0]), (result,))
        same = bool(same) and torch.equal(torch.random.get_rng_state(), after)
    finally:
        torch.random.set_rng_state(after)
    if not same:
        return None
    meta = (tuple(result.shape), result.stride(), result.dtype, result.device)
    return into, ["out"], [meta], None, None


def _direct_library_call(func, args, kwargs, results) -> Callable | None:
    """A function ``(args, kwargs, outs) -> call of no arguments`` that makes the library
    call through :mod:`.library_kernels` into ``outs``, where it wrote ``results`` bit for
    bit into fresh buffers of their layout (tried once, here); else None."""
    if func not in _DIRECT_OPS:
        return None

    def make(args, kwargs, outs):
        return _direct(func, _named(func, args, kwargs), outs)

    return make if _accepted(lambda buffers: make(args, kwargs, buffers), results) else None


def _direct_out_call(func, args, kwargs) -> Callable | None:
    """For a recorded ``out=`` matrix product (``mm``, ``bmm``, ``baddbmm`` with ``beta`` 0
    and ``alpha`` 1) that already wrote its ``out``: a function ``(args, kwargs) -> call of
    no arguments`` making it through :mod:`.library_kernels`, where that wrote the same bits
    into a fresh buffer of ``out``'s layout (tried once, here); else None."""
    out = _named(func, args, kwargs).get("out") if func in _DIRECT_OPS else None
    if not isinstance(out, torch.Tensor):
        return None

    def make(args, kwargs):
        given = _named(func, args, kwargs)
        return _direct(func, given, (given["out"],))

    def into_fresh(buffers):
        return make(args, {**kwargs, "out": buffers[0]})

    return make if _accepted(into_fresh, (out,)) else None


_aten = torch.ops.aten
_DIRECT_OPS = {
    torch.ops.probtorch.potential_hole.default,
    torch.ops.probtorch.potential_hole.out,
    torch.ops.probtorch.matvec.default,
    torch.ops.probtorch.matvec.out,
    _aten.linalg_cholesky_ex.default,
    _aten.linalg_solve_triangular.default,
    _aten.mm.default,
    _aten.bmm.default,
    _aten.mv.default,
    _aten.mm.out,
    _aten.mv.out,
    _aten.bmm.out,
    _aten.baddbmm.out,
}


def _named(func, args, kwargs) -> dict:
    """A call's arguments by their schema names (defaults left out)."""
    return {**dict(zip((a.name for a in func._schema.arguments), args)), **kwargs}


def _direct(func, given: dict, outs: tuple) -> Callable | None:
    """The :mod:`.library_kernels` call that makes ``func`` with the arguments ``given``
    into ``outs``, or None."""
    from . import library_kernels

    aten = torch.ops.aten
    if func in (torch.ops.probtorch.potential_hole.default, torch.ops.probtorch.potential_hole.out):
        return potential_hole.direct_fill(given["z"], *outs) if len(outs) == 2 else None
    if func is aten.linalg_cholesky_ex.default:
        if len(outs) != 2 or given.get("check_errors", False):  # torch raises there
            return None
        return library_kernels.direct_cholesky(
            given["self"], *outs, upper=given.get("upper", False)
        )
    if len(outs) != 1:
        return None
    if func is aten.linalg_solve_triangular.default:
        return library_kernels.direct_solve_triangular(
            given["self"],
            given["B"],
            outs[0],
            upper=given["upper"],
            left=given.get("left", True),
            unitriangular=given.get("unitriangular", False),
        )
    if func is aten.baddbmm.out:
        if given.get("beta", 1) != 0 or given.get("alpha", 1) != 1:
            return None
        return library_kernels.direct_matmul(given["batch1"], given["batch2"], outs[0])
    if func in (torch.ops.probtorch.matvec.default, torch.ops.probtorch.matvec.out):
        return library_kernels.own_matvec(given["self"], given["vec"], outs[0])
    if func in (aten.mv.default, aten.mv.out):
        return library_kernels.direct_matvec(given["self"], given["vec"], outs[0])
    return library_kernels.direct_matmul(given["self"], given["mat2"], outs[0])


def _accepted(make: Callable[[tuple], Callable | None], results) -> bool:
    """Whether the call ``make(buffers)`` returns writes ``results`` bit for bit into fresh
    buffers of their layout."""

    def into(buffers):
        call = make(buffers)
        if call is None:
            raise TypeError("no direct call for these arguments")
        call()

    return bool(_writes_bit_for_bit(into, results))


_BINDING_MODULES = ("_VariableFunctions", "_linalg", "_nn", "_special", "_fft")


def _python_binding(overload) -> Callable | None:
    """The function torch's Python API calls for an ``aten`` operator (``torch.bmm``,
    ``torch.linalg.solve_triangular``, ...): it parses its arguments in C++, where an
    ``OpOverload`` call converts them through the operator's schema, a few us slower (a
    100 x 100 triangular solve with 4 right-hand sides: 10.3 against 6.9 us per call)."""
    if getattr(overload, "namespace", None) != "aten":
        return None
    name = overload.overloadpacket.__name__
    for module in _BINDING_MODULES:
        found = getattr(getattr(torch._C, module, None), name, None)
        if callable(found):
            return found
    return None


def _same_binding(func, args, kwargs, result) -> Callable | None:
    """:func:`_python_binding` of a recorded library call where calling it again with the
    same arguments gives ``result`` bit for bit (tried once, here): deterministic calls
    that write nothing but their ``out=`` arguments, which share no memory with the other
    arguments, and return no view; else None."""
    schema = getattr(func, "_schema", None)
    binding = _python_binding(func) if schema is not None else None
    if binding is None or torch.Tag.nondeterministic_seeded in func.tags:
        return None
    out_names = {a.name for a in schema.arguments if a.is_out}
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if any(not a.is_out for a in writes):
        return None
    if not out_names and any(r.alias_info is not None for r in schema.returns):
        return None
    results = pytree.tree_leaves(result)
    if not results or not all(isinstance(t, torch.Tensor) for t in results):
        return None
    inputs = [
        t
        for k, v in (*enumerate(args), *kwargs.items())
        if k not in out_names
        for t in pytree.tree_leaves(v)
        if isinstance(t, torch.Tensor)
    ]
    storages = {t.untyped_storage().data_ptr() for t in inputs}
    if out_names and any(t.untyped_storage().data_ptr() in storages for t in results):
        return None  # a second call would read what the first wrote
    expected = [t.clone() for t in results]
    try:
        again = pytree.tree_leaves(binding(*args, **kwargs))
    except Exception:  # noqa: BLE001 - the binding does not take these arguments
        return None
    if out_names:
        again = results  # written in place again
    return binding if _bitwise_equal(expected, again) else None


def _out_binding(overload, names, args, kwargs, results) -> Callable | None:
    """:func:`_python_binding` of an ``out=`` overload where calling it with
    ``out=`` (a tuple for several results) writes ``results`` bit for bit into fresh
    buffers of their layout (tried once, here); else None."""
    binding = _python_binding(overload)
    if binding is None:
        return None
    same = _writes_bit_for_bit(
        lambda buffers: binding(*args, **kwargs, out=buffers if len(names) > 1 else buffers[0]),
        results,
    )
    return binding if same else None


def _writes_bit_for_bit(call: Callable[[tuple], object], results) -> bool | None:
    """Whether ``call(buffers)`` writes ``results`` bit for bit into fresh ``buffers`` of
    their layout (and leaves them in place); None where it raises (it does not take these
    arguments)."""
    buffers = tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
                    for t in results)  # fmt: skip
    layouts = [(b.data_ptr(), b.stride()) for b in buffers]
    try:
        call(buffers)
    except Exception:  # noqa: BLE001
        return None
    return all(
        (b.data_ptr(), b.stride()) == layout and _bitwise_equal(b, t)
        for b, layout, t in zip(buffers, layouts, results)
    )


def _library_call_out(
    overload,
    settled: list,
    spec,
    value,
    outs: dict,
    binding: Callable | None = None,
    direct: Callable | None = None,
) -> Callable:
    """:func:`_library_call` through the ``out=`` overload into the fixed ``outs`` (through
    its Python ``binding`` where given: the same call, with ``out=`` a tuple for several;
    through ``direct`` (:func:`_direct_library_call`) where given and every argument is
    known when binding)."""
    results = tuple(outs.values())
    if binding is not None:
        outs = {"out": results if len(results) > 1 else results[0]}
        overload = binding
    if all(p[0] == "s" for p in settled):
        args, kwargs = pytree.tree_unflatten([p[1] for p in settled], spec)
        through = direct(args, kwargs, results) if direct is not None else None
        bound = through or functools.partial(overload, *args, **kwargs, **outs)

        def call(slots):
            bound()
            slots.append(results)

        call.direct = through  # a C function and its arguments (call_program.py), or None
        call.python = bound  # the call as a Python callable of no arguments
        return call

    def call_later(slots):
        args, kwargs = pytree.tree_unflatten([value(p, slots) for p in settled], spec)
        overload(*args, **kwargs, **outs)
        slots.append(results)

    return call_later


def replay_call(
    reference: Callable[[list], object],
    module,
    constants: list,
    inputs: Sequence,
    written: Sequence[int],
    before_call: Callable[[], None] = _nothing,
) -> CallTape | None:
    """A :class:`CallTape` of ``module.call`` that gives bit for bit what ``reference``
    (the direct call) gives, or None.

    Three calls on copies of ``inputs`` (``written``: the positions the graph writes), each
    after ``before_call`` and from the same CPU random state (restored afterwards): the
    reference, the recorded call and the tape's replay; their outputs and written inputs
    must agree. ``PROBTORCH_REPLAY_CALL=0``: None.
    """
    if module is None or os.environ.get("PROBTORCH_REPLAY_CALL", "1").strip().lower() in _FALSE:
        return None
    if not callable(getattr(module, "reinterpret_tensor", None)):
        return None

    def copies() -> list:
        out = list(inputs)
        for i in written:
            out[i] = inputs[i].clone()
        return out

    expected_inputs, recorded_inputs, replayed_inputs = copies(), copies(), copies()
    programmed_inputs = copies()
    try:
        with torch.random.fork_rng(devices=[]):
            rng = torch.get_rng_state()
            before_call()
            expected = reference(expected_inputs)
            torch.set_rng_state(rng)
            before_call()
            tape, recorded = CallTape.record(module, constants, recorded_inputs)
            torch.set_rng_state(rng)
            replayed = tape.bind(replayed_inputs)()
            torch.set_rng_state(rng)
            programmed = _run_program_once(tape.bind(programmed_inputs))
    except Exception:  # noqa: BLE001 - a call this recorder does not understand
        return None

    def same_as_expected(out, got) -> bool:
        return _bitwise_equal(expected, out) and all(
            _bitwise_equal(expected_inputs[i], got[i]) for i in written
        )

    if not all(
        same_as_expected(out, got)
        for out, got in ((recorded, recorded_inputs), (replayed, replayed_inputs))
    ):
        return None
    tape.use_program = programmed is not None and same_as_expected(programmed, programmed_inputs)
    return tape


def _run_program_once(run: Callable[[], object]):
    """What one call through ``run``'s program (:mod:`.call_program`) returns, or None
    where ``run`` has none."""
    program = getattr(run, "program", None)
    if program is None:
        return None
    calls = torch.zeros(1, dtype=torch.int64)
    call_program.run(program, torch.ones((), dtype=torch.bool), 1, calls)
    return run.result if int(calls[0]) == 1 else None
