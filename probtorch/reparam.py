"""Reparameterizers for the ``reparam`` handler: non-centering and transform unwrapping.

A reparameterizer is called as ``reparam(name, fn, obs) -> (new_fn, value)``: it may sample
auxiliary sites and return the value of the original site computed from them
(``new_fn is None`` then turns the original site into a deterministic one).
"""

from __future__ import annotations

import functools
import math

import pyro.distributions as pyro_dist
import torch
from torch.distributions import Independent, TransformedDistribution, constraints

from . import handlers
from ._errors import with_message
from .primitives import param, sample

__all__ = [
    "Reparam",
    "LocScaleReparam",
    "TransformReparam",
    "NeuTraReparam",
    "StudentTReparam",
    "CircularReparam",
    "ProjectedNormalReparam",
    "GumbelSoftmaxReparam",
    "Strategy",
    "MinimalReparam",
    "AutoReparam",
]


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


class NeuTraReparam(Reparam):
    """Neural transport: run a model on the noise of a fitted autoguide (Hoffman et al. 2019).

    A guide fitted by SVI (``AutoIAFNormal``, ``AutoMultivariateNormal``, any
    :class:`~probtorch.inference.autoguide.AutoContinuous`) is a map ``T`` of standard
    normal noise ``z`` to the model's latent vector. :meth:`reparam` rewrites the model
    to draw ``z`` at the one site ``f"{prefix}_shared_latent"`` and compute every latent
    site from ``T(z)``; the density is the model's, times ``|det dT/dz|``. Where the guide
    fits the posterior well, NUTS sees a near-standard Normal in ``z`` instead of the
    model's funnels and correlations.

    The original sites stay in the run as deterministic sites (as NumPyro's), so MCMC's
    samples hold them. Their log densities are ``pt.factor`` sites ``f"_{name}_log_prob"``
    in the site's plates (scaled and masked as the site would be), and the Jacobians
    (of ``T`` and of each site's map to its support; never scaled, as HMC's potential
    has them) one factor ``f"_{prefix}_shared_latent_log_det"`` after the model. These
    are prior terms: log likelihoods (``to_inference_data``, ``log_likelihood``) leave
    them out. The model's own params are read as for the model itself (the store of the
    SVI that fitted it).

    Args:
        guide: an ``AutoContinuous`` guide, set up (fitted).
        params: the guide's params (SVI's ``result.params``); None reads the fitted ones.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference import SVI, Trace_ELBO, MCMC, NUTS
        >>> from probtorch.inference.autoguide import AutoMultivariateNormal
        >>> def model():
        ...     s = pt.sample("s", dist.HalfNormal(1.0))
        ...     pt.sample("x", dist.Normal(0.0, s))
        >>> guide = AutoMultivariateNormal(model)
        >>> result = SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), seed=0).run(
        ...     200, progress_bar=False)
        >>> neutra = NeuTraReparam(guide, result.params)
        >>> mcmc = MCMC(NUTS(neutra.reparam(model), compile=False), num_warmup=100,
        ...             num_samples=100, progress_bar=False, seed=0)
        >>> mcmc.run()
        >>> sorted(mcmc.get_samples())
        ['auto_shared_latent', 's', 'x']
        >>> bool((neutra.transform_sample(mcmc.get_samples()["auto_shared_latent"])["s"]
        ...       == mcmc.get_samples()["s"]).all())
        True
    """

    def __init__(self, guide, params: dict | None = None):
        from .inference.autoguide import AutoContinuous

        if not isinstance(guide, AutoContinuous):
            raise TypeError(
                f"NeuTraReparam needs an AutoContinuous guide (AutoIAFNormal, "
                f"AutoMultivariateNormal, AutoDiagonalNormal, ...): a map of one latent "
                f"vector; got {type(guide).__name__}"
            )
        guide._require_prototype("NeuTraReparam")
        self.guide = guide
        self.params = params
        try:
            self.transform = guide.get_transform(params)
        except NotImplementedError as error:
            raise ValueError(f"NeuTraReparam: {error}") from error
        self.base_dist = guide.get_base_dist()

    @property
    def latent_name(self) -> str:
        """The name of the site of the standard normal noise."""
        return f"{self.guide.prefix}_shared_latent"

    def reparam(self, fn=None):
        """``fn`` run on the guide's noise (see the class); without ``fn``, a decorator."""
        if fn is None:
            return self.reparam
        from .params import fitted_scope

        @functools.wraps(fn)  # (whose __wrapped__ finds the SVI store that fitted fn)
        def neutra_model(*args, **kwargs):
            z = sample(self.latent_name, self.base_dist.mask(False))
            x = self.transform(z)
            sites = _NeuTraSites(self.guide, self.guide.unpack(x, align=True))
            with fitted_scope(fn):
                result = handlers.reparam(fn, config=sites.config)(*args, **kwargs)
            if sites.unconstrained:
                raise ValueError(
                    f"NeuTraReparam: the guide's latent sites {sorted(sites.unconstrained)} "
                    f"did not occur in this run of the model; the guide was set up on a "
                    f"model whose latent sites were {list(self.guide.latents)}"
                )
            log_det = self.transform.log_abs_det_jacobian(z, x)
            for term in sites.log_dets:  # (summed over the site's own dims)
                log_det = log_det + _sum_to(term, z.shape[:-1])
            _prior_factor(f"_{self.latent_name}_log_det", log_det)
            return result

        return neutra_model

    def __call__(self, name, fn, obs):
        raise TypeError(
            "NeuTraReparam draws all sites from one shared latent: wrap the whole model with "
            "neutra.reparam(model), not site by site in a reparam config"
        )

    def transform_sample(self, latent: torch.Tensor, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The model's latent sites for draws ``latent`` of the shared latent site
        (``(..., latent_dim)``, e.g. ``mcmc.get_samples()[neutra.latent_name]``).

        The model runs on each draw (with ``args``/``kwargs``, by default the arguments
        the guide was set up with), so a support that depends on other sites
        (``Uniform(a, b)`` with a latent ``a``) maps each draw with its own bounds.
        """
        from .inference.predictive import Predictive

        if not args and not kwargs:
            args, kwargs = self.guide.prototype_args
        batch = latent.shape[:-1]
        flat = latent.detach().reshape((-1, latent.shape[-1]))
        names = list(self.guide.latents)
        predictive = Predictive(
            self.reparam(self.guide.model), {self.latent_name: flat}, return_sites=names
        )
        draws = predictive(*args, seed=0, **kwargs)
        return {name: draws[name].reshape(batch + draws[name].shape[1:]).detach() for name in names}


def _sum_to(term: torch.Tensor, batch: torch.Size) -> torch.Tensor:
    """``term`` summed over every dim but those of ``batch`` (draws batched at the left of
    the plates, e.g. by ``Predictive``; aligned from the right, kept where not 1)."""
    if term.dim() > len(batch):
        term = term.sum(tuple(range(term.dim() - len(batch))))
    dims = [i for i in range(-term.dim(), 0) if batch[i] == 1 and term.shape[i] != 1]
    return term.sum(dims, keepdim=True) if dims else term


def _prior_factor(name: str, log_factor: torch.Tensor) -> None:
    """A ``pt.factor`` that is part of the prior: not a log likelihood term."""
    unit = pyro_dist.Unit(log_factor)
    sample(name, unit, obs=unit.sample(), infer={"is_auxiliary": True, "prior_term": True})


class _NeuTraSites:
    """One model run's sites computed from the warped shared latent (unconstrained values
    by site name, each used once), and the log Jacobians of their maps to their supports."""

    def __init__(self, guide, unconstrained: dict[str, torch.Tensor]):
        self.guide = guide
        self.unconstrained = unconstrained
        self.log_dets: list[torch.Tensor] = []

    def config(self, msg):
        if msg.name in self.guide.latents:
            return self._refuse_observed if msg.is_observed else self._reparam
        return None

    def _refuse_observed(self, name, fn, obs):
        raise ValueError(
            f"NeuTraReparam: site {name!r} is observed in this run, but the guide was set up "
            f"with it latent; NeuTraReparam draws latent sites only"
        )

    def _reparam(self, name, fn, obs):
        from .inference.angles import unconstraining_transform

        if name not in self.unconstrained:
            raise ValueError(f"NeuTraReparam: site {name!r} occurs twice in the model")
        unconstrained = self.unconstrained.pop(name)
        site_shape = tuple(self.guide.latents[name].shape)
        shape = tuple(fn.batch_shape) + tuple(fn.event_shape)
        # (dims left of the guide's shape: enumerated discrete parents, or draws batched
        # by Predictive)
        if len(shape) < len(site_shape) or shape[len(shape) - len(site_shape) :] != site_shape:
            raise ValueError(
                f"NeuTraReparam: site {name!r} has shape {shape} ({type(fn).__name__}, "
                f"batch {tuple(fn.batch_shape)}, event {tuple(fn.event_shape)}) in this run, "
                f"but {site_shape} when the guide was set up; fit a guide on the model with "
                f"these arguments"
            )
        transform = unconstraining_transform(fn)
        value = transform(unconstrained)
        log_det = transform.log_abs_det_jacobian(unconstrained, value)
        self.log_dets.append(log_det)
        _prior_factor(f"_{name}_log_prob", fn.log_prob(value))
        return None, value


def _require_family(name, fn, family, what):
    if not isinstance(fn, family):
        raise ValueError(
            f"{what}: site {name!r} has distribution {type(fn).__name__}, not a {family.__name__}"
        )


class StudentTReparam(Reparam):
    """A StudentT site as a Normal given an auxiliary Gamma precision (a scale mixture).

    ``x ~ StudentT(df, loc, scale)`` becomes ``x_gamma ~ Gamma(df / 2, df / 2)`` and
    ``x ~ Normal(loc, scale / sqrt(x_gamma))``: the site keeps its name (observed sites
    too) with the conditional Normal, as Pyro's.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.StudentT(4.0, 0.0, 2.0))
        >>> m = pt.handlers.reparam(model, config={"x": StudentTReparam()})
        >>> tr = pt.handlers.trace(pt.handlers.seed(m, 0)).get_trace()
        >>> list(tr), type(tr["x"].fn).__name__
        (['x_gamma', 'x'], 'Normal')
    """

    def __call__(self, name, fn, obs):
        fn, expand_shape, event_dim = self._unwrap(fn)
        _require_family(name, fn, torch.distributions.StudentT, "StudentTReparam")
        half_df = fn.df * 0.5
        gamma = sample(
            f"{name}_gamma", self._wrap(pyro_dist.Gamma(half_df, half_df), expand_shape, event_dim)
        )
        normal = pyro_dist.Normal(fn.loc, fn.scale * gamma.rsqrt())
        return self._wrap(normal, expand_shape, event_dim), None


class _Unwrapped(torch.distributions.Distribution):
    """A real line carrying no density, drawn (for prior draws and inits) as the
    circular ``fn``: the unwrapped angle of :class:`CircularReparam`."""

    arg_constraints: dict = {}

    def __init__(self, fn):
        self.fn = fn
        super().__init__(fn.batch_shape, fn.event_shape, validate_args=False)

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    def sample(self, sample_shape=()):
        return self.fn.sample(torch.Size(sample_shape))

    def log_prob(self, value):
        shape = value.shape[: value.dim() - len(self.event_shape)]
        return value.new_zeros(shape)


class CircularReparam(Reparam):
    """An angle (``VonMises``, ``SineBivariateVonMises``, ``SineSkewed``) drawn on the real
    line and wrapped.

    ``x ~ VonMises(loc, concentration)`` becomes ``x_unwrapped`` on the real line (no
    density of its own) and ``x = (x_unwrapped + pi) mod 2 pi - pi``, with the site's
    density as the factor ``f"{x}_factor"``: NumPyro's. (probtorch's HMC and NUTS sample
    angles as directions in the plane without it.)

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.VonMises(3.0, 2.0))
        >>> m = pt.handlers.reparam(model, config={"x": CircularReparam()})
        >>> values = {"x_unwrapped": torch.tensor(3.0 + 2 * math.pi)}
        >>> tr = pt.handlers.trace(pt.handlers.substitute(m, data=values)).get_trace()
        >>> round(float(tr["x"].value), 4), tr["x"].type
        (3.0, 'deterministic')
    """

    def __call__(self, name, fn, obs):
        self._require_latent(name, obs, "CircularReparam")
        from .inference.angles import _is_angular

        if not _is_angular(fn):
            raise ValueError(
                f"CircularReparam: site {name!r} has distribution {type(fn).__name__}, not "
                f"a distribution of angles (VonMises, SineBivariateVonMises, SineSkewed)"
            )
        unwrapped = sample(f"{name}_unwrapped", _Unwrapped(fn))
        value = torch.remainder(unwrapped + math.pi, 2 * math.pi) - math.pi
        _prior_factor(f"{name}_factor", fn.log_prob(value))
        return None, value


class ProjectedNormalReparam(Reparam):
    """A ``ProjectedNormal`` direction as the normalized ``concentration + x_normal``,
    ``x_normal`` a standard Normal of the same shape (Pyro's and NumPyro's).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.ProjectedNormal(torch.tensor([3.0, 0.0, 0.0])))
        >>> m = pt.handlers.reparam(model, config={"x": ProjectedNormalReparam()})
        >>> values = {"x_normal": torch.tensor([1.0, 4.0, 0.0])}
        >>> pt.handlers.trace(pt.handlers.substitute(m, data=values)).get_trace()["x"].value
        tensor([0.7071, 0.7071, 0.0000])
    """

    def __call__(self, name, fn, obs):
        self._require_latent(name, obs, "ProjectedNormalReparam")
        fn, expand_shape, event_dim = self._unwrap(fn)
        _require_family(name, fn, pyro_dist.ProjectedNormal, "ProjectedNormalReparam")
        concentration = fn.concentration
        zeros = torch.zeros_like(concentration)
        noise = pyro_dist.Normal(zeros, torch.ones_like(zeros))
        full_shape = tuple(expand_shape) + tuple(fn.event_shape)
        x = sample(f"{name}_normal", self._wrap(noise, full_shape, event_dim))
        y = x + concentration
        tiny = torch.finfo(y.dtype).tiny
        value = y / torch.linalg.vector_norm(y, dim=-1, keepdim=True).clamp(min=tiny)
        return None, value


class GumbelSoftmaxReparam(Reparam):
    """A ``RelaxedOneHotCategorical`` site from uniform noise through the Gumbel-softmax:
    ``x_uniform ~ Uniform(0, 1)`` (the logits' shape), ``x = softmax((logits + g) / T)``
    with ``g = -log(-log(x_uniform))`` (Pyro's).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.RelaxedOneHotCategorical(
        ...         torch.tensor(0.5), logits=torch.zeros(3)))
        >>> m = pt.handlers.reparam(model, config={"x": GumbelSoftmaxReparam()})
        >>> tr = pt.handlers.trace(pt.handlers.seed(m, 0)).get_trace()
        >>> list(tr), round(float(tr["x"].value.sum()), 6)
        (['x_uniform', 'x'], 1.0)
    """

    def __call__(self, name, fn, obs):
        self._require_latent(name, obs, "GumbelSoftmaxReparam")
        fn, expand_shape, event_dim = self._unwrap(fn)
        _require_family(
            name, fn, torch.distributions.RelaxedOneHotCategorical, "GumbelSoftmaxReparam"
        )
        logits = fn.logits
        uniform = pyro_dist.Uniform(torch.zeros_like(logits), torch.ones_like(logits))
        full_shape = tuple(expand_shape) + tuple(fn.event_shape)
        u = sample(f"{name}_uniform", self._wrap(uniform, full_shape, event_dim))
        tiny = torch.finfo(u.dtype).tiny
        gumbel = -torch.log(-torch.log(u.clamp(min=tiny)))
        value = torch.softmax((logits + gumbel) / fn.temperature, dim=-1)
        return None, value


# -- strategies: a reparameterizer chosen per site ------------------------------------------
class Strategy:
    """Chooses a reparameterizer for each site, once (Pyro's strategies).

    Use it as a decorator (``@AutoReparam()`` on a model), or as the config of the
    ``reparam`` handler. :attr:`config` holds the choice per site name after the first run
    of the model (reusable as ``reparam(model, config=strategy.config)``).
    """

    def __init__(self):
        self.config: dict = {}

    def configure(self, msg):
        """The reparameterizer for the sample site ``msg``, or None."""
        raise NotImplementedError

    def __call__(self, msg_or_fn):
        from .runtime import Message

        if isinstance(msg_or_fn, Message):
            name = msg_or_fn.name
            if name not in self.config:
                self.config[name] = self.configure(msg_or_fn)
            return self.config[name]
        return handlers.reparam(msg_or_fn, config=self)


def _base_family(fn):
    """``fn`` without its Independent/expanded/masked wrappers."""
    while (
        isinstance(fn, Independent)
        or type(fn).__name__ in ("ExpandedDistribution", "MaskedDistribution")
    ) and hasattr(fn, "base_dist"):
        fn = fn.base_dist
    return fn


def _minimal(name, fn, is_observed):
    fn = _base_family(fn)
    if isinstance(fn, TransformedDistribution):
        inner = _minimal(name, fn.base_dist, is_observed)
        return None if inner is None else TransformReparam()
    if isinstance(fn, pyro_dist.Stable):
        raise NotImplementedError(
            f"site {name!r} is a Stable distribution, which has no density: probtorch has "
            f"no Stable reparameterizers (Pyro's StableReparam, LatentStableReparam, "
            f"SymmetricStableReparam)"
        )
    if isinstance(fn, pyro_dist.ProjectedNormal) and not is_observed:
        return ProjectedNormalReparam()
    return None


class MinimalReparam(Strategy):
    """Reparameterizes only the sites that need it: ``ProjectedNormal`` latents (through a
    ``TransformedDistribution`` too). Pyro's strategy; its Stable reparameterizers are not
    in probtorch, and a Stable site is refused by name.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> @MinimalReparam()
        ... def model():
        ...     pt.sample("s", dist.Normal(0.0, 1.0))
        ...     pt.sample("d", dist.ProjectedNormal(torch.ones(3)))
        >>> list(pt.handlers.trace(pt.handlers.seed(model, 0)).get_trace())
        ['s', 'd_normal', 'd']
    """

    def configure(self, msg):
        return _minimal(msg.name, msg.fn, msg.is_observed)


class AutoReparam(Strategy):
    """Pyro's recommended reparameterizers, per latent site: ``TransformReparam`` for a
    ``TransformedDistribution``, ``GumbelSoftmaxReparam`` for a
    ``RelaxedOneHotCategorical``, a ``LocScaleReparam`` for a location-scale family on
    the real line (learned centering by default: fit with SVI; ``centered=0.0`` decenters
    fully, for MCMC), then :class:`MinimalReparam`'s.

    Args:
        centered: None to learn each site's centering (params ``f"{name}_centered"``), or
            a fixed degree in [0, 1].

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        ...     pt.sample("x", dist.Normal(mu, 2.0))
        >>> strategy = AutoReparam(centered=0.0)
        >>> tr = pt.handlers.trace(pt.handlers.seed(strategy(model), 0)).get_trace()
        >>> list(tr)
        ['mu_decentered', 'mu', 'x_decentered', 'x']
        >>> sorted(strategy.config)
        ['mu', 'mu_decentered', 'x', 'x_decentered']
    """

    def __init__(self, *, centered: float | None = None):
        if centered is not None and not 0 <= float(centered) <= 1:
            raise ValueError(f"AutoReparam: centered must be None or in [0, 1], got {centered}")
        super().__init__()
        self.centered = None if centered is None else float(centered)

    def configure(self, msg):
        fn = msg.fn
        if not msg.is_observed:
            fn = _base_family(fn)
            if isinstance(fn, TransformedDistribution):
                return TransformReparam()
            if isinstance(fn, torch.distributions.RelaxedOneHotCategorical):
                return GumbelSoftmaxReparam()
            if not msg.name.endswith("_decentered") and _is_loc_scale(fn):
                return LocScaleReparam(self.centered)
        return _minimal(msg.name, msg.fn, msg.is_observed)


def _is_loc_scale(fn) -> bool:
    if not {"loc", "scale"} <= set(getattr(fn, "arg_constraints", {})):
        return False
    support = fn.support
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real
