"""Truncation of any continuous univariate family with a ``cdf`` (and an ``icdf`` to sample).

``TruncatedDistribution(base, low, high)`` restricts ``base`` to ``[low, high]`` and
renormalizes. The normalizer ``log Z = log(F(high) - F(low))`` is computed on the side of
the median where it is accurate (see :mod:`probtorch.distributions._tails`), so a
``Normal(0, 1)`` truncated to ``[8, 10]`` has finite, exact log densities. Samples come
through the inverse cdf, ``x = F^{-1}(F(low) + u (F(high) - F(low)))`` with
``u ~ Uniform(0, 1)`` (or its survival-function mirror in the upper tail), taken in log
space so that it stays exact where ``F(low)`` underflows (a normal truncated to
``[38, 40]``); gradients flow to the base parameters and to the bounds.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import Normal, constraints
from torch.distributions.utils import broadcast_all

from . import _tails
from .constraint_registry import less_than_eq

__all__ = ["TruncatedDistribution", "TruncatedNormal"]

_LOG2 = math.log(2.0)


def _as_bound(bound, dtype, device):
    if bound is None:
        return None
    return torch.as_tensor(bound, dtype=dtype, device=device)


class TruncatedDistribution(TorchDistribution):
    """The base distribution restricted to ``[low, high]`` and renormalized.

    Args:
        base: a continuous univariate distribution with ``cdf`` (``log_prob``) and ``icdf``
            (sampling). ``Normal``, ``LogNormal``, ``HalfNormal``, ``Exponential``,
            ``Laplace``, ``Cauchy``, ``Logistic``, ``Gumbel``, ``Weibull``, ``Pareto`` and
            ``Gamma`` (no sampling: torch has no inverse incomplete gamma) use
            closed forms accurate in both tails; other families use their ``cdf``/``icdf``.
        low: lower bound (``None``: unbounded below).
        high: upper bound (``None``: unbounded above).

    The batch shape broadcasts ``base.batch_shape`` with the shapes of ``low`` and ``high``.
    Pass an unbounded side as ``None`` rather than ``inf``. A bound outside the base's
    support is moved to the support's end (``low=-1`` for a ``LogNormal`` is ``low=0``).

    Example::

        >>> d = TruncatedDistribution(Normal(0.0, 1.0), low=8.0, high=10.0)
        >>> x = d.sample((1000,))
        >>> bool(((x >= 8) & (x <= 10)).all())
        True
        >>> round(float(d.log_prob(torch.tensor(8.0))), 4)  # scipy: truncnorm(8, 10).logpdf(8)
        2.0945
    """

    def __init__(self, base=None, low=None, high=None, validate_args=None, base_dist=None):
        base = _tails.one_base(type(self).__name__, base, base_dist)
        name = type(self).__name__
        if low is None and high is None:
            raise ValueError(f"{name} needs at least one of low and high")
        _tails.check_univariate_base(base, name, continuous=True)
        dtype, device = _tails.dtype_device(base)
        low, high = _as_bound(low, dtype, device), _as_bound(high, dtype, device)
        shapes = [base.batch_shape] + [b.shape for b in (low, high) if b is not None]
        batch_shape = torch.broadcast_shapes(*shapes)
        self.base_dist = base.expand(batch_shape)
        # A bound outside the base's support truncates nothing: clamp it into the support
        # (LogNormal above -1 is LogNormal above 0; Pareto(1, 2) above 0.5, above 1).
        support = self.base_dist.support
        support_low = getattr(support, "lower_bound", None)
        support_high = getattr(support, "upper_bound", None)
        if low is not None and support_low is not None:
            low = torch.maximum(low, torch.as_tensor(support_low, dtype=dtype, device=device))
        if high is not None and support_high is not None:
            high = torch.minimum(high, torch.as_tensor(support_high, dtype=dtype, device=device))
        self.low = None if low is None else low.expand(batch_shape)
        self.high = None if high is None else high.expand(batch_shape)
        super().__init__(batch_shape, validate_args=validate_args)
        if self._validate_args and low is not None and high is not None:
            if not bool((self.low < self.high).all()):
                raise ValueError(f"{name}: expected low < high, got low={low} and high={high}")

    _param_constraints: dict = {}  # constraints of parameters a subclass exposes

    @property
    def arg_constraints(self):
        bounds = {
            n: constraints.real for n in ("low", "high") if getattr(self, n, None) is not None
        }
        return {**self._param_constraints, **bounds}

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        if self.low is None:
            return less_than_eq(self.high)  # closed, as log_prob and rsample include high
        if self.high is None:
            return constraints.greater_than_eq(self.low)
        return constraints.interval(self.low, self.high)

    @property
    def has_rsample(self):
        return _tails.has_icdf(self.base_dist)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.base_dist = self.base_dist.expand(batch_shape)
        new.low = None if self.low is None else self.low.expand(batch_shape)
        new.high = None if self.high is None else self.high.expand(batch_shape)
        TorchDistribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def log_normalizer(self) -> torch.Tensor:
        """``log(F(high) - F(low))`` of the base, accurate in both tails."""
        return _tails.log_prob_between(self.base_dist, self.low, self.high)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        log_prob = self.base_dist.log_prob(value) - self.log_normalizer
        inside = torch.ones_like(log_prob, dtype=torch.bool)
        if self.low is not None:
            inside = inside & (value >= self.low)
        if self.high is not None:
            inside = inside & (value <= self.high)
        return torch.where(inside, log_prob, -math.inf)

    def cdf(self, value):
        if self.low is not None:
            value = torch.maximum(value, self.low)
        if self.high is not None:
            value = torch.minimum(value, self.high)
        if self.low is None:
            log_mass = _tails.log_cdf(self.base_dist, value)
        else:
            log_mass = _tails.log_prob_between(self.base_dist, self.low, value)
        return torch.exp(log_mass - self.log_normalizer)

    def rsample(self, sample_shape=()):
        if not self.has_rsample:
            raise NotImplementedError(
                f"sampling a truncated {type(self.base_dist).__name__} needs its icdf, "
                f"which torch does not provide"
            )
        shape = self._extended_shape(sample_shape)
        base, low, high = self.base_dist, self.low, self.high
        bound = low if low is not None else high
        finfo = torch.finfo(bound.dtype)
        # u in [tiny, 1): log u and log(1 - u) are finite
        u = torch.rand(shape, dtype=bound.dtype, device=bound.device).clamp(min=finfo.tiny)
        log_z = self.log_normalizer
        # Inverse cdf in log space, so that draws far in a tail (where F(low) underflows)
        # are spread over [low, high]. Lower side: p = F(low) + u (F(high) - F(low));
        # upper side (low above the median): q = S(high) + (1 - u) (S(low) - S(high)),
        # which keeps its precision when F ~ 1.
        log_p = torch.log(u) + log_z
        if low is not None:
            log_cdf_low = _tails.log_cdf(base, low)
            log_p = torch.logaddexp(log_cdf_low, log_p)
        x = _tails.icdf_log(base, log_p)
        if low is not None:
            log_q = torch.log1p(-u) + log_z
            if high is not None:
                log_q = torch.logaddexp(_tails.log_survival(base, high), log_q)
            x_upper = _tails.isf_log(base, log_q)
            x = torch.where(log_cdf_low > -_LOG2, x_upper, x)
        # Rounding can put x a hair outside the bounds.
        if low is not None:
            x = torch.maximum(x, low)
        if high is not None:
            x = torch.minimum(x, high)
        return x

    def sample(self, sample_shape=()):
        with torch.no_grad():
            return self.rsample(sample_shape)


# Quadrature rules for the variance (float64; cast where used): Gauss-Legendre on [0, 1]
# and Gauss-Laguerre (weight exp(-u) on [0, inf)).
_legendre_t, _legendre_w = np.polynomial.legendre.leggauss(48)
_GL_NODES, _GL_WEIGHTS = torch.tensor((_legendre_t + 1.0) / 2.0), torch.tensor(_legendre_w / 2.0)
_laguerre_x, _laguerre_w = np.polynomial.laguerre.laggauss(40)
_LAGUERRE_NODES, _LAGUERRE_WEIGHTS = torch.tensor(_laguerre_x), torch.tensor(_laguerre_w)
_GL_MAX_WIDTH = 8.0  # Gauss-Legendre where w <= 8 and |a| w <= 8
_LAGUERRE_MIN_A = 2.0  # Gauss-Laguerre for the tail side from a = 2 on
_MAX_WIDTH = 40.0  # exp(-w^2 / 2) is 0 beyond: a wider interval is one-sided


def _rule(nodes, weights, like):
    return nodes.to(like), weights.to(like)


def _mean_and_variance(y, f):
    """Mean and variance of the nodes ``y`` under the (unnormalized) weights ``f`` (the
    variance centered first)."""
    total = f.sum(-1)
    m = (f * y).sum(-1) / total
    return m, (f * (y - m.unsqueeze(-1)) ** 2).sum(-1) / total


def _moments_legendre(a, w):
    """Mean and variance of ``Y`` on ``[0, w]`` with density ``exp(-a y - y^2 / 2)``:
    Gauss-Legendre, exact to rounding where the integrand is gentle (``w <= 8``, ``|a| w <= 8``)."""
    t, weights = _rule(_GL_NODES, _GL_WEIGHTS, a)
    y = w.unsqueeze(-1) * t
    f = weights * torch.exp(-a.unsqueeze(-1) * y - 0.5 * y * y)
    return _mean_and_variance(y, f)


def _moments_laguerre(a, w):
    """The same for ``a >= 2`` and ``a w > 8``: ``int_0^w = int_0^inf - int_w^inf``, and
    ``int_w^inf y^k exp(-a y - y^2/2) dy = exp(-a w - w^2/2) int_0^inf (w + v)^k exp(-(a + w) v
    - v^2/2) dv``; each ``int_0^inf v^k exp(-c v - v^2 / 2) dv`` by Gauss-Laguerre in ``u = c v``
    (smooth for ``c >= 2``). Nothing cancels: the subtracted part is below ``exp(-8)``."""
    x, weights = _rule(_LAGUERRE_NODES, _LAGUERRE_WEIGHTS, a)

    def moments(c):
        v = x / c.unsqueeze(-1)
        g = weights * torch.exp(-0.5 * v * v) / c.unsqueeze(-1)
        return g.sum(-1), (g * v).sum(-1), (g * v * v).sum(-1)

    j0, j1, j2 = moments(a)
    k0, k1, k2 = moments(a + w)
    e = torch.exp(-a * w - 0.5 * w * w)
    i0 = j0 - e * k0
    m = (j1 - e * (w * k0 + k1)) / i0
    second = (j2 - e * (w * w * k0 + 2.0 * w * k1 + k2)) / i0
    return m, second - m * m


class TruncatedNormal(TruncatedDistribution):
    """``Normal(loc, scale)`` truncated to ``[low, high]``, with NumPyro's signature.

    Mean and variance are analytic. Accurate far in the tails: ``TruncatedNormal(0, 1, 8,
    10)`` has exact log densities and samples inside ``[8, 10]``.

    Example::

        >>> d = TruncatedNormal(0.0, 1.0, low=0.0)  # the half-normal
        >>> round(float(d.mean), 4) == round(math.sqrt(2 / math.pi), 4)
        True
    """

    _param_constraints = {"loc": constraints.real, "scale": constraints.positive}

    def __init__(self, loc=0.0, scale=1.0, low=None, high=None, validate_args=None):
        loc, scale = broadcast_all(loc, scale)
        base = _tails.base_of(type(self).__name__, Normal, loc, scale, validate_args=validate_args)
        super().__init__(base, low, high, validate_args=validate_args)

    @property
    def loc(self):
        return self.base_dist.loc

    @property
    def scale(self):
        return self.base_dist.scale

    def _ratios(self):
        """``alpha phi(alpha) / Z`` style terms of the closed-form moments (0 for an
        infinite bound)."""
        base = self.base_dist
        log_z = self.log_normalizer
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        zero = torch.zeros_like(log_z)
        r_low = r_high = a_r_low = b_r_high = zero
        if self.low is not None:
            alpha = (self.low - base.loc) / base.scale
            finite = torch.isfinite(alpha)
            alpha = torch.where(finite, alpha, 0.0)
            r_low = torch.where(finite, torch.exp(-0.5 * alpha**2 - half_log_2pi - log_z), 0.0)
            a_r_low = alpha * r_low
        if self.high is not None:
            beta = (self.high - base.loc) / base.scale
            finite = torch.isfinite(beta)
            beta = torch.where(finite, beta, 0.0)
            r_high = torch.where(finite, torch.exp(-0.5 * beta**2 - half_log_2pi - log_z), 0.0)
            b_r_high = beta * r_high
        return r_low, r_high, a_r_low, b_r_high

    def _quadrature(self):
        """Mean and variance where the closed forms cancel (narrow intervals and far tails:
        the variance small against ``a^2``, ``b^2``; the mean's ``r_low - r_high``), by
        quadrature of the standardized ``Y = X - a`` (reflected so that ``a`` is the end
        nearer the mode), exact to rounding. Returns ``(used, mean, variance)``: where
        ``used`` is false the closed forms hold and the two others are placeholders."""
        loc, scale = self.loc, self.scale
        inf = torch.full_like(self.log_normalizer, math.inf)
        a = -inf if self.low is None else (self.low - loc) / scale
        b = inf if self.high is None else (self.high - loc) / scale
        if self.low is not None and self.high is not None:
            width = (self.high - self.low) / scale  # no rounding of a and b in a narrow width
        else:
            width = b - a
        flip = a + b < 0  # mirror so that the interval leans to the upper side
        a = torch.where(flip, -b, a)
        a_abs = a.abs()
        use_legendre = (width <= _GL_MAX_WIDTH) & (a_abs * width <= _GL_MAX_WIDTH)
        use_laguerre = ~use_legendre & (a >= _LAGUERRE_MIN_A)
        # each rule sees safe inputs where it is not used (finite values and gradients)
        one = torch.ones_like(a)
        legendre = _moments_legendre(
            torch.where(use_legendre, a, 0.0), torch.where(use_legendre, width, one)
        )
        laguerre = _moments_laguerre(
            torch.where(use_laguerre, a, _LAGUERRE_MIN_A),
            torch.where(use_laguerre, width.clamp(max=_MAX_WIDTH), one),
        )
        m, var = (torch.where(use_legendre, g, l) for g, l in zip(legendre, laguerre))
        # the mean from the end the quadrature starts at (no rounding of a: it is low or
        # high itself), low + scale m, or high - scale m when mirrored
        zero = torch.zeros_like(a)
        low = zero if self.low is None else self.low
        high = zero if self.high is None else self.high
        mean = torch.where(flip, high - scale * m, low + scale * m)
        return use_legendre | use_laguerre, mean, scale**2 * var

    @property
    def mean(self):
        r_low, r_high, _, _ = self._ratios()
        closed = self.loc + self.scale * (r_low - r_high)
        used, mean, _ = self._quadrature()
        return torch.where(used, mean, closed)

    @property
    def variance(self):
        r_low, r_high, a_r_low, b_r_high = self._ratios()
        closed = 1.0 + a_r_low - b_r_high - (r_low - r_high) ** 2
        used, _, variance = self._quadrature()
        return torch.where(used, variance, self.scale**2 * closed)
