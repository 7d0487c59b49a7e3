"""Tail-accurate ``log cdf``, ``log survival``, ``icdf`` and inverse survival of a base family.

Truncation and censoring need ``log F(x)`` and ``log (1 - F(x))`` far into the tails, and
an inverse that stays accurate there. torch's ``cdf``/``icdf`` lose everything past a few
standard deviations on the upper side (``1 - F`` rounds to 0; ``Laplace.cdf`` and
``Cauchy.cdf`` even cancel in the lower tail). So families with a closed form get one
here (``Normal`` through ``log_ndtr``/``ndtri``); any other family with a ``cdf`` falls
back to ``log(cdf)`` and ``log1p(-cdf)`` (accurate on the lower side only), and to
``icdf(1 - q)`` for the inverse survival function.

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
    "icdf",
    "isf",
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


def _normal_icdf(d, p):
    return d.loc + d.scale * torch.special.ndtri(_probs(p))


def _laplace_log_cdf(d, x):
    z = (x - d.loc) / d.scale
    neg, pos = z.clamp(max=0.0), z.clamp(min=0.0)
    return torch.where(z < 0, neg - _LOG2, torch.log1p(-0.5 * torch.exp(-pos)))


def _laplace_icdf(d, p):
    p = _probs(p)
    low, high = p.clamp(max=0.5), p.clamp(min=0.5)
    z = torch.where(p < 0.5, torch.log(2.0 * low), -torch.log(2.0 - 2.0 * high))
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


def _cauchy_icdf(d, p):
    return d.loc - d.scale / torch.tan(math.pi * _probs(p))


def _logistic_log_cdf(d, x):
    return -F.softplus(-(x - d.loc) / d.scale)


def _logistic_icdf(d, p):
    p = _probs(p)
    return d.loc + d.scale * (torch.log(p) - torch.log1p(-p))


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


_ASYMMETRIC = {
    LogNormal: (
        lambda d, x: log_ndtr(_lognormal_z(d, x)),
        lambda d, x: log_ndtr(-_lognormal_z(d, x)),
        lambda d, p: torch.exp(d.loc + d.scale * torch.special.ndtri(_probs(p))),
        lambda d, q: torch.exp(d.loc - d.scale * torch.special.ndtri(_probs(q))),
    ),
    HalfNormal: (
        lambda d, x: torch.log(torch.erf(_half_normal_z(d, x) / math.sqrt(2.0))),
        lambda d, x: _LOG2 + log_ndtr(-_half_normal_z(d, x)),
        lambda d, p: d.scale * torch.special.ndtri(0.5 + 0.5 * _probs(p)),
        lambda d, q: -d.scale * torch.special.ndtri(0.5 * _probs(q)),
    ),
    Exponential: (
        lambda d, x: log1mexp(-_exp_rate(d, x)),
        lambda d, x: -_exp_rate(d, x),
        lambda d, p: -torch.log1p(-_probs(p)) / d.rate,
        lambda d, q: -torch.log(_probs(q)) / d.rate,
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
        lambda d, p: d.scale * (-torch.log1p(-_probs(p))).pow(d.concentration.reciprocal()),
        lambda d, q: d.scale * (-torch.log(_probs(q))).pow(d.concentration.reciprocal()),
    ),
    Gumbel: (
        lambda d, x: -_gumbel_t(d, x),
        lambda d, x: log1mexp(-_gumbel_t(d, x)),
        lambda d, p: d.loc - d.scale * torch.log(-torch.log(_probs(p))),
        lambda d, q: d.loc - d.scale * torch.log(-torch.log1p(-_probs(q))),
    ),
    Pareto: (
        lambda d, x: log1mexp(d.alpha * (torch.log(d.scale) - torch.log(x))),
        lambda d, x: d.alpha * (torch.log(d.scale) - torch.log(x)),
        lambda d, p: d.scale * torch.exp(-torch.log1p(-_probs(p)) / d.alpha),
        lambda d, q: d.scale * torch.exp(-torch.log(_probs(q)) / d.alpha),
    ),
}


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
        return fns[0](d, x)
    return torch.log(d.cdf(x).clamp(min=torch.finfo(x.dtype).tiny))


def log_survival(d: Distribution, x: torch.Tensor) -> torch.Tensor:
    """``log (1 - F(x))`` of a univariate base ``d``."""
    fns = _lookup(d)
    if fns is not None:
        return fns[1](d, x)
    return torch.log1p(-d.cdf(x).clamp(max=1.0 - torch.finfo(x.dtype).eps))


def has_icdf(d: Distribution) -> bool:
    """Whether ``icdf``/``isf`` below are available for ``d`` (decided from its type)."""
    fns = _lookup(d)
    if fns is not None:
        return fns[2] is not None
    return type(d).icdf is not Distribution.icdf


def icdf(d: Distribution, p: torch.Tensor) -> torch.Tensor:
    """``F^{-1}(p)``, accurate for small ``p``."""
    fns = _lookup(d)
    if fns is not None and fns[2] is not None:
        return fns[2](d, p)
    return d.icdf(_probs(p))


def isf(d: Distribution, q: torch.Tensor) -> torch.Tensor:
    """Inverse survival function ``S^{-1}(q) = F^{-1}(1 - q)``, accurate for small ``q``
    where the family has a closed form."""
    fns = _lookup(d)
    if fns is not None and fns[3] is not None:
        return fns[3](d, q)
    return d.icdf(_probs(1.0 - q))


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
