"""Modeling primitives: ``sample``, ``param``, ``plate``, ``deterministic``, ``factor``, ``module``.

Each primitive is a thin function that sends a :class:`~probtorch.runtime.Message` through
the handler stack; what happens to it (recording, conditioning, seeding, scaling) is decided
by the handlers in :mod:`probtorch.handlers`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints

from .handlers import _as_site_value, equal_indices, scale
from .params import get_param_store
from .runtime import CondIndepStackFrame, Message, Messenger, apply_stack, get_stack
from .validation import innermost, num_event_dims, readable

__all__ = ["sample", "param", "plate", "markov", "deterministic", "factor", "module", "subsample"]


class RandomnessError(RuntimeError):
    """A primitive needed random numbers but no ``seed`` handler was active."""


def _require_seed(msg: Message, what: str) -> None:
    if not msg.extra.get("seeded", False):
        raise RandomnessError(
            f"{what} {msg.name!r} needs random numbers, but no seed handler is active. "
            f"Wrap the model: probtorch.handlers.seed(model, rng_seed=0)(*args), "
            f"or give the site a value with condition/substitute."
        )


def _is_point_mass(fn) -> bool:
    """Whether ``fn`` is a ``Delta`` (through ``to_event``, ``mask`` and ``expand``): its
    draw takes no random numbers (an ``AutoDelta`` guide runs without a seed, as in
    Pyro)."""
    return isinstance(innermost(fn), pyro_dist.Delta)


def _sample_default(msg: Message) -> torch.Tensor:
    if not _is_point_mass(msg.fn):
        _require_seed(msg, "sample site")
    sample_shape = msg.kwargs.get("sample_shape", ())
    if msg.fn.has_rsample:
        return msg.fn.rsample(sample_shape)
    return msg.fn.sample(sample_shape)


def sample(
    name: str,
    fn: Any,
    obs: torch.Tensor | None = None,
    obs_mask: torch.Tensor | None = None,
    infer: dict | None = None,
    sample_shape: tuple = (),
) -> torch.Tensor:
    """Draw (or observe) the random variable ``name`` from the distribution ``fn``.

    Args:
        name: the site name, unique within one run of the model.
        fn: a distribution (any ``torch.distributions`` / ``pyro.distributions`` object).
        obs: observed data; the site is then a likelihood term, not a latent.
        obs_mask: boolean tensor, True where ``obs`` is observed. The missing entries are
            imputed: they are taken from the latent site ``f"{name}_unobserved"``, which has
            the shape of ``obs`` and is drawn from ``fn`` everywhere (its entries where
            ``obs`` is observed are unused draws, which leave the posterior of the other
            sites as it is and keep the density proper: NUTS and SVI guides need that).
            The combined value is the deterministic site ``name``.
        infer: inference hints (e.g. ``{"is_auxiliary": True}``).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> x = pt.handlers.seed(model, rng_seed=0)()
        >>> x.shape
        torch.Size([])
    """
    _check_site_distribution(name, fn)
    if obs_mask is not None:
        return _masked_observe(name, fn, obs, obs_mask, infer)
    if obs is not None and not isinstance(obs, torch.Tensor):
        obs = _as_site_value("pt.sample(..., obs=)", name, obs)
    if not get_stack():
        # No handler at all: behave like a plain distribution call or observation.
        if obs is not None:
            return obs
        msg = Message("sample", name, fn)
        _require_seed(msg, "sample site")
    msg = Message(
        "sample",
        name,
        fn,
        kwargs={"sample_shape": tuple(sample_shape)},
        value=obs,
        is_observed=obs is not None,
        infer=infer,
        default=_sample_default,
    )
    return apply_stack(msg).value


def _check_site_distribution(name: str, fn) -> None:
    """A clear error for what is no distribution object at a sample site (a number, or a
    distribution's class instead of an instance)."""
    if isinstance(fn, torch.distributions.Distribution):
        return
    if isinstance(fn, type):
        raise TypeError(
            f"sample site {name!r}: got the class {fn.__name__}, not a distribution; give "
            f"one with its parameters, e.g. {fn.__name__}(...)"
        )
    if not (callable(getattr(fn, "log_prob", None)) and callable(getattr(fn, "sample", None))):
        raise TypeError(
            f"sample site {name!r}: the second argument must be a distribution (e.g. "
            f"dist.Normal(0.0, 1.0)), got {type(fn).__name__} {fn!r:.60}"
        )


def _masked_observe(name, fn, obs, obs_mask, infer):
    """NumPyro's ``obs_mask``: observed where the mask is True, latent elsewhere.

    NumPyro (and Pyro) draw the unobserved site from ``fn.mask(~obs_mask)``: its entries
    where ``obs`` is observed then have a flat, improper density, which NUTS wanders along
    (trees at ``max_tree_depth``) and an SVI guide's entropy widens without bound. Here they
    have ``fn``'s density: integrated out, they change no other site's posterior."""
    if obs is None:
        raise ValueError(f"sample site {name!r}: obs_mask was given without obs")
    obs = torch.as_tensor(obs)
    obs_mask = torch.as_tensor(obs_mask, dtype=torch.bool)
    event_shape = tuple(fn.event_shape)
    obs_batch = tuple(obs.shape[: max(obs.dim() - len(event_shape), 0)])
    try:
        fits = torch.broadcast_shapes(obs_mask.shape, obs_batch) == obs_batch
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"sample site {name!r}: obs_mask of shape {tuple(obs_mask.shape)} does not fit obs "
            f"of shape {tuple(obs.shape)}: the mask must broadcast to the batch shape "
            f"{obs_batch} of obs ({type(fn).__name__} has event_shape {event_shape})"
        )
    unobserved = sample(f"{name}_unobserved", fn, infer=infer)
    # The mask indexes batch elements; broadcast it over the event dims.
    mask = obs_mask[(...,) + (None,) * num_event_dims(fn)]
    # Entries left out by the mask count for nothing; they are filled with the imputed
    # values so that any filler (NaN, as pandas gives) passes the support check.
    filled = torch.where(mask, obs, unobserved.detach().to(obs.dtype))
    # Pyro's fn.mask(obs_mask), which torch's own distributions lack
    masked = pyro_dist.torch_distribution.MaskedDistribution(fn, obs_mask)
    observed = sample(f"{name}_observed", masked, obs=filled, infer=infer)
    # The combined value is recorded under ``name``, as in Pyro and NumPyro: in Predictive,
    # where observations are drawn anew, it is a replicate of the data.
    return deterministic(name, torch.where(mask, observed, unobserved))


