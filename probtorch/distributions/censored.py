"""Censored observations of a continuous univariate family.

Two conventions, both common:

* **Survival analysis** (NumPyro's API): a boolean indicator per observation says whether
  the reported value is exact or only a bound. :class:`LeftCensoredDistribution` (true value
  at or below the reported one: ``log F(x)``), :class:`RightCensoredDistribution` (at or
  above: ``log S(x) = log(1 - F(x))``) and :class:`IntervalCensoredDistribution` (a pair
  ``(lower, upper)`` per observation).
* **Clipping** (PyMC's ``Censored``, the Tobit model): :class:`Censored` with fixed bounds;
  values at or below ``low`` were reported as ``low`` and carry the mass ``F(low)``, values
  at or above ``high`` carry ``S(high)``, values in between the base density.

All tails are computed in log space and stay accurate far out (see
:mod:`probtorch.distributions._tails`).
"""

from __future__ import annotations

import math

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints

from . import _tails
from .constraint_registry import less_than_eq

__all__ = [
    "Censored",
    "LeftCensoredDistribution",
    "RightCensoredDistribution",
    "IntervalCensoredDistribution",
]


def _copy(dist, batch_shape, tensors):
    """An expanded copy of ``dist``: ``base_dist`` and the named tensors expanded."""
    batch_shape = torch.Size(batch_shape)
    new = type(dist).__new__(type(dist))
    new.__dict__.update(dist.__dict__)
    new.base_dist = dist.base_dist.expand(batch_shape)
    for name in tensors:
        value = getattr(dist, name)
        if value is not None:
            setattr(new, name, value.expand(batch_shape))
    TorchDistribution.__init__(new, batch_shape, new.event_shape, validate_args=False)
    new._validate_args = dist._validate_args
    return new


