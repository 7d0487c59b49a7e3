"""Tail-accurate ``log cdf``, ``log survival``, ``icdf`` and inverse survival of a base family.

Truncation and censoring need ``log F(x)`` and ``log (1 - F(x))`` far into the tails, and
an inverse that stays accurate there. torch's ``cdf``/``icdf`` lose everything past a few
standard deviations on the upper side (``1 - F`` rounds to 0; ``Laplace.cdf`` and
``Cauchy.cdf`` even cancel in the lower tail). So families with a closed form get one
here (``Normal`` through ``log_ndtr`` and its inverse ``ndtri_log``); any other family
with a ``cdf`` falls back to ``log(cdf)`` and ``log1p(-cdf)`` (accurate on the lower side
only), and to ``icdf(1 - q)`` for the inverse survival function.

The inverses take log probabilities (``icdf_log``, ``isf_log``), so that a draw can be
placed where ``F`` itself underflows (a normal 40 standard deviations out: ``F = 4e-350``).

All functions are branch-free tensor code (``torch.where`` over clamped inputs, so that the
branch not taken never produces ``nan`` gradients) and compile without graph breaks.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pyro.distributions import Logistic
from torch.distributions import (
    Cauchy,
    Distribution,
    Exponential,
    Gamma,
    Gumbel,
    HalfNormal,
    Laplace,
    LogNormal,
    Normal,
    Pareto,
    Weibull,
)

__all__ = [
    "log_cdf",
    "log_survival",
    "icdf_log",
    "isf_log",
    "ndtri_log",
    "log1mexp",
    "log_prob_between",
    "has_icdf",
    "dtype_device",
]

_LOG2 = math.log(2.0)
_SQRT2 = math.sqrt(2.0)


def log1mexp(t: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(t))`` for ``t <= 0``, accurate for ``t`` near 0 and very negative."""
    t = t.clamp(max=-torch.finfo(t.dtype).tiny)
    near = t.clamp(min=-_LOG2)  # each branch sees only inputs where it is accurate and finite
    far = t.clamp(max=-_LOG2)
    return torch.where(t > -_LOG2, torch.log(-torch.expm1(near)), torch.log1p(-torch.exp(far)))


def log_ndtr(z: torch.Tensor) -> torch.Tensor:
    """``log Phi(z)``, the standard normal log cdf, accurate in both tails.

    Same accuracy as ``torch.special.log_ndtr``, which has no ``vmap`` batching rule (it
    falls back to a loop over chains); ``erfcx`` and ``erfc`` have one. Below ``z = -1``:
    ``Phi(z) = erfcx(-z / sqrt 2) exp(-z^2 / 2) / 2``; above: ``log1p(-Phi(-z))``.
    """
    neg, pos = z.clamp(max=-1.0), z.clamp(min=-1.0)
    lower = torch.log(torch.special.erfcx(-neg / _SQRT2)) - 0.5 * neg * neg - _LOG2
    return torch.where(z < -1.0, lower, torch.log1p(-0.5 * torch.special.erfc(pos / _SQRT2)))


_NDTRI_DIRECT = -20.0  # above this log p, start from ndtri(exp(log p)); below, asymptotics
_NEWTON_STEPS = 4
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_HALF_PI = math.sqrt(0.5 * math.pi)


def _mills(z: torch.Tensor) -> torch.Tensor:
    """``Phi(z) / phi(z) = sqrt(pi / 2) erfcx(-z / sqrt 2)``, without cancellation for
    ``z <= 0``."""
    return _SQRT_HALF_PI * torch.special.erfcx(-z / _SQRT2)


