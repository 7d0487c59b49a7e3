"""Fit a prior to the shape of the parameter it replaces (shared by both Bayesian-module APIs)."""

from __future__ import annotations

import pyro.distributions as pyro_dist
import torch

__all__ = ["fit_prior"]


def fit_prior(prior, shape: torch.Size, site: str):
    """``prior`` as a distribution whose ``event_shape`` is ``shape``, the parameter's shape.

    A prior whose ``batch_shape + event_shape`` already equals ``shape`` has its batch
    dimensions moved into the event; a prior with an empty ``event_shape`` (a scalar
    ``Normal(0, 1)``, or one with fewer batch dimensions that broadcast) is expanded to
    ``shape`` first. A parameter's value is one draw of one site, so its whole shape is the
    event: its log density is one number.

    Example::

        >>> import probtorch.distributions as dist
        >>> d = fit_prior(dist.Normal(0.0, 1.0), torch.Size([3, 2]), "w")
        >>> d.batch_shape, d.event_shape
        (torch.Size([]), torch.Size([3, 2]))
    """
    shape = torch.Size(shape)
    full = prior.batch_shape + prior.event_shape
    if full != shape:
        if len(prior.event_shape) != 0:
            raise ValueError(
                f"site {site!r}: the prior {type(prior).__name__} has batch_shape "
                f"{tuple(prior.batch_shape)} and event_shape {tuple(prior.event_shape)}, but "
                f"the parameter has shape {tuple(shape)}; give a prior of that shape or a "
                f"scalar one (it is expanded)"
            )
        try:
            torch.broadcast_shapes(prior.batch_shape, shape)
        except RuntimeError:
            raise ValueError(
                f"site {site!r}: the prior's batch_shape {tuple(prior.batch_shape)} does not "
                f"broadcast to the parameter's shape {tuple(shape)}"
            ) from None
        prior = prior.expand(shape)
    extra = len(prior.batch_shape)
    if extra == 0:
        return prior
    if hasattr(prior, "to_event"):
        return prior.to_event(extra)
    return pyro_dist.Independent(prior, extra)