def _param_default(msg: Message) -> torch.Tensor:
    return get_param_store().setdefault(msg.name, msg.args[0], msg.kwargs["constraint"])


def param(
    name: str,
    init_value: torch.Tensor | None = None,
    constraint: constraints.Constraint = constraints.real,
    event_dim: int | None = None,
) -> torch.Tensor:
    """A learnable parameter, stored unconstrained and returned constrained.

    Outside inference it lives in the default store (:func:`probtorch.get_param_store`);
    ``SVI`` gives each run its own store. ``event_dim`` (as in Pyro) counts the rightmost
    dims that are not batch dims: inside a subsampled plate, the param holds every row and
    returns the rows of the subsample.

    Example::

        >>> import probtorch as pt
        >>> from torch.distributions import constraints
        >>> pt.get_param_store().clear()
        >>> scale = pt.param("scale", torch.tensor(2.0), constraint=constraints.positive)
        >>> float(scale.detach())
        2.0
    """
    if (
        init_value is not None
        and not isinstance(init_value, torch.Tensor)
        and not callable(init_value)
    ):
        init_value = torch.as_tensor(init_value, dtype=torch.get_default_dtype())
    msg = Message(
        "param",
        name,
        args=(init_value,),
        kwargs={"constraint": constraint, "event_dim": event_dim},
        default=_param_default,
    )
    return apply_stack(msg).value


def deterministic(name: str, value: torch.Tensor, event_dim: int | None = None) -> torch.Tensor:
    """Record ``value`` under ``name`` in traces and MCMC output.

    ``event_dim`` (Pyro's) counts the value's rightmost dims that are not batch dims: a
    deterministic site has no density here, and it tells which dims the enclosing plates
    span where MCMC's ``to_inference_data`` names them (without it, the rightmost dims
    whose sizes line up with the plates').

    Example::

        >>> import probtorch as pt
        >>> with pt.handlers.trace() as tr:
        ...     pt.deterministic("two", torch.tensor(2.0))
        tensor(2.)
        >>> float(tr["two"].value)
        2.0
    """
    if not get_stack():
        return value
    msg = Message("deterministic", name, value=value, kwargs={"event_dim": event_dim})
    return apply_stack(msg).value