class _IndicatorCensored(TorchDistribution):
    """Shared by the left- and right-censored wrappers: ``censored`` selects a tail term."""

    arg_constraints = {"censored": constraints.boolean}

    def __init__(self, base=None, censored=False, validate_args=None, base_dist=None):
        base = _tails.one_base(type(self).__name__, base, base_dist)
        _tails.check_univariate_base(base, type(self).__name__)
        censored = torch.as_tensor(censored)
        if censored.dtype != torch.bool:
            if validate_args is not False and not bool(((censored == 0) | (censored == 1)).all()):
                raise ValueError(
                    f"{type(self).__name__}: parameter censored must be boolean (0 or 1), "
                    f"got {censored}"
                )
            censored = censored != 0
        batch_shape = torch.broadcast_shapes(base.batch_shape, censored.shape)
        self.base_dist = base.expand(batch_shape)
        self.censored = censored.expand(batch_shape)
        super().__init__(batch_shape, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return self.base_dist.support

    def expand(self, batch_shape, _instance=None):
        return _copy(self, batch_shape, ["censored"])

    def _tail(self, value):
        raise NotImplementedError

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return torch.where(self.censored, self._tail(value), self.base_dist.log_prob(value))

    def sample(self, sample_shape=()):
        """Draws of the (uncensored) base: the censoring points are data, not parameters."""
        return self.base_dist.sample(sample_shape)

    @property
    def mean(self):
        return self.base_dist.mean

    @property
    def variance(self):
        return self.base_dist.variance


class LeftCensoredDistribution(_IndicatorCensored):
    """Left-censored observations: where ``censored``, the true value is at or below ``value``.

    ``log_prob(value)`` is ``log F(value)`` for censored entries and ``base.log_prob(value)``
    for the others (R: ``Surv(time, event, type="left")``). Samples are draws of ``base``.

    Args:
        base: a univariate distribution with a ``cdf``.
        censored: boolean tensor (broadcast with ``base.batch_shape``), ``True`` where the
            observation is censored.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = LeftCensoredDistribution(dist.Normal(0.0, 1.0), torch.tensor([False, True]))
        >>> d.log_prob(torch.tensor([0.0, 0.0]))  # density, then log P(X <= 0) = log 1/2
        tensor([-0.9189, -0.6931])
    """

    def _tail(self, value):
        return _tails.log_cdf(self.base_dist, value)


class RightCensoredDistribution(_IndicatorCensored):
    """Right-censored observations: where ``censored``, the true value is at or above ``value``.

    The survival-analysis convention: ``value`` is the event time, or the censoring time for
    censored entries. ``log_prob(value)`` is ``log S(value) = log(1 - F(value))`` for
    censored entries and ``base.log_prob(value)`` for the others (R:
    ``Surv(time, event)`` with ``censored = 1 - event``). Samples are draws of ``base``.

    Args:
        base: a univariate distribution with a ``cdf``.
        censored: boolean tensor (broadcast with ``base.batch_shape``), ``True`` where the
            observation is censored.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = RightCensoredDistribution(dist.Exponential(2.0), torch.tensor([False, True]))
        >>> d.log_prob(torch.tensor([1.0, 1.0]))  # log 2 - 2, then log S(1) = -2
        tensor([-1.3069, -2.0000])
    """

    def _tail(self, value):
        return _tails.log_survival(self.base_dist, value)


def _finite_or_zero(x):
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _log_cdf(base, x):
    """``log F(x)`` with the limits at ``x = -inf`` (``-inf``) and ``x = inf`` (0)."""
    result = torch.where(x == math.inf, 0.0, _tails.log_cdf(base, _finite_or_zero(x)))
    return torch.where(x == -math.inf, -math.inf, result)


def _log_survival(base, x):
    """``log S(x)`` with the limits at ``x = -inf`` (0) and ``x = inf`` (``-inf``)."""
    result = torch.where(x == -math.inf, 0.0, _tails.log_survival(base, _finite_or_zero(x)))
    return torch.where(x == math.inf, -math.inf, result)


class _IntervalSupport(constraints.independent):
    """Pairs ``lower <= upper`` of reals, except that the end a one-sided row does not use
    (``lower`` of a left-censored row, ``upper`` of a right-censored one) may be anything
    (``nan``).
    ``biject_to`` treats it as ``independent(real, 1)``."""

    def __init__(self, left_censored, right_censored):
        super().__init__(constraints.real, 1)
        self.left_censored = left_censored
        self.right_censored = right_censored

    def check(self, value):
        if value.dim() < 1:
            raise ValueError(f"Expected value.dim() >= 1 but got {value.dim()}")
        left, right = self.left_censored, self.right_censored
        lower_ok = ~torch.isnan(value[..., 0]) | (left & ~right)
        upper_ok = ~torch.isnan(value[..., 1]) | (right & ~left)
        # a row that uses both ends needs lower <= upper (it was swapped silently)
        ordered = ~(value[..., 0] > value[..., 1]) | (left ^ right)
        return lower_ok & upper_ok & ordered

    def __repr__(self):
        return "IntervalCensoredSupport()"


class IntervalCensoredDistribution(TorchDistribution):
    """Interval-censored observations ``(lower, upper)``, with NumPyro's signature.

    ``value[..., 0]`` is the lower and ``value[..., 1]`` the upper end of each observation
    (event shape ``(2,)``). Per entry:

    ======================  ======================  =====================================
    ``left_censored``       ``right_censored``      ``log_prob``
    ======================  ======================  =====================================
    ``True``                ``False``               ``log F(upper)``
    ``False``               ``True``                ``log S(lower)``
    ``False``               ``False``               ``log(F(upper) - F(lower))``, or the
                                                    density ``log f(lower)`` when
                                                    ``lower == upper`` (an exact value)
    ``True``                ``True``                ``log(F(lower) + S(upper))`` (outside)
    ======================  ======================  =====================================

    The exact-value case follows R's ``Surv(lower, upper, type="interval2")`` (NumPyro
    scores ``lower == upper`` by the cdf instead). An unflagged row may have infinite
    ends: ``(-inf, upper)`` scores ``log F(upper)`` and ``(lower, inf)`` ``log S(lower)``.
    The end that a one-sided row (exactly one flag set) does not use may be anything
    (``inf``, ``nan``), also with validation on; a ``nan`` in an end that a row uses fails
    validation (and scores ``nan`` without it). Samples are exact values ``(x, x)``, ``x``
    a draw of ``base``.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = IntervalCensoredDistribution(
        ...     dist.Normal(0.0, 1.0), torch.tensor([False, False]), torch.tensor([False, True])
        ... )
        >>> d.log_prob(torch.tensor([[-1.0, 1.0], [0.0, float("inf")]]))  # 0.6827, 0.5
        tensor([-0.3817, -0.6931])
    """

    arg_constraints = {
        "left_censored": constraints.boolean,
        "right_censored": constraints.boolean,
    }

    def __init__(
        self,
        base=None,
        left_censored=False,
        right_censored=False,
        validate_args=None,
        base_dist=None,
    ):
        base = _tails.one_base(type(self).__name__, base, base_dist)
        _tails.check_univariate_base(base, type(self).__name__)
        left = torch.as_tensor(left_censored)
        right = torch.as_tensor(right_censored)
        for name, flag in (("left_censored", left), ("right_censored", right)):
            if flag.dtype != torch.bool and validate_args is not False:
                if not bool(((flag == 0) | (flag == 1)).all()):
                    raise ValueError(
                        f"{type(self).__name__}: parameter {name} must be boolean (0 or 1), "
                        f"got {flag}"
                    )
        batch_shape = torch.broadcast_shapes(base.batch_shape, left.shape, right.shape)
        self.base_dist = base.expand(batch_shape)
        self.left_censored = (left != 0).expand(batch_shape)
        self.right_censored = (right != 0).expand(batch_shape)
        super().__init__(batch_shape, torch.Size([2]), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=1)
    def support(self):
        return _IntervalSupport(self.left_censored, self.right_censored)

    def expand(self, batch_shape, _instance=None):
        return _copy(self, batch_shape, ["left_censored", "right_censored"])

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        base = self.base_dist
        lower, upper = value[..., 0], value[..., 1]
        left, right = self.left_censored, self.right_censored
        exact = lower == upper
        # Each term gets finite, ordered inputs (stand-ins 0 and 1 where an end is not
        # finite, only so that the branch not taken has finite gradients); torch.where
        # picks the one that applies, and infinite ends get their exact limits.
        finite = torch.isfinite(lower) & torch.isfinite(upper)
        lo = torch.where(finite, torch.minimum(lower, upper), torch.zeros_like(lower))
        hi = torch.where(finite & ~exact, torch.maximum(lower, upper), lo + 1.0)
        interval = _tails.log_prob_between(base, lo, hi)
        density = torch.where(finite, base.log_prob(lo), -math.inf)
        # one infinite end: log F(upper) or log S(lower) (0 for (-inf, inf))
        lo_all, hi_all = torch.minimum(lower, upper), torch.maximum(lower, upper)
        one_sided = torch.where(lo_all == -math.inf, _log_cdf(base, hi_all), -math.inf)
        one_sided = torch.where(hi_all == math.inf, _log_survival(base, lo_all), one_sided)
        one_sided = torch.where((lo_all == -math.inf) & (hi_all == math.inf), 0.0, one_sided)
        between = torch.where(finite, interval, one_sided)
        outside = torch.logaddexp(_log_cdf(base, lo_all), _log_survival(base, hi_all))
        result = torch.where(exact, density, between)
        result = torch.where(left & right, outside, result)
        result = torch.where(left & ~right, _log_cdf(base, upper), result)
        result = torch.where(right & ~left, _log_survival(base, lower), result)
        unused_lower, unused_upper = left & ~right, right & ~left
        used_nan = (torch.isnan(lower) & ~unused_lower) | (torch.isnan(upper) & ~unused_upper)
        return torch.where(used_nan, math.nan, result)

    def sample(self, sample_shape=()):
        x = self.base_dist.sample(sample_shape)
        return torch.stack([x, x], dim=-1)


class Censored(TorchDistribution):
    """``base`` clipped to ``[low, high]``: PyMC's ``Censored``, the Tobit likelihood.

    A draw is ``clamp(x, low, high)`` with ``x ~ base``. ``log_prob(value)`` is
    ``log F(low)`` where ``value <= low``, ``log S(high)`` where ``value >= high`` and
    ``base.log_prob(value)`` in between: a density with respect to Lebesgue measure plus
    point masses at the bounds. ``None`` leaves a side uncensored.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = Censored(dist.Normal(0.0, 1.0), low=0.0)
        >>> d.log_prob(torch.tensor([0.0, 1.0]))  # log P(X <= 0) = log 1/2, then the density
        tensor([-0.6931, -1.4189])
        >>> bool((d.sample((100,)) >= 0).all())
        True
    """

    def __init__(self, base=None, low=None, high=None, validate_args=None, base_dist=None):
        base = _tails.one_base(type(self).__name__, base, base_dist)
        name = type(self).__name__
        if low is None and high is None:
            raise ValueError(f"{name} needs at least one of low and high")
        _tails.check_univariate_base(base, name)
        dtype, device = _tails.dtype_device(base)
        low = None if low is None else torch.as_tensor(low, dtype=dtype, device=device)
        high = None if high is None else torch.as_tensor(high, dtype=dtype, device=device)
        shapes = [base.batch_shape] + [b.shape for b in (low, high) if b is not None]
        batch_shape = torch.broadcast_shapes(*shapes)
        self.base_dist = base.expand(batch_shape)
        self.low = None if low is None else low.expand(batch_shape)
        self.high = None if high is None else high.expand(batch_shape)
        super().__init__(batch_shape, validate_args=validate_args)
        if self._validate_args and low is not None and high is not None:
            if not bool((self.low < self.high).all()):
                raise ValueError(f"{name}: expected low < high, got low={low} and high={high}")

    @property
    def arg_constraints(self):
        return {n: constraints.real for n in ("low", "high") if getattr(self, n, None) is not None}

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        # closed: the bounds carry mass
        if self.high is None:
            return constraints.greater_than_eq(self.low)
        if self.low is None:
            return less_than_eq(self.high)
        return constraints.interval(self.low, self.high)

    def expand(self, batch_shape, _instance=None):
        return _copy(self, batch_shape, ["low", "high"])

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        base = self.base_dist
        result = base.log_prob(value)
        if self.low is not None:
            result = torch.where(value <= self.low, _tails.log_cdf(base, self.low), result)
        if self.high is not None:
            result = torch.where(value >= self.high, _tails.log_survival(base, self.high), result)
        return result

    def sample(self, sample_shape=()):
        with torch.no_grad():
            return self._clip(self.base_dist.sample(sample_shape))

    def _clip(self, x):
        if self.low is not None:
            x = torch.maximum(x, self.low)
        if self.high is not None:
            x = torch.minimum(x, self.high)
        return x
