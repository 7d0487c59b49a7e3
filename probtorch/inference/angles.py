"""Angles for HMC and NUTS: each angle of a von Mises site (or of Pyro's torus
distributions) sampled as the direction of a point of the plane.

A von Mises density is periodic. Sampled on the real line (torch's and Pyro's support is
``real``), a chain drifts across periods: the mass matrix learns the drift as variance,
trajectories find no U-turn, and the draws are unbounded (a ``VonMises(2.8, 2)`` site ran
to 557 with most transitions at ``max_tree_depth``). Mapped onto an interval (NumPyro's
``circular`` support goes through a sigmoid), a posterior near ``±pi`` is cut in two.

As Stan's ``unit_vector``, each angle here is the direction of an unconstrained point
``y`` of the plane, ``theta = atan2(y1, y0)`` (a site on the sphere: ``y / |y|``), with
``-|y|^2 / 2`` added to the log density in place of a Jacobian. The added term is an
isotropic Gaussian, whose direction is uniform and independent of its radius, so the
angle has exactly the site's density; the sampler moves on a proper, smooth density and
the draws are angles in ``(-pi, pi]``. The term carries the radius's normalizer (none in
the plane; ``log(2^(d/2-1) Gamma(d/2))`` in ``d`` dimensions), so that the point's density
integrates to one and autoguides fitted to it keep the ELBO a bound on the log evidence.

As with Stan's ``unit_vector``, the angle's gradient grows as ``1 / |y|`` near the
origin, where a trajectory now and then diverges: a von Mises posterior of concentration
4.7 gave 1-4 divergences per 4 x 1000 draws at ``target_accept_prob=0.8`` and 0-1 at 0.95
(eight seeds). A ring around the unit circle for the radius (``-(|y| - 1)^2 / (2 * 0.25^2)``)
had none, but its draws' sd of ``cos(theta)`` was 6 % low on average over eight seeds
(slow to reach the tails), so the Gaussian stays.
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import SineBivariateVonMises, SineSkewed, constraints
from torch.distributions import Distribution
from torch.distributions.transforms import Transform

from ..distributions.constraint_registry import biject_to
from ..validation import innermost

__all__ = ["AngleFromPlane", "UnitVectorFromSpace", "unconstraining_transform"]


class UnitVectorFromSpace(Transform):
    """``y`` of shape ``(..., d)`` to the unit vector ``y / |y|`` (Stan's ``unit_vector``),
    for sites on the sphere (Pyro's ``ProjectedNormal``).

    Not a bijection: ``log_abs_det_jacobian`` is the Gaussian term ``-|y|^2 / 2`` that
    makes the direction's density the site's, with respect to the sphere's surface measure
    (see the module docstring); ``inv`` is the identity on the sphere.

    Example::

        >>> t = UnitVectorFromSpace()
        >>> y = torch.tensor([0.0, 3.0, 4.0])
        >>> t(y), t.log_abs_det_jacobian(y, t(y))  # -|y|^2/2 - log(sqrt(pi/2))
        (tensor([0.0000, 0.6000, 0.8000]), tensor(-12.7258))
    """

    domain = constraints.independent(constraints.real, 1)
    codomain = constraints.sphere
    bijective = False

    def __eq__(self, other):
        return type(other) is type(self)

    def _call(self, y):
        return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)

    def _inverse(self, u):
        return u

    def log_abs_det_jacobian(self, y, value):
        # the radius's density: -|y|^2/2 - log Z_d, Z_d = ∫ exp(-r^2/2) r^(d-1) dr over r > 0
        # (1 in the plane), so that the point's density integrates to the site's: the
        # bound of an ELBO holds (samplers ignore the constant)
        d = y.shape[-1]
        log_z = (0.5 * d - 1.0) * math.log(2.0) + math.lgamma(0.5 * d)
        return -0.5 * (y * y).sum(-1) - log_z


class AngleFromPlane(UnitVectorFromSpace):
    """``y`` of shape ``(..., 2)`` to the angle ``atan2(y[..., 1], y[..., 0])``: the
    direction of a point of the plane as an angle, with the same Gaussian term as
    :class:`UnitVectorFromSpace`; ``inv`` gives the point on the unit circle.

    Example::

        >>> t = AngleFromPlane()
        >>> y = torch.tensor([[0.0, 2.0], [-1.0, 0.0]])
        >>> t(y)
        tensor([1.5708, 3.1416])
        >>> t.log_abs_det_jacobian(y, t(y))
        tensor([-2.0000, -0.5000])
        >>> t.inv(torch.tensor(0.0))
        tensor([1., 0.])
    """

    codomain = constraints.real

    def _call(self, y):
        return torch.atan2(y[..., 1], y[..., 0])

    def _inverse(self, theta):
        return torch.stack([torch.cos(theta), torch.sin(theta)], dim=-1)

    def forward_shape(self, shape):
        if len(shape) < 1 or shape[-1] != 2:
            raise ValueError(f"AngleFromPlane takes points of shape (..., 2), not {tuple(shape)}")
        return shape[:-1]

    def inverse_shape(self, shape):
        return torch.Size(shape) + (2,)


def _on_sphere(support: constraints.Constraint) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return isinstance(support, type(constraints.sphere))


def _is_angular(fn: Distribution) -> bool:
    """A distribution of angles (von Mises; Pyro's sine bivariate von Mises and sine-skewed
    torus distributions), possibly reshaped."""
    return isinstance(
        innermost(fn), (torch.distributions.VonMises, SineBivariateVonMises, SineSkewed)
    )


def unconstraining_transform(fn: Distribution) -> Transform:
    """The map from a latent site's unconstrained values to its values, for HMC and NUTS:
    :class:`AngleFromPlane` for a site of angles (von Mises, ``SineBivariateVonMises``,
    ``SineSkewed``), :class:`UnitVectorFromSpace` for a site on the sphere
    (``ProjectedNormal``), ``biject_to(fn.support)`` otherwise.

    Example::

        >>> import probtorch.distributions as dist
        >>> unconstraining_transform(dist.VonMises(0.0, 1.0).expand([3]).to_event(1))
        AngleFromPlane()
        >>> unconstraining_transform(dist.HalfNormal(1.0))(torch.tensor(0.0))
        tensor(1.)
    """
    if _is_angular(fn):
        return AngleFromPlane()
    if _on_sphere(fn.support):
        return UnitVectorFromSpace()
    return biject_to(fn.support)
