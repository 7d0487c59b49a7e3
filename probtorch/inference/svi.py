"""Stochastic variational inference: fit a guide's parameters by maximizing an ELBO.

How a step runs. ``SVI.init`` runs guide and model once, eagerly, with validation (errors
name the site), and creates the parameters in a store owned by this SVI object. From then on
the parameters are one flat tensor of unconstrained values. One step is a pure function

    (flat, optimizer state, baseline state) -> (new flat, new states, loss)

that puts the flat values into ``pt.param`` sites (and into the parameters of modules
registered with ``pt.module``) through a handler, evaluates the ELBO's surrogate loss, takes
its gradient with ``torch.func.grad_and_value`` and applies the optimizer's functional
update. ``steps_per_call`` such steps, unrolled, form one function, called from a host loop;
the learning rates are a tensor argument, so schedules do not recompile. :meth:`SVI.run`
compiles it as a graph that updates the state in place, without Dynamo, checked once per run
(:mod:`.svi_block`); :meth:`SVI.step` and any function that cannot be captured that way use
``torch.compile(fullgraph=True)`` (no graph breaks); a step that Dynamo cannot capture as
one graph (Python that reads tensor values) runs eagerly from then on, with a warning that
says why and where. A data matrix used only in
matrix-vector products is passed with its long side contiguous (:mod:`.data_layout`).
Random numbers come
from torch's global generator (compiled with Inductor's ``fallback_random``), whose state
SVI keeps for itself, so ``compile=False`` runs the same function eagerly with the same
draws and the same losses.

A step whose loss or gradient is not finite is not applied: the run stops, warns, and
keeps the parameters at which the last finite loss was computed.

Example::

    >>> import torch, probtorch as pt, probtorch.distributions as dist
    >>> from probtorch.inference import SVI, Trace_ELBO
    >>> def model(y):
    ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pt.plate("n", len(y)):
    ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> def guide(y):
    ...     loc = pt.param("loc", torch.tensor(0.0))
    ...     scale = pt.param("scale", torch.tensor(1.0), constraint=dist.constraints.positive)
    ...     pt.sample("mu", dist.Normal(loc, scale))
    >>> svi = SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    >>> result = svi.run(500, torch.full((10,), 3.0), progress_bar=False)
    >>> abs(float(result.params["loc"]) - 3.0) < 0.2, result.losses.shape   # posterior: N(3, 0.32)
    (True, torch.Size([500]))
"""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import os
import time
import warnings
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch.distributions import constraints

from .._caller import warn_at_caller
from .._errors import explaining_rng_key
from ..distributions.constraint_registry import biject_to
from ..handlers import _named_site_log_prob, replay, site_log_prob
from ..optim import Optimizer
from ..params import _SVI_STORES, ParamStore, note_fitted, param_scope, same_constraint
from ..runtime import Message, Messenger
from ..validation import (
    ObservationOutsideSupportError,
    check_observation,
    is_validation_enabled,
    observation_in_support,
    torch_validation,
)
from .compile import (
    _FALSE,
    _fresh_function,
    compile_enabled,
    inductor_base_options,
    inference_threads,
    skip_guards,
)
from .data_layout import DataLayout
from .elbo import ELBO, _Record, _Seeded
from .mcmc.executor import deferred_interrupts
from .svi_block import InPlaceBlock
from .uncompilable import eager_fallback_note

__all__ = ["SVI", "SVIRunResult", "NonFiniteLossError"]


class NonFiniteLossError(RuntimeError):
    """The loss or its gradient became NaN or infinite during SVI."""