def factor(name: str, log_factor: torch.Tensor, has_rsample: bool | None = None) -> None:
    """Add ``log_factor`` to the model's log density, as an observed auxiliary site.

    In a guide, the factor is part of ``log q`` (as in Pyro), and the ELBOs need
    ``has_rsample=True``: ``log_factor`` is computed from reparameterized draws, so its
    gradient is the pathwise one.

    Example::

        >>> import probtorch as pt
        >>> with pt.handlers.trace() as tr:
        ...     pt.factor("penalty", torch.tensor(-3.0))
        >>> float(tr.log_prob_sum())
        -3.0
    """
    unit = pyro_dist.Unit(torch.as_tensor(log_factor), has_rsample=has_rsample)
    sample(name, unit, obs=unit.sample(), infer={"is_auxiliary": True})


def module(
    name: str, nn_module: torch.nn.Module, update_module_params: bool = False
) -> torch.nn.Module:
    """Register the parameters of ``nn_module`` as params named ``f"{name}$$${param}"``.

    The store keeps the module's own parameter tensors (values loaded into the store
    before are written into them), so the module always holds the store's values, which
    Pyro's ``update_module_params=True`` asks for; the argument is taken for Pyro's
    signature.

    Parameters with ``requires_grad=False`` (a frozen, pre-trained part) are not registered,
    as in Pyro: inference leaves them as they are.

    Example::

        >>> import probtorch as pt
        >>> pt.get_param_store().clear()
        >>> net = pt.module("net", torch.nn.Linear(2, 1))
        >>> sorted(pt.get_param_store().keys())
        ['net$$$bias', 'net$$$weight']
        >>> frozen = torch.nn.Linear(2, 1)
        >>> _ = frozen.bias.requires_grad_(False)
        >>> _ = pt.module("frozen", frozen)
        >>> sorted(k for k in pt.get_param_store().keys() if k.startswith("frozen"))
        ['frozen$$$weight']
    """
    if not isinstance(nn_module, torch.nn.Module):
        what = (
            f"the class {nn_module.__name__}"
            if isinstance(nn_module, type)
            else (f"a {type(nn_module).__name__}")
        )
        raise TypeError(f"pt.module({name!r}, ...) takes a torch.nn.Module instance, got {what}")
    for param_name, value in nn_module.named_parameters():
        if value.requires_grad:
            param(f"{name}$$${param_name}", value)
    return nn_module


def _subsample_default(msg: Message) -> torch.Tensor:
    size, subsample_size = msg.args
    msg.extra["drawn"] = True  # by the plate itself, not given by a handler
    if subsample_size >= size:
        return torch.arange(size)
    _require_seed(msg, "plate")
    return torch.randperm(size)[:subsample_size]


def _subsample_site(
    name: str, size: int, subsample_size: int, given: torch.Tensor | None = None
) -> torch.Tensor:
    """The indices a plate uses; a ``"plate"`` site, so replay/substitute can fix them.

    With ``given`` (the caller's indices) the site holds them already, as Pyro's does,
    flagged ``extra["indices_given"]``; traces record it, so a model that replays a
    guide's trace takes the guide's given rows (as in Pyro), but a replay or substitute
    that gives a plate other indices than its own given ones is refused
    (:func:`_check_given_indices`)."""
    msg = Message(
        "plate", name, args=(size, subsample_size), value=given, default=_subsample_default
    )
    if given is not None:
        msg.extra["indices_given"] = True
    if not get_stack():
        msg.extra["seeded"] = True  # no handler: plain torch RNG, as in interactive use
        return _subsample_default(msg) if given is None else given
    value = apply_stack(msg).value
    if given is not None:
        _check_given_indices(name, given, value)
    elif not msg.extra.get("drawn", False):  # a handler gave them
        _check_handler_indices(name, size, value)
    return value