def _ndtri_newton(z: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """One Newton step for ``log_ndtr(z) = log_p``: ``d log Phi / dz = phi / Phi``."""
    return z - (log_ndtr(z) - log_p) * _mills(z)


def _ndtri_log_lower(log_p: torch.Tensor) -> torch.Tensor:
    """``Phi^{-1}(exp(log_p))`` for ``log_p <= -log 2`` (so ``z <= 0``).

    Start: ``ndtri(exp(log_p))`` where ``exp`` is safe, else the asymptotic
    ``z^2 ~ y - log y - log(2 pi)``, ``y = -2 log_p`` (from ``log Phi(z) ~ -z^2 / 2 -
    log(-z) - log(2 pi) / 2``). Newton on ``log_ndtr`` converges monotonically (``log Phi``
    is concave) and quadratically. The iterations are detached; one last differentiable step
    gives the implicit-function gradient ``dz / dlog_p = Phi(z) / phi(z)``.
    """
    finfo = torch.finfo(log_p.dtype)
    log_p = log_p.clamp(min=-0.25 * finfo.max, max=-_LOG2)  # z * z stays finite
    target = log_p.detach()
    direct = torch.special.ndtri(torch.exp(target.clamp(min=_NDTRI_DIRECT)))
    y = -2.0 * target.clamp(max=_NDTRI_DIRECT)
    asymptotic = -torch.sqrt(y - torch.log(y) - 2.0 * _HALF_LOG_2PI)
    z = torch.where(target > _NDTRI_DIRECT, direct, asymptotic)
    for _ in range(_NEWTON_STEPS):
        z = _ndtri_newton(z, target)
    z = z.detach()
    return z + (log_p - log_ndtr(z)) * _mills(z)


def ndtri_log(log_p: torch.Tensor) -> torch.Tensor:
    """``Phi^{-1}(exp(log_p))``, the standard normal quantile of a log probability.

    Accurate where ``exp(log_p)`` underflows (``log_p = -800``: ``z = -39.9``); above the
    median through the survival side, ``-Phi^{-1}(1 - p)``. Differentiable, with the exact
    gradient of the inverse. ``log_p = -inf`` and ``0`` give ``-inf`` and ``inf``.
    """
    lower = log_p <= -_LOG2
    log_q = torch.where(lower, log_p, log1mexp(log_p.clamp(min=-_LOG2)))
    z = _ndtri_log_lower(log_q)
    z = torch.where(lower, z, -z)
    z = torch.where(log_p == -math.inf, -math.inf, z)
    return torch.where(log_p == 0.0, math.inf, z)


def _probs(p: torch.Tensor) -> torch.Tensor:
    """Clamp probabilities into the open unit interval (``icdf(0)``/``icdf(1)`` are infinite)."""
    finfo = torch.finfo(p.dtype)
    return p.clamp(min=finfo.tiny, max=1.0 - finfo.eps)


# -- per-family closed forms: (log_cdf, log_survival, icdf, isf) ----------------------------
# Symmetric families need the lower side only: S(x) = F(2 loc - x), isf(q) = 2 loc - icdf(q).


def _normal_z(d, x):
    return (x - d.loc) / d.scale


def _normal(d, x):
    return log_ndtr(_normal_z(d, x))


def _normal_icdf(d, log_p):
    return d.loc + d.scale * ndtri_log(log_p)


def _laplace_log_cdf(d, x):
    z = (x - d.loc) / d.scale
    neg, pos = z.clamp(max=0.0), z.clamp(min=0.0)
    return torch.where(z < 0, neg - _LOG2, torch.log1p(-0.5 * torch.exp(-pos)))


def _laplace_icdf(d, log_p):
    low, high = log_p.clamp(max=-_LOG2), log_p.clamp(min=-_LOG2)
    z = torch.where(log_p < -_LOG2, low + _LOG2, -_LOG2 - log1mexp(high))
    return d.loc + d.scale * z


def _cauchy_log_cdf(d, x):
    z = (x - d.loc) / d.scale
    neg = z.clamp(max=-1e-30)  # cdf(z) = atan(-1/z) / pi for z < 0: no cancellation
    pos = z.clamp(min=0.0)
    return torch.where(
        z < 0,
        torch.log(torch.atan(-1.0 / neg) / math.pi),
        torch.log(0.5 + torch.atan(pos) / math.pi),
    )


def _cauchy_icdf(d, log_p):
    return d.loc - d.scale / torch.tan(math.pi * _probs(torch.exp(log_p)))


def _logistic_log_cdf(d, x):
    return -F.softplus(-(x - d.loc) / d.scale)


def _logistic_icdf(d, log_p):
    return d.loc + d.scale * (log_p - log1mexp(log_p))


_SYMMETRIC = {
    Normal: (_normal, _normal_icdf),
    Laplace: (_laplace_log_cdf, _laplace_icdf),
    Cauchy: (_cauchy_log_cdf, _cauchy_icdf),
    Logistic: (_logistic_log_cdf, _logistic_icdf),
}


def _lognormal_z(d, x):
    return (torch.log(x) - d.loc) / d.scale


def _half_normal_z(d, x):
    return x / d.scale


def _exp_rate(d, x):
    return d.rate * x


def _gamma_y(d, x):
    return d.rate * x


def _weibull_t(d, x):
    return (x / d.scale).pow(d.concentration)


def _gumbel_t(d, x):
    return torch.exp(-(x - d.loc) / d.scale)


# The inverses take log p (log q): -log(1 - p) = -log1mexp(log p), -log q = -log_q.
_ASYMMETRIC = {
    LogNormal: (
        lambda d, x: log_ndtr(_lognormal_z(d, x)),
        lambda d, x: log_ndtr(-_lognormal_z(d, x)),
        lambda d, lp: torch.exp(d.loc + d.scale * ndtri_log(lp)),
        lambda d, lq: torch.exp(d.loc - d.scale * ndtri_log(lq)),
    ),
    HalfNormal: (
        lambda d, x: torch.log(torch.erf(_half_normal_z(d, x) / math.sqrt(2.0))),
        lambda d, x: _LOG2 + log_ndtr(-_half_normal_z(d, x)),
        lambda d, lp: d.scale * torch.special.ndtri(0.5 + 0.5 * _probs(torch.exp(lp))),
        lambda d, lq: -d.scale * ndtri_log(lq - _LOG2),
    ),
    Exponential: (
        lambda d, x: log1mexp(-_exp_rate(d, x)),
        lambda d, x: -_exp_rate(d, x),
        lambda d, lp: -log1mexp(lp) / d.rate,
        lambda d, lq: -lq / d.rate,
    ),
    Gamma: (
        lambda d, x: torch.log(torch.special.gammainc(d.concentration, _gamma_y(d, x))),
        lambda d, x: torch.log(torch.special.gammaincc(d.concentration, _gamma_y(d, x))),
        None,
        None,
    ),
    Weibull: (
        lambda d, x: log1mexp(-_weibull_t(d, x)),
        lambda d, x: -_weibull_t(d, x),
        lambda d, lp: d.scale * (-log1mexp(lp)).pow(d.concentration.reciprocal()),
        lambda d, lq: d.scale * (-lq).pow(d.concentration.reciprocal()),
    ),
    Gumbel: (
        lambda d, x: -_gumbel_t(d, x),
        lambda d, x: log1mexp(-_gumbel_t(d, x)),
        lambda d, lp: d.loc - d.scale * torch.log(-lp),
        lambda d, lq: d.loc - d.scale * torch.log(-log1mexp(lq)),
    ),
    Pareto: (
        lambda d, x: log1mexp(d.alpha * (torch.log(d.scale) - torch.log(x))),
        lambda d, x: d.alpha * (torch.log(d.scale) - torch.log(x)),
        lambda d, lp: d.scale * torch.exp(-log1mexp(lp) / d.alpha),
        lambda d, lq: d.scale * torch.exp(-lq / d.alpha),
    ),
}


# Lower end of the support of the families above it: at and below it F = 0 exactly, set
# directly (the closed forms give nan there, or nan gradients: log(0), erf(0), 0 ** k).
_LOWER_END = {
    LogNormal: lambda d: 0.0,
    HalfNormal: lambda d: 0.0,
    Exponential: lambda d: 0.0,
    Gamma: lambda d: 0.0,
    Weibull: lambda d: 0.0,
    Pareto: lambda d: d.scale,
}


def _lower_end(d: Distribution):
    for cls, end in _LOWER_END.items():
        if isinstance(d, cls):
            return end(d)
    return None


def _guarded(fn, d, x, value_below):
    """``fn(d, x)``, and ``value_below`` where ``x`` is at or below the support's lower end
    (``fn`` sees a point inside the support there, so its gradient stays finite)."""
    end = _lower_end(d)
    if end is None:
        return fn(d, x)
    below = x <= end
    return torch.where(below, value_below, fn(d, torch.where(below, end + 1.0, x)))


def _reflected(log_cdf_fn, icdf_fn):
    """The four functions of a family symmetric about ``loc``, from its lower side."""
    return (
        log_cdf_fn,
        lambda d, x: log_cdf_fn(d, 2.0 * d.loc - x),
        icdf_fn,
        lambda d, q: 2.0 * d.loc - icdf_fn(d, q),
    )


def _lookup(d: Distribution):
    for cls, fns in _SYMMETRIC.items():
        if isinstance(d, cls):
            return _reflected(*fns)
    for cls, fns in _ASYMMETRIC.items():
        if isinstance(d, cls):
            return fns
    return None


def log_cdf(d: Distribution, x: torch.Tensor) -> torch.Tensor:
    """``log F(x)`` of a univariate base ``d``."""
    fns = _lookup(d)
    if fns is not None:
        return _guarded(fns[0], d, x, -math.inf)
    return torch.log(d.cdf(x).clamp(min=torch.finfo(x.dtype).tiny))


def log_survival(d: Distribution, x: torch.Tensor) -> torch.Tensor:
    """``log (1 - F(x))`` of a univariate base ``d``."""
    fns = _lookup(d)
    if fns is not None:
        return _guarded(fns[1], d, x, 0.0)
    return torch.log1p(-d.cdf(x).clamp(max=1.0 - torch.finfo(x.dtype).eps))


def one_base(name: str, base, base_dist):
    """The base distribution of a wrapper (hurdle, truncated, censored) given as ``base`` or
    by NumPyro's name ``base_dist``."""
    if (base is None) == (base_dist is None):
        raise TypeError(f"{name}: give the base distribution once, as base (or base_dist)")
    return base if base is not None else base_dist


def base_of(name: str, family: type, *args, **kwargs) -> Distribution:
    """``family(*args, **kwargs)``, the base of the distribution ``name`` (a hurdle,
    truncated... family), its parameter errors naming ``name`` too."""
    try:
        return family(*args, **kwargs)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from error


def _has_cdf(d: Distribution) -> bool:
    """Whether torch computes ``d.cdf``: a family that defines it, or a transformed
    distribution of one through monotone transforms with a known sign (``AbsTransform``,
    of ``FoldedDistribution``, has none)."""
    cdf = type(d).cdf
    if cdf is torch.distributions.TransformedDistribution.cdf:  # (HalfCauchy has its own)
        for transform in d.transforms:
            try:
                _ = transform.sign
            except NotImplementedError:
                return False
        return _lookup(d.base_dist) is not None or _has_cdf(d.base_dist)
    return cdf is not Distribution.cdf


def check_univariate_base(d: Distribution, name: str, continuous: bool = False) -> None:
    """A base that ``name`` (a truncation or censoring) can use: univariate, continuous if
    asked, with a ``cdf`` (its log densities need one; torch's ``StudentT``, ``Beta``,
    ``Poisson`` ... have none, and would fail at the first ``log_prob`` with an empty
    error)."""
    if d.event_shape != ():
        raise ValueError(
            f"{name} needs a univariate base distribution, got event_shape "
            f"{tuple(d.event_shape)} from {type(d).__name__}"
        )
    if continuous and d.support.is_discrete:
        raise ValueError(f"{name} needs a continuous base, got {type(d).__name__}")
    if _lookup(d) is None and not _has_cdf(d):
        raise NotImplementedError(
            f"{name} needs the cdf of its base, and {type(d).__name__} has none in torch "
            f"(families with one: Normal, LogNormal, HalfNormal, Exponential, Laplace, "
            f"Cauchy, Logistic, Gumbel, Weibull, Pareto, Gamma, Uniform, ...)"
        )


def has_icdf(d: Distribution) -> bool:
    """Whether ``icdf``/``isf`` below are available for ``d`` (decided from its type)."""
    fns = _lookup(d)
    if fns is not None:
        return fns[2] is not None
    return type(d).icdf is not Distribution.icdf


def _log_probs(log_p: torch.Tensor) -> torch.Tensor:
    """Clamp log probabilities to ``[log tiny, log(1 - eps)]``: finite inverses (and finite
    gradients in branches that ``torch.where`` does not take)."""
    finfo = torch.finfo(log_p.dtype)
    return log_p.clamp(min=-0.5 * finfo.max, max=math.log1p(-finfo.eps))


def icdf_log(d: Distribution, log_p: torch.Tensor) -> torch.Tensor:
    """``F^{-1}(exp(log_p))``, accurate for small ``p`` (also where ``exp(log_p)``
    underflows, for the families with a closed form)."""
    log_p = _log_probs(log_p)
    fns = _lookup(d)
    if fns is not None and fns[2] is not None:
        return fns[2](d, log_p)
    return d.icdf(_probs(torch.exp(log_p)))


def isf_log(d: Distribution, log_q: torch.Tensor) -> torch.Tensor:
    """Inverse survival function of a log probability, ``S^{-1}(exp(log_q))``, accurate for
    small ``q`` where the family has a closed form."""
    log_q = _log_probs(log_q)
    fns = _lookup(d)
    if fns is not None and fns[3] is not None:
        return fns[3](d, log_q)
    return d.icdf(_probs(-torch.expm1(log_q)))


def log_prob_between(
    d: Distribution, low: torch.Tensor | None, high: torch.Tensor | None
) -> torch.Tensor:
    """``log P(low < X <= high)``, computed on the side of the median where it is accurate.

    ``None`` means an infinite bound. When ``low`` lies above the median, the difference
    is taken of survival functions, ``S(low) - S(high)``; otherwise of cdfs. Both in log
    space: ``log(a - b) = log a + log1mexp(log b - log a)``.
    """
    if low is None and high is None:
        raise ValueError("log_prob_between needs at least one finite bound")
    if low is None:
        return log_cdf(d, high)
    if high is None:
        return log_survival(d, low)
    lcdf_low, lcdf_high = log_cdf(d, low), log_cdf(d, high)
    lsf_low, lsf_high = log_survival(d, low), log_survival(d, high)
    lower_side = lcdf_high + log1mexp(lcdf_low - lcdf_high)
    upper_side = lsf_low + log1mexp(lsf_high - lsf_low)
    return torch.where(lcdf_low > -_LOG2, upper_side, lower_side)


def dtype_device(d: Distribution) -> tuple[torch.dtype, torch.device]:
    """dtype and device of a distribution's parameters (from its mean, else its
    parameters). The parameters are read by name from ``arg_constraints``: Dynamo before
    torch 2.13 cannot trace ``vars(d).values()``."""
    try:
        mean = d.mean
    except NotImplementedError:
        mean = None
    params = [getattr(d, name, None) for name in getattr(d, "arg_constraints", {})]
    for t in [mean, *params]:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.dtype, t.device
    return torch.get_default_dtype(), torch.get_default_device()
