"""The compiled SVI block as one graph that updates the optimization state in place.

:class:`InPlaceBlock` runs ``steps_per_call`` SVI steps (the block function of
:mod:`.svi`) without Dynamo: the block is captured with ``make_fx`` on fake tensors, as a
graph that writes the new parameters, optimizer state, ELBO state and last finite
parameters into its input buffers and returns the block's losses; Inductor compiles it in
this process (``torch._inductor.standalone_compile``, with the SVI step's decompositions and
options), and each call feeds it the same buffers. A Dynamo-compiled block spends most of a
short call in its wrappers (frame evaluation, guards, AOT autograd's runtime wrapper) and
returns new state tensors: on the logistic-regression benchmark one step per call took 63
us that way and 39 us in place (the step itself is about 22 us), and the first capture
takes 0.1 s instead of Dynamo's 0.75 s. Calls go to Inductor's generated code directly,
without AOT autograd's runtime wrappers, where one checked call shows that this computes
the same (:mod:`.generated_call`).

What Dynamo's guards check on every call is checked once per run here. Capturing on fake
tensors, like Dynamo, refuses Python control flow that depends on tensor values (the
capture fails). A captured graph holds what the model read from outside its arguments
(globals, closures, attributes, module buffers) as constants, so at the start of each run
(:meth:`InPlaceBlock.forget_arguments`) a *probe*, the loss alone, is run once eagerly
while its operations are recorded (about 5 ms for the logistic regression; capturing it as
a graph took 50 ms), and the record (the operations, where each tensor came from, the
values of the tensors from outside) keys the compiled graph, with the shapes, strides,
dtypes and devices of the inputs and the non-tensor arguments: a change anywhere (a
global, a module switched to ``eval()``) captures and compiles the block again. A graph
that writes into anything other than the state (a module's buffer, a data argument) is
refused. Where the block cannot be captured or compiled this way, it warns once and runs
the ``torch.compile`` block instead, whose errors name the problem (a data-dependent branch
is a graph break there).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .._caller import warn_at_caller
from ..validation import torch_validation
from . import call_program
from .generated_call import _FALSE, compile_graph
from .matvec_op import use_own_matvec
from .mcmc.executor import _replace_lift_fresh_copy

__all__ = ["InPlaceBlock"]


_MISSING = object()
# Matrix-vector products with probtorch's own loops (matvec_op.py) instead of BLAS's gemv.
_OWN_MATVEC = os.environ.get("PROBTORCH_OWN_MATVEC", "1").strip().lower() not in _FALSE


def _meta(x) -> tuple:
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.stride(), x.dtype, x.device, x.requires_grad)
    hash(x)  # an unhashable constant argument cannot key a compiled graph: TypeError
    return ("constant", type(x), x)


class _Compiled:
    def __init__(self, fn, pool, buffers, tensor_positions, state_spec):
        self.fn = fn
        self.pool = pool
        self.buffers = buffers
        self.tensor_positions = tensor_positions
        self.state = tuple(pytree.tree_unflatten(buffers, state_spec))  # what calls return

    def runner(self, inputs: list) -> Callable[[], tuple]:
        """The graph's call on ``inputs`` (the same list each call), as a function of no
        arguments: the recorded call replayed where it was accepted
        (:class:`~.generated_call.CallTape`), else the generated code on pooled buffers."""
        bind = getattr(self.fn, "bind", None)
        if bind is not None:
            run = bind(inputs)
            program = getattr(run, "program", None)
            if program is None:
                return run
            # the replayed calls as one C++ loop (call_program.py), one block per call
            once, made, result = (
                torch.ones((), dtype=torch.bool),
                torch.zeros(1, dtype=torch.int64),
                run.result,
            )

            def run_program(run=run):  # run keeps the program's Python steps alive
                call_program.run(program, once, 1, made)
                return result

            return run_program
        if self.pool is None:
            return functools.partial(self.fn, inputs)

        def run(start=self.pool.start, fn=self.fn):
            start()
            return fn(inputs)

        return run


class InPlaceBlock:
    """``block(flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs)``,
    compiled as an in-place graph (see the module docstring).

    Returns what ``block`` returns: the new state (the block's own buffers, overwritten by
    the next call) and the losses report. A Ctrl-C between two of the graph's kernels
    would leave a half-written state: callers hold it back during calls
    (:func:`~probtorch.inference.mcmc.executor.deferred_interrupts`).

    Args:
        block: the eager block function.
        compile_kwargs: keyword arguments for Inductor's ``compile_fx`` (``config_patches``,
            ``decompositions``).
        fallback: makes the ``torch.compile`` block used where capture fails.
        after_trace: called after each capture (SVI puts the modules' parameters back).
        probe: a cheaper function of the same arguments that runs the user's code the block
            runs (the loss alone); recorded again at the start of each run
            (:meth:`forget_arguments`), its operations and outside tensors key the graph (a
            module switched to ``eval()`` changes them, for example). Default: the block
            itself.
        settings: a summary of settings the block reads that the probe does not (the
            optimizer's hyperparameters); part of the key.

    Example::

        >>> import torch
        >>> def block(flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs):
        ...     new = flat - lrs[0] * 2 * (flat - args[0])
        ...     return new, opt_state, elbo_state, flat, ((flat - args[0]) ** 2).sum()[None]
        >>> run = InPlaceBlock(block, {}, fallback=lambda: block)
        >>> state = (torch.zeros(2), (), {}, torch.zeros(2))
        >>> for _ in range(50):
        ...     *state, report = run(*state, None, torch.tensor([0.1]), (torch.ones(2),), {})
        >>> state[0]
        tensor([1.0000, 1.0000])
    """

    def __init__(
        self,
        block: Callable,
        compile_kwargs: dict,
        fallback: Callable[[], Callable],
        after_trace: Callable[[], None] = lambda: None,
        probe: Callable | None = None,
        settings: Callable[[], object] = lambda: None,
    ):
        self.block = block
        self.probe = block if probe is None else probe
        self.settings = settings
        self._probed: tuple | None = None  # this run's fingerprint of the probe
        self.compile_kwargs = compile_kwargs
        self._make_fallback = fallback
        self._after_trace = after_trace
        self._compiled: dict = {}
        self._fallback: Callable | None = None
        self._capture_note = ""  # why the step could not be captured in place
        # The last call's state and argument objects, its graph and tensor inputs: a call
        # with the same objects (the host loop feeding the block its own outputs) skips
        # flattening and keying them.
        self._repeat: tuple | None = None

    def forget_arguments(self) -> None:
        """Start a new run: the next call checks its arguments in full (containers may have
        changed in place) and captures the probe again (globals, closures and attributes
        the model reads may have changed)."""
        self._repeat = None
        self._probed = None

    def __call__(self, flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs):
        if self._fallback is not None:
            return self._fallback(flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs)
        state = (flat, opt_state, elbo_state, last_good)
        repeat = self._repeat
        if repeat is not None and self._same_call(repeat, state, active, lrs, args, kwargs):
            compiled, run = repeat[2], repeat[3]
        else:
            compiled, run = self._prepare(state, active, lrs, args, kwargs)
            if compiled is None:
                result = self._fallback(*state, active, lrs, args, kwargs)
                # where torch.compile cannot capture the step either, its own warning (the
                # step runs eagerly) says why: one warning, not two
                if getattr(self._fallback, "eager_because", None) is None:
                    warn_at_caller(self._capture_note)
                return result
        (report,) = run()
        return (*compiled.state, report)

    def _same_call(self, repeat, state, active, lrs, args, kwargs) -> bool:
        old_state, old_args, _, _ = repeat
        return (
            all(a is b for a, b in zip(state, old_state))
            and active is old_args[0]
            and lrs is old_args[1]
            and len(args) == len(old_args[2])
            and all(a is b for a, b in zip(args, old_args[2]))
            and len(kwargs) == len(old_args[3])
            and all(kwargs.get(k, _MISSING) is v for k, v in old_args[3].items())
        )

    def _prepare(self, state, active, lrs, args, kwargs):
        """The graph for these arguments (compiled if new; None: use the fallback) and its
        call on them (:meth:`_Compiled.runner`), with the state copied into the graph's
        buffers."""
        state_leaves, state_spec = pytree.tree_flatten(state)
        arg_leaves, arg_spec = pytree.tree_flatten((active, lrs, args, kwargs))
        compiled = None
        try:
            if self._probed is None:
                self._probed = self._fingerprint(state_leaves, state_spec, arg_leaves, arg_spec)
            key = (
                state_spec,
                arg_spec,
                tuple(_meta(x) for x in state_leaves),
                tuple(_meta(x) for x in arg_leaves),
                self._probed,
            )
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compile(state_leaves, state_spec, arg_leaves, arg_spec)
        except Exception as error:  # noqa: BLE001 - anything capture or Inductor rejects
            first = str(error).splitlines()[0] if str(error) else ""
            hint = ""
            if "DataDependent" in type(error).__name__:
                hint = (
                    " (the model or guide reads a number from a tensor's values, such as "
                    "int(labels.max()), to choose a shape or a branch; computing it once, "
                    "outside, and passing it as an argument keeps the in-place step)"
                )
            self._capture_note = (
                f"the SVI step could not be captured as an in-place graph "
                f"({type(error).__name__}: {first[:300]}); running it through "
                f"torch.compile instead{hint}"
            )
            self._fallback = self._make_fallback()
            return None, None
        if key not in self._compiled:
            # graphs of earlier fingerprints cannot be called again
            self._compiled = {k: v for k, v in self._compiled.items() if k[-1] == key[-1]}
            self._compiled[key] = compiled
        for buffer, value in zip(compiled.buffers, state_leaves):
            if buffer is not value:  # new params (init_params, a non-finite step, a new run)
                buffer.copy_(value)
        inputs = compiled.buffers + [arg_leaves[i] for i in compiled.tensor_positions]
        run = compiled.runner(inputs)
        self._repeat = (
            compiled.state,
            (active, lrs, tuple(args), dict(kwargs)),
            compiled,
            run,
        )
        return compiled, run

    def _fingerprint(self, state_leaves, state_spec, arg_leaves, arg_spec) -> tuple:
        """Run the probe once, eagerly, recording the operations it makes (:class:`_OpRecord`):
        each with its non-tensor arguments and, for each tensor argument, where it came from
        (an input, an earlier operation's result) or, for a tensor from outside the call (a
        global, a closure, a module's buffer), a digest of its values. Equal records mean a
        graph compiled for one run is right for the next. This is what capturing the probe
        as a graph would tell (its code and its constants' values) at about a tenth of the
        cost: 4-5 ms against 50 ms per run for the logistic regression's loss."""
        leaves = [x.detach() if isinstance(x, torch.Tensor) else x for x in state_leaves]
        arg_values = [x.detach() if isinstance(x, torch.Tensor) else x for x in arg_leaves]
        state = pytree.tree_unflatten(leaves, state_spec)
        active, lrs, args, kwargs = pytree.tree_unflatten(arg_values, arg_spec)
        inputs = [x for x in (*leaves, *arg_values) if isinstance(x, torch.Tensor)]
        record = _OpRecord(inputs)
        try:
            with torch_validation(False), torch.random.fork_rng(devices=[]), record:
                self.probe(*state, active, lrs, args, kwargs)
        finally:
            self._after_trace()
        return (tuple(record.ops), self.settings())

    def _trace(self, fn, state_leaves, state_spec, arg_leaves, arg_spec):
        """``fn`` captured as an in-place graph on fake tensors; its tensor inputs are the
        state's leaves, then the arguments' tensor leaves."""
        from torch.fx.experimental.proxy_tensor import make_fx

        num_state = len(state_leaves)
        tensor_positions = [i for i, x in enumerate(arg_leaves) if isinstance(x, torch.Tensor)]

        def block_in_place(*flat):
            leaves = list(arg_leaves)
            for position, value in zip(tensor_positions, flat[num_state:]):
                leaves[position] = value
            active, lrs, args, kwargs = pytree.tree_unflatten(leaves, arg_spec)
            state = pytree.tree_unflatten(list(flat[:num_state]), state_spec)
            *new_state, report = fn(*state, active, lrs, args, kwargs)
            # every new value is computed before any buffer is written
            values = [v.clone() for v in pytree.tree_leaves(tuple(new_state))]
            for target, value in zip(flat[:num_state], values):
                target.copy_(value)
            return (report,)

        example = [x.detach() for x in state_leaves]
        example += [arg_leaves[i] for i in tensor_positions]
        try:
            with torch_validation(False), torch.random.fork_rng(devices=[]):
                gm = make_fx(block_in_place, tracing_mode="fake", _allow_non_fake_inputs=True)(
                    *example
                )
        finally:
            self._after_trace()
        _check_writes(gm, num_state)
        _replace_lift_fresh_copy(gm)
        return gm, tensor_positions

    def _compile(self, state_leaves, state_spec, arg_leaves, arg_spec) -> _Compiled:
        gm, tensor_positions = self._trace(
            self.block, state_leaves, state_spec, arg_leaves, arg_spec
        )
        if _OWN_MATVEC:
            use_own_matvec(gm)
        buffers = [x.detach().clone() for x in state_leaves]
        example = buffers + [arg_leaves[i] for i in tensor_positions]
        with torch_validation(False):
            # called as a recorded call replayed where one checked call shows that this
            # computes what the compiled artifact computes (generated_call.py)
            fn, pool = compile_graph(
                gm,
                example,
                self.compile_kwargs,
                written=range(len(buffers)),
                pool_buffers=True,
                replay=True,
            )
        return _Compiled(fn, pool, buffers, tensor_positions, state_spec)


class _OpRecord(TorchDispatchMode):
    """The operations made while active, each as ``(operator, argument structure, argument
    descriptions)``: a tensor is described by where it came from (``("input", k)``,
    ``("result", j, k)``) or, coming from outside, by :func:`_digest`; anything else by its
    ``repr``. An operation that would write into an input or an outside tensor (a module's
    running statistics, say) writes into a copy instead, so recording changes nothing."""

    def __init__(self, inputs: list[torch.Tensor]):
        super().__init__()
        self.ops: list[tuple] = []
        self._known = {id(t): ("input", k) for k, t in enumerate(inputs)}
        self._alive = list(inputs)  # keeps recorded tensors alive, so that ids stay unique

    def _describe(self, x):
        if not isinstance(x, torch.Tensor):
            return repr(x)
        found = self._known.get(id(x))
        if found is None:
            found = self._known[id(x)] = _digest(x)
            self._alive.append(x)
        return found

    def _protected(self, func, args, kwargs):
        """``args`` and ``kwargs`` with copies of the tensors ``func`` writes that did not
        come from an earlier operation (described as the originals)."""
        args, kwargs = list(args), dict(kwargs)
        for k, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            in_kwargs = argument.name in kwargs
            value = kwargs[argument.name] if in_kwargs else (args[k] if k < len(args) else None)
            if not isinstance(value, torch.Tensor):
                continue
            described = self._describe(value)
            if described[0] == "result":
                continue
            copy = value.clone()
            self._known[id(copy)] = described
            self._alive.append(copy)
            if in_kwargs:
                kwargs[argument.name] = copy
            else:
                args[k] = copy
        return tuple(args), kwargs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.is_mutable:
            args, kwargs = self._protected(func, args, kwargs)
        flat, spec = pytree.tree_flatten((args, kwargs))
        for a in flat:
            if isinstance(a, torch.Generator) and a is not torch.default_generator:
                # a captured graph would not draw from it (the draws came out of torch's
                # global generator, and so differed from compile=False's)
                raise RuntimeError(
                    f"{func} draws from a torch.Generator of the model's or guide's own "
                    f"(in a param's initial value, say), which a captured graph cannot keep"
                )
        self.ops.append((str(func), str(spec), tuple(self._describe(a) for a in flat)))
        out = func(*args, **kwargs)
        j = len(self.ops) - 1
        for k, t in enumerate(pytree.tree_leaves(out)):
            if isinstance(t, torch.Tensor):
                self._known[id(t)] = ("result", j, k)
                self._alive.append(t)
        return out


def _digest(t: torch.Tensor) -> tuple:
    """Shape, layout, dtype, device and a hash of the values of ``t``."""
    flat = t.detach().contiguous().cpu().reshape(-1)
    if flat.numel() and flat.stride(-1) != 1:
        # torch calls a size-1 dim of any stride contiguous: expand([1]) of a scalar (Pyro's
        # PyroSample(Normal(0, 10).expand([1]).to_event(1))) has stride 0, which view refuses
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    data = flat.view(torch.uint8).numpy().tobytes()
    return (tuple(t.shape), t.stride(), t.dtype, t.device, hashlib.sha1(data).hexdigest())


def _base(node):
    """The node whose memory a chain of views of ``node`` reads."""
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and getattr(node.target, "is_view", False)
    ):
        node = node.args[0]
    return node


def _check_writes(gm: torch.fx.GraphModule, num_state: int) -> None:
    """Raise if the graph writes into an input other than the state buffers (its first
    inputs) or into a constant it captured (a module's buffer)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    protected = set(placeholders[num_state:])
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for argument, value in zip(schema.arguments, node.args):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            base = _base(value)
            if isinstance(base, torch.fx.Node) and (base in protected or base.op == "get_attr"):
                raise RuntimeError(
                    f"the SVI step writes into {base.name} ({node.target}); only its "
                    f"parameters and optimizer state can be updated in place"
                )
