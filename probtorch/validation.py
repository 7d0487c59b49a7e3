"""Eager checks of sample sites, with errors that name the site.

Validation runs once, eagerly, when a model is first traced (by ``trace`` while
validation is enabled, and by the inference set-up). Compiled code never validates:
``torch.distributions`` validation is a graph break by design, and a check per call would
cost more than the model on small problems.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributions import constraints
from torch.distributions.utils import lazy_property

__all__ = ["enable_validation", "is_validation_enabled", "check_sample_site"]

_VALIDATION_ENABLED = True


def enable_validation(flag: bool = True) -> None:
    """Turn probtorch's eager site checks on or off (on by default).

    Example::

        >>> import probtorch as pt
        >>> pt.enable_validation(False); pt.is_validation_enabled()
        False
        >>> pt.enable_validation(True)
    """
    global _VALIDATION_ENABLED
    _VALIDATION_ENABLED = bool(flag)


def is_validation_enabled() -> bool:
    return _VALIDATION_ENABLED


@contextlib.contextmanager
def torch_validation(flag: bool):
    """Set ``torch.distributions``' process-wide validation default inside the block.

    Nothing is set where the default already is ``flag``: setting a class attribute of
    ``Distribution`` invalidates Python's attribute caches of every subclass (hundreds, with
    Pyro's), about 3.5 us each time, which was a tenth of a short SVI step when set and
    restored around every block.
    """
    old = torch.distributions.Distribution._validate_args
    if old == flag:
        yield
        return
    torch.distributions.Distribution.set_default_validate_args(flag)
    try:
        yield
    finally:
        torch.distributions.Distribution.set_default_validate_args(old)


def readable(value: torch.Tensor) -> bool:
    """Whether ``value``'s entries can be read in Python: not while Dynamo compiles or
    ``make_fx`` traces (a graph input's values are unknown then), nor for a tensor batched
    by ``torch.func`` (its per-chain entries differ). Checks of values run only where it is.

    >>> seen = []
    >>> _ = torch.func.vmap(lambda x: seen.append(readable(x)) or x)(torch.ones(3, 2))
    >>> readable(torch.ones(2)), seen
    (True, [False])
    """
    if torch.compiler.is_compiling():
        return False
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    if get_proxy_mode() is not None:
        return False
    return not torch._C._functorch.is_functorch_wrapped_tensor(value)


def _describe(value: torch.Tensor, valid: torch.Tensor) -> str:
    value = torch.as_tensor(value)
    shape = tuple(value.shape)
    try:
        bad = value.detach().expand(torch.broadcast_shapes(value.shape, valid.shape))[~valid]
        shown = bad.flatten()[:5].tolist()
        return f"tensor of shape {shape}, invalid values {shown}" + (
            " ..." if bad.numel() > 5 else ""
        )
    except RuntimeError:
        return f"tensor of shape {shape}"


def innermost(fn):
    """The family inside reshaping wrappers (``Independent``, expanded, masked).

    >>> import pyro.distributions as d
    >>> type(innermost(d.Normal(0.0, 1.0).expand([3]).mask(False).to_event(1))).__name__
    'Normal'
    """
    from pyro.distributions.torch_distribution import ExpandedDistribution, MaskedDistribution

    wrappers = (torch.distributions.Independent, ExpandedDistribution, MaskedDistribution)
    while isinstance(fn, wrappers):
        fn = fn.base_dist
    return fn


def num_event_dims(fn) -> int:
    """The number of event dimensions of ``fn``: Pyro's ``event_dim``, which torch's own
    distributions lack (they have ``event_shape``).

    >>> import torch.distributions as td
    >>> num_event_dims(td.MultivariateNormal(torch.zeros(2), torch.eye(2)))
    1
    """
    return len(fn.event_shape)


def _unwrapped(fn):
    """The distribution and those inside it: wrappers (Independent, Expanded, Masked, ...)
    through ``base_dist``, and a mixture's mixing and component distributions."""
    chain, pending = [], [fn]
    while pending:
        fn = pending.pop(0)
        chain.append(fn)
        for attr in ("base_dist", "mixture_distribution", "component_distribution"):
            inner = getattr(fn, attr, None)
            if isinstance(inner, torch.distributions.Distribution):
                pending.append(inner)
    return chain


class InvalidParameterError(ValueError):
    """A distribution parameter violates its constraint (the message names site and parameter).

    Inference treats it at random initial points as a rejected point and tries another one.
    """


class ObservationOutsideSupportError(ValueError):
    """An observed value lies outside its distribution's support (the message names the site).

    Where the support depends on latent values (``y ~ Uniform(0, theta)``), inference treats
    it at random initial points as a rejected point and tries another one.
    """


def check_parameters(name: str, fn) -> None:
    """Raise InvalidParameterError naming the site, the parameter and the violated constraint."""
    for d in _unwrapped(fn):
        try:
            arg_constraints = d.arg_constraints
        except NotImplementedError:
            continue
        for param, constraint in arg_constraints.items():
            if constraints.is_dependent(constraint):
                continue
            if param not in d.__dict__ and isinstance(getattr(type(d), param, None), lazy_property):
                continue  # never computed: the user gave the other parameterization
            value = getattr(d, "_unclamped", {}).get(param)
            if value is None:
                value = getattr(d, param, None)
            if not isinstance(value, torch.Tensor):
                continue
            valid = constraint.check(value)
            if not readable(valid):
                continue  # batched over chains or being traced: checked where readable
            if not bool(torch.all(valid)):
                raise InvalidParameterError(
                    f"sample site {name!r}: parameter {param!r} of {type(d).__name__} must "
                    f"satisfy the constraint {constraint}, but got {_describe(value, valid)}"
                )


def check_observation(name: str, fn, value: torch.Tensor) -> None:
    """Raise ValueError if an observed value has the wrong shape or lies outside the support."""
    dist_shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
    value_shape = tuple(value.shape)
    event_shape = tuple(fn.event_shape)
    what = (
        f"sample site {name!r}: observed value of shape {value_shape} does not fit "
        f"{type(fn).__name__} with batch_shape {tuple(fn.batch_shape)} and event_shape "
        f"{event_shape}"
    )
    if event_shape and value_shape[len(value_shape) - len(event_shape) :] != event_shape:
        raise ValueError(what + f": its rightmost dims must equal the event_shape {event_shape}")
    try:
        broadcast = torch.broadcast_shapes(value_shape, dist_shape)
    except RuntimeError:
        raise ValueError(what + ": the shapes do not broadcast") from None
    if broadcast != value_shape:
        raise ValueError(
            what + f": the value would be broadcast to {broadcast}, counting each observation "
            f"more than once. Reshape the data or fix the plate/distribution shapes."
        )
    _check_infinite_observation(name, fn, value)
    support = _checkable_support(fn)
    if support is None:
        return
    valid = support.check(value)
    if not readable(valid):
        return  # a support that depends on latent values batched over chains
    if not bool(torch.all(valid)):
        missing = ""
        if value.is_floating_point() and bool(torch.isnan(value).any()):
            k = len(fn.event_shape)  # obs_mask is over the batch: one entry per event
            mask = {0: "~torch.isnan(y)", 1: "~torch.isnan(y).any(-1)"}.get(
                k, f"~torch.isnan(y).flatten(-{k}).any(-1)"
            )
            missing = (
                f" ({int(torch.isnan(value).sum())} NaN entries: for missing data pass "
                f"obs_mask={mask} to pt.sample, which imputes them; under "
                f"pt.handlers.mask a NaN still makes the gradient NaN)"
            )
        raise ObservationOutsideSupportError(
            f"sample site {name!r}: observed value lies outside the support {support} of "
            f"{type(fn).__name__}: {_describe(value, valid)}{missing}"
        )


def observation_in_support(fn, value: torch.Tensor) -> torch.Tensor | None:
    """Whether all of an observed ``value`` lies in ``fn``'s support, as a 0-d bool tensor
    that is not read here (a compiled step returns it; :func:`check_observation` names what
    is wrong once it is false); ``None`` where the support cannot be checked.

    >>> import pyro.distributions as d
    >>> observation_in_support(d.Exponential(1.0), torch.tensor([1.0, -1.0]))
    tensor(False)
    """
    support = _checkable_support(fn)
    return None if support is None else support.check(value).all()


def _checkable_support(fn):
    """``fn``'s support, or ``None`` where it has none that values can be checked against."""
    try:
        support = fn.support
    except NotImplementedError:
        return None
    # (isinstance, not constraints.is_dependent: Dynamo skips that function)
    if support is None or isinstance(support, constraints._Dependent):
        return None
    return support


def _check_infinite_observation(name: str, fn, value: torch.Tensor) -> None:
    """Raise for infinite observations where the log density is not finite. torch's
    ``real`` support (and ``positive``, and others open above or below) admits ``inf``, but a
    density at it is 0: the potential would be infinite at every point, and inference could
    only blame the latent sites."""
    if not value.is_floating_point():
        return
    infinite = torch.isinf(value)
    if not bool(infinite.any()):
        return
    try:
        log_density = fn.log_prob(value)
        if not readable(log_density):
            return  # parameters batched over chains: checked where the model runs eagerly
        finite = bool(torch.isfinite(log_density).all())
    except Exception:  # noqa: BLE001 - a family that refuses inf says so itself later
        finite = False
    if not finite:
        where = infinite.nonzero()[:5].tolist()
        shown = ", ".join(f"{tuple(i)}: {float(value[tuple(i)])}" for i in where)
        more = " ..." if int(infinite.sum()) > 5 else ""
        raise ObservationOutsideSupportError(
            f"sample site {name!r}: observed value of shape {tuple(value.shape)} has "
            f"{int(infinite.sum())} infinite entries (index: value) {shown}{more}, where "
            f"{type(fn).__name__} has no density. Replace them with finite values (and mask "
            f"those entries with pt.handlers.mask, or pass obs_mask, if they stand for "
            f"missing data: a masked inf still makes the gradient NaN)"
        )


def check_sample_site(msg) -> None:
    """All eager checks for one sample site."""
    check_parameters(msg.name, msg.fn)
    if msg.is_observed and isinstance(msg.value, torch.Tensor):
        check_observation(msg.name, msg.fn, msg.value)
