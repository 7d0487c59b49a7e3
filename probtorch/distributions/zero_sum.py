"""The zero-sum normal (PyMC's and NumPyro's ``ZeroSumNormal``), its constraint and bijection.

``ZeroSumNormal(scale, event_shape)`` is ``Normal(0, scale)`` conditioned on summing to
zero along every event axis, e.g. the effects of a categorical predictor under a
sum-to-zero identification. With one event axis of size ``n`` it is the (degenerate)
``MultivariateNormal(0, scale**2 (I - 1 1^T / n))``.

Density: with respect to Lebesgue measure on the zero-sum subspace (dimension
``D = prod(n_i - 1)``), ``log p(x) = -|x|^2 / (2 scale^2) - D/2 log(2 pi scale^2)``: the
standard normal density of ``x``'s coordinates in any orthonormal basis of the subspace.
This is NumPyro's normalization (its transform is an isometry) and PyMC's.

The bijection from ``R^{n-1}`` onto the subspace is the Householder reflection that maps
the last unit vector to ``-1/sqrt(n)``: orthonormal, so ``log |det J| = 0``.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch.distributions import constraints
from torch.distributions.transforms import Transform

__all__ = ["ZeroSumNormal", "ZeroSumConstraint", "ZeroSumTransform", "zero_sum"]


class ZeroSumConstraint(constraints.Constraint):
    """Tensors whose last ``event_dim`` axes each sum to zero (to rounding)."""

    is_discrete = False

    def __init__(self, event_dim: int = 1):
        if event_dim < 1:
            raise ValueError(f"zero_sum needs event_dim >= 1, got {event_dim}")
        self.event_dim = event_dim
        super().__init__()

    def check(self, value):
        ok = torch.ones(value.shape[: value.dim() - self.event_dim], dtype=torch.bool)
        ok = ok.to(value.device)
        dims = tuple(range(-self.event_dim, 0))
        scale = value.abs().sum(dims) + 1.0
        tol = 100.0 * torch.finfo(value.dtype).eps * scale
        for axis in dims:
            total = value.sum(axis, keepdim=True).abs()
            rest = tuple([d for d in dims if d != axis])
            worst = total.amax(rest) if rest else total
            ok = ok & (worst.reshape(ok.shape) <= tol)
        return ok

    def __eq__(self, other):
        return isinstance(other, ZeroSumConstraint) and other.event_dim == self.event_dim

    def __hash__(self):
        return hash((ZeroSumConstraint, self.event_dim))

    def __repr__(self):
        return f"ZeroSum(event_dim={self.event_dim})"


zero_sum = ZeroSumConstraint


class ZeroSumTransform(Transform):
    """Orthonormal bijection from ``R^{n_1-1} x ... x R^{n_k-1}`` onto the zero-sum tensors.

    Along each of the last ``event_dim`` axes, ``y`` (size ``n - 1``) maps to
    ``x = H [y, 0]`` with ``H`` the Householder reflection taking the last unit vector to
    ``-1/sqrt(n)``: ``x_i = y_i - s / (n + sqrt(n))`` for ``i < n`` and
    ``x_n = -s / sqrt(n)``, ``s = sum(y)``. An isometry, so ``log |det J| = 0``.

    Example::

        >>> t = ZeroSumTransform(1)
        >>> x = t(torch.tensor([1.0, 2.0, 3.0]))
        >>> bool(x.sum().abs() < 1e-6), bool(torch.allclose(t.inv(x), torch.tensor([1., 2., 3.])))
        (True, True)
    """

    bijective = True

    def __init__(self, event_dim: int = 1, cache_size: int = 0):
        self._event_dim = event_dim
        super().__init__(cache_size=cache_size)

    @property
    def domain(self):
        return constraints.independent(constraints.real, self._event_dim)

    @property
    def codomain(self):
        return ZeroSumConstraint(self._event_dim)

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return ZeroSumTransform(self._event_dim, cache_size=cache_size)

    def __eq__(self, other):
        return isinstance(other, ZeroSumTransform) and other._event_dim == self._event_dim

    def _call(self, y):
        for axis in range(-self._event_dim, 0):
            n = y.shape[axis] + 1
            total = y.sum(axis, keepdim=True)
            norm = total / (n + math.sqrt(n))
            last = -total / math.sqrt(n)
            y = torch.cat([y - norm, last], dim=axis)
        return y

    def _inverse(self, x):
        for axis in range(-self._event_dim, 0):
            n = x.shape[axis]
            last = x.narrow(axis, n - 1, 1)
            x = x.narrow(axis, 0, n - 1) - last / (math.sqrt(n) + 1.0)
        return x

    def log_abs_det_jacobian(self, y, x):
        return y.new_zeros(y.shape[: y.dim() - self._event_dim])

    def forward_shape(self, shape):
        return _resize(shape, self._event_dim, +1)

    def inverse_shape(self, shape):
        return _resize(shape, self._event_dim, -1)


def _resize(shape, event_dim, delta):
    shape = list(shape)
    if len(shape) < event_dim:
        raise ValueError(f"expected at least {event_dim} dims, got shape {tuple(shape)}")
    for i in range(len(shape) - event_dim, len(shape)):
        shape[i] += delta
    return torch.Size(shape)


class ZeroSumNormal(TorchDistribution):
    """Normal with zero sum along every event axis, as in PyMC and NumPyro.

    Args:
        scale: standard deviation of the normal before the zero-sum constraint (its shape is
            the batch shape).
        event_shape: shape of one draw; every axis (each of size >= 2) sums to zero.

    The covariance of one axis of size ``n`` is ``scale**2 (I - 1 1^T / n)``; ``log_prob``
    is the density on the zero-sum subspace (see the module docstring). Draws are normal
    draws minus their mean along each axis. ``biject_to(support)`` is
    :class:`ZeroSumTransform`, so it works as a latent site under NUTS.

    Example::

        >>> d = ZeroSumNormal(1.0, (3,))
        >>> x = d.sample((2,))
        >>> x.shape, bool(x.sum(-1).abs().max() < 1e-5)
        (torch.Size([2, 3]), True)
        >>> float(d.log_prob(torch.zeros(3)))  # -(3 - 1)/2 log(2 pi)  # doctest: +ELLIPSIS
        -1.837877...
    """

    arg_constraints = {"scale": constraints.positive}
    has_rsample = True

    def __init__(self, scale, event_shape, validate_args=None):
        if isinstance(event_shape, int):
            event_shape = (event_shape,)
        event_shape = torch.Size(event_shape)
        if len(event_shape) == 0 or min(event_shape) < 2:
            raise ValueError(
                f"ZeroSumNormal: every axis of event_shape needs size >= 2, got "
                f"{tuple(event_shape)}"
            )
        self.scale = torch.as_tensor(scale, dtype=_float_dtype(scale))
        super().__init__(self.scale.shape, event_shape, validate_args=validate_args)

    @constraints.dependent_property(is_discrete=False, event_dim=1)
    def support(self):
        return ZeroSumConstraint(len(self.event_shape))

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = self._get_checked_instance(ZeroSumNormal, _instance)
        new.scale = self.scale.expand(batch_shape)
        TorchDistribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def _dof(self) -> int:
        dof = 1
        for n in self.event_shape:  # a loop, not a generator: Dynamo cannot trace those
            dof *= n - 1
        return dof

    def _scale_event(self):
        return self.scale.reshape(self.scale.shape + (1,) * len(self.event_shape))

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.scale.dtype, device=self.scale.device)
        x = self._scale_event() * eps
        for axis in range(-len(self.event_shape), 0):
            x = x - x.mean(axis, keepdim=True)
        return x

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        dims = tuple(range(-len(self.event_shape), 0))
        squared = (value / self._scale_event()).pow(2).sum(dims)
        dof = self._dof
        return -0.5 * squared - dof * (0.5 * math.log(2 * math.pi) + torch.log(self.scale))

    @property
    def mean(self):
        return self.scale.new_zeros(self.batch_shape + self.event_shape)

    @property
    def variance(self):
        factor = 1.0
        for n in self.event_shape:
            factor *= 1.0 - 1.0 / n
        return (factor * self._scale_event() ** 2).expand(self.batch_shape + self.event_shape)


def _float_dtype(x):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.dtype
    return torch.get_default_dtype()
