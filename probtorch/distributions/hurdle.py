"""Hurdle count models: a gate for zero, a zero-truncated count family for the rest.

``P(0) = gate`` and ``P(k) = (1 - gate) p(k) / (1 - p(0))`` for ``k > 0``, with ``p`` the
base pmf. Unlike a zero-inflated model (Pyro's ``ZeroInflatedPoisson``, re-exported here),
every zero comes from the gate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pyro.distributions import NegativeBinomial, Poisson
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints

from ._tails import base_of, dtype_device, log1mexp, one_base

__all__ = ["HurdleDistribution", "HurdlePoisson", "HurdleNegativeBinomial"]

_MAX_REJECTION_ROUNDS = 10_000


# log((1 - e^-r) / r) = -r/2 + sum_n B_2n r^2n / (2n (2n)!), Bernoulli numbers B_2n
# (radius 2 pi): the coefficients of r^2 .. r^14
_LOG_H_SERIES = (
    1.0 / 24,
    -1.0 / 2880,
    1.0 / 181440,
    -1.0 / 9676800,
    2.08767569878681e-09,
    -4.403491782239578e-11,
    9.55895466477477e-13,
)
# Below it the series (its first left-out term, r^16 / 4.7e13, is below eps of its value
# and derivative there); above it the closed form, whose value and autograd derivative
# lose about eps / r to cancellation (so not at the smallest rates).
_LOG_H_SWITCH = {torch.float64: 0.5, torch.float32: 1.0}


def _log_h(rate: torch.Tensor) -> torch.Tensor:
    """``log((1 - e^-r) / r)``, 0 at ``r = 0``, accurate (value and gradient) to a few
    eps at every rate: the closed form's autograd gradient cancels at small rates
    (-1.0 instead of -0.5 at 1e-8 in float32, the wrong sign at 1e-16 in float64)."""
    switch = _LOG_H_SWITCH.get(rate.dtype, 1.0)
    small = rate < switch
    r = torch.where(small, rate, torch.zeros_like(rate))  # each branch on a finite input
    r2 = r * r
    poly = torch.zeros_like(r)
    for coef in reversed(_LOG_H_SERIES):
        poly = (poly + coef) * r2
    series = poly - 0.5 * r
    big = torch.where(small, torch.full_like(rate, switch), rate)
    closed = torch.log(-torch.expm1(-big) / big)
    return torch.where(small, series, closed)


def _zero_truncated_poisson(rate: torch.Tensor) -> torch.Tensor:
    """One draw of ``Poisson(rate)`` given ``> 0``, without rejection.

    In a Poisson process of intensity ``rate`` on ``[0, 1]`` with at least one event, the
    first event time ``t`` is an ``Exponential(rate)`` truncated to ``[0, 1]`` (sampled by
    its inverse cdf), and the events after it are ``Poisson(rate (1 - t))``.
    """
    u = torch.rand_like(rate)
    t = -torch.log1p(u * torch.expm1(-rate)) / rate
    return 1.0 + torch.poisson((rate * (1.0 - t)).clamp(min=0.0))


class HurdleDistribution(TorchDistribution):
    """A univariate count distribution with its zeros replaced by a gate.

    Args:
        base: a count distribution (``Poisson``, ``NegativeBinomial``, ``Binomial``,
            ``Geometric``...) whose ``log_prob(0) < 0`` (also by NumPyro's name,
            ``base_dist=``).
        gate: probability of a zero (``P(0) = gate``).
        gate_logits: the same as logits (give exactly one of the two).

    Sampling draws the base conditioned on ``> 0`` by rejection (redrawing only the
    zeros, expected ``1 / (1 - p(0))`` rounds); :class:`HurdlePoisson` samples exactly
    without rejection. Mean and variance follow from the base's.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = HurdleDistribution(dist.Geometric(probs=0.5), gate=0.3)
        >>> d.log_prob(torch.tensor([0.0, 1.0])).exp()  # 0.3, then 0.7 * 0.25 / 0.5
        tensor([0.3000, 0.3500])
    """

    _param_constraints: dict = {}  # constraints of base parameters a subclass exposes

    def __init__(
        self, base=None, gate=None, *, gate_logits=None, validate_args=None, base_dist=None
    ):
        base = one_base(type(self).__name__, base, base_dist)
        if (gate is None) == (gate_logits is None):
            raise ValueError(f"{type(self).__name__}: give exactly one of gate and gate_logits")
        if base.event_shape != () or not base.support.is_discrete:
            raise ValueError(
                f"{type(self).__name__} needs a univariate count distribution, got "
                f"{type(base).__name__}"
            )
        name = "gate" if gate is not None else "gate_logits"
        value = gate if gate is not None else gate_logits
        dtype, device = dtype_device(base)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            param = value
        else:  # a number or an integer tensor takes the base's dtype (as broadcast_all)
            param = torch.as_tensor(value, dtype=dtype, device=device)
        batch_shape = torch.broadcast_shapes(base.batch_shape, param.shape)
        self.base_dist = base.expand(batch_shape)
        setattr(self, name, param.expand(batch_shape))
        super().__init__(batch_shape, validate_args=validate_args)

    @property
    def arg_constraints(self):  # the base's exposed parameters and the gate that was given
        if "gate" in self.__dict__:
            return {**self._param_constraints, "gate": constraints.unit_interval}
        return {**self._param_constraints, "gate_logits": constraints.real}

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return self.base_dist.support

    def _log_gates(self):
        """``(log gate, log(1 - gate))``."""
        if "gate" in self.__dict__:
            return torch.log(self.gate), torch.log1p(-self.gate)
        return -F.softplus(-self.gate_logits), -F.softplus(self.gate_logits)

    @property
    def probs_zero(self) -> torch.Tensor:
        """``P(0)``, the gate."""
        if "gate" in self.__dict__:
            return self.gate
        return torch.sigmoid(self.gate_logits)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        log_gate, log_open = self._log_gates()
        positive = log_open + self._log_prob_positive(value)
        return torch.where(value == 0, log_gate.expand_as(positive), positive)

    def _log_prob_positive(self, value):
        """``log p(value | value > 0)`` of the base, for ``value > 0``."""
        base_log_p0 = self.base_dist.log_prob(torch.zeros_like(value))
        return self.base_dist.log_prob(value) - log1mexp(base_log_p0)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.base_dist = self.base_dist.expand(batch_shape)
        for name in ("gate", "gate_logits"):
            if name in self.__dict__:
                setattr(new, name, self.__dict__[name].expand(batch_shape))
        TorchDistribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _sample_positive(self, shape):
        base = self.base_dist.expand(shape)
        x = base.sample()
        for _ in range(_MAX_REJECTION_ROUNDS):
            zero = x == 0
            if not bool(zero.any()):
                return x
            x = torch.where(zero, base.sample(), x)
        raise RuntimeError(
            f"{type(self).__name__}: rejection sampling of the zero-truncated "
            f"{type(self.base_dist).__name__} did not finish in {_MAX_REJECTION_ROUNDS} rounds "
            f"(P(0) of the base is too close to 1)"
        )

    def sample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            positive = self._sample_positive(shape)
            u = torch.rand(shape, dtype=positive.dtype, device=positive.device)
            zero = u < self.probs_zero.expand(shape)
            return torch.where(zero, torch.zeros_like(positive), positive)

    def _positive_moments(self):
        """``(E[K], E[K^2])`` of the zero-truncated base."""
        base = self.base_dist
        mean = base.mean
        log_p0 = base.log_prob(torch.zeros_like(mean))
        # 1 - p0 = -expm1(log p0): exact when p0 is near 1 (a Poisson rate of 1e-8)
        positive = -torch.expm1(log_p0)
        m1 = mean / positive
        m2 = (base.variance + mean**2) / positive
        return m1, m2

    @property
    def mean(self):
        m1, _ = self._positive_moments()
        return (1.0 - self.probs_zero) * m1

    @property
    def variance(self):
        _, m2 = self._positive_moments()
        return (1.0 - self.probs_zero) * m2 - self.mean**2


def _gate_by_keyword(name: str, signature: str, extra: tuple) -> None:
    """The gate is keyword-only (as in Pyro's ``ZeroInflatedPoisson``): NumPyro's hurdle
    families take it first, so a positional gate could be silently read as a rate."""
    if extra:
        raise TypeError(
            f"{name}({signature}) takes the gate by keyword: {name}(..., gate=...) or "
            f"gate_logits=...; got {len(extra)} more positional argument(s). (NumPyro's "
            f"{name} takes the gate first; probtorch follows Pyro's ZeroInflatedPoisson "
            f"order.)"
        )


class HurdlePoisson(HurdleDistribution):
    """Hurdle Poisson: ``P(0) = gate``, positive counts from a zero-truncated ``Poisson(rate)``.

    Sampling is exact and rejection-free (a Poisson process given at least one event).

    Example::

        >>> d = HurdlePoisson(torch.tensor(2.0), gate=torch.tensor(0.4))
        >>> round(float(d.mean), 4)  # 0.6 * 2 / (1 - exp(-2))
        1.3878
    """

    def __init__(self, rate, *extra, gate=None, gate_logits=None, validate_args=None):
        _gate_by_keyword(type(self).__name__, "rate", extra)
        base = base_of(type(self).__name__, Poisson, rate, validate_args=validate_args)
        super().__init__(base, gate, gate_logits=gate_logits, validate_args=validate_args)

    _param_constraints = {"rate": constraints.positive}

    @property
    def rate(self):
        return self.base_dist.rate

    def _log_prob_positive(self, value):
        """``k log r - log k! - r - log(1 - e^-r)`` as ``(k - 1) log r - log k! - r -
        log((1 - e^-r) / r)``: the ``log r`` that both terms hold at a small rate cancels
        before rounding (in float32 the other form lost ``eps * |log r|`` to it).
        ``log((1 - e^-r) / r)`` takes its series at small rates (:func:`_log_h`); at rate 0
        the limits ``log(1 - gate)`` (k = 1) and ``-inf`` (k >= 2); each branch is computed
        on inputs where it is finite, so the gradients are finite (at value 0 too, where
        ``log_prob`` leaves this branch out)."""
        rate = self.rate
        k = value.clamp(min=1)  # (value 0 takes the gate: k = 1 keeps this branch finite)
        positive = rate > 0
        safe_rate = torch.where(positive, rate, torch.ones_like(rate))
        power = torch.xlogy(k - 1, safe_rate)  # (its gradient (k - 1) / r: 0 at k = 1)
        at_zero = torch.where(k == 1, torch.zeros_like(power), torch.full_like(power, -math.inf))
        power = torch.where(positive, power, at_zero)
        return power - torch.lgamma(k + 1) - rate - _log_h(rate)

    def _sample_positive(self, shape):
        return _zero_truncated_poisson(self.rate.expand(shape))


class HurdleNegativeBinomial(HurdleDistribution):
    """Hurdle negative binomial: ``P(0) = gate``, positive counts from a zero-truncated
    ``NegativeBinomial(total_count, probs | logits)`` (torch's parametrization).

    Example::

        >>> d = HurdleNegativeBinomial(3.0, probs=0.4, gate=0.2)
        >>> round(float(d.log_prob(torch.tensor(0.0)).exp()), 4)
        0.2
    """

    def __init__(
        self,
        total_count,
        probs=None,
        logits=None,
        *extra,
        gate=None,
        gate_logits=None,
        validate_args=None,
    ):
        _gate_by_keyword(type(self).__name__, "total_count, probs, logits", extra)
        base = base_of(
            type(self).__name__,
            NegativeBinomial,
            total_count,
            probs=probs,
            logits=logits,
            validate_args=validate_args,
        )
        super().__init__(base, gate, gate_logits=gate_logits, validate_args=validate_args)

    _param_constraints = {"total_count": constraints.greater_than_eq(0)}

    @property
    def total_count(self):
        return self.base_dist.total_count
