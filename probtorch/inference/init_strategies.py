"""Initialization strategies: where in constrained space a latent site starts.

A strategy is a callable ``strategy(site) -> value`` applied to each latent sample site
while the model runs under a ``seed`` handler (so later sites see earlier initial values).
Called with keyword arguments only, each returns a configured strategy, as in NumPyro:
``init_to_uniform(radius=1)``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch

from ..runtime import Message
from .angles import UnitVectorFromSpace, unconstraining_transform

__all__ = [
    "init_to_feasible",
    "init_to_mean",
    "init_to_median",
    "init_to_sample",
    "init_to_uniform",
    "init_to_value",
]


def _is_latent(site: Message) -> bool:
    """A continuous latent site (discrete ones are left to their prior draw)."""
    return (
        site.type == "sample"
        and not site.is_observed
        and not site.infer.get("is_auxiliary")
        and not site.fn.support.is_discrete
    )


def on_latent_sites(init_fn):
    """``init_fn`` as a ``substitute_fn`` that asks it about latent sample sites only, as
    Pyro calls an ``init_loc_fn`` (``substitute`` also passes plate and param messages,
    which a user's function written for Pyro does not expect)."""

    def substitute_fn(site: Message):
        if site.type != "sample" or site.is_observed:
            return None
        return init_fn(site)

    return substitute_fn


def _site_shape(site: Message) -> torch.Size:
    return (
        torch.Size(site.kwargs.get("sample_shape", ())) + site.fn.batch_shape + site.fn.event_shape
    )


def init_to_uniform(site: Message | None = None, radius: float = 2.0):
    """Uniform in ``(-radius, radius)`` in unconstrained space (Stan's default, radius 2).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> site = pt.Message("sample", "s", dist.HalfNormal(1.0))
        >>> v = pt.handlers.seed(init_to_uniform, rng_seed=0)(site)
        >>> bool(torch.exp(torch.tensor(-2.0)) < v < torch.exp(torch.tensor(2.0)))
        True
    """
    if site is None:
        return functools.partial(init_to_uniform, radius=radius)
    if not _is_latent(site):
        return None
    transform = unconstraining_transform(site.fn)
    shape = transform.inverse_shape(_site_shape(site))
    dtype = _dtype_of(site)
    u = (torch.rand(shape, dtype=dtype) * 2 - 1) * radius
    return transform(u)


def init_to_feasible(site: Message | None = None):
    """The point that unconstrained zero maps to (Pyro's and NumPyro's ``init_to_feasible``):
    0 for a real site, 1 for a positive one, the simplex's centre, the identity correlation.
    An angle starts at 0 and a direction at the first axis (their unconstrained space is a
    plane or space, whose origin has no direction). Every chain starts at the same point.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> init_to_feasible(pt.Message("sample", "s", dist.Dirichlet(torch.ones(4))))
        tensor([0.2500, 0.2500, 0.2500, 0.2500])
        >>> init_to_feasible(pt.Message("sample", "a", dist.VonMises(2.0, 1.0)))
        tensor(0.)
    """
    if site is None:
        return init_to_feasible
    if not _is_latent(site):
        return None
    try:
        transform = unconstraining_transform(site.fn)
    except NotImplementedError:  # no map from unconstrained space: whoever needs it says so
        return init_to_sample(site)
    u = torch.zeros(transform.inverse_shape(_site_shape(site)), dtype=_dtype_of(site))
    if isinstance(transform, UnitVectorFromSpace):
        u[..., 0] = 1.0
    return transform(u)


def init_to_mean(site: Message | None = None, num_samples: int = 15):
    """The prior's mean (Pyro's and NumPyro's ``init_to_mean``); where it is undefined,
    not finite or not inside the support (a half-Cauchy's, a von Mises direction's mean
    vector), ``init_to_median`` with ``num_samples`` draws.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> init_to_mean(pt.Message("sample", "r", dist.Gamma(3.0, 2.0)))
        tensor(1.5000)
        >>> v = pt.handlers.seed(init_to_mean, rng_seed=0)(
        ...     pt.Message("sample", "c", dist.HalfCauchy(1.0)))  # no mean: the median
        >>> bool(0.0 < v < float("inf"))
        True
    """
    if site is None:
        return functools.partial(init_to_mean, num_samples=num_samples)
    if not _is_latent(site):
        return None
    try:
        mean = site.fn.mean.detach().expand(_site_shape(site)).to(_dtype_of(site))
        usable = bool(torch.isfinite(mean).all()) and bool(site.fn.support.check(mean).all())
    except (NotImplementedError, AttributeError, RuntimeError, ValueError):
        usable = False  # no mean, or a support that cannot check it (a dependent one)
    return mean if usable else init_to_median(site, num_samples=num_samples)


def init_to_median(site: Message | None = None, num_samples: int = 15):
    """The elementwise median of ``num_samples`` prior draws, taken in unconstrained space.

    Sites whose prior cannot be sampled (improper priors) start ``init_to_uniform``; a
    site whose support has no map from unconstrained space starts at a prior draw (whoever
    needs the map names the site).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> site = pt.Message("sample", "m", dist.Normal(3.0, 0.001))
        >>> round(float(pt.handlers.seed(init_to_median, rng_seed=0)(site)), 2)
        3.0
    """
    if site is None:
        return functools.partial(init_to_median, num_samples=num_samples)
    if not _is_latent(site):
        return None
    try:
        transform = unconstraining_transform(site.fn)
    except NotImplementedError:
        return init_to_sample(site)
    try:
        draws = site.fn.sample((num_samples,) + tuple(site.kwargs.get("sample_shape", ())))
    except NotImplementedError:  # improper priors cannot be sampled
        return init_to_uniform(site)
    return transform(transform.inv(draws).median(dim=0).values)


def init_to_sample(site: Message | None = None):
    """One draw from the site's prior (``init_to_uniform`` for improper priors).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> site = pt.Message("sample", "p", dist.Beta(2.0, 2.0))
        >>> v = pt.handlers.seed(init_to_sample, rng_seed=0)(site)
        >>> bool(0 < v < 1)
        True
    """
    if site is None:
        return init_to_sample
    if not _is_latent(site):
        return None
    try:
        return site.fn.sample(tuple(site.kwargs.get("sample_shape", ())))
    except NotImplementedError:  # improper priors cannot be sampled
        return init_to_uniform(site)


def init_to_value(
    site: Message | None = None,
    values: dict | None = None,
    radius: float = 2.0,
    *,
    fallback: Callable | None = init_to_uniform,
):
    """The given constrained ``values``; other latent sites start by ``fallback`` (Pyro's
    keyword; ``init_to_uniform`` with ``radius`` by default; None: an error for them).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> strategy = init_to_value(values={"mu": torch.tensor(1.5)})
        >>> float(strategy(pt.Message("sample", "mu", dist.Normal(0.0, 1.0))))
        1.5
    """
    if site is None:
        return functools.partial(init_to_value, values=values, radius=radius, fallback=fallback)
    if not _is_latent(site):
        return None
    if values is not None and site.name in values:
        value = torch.as_tensor(values[site.name], dtype=_dtype_of(site))
        shape = site.fn.shape(torch.Size(site.kwargs.get("sample_shape", ())))
        if value.shape != shape:
            raise ValueError(
                f"init_to_value: values[{site.name!r}] has shape {tuple(value.shape)}; site "
                f"{site.name!r} ({type(site.fn).__name__}) has shape {tuple(shape)}"
            )
        support = site.fn.support
        if not bool(support.check(value).all()):
            raise ValueError(
                f"init_to_value: values[{site.name!r}] lies outside the support {support} of "
                f"site {site.name!r} ({type(site.fn).__name__})"
            )
        return value
    if fallback is None:
        raise ValueError(
            f"init_to_value(fallback=None): no initial value for site {site.name!r}; give "
            f"one in values (it has {sorted(values or {})})"
        )
    if fallback is init_to_uniform:
        return init_to_uniform(site, radius=radius)
    return fallback(site)


# While an AutoGuideList sets up its parts: the init_to_value strategies whose names it checks
# on the whole model (each part sees only its own sites), else None.
_deferred: list | None = None


@contextlib.contextmanager
def deferred_value_checks():
    """Collect, rather than check, the :func:`init_to_value` strategies that
    :func:`check_value_names` sees in the block: an ``AutoGuideList``'s parts each trace the
    model with the other parts' sites hidden, so one ``init_to_value`` shared by the parts
    names sites a part does not see. Yields the list to check on the whole model, or
    ``None`` inside an outer block (whose owner checks them)."""
    global _deferred
    if _deferred is not None:
        yield None
        return
    _deferred = collected = []
    try:
        yield collected
    finally:
        _deferred = None


def check_value_names(strategy, trace) -> None:
    """Refuse an :func:`init_to_value` strategy whose ``values`` name no site of the model
    traced in ``trace`` (a mistyped name would leave its site where ``init_to_uniform``
    puts it, without a word). Values for observed or deterministic sites are allowed, as a
    whole draw of the model may be passed.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("scale", dist.HalfNormal(1.0))
        >>> trace = pt.handlers.trace(pt.handlers.seed(model, 0)).get_trace()
        >>> check_value_names(init_to_value(values={"scael": 1.0}), trace)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: init_to_value: values has ['scael'], which are not sites ...['scale']
    """
    if not (isinstance(strategy, functools.partial) and strategy.func is init_to_value):
        return
    if _deferred is not None:
        if all(strategy is not seen for seen in _deferred):
            _deferred.append(strategy)
        return
    unknown = sorted(set(strategy.keywords.get("values") or ()) - set(trace))
    if unknown:
        latent = [name for name, site in trace.items() if _is_latent(site)]
        raise ValueError(
            f"init_to_value: values has {unknown}, which are not sites of the model; its "
            f"latent sites are {latent}"
        )


def _dtype_of(site: Message) -> torch.dtype:
    """The floating dtype the site's distribution computes in: its mean's dtype or, for a
    family without a mean (``VonMises3D``), that of a floating tensor parameter."""
    fn = site.fn
    while fn is not None:
        try:
            mean = fn.mean
            if mean.is_floating_point():
                return mean.dtype
        except (NotImplementedError, AttributeError, RuntimeError):
            pass
        for value in vars(fn).values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.dtype
        fn = getattr(fn, "base_dist", None)
    return torch.get_default_dtype()