def _shown(indices: torch.Tensor) -> str:
    """A few of ``indices``' values, for messages."""
    head = indices[:5].tolist()
    return f"{head}{' ...' if len(indices) > 5 else ''}"


def _check_given_indices(name: str, given: torch.Tensor, value: torch.Tensor) -> None:
    """Refuse indices that a handler (the guide's trace replayed into the model, or
    Predictive's guide) gives a plate the model gave other ones (``subsample=``): the
    model's data and the guide's local draws would be other rows."""
    if equal_indices(given, value) is not False:
        return
    raise ValueError(
        f"plate {name!r}: the model gives it subsample indices of shape "
        f"{tuple(given.shape)} ({_shown(given)}), but a replayed trace (the guide's, under "
        f"SVI or an ELBO, or Predictive's guide) gives indices of shape "
        f"{tuple(value.shape)} ({_shown(value)}): the guide drew its own subsample, so its "
        f"local sites would belong to other rows than the model's data. Pass the same "
        f"subsample to the guide: pt.plate({name!r}, ..., subsample=idx) in the guide's "
        f"plate too (or draw the indices once and give them to both)"
    )


def subsample(data: torch.Tensor, event_dim: int) -> torch.Tensor:
    """Pyro's and NumPyro's ``subsample``: the rows of full-size ``data`` that the
    subsampled plates around the call select, along their dims (``event_dim`` counts the
    rightmost dims of ``data`` that are not batch dims). Outside subsampled plates it
    returns ``data``.

    Example::

        >>> import probtorch as pt
        >>> x = torch.arange(10.0)
        >>> with pt.plate("data", 10, subsample=torch.tensor([2, 7])):
        ...     pt.subsample(x, event_dim=0)
        tensor([2., 7.])
    """
    for handler in get_stack():
        if isinstance(handler, plate):
            data = handler.rows_of(data, int(event_dim), "subsample(data, ...)")
    return data


def _every_row_in_order(indices: torch.Tensor, size: int) -> bool:
    """Whether given indices are ``0, 1, ..., size - 1`` (where their values can be read)."""
    return (
        indices.shape[0] == size
        and readable(indices)
        and bool(torch.equal(indices, torch.arange(size, device=indices.device)))
    )


def _as_index_tensor(indices):
    """``plate(..., subsample=indices)``'s indices as a tensor: a tensor as it is; a list,
    tuple or numpy array converted, as Pyro converts them (``torch.as_tensor``), and then to
    ``torch.long`` (what the plate's drawn indices and ``torch.arange`` hold). Anything else,
    or what does not convert, is returned as it is, for :func:`_given_subsample` to refuse."""
    if isinstance(indices, torch.Tensor) or not (
        isinstance(indices, (list, tuple)) or type(indices).__module__ == "numpy"
    ):
        return indices
    try:
        converted = torch.as_tensor(indices)
    except (TypeError, ValueError, RuntimeError):  # ragged, or objects that are not numbers
        return indices
    if converted.dtype == torch.bool or (converted.is_floating_point() and converted.numel()):
        return converted  # refused, named by its dtype
    return converted.long()  # (an empty list converts to float32; it is refused as empty)


def _given_subsample(name: str, size: int, indices, subsample_size) -> tuple[torch.Tensor, int]:
    """Check ``plate(..., subsample=indices)``; returns the indices as a tensor
    (:func:`_as_index_tensor`) and the subsample size."""
    given, indices = indices, _as_index_tensor(indices)
    if (
        not isinstance(indices, torch.Tensor)
        or indices.dim() != 1
        or indices.is_floating_point()
        # torch indexes by a uint8 tensor as by a mask (a numpy uint8 array, which numpy
        # reads as indices, was converted to long above)
        or indices.dtype in (torch.bool, torch.uint8)
    ):
        kind = "a tensor" if given is indices else f"{type(given).__name__} converted to a tensor"
        what = (
            f"{kind} of shape {tuple(indices.shape)} and dtype {indices.dtype}"
            if isinstance(indices, torch.Tensor)
            else type(indices).__name__
        )
        raise ValueError(
            f"plate {name!r}: subsample must be a 1-d tensor of integer indices (not a "
            f"boolean mask), or a list, tuple or numpy array of them, got {what}"
        )
    count = indices.shape[0]
    if count == 0:
        raise ValueError(f"plate {name!r}: subsample has no indices")
    if subsample_size is not None and int(subsample_size) != count:
        raise ValueError(
            f"plate {name!r}: subsample_size={subsample_size} but subsample has {count} indices"
        )
    span = _span_outside(indices, size)
    if span:
        raise ValueError(
            f"plate {name!r}: subsample indices must lie in [0, size={size}), got {span}"
        )
    return indices, count


