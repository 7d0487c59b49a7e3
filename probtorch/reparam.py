"""Reparameterizers for the ``reparam`` handler: non-centering and transform unwrapping.

A reparameterizer is called as ``reparam(name, fn, obs) -> (new_fn, value)``: it may sample
auxiliary sites and return the value of the original site computed from them
(``new_fn is None`` then turns the original site into a deterministic one).
"""

from __future__ import annotations

import torch
from torch.distributions import Independent, TransformedDistribution, constraints

from ._errors import with_message
from .primitives import param, sample

__all__ = ["Reparam", "LocScaleReparam", "TransformReparam"]


class Reparam:
    """Base class of reparameterizers."""

    def __call__(self, name, fn, obs):
        raise NotImplementedError

    @staticmethod
    def _unwrap(fn):
        """Strip ``Independent``/expanded wrappers: (inner fn, its full batch shape, event_dim)."""
        shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
        event_dim = len(fn.event_shape)
        while isinstance(fn, Independent) or type(fn).__name__ == "ExpandedDistribution":
            fn = fn.base_dist
        expand_shape = shape[: len(shape) - len(fn.event_shape)]
        return fn, expand_shape, event_dim

    @staticmethod
    def _wrap(fn, expand_shape, event_dim):
        batch_shape = expand_shape[: len(expand_shape) - len(fn.event_shape)]
        fn = fn.expand(torch.Size(batch_shape))
        if len(fn.event_shape) < event_dim:
            fn = Independent(fn, event_dim - len(fn.event_shape))
        return fn

    @staticmethod
    def _require_latent(name, obs, what):
        if obs is not None:
            raise ValueError(f"{what} cannot reparameterize the observed site {name!r}")


class LocScaleReparam(Reparam):
    """Decenter a location-scale family (Normal, StudentT, Cauchy, Laplace, ...).

    With ``centered=0`` the site ``x ~ F(loc, scale)`` becomes
    ``x_decentered ~ F(0, 1)`` and ``x = loc + scale * x_decentered`` (non-centered);
    ``centered=1`` leaves it alone; ``centered=None`` learns the degree of centering as the
    param ``f"{name}_centered"`` in [0, 1].

    Args:
        centered: degree of centering in [0, 1], or None to learn it.
        shape_params: names of the other parameters of the family, carried over to the
            decentered distribution; by default (None) every parameter other than ``loc``
            and ``scale`` (its ``arg_constraints``: ``df`` of StudentT), as in Pyro.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(3.0, 2.0))
        >>> m = pt.handlers.reparam(model, config={"x": LocScaleReparam(0.0)})
        >>> tr = pt.handlers.trace(pt.handlers.seed(m, 0)).get_trace()
        >>> float(tr["x_decentered"].fn.loc), float(tr["x_decentered"].fn.scale)
        (0.0, 1.0)
    """

    def __init__(self, centered: float | torch.Tensor | None = None, shape_params=None):
        if isinstance(centered, (int, float)) and not 0 <= centered <= 1:
            raise ValueError(f"LocScaleReparam: centered must lie in [0, 1], got {centered}")
        self.centered = centered
        if isinstance(shape_params, str):
            shape_params = (shape_params,)
        self.shape_params = None if shape_params is None else tuple(shape_params)

    def __call__(self, name, fn, obs):
        self._require_latent(name, obs, "LocScaleReparam")
        centered = self.centered
        if isinstance(centered, (int, float)) and centered == 1:
            return fn, None
        event_shape = tuple(fn.event_shape)
        fn, expand_shape, event_dim = self._unwrap(fn)
        if not (hasattr(fn, "loc") and hasattr(fn, "scale")):
            raise ValueError(
                f"LocScaleReparam: site {name!r} has distribution {type(fn).__name__}, "
                f"which is not a location-scale family (needs .loc and .scale)"
            )
        if centered is None:
            centered = param(
                f"{name}_centered",
                lambda: fn.loc.new_full(event_shape, 0.5),  # (its dtype and device)
                constraint=constraints.unit_interval,
            )
        shape_params = self.shape_params
        if shape_params is None:  # (worked out per site: one instance may serve several)
            shape_params = tuple(k for k in fn.arg_constraints if k not in ("loc", "scale"))
        try:
            params = {key: getattr(fn, key) for key in shape_params}
            params["loc"] = fn.loc * centered
            params["scale"] = fn.scale**centered
            decentered_fn = type(fn)(**params)
        except (TypeError, AttributeError, ValueError, RuntimeError) as error:
            message = (
                f"LocScaleReparam: site {name!r}: could not build the decentered "
                f"{type(fn).__name__} from loc, scale and shape_params={shape_params!r} "
                f"(name the family's other parameters in shape_params=): {error}"
            )
            raise with_message(error, message, ValueError) from error
        decentered_fn = self._wrap(decentered_fn, expand_shape, event_dim)
        decentered = sample(f"{name}_decentered", decentered_fn)
        value = fn.loc + fn.scale ** (1 - centered) * (decentered - centered * fn.loc)
        return None, value


class TransformReparam(Reparam):
    """Sample the base distribution of a ``TransformedDistribution`` and push it through.

    ``x ~ TransformedDistribution(base, transforms)`` becomes ``x_base ~ base`` and
    ``x = transforms(x_base)``.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.LogNormal(0.0, 1.0))
        >>> m = pt.handlers.reparam(model, config={"x": TransformReparam()})
        >>> tr = pt.handlers.trace(pt.handlers.seed(m, 0)).get_trace()
        >>> bool(torch.isclose(tr["x"].value, tr["x_base"].value.exp()))
        True
    """

    def __call__(self, name, fn, obs):
        self._require_latent(name, obs, "TransformReparam")
        fn, expand_shape, event_dim = self._unwrap(fn)
        if not isinstance(fn, TransformedDistribution):
            raise ValueError(
                f"TransformReparam: site {name!r} has distribution {type(fn).__name__}, "
                f"not a TransformedDistribution"
            )
        # ``expand_shape`` is the batch shape of ``fn``; the base's full shape is what the
        # transforms map back from the full shape of ``fn`` (batch + event).
        base_event_dim = event_dim
        base_expand = torch.Size(expand_shape + tuple(fn.event_shape))
        for t in reversed(fn.transforms):
            base_event_dim += t.domain.event_dim - t.codomain.event_dim
            base_expand = t.inverse_shape(base_expand)
        base_expand = tuple(base_expand)
        x = sample(f"{name}_base", self._wrap(fn.base_dist, base_expand, base_event_dim))
        for t in fn.transforms:
            x = t(x)
        return None, x