def _generator_states() -> tuple:
    """The CPU generator's state and, where CUDA is in use, every CUDA generator's."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None


def _restore_generators(states: tuple) -> None:
    torch.random.set_rng_state(states[0])
    if states[1] is not None:
        torch.cuda.set_rng_state_all(states[1])


class SVIRunResult(NamedTuple):
    """What :meth:`SVI.run` returns: constrained parameter values and the loss of each step."""

    params: dict[str, torch.Tensor]
    losses: torch.Tensor


class _ParamValues(Messenger):
    """Serve ``param`` sites from the flat parameter vector of the current step."""

    def __init__(self, values: dict[str, torch.Tensor], param_constraints: dict):
        super().__init__()
        self.values = values
        self.param_constraints = param_constraints

    def process_message(self, msg: Message) -> None:
        if msg.type != "param" or msg.value is not None:
            return
        if msg.name not in self.values:
            looped = msg.extra.get("looped_plates")
            raise ValueError(
                f"param {msg.name!r} did not exist when SVI was initialized; all params must "
                f"be created in the first run of the model and guide (call svi.init again, "
                f"or make a new SVI)"
                + (
                    f". It lies in a loop over the rows of the subsampled plate "
                    f"{looped[0]!r}, whose rows change every step: make one param for all "
                    f"rows and index it by the row (pt.param('loc', torch.zeros(size))[i])"
                    if looped
                    else ""
                )
            )
        value = self.values[msg.name]
        constraint = self.param_constraints[msg.name]
        msg.value = value if constraint is constraints.real else biject_to(constraint)(value)


_OUTSIDE = "an observed value lies outside its distribution's support"


class _ObservationsInSupport(Messenger):
    """Whether the observed values of one run of guide and model lie in their supports:
    :meth:`flag` is a 0-d bool tensor, computed inside the step and read with its loss.

    ``SVI.init`` checks the data of its first call eagerly; the compiled step cannot raise,
    so a later call with other data (a minibatch through ``svi.step(batch)``, a second
    ``run``) reports through this flag, and the host names the site
    (:meth:`SVI._invalid_observation`). Off with ``pt.enable_validation(False)``.
    """

    def __init__(self):
        super().__init__()
        self.flags: list[torch.Tensor] = []

    def postprocess_message(self, msg: Message) -> None:
        if msg.type == "sample" and msg.is_observed and isinstance(msg.value, torch.Tensor):
            flag = observation_in_support(msg.fn, msg.value)
            if flag is not None:
                self.flags.append(flag)

    def flag(self, device) -> torch.Tensor:
        if not self.flags:
            return torch.ones((), dtype=torch.bool, device=device)
        return torch.stack(self.flags).all()


def _module_buffers(written: list, start: int = 0) -> dict:
    """``key -> (module, attribute, buffer)`` for the buffers that the modules called by the
    model and guide wrote in place when they ran at set-up (``written``).

    A forward call in training mode updates buffers in place (BatchNorm's running mean,
    variance and batch count). The step's gradient transform refuses writes into tensors
    it did not receive, so those buffers are part of the step's state: each step puts copies
    into the modules, and keeps what the forward calls leave there (see
    :meth:`SVI._swap_modules`); after a step the modules' own buffers hold the values.
    Buffers that are only read (a positional encoding, say) stay constants of the step.
    """
    found = {}
    for module, attr in written:
        buffer = module._buffers.get(attr)
        if buffer is None:
            continue
        key = f"buffer:{start + len(found)}:{type(module).__name__}.{attr}"
        found[key] = (module, attr, buffer)
    return found


class _Layout(NamedTuple):
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    sizes: tuple[int, ...]
    dtypes: tuple[torch.dtype, ...]
    constraints: dict
    dtype: torch.dtype
    device: torch.device


@contextlib.contextmanager
def _module_calls(found: list, written: list):
    """Record every module called inside the block (to find owners of module params) in
    ``found``, and in ``written`` the ``(module, attribute)`` of each buffer the calls
    updated in place (BatchNorm's running statistics in training mode), which are put back
    as they were before: set-up is not a step."""
    before: dict = {}

    def pre_hook(module, args):
        if id(module) not in before:
            saved = {
                k: (b._version, b.detach().clone())
                for k, b in module._buffers.items()
                if b is not None
            }
            before[id(module)] = (module, saved)
        found.append(module)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    try:
        yield found
    finally:
        handle.remove()
        with torch.no_grad():
            for module, saved in before.values():
                # a kernel's own write (batch_norm's running statistics) leaves the version
                # counter alone: values are compared too; a module that wrote one of its
                # buffers has all of them in the step's state
                changed = [
                    attr
                    for attr, (version, value) in saved.items()
                    if _buffer_changed(module._buffers.get(attr), version, value)
                ]
                if not changed:
                    continue
                written.extend((module, attr) for attr in saved)
                for attr in changed:
                    current, value = module._buffers[attr], saved[attr][1]
                    if current.shape == value.shape:
                        current.copy_(value)


def _buffer_changed(current, version: int, value: torch.Tensor) -> bool:
    if current is None:
        return False
    if current._version != version or current.shape != value.shape:
        return True
    return not torch.equal(current, value)


# Inductor's Python wrapper runs between the kernels of every step: with ``cpp_wrapper``
# that host code is C++, and the checks of sizes, strides and alignments it would make on
# every call are left out (the graph is compiled for fixed shapes). About 20% shorter
# logistic-regression steps (N=5000, D=25, 8 steps per call) on one CPU.
_INDUCTOR_OPTIONS = {
    "cpp.threads": 1,
    "fallback_random": True,
    "cpp_wrapper": True,
    "size_asserts": False,
    "alignment_asserts": False,
    "scalar_asserts": False,
}


# The in-place block (SVI.run) keeps Inductor's Python host code: one call of it is
# recorded and replayed without it (kernels, BLAS calls and random draws into fixed buffers;
# generated_call.CallTape), which the C++ host code does not allow. Logistic regression
# (N=5000, D=25, one core): 77 -> 56 us per step at one step per call, 56 -> 47 at eight.
_IN_PLACE_OPTIONS = {"cpp_wrapper": False}


def _register_fallbacks() -> None:
    """Give Inductor explicit fallback lowerings for the :data:`_KEPT_OPS`.

    Inductor lowers an op that has neither a lowering nor a decomposition by falling back to
    its ATen kernel, but when the environment variable ``CI`` is set it refuses to do that
    for an op that torch can decompose (``make_fallback(aten.mv.default): a decomposition
    exists``). Registering the fallback explicitly, without the warning, is what Inductor
    does for its own fallbacks; ordinary ``torch.compile`` calls still decompose these ops
    before lowering and never reach it.
    """
    from torch._inductor import lowering

    for op in _kept_ops(_KEPT_OPS):
        if op not in lowering.lowerings:
            lowering.make_fallback(op, warn=False, override_decomp=True)


# Ops the compiled SVI step keeps as ATen calls instead of decomposing them (see
# _compile_options). Changing this tuple changes the decomposition table's cache key.
_KEPT_OPS = ("bernoulli.default", "mv.default", "dot.default")


def _kept_ops(names: tuple) -> list:
    """The ATen overloads named ``packet.overload`` in ``names``."""
    return [getattr(getattr(torch.ops.aten, n.split(".")[0]), n.split(".")[1]) for n in names]


class _DecompositionTable(dict):
    """Inductor's decomposition table without the :data:`_KEPT_OPS`, with a stable pickle.

    Inductor's FX graph cache pickles the decomposition table to build its cache key; the
    table's values include C++ (pybind11) functions, which cannot be pickled, so a plain
    dict made every SVI compile bypass the cache and run Inductor again in every process
    (about 1.2 s of a logistic-regression step's 2.3 s compile with warm caches). This
    table pickles as the call that rebuilds it, so the key names the kept ops (Inductor's
    own key covers torch's version and code).
    """

    def __reduce__(self):
        return _decomposition_table, (_KEPT_OPS,)


@functools.cache
def _decomposition_table(kept_ops: tuple) -> _DecompositionTable:
    from torch._inductor import config as inductor_config
    from torch._inductor.decomposition import select_decomp_table

    with inductor_config.patch(fallback_random=True):
        table = _DecompositionTable(select_decomp_table())
    for op in _kept_ops(kept_ops):
        table.pop(op, None)
    return table


def _compile_kwargs() -> dict:
    """Inductor ``compile_fx`` arguments for the SVI step: draws equal to eager draws.

    ``fallback_random`` makes Inductor call torch's samplers (and so torch's generator) as
    eager code does. ``aten.bernoulli`` is still decomposed into ``rand < p`` before
    Inductor sees it, which draws other numbers than eager ``torch.bernoulli``; without that
    decomposition it runs as torch's sampler. This uses Inductor's private decomposition
    table; if it is missing, only Bernoulli draws differ between compiled and eager runs.

    ``aten.mv`` and ``aten.dot`` are not decomposed either: Inductor would turn them into
    its own pointwise-and-reduction loops, which made ``X @ beta`` (and its gradient, a
    second matrix-vector product) the slowest part of a logistic-regression step (~1.7x
    slower steps at N=5000, D=25); undecomposed they run as BLAS calls, as in eager mode.
    The table keeps Inductor's FX graph cache working (:class:`_DecompositionTable`).
    """
    table = _decomposition_table(_KEPT_OPS)
    _register_fallbacks()
    return {
        "config_patches": {**inductor_base_options(), **_INDUCTOR_OPTIONS},
        "decompositions": table,
    }


def _compile_options() -> dict:
    """``torch.compile`` arguments for the SVI step (:func:`_compile_kwargs`)."""
    try:
        from torch._inductor.compile_fx import compile_fx

        return {"backend": functools.partial(compile_fx, **_compile_kwargs())}
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - other torch versions
        return {"options": {**inductor_base_options(), **_INDUCTOR_OPTIONS}}


class _EagerSteps:
    """Whether an SVI's steps run eagerly, shared by its blocks (one per number of steps
    per call, in place or not): once Dynamo has refused the step, a new block does not
    try again, nor warn again. ``allowed`` says whether a refusal may switch to eager."""

    def __init__(self, allowed: Callable[[], bool]):
        self.allowed = allowed
        self.because: Exception | None = None


class _ShapeKeyedBlock:
    """The block compiled by ``torch.compile`` once per set of argument shapes, each graph
    static (for :meth:`SVI.step`, and where the in-place block cannot be captured).

    Dynamo's own answer to a new shape, a graph with symbolic sizes, fails for some
    operations under the step's gradient transform (``dropout``: "Cannot call numel() on
    tensor with symbolic sizes"), and one function compiled once per shape fails at
    Dynamo's recompile limit (the ninth shape). A function of its own per shape (a fresh
    code object, so its own cache and limit) has neither problem: a data loader's last,
    smaller batch compiles one more graph, as ``jax.jit`` would. Past
    :data:`_MANY_SHAPES` shapes it warns once (each compile takes seconds).
    """

    def __init__(
        self,
        block: Callable,
        options: dict,
        restore: Callable[[], None],
        eager: _EagerSteps,
    ):
        self.block = block
        self.options = options
        self.restore = restore
        self.eager = eager
        self.compiled: dict = {}

    @property
    def eager_because(self) -> Exception | None:
        """Dynamo's error, once the steps run eagerly."""
        return self.eager.because

    def __call__(self, *args):
        if self.eager_because is not None:
            return self.block(*args)
        leaves, spec = torch.utils._pytree.tree_flatten(args)
        key = (spec, tuple(_shape_key(x) for x in leaves))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = torch.compile(
                _fresh_function(self.block), fullgraph=True, dynamic=False, **self.options
            )
            self.compiled[key] = compiled
            if len(self.compiled) == _MANY_SHAPES + 1:
                warn_at_caller(_many_graphs_note(list(self.compiled)))
        try:
            return compiled(*args)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError) as error:
            # an error the user's code raises while traced reaches here as Dynamo's
            # "Observed exception": the step run eagerly raises it as it is
            try:
                with torch.random.fork_rng(devices=[]):
                    self.block(*args)
            except Exception as eager_error:  # noqa: BLE001 - the user's own error
                raise eager_error from error
            finally:
                self.restore()
            if not self.eager.allowed():
                raise error  # (the caller retries another way: floats as numbers)
            # the step runs eagerly: Python that reads values (`if z > 0:`) is what
            # Dynamo cannot capture, and it is what Pyro's SVI runs (as the samplers do)
            self.eager.because = error
            warn_at_caller(_eager_note(error))
            return self.block(*args)