def _span_outside(indices: torch.Tensor, size: int) -> str | None:
    """``"[min, max]"`` of readable, non-empty ``indices`` that are not all rows of a plate
    of ``size``; None otherwise."""
    if not (readable(indices) and indices.numel()):
        return None
    low, high = int(indices.min()), int(indices.max())
    return None if 0 <= low and high < size else f"[{low}, {high}]"


def _plate_count(name: str, what: str, count) -> int:
    """A plate's ``size`` or ``subsample_size`` as a non-negative int (an integer, a NumPy
    integer or a one-element integer tensor; a float only if it is whole)."""
    if isinstance(count, torch.Tensor) and count.numel() == 1:
        count = count.item()
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    try:
        count = operator.index(count)
    except TypeError:
        raise TypeError(
            f"plate {name!r}: {what} must be an integer, got {count!r} ({type(count).__name__})"
        ) from None
    if count < 0:
        raise ValueError(f"plate {name!r}: {what} must be >= 0, got {count}")
    return count


def _check_handler_indices(name: str, size: int, indices: torch.Tensor) -> None:
    """Indices a handler gave a plate (replay of a guide's trace, substitute) must be rows
    of this plate: a guide that built the plate with another size gives others."""
    count, span = int(indices.shape[0]), _span_outside(indices, size)
    if count > size or span:
        where = f" in {span}" if span else ""
        raise ValueError(
            f"plate {name!r} has size {size}, but a handler (replay of the guide's trace, or "
            f"substitute) gave it {count} indices{where}: do the model and the guide build "
            f"this plate with different sizes?"
        )


