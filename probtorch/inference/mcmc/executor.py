"""Executors: how a per-leapfrog state machine is run until every chain has finished.

A chunk is ``chunk_size`` unrolled iterations of the state machine.

- :class:`InPlaceLoop` (the quick path for NUTS's and HMC's blocks of transitions): the
  chunk is captured once with ``make_fx`` as a graph that updates the state *in place* and
  writes the all-done flag into a one-element buffer (:func:`trace_in_place`), compiled by
  Inductor in this process (``torch._inductor.standalone_compile``), and called from a
  Python loop with the same buffers every time, through Inductor's generated code directly
  (:mod:`..generated_call`). No Dynamo guards, no AOT autograd wrappers, no new state
  tensors per call.
- :class:`ChunkedLoop`: the chunk under ``torch.compile`` (``fullgraph=True``), fed its
  own outputs. NUTS's single transitions (``NUTS.sample``) use it, and
  :class:`InPlaceLoop` falls back to it where the chunk cannot be captured. With
  ``compile=False`` it runs every chunk eagerly, with the same results.
- The lean executor (:mod:`.lean`) compiles the in-place graph with AOTInductor and drives
  it from C++.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.utils import _pytree as pytree

from ..._caller import warn_at_caller
from ...validation import torch_validation
from .. import call_program
from ..compile import compile_fn, inductor_base_options, skip_guards
from ..generated_call import BufferPool, compile_graph, load_graph
from ..uncompilable import eager_fallback_note, untraceable_reason

__all__ = ["ChunkedLoop", "InPlaceLoop", "SplitLoop", "TracedChunk", "trace_in_place"]

# The generated host code checks every input's sizes, strides and alignment on each call
# (about sixty checks for a NUTS block state); the loop only feeds a chunk its own outputs,
# whose layout the first calls fixed, so the checks are left out: 126 -> 100 us per call on
# eight schools (4 chains, one core). ``cpp_wrapper`` would save 5 us more for 2 s of compile.
# Calls per C++ loop of a program (call_program.py): a Ctrl-C is seen within that many.
_PROGRAM_CALLS = 256

_UNCHECKED = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}


class ChunkedLoop:
    """Run ``iteration(state, *args)`` in chunks until ``state.done`` holds for every chain.

    Args:
        iteration: one state-machine step; returns the new state (a NamedTuple with a
            boolean ``done`` field, batched over chains).
        chunk_size: iterations unrolled per compiled call. Larger chunks cost fewer calls
            and more compile time; iterations of finished chains are wasted.
        compiled: compile the chunk.
        done: the state's all-finished flag, batched over chains.
        options: more Inductor options for the chunk (see :func:`~.kernels.codegen_options`).
    """

    def __init__(
        self,
        iteration: Callable,
        chunk_size: int = 4,
        compiled: bool = True,
        done: Callable = lambda state: state.done,
        options: dict | None = None,
    ):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self.compiled = compiled
        self.done = done

        def chunk(state, *args):
            for _ in range(chunk_size):
                state = iteration(state, *args)
            return state

        self._chunk_fn = chunk
        self._chunk = compile_fn(chunk, compiled, options={**_UNCHECKED, **(options or {})})
        self.calls = 0
        self.interrupted = False

    def _first_call(self, state, args):
        """A call that may compile: where torch.compile cannot capture the model (a
        distribution whose code branches on tensor values, as Pyro's
        ``SineBivariateVonMises``), the chunk runs eagerly from then on, with a warning
        that says why and where (nothing ran yet: Dynamo refuses before running)."""
        try:
            return self._chunk(state, *args)
        except torch._dynamo.exc.Unsupported as error:
            if not self.compiled:
                raise
            doing = "running the sampler eagerly, much slower"
            warn_at_caller(eager_fallback_note(doing, error, " to the kernel"))
            self.compiled = False
            self._chunk = self._chunk_fn
            return self._chunk(state, *args)

    def __call__(self, state, *args):
        """The final state; on KeyboardInterrupt, the state after the last whole chunk."""
        self.interrupted = False
        with torch_validation(False):
            try:
                # The first two calls check Dynamo's guards (compiling if needed): the
                # second one gets the first one's outputs, which is what every later call
                # gets (same shapes, strides, dtypes and devices), so later calls skip the
                # guards (about 20% of the time per draw on eight schools).
                for _ in range(2):
                    if bool(self.done(state).all()):
                        return state
                    state = self._first_call(state, args)
                    self.calls += 1
                unguarded = self.compiled
                while not bool(self.done(state).all()):
                    try:
                        with skip_guards(unguarded):
                            while not bool(self.done(state).all()):
                                state = self._chunk(state, *args)
                                self.calls += 1
                    except RuntimeError as error:
                        # an input that none of the compiled graphs fits: Dynamo refuses to
                        # recompile under the stance (before running anything); go on guarded
                        if not unguarded or "skip_guard_eval_unsafe" not in str(error):
                            raise
                        unguarded = False
            except KeyboardInterrupt:
                self.interrupted = True
        return state


class TracedChunk(NamedTuple):
    """A chunk captured as an in-place graph (:func:`trace_in_place`)."""

    graph: torch.fx.GraphModule
    inputs: list  # example inputs: the state's leaves, the arguments' leaves, the done flag
    state_spec: pytree.TreeSpec
    num_state: int


def trace_in_place(
    iteration: Callable,
    example_state,
    example_args: tuple,
    chunk_size: int,
    done: Callable,
    symbolic: bool = False,
) -> TracedChunk:
    """Capture ``chunk_size`` iterations as a graph that updates the state in place.

    The graph takes the state's tensor leaves, then the arguments' leaves, then a 0-d bool
    buffer; it writes the new state into the state's buffers (``copy_``) and
    ``done(state).all()`` into the bool buffer. Constants made while tracing are folded.
    The example inputs are laid out by :func:`in_place_inputs`, as callers' inputs are.
    ``symbolic``: every size a symbol (one graph for all sizes the trace did not specialize).
    """
    state_leaves, state_spec = pytree.tree_flatten(example_state)
    arg_spec = pytree.tree_flatten(example_args)[1]
    num_state = len(state_leaves)

    def chunk_in_place(*flat):
        leaves = list(flat[:num_state])
        state = pytree.tree_unflatten(leaves, state_spec)
        args = pytree.tree_unflatten(list(flat[num_state:-1]), arg_spec)
        for _ in range(chunk_size):
            state = iteration(state, *args)
        for target, value in zip(leaves, pytree.tree_leaves(state)):
            target.copy_(value)
        flat[-1].copy_(done(state).all())
        return (flat[-1].clone(),)

    from torch.fx.experimental.proxy_tensor import make_fx

    state_leaves, arg_leaves = in_place_inputs(example_state, example_args)
    inputs = [x.clone() for x in state_leaves + arg_leaves] + [
        state_leaves[0].new_zeros((), dtype=torch.bool)
    ]
    with torch_validation(False):
        if symbolic:  # sizes that happen to be equal (dimensions, tree depth) stay apart
            from torch.fx.experimental import _config as fx_config

            with fx_config.patch(use_duck_shape=False):
                gm = make_fx(chunk_in_place, tracing_mode="symbolic")(*[x.clone() for x in inputs])
        else:
            gm = make_fx(chunk_in_place)(*[x.clone() for x in inputs])
    _replace_lift_fresh_copy(gm)
    _fold_constants(gm)
    return TracedChunk(gm, inputs, state_spec, num_state)


def in_place_inputs(state, args) -> tuple[list, list]:
    """The state's leaves as new buffers (the graph writes them) and the arguments' leaves,
    laid out as a compiled in-place chunk expects (its generated code does not check
    strides): dense tensors keep their strides (a column-major Cholesky factor stays one),
    overlapping ones (expanded) become contiguous. The chunk is compiled per layout."""
    leaves = [x.clone() for x in pytree.tree_leaves(state)]
    return leaves, [_dense(x) for x in pytree.tree_leaves(args)]


def with_strides(tensors: list, strides: list) -> list:
    """``tensors``, each laid out with the given strides (copied where it is not)."""
    return [
        x
        if x.stride() == s
        else torch.empty_strided(x.shape, s, dtype=x.dtype, device=x.device).copy_(x)
        for x, s in zip(tensors, strides)
    ]


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy where its elements overlap or leave gaps (``clone`` and
    ``empty_like`` keep the strides of any other tensor)."""
    return x if torch.empty_like(x).stride() == x.stride() else x.contiguous()


