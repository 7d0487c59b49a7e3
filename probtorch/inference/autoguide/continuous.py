"""Guides over one flat vector of all latent sites in unconstrained space.

``AutoContinuous`` lays the latent sites out end to end (as ``Potential`` does for MCMC)
and draws the vector ``z`` of dimension ``latent_dim`` from a joint distribution
(``get_posterior``) at the auxiliary site ``f"_{prefix}_latent"``. Each model site then gets
its slice of ``z`` mapped through ``biject_to(support)``, as a ``Delta`` whose log density
is the log |det| of that map, so that the guide's density is that of the transformed
vector. Subsampled plates are not supported here (use ``AutoNormal``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro.distributions as pyro_dist
import torch
from pyro.distributions.transforms import LowerCholeskyAffine
from torch.distributions import AffineTransform, ComposeTransform, Independent, constraints

from ...handlers import substitute, trace
from ...params import fitted_params
from ...primitives import sample
from ...validation import enable_validation, innermost, is_validation_enabled, torch_validation
from .base import (
    AutoGuide,
    SiteDelta,
    as_quantiles,
    is_identity,
    rows_of_plates,
    run_in_plates,
)

__all__ = [
    "AutoContinuous",
    "AutoDiagonalNormal",
    "AutoMultivariateNormal",
    "AutoLowRankMultivariateNormal",
    "AutoLaplaceApproximation",
]


def _sum_rightmost(value: torch.Tensor, dims: int) -> torch.Tensor:
    return value.reshape(value.shape[: value.dim() - dims] + (-1,)).sum(-1) if dims > 0 else value


class AutoContinuous(AutoGuide):
    """Base class of the guides over the flat unconstrained latent vector.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("a", dist.Normal(0.0, 1.0))
        ...     pt.sample("w", dist.Dirichlet(torch.ones(3)))
        >>> guide = AutoDiagonalNormal(model)
        >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> isinstance(guide, AutoContinuous), guide.latent_dim
        (True, 3)
        >>> {k: tuple(v.shape) for k, v in guide.unpack(torch.zeros(5, 3)).items()}
        {'a': (5,), 'w': (5, 2)}
    """

    def _refuse_subsample(self, site: str, name: str, subsample_size: int, size: int):
        raise ValueError(
            f"{type(self).__name__}: latent site {site!r} lies in plate {name!r}, which "
            f"subsamples {subsample_size} of {size} elements; guides over one joint latent "
            f"vector need the full plate. Use AutoNormal (which indexes full-size params by "
            f"the subsample) instead"
        )

    def _check_prototype(self) -> None:
        for site in self.latents.values():
            if site.subsampled_frames:
                frame = site.subsampled_frames[0]
                self._refuse_subsample(site.name, frame.name, frame.subsample_size, frame.size)
        self._offsets = {}
        offset = 0
        for name, site in self.latents.items():
            self._offsets[name] = offset
            offset += site.size
        self.latent_dim = offset
        self._init_loc = torch.cat(
            [site.init_unconstrained.reshape(-1) for site in self.latents.values()]
        )

    # -- layout --------------------------------------------------------------------
    def unpack(self, z: torch.Tensor, align: bool = False) -> dict[str, torch.Tensor]:
        """Split ``z`` of shape ``(..., latent_dim)`` into unconstrained values per site.

        Leading batch dims of ``z`` go to the left of each site's shape. With ``align`` (for
        ``z`` drawn inside outer plates, e.g. vectorized ELBO particles, batch shape
        ``(P, 1, ...)``) they are instead aligned from the right with the site's own plate
        dims where they broadcast, as in Pyro: ``(P, 1)`` and a site of shape ``(N,)`` give
        ``(P, N)``.
        """
        batch = z.shape[:-1]
        values = {}
        for name, site in self.latents.items():
            part = z[..., self._offsets[name] : self._offsets[name] + site.size]
            shape = batch + site.unconstrained_shape
            if align and batch:
                padded = batch + (1,) * site.unconstrained_event_dim
                try:
                    aligned = torch.broadcast_shapes(site.unconstrained_shape, padded)
                except RuntimeError:
                    aligned = None
                if aligned is not None and math.prod(aligned) == part.numel():
                    shape = aligned
            values[name] = part.reshape(shape)
        return values

    # -- the joint distribution -----------------------------------------------------
    def _posterior(self, values: dict[str, torch.Tensor]) -> torch.distributions.Distribution:
        raise NotImplementedError

    def get_posterior(self, params: dict | None = None) -> torch.distributions.Distribution:
        """The guide's joint distribution of the unconstrained latent vector."""
        self._require_prototype("get_posterior")
        return self._posterior(self._lookup_params(params))

    def __call__(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self._ensure_prototype(args, kwargs)
        posterior = self._posterior(self._create_params())
        z = sample(f"_{self.prefix}_latent", posterior, infer={"is_auxiliary": True})
        plates = self._create_plates(args, kwargs)
        result = {}
        for name, unconstrained in self.unpack(z, align=True).items():
            site = self.latents[name]
            transform = site.transform
            value = transform(unconstrained)
            if is_identity(transform):
                log_density = torch.zeros((), dtype=value.dtype, device=value.device)
            else:
                log_density = -transform.log_abs_det_jacobian(unconstrained, value)
                extra = log_density.dim() - (value.dim() - site.event_dim)
                log_density = _sum_rightmost(log_density, extra)
            for frame in site.frames:  # (create_plates may give a subsampled plate)
                given = plates[frame.name]
                if given.subsample_size != given.size:
                    self._refuse_subsample(name, frame.name, given.subsample_size, given.size)

            def draw(site=site, value=value, log_density=log_density):
                # all rows, in the order of indices the model was given (a permutation)
                rows = rows_of_plates(value, site, plates, site.event_dim)
                density = rows_of_plates(log_density, site, plates, 0)
                fn = SiteDelta(rows, site.support, log_density=density, event_dim=site.event_dim)
                return sample(site.name, fn)

            result[name] = run_in_plates(site.frames, plates, draw)
        return result

    # -- the guide as a map of standard normal noise (NeuTra) ---------------------------
    def get_base_dist(self) -> torch.distributions.Distribution:
        """The standard Normal of dimension ``latent_dim`` that :meth:`get_transform` maps
        to the guide's posterior of the latent vector.

        Example::

            >>> import probtorch as pt, probtorch.distributions as dist
            >>> guide = AutoDiagonalNormal(lambda: pt.sample("a", dist.Normal(0.0, 1.0)))
            >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
            ...     _ = guide()
            >>> guide.get_base_dist().event_shape
            torch.Size([1])
        """
        self._require_prototype("get_base_dist")
        zeros = self._init_loc.new_zeros(self.latent_dim)
        return pyro_dist.Normal(zeros, torch.ones_like(zeros)).to_event(1)

    def get_transform(self, params: dict | None = None) -> torch.distributions.Transform:
        """The map ``T`` with ``get_posterior(params)`` = ``T`` of ``get_base_dist()``.

        Its parameters are detached from the params (a fixed map: what
        :class:`~probtorch.reparam.NeuTraReparam` warps a model's geometry with).
        ``params`` as for :meth:`get_posterior` (None: the fitted ones).

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> guide = AutoMultivariateNormal(
            ...     lambda: pt.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1)),
            ...     init_scale=0.5)
            >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
            ...     _ = guide()
            ...     t = guide.get_transform()
            >>> t(torch.tensor([2.0, -2.0])) - t(torch.zeros(2))  # the Cholesky factor 0.5 I
            tensor([ 1., -1.])
        """
        self._require_prototype("get_transform")
        values = {k: v.detach().clone() for k, v in self._lookup_params(params).items()}
        return self._transform(values)

    def _transform(self, values: dict[str, torch.Tensor]) -> torch.distributions.Transform:
        posterior = self._posterior(values)
        if isinstance(posterior, torch.distributions.TransformedDistribution):
            return ComposeTransform(list(posterior.transforms), cache_size=0)
        if isinstance(
            posterior, (pyro_dist.MultivariateNormal, pyro_dist.LowRankMultivariateNormal)
        ):
            return LowerCholeskyAffine(posterior.loc, posterior.scale_tril)
        base = posterior.base_dist if isinstance(posterior, Independent) else None
        if isinstance(base, torch.distributions.Normal):
            return AffineTransform(base.loc, base.scale, event_dim=1)
        raise NotImplementedError(
            f"{type(self).__name__} has no map from standard normal noise to its posterior "
            f"({type(posterior).__name__})"
        )

    # -- summaries -----------------------------------------------------------------
    def _loc_scale(self, values: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginal location and scale of each coordinate of the latent vector."""
        raise NotImplementedError

    def median(self, params: dict | None = None) -> dict[str, torch.Tensor]:
        self._require_prototype("median")
        with torch.no_grad():
            loc, _ = self._loc_scale(self._lookup_params(params))
            return self._constrain(self.unpack(loc))

    def quantiles(
        self, qs: Sequence[float] | torch.Tensor, params: dict | None = None
    ) -> dict[str, torch.Tensor]:
        self._require_prototype("quantiles")
        with torch.no_grad():
            loc, scale = self._loc_scale(self._lookup_params(params))
            q = as_quantiles(qs, loc.dtype)
            z = torch.distributions.Normal(0.0, 1.0).icdf(q)[:, None]
            return self._constrain(self.unpack(loc + scale * z))

    def _sample_posterior(self, num_samples, params):
        with torch.no_grad():
            z = self.get_posterior(params).sample((num_samples,))
            return self._constrain(self.unpack(z))


class AutoDiagonalNormal(AutoContinuous):
    """Normal with a diagonal covariance over the unconstrained latent vector.

    Params ``f"{prefix}.loc"`` and ``f"{prefix}.scale"``, both of shape ``(latent_dim,)``.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("a", dist.Normal(0.0, 1.0))
        ...     pt.sample("b", dist.Exponential(1.0).expand([3]).to_event(1))
        >>> guide = AutoDiagonalNormal(model)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> guide.latent_dim, tuple(store["auto.scale"].shape)
        (4, (4,))
        >>> guide.get_posterior(dict(store.items())).event_shape
        torch.Size([4])
    """

    def _param_specs(self):
        init = self._init_loc
        return {
            "loc": (init, constraints.real),
            "scale": (torch.full_like(init, self.init_scale), constraints.positive),
        }

    def _posterior(self, values):
        return pyro_dist.Normal(values["loc"], values["scale"]).to_event(1)

    def _loc_scale(self, values):
        return values["loc"], values["scale"]


class AutoMultivariateNormal(AutoContinuous):
    """Normal with a full covariance over the unconstrained latent vector.

    The Cholesky factor of the covariance is ``diag(scale) @ unit_tril``: params
    ``f"{prefix}.loc"`` and ``f"{prefix}.scale"`` (positive), both ``(latent_dim,)``, and
    ``f"{prefix}.unit_tril"`` ``(latent_dim, latent_dim)``, of which only the strictly lower
    triangle is used (the diagonal is 1). This is NumPyro's parameterization.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        >>> guide = AutoMultivariateNormal(model, init_scale=0.5)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> guide.get_posterior(dict(store.items())).scale_tril.tolist()
        [[0.5, 0.0], [0.0, 0.5]]
    """

    def _param_specs(self):
        init = self._init_loc
        eye = torch.eye(self.latent_dim, dtype=init.dtype, device=init.device)
        return {
            "loc": (init, constraints.real),
            "scale": (torch.full_like(init, self.init_scale), constraints.positive),
            "unit_tril": (eye, constraints.real),
        }

    @staticmethod
    def _scale_tril(values):
        unit = values["unit_tril"].tril(-1)
        unit = unit + torch.eye(unit.shape[-1], dtype=unit.dtype, device=unit.device)
        return values["scale"][:, None] * unit

    def _posterior(self, values):
        return pyro_dist.MultivariateNormal(values["loc"], scale_tril=self._scale_tril(values))

    def _loc_scale(self, values):
        scale = self._scale_tril(values).pow(2).sum(-1).sqrt()
        return values["loc"], scale


class AutoLowRankMultivariateNormal(AutoContinuous):
    """Normal with covariance ``D (W W^T + I) D``, ``D = diag(scale)``: rank ``rank`` plus a
    diagonal, parameterized as Pyro's.

    Params ``f"{prefix}.loc"``, ``f"{prefix}.cov_factor"`` ``W`` ``(latent_dim, rank)`` and
    ``f"{prefix}.scale"`` ``(latent_dim,)``. ``rank`` defaults to ``round(sqrt(latent_dim))``.
    ``cov_factor`` starts random (from torch's generator), since ``W = 0`` is a stationary
    point of the ELBO. ``W`` is relative to the scales: with the low-rank factor
    ``W`` itself (``W W^T + D^2``), Adam's steps of the same size in ``W`` for sites of very
    different posterior scales made the fit unstable (a regression's loss rose from 30 back
    to 89 at a learning rate of 0.05, where Pyro's stayed at 25).

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("w", dist.Normal(0.0, 1.0).expand([5]).to_event(1))
        >>> guide = AutoLowRankMultivariateNormal(model, rank=2)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> tuple(store["auto.cov_factor"].shape)
        (5, 2)
    """

    def __init__(self, model, *, rank: int | None = None, **kwargs):
        super().__init__(model, **kwargs)
        if rank is not None and int(rank) < 1:
            raise ValueError(f"rank must be a positive integer, got {rank}")
        self.rank = rank

    def _check_prototype(self) -> None:
        super()._check_prototype()
        if self.rank is None:
            self.rank = max(1, int(round(math.sqrt(self.latent_dim))))
        init = self._init_loc
        # Drawn once, here, so that every call (and a fresh store) starts from the same W;
        # E[(W W^T)_ii] = 1, so each site's variance starts at about init_scale^2.
        self._init_cov_factor = torch.randn(
            (self.latent_dim, int(self.rank)), dtype=init.dtype, device=init.device
        ) / math.sqrt(int(self.rank))

    def _param_specs(self):
        init = self._init_loc
        return {
            "loc": (init, constraints.real),
            "cov_factor": (self._init_cov_factor, constraints.real),
            "scale": (
                torch.full_like(init, self.init_scale * math.sqrt(0.5)),
                constraints.positive,
            ),
        }

    def _posterior(self, values):
        scale = values["scale"]
        return pyro_dist.LowRankMultivariateNormal(
            values["loc"], values["cov_factor"] * scale.unsqueeze(-1), scale.pow(2)
        )

    def _loc_scale(self, values):
        scale = values["scale"]
        return values["loc"], scale * (values["cov_factor"].pow(2).sum(-1) + 1).sqrt()


class AutoLaplaceApproximation(AutoContinuous):
    """MAP in unconstrained space, then a Normal with the inverse Hessian as covariance.

    Fitted with SVI, the guide is a point mass at ``f"{prefix}.loc"`` (the mode of the
    posterior density of the unconstrained vector, Jacobian included).
    :meth:`laplace_approximation` then returns an :class:`AutoMultivariateNormal` whose
    covariance is the inverse Hessian of the negative log joint at that mode.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("x", dist.Normal(1.0, 2.0))
        >>> guide = AutoLaplaceApproximation(model)
        >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> laplace = guide.laplace_approximation(params={"auto.loc": torch.tensor([1.0])})
        >>> round(float(laplace.get_posterior().covariance_matrix), 4)
        4.0
    """

    def _check_prototype(self) -> None:
        for site in self.latents.values():
            if site.from_space:
                raise ValueError(
                    f"{type(self).__name__}: latent site {site.name!r} "
                    f"({type(innermost(self.prototype_trace[site.name].fn)).__name__}) is an angle "
                    f"or direction, which guides work with as the direction of an "
                    f"unconstrained point under a Gaussian radius; that density's mode is "
                    f"at the origin, where no direction is defined, so it has no Laplace "
                    f"approximation. Use AutoMultivariateNormal or AutoNormal"
                )
        super()._check_prototype()

    def _param_specs(self):
        return {"loc": (self._init_loc, constraints.real)}

    def _posterior(self, values):
        return pyro_dist.Delta(values["loc"], event_dim=1)

    def _loc_scale(self, values):
        return values["loc"], torch.zeros_like(values["loc"])

    def _transform(self, values):
        raise NotImplementedError(
            "AutoLaplaceApproximation is a point mass while it is fitted: no map from "
            "standard normal noise. Use guide.laplace_approximation(*args), an "
            "AutoMultivariateNormal, whose get_transform() is the Laplace approximation's"
        )

    def _sample_posterior(self, num_samples, params):
        loc = self._lookup_params(params)["loc"].detach()
        return self._constrain(self.unpack(loc.expand(num_samples, -1)))

    def _neg_log_joint(self, z, args, kwargs, params):
        model = self.model if params is None else substitute(self.model, data=params)
        values, log_det = {}, 0.0
        for name, unconstrained in self.unpack(z, align=True).items():
            transform = self.latents[name].transform
            values[name] = transform(unconstrained)
            if not is_identity(transform):
                ladj = transform.log_abs_det_jacobian(unconstrained, values[name])
                log_det = log_det + ladj.sum()
        tr = trace(substitute(model, data=values)).get_trace(*args, **kwargs)
        return -(tr.log_prob_sum() + log_det)

    def laplace_approximation(
        self, *args, params: dict | None = None, **kwargs
    ) -> AutoMultivariateNormal:
        """The Laplace approximation at the fitted mode, as an ``AutoMultivariateNormal``.

        ``args``/``kwargs`` are the model's; ``params`` are the fitted params (SVI's
        ``result.params``, which also supply the model's own params) or, when None, those
        of the SVI that fitted this guide (in a ``pt.param_scope``: that store). The
        returned guide has fixed params (``loc`` and the Cholesky factor of the inverse
        Hessian); it reads nothing from a param store.
        """
        self._ensure_prototype(args, kwargs)
        if params is None:  # the SVI's that fitted this guide: its loc and the model's params
            params = fitted_params(self, self.model)
        loc = self._lookup_params(params)["loc"].detach()
        was = is_validation_enabled()
        enable_validation(False)  # the values come from the fitted guide; no re-checks
        try:
            with torch_validation(False):
                hessian = torch.autograd.functional.hessian(
                    lambda z: self._neg_log_joint(z, args, kwargs, params), loc
                )
        finally:
            enable_validation(was)
        hessian = 0.5 * (hessian + hessian.T)
        chol, info = torch.linalg.cholesky_ex(hessian)
        if int(info) != 0:
            raise ValueError(
                "laplace_approximation: the Hessian of the negative log joint is not positive "
                "definite at the fitted mode (is the fit converged? is the posterior proper?)"
            )
        covariance = torch.cholesky_inverse(chol)
        scale_tril = torch.linalg.cholesky(0.5 * (covariance + covariance.T))
        guide = AutoMultivariateNormal(
            self.model, prefix=self.prefix, init_loc_fn=self.init_loc_fn, init_scale=1.0
        )
        guide.prototype_trace = self.prototype_trace
        guide.prototype_args = self.prototype_args
        guide.latents = dict(self.latents)
        guide._check_prototype()
        diagonal = scale_tril.diagonal()
        guide._fixed_params = {
            "loc": loc,
            "scale": diagonal,
            "unit_tril": scale_tril / diagonal[:, None],
        }
        return guide