class plate(Messenger):
    """A vectorized conditional-independence context of ``size`` elements along ``dim``.

    Sites inside are broadcast to ``size`` (or ``subsample_size``) at batch dimension ``dim``
    (allocated automatically from the right when not given). With subsampling, entering the
    plate returns the indices used, and log densities inside are scaled by
    ``size / subsample_size`` so that the log likelihood stays unbiased. As in Pyro and
    NumPyro, the indices are drawn once, when the plate is built, so a plate entered several
    times uses the same subsample each time. ``subsample=indices`` gives the indices
    instead (a minibatch chosen by a data loader): ``subsample_size`` is their number. As in
    Pyro, they may be a 1-d integer tensor, or a list, tuple or numpy array of integers
    (converted to a ``torch.long`` tensor, which entering the plate returns). The arguments
    come in Pyro's order, ``plate(name, size, subsample_size, subsample, dim)``; ``device``
    is where the indices are made (as Pyro's; the default device otherwise).

    Iterated, ``for i in pt.plate("groups", n):``, it is Pyro's sequential plate: the body
    runs once per index (a Python int), not vectorized, with the sites in it scaled by
    ``size / subsample_size``. The inference algorithms read no independence from it (no
    batch dim, no frame): their results are those of the same loop without a plate; but
    discrete sites summed out in one iteration reuse the dims of earlier iterations' (as
    Pyro's), so that a loop over many sequences, each a ``pt.markov`` chain, fits in
    torch's 64 dims. A site must then not read a summed-out site of another iteration.
    Subsampled, its sites' names (``f"z_{i}"``) change with the rows drawn: the ELBOs plan
    each run's sites anew where they run eagerly (``SVI(..., compile=False)``,
    ``elbo.loss``), and a compiled SVI step refuses it; a param in the loop must hold every
    row (``pt.param("loc", torch.zeros(n))[i]``), as SVI creates params on its first step.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     with pt.plate("data", 5):
        ...         return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> pt.handlers.seed(model, rng_seed=0)().shape
        torch.Size([5])
        >>> with pt.plate("data", 100, subsample=torch.tensor([3, 14, 15])) as idx:
        ...     idx
        tensor([ 3, 14, 15])
    """

    def __init__(
        self,
        name: str,
        size: int,
        subsample_size: int | None = None,
        subsample: torch.Tensor | Sequence[int] | None = None,
        dim: int | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        size = _plate_count(name, "size", size)
        if subsample is not None:
            subsample, subsample_size = _given_subsample(name, size, subsample, subsample_size)
        asked = subsample_size
        if subsample_size is None:
            subsample_size = size
        subsample_size = _plate_count(name, "subsample_size", subsample_size)
        if not min(1, size) <= subsample_size <= size:
            raise ValueError(
                f"plate {name!r}: subsample_size must lie in [1, size={size}], got {subsample_size}"
            )
        if dim is not None:
            try:
                dim = operator.index(dim)
            except TypeError:
                raise TypeError(
                    f"plate {name!r}: dim must be a negative integer, got {dim!r}"
                ) from None
            if dim >= 0:
                raise ValueError(f"plate {name!r}: dim must be negative, got {dim}")
        self.name = name
        self.size = size
        self.subsample_size = subsample_size
        self._user_dim = dim
        self.dim: int | None = dim
        # the caller's indices (a data loader's), unless they are every row in order
        self._given = subsample is not None and not _every_row_in_order(subsample, size)
        indices = _subsample_site(name, size, subsample_size, subsample)
        if subsample is None and indices.shape[0] != subsample_size:
            # A handler gave the indices (the model replaying the guide's plate).
            if asked is not None:
                raise ValueError(
                    f"plate {name!r}: subsample_size={asked} but a handler (replay of "
                    f"the guide's trace, or substitute) gave {indices.shape[0]} "
                    f"indices: do the model and the guide subsample this plate to "
                    f"different sizes?"
                )
            self.subsample_size = int(indices.shape[0])
        if subsample is None and indices.shape[0] == size and readable(indices):
            # a handler gave all rows, permuted (the guide's given indices, replayed)
            self._given = not _every_row_in_order(indices, size)
        if device is not None:
            indices = indices.to(device)
        self.indices: torch.Tensor = indices

    def __iter__(self):
        if self._user_dim is not None:
            raise ValueError(
                f"plate {self.name!r}: a plate with dim={self._user_dim} is vectorized; "
                f"iterate a plate built without dim (Pyro's sequential plate)"
            )
        rows = self.indices.tolist() if self.selects_rows else range(self.size)
        subsampled = self.subsample_size < self.size
        scaled = (
            _looped_rows(self.name, self.size / self.subsample_size)
            if subsampled
            else nullcontext()
        )
        for k, i in enumerate(rows):
            with scaled, _Iteration(self, k):
                yield i

    @property
    def selects_rows(self) -> bool:
        """Whether its indices are other than all rows in order: a subsample, or indices
        the caller gave (of full length, maybe a permutation)."""
        return self.subsample_size < self.size or self._given

    def _allocate_dim(self) -> int:
        enclosing = [h for h in get_stack() if isinstance(h, plate)]
        for other in enclosing:
            if other.name == self.name:
                again = "the same plate entered again" if other is self else "another plate"
                raise ValueError(
                    f"plate {self.name!r} is entered while a plate named {self.name!r} "
                    f"(size {other.size}, dim {other.dim}) is active ({again}; `with p: "
                    f"with p:`, or a function run inside the plate that enters it): one name "
                    f"would stand for two batch dims, a subsample's sites would be scaled "
                    f"twice, and guides, traces and ArviZ dims find a plate by its name. "
                    f"Enter a plate once, and give a plate inside it another name (Pyro "
                    f"refuses this too: duplicate plate)"
                )
        used = {h.dim for h in enclosing}
        if self._user_dim is not None:
            if self._user_dim in used:
                raise ValueError(
                    f"plate {self.name!r}: dim {self._user_dim} is already used by an "
                    f"enclosing plate"
                )
            return self._user_dim
        dim = -1
        while dim in used:
            dim -= 1
        return dim

    def __enter__(self):
        self.dim = self._allocate_dim()  # refuses a plate of its name already active
        super().__enter__()
        return self.indices

    def __exit__(self, *exc):
        self.dim = self._user_dim
        return super().__exit__(*exc)

    @property
    def frame(self) -> CondIndepStackFrame:
        return CondIndepStackFrame(self.name, self.dim, self.size, self.subsample_size)

    def process_message(self, msg: Message) -> None:
        if msg.type == "deterministic":  # recorded (ArviZ names its dims after plates)
            msg.cond_indep_stack = msg.cond_indep_stack + (self.frame,)
        if msg.type != "sample":
            return
        msg.cond_indep_stack = msg.cond_indep_stack + (self.frame,)
        batch_shape = tuple(msg.fn.batch_shape)
        n = self.subsample_size
        ndim = max(len(batch_shape), -self.dim)
        padded = (1,) * (ndim - len(batch_shape)) + batch_shape
        current = padded[self.dim]
        if current not in (1, n):
            raise ValueError(
                f"sample site {msg.name!r}: its distribution {type(msg.fn).__name__} has "
                f"batch_shape {batch_shape}, whose dim {self.dim} has size {current}, but "
                f"plate {self.name!r} at dim {self.dim} has size {n}"
                + (f" (subsampled from {self.size})" if n != self.size else "")
                + ". Sizes must match (or be 1 to broadcast)."
            )
        if current != n or len(padded) != len(batch_shape):
            # (a plate of one element still adds its dim, as in Pyro and NumPyro); the
            # distribution before any plate broadcast it is kept: the log density of a
            # value that does not vary along the plates (a summed-out site's) is cheaper
            # to compute from it
            msg.extra.setdefault("unexpanded_fn", msg.fn)
            target = list(padded)
            target[self.dim] = n
            expanded = msg.fn.expand(torch.Size(target))
            if expanded.has_rsample != msg.fn.has_rsample and hasattr(expanded, "has_rsample_"):
                # keep a flag set by the user with Pyro's ``has_rsample_(False)``
                expanded = expanded.has_rsample_(msg.fn.has_rsample)
            msg.fn = expanded
        if n != self.size:
            factor = self.size / n
            msg.scale = factor if msg.scale is None else msg.scale * factor
        if self._given:  # (an autoguide cannot draw these rows, a permutation too, itself)
            msg.extra["subsample_given"] = msg.extra.get("subsample_given", ()) + (self.name,)

    def postprocess_message(self, msg: Message) -> None:
        """As in Pyro: ``param(..., event_dim=k)`` inside the plate is a full-size param
        whose rows along the plate's dim are cut to the subsample."""
        event_dim = msg.kwargs.get("event_dim") if msg.type == "param" else None
        if event_dim is not None and msg.value is not None:
            msg.value = self.rows_of(msg.value, int(event_dim), f"param {msg.name!r}")

    def rows_of(self, value: torch.Tensor, event_dim: int, what: str) -> torch.Tensor:
        """``value``'s rows of the subsample along this plate's dim (``event_dim`` dims
        right of the batch dims); ``value`` itself where that dim has size 1 or is absent."""
        dim = self.dim - event_dim
        shape = value.shape
        if len(shape) < -dim or shape[dim] == 1:
            return value
        if shape[dim] != self.size:
            raise ValueError(
                f"{what}: shape {tuple(shape)} with event_dim={event_dim} puts size "
                f"{shape[dim]} at plate {self.name!r}'s dim {self.dim}, whose size is "
                f"{self.size} (a value inside a plate holds every row; its rows are cut to "
                f"the subsample)"
            )
        return value.index_select(dim, self.indices) if self.selects_rows else value


class _Iteration(Messenger):
    """One iteration of an iterated plate, as a step of a ``markov`` loop with history 0
    (its iterations are independent given what is outside the loop): discrete sites
    summed out in one iteration reuse the dims of those in earlier ones (Pyro's
    sequential plate around ``pyro.markov`` chains, one per sequence)."""

    def __init__(self, loop: plate, step: int):
        super().__init__()
        self.frame = (loop, step, 0)

    def process_message(self, msg: Message) -> None:
        if msg.type == "sample":
            msg.extra["markov"] = (self.frame,) + msg.extra.get("markov", ())


class _looped_rows(scale):
    """The scale of an iterated subsampled plate's body. Its sample and param sites record
    the plate's name in ``msg.extra["looped_plates"]``: sites named by the row index change
    with each subsample, which the ELBOs' plan of the sites (and SVI's params) need to know."""

    def __init__(self, name: str, factor: float):
        super().__init__(scale=factor)
        self.name = name

    def process_message(self, msg: Message) -> None:
        super().process_message(msg)
        if msg.type in ("sample", "param"):
            msg.extra["looped_plates"] = msg.extra.get("looped_plates", ()) + (self.name,)


class markov(Messenger):
    """Pyro's ``markov``: a loop whose steps each depend only on the ``history`` steps
    before them (a hidden Markov model's states), so that discrete sites summed out
    (:mod:`probtorch.inference.enumeration`) reuse the batch dims of sites more than
    ``history`` steps back instead of taking one each. Without it a model can sum out at
    most 62 discrete sites (torch's 64 dims, less the chains'); with it, a chain of any
    length, with each step's sites on the dims of the step ``history + 1`` before.

    As in Pyro, a step is a depth of entry: ``for t in pt.markov(range(T)):`` makes each
    iteration the next step (every iteration stays entered until the loop ends), and
    ``pt.markov(fn)`` wrapping a recursive function (or ``with m:`` nested) makes each call
    one step deeper than its caller, so that the siblings of a tree are steps after their
    parent. Sites outside it take dims of their own, and so do those of other ``markov``
    objects. Without summed-out sites it changes nothing. ``keep=True`` reuses no dims, and
    vectorized markov (``dim=``, ``name=``: NumPyro's ``scan`` or Pyro's
    ``vectorized_markov``) is refused.

    As in Pyro, the model must keep its promise: a site that reads a summed-out value
    more than ``history`` steps back reads another site's values along that dim.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> transition = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
        >>> def hmm(y):
        ...     z = torch.tensor(0)
        ...     for t in pt.markov(range(len(y))):
        ...         z = pt.sample(f"z_{t}", dist.Categorical(transition[z]))
        ...         pt.sample(f"y_{t}", dist.Normal(2.0 * z, 1.0), obs=y[t])
        >>> trace = pt.handlers.trace(pt.handlers.seed(hmm, rng_seed=0)).get_trace(torch.zeros(3))
        >>> [msg.extra["markov"][0][1] for msg in trace.values()]
        [1, 1, 2, 2, 3, 3]
    """

    def __init__(
        self,
        fn=None,
        history: int = 1,
        keep: bool = False,
        dim: int | None = None,
        name: str | None = None,
    ):
        if dim is not None or name is not None:
            raise NotImplementedError(
                f"pt.markov(dim={dim!r}, name={name!r}): vectorized markov (Pyro's "
                f"vectorized_markov, NumPyro's scan) is not supported; loop in Python "
                f"(`for t in pt.markov(range(T)):`), or marginalize the chain in the model "
                f"(probtorch.distributions.DiscreteHMM)"
            )
        history = int(history)
        if history < 0:
            raise ValueError(f"pt.markov: history must be >= 0, got {history}")
        self.history = history
        self.keep = bool(keep)
        self.depth = 0  # entries not yet exited: the step of the sites run now
        self._iterable = None
        if fn is not None and not callable(fn):  # an iterable: each item one step
            self._iterable, fn = fn, None
        super().__init__(fn)

    def __enter__(self):
        # a step is the depth of entry, as in Pyro: a recursive function's call depth (its
        # siblings, run after a subtree returns, are at their parent's depth + 1), and for
        # a loop the number of items so far (each entered until the loop ends). Re-entry is
        # its purpose (Pyro's markov is a ReentrantMessenger), so it is not refused as other
        # handlers' is: on the handler stack once, however deep, its sites pass through it
        # once.
        self.depth += 1
        if self.depth == 1:
            super().__enter__()
        return self

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            return super().__exit__(*exc)
        return None

    def __iter__(self):
        if self._iterable is None:
            raise TypeError("pt.markov() was given no iterable to loop over")
        entered = 0
        try:
            for item in self._iterable:
                self.__enter__()
                entered += 1
                yield item
        finally:
            for _ in range(entered):
                self.__exit__(None, None, None)

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample":
            return
        # outermost markov first (the inner one's handler runs first, so prepends last)
        # (keep: every step may depend on every other, so no dims are reused)
        frame = (self, self.depth, math.inf if self.keep else self.history)
        msg.extra["markov"] = (frame,) + msg.extra.get("markov", ())