def _replace_lift_fresh_copy(gm: torch.fx.GraphModule) -> None:
    """Constants made at trace time arrive as ``lift_fresh_copy``; make them plain clones."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.lift_fresh_copy.default:
            with gm.graph.inserting_after(node):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, node.args)
            node.replace_all_uses_with(clone)
            gm.graph.erase_node(node)


def _fold_constants(gm: torch.fx.GraphModule) -> None:
    """Evaluate every op whose inputs are all constants.

    AOTInductor (torch 2.13) fails to lower ops on 0-d constant tensors
    (``LoweringException: StopIteration`` in ``pow``); folding them first avoids it.
    """
    constants = {n: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        inputs = [
            a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)
        ]
        if not inputs or not all(a in constants for a in inputs):
            continue
        args, kwargs = pytree.tree_map(
            lambda a: constants[a] if isinstance(a, torch.fx.Node) else a, (node.args, node.kwargs)
        )
        with torch.no_grad():  # a module's trained parameters are constants here
            value = node.target(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_probtorch_folded_{count}"
        count += 1
        gm.register_buffer(name, value.detach().clone())
        with gm.graph.inserting_before(node):
            folded = gm.graph.get_attr(name)
        node.replace_all_uses_with(folded)
        gm.graph.erase_node(node)
        constants[folded] = value
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _signature(tensors) -> tuple:
    return tuple((t.shape, t.stride(), t.dtype, t.device) for t in tensors)


@contextlib.contextmanager
def deferred_interrupts():
    """Hold Ctrl-C back until the current call has finished (a context manager).

    Yields a function that tells whether Ctrl-C was pressed. A compiled in-place chunk
    writes the state with several kernels (and library calls in between); a
    KeyboardInterrupt raised between two of them would leave a state that is half one
    iteration, half the next. Only Python's default SIGINT handler, in the main thread, is
    replaced; anything else (a handler of the user's, other threads) is left alone.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield lambda: False
        return
    pressed = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield lambda: bool(pressed)
    finally:
        signal.signal(signal.SIGINT, previous)


def _nothing() -> None:
    pass


class InPlaceLoop:
    """Run ``iteration(state, *args)`` in chunks until ``state.done`` holds for every chain,
    as a graph that updates the state in place (see the module docstring).

    The graph is captured and compiled on the first call for each signature (shapes,
    strides, dtypes, devices) of the state and arguments; :meth:`adopt` takes a chunk that
    was already captured (the lean executor's, so the chunk is traced once). Draws are the
    quick path's (:class:`ChunkedLoop`) and the lean executor's: the same iteration on the
    same pre-drawn random numbers. Where the chunk cannot be captured or compiled, it
    warns once and runs a :class:`ChunkedLoop` instead. On eight schools (4 chains, one
    core) a call takes about 21 us, against about 100 us for the ``torch.compile`` chunk.

    Args:
        iteration: one state-machine step (as for :class:`ChunkedLoop`).
        chunk_size: iterations unrolled per compiled call.
        done: the state's all-finished flag, batched over chains.
        options: more Inductor options for the chunk.

    Example::

        >>> from typing import NamedTuple
        >>> class Count(NamedTuple):
        ...     n: torch.Tensor
        ...     done: torch.Tensor
        >>> def iteration(s, limit):
        ...     n = s.n + (~s.done).long()
        ...     return Count(n, n >= limit)
        >>> loop = InPlaceLoop(iteration)
        >>> loop(Count(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.bool)),
        ...      torch.tensor([2, 5, 3])).n
        tensor([2, 5, 3])
    """

    def __init__(
        self,
        iteration: Callable,
        chunk_size: int = 1,
        done: Callable = lambda state: state.done,
        options: dict | None = None,
    ):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.iteration = iteration
        self.chunk_size = int(chunk_size)
        self.done = done
        self.options = dict(options or {})
        self._compiled: dict[tuple, tuple] = {}  # signature -> (function, state spec)
        self._fallback: ChunkedLoop | None = None
        self._fallback_note: str | None = None
        self.calls = 0
        self.interrupted = False

    def adopt(self, traced: TracedChunk) -> None:
        """Compile an already captured chunk (for the state and arguments it was traced on)."""
        key = _signature(traced.inputs[:-1])
        if key not in self._compiled and self._fallback is None:
            try:
                self._compiled[key] = (*self._compile(traced), traced.state_spec)
            except Exception as error:  # an op Inductor cannot take here
                self._use_fallback(error)

    def _compile(self, traced: TracedChunk) -> tuple[Callable, BufferPool | None]:
        """The compiled chunk, as a function of its inputs list, and the pool of its
        intermediate buffers (None: not pooled). The chunk calls Inductor's generated code
        directly where that computes what the compiled artifact computes (checked on one
        call, :func:`~..generated_call.direct_call`): 59 -> 43 us per call on eight schools."""
        options, dynamic = self._compile_options()
        written = [*range(traced.num_state), len(traced.inputs) - 1]  # the state, the flag
        with torch_validation(False):
            return compile_graph(
                traced.graph,
                traced.inputs,
                {"config_patches": options},
                written,
                pool_buffers=True,
                replay=True,
                dynamic_shapes=dynamic,
                on_compiled=self._keeper(traced),
            )

    def _keeper(self, traced: TracedChunk) -> Callable | None:
        """What is called with the compiled artifact of ``traced`` (None: nothing)."""
        return None

    def _options(self) -> dict:
        return {
            **inductor_base_options(),
            "cpp.threads": 1,
            "size_asserts": False,
            "alignment_asserts": False,
            "scalar_asserts": False,
            **self.options,
        }

    def _compile_options(self) -> tuple[dict, str]:
        """Inductor's options and ``standalone_compile``'s ``dynamic_shapes``."""
        return self._options(), "from_example_inputs"

    def _trace(self, state, args) -> TracedChunk:
        return trace_in_place(self.iteration, state, args, self.chunk_size, self.done)

    def _prepare(self, key: tuple, state, args) -> None:
        """Capture and compile the chunk for the signature ``key`` of ``(state, args)``."""
        try:
            traced = self._trace(state, args)
        except Exception as error:  # an op make_fx cannot trace
            self._use_fallback(error)
        else:
            self.adopt(traced)

    _FALLBACK_NOTE = (
        "the in-place NUTS chunk could not be compiled ({error}); running it through "
        "torch.compile instead"
    )

    def _use_fallback(self, error: BaseException) -> None:
        # said once the fallback has compiled (where it cannot, its own warning says why)
        self._fallback_note = self._FALLBACK_NOTE.format(error=untraceable_reason(error))
        self._fallback = ChunkedLoop(self.iteration, self.chunk_size, True, self.done, self.options)

    def __call__(self, state, *args):
        """The final state (new buffers; ``state`` is not changed). On KeyboardInterrupt,
        the state after the last whole chunk, with ``self.interrupted`` set."""
        if self._fallback is None and not bool(self.done(state).all()):
            leaves, arg_leaves = in_place_inputs(state, args)
            key = _signature(leaves + arg_leaves)
            if key not in self._compiled:
                self._prepare(key, state, args)
            if self._fallback is None:
                return self._run(key, leaves, arg_leaves)
        if self._fallback is not None:
            state = self._fallback(state, *args)
            self.calls, self.interrupted = self._fallback.calls, self._fallback.interrupted
            if self._fallback_note and self._fallback.compiled:
                warn_at_caller(self._fallback_note)
            self._fallback_note = None
        return state

    def _run(self, key, leaves, arg_leaves):
        compiled, pool, spec = self._compiled[key]
        flag = torch.zeros((), dtype=torch.bool, device=leaves[0].device)
        inputs = leaves + arg_leaves + [flag]
        self.interrupted = False
        start = pool.start if pool is not None else _nothing
        bind = getattr(compiled, "bind", None)
        if bind is not None:  # a recorded call, replayed (generated_call.CallTape)
            step, start = bind(inputs), _nothing
        else:
            step = functools.partial(compiled, inputs)
        program = getattr(step, "program", None)
        if program is not None:  # the replayed calls as one C++ loop (call_program.py)
            made = torch.zeros(1, dtype=torch.int64)

            def advance() -> int:  # up to _PROGRAM_CALLS calls, then interrupts are seen
                call_program.run(program, flag, _PROGRAM_CALLS, made)
                return int(made[0])

        else:

            def advance() -> int:
                start()
                step()
                return 1

        with torch_validation(False), torch.no_grad(), deferred_interrupts() as interrupted:
            while True:
                self.calls += advance()
                if bool(flag):
                    break
                if interrupted():
                    self.interrupted = True
                    break
        return pytree.tree_unflatten(leaves, spec)


class SplitLoop(InPlaceLoop):
    """:class:`InPlaceLoop` with the model's gradient compiled apart from the sampler.

    ``iteration`` must compute the gradient with
    :func:`~..potential_hole.hole_value_and_grad`; ``value_and_grad`` is the model's. The
    iteration is traced with symbolic sizes and compiled once per sampler setting
    (``graph_name`` names the setting; ``options`` are Inductor's): it is kept on disk
    (:mod:`.sampler_cache`) and loaded by every later run, whatever its model, number of
    chains and dimensions. Only the model's ``value_and_grad`` is compiled per model (in
    place: ``z`` -> value and gradient buffers, with ``gradient_options`` added to
    Inductor's), and the operator runs it: a replayed call runs the gradient's program
    from the sampler's program (:mod:`..potential_hole`), so a leapfrog step still never
    returns to Python. Draws are the quick path's, bit for bit where the gradient compiles
    to the same code (the sampler's own arithmetic is elementwise).
    """

    _FALLBACK_NOTE = (
        "the model's gradient could not be compiled apart from the sampler ({error}); it "
        "runs eagerly inside the compiled sampler, much slower"
    )

    def __init__(
        self,
        iteration: Callable,
        value_and_grad: Callable,
        chunk_size: int = 1,
        done: Callable = lambda state: state.done,
        options: dict | None = None,
        gradient_options: dict | None = None,
        z_of: Callable = lambda state: state.z,
        graph_name: str | None = None,
    ):
        super().__init__(iteration, chunk_size, done, options)
        self.value_and_grad = value_and_grad
        self.gradient_options = dict(gradient_options or {})
        self.graph_name = graph_name
        self.z_of = z_of
        self._gradient: dict[tuple, tuple] = {}  # signature of z -> (python fill, direct fill)
        self.kept_paths: set[str] = set()  # entries this loop loaded or kept

    def _trace(self, state, args) -> TracedChunk:
        return trace_in_place(self.iteration, state, args, self.chunk_size, self.done, True)

    def _compile_options(self) -> tuple[dict, str]:
        return self._options(), "from_graph"

    def _prepare(self, key: tuple, state, args) -> None:
        """Load the sampler graph kept by an earlier run (:mod:`.sampler_cache`), or trace
        and compile it and keep it."""
        entry = self._kept_entry(state, args)
        if entry is None or not self._load_kept(key, state, entry):
            super()._prepare(key, state, args)

    def _kept_entry(self, state, args) -> tuple[str, list, int] | None:
        """Where the sampler graph for ``(state, args)`` is kept (or would be), the graph's
        inputs and how many of them are the state; None where ``graph_name`` is None."""
        from . import sampler_cache

        if self.graph_name is None:
            return None
        leaves, arg_leaves = in_place_inputs(state, args)
        inputs = leaves + arg_leaves + [leaves[0].new_zeros((), dtype=torch.bool)]
        path = sampler_cache.entry_path(self.graph_name, self.options, inputs)
        return path, inputs, len(leaves)

    def _load_kept(self, key: tuple, state, entry: tuple[str, list, int]) -> bool:
        from . import sampler_cache

        path, inputs, num_state = entry
        written = [*range(num_state), len(inputs) - 1]
        with torch_validation(False):
            found = load_graph(
                lambda: sampler_cache.load(path, inputs),
                inputs,
                written,
                True,
                True,
                config_patches=self._compile_options()[0],
            )
        if found is None:
            return False
        self._compiled[key] = (*found, pytree.tree_flatten(state)[1])
        self.kept_paths.add(path)
        return True

    def kept_path(self, state, *args) -> str | None:
        """Where the sampler graph for ``(state, *args)`` is kept, or would be (None:
        ``graph_name`` is None, nothing is kept)."""
        entry = self._kept_entry(*pytree.tree_map(_row_major, (state, args)))
        return None if entry is None else entry[0]

    def load_kept(self, state, *args) -> bool:
        """Load the sampler graph an earlier run kept for ``(state, *args)`` and compile
        the model's gradient; whether the graph was there (and serves these sizes) and the
        gradient compiled. Calls on such inputs then trace and compile nothing more."""
        from .. import potential_hole
        from . import sampler_cache

        state, args = pytree.tree_map(_row_major, (state, args))
        leaves, arg_leaves = in_place_inputs(state, args)
        key = _signature(leaves + arg_leaves)
        if key in self._compiled:
            return True
        entry = self._kept_entry(state, args)
        if entry is None or not sampler_cache.serves(entry[0], entry[1]):
            return False
        try:
            fills = self._fills(self.z_of(state))
        except Exception:  # noqa: BLE001 - the caller goes on without this loop
            return False
        # loading checks and records one call of the graph: the hole must be this model's
        with potential_hole.filling(*fills):
            return self._load_kept(key, state, entry)

    def _keeper(self, traced: TracedChunk) -> Callable | None:
        from . import sampler_cache

        if self.graph_name is None:
            return None
        path = sampler_cache.entry_path(self.graph_name, self.options, traced.inputs)

        def keep(artifact) -> None:
            if sampler_cache.save(path, artifact, traced.graph):
                self.kept_paths.add(path)

        return keep

    def _fills(self, z: torch.Tensor) -> tuple[Callable, Callable | None]:
        """The gradient, compiled for ``z``'s layout: a Python function of ``z`` and a
        maker of direct calls (see :func:`~..potential_hole.filling`)."""
        key = _signature([z])
        if key not in self._gradient:
            options = {**self._options(), **self.gradient_options}
            self._gradient[key] = _compiled_fills(self.value_and_grad, z, options)
        return self._gradient[key]

    def __call__(self, state, *args):
        from .. import potential_hole

        # one layout for every model (row-major), so that one compiled graph serves them all
        state, args = pytree.tree_map(_row_major, (state, args))
        z = self.z_of(state)
        fills: tuple = (self.value_and_grad, None)  # eager: the fallback's gradient
        if self._fallback is None:
            try:
                fills = self._fills(z)
            except Exception as error:  # an op the gradient's capture or compile refuses
                self._use_fallback(error)
        with potential_hole.filling(*fills):
            return super().__call__(state, *args)


def _row_major(x):
    if isinstance(x, torch.Tensor):
        return x.contiguous()
    return x


def _compiled_fills(value_and_grad: Callable, z: torch.Tensor, options: dict):
    """``value_and_grad`` compiled in place for ``z``'s layout: ``(fill, direct)`` for
    :func:`~..potential_hole.filling`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def in_place(z, value, grad):
        v, g = value_and_grad(z)
        value.copy_(v)
        grad.copy_(g)
        return (value.sum(),)

    example = [z.clone(), z.new_zeros(z.shape[:1]), torch.zeros_like(z)]
    with torch_validation(False):
        gm = make_fx(in_place)(*[x.clone() for x in example])
        compiled, pool = compile_graph(
            gm, example, {"config_patches": options}, [1, 2], pool_buffers=True, replay=True
        )
    start = pool.start if pool is not None else _nothing

    def fill(z):
        value, grad = z.new_empty(z.shape[:1]), torch.empty_like(z)
        start()
        compiled([z.contiguous(), value, grad])
        return value, grad

    bind = getattr(compiled, "bind", None)

    def direct(z, value, grad):
        if bind is None or not call_program.available():
            return None
        if _signature([z, value, grad]) != _signature(example):
            return None
        run = bind([z, value, grad])
        program = getattr(run, "program", None)
        if program is None:
            return None
        made = torch.zeros(1, dtype=torch.int64)
        never = torch.zeros((), dtype=torch.bool)
        call = functools.partial(call_program._runner[0], program, never, 1, made)
        call.keep = run  # the buffers the program writes and reads
        return call

    return fill, direct
