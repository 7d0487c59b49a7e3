"""Truncation of any continuous univariate family with a ``cdf`` (and an ``icdf`` to sample).

``TruncatedDistribution(base, low, high)`` restricts ``base`` to ``[low, high]`` and
renormalizes. The normalizer ``log Z = log(F(high) - F(low))`` is computed on the side of
the median where it is accurate (see :mod:`probtorch.distributions._tails`), so a
``Normal(0, 1)`` truncated to ``[8, 10]`` has finite, exact log densities. Samples come
through the inverse cdf, ``x = F^{-1}(F(low) + u (F(high) - F(low)))`` with
``u ~ Uniform(0, 1)`` (or its survival-function mirror in the upper tail), so gradients
flow to the base parameters and to the bounds.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import Normal, constraints
from torch.distributions.utils import broadcast_all

from . import _tails

__all__ = ["TruncatedDistribution", "TruncatedNormal"]

_LOG2 = math.log(2.0)


def _as_bound(bound, dtype, device):
    if bound is None:
        return None
    return torch.as_tensor(bound, dtype=dtype, device=device)


def _check_base(base, name):
    if base.event_shape != ():
        raise ValueError(
            f"{name} needs a univariate base distribution, got event_shape "
            f"{tuple(base.event_shape)} from {type(base).__name__}"
        )
    if base.support.is_discrete:
        raise ValueError(f"{name} needs a continuous base, got {type(base).__name__}")


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
    Pass an unbounded side as ``None`` rather than ``inf``.

    Example::

        >>> d = TruncatedDistribution(Normal(0.0, 1.0), low=8.0, high=10.0)
        >>> x = d.sample((1000,))
        >>> bool(((x >= 8) & (x <= 10)).all())
        True
        >>> round(float(d.log_prob(torch.tensor(8.0))), 4)  # scipy: truncnorm(8, 10).logpdf(8)
        2.0945
    """

    def __init__(self, base, low=None, high=None, validate_args=None):
        name = type(self).__name__
        if low is None and high is None:
            raise ValueError(f"{name} needs at least one of low and high")
        _check_base(base, name)
        dtype, device = _tails.dtype_device(base)
        low, high = _as_bound(low, dtype, device), _as_bound(high, dtype, device)
        shapes = [base.batch_shape] + [b.shape for b in (low, high) if b is not None]
        batch_shape = torch.broadcast_shapes(*shapes)
        self.base_dist = base.expand(batch_shape)
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
            return constraints.less_than(self.high)
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
        u = torch.rand(shape, dtype=bound.dtype, device=bound.device)
        zero, one = u.new_zeros(()), u.new_ones(())
        # Lower side: p = F(low) + u (F(high) - F(low)); upper side (low above the median):
        # q = S(high) + (1 - u) (S(low) - S(high)), which keeps its precision when F ~ 1.
        p_low = zero if low is None else torch.exp(_tails.log_cdf(base, low))
        p_high = one if high is None else torch.exp(_tails.log_cdf(base, high))
        x = _tails.icdf(base, p_low + u * (p_high - p_low))
        if low is not None:
            q_low = torch.exp(_tails.log_survival(base, low))
            q_high = zero if high is None else torch.exp(_tails.log_survival(base, high))
            x_upper = _tails.isf(base, q_high + (1.0 - u) * (q_low - q_high))
            x = torch.where(p_low > 0.5, x_upper, x)
        # Rounding can put x a hair outside the bounds.
        if low is not None:
            x = torch.maximum(x, low)
        if high is not None:
            x = torch.minimum(x, high)
        return x

    def sample(self, sample_shape=()):
        with torch.no_grad():
            return self.rsample(sample_shape)


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
        base = Normal(loc, scale, validate_args=validate_args)
        super().__init__(base, low, high, validate_args=validate_args)

    @property
    def loc(self):
        return self.base_dist.loc

    @property
    def scale(self):
        return self.base_dist.scale

    def _ratios(self):
        """``alpha phi(alpha) / Z`` style terms of the closed-form moments."""
        base = self.base_dist
        log_z = self.log_normalizer
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        zero = torch.zeros_like(log_z)
        r_low = r_high = a_r_low = b_r_high = zero
        if self.low is not None:
            alpha = (self.low - base.loc) / base.scale
            r_low = torch.exp(-0.5 * alpha**2 - half_log_2pi - log_z)
            a_r_low = alpha * r_low
        if self.high is not None:
            beta = (self.high - base.loc) / base.scale
            r_high = torch.exp(-0.5 * beta**2 - half_log_2pi - log_z)
            b_r_high = beta * r_high
        return r_low, r_high, a_r_low, b_r_high

    @property
    def mean(self):
        r_low, r_high, _, _ = self._ratios()
        return self.loc + self.scale * (r_low - r_high)

    @property
    def variance(self):
        r_low, r_high, a_r_low, b_r_high = self._ratios()
        return self.scale**2 * (1.0 + a_r_low - b_r_high - (r_low - r_high) ** 2)