_MANY_SHAPES = 8


def _many_graphs_note(keys: list) -> str:
    """The warning once the step has been compiled for :data:`_MANY_SHAPES` + 1 argument
    keys (:func:`_shape_key`): new tensor shapes, or new values of other arguments, which
    the compiled step holds as constants (a Python list of minibatch indices, say)."""
    tensor_keys = {tuple(k for k in key if k and k[0] != "value") for _, key in keys}
    if len(tensor_keys) > 1:
        return (
            f"SVI.step has been compiled for {len(keys)} different argument shapes, and each "
            f"new shape compiles again (seconds each): pad the data to a few batch sizes (or "
            f"use drop_last=True in a DataLoader), or run SVI(..., compile=False)"
        )
    return (
        f"SVI.step has been compiled for {len(keys)} different values of its non-tensor "
        f"arguments (numbers, lists, tuples), which the compiled step holds as constants, and "
        f"each new value compiles again (seconds each): pass values that change from step "
        f"to step as tensors (minibatch indices as torch.tensor(idx)), or run "
        f"SVI(..., compile=False)"
    )


def _numpy_as_tensors(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The step's arguments with their numeric numpy arrays as tensors (sharing memory; a
    read-only array copied), for the compiled step: Dynamo converts a numpy input itself,
    but under the step's gradient transform its guard on the converted tensor fails on the
    frame that made it (torch 2.13: "Guard failed on the same frame it was created ...
    dispatch key set mismatch"). Eager steps take the arrays as they are.

    >>> import numpy as np
    >>> args, kwargs = _numpy_as_tensors((np.ones(2), 3.0), {"y": np.arange(2)})
    >>> args, kwargs
    ((tensor([1., 1.], dtype=torch.float64), 3.0), {'y': tensor([0, 1])})
    """

    def convert(x):
        if not isinstance(x, np.ndarray) or x.dtype.kind not in "biufc":
            return x
        return torch.from_numpy(x if x.flags.writeable else x.copy())

    if not any(isinstance(x, np.ndarray) for x in (*args, *kwargs.values())):
        return args, kwargs
    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}


def _shape_key(x) -> tuple:
    """A tensor by its shape, dtype and device; anything else by its value (a number the
    step holds as a constant) where it has one."""
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device)
    try:
        hash(x)
    except TypeError:
        return (type(x),)
    return ("value", type(x), x)


def _eager_note(error: Exception) -> str:
    """The warning of a step that runs eagerly because Dynamo cannot capture it as one
    graph, with why, where, and what keeps it compiled."""
    return (
        f"{eager_fallback_note('running the SVI step eagerly', error, ' to SVI')}. "
        f"Python code that reads the values of tensors computed in the model or guide "
        f"(`if z > 0:`, `.item()`, `int(x)`), or that creates objects such as a "
        f"torch.Generator there, cannot be compiled: torch operations such as torch.where, "
        f"or such numbers and objects made outside and passed in, keep the step compiled "
        f"(several times faster)"
    )


def _never() -> bool:
    return False


class _BarFeed:
    """Feeds a tqdm bar the steps done and their mean loss at most every ``interval``
    seconds: updating it and formatting the loss after every block cost about 15 us per
    block, a sixth of a logistic-regression step at one step per block."""

    def __init__(self, bar, interval: float = 0.1):
        self.bar = bar
        self.interval = interval
        self.steps = 0
        self.loss_sum = 0.0
        self.next_time = time.monotonic()

    def add(self, losses: list) -> None:
        self.steps += len(losses)
        self.loss_sum += sum(losses)
        if time.monotonic() >= self.next_time:
            self.flush()

    def flush(self) -> None:
        if self.steps:
            self.bar.update(self.steps)
            self.bar.set_postfix_str(f"loss={self.loss_sum / self.steps:.4g}", refresh=False)
            self.steps, self.loss_sum = 0, 0.0
        self.next_time = time.monotonic() + self.interval


def _fitting_guide(method: Callable) -> Callable:
    """An SVI method during which an autoguide reads its params through the handlers SVI
    sets up, and after which it reads them from this SVI's store (``fitted_store``)."""

    @functools.wraps(method)
    def fitting(self, *args, **kwargs):
        guide = self.guide
        note_fitted(self.model, self.param_store)  # for Predictive: fitted_store_of
        note_fitted(guide, self.param_store)
        if not hasattr(guide, "fitted_store"):
            return method(self, *args, **kwargs)
        guide.fitted_store = self.param_store
        was, guide.fitting = guide.fitting, True  # a bool: compiled steps guard on it
        try:
            return method(self, *args, **kwargs)
        finally:
            guide.fitting = was

    return fitting


class SVI:
    """Stochastic variational inference: ``SVI(model, guide, optim, loss)``.

    Args:
        model: the model function.
        guide: a callable with the model's arguments that samples every latent site of the
            model, with parameters from ``pt.param`` (or modules registered with
            ``pt.module``).
        optim: a :mod:`probtorch.optim` optimizer, e.g. ``pt.optim.Adam(lr=1e-2)``.
        loss: an ELBO, e.g. ``Trace_ELBO()``.
        compile: compile the step (default: ``PROBTORCH_COMPILE``, on); ``False`` runs the
            same step eagerly with the same results.
        seed: seed of the random numbers of this SVI object (kept separately from the
            caller's generator state, which SVI leaves untouched).
        steps_per_call: optimization steps unrolled into one compiled call in :meth:`run`.
            More steps per call cost less host time per step but compile for longer (on a
            small logistic regression: ~4 s and ~8k steps/s with 1, ~15 s and ~16k steps/s
            with 4, on one loaded core); worth it for runs of many thousands of steps. A
            last, partial block runs masked steps, which still draw random numbers, so
            ``run(10); run(20)`` equals ``run(30)`` only when ``steps_per_call`` divides 10.
            With more than one step per call Inductor may order the random draws of
            independent sites of different steps differently from eager code: compiled and
            eager losses are then equal in distribution, not draw for draw.

    The parameters live in ``svi.param_store``, owned by this object; ``pt.param`` outside
    inference keeps using the default store. A second :meth:`run` continues from the
    current parameters and optimizer state; ``run(..., init_params=result.params)`` starts
    from given parameters with a fresh optimizer state. Changes made to the store between
    steps (``svi.param_store[name] = value``, ``set_state``, ``load``, ``clear``, or a
    registered module's ``load_state_dict``) are what the next step starts from; writes
    through ``.data`` are not seen (write under ``torch.no_grad()`` instead). Outside SVI an
    autoguide reads its params from the store of the last SVI that fitted it (stepped,
    ran or evaluated it), so ``guide()``, ``guide.median()``, ``guide.quantiles(...)`` and
    ``Predictive(model, guide=guide)`` after ``svi.step`` show the fitted guide, as in Pyro;
    inside ``pt.param_scope(store)`` it reads that store.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference import SVI, Trace_ELBO
        >>> def model():
        ...     pt.sample("z", dist.Normal(1.0, 2.0))
        >>> def guide():
        ...     pt.sample("z", dist.Normal(pt.param("m", torch.tensor(0.0)), 2.0))
        >>> svi = SVI(model, guide, pt.optim.SGD(lr=0.1), Trace_ELBO(), compile=False)
        >>> loss = svi.step()
        >>> sorted(svi.get_params())
        ['m']
    """

    def __init__(
        self,
        model: Callable,
        guide: Callable,
        optim: Optimizer,
        loss: ELBO,
        *,
        compile: bool | None = None,
        seed: int = 0,
        steps_per_call: int = 1,
    ):
        if not isinstance(optim, Optimizer):
            raise TypeError(
                f"optim must be a probtorch optimizer such as pt.optim.Adam(lr=1e-2), got "
                f"{type(optim).__name__}"
            )
        if not isinstance(loss, ELBO):
            raise TypeError(f"loss must be an ELBO such as Trace_ELBO(), got {loss!r}")
        if int(steps_per_call) < 1:
            raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
        self.model = model
        self.guide = guide
        self.optim = optim
        self.loss = loss
        self.compiled = compile_enabled(compile)
        self.seed = int(seed)
        self.steps_per_call = int(steps_per_call)
        self.param_store = ParamStore()
        _SVI_STORES.add(self.param_store)
        self._rng_state = None
        self._initialized = False
        self._blocks: dict[tuple, Callable] = {}
        self._data_layout: DataLayout | None = None
        self._inputs_cache: tuple = (None, None)

    # -- random numbers ------------------------------------------------------------------
    @contextlib.contextmanager
    def _rng(self):
        """Use this SVI's random stream; the caller's generator state is restored after."""
        saved = _generator_states()
        if self._rng_state is None:
            torch.manual_seed(self.seed)
        else:
            _restore_generators(self._rng_state)
        try:
            yield
        finally:
            self._rng_state = _generator_states()
            _restore_generators(saved)

    # -- set-up --------------------------------------------------------------------------
    @_fitting_guide
    def init(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Run guide and model once, eagerly, with checks; create the parameters.

        Returns the initial constrained parameter values. Called by :meth:`step` and
        :meth:`run` when needed.
        """
        called: list = []
        written: list = []
        with (
            self._rng(),
            param_scope(self.param_store),
            _module_calls(called, written),
            explaining_rng_key(args, "SVI.init(*args)", "SVI(seed=)"),
        ):
            self._plan = self.loss.prepare(self.model, self.guide, args, kwargs)
        # eager steps may run other sites each (a loop over a subsampled plate's rows)
        self._plan.sites_may_change = not self.compiled
        store = self.param_store
        if len(store) == 0:
            raise ValueError(
                "the model and guide create no parameters (pt.param / pt.module): there is "
                "nothing for SVI to fit"
            )
        names = tuple(store.keys())
        leaves = [store.unconstrained(n) for n in names]
        dtype = leaves[0].dtype
        for leaf in leaves[1:]:
            dtype = torch.promote_types(dtype, leaf.dtype)
        for name, leaf in zip(names, leaves):
            if not leaf.dtype.is_floating_point:
                raise ValueError(f"param {name!r} has dtype {leaf.dtype}; params must be floats")
        self._layout = _Layout(
            names=names,
            shapes=tuple(leaf.shape for leaf in leaves),
            sizes=tuple(leaf.numel() for leaf in leaves),
            dtypes=tuple(leaf.dtype for leaf in leaves),
            constraints={n: store.constraint(n) for n in names},
            dtype=dtype,
            device=leaves[0].device,
        )
        self._module_owners = self._find_module_owners(names, leaves, called)
        self._module_buffers = _module_buffers(written)
        unique = dict.fromkeys(sub for caller in called for sub in caller.modules())
        self._called_modules = list(unique)
        self._flat = torch.cat([leaf.detach().reshape(-1).to(dtype) for leaf in leaves])
        self._last_good = self._flat.clone()  # a distinct tensor: aliasing would recompile
        self._opt_state = self.optim.init(self._flat)
        self._elbo_state = dict(self._plan.initial_state)
        for key, (_, _, buffer) in self._module_buffers.items():
            self._elbo_state[key] = buffer.detach().clone()
        self._blocks = {}
        self._data_layout = None
        self._inputs_cache = (None, None)
        self._float_inputs: bool | None = None  # Python floats passed as tensors (None: untried)
        self._trying_floats = False  # the first call with them as tensors is running
        # not while the floats are tried as tensors: that failure retries them as numbers,
        # compiled (_first_call_with_float_inputs)
        self._eager = _EagerSteps(allowed=lambda: not self._trying_floats)
        self._lifted_cache: tuple | None = None
        self._num_steps = 0  # steps taken, for messages
        self._initialized = True
        self._store_marks = self._marks()
        return self.get_params()

    def _marks(self) -> tuple:
        """What identifies what a step starts from: each param leaf's name, object and
        version counter (which every in-place write bumps, e.g. a module's
        ``load_state_dict``), the same of the module buffers in the step's state, and the
        training flags of the modules the model and guide call."""
        store = self.param_store
        leaves = ((n, store.unconstrained(n)) for n in store)
        params = tuple((n, id(leaf), leaf._version) for n, leaf in leaves)
        buffers = tuple(
            (key, id(module._buffers.get(attr)), getattr(module._buffers.get(attr), "_version", 0))
            for key, (module, attr, _) in self._module_buffers.items()
        )
        modules = self._called_modules
        parameters = (p for m in modules for p in m._parameters.values() if p is not None)
        trainable = (p.requires_grad for p in parameters)
        return params, buffers, tuple(m.training for m in modules), tuple(trainable)

    def _adopt_store_edits(self, args, kwargs) -> None:
        """Train from the store's values where they were changed since the last step
        (``svi.param_store[name] = value``, ``set_state``, ``load``, a module's
        ``load_state_dict``): the optimizer state is kept for params of the same shapes and
        constraints; other changes (new, removed or reshaped params) set the SVI up again.
        Module buffers written since (``reset_running_stats``) are the step's buffers from
        now on, and a module switched to training mode is checked for buffers it writes."""
        marks = self._marks()
        if marks == self._store_marks:
            return
        old = self._store_marks
        if marks[3] != old[3]:
            # a module's parameters frozen or unfrozen (requires_grad_): the frozen ones
            # leave the fitted params, as pt.module registers only trainable ones
            store = self.param_store
            for name in [n for n in store if "$$$" in n]:
                if not store.unconstrained(name).requires_grad:
                    del store[name]
            self.init(*args, **kwargs)
            return
        if marks[0] != old[0]:
            store, layout = self.param_store, self._layout
            same = tuple(store.keys()) == layout.names and all(
                store.unconstrained(n).shape == shape
                and store.unconstrained(n).dtype == dtype
                and same_constraint(store.constraint(n), layout.constraints[n])
                for n, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes)
            )
            if not same:
                self.init(*args, **kwargs)
                return
            self._flat = torch.cat(
                [store.unconstrained(n).detach().reshape(-1).to(layout.dtype) for n in layout.names]
            )
            self._last_good = self._flat.clone()
        if marks[1] != old[1]:
            for key, (module, attr, _) in list(self._module_buffers.items()):
                current = module._buffers[attr]
                self._module_buffers[key] = (module, attr, current)
                self._elbo_state[key] = current.detach().clone()
        if marks[2] != old[2]:
            self._detect_buffer_writes(args, kwargs)
        self._store_marks = self._marks()

    def _detect_buffer_writes(self, args, kwargs) -> None:
        """Run the loss once, eagerly, to find buffers the modules now write (a module
        switched to training mode since set-up) and add them to the step's state."""
        known = self._module_buffers
        called: list = []
        written: list = []
        loss_state = {k: v for k, v in self._elbo_state.items() if k not in known}
        self._module_buffers = {}
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), torch_validation(False):
                with _module_calls(called, written):
                    self._surrogate(self._flat, loss_state, args, kwargs)
        finally:
            self._module_buffers = known
            self._swap_modules(None)
        seen = {(id(m), attr) for m, attr, _ in known.values()}
        new = [(m, attr) for m, attr in written if (id(m), attr) not in seen]
        for key, entry in _module_buffers(new, start=len(known)).items():
            known[key] = entry
            self._elbo_state[key] = entry[2].detach().clone()

    def _find_module_owners(self, names, leaves, called) -> dict:
        """``name -> [(module, attribute)]`` for params that are parameters of called modules.

        A module reads its own parameters, not ``pt.param``'s value, so the step swaps the
        step's values into the modules that own them (as ``torch.func.functional_call``).
        """
        by_id = {id(leaf): name for name, leaf in zip(names, leaves)}
        owners: dict[str, list] = {}
        seen = set()
        # Submodules of a called module count too: nn.MultiheadAttention reads
        # out_proj.weight without calling out_proj.
        for module in (sub for caller in called for sub in caller.modules()):
            if id(module) in seen:
                continue
            seen.add(id(module))
            for attr, p in module._parameters.items():
                if p is not None and id(p) in by_id:
                    owners.setdefault(by_id[id(p)], []).append((module, attr))
        for name, leaf in zip(names, leaves):
            if "$$$" in name and isinstance(leaf, torch.nn.Parameter) and name not in owners:
                raise ValueError(
                    f"param {name!r} was registered with pt.module, but its module was not "
                    f"called while the model and guide ran; SVI trains module parameters "
                    f"through the module's forward call"
                )
        return owners

    # -- the step ------------------------------------------------------------------------
    def _unpack(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        layout = self._layout
        values = {}
        for name, part, shape, dtype in zip(
            layout.names, flat.split(layout.sizes), layout.shapes, layout.dtypes
        ):
            part = part.reshape(shape)
            values[name] = part if dtype == layout.dtype else part.to(dtype)
        return values

    def _swap_modules(self, values: dict | None, state: dict | None = None) -> None:
        """Put ``values`` into the owning modules, and copies of the buffers in ``state``
        into theirs (``None``: put the stored leaves and the modules' own buffers back)."""
        for name, owners in self._module_owners.items():
            value = self.param_store.unconstrained(name) if values is None else values[name]
            for module, attr in owners:
                module._parameters[attr] = value
        for key, (module, attr, own) in self._module_buffers.items():
            # a copy: the forward call updates it in place (BatchNorm's running statistics)
            module._buffers[attr] = own if state is None else state[key].clone()

    def _surrogate(self, flat, elbo_state, args, kwargs):
        values = self._unpack(flat)
        buffers = self._module_buffers
        self._swap_modules(values, elbo_state)
        loss_state = {k: v for k, v in elbo_state.items() if k not in buffers}
        observed = _ObservationsInSupport()
        checks = observed if is_validation_enabled() else contextlib.nullcontext()
        with _ParamValues(values, self._layout.constraints), _Seeded(), checks:
            surrogate, loss, new_state = self.loss.compute(
                self.model, self.guide, args, kwargs, self._plan, loss_state
            )
        for key, (module, attr, _) in buffers.items():
            new_state[key] = module._buffers[attr]
        self._swap_modules(None)
        new_state = {k: v.detach() for k, v in new_state.items()}
        return surrogate, (loss.detach(), new_state, observed.flag(flat.device))

    def _block_function(self, num_steps: int) -> Callable:
        """``num_steps`` unrolled steps as one eager function (see the module docstring)."""
        grad_fn = torch.func.grad_and_value(self._surrogate, has_aux=True)
        update = self.optim.update

        def svi_block(flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs):
            losses, oks, valids = [], [], []
            alive = torch.ones((), dtype=torch.bool, device=flat.device)
            for k in range(num_steps):
                grad, (_, (loss, new_elbo_state, valid)) = grad_fn(flat, elbo_state, args, kwargs)
                ok = alive & active[k] & valid & torch.isfinite(loss) & torch.isfinite(grad).all()
                new_flat, new_opt_state = update(flat, grad, opt_state, lrs[k])
                # A non-finite step is not applied; last_good keeps the params at which the
                # last finite loss was computed.
                last_good = torch.where(ok, flat, last_good)
                flat = torch.where(ok, new_flat, flat)
                opt_state = tuple(torch.where(ok, n, o) for n, o in zip(new_opt_state, opt_state))
                elbo_state = {
                    key: torch.where(ok, new_elbo_state[key], elbo_state[key]) for key in elbo_state
                }
                alive = ok
                losses.append(loss)
                oks.append(ok)
                valids.append(valid)
            # one tensor (losses, then 1.0 for a step applied, then 1.0 for observations in
            # their supports): one read on the host
            losses = torch.stack(losses)
            report = torch.stack(
                [losses, torch.stack(oks).to(losses.dtype), torch.stack(valids).to(losses.dtype)]
            )
            return flat, opt_state, elbo_state, last_good, report

        return svi_block

    def _make_block(self, num_steps: int, in_place: bool) -> Callable:
        """The block of ``num_steps`` steps: eager (``compile=False``), compiled in place
        (:class:`~.svi_block.InPlaceBlock`, for :meth:`run`) or by ``torch.compile``,
        whose guards check every call (for :meth:`step`, and where capture fails)."""
        svi_block = self._block_function(num_steps)
        if not self.compiled:
            return svi_block
        options = _compile_options()

        def dynamo_block():
            return _ShapeKeyedBlock(
                svi_block,
                options,
                lambda: self._swap_modules(None),
                self._eager,
            )

        enabled = os.environ.get("PROBTORCH_SVI_IN_PLACE", "1").strip().lower() not in _FALSE
        if not (in_place and enabled) or "backend" not in options:
            return dynamo_block()
        kwargs = options["backend"].keywords
        return InPlaceBlock(
            svi_block,
            # Python host code: its call is recorded and replayed (generated_call.CallTape)
            {**kwargs, "config_patches": {**kwargs["config_patches"], **_IN_PLACE_OPTIONS}},
            fallback=dynamo_block,
            after_trace=lambda: self._swap_modules(None),
            probe=self._probe,
            settings=self._optimizer_settings,
        )

    def _optimizer_settings(self) -> str:
        """The optimizer's hyperparameters the compiled update holds as constants (the
        learning rate is an input of the block)."""
        optim = self.optim
        while not hasattr(optim, "hyper") and hasattr(optim, "optimizer"):
            optim = optim.optimizer  # a scheduler
        hyper = getattr(optim, "hyper", {})
        return repr(sorted((k, v) for k, v in hyper.items() if k != "lr"))

    def _probe(self, flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs):
        """The loss alone, as a block: what the in-place block captures again at the start
        of each run to see whether the model and guide still compute the same graph
        (:class:`~.svi_block.InPlaceBlock`)."""
        surrogate, (loss, new_elbo_state, _) = self._surrogate(flat, elbo_state, args, kwargs)
        report = torch.stack([surrogate.detach().to(loss.dtype), loss])
        return flat, opt_state, {**elbo_state, **new_elbo_state}, last_good, report

    def _block(self, num_steps: int, in_place: bool = True) -> Callable:
        key = (num_steps, in_place and self.compiled)
        if key not in self._blocks:
            self._blocks[key] = self._make_block(num_steps, in_place)
        return self._blocks[key]

    def _laid_out(self, args, kwargs) -> tuple[tuple, dict]:
        """The data arguments as the step reads them fastest (:mod:`.data_layout`): a data
        matrix used only in matrix-vector products is passed with its longer dimension
        contiguous. Chosen from one eager evaluation of the loss, the first time; then once
        per run (or step)."""
        if self.compiled:
            args, kwargs = _numpy_as_tensors(args, kwargs)
        if self._data_layout is None:

            def loss(*a, **k):
                try:
                    with torch_validation(False):
                        return self._surrogate(self._flat, self._elbo_state, a, k)
                finally:
                    self._swap_modules(None)

            self._data_layout = DataLayout.find(loss, args, kwargs)
        return self._data_layout.apply(args, kwargs)

    def _block_inputs(self, lrs: tuple, num_steps: int, num_active: int):
        """The block's learning-rate and active-step tensors, reused while they repeat (a
        constant learning rate makes the same tensors every call: ~4 us per call saved)."""
        key = (lrs, num_steps, num_active)
        if self._inputs_cache[0] != key:
            dtype, device = self._layout.dtype, self._layout.device
            tensors = (
                torch.tensor(lrs, dtype=dtype, device=device),
                torch.arange(num_steps, device=device) < num_active,
            )
            self._inputs_cache = (key, tensors)
        return self._inputs_cache[1]

    def _forget_arguments(self) -> None:
        for block in self._blocks.values():
            if isinstance(block, InPlaceBlock):
                block.forget_arguments()

    def _run_block(self, num_steps: int, num_active: int, args, kwargs, in_place: bool = True):
        """Run one block; returns ``(losses, oks, valids)`` lists of the ``num_active`` first
        steps (whether each was applied; whether its observations lay in their supports).
        ``args`` and ``kwargs`` are laid out already (:meth:`_laid_out`)."""
        lrs = self.optim.learning_rates(num_active) + [0.0] * (num_steps - num_active)
        lrs, active = self._block_inputs(tuple(lrs), num_steps, num_active)

        def call(args, kwargs):
            block = self._block(num_steps, in_place)
            try:
                with torch_validation(False):  # nothing to do inside run(): set already
                    return block(
                        self._flat,
                        self._opt_state,
                        self._elbo_state,
                        self._last_good,
                        active,
                        lrs,
                        args,
                        kwargs,
                    )
            finally:
                self._swap_modules(None)

        lifted = self._floats_as_tensors(args, kwargs)
        if lifted is None:
            out = call(args, kwargs)
        elif self._float_inputs:
            out = call(*lifted)
        else:
            out = self._first_call_with_float_inputs(call, lifted, args, kwargs)
        flat, opt_state, elbo_state, last_good, report = out
        self._flat, self._opt_state, self._elbo_state = flat, opt_state, elbo_state
        self._last_good = last_good
        # (slicing the tensor first costs more than the lists)
        losses, oks, valids = report.tolist()
        if num_active < num_steps:
            losses, oks, valids = losses[:num_active], oks[:num_active], valids[:num_active]
        return losses, [ok == 1.0 for ok in oks], [valid == 1.0 for valid in valids]

    def _floats_as_tensors(self, args, kwargs) -> tuple | None:
        """``(args, kwargs)`` with their Python floats as 0-d tensors of the params' dtype,
        for the compiled step; ``None`` where there is nothing to change (no float, eager
        steps, or a model that needs its floats as numbers: :meth:`_first_call_with_float_inputs`).

        A compiled step holds a Python float as a constant, so a new value (an annealing
        factor that changes every step) would compile the step again, and the ninth would
        hit Dynamo's recompile limit. As a tensor input it is one compiled step for any
        value. The same objects are returned while the arguments are the same objects (the
        in-place block recognizes the calls of one run by identity).
        """
        if not self.compiled or self._float_inputs is False:
            return None
        cached = self._lifted_cache
        if cached is not None and cached[0] is args and cached[1] is kwargs:
            return cached[2]
        if not any(type(x) is float for x in (*args, *kwargs.values())):
            lifted = None
        else:
            dtype, device = self._layout.dtype, self._layout.device

            def lift(x):
                return torch.tensor(x, dtype=dtype, device=device) if type(x) is float else x

            lifted = (tuple(lift(a) for a in args), {k: lift(v) for k, v in kwargs.items()})
        self._lifted_cache = (args, kwargs, lifted)
        return lifted

    def _first_call_with_float_inputs(self, call, lifted, args, kwargs):
        """The first compiled call with Python floats passed as tensors; where that cannot
        be compiled (the model branches on a float, or hands it to ``math.sqrt`` or to an
        argument that must be a number), the floats stay numbers, as in eager code, and
        each new value compiles the step again."""
        rng = _generator_states()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self._trying_floats = True
            try:
                out = call(*lifted)
            except Exception:  # noqa: BLE001 - retried with the floats as numbers
                out = None
            finally:
                self._trying_floats = False
        if out is not None:
            self._float_inputs = True
            for w in caught:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            return out
        _restore_generators(rng)
        self._float_inputs = False
        self._lifted_cache = None
        self._blocks = {}
        return call(args, kwargs)

    def _handle_failure(self, losses: list, oks: list, valids: list, done: int, args, kwargs):
        """``(failed step, message, data)`` for the first step not applied; ``data`` says
        whether an observed value outside its support stopped it. At the first step of a
        call (new data) the params stay those before it; later in a run, the data being the
        same, the params moved the support (``y ~ Uniform(0, b)``) and go back to the last
        step that passed, as they go back to the last finite step where the loss or its
        gradient was not finite."""
        bad = oks.index(False)
        failed = done + bad
        at_failure = self._flat
        if not valids[bad]:
            # (None: the support depends on values the diagnosis drew otherwise)
            found = self._invalid_observation(at_failure, args, kwargs) or _OUTSIDE
            if failed == self._num_steps:
                kept = "the step was not applied; the params are those before it"
            else:
                self._flat = self._last_good
                kept = (
                    f"the params are kept from step {failed - 1}, the last step whose "
                    f"observations lay in their supports"
                )
            return failed, f"SVI: at step {failed} (counting from 0), {found}; {kept}", True
        self._flat = self._last_good
        loss = losses[bad]
        what = "the loss" if not math.isfinite(loss) else "the gradient of the loss"
        if failed == 0:
            where = "at step 0, the first step; the params are the initial ones"
        else:
            where = (
                f"at step {failed} (counting from 0); the params are kept from step "
                f"{failed - 1}, the last step with a finite loss"
            )
        sites = self._nonfinite_sites(at_failure, args, kwargs)
        hint = f" Non-finite log densities at: {', '.join(sites)}." if sites else ""
        message = (
            f"SVI: {what} is not finite ({loss}) {where}.{hint} Lower the learning rate, "
            f"check the constraints and initial values of the params, or use "
            f"pt.optim.ClippedAdam."
        )
        return failed, message, False

    def _eager_traces(self, flat, args, kwargs):
        """``(guide trace, model trace)`` of one eager run at ``flat``, without checks, from
        a copy of the random stream (diagnosis only)."""
        values = self._unpack(flat)
        try:
            self._swap_modules(values)
            with torch.random.fork_rng(devices=[]), torch.no_grad(), torch_validation(False):
                with _ParamValues(values, self._layout.constraints), _Seeded():
                    guide_rec = _Record()
                    guide_rec.fn = self.guide
                    guide_rec(*args, **kwargs)
                    model_rec = _Record()
                    model_rec.fn = replay(self.model, trace=guide_rec.trace)
                    model_rec(*args, **kwargs)
        finally:
            self._swap_modules(None)
        return guide_rec.trace, model_rec.trace

    @contextlib.contextmanager
    def _naming_the_site(self, args, kwargs):
        """Raise an error of a step, where torch's arithmetic raised it (data of another
        shape than the first call's, which the first call's checks did not see: ``size of
        tensor a (7) must match ... (5)``, or Dynamo's fake-tensor error while compiling for
        the new shape), as the error of one eager run with checks that names the site, its
        distribution and the shapes (Pyro: "Error while computing log_prob at site")."""
        try:
            yield
        except Exception as error:
            named = self._site_error(args, kwargs)
            if named is None:
                raise
            raise named from error

    def _site_error(self, args, kwargs) -> Exception | None:
        """The error of the first site whose log density fails in one eager run at the
        current params (:func:`~probtorch.handlers._named_site_log_prob`), or None."""
        if not self._initialized:
            return None
        try:
            traces = self._eager_traces(self._flat, args, kwargs)
        except Exception:  # noqa: BLE001 - diagnosis only: the step's error is raised
            return None
        try:
            with torch.no_grad():
                for tr in traces:
                    for site in tr.values():
                        if site.type == "sample":
                            _named_site_log_prob(site)
        except Exception as error:  # noqa: BLE001 - the named error, to raise instead
            return error
        return None

    def _nonfinite_sites(self, flat, args, kwargs) -> list[str]:
        """Sites with a non-finite log density in one eager run at ``flat``."""
        bad = []
        try:
            guide_trace, model_trace = self._eager_traces(flat, args, kwargs)
            for where, tr in (("guide", guide_trace), ("model", model_trace)):
                for name, site in tr.items():
                    if site.type == "sample":
                        if not bool(torch.isfinite(site_log_prob(site)).all()):
                            bad.append(f"site {name!r} of the {where}")
        except Exception:  # diagnosis only: never hide the original problem
            return bad
        return bad

    def _invalid_observation(self, flat, args, kwargs) -> str | None:
        """What is wrong with the first observed value outside its support, in one eager
        run at ``flat`` (the site, the support, the values); ``None`` if none is found."""
        try:
            for tr in self._eager_traces(flat, args, kwargs):
                for name, site in tr.items():
                    if site.type == "sample" and site.is_observed:
                        check_observation(name, site.fn, site.value)
        except ObservationOutsideSupportError as error:
            return str(error)
        except Exception:  # noqa: BLE001 - diagnosis only: never hide the original problem
            return None
        return None

    # -- public ----------------------------------------------------------------------------
    def _ensure_init(self, args, kwargs) -> None:
        if not self._initialized:
            self.init(*args, **kwargs)
        else:
            self._adopt_store_edits(args, kwargs)

    @_fitting_guide
    def step(self, *args, **kwargs) -> float:
        """One optimization step; returns the loss before the update.

        Raises :class:`NonFiniteLossError` (params kept at the last finite step) when the
        loss or its gradient is not finite, and
        :class:`~probtorch.validation.ObservationOutsideSupportError` (a ``ValueError``
        naming the site; the step is not applied) when an observed value lies outside its
        distribution's support: each call's data are checked, a minibatch too.
        """
        self._ensure_init(args, kwargs)
        with self._rng(), self._naming_the_site(args, kwargs):
            step = self._run_block(1, 1, *self._laid_out(args, kwargs), in_place=False)
        losses, oks, _ = step
        self._lifted_cache = None
        if not oks[0]:
            _, message, data = self._handle_failure(*step, self._num_steps, args, kwargs)
            self._sync_store()
            raise (ObservationOutsideSupportError if data else NonFiniteLossError)(message)
        self._num_steps += 1
        self.optim.observe(losses)  # ReduceLROnPlateau's step(loss), as in run
        self._sync_store()
        return losses[0]

    @_fitting_guide
    def evaluate_loss(self, *args, **kwargs) -> float:
        """An estimate of the loss at the current params, without updating them.

        It draws from a copy of this SVI's random stream (as NumPyro's ``evaluate``): the
        steps that follow are the same as without it, and two calls at the same params
        give the same estimate.
        """
        self._ensure_init(args, kwargs)
        kept = self._rng_state
        try:
            with self._rng(), torch.no_grad(), torch_validation(False):
                _, (loss, _, valid) = self._surrogate(self._flat, self._elbo_state, args, kwargs)
        finally:
            self._swap_modules(None)
            self._rng_state = kept
        if not bool(valid):
            found = self._invalid_observation(self._flat, args, kwargs) or _OUTSIDE
            raise ObservationOutsideSupportError(f"SVI.evaluate_loss: {found}")
        return float(loss)

    @_fitting_guide
    def run(
        self,
        num_steps: int,
        *args,
        progress_bar: bool = True,
        init_params: dict | None = None,
        **kwargs,
    ) -> SVIRunResult:
        """Run ``num_steps`` optimization steps; returns :class:`SVIRunResult`.

        ``init_params`` (constrained values by name, e.g. a previous ``result.params``)
        replace the current params and restart the optimizer state. Ctrl-C stops the run
        and returns the result so far, with a warning; so does a non-finite loss, keeping the
        params of the last step with a finite loss. An observed value outside its
        distribution's support raises :class:`~probtorch.validation.ObservationOutsideSupportError`
        naming the site where it is this call's data (at its first step), and otherwise
        (a support that depends on latent values) stops the run with a warning as above, its
        params those before the step. torch runs with
        ``PROBTORCH_NUM_THREADS`` intra-op threads meanwhile (default 1). The progress bar
        shows the mean loss, and reads ``SVI (compiling)`` while the first call of the step
        compiles it.
        """
        try:
            if isinstance(num_steps, bool):
                raise TypeError
            num_steps = operator.index(num_steps)
        except TypeError:
            raise TypeError(
                f"SVI.run(num_steps, *args): num_steps must be an integer, got "
                f"{type(num_steps).__name__}. NumPyro's svi.run(rng_key, num_steps, *args) "
                f"takes a key first; here the seed goes to SVI(..., seed=...)"
            ) from None
        with (
            inference_threads(),
            self._naming_the_site(args, kwargs),
            explaining_rng_key((num_steps, *args), "SVI.run(num_steps, *args)", "SVI(seed=)"),
        ):
            return self._run(num_steps, args, progress_bar, init_params, kwargs)

    def _run(self, num_steps, args, progress_bar, init_params, kwargs) -> SVIRunResult:
        num_steps = int(num_steps)
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        self._ensure_init(args, kwargs)
        if init_params is not None:
            self._set_params(init_params)
        from tqdm.auto import tqdm

        all_losses: list[float] = []
        bad_data = None
        block = self.steps_per_call if num_steps >= self.steps_per_call else max(num_steps, 1)
        bar = tqdm(total=num_steps, disable=not progress_bar, desc="SVI")
        shown = _BarFeed(bar) if progress_bar else None
        # the first call of a block size compiles it (seconds): the bar says so meanwhile
        compiling = progress_bar and self.compiled and (block, True) not in self._blocks
        done = 0
        calls = 0
        guards = contextlib.ExitStack()
        pressed = _never
        self._forget_arguments()
        laid_args, laid_kwargs = self._laid_out(args, kwargs)
        try:
            # torch.distributions' validation stays off for the whole run (each block would
            # switch it off and on again otherwise: about 7 us per block)
            with self._rng(), guards, torch_validation(False):
                while done < num_steps:
                    if pressed is _never and (calls == 1 or (block, True) in self._blocks):
                        # An in-place block writes the state with several kernels: Ctrl-C
                        # is held until the block has finished (not during a block's first
                        # call, which compiles and writes new buffers).
                        pressed = guards.enter_context(deferred_interrupts())
                    if calls == 2:
                        # The first two calls checked Dynamo's guards (compiling if
                        # needed); the arguments stay the same for the rest of this run and
                        # the state is the block's own output, so later calls skip them.
                        guards.enter_context(skip_guards(self.compiled))
                    calls += 1
                    active = min(block, num_steps - done)
                    if compiling:
                        bar.set_description("SVI (compiling)")
                    ran = self._run_block(block, active, laid_args, laid_kwargs)
                    losses, oks, _ = ran
                    if compiling:
                        bar.set_description("SVI", refresh=False)
                        compiling = False
                    if not all(oks):
                        all_losses.extend(losses[: oks.index(False)])
                        failed, message, data = self._handle_failure(
                            *ran, self._num_steps + done, args, kwargs
                        )
                        done = failed - self._num_steps
                        if data and done == 0:  # the data of this run: nothing was done
                            bad_data = message
                            break
                        warn_at_caller(message, RuntimeWarning)
                        break
                    self.optim.observe(losses)
                    all_losses.extend(losses)
                    done += active
                    if shown is not None:
                        shown.add(losses)
                    if pressed():  # Ctrl-C, held until the block had finished
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            warn_at_caller(
                f"SVI interrupted after {done} of {num_steps} steps; returning the result so far",
                RuntimeWarning,
            )
        finally:
            if shown is not None:
                shown.flush()
            bar.close()
            self._num_steps += done
            self._lifted_cache = None  # (it holds the run's arguments)
            self._sync_store()
        if bad_data is not None:
            raise ObservationOutsideSupportError(bad_data)
        losses = torch.tensor(all_losses, dtype=self._layout.dtype)
        return SVIRunResult(self.get_params(), losses)

    def get_params(self, state=None) -> dict[str, torch.Tensor]:
        """The current constrained parameter values, by name (copies). ``state`` is taken
        for NumPyro's ``get_params(svi_state)`` and not used: an SVI holds one state, its
        current one."""
        if not self._initialized:
            return {}
        # the store holds the params after each step, and any edits made to it since
        store = self.param_store
        return {name: store[name].detach().clone() for name in store}

    def _set_params(self, init_params: dict) -> None:
        layout = self._layout
        unknown = sorted(set(init_params) - set(layout.names))
        if unknown:
            raise ValueError(
                f"init_params has {unknown}, which are not params of this model and guide "
                f"(params: {list(layout.names)})"
            )
        values = self._unpack(self._flat)
        for name, value in init_params.items():
            value = torch.as_tensor(value, dtype=values[name].dtype, device=layout.device)
            constraint = layout.constraints[name]
            shape = layout.shapes[layout.names.index(name)]  # unconstrained
            if constraint is not constraints.real:  # a simplex of 3 is 2 unconstrained
                shape = biject_to(constraint)(torch.zeros(shape, dtype=value.dtype)).shape
            if value.shape != shape:
                raise ValueError(
                    f"init_params[{name!r}] has shape {tuple(value.shape)}, but the param "
                    f"has shape {tuple(shape)}"
                )
            if not bool(torch.all(constraint.check(value))):
                raise ValueError(f"init_params[{name!r}] does not satisfy {constraint}")
            if constraint is not constraints.real:
                value = biject_to(constraint).inv(value)
            values[name] = value
        self._flat = torch.cat(
            [values[n].detach().reshape(-1).to(layout.dtype) for n in layout.names]
        )
        self._last_good = self._flat.clone()  # a distinct tensor: aliasing would recompile
        self._opt_state = self.optim.init(self._flat)

    def _sync_store(self) -> None:
        """Copy the flat params into the store's leaves (and so into registered modules)."""
        with torch.no_grad():
            for name, value in self._unpack(self._flat).items():
                self.param_store.unconstrained(name).copy_(value)
            for key, (_, _, buffer) in self._module_buffers.items():
                buffer.copy_(self._elbo_state[key])
        self._store_marks = self._marks()
