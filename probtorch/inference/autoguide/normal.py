"""Guides with one set of params per latent site: ``AutoNormal`` (mean field) and ``AutoDelta``.

Params keep each site's shape, local latents inside plates included. Under a subsampled
plate the params have the plate's full size and each call uses the rows of the subsample
(as Pyro's ``AutoNormal`` does), so the guide and the model see the same indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints

from ...primitives import sample
from ..angles import AngleFromPlane
from .base import (
    AutoGuide,
    LatentSite,
    SiteDelta,
    SiteTransformed,
    as_quantiles,
    is_identity,
    rows_of_plates,
    run_in_plates,
)

__all__ = ["AutoNormal", "AutoDelta"]


class AutoNormal(AutoGuide):
    """Mean-field Normal guide in unconstrained space, one ``loc``/``scale`` per latent site.

    Each site ``x`` is drawn as ``biject_to(support)(Normal(loc, scale))`` (a
    ``TransformedDistribution``) with params ``f"{prefix}.loc.{x}"`` and
    ``f"{prefix}.scale.{x}"`` of the site's unconstrained shape.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model(y):
        ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        ...     sigma = pt.sample("sigma", dist.HalfNormal(1.0))
        ...     with pt.plate("n", len(y)):
        ...         pt.sample("y", dist.Normal(mu, sigma), obs=y)
        >>> guide = AutoNormal(model)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     draw = guide(torch.zeros(5))
        >>> sorted(store.keys())
        ['auto.loc.mu', 'auto.loc.sigma', 'auto.scale.mu', 'auto.scale.sigma']
        >>> params = dict(store.items())
        >>> bool(guide.median(params)["sigma"] > 0)
        True
        >>> guide.sample_posterior(100, params, seed=0)["mu"].shape
        torch.Size([100])
    """

    def _param_specs(self):
        specs = {}
        for name, site in self.latents.items():
            init = site.init_unconstrained
            specs[f"loc.{name}"] = (init, constraints.real)
            specs[f"scale.{name}"] = (torch.full_like(init, self.init_scale), constraints.positive)
        return specs

    def _site_distribution(self, site: LatentSite, loc: torch.Tensor, scale: torch.Tensor):
        base = pyro_dist.Normal(loc, scale).to_event(site.unconstrained_event_dim)
        transform = site.transform
        if is_identity(transform):
            return base
        # Cache the inverse so that log_prob of the value just drawn needs no inversion.
        return SiteTransformed(base, [transform.with_cache(1)], site.support)

    def __call__(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self._ensure_prototype(args, kwargs)
        values = self._create_params()
        plates = self._create_plates(args, kwargs)
        result = {}
        for name, site in self.latents.items():

            def draw(site=site, name=name):
                event_dim = site.unconstrained_event_dim
                loc = rows_of_plates(values[f"loc.{name}"], site, plates, event_dim)
                scale = rows_of_plates(values[f"scale.{name}"], site, plates, event_dim)
                return sample(name, self._site_distribution(site, loc, scale))

            result[name] = run_in_plates(site.frames, plates, draw)
        return result

    def _locs_scales(self, params):
        values = self._lookup_params(params)
        return {
            name: (values[f"loc.{name}"].detach(), values[f"scale.{name}"].detach())
            for name in self.latents
        }

    def median(self, params: dict | None = None) -> dict[str, torch.Tensor]:
        self._require_prototype("median")
        with torch.no_grad():
            return self._constrain({k: loc for k, (loc, _) in self._locs_scales(params).items()})

    def quantiles(
        self, qs: Sequence[float] | torch.Tensor, params: dict | None = None
    ) -> dict[str, torch.Tensor]:
        self._require_prototype("quantiles")
        result = {}
        with torch.no_grad():
            for name, (loc, scale) in self._locs_scales(params).items():
                q = as_quantiles(qs, loc.dtype)
                z = torch.distributions.Normal(0.0, 1.0).icdf(q).reshape((-1,) + (1,) * loc.dim())
                result[name] = self.latents[name].transform(loc + scale * z)
        return result

    def _sample_posterior(self, num_samples, params):
        draws = {}
        with torch.no_grad():
            for name, (loc, scale) in self._locs_scales(params).items():
                noise = torch.randn((num_samples,) + loc.shape, dtype=loc.dtype, device=loc.device)
                draws[name] = loc + scale * noise
            return self._constrain(draws)


class AutoDelta(AutoGuide):
    """Point-mass guide: SVI with it finds the MAP (in constrained space, no Jacobian).

    Each site ``x`` is a ``Delta`` at the param ``f"{prefix}.loc.{x}"``, constrained to the
    site's support.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("rate", dist.Gamma(3.0, 1.0))
        >>> guide = AutoDelta(model)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> list(store.keys())
        ['auto.loc.rate']
        >>> bool(guide.median(dict(store.items()))["rate"] > 0)
        True
    """

    def _check_prototype(self) -> None:
        for site in self.latents.values():
            if site.from_space and not isinstance(site.transform, AngleFromPlane):
                raise ValueError(
                    f"{type(self).__name__}: latent site {site.name!r} lies on the sphere "
                    f"(support {site.support}), which has no bijection to unconstrained "
                    f"space for a point estimate's parameter: use AutoNormal, or write a "
                    f"guide for it"
                )
        super()._check_prototype()

    def _param_specs(self):
        specs = {}
        for name, site in self.latents.items():
            with torch.no_grad():
                init = site.transform(site.init_unconstrained)
            specs[f"loc.{name}"] = (init, site.support)
        return specs

    def __call__(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self._ensure_prototype(args, kwargs)
        values = self._create_params()
        plates = self._create_plates(args, kwargs)
        result = {}
        for name, site in self.latents.items():

            def draw(site=site, name=name):
                value = rows_of_plates(values[f"loc.{name}"], site, plates, site.event_dim)
                return sample(name, SiteDelta(value, site.support, event_dim=site.event_dim))

            result[name] = run_in_plates(site.frames, plates, draw)
        return result

    def median(self, params: dict | None = None) -> dict[str, torch.Tensor]:
        self._require_prototype("median")
        values = self._lookup_params(params)
        return {name: values[f"loc.{name}"].detach() for name in self.latents}

    def quantiles(
        self, qs: Sequence[float] | torch.Tensor, params: dict | None = None
    ) -> dict[str, torch.Tensor]:
        """The point mass at every level ``q``."""
        self._require_prototype("quantiles")
        median = self.median(params)
        n = len(as_quantiles(qs, torch.get_default_dtype()))
        return {name: value.expand((n,) + value.shape).clone() for name, value in median.items()}

    def _sample_posterior(self, num_samples, params):
        median = self.median(params)
        return {
            name: value.expand((num_samples,) + value.shape).clone()
            for name, value in median.items()
        }
