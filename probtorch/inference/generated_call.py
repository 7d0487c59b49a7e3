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
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

__all__ = ["BufferPool", "ViewPool", "compile_graph", "direct_call", "generated_module"]

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


def compile_graph(
    gm: torch.fx.GraphModule,
    example: list,
    options: dict,
    written: Sequence[int],
    pool_buffers: bool = False,
) -> tuple[Callable[[list], object], BufferPool | None]:
    """``gm`` compiled by ``torch._inductor.standalone_compile`` for ``example`` (its
    ``options`` passed on), as a function of its inputs list that calls the generated code
    directly where :func:`direct_call` accepts it, and the pool of its intermediate buffers
    (``pool_buffers``; None otherwise or where the generated module has none: then
    :meth:`BufferPool.start` need not run). ``written``: the input positions the graph
    writes."""
    from torch._inductor.codecache import PyCodeCache

    from .compile import note_direct_compile

    loaded = len(PyCodeCache.modules)
    compiled = torch._inductor.standalone_compile(
        gm, example, dynamic_shapes="from_example_inputs", options=options
    )
    note_direct_compile()
    module = generated_module(PyCodeCache.modules[loaded:])
    pool = BufferPool.attach(module) if pool_buffers else None
    before_call = pool.start if pool is not None else _nothing
    direct = direct_call(compiled, gm, module, example, written, before_call=before_call)

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
