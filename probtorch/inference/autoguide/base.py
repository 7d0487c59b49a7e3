"""The machinery every autoguide shares: the prototype trace, its latent sites and params.

An autoguide is built from the model alone. On its first call it runs the model once
(seeded, with every site hidden from the handlers outside, and model params served from a
throw-away store) to record the *prototype trace*: each continuous latent site, its shape,
support, plates and initial value (from ``init_loc_fn``). From then on the guide draws each
latent site with the same name, shape and support as the model, so that
``replay(model, guide_trace)`` is well defined.

Parameters are read with :func:`probtorch.param` under the names ``f"{prefix}.{short}"``
(e.g. ``"auto.loc.mu"``), so ``SVI`` trains them in its own store. ``median``,
``quantiles``, ``sample_posterior`` take ``params`` (a dict ``name -> constrained value``,
as ``SVI``'s ``result.params``) or, without it, read the param store that is active.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints
from torch.distributions.transforms import ComposeTransform, IndependentTransform, Transform

from ...handlers import Trace, block, seed, substitute, trace
from ...params import ParamStore, param_scope, store_chosen
from ...primitives import param, plate
from ...runtime import CondIndepStackFrame, Message
from ...validation import num_event_dims, torch_validation
from ..angles import UnitVectorFromSpace, unconstraining_transform
from ..init_strategies import check_value_names, init_to_median, on_latent_sites

__all__ = ["AutoGuide", "LatentSite", "SiteDelta", "SiteTransformed"]


@dataclass(frozen=True)
class LatentSite:
    """A continuous latent site of the model as the prototype trace recorded it.

    ``shape`` is the value's shape in the prototype run (subsampled plates at their subsample
    size); ``full_shape`` has subsampled plates at their full size. ``transform`` maps
    unconstrained values to the site's (``biject_to(support)``; for angles and directions
    the point of the plane or space whose direction they are, as NUTS samples them:
    :func:`~..angles.unconstraining_transform`), and ``unconstrained_shape`` is
    ``full_shape`` mapped through its ``inverse_shape``.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference.autoguide import AutoNormal
        >>> def model():
        ...     pt.sample("w", dist.Dirichlet(torch.ones(4)))
        >>> guide = AutoNormal(model)
        >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> site = guide.latents["w"]
        >>> tuple(site.shape), tuple(site.unconstrained_shape), site.event_dim
        ((4,), (3,), 1)
    """

    name: str
    shape: torch.Size
    full_shape: torch.Size
    unconstrained_shape: torch.Size
    event_dim: int
    unconstrained_event_dim: int
    support: constraints.Constraint
    frames: tuple[CondIndepStackFrame, ...]
    init_unconstrained: torch.Tensor  # full size
    transform: Transform

    @property
    def from_space(self) -> bool:
        """Whether the site is an angle or direction of an unconstrained point (not a
        bijection: its ``log_abs_det_jacobian`` is the point's radial density)."""
        return isinstance(self.transform, UnitVectorFromSpace)

    @property
    def size(self) -> int:
        return math.prod(self.unconstrained_shape)

    @property
    def subsampled_frames(self) -> tuple[CondIndepStackFrame, ...]:
        return tuple(f for f in self.frames if f.subsample_size != f.size)


class SiteDelta(pyro_dist.Delta):
    """A ``Delta`` whose ``support`` is the model site's (Pyro's says ``real``).

    Autoguides put their values at model sites through it, so support checks that compare
    the guide's and the model's supports (as SVI's do) see matching supports.

    Example::

        >>> from torch.distributions import constraints
        >>> d = SiteDelta(torch.tensor(2.0), constraints.positive)
        >>> d.support, float(d.log_prob(torch.tensor(2.0)))
        (GreaterThan(lower_bound=0.0), 0.0)
    """

    def __init__(self, v, support, log_density=0.0, event_dim=0, validate_args=None):
        self._site_support = support
        super().__init__(
            v, log_density=log_density, event_dim=event_dim, validate_args=validate_args
        )

    @property
    def support(self):
        return self._site_support

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SiteDelta, _instance)
        new._site_support = self._site_support
        return super().expand(batch_shape, _instance=new)


class SiteTransformed(pyro_dist.TransformedDistribution):
    """``TransformedDistribution`` onto a site's support, reporting that support exactly.

    torch's reports the last transform's codomain, which for ``biject_to(positive)``
    (``exp`` then an affine shift) is ``real``.

    Example::

        >>> from torch.distributions import constraints
        >>> from probtorch.distributions import biject_to
        >>> base = pyro_dist.Normal(0.0, 1.0)
        >>> d = SiteTransformed(base, [biject_to(constraints.positive)], constraints.positive)
        >>> d.support
        GreaterThan(lower_bound=0.0)
    """

    def __init__(self, base_distribution, transforms, support, validate_args=None):
        self._site_support = support
        super().__init__(base_distribution, transforms, validate_args=validate_args)

    @property
    def support(self):
        return self._site_support

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(SiteTransformed, _instance)
        new._site_support = self._site_support
        return super().expand(batch_shape, _instance=new)


def is_identity(transform: Transform) -> bool:
    """True for ``biject_to(real)`` and its ``independent`` versions."""
    if isinstance(transform, IndependentTransform):
        return is_identity(transform.base_transform)
    return isinstance(transform, ComposeTransform) and not transform.parts


def _is_latent(site: Message) -> bool:
    return site.type == "sample" and not site.is_observed and not site.infer.get("is_auxiliary")


def _repeat_to(value: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """Tile ``value`` periodically along ``dim`` up to ``size`` (Pyro's ``periodic_repeat``)."""
    reps = -(-size // value.shape[dim])
    repeats = [1] * value.dim()
    repeats[dim] = reps
    return value.repeat(repeats).narrow(dim, 0, size).contiguous()


def rows_of_plates(value: torch.Tensor, site: LatentSite, plates: dict, event_dim: int):
    """The rows of ``value`` (full size along the site's plates, ``event_dim`` dims right
    of them) that the guide's plates select: a subsample's, or given indices' in their
    order (``plate.selects_rows``). Call it inside the plates (:func:`run_in_plates`)."""
    for frame in site.frames:
        value = plates[frame.name].rows_of(value, event_dim, f"site {site.name!r}'s guide value")
    return value


def run_in_plates(frames: Sequence[CondIndepStackFrame], plates: dict, fn: Callable):
    """Call ``fn()`` inside the plates named by ``frames`` (explicit enter/exit, no ExitStack)."""
    entered = []
    try:
        for frame in frames:
            plates[frame.name].__enter__()
            entered.append(plates[frame.name])
        return fn()
    finally:
        for p in reversed(entered):
            p.__exit__(None, None, None)


def _without_model_args(method: Callable) -> Callable:
    """``method`` (a guide's ``median`` or ``quantiles``), refusing more positional
    arguments than it takes with what Pyro's ``guide.median(*model_args)`` means here."""
    positional = [
        p
        for p in inspect.signature(method).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][1:]  # without self

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if len(args) > len(positional):
            name = method.__name__
            takes = ", ".join(p.name for p in positional)
            raise TypeError(
                f"{type(self).__name__}.{name}({takes}) got {len(args)} positional "
                f"arguments: Pyro's guide.{name}(*model_args) takes the model's arguments, "
                f"but here the guide, once set up (by SVI or a call guide(*args)), needs none: "
                f"guide.{name}({'qs' if name == 'quantiles' else ''}) reads the fitted params, "
                f"or pass params= (SVI's result.params)"
            )
        return method(self, *args, **kwargs)

    return checked


class AutoGuide:
    """Base class of the automatic guides; subclasses define the params and the draws.

    Args:
        model: the model function the guide approximates the posterior of.
        prefix: prefix of the param names (``f"{prefix}.loc.{site}"``, ...).
        init_loc_fn: initialization strategy (``probtorch.inference.init_strategies``) giving
            the initial location of each latent site, in constrained space;
            ``init_to_median`` for every guide (Pyro's ``AutoNormal`` starts
            ``init_to_feasible``, its other guides ``init_to_median``).
        init_scale: initial scale (standard deviation in unconstrained space).
        create_plates: as Pyro's: a function of the model's arguments returning a plate, or
            a list of plates, for the guide to use instead of plates it builds itself. A
            model whose plate takes its subsample from the arguments
            (``pt.plate("data", n, subsample=idx)``, a data loader's minibatch) needs it, so
            that the guide's draws are the rows of that subsample; plates that draw their
            own subsample share it with the model's through the guide's trace.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference.autoguide import AutoDiagonalNormal
        >>> def model():
        ...     pt.sample("a", dist.Normal(0.0, 1.0))
        >>> guide = AutoDiagonalNormal(model, prefix="q")
        >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> isinstance(guide, AutoGuide), guide.param_names
        (True, ['q.loc', 'q.scale'])
    """

    def __init__(
        self,
        model: Callable,
        *,
        prefix: str = "auto",
        init_loc_fn: Callable = init_to_median,
        init_scale: float = 0.1,
        create_plates: Callable | None = None,
    ):
        if not callable(model):
            raise TypeError(f"{type(self).__name__} needs a callable model, got {model!r}")
        if create_plates is not None and not callable(create_plates):
            raise TypeError(
                f"{type(self).__name__}: create_plates must be a function of the model's "
                f"arguments returning plates, got {create_plates!r}"
            )
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale}")
        self.model = model
        self.prefix = prefix
        self.init_loc_fn = init_loc_fn
        self.init_scale = float(init_scale)
        self.create_plates = create_plates
        self.prototype_trace: Trace | None = None
        self.prototype_args: tuple = ((), {})
        # Subsampled plates whose indices the model takes from its arguments:
        # create_plates must give the guide those plates.
        self._subsample_given: dict[str, CondIndepStackFrame] = {}
        self.latents: dict[str, LatentSite] = {}
        # Params that do not come from a store (the guide of a Laplace approximation).
        self._fixed_params: dict[str, torch.Tensor] | None = None
        # The store of the last SVI that fitted this guide: outside SVI the guide reads its
        # params there (Pyro's guide() and guide.median() after svi.step, whose params live
        # in one global store), unless the caller chooses a store with param_scope
        self.fitted_store: ParamStore | None = None
        self.fitting = False  # True while an SVI method runs the guide

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("median", "quantiles"):
            if name in cls.__dict__:
                setattr(cls, name, _without_model_args(cls.__dict__[name]))

    # -- the prototype ---------------------------------------------------------------
    def _setup_prototype(self, *args, **kwargs) -> None:
        """Trace the model once and record its continuous latent sites."""
        rng_seed = int(torch.randint(0, 2**31 - 1, ()).item())
        init = on_latent_sites(self.init_loc_fn)
        tracer = trace(seed(substitute(self.model, substitute_fn=init), rng_seed))
        # Hide the run from the handlers outside (SVI's trace of the guide) and keep the
        # model's own params out of every store that matters.
        with block(), param_scope(ParamStore()), torch_validation(False):
            tracer(*args, **kwargs)
        self.prototype_trace = tracer.trace
        self.prototype_args = (args, kwargs)  # (NeuTraReparam.transform_sample reruns it)
        check_value_names(self.init_loc_fn, tracer.trace)
        latents = {}
        for name, site in tracer.trace.items():
            if not _is_latent(site):
                continue
            latents[name] = self._latent_site(site)
        if not latents:
            raise ValueError(
                f"{type(self).__name__}: the model has no latent sample sites; there is "
                f"nothing for a guide to approximate"
            )
        self.latents = latents
        # (a plate given all rows in another order too: plate.selects_rows)
        self._subsample_given = {
            frame.name: frame
            for site in latents.values()
            for frame in site.frames
            if frame.name in tracer.trace[site.name].extra.get("subsample_given", ())
        }
        self._check_prototype()

    def _latent_site(self, site: Message) -> LatentSite:
        support = site.fn.support
        if support.is_discrete:
            raise ValueError(
                f"{type(self).__name__}: latent site {site.name!r} has the discrete "
                f"distribution {type(site.fn).__name__} (support {support}); autoguides "
                f"handle continuous latent sites only. Build the guide on the model with it "
                f"hidden, {type(self).__name__}(pt.handlers.block(model, "
                f"hide=[{site.name!r}])), and fit with TraceEnum_ELBO, which sums it out of "
                f"the model (as in Pyro); or marginalize it out, observe it, or write a "
                f"guide for it"
            )
        try:
            transform = unconstraining_transform(site.fn)
        except NotImplementedError:
            raise ValueError(
                f"{type(self).__name__}: latent site {site.name!r} has the distribution "
                f"{type(site.fn).__name__} with support {support}, which has no bijection "
                f"to unconstrained space for an autoguide to work in: write a guide for it"
            ) from None
        value = site.value.detach()
        with torch.no_grad():
            init = transform.inv(value)
        event_dim = num_event_dims(site.fn)
        unconstrained_event_dim = event_dim + init.dim() - value.dim()
        full_shape = list(value.shape)
        for frame in site.cond_indep_stack:
            if frame.subsample_size != frame.size:
                init = _repeat_to(init, frame.size, frame.dim - unconstrained_event_dim)
                full_shape[len(full_shape) + frame.dim - event_dim] = frame.size
        # Plates in their order of nesting, outermost first.
        frames = tuple(reversed(site.cond_indep_stack))
        return LatentSite(
            name=site.name,
            shape=value.shape,
            full_shape=torch.Size(full_shape),
            unconstrained_shape=init.shape,
            event_dim=event_dim,
            unconstrained_event_dim=unconstrained_event_dim,
            support=support,
            frames=frames,
            init_unconstrained=init.detach().clone(),
            transform=transform,
        )

    def _check_prototype(self) -> None:
        """Hook for subclasses that cannot handle every prototype (e.g. subsampling)."""

    def _ensure_prototype(self, args: tuple, kwargs: dict) -> None:
        if self.prototype_trace is None:
            self._setup_prototype(*args, **kwargs)

    def _require_prototype(self, what: str) -> None:
        if self.prototype_trace is None:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: the guide has not been set up yet; call it "
                f"once with the model's arguments (SVI does this), e.g. guide(*args)"
            )

    def _create_plates(self, args: tuple, kwargs: dict) -> dict[str, plate]:
        """The plates of the latent sites: ``create_plates``'s, and for the others one per
        name seen in the prototype, as the model built it. Inside an
        :class:`~.guide_list.AutoGuideList` call the parts share one plate per name (one
        subsample per guide run)."""
        shared = self._shared_plates
        plates = self._given_plates(args, kwargs, shared)
        for site in self.latents.values():
            for frame in site.frames:
                if frame.name not in plates:
                    plates[frame.name] = plate(
                        frame.name, frame.size, subsample_size=frame.subsample_size, dim=frame.dim
                    )
        if shared is not None:
            shared.update(plates)
        return plates

    # a dict of plates by name while an AutoGuideList runs this guide as one of its parts
    _shared_plates: dict | None = None

    def _given_plates(self, args: tuple, kwargs: dict, shared: dict | None = None) -> dict:
        given = () if self.create_plates is None else self.create_plates(*args, **kwargs)
        if isinstance(given, plate):
            given = (given,)
        plates = dict(shared or {})
        for p in given:
            if not isinstance(p, plate):
                raise TypeError(
                    f"{type(self).__name__}: create_plates must return a plate or a list of "
                    f"plates (pt.plate(...)), got {type(p).__name__}"
                )
            plates[p.name] = p
        missing = [f for name, f in self._subsample_given.items() if name not in plates]
        if missing:
            frame = missing[0]
            raise ValueError(
                f"{type(self).__name__}: plate {frame.name!r} takes its subsample of "
                f"{frame.subsample_size} of {frame.size} from the model's arguments "
                f"(pt.plate(..., subsample=indices)), which the guide does not see, so its "
                f"draws would be other rows than the model's. Pass create_plates, a function "
                f"of the model's arguments returning that plate, as in Pyro: "
                f"{type(self).__name__}(model, create_plates=lambda *args, **kwargs: "
                f"pt.plate({frame.name!r}, {frame.size}, subsample=<the same indices>, "
                f"dim={frame.dim}))"
            )
        return plates

    # -- params ----------------------------------------------------------------------
    def _param_specs(self) -> dict[str, tuple[torch.Tensor | Callable, constraints.Constraint]]:
        """``short name -> (initial value or a function giving it, constraint)``."""
        raise NotImplementedError

    def _full_name(self, short: str) -> str:
        return f"{self.prefix}.{short}"

    @property
    def param_names(self) -> list[str]:
        """Full names of the guide's params (after the prototype is set up)."""
        self._require_prototype("param_names")
        return [self._full_name(short) for short in self._param_specs()]

    def _create_params(self) -> dict[str, torch.Tensor]:
        """Read (creating on first use) every param through ``probtorch.param``."""
        if self._fixed_params is not None:
            return dict(self._fixed_params)
        specs = self._param_specs()
        fitted = self._fitted_source()
        if fitted is not None and all(self._full_name(short) in fitted for short in specs):
            return {short: fitted[self._full_name(short)] for short in specs}
        return {
            short: param(self._full_name(short), init, constraint=constraint)
            for short, (init, constraint) in specs.items()
        }

    def _fitted_source(self) -> ParamStore | None:
        """The store of the SVI that fitted this guide, where the guide runs outside SVI
        and the caller chose no store (``param_scope``); else None."""
        if self.fitted_store is None or self.fitting:
            return None
        if store_chosen():
            return None
        return self.fitted_store

    def _lookup_params(self, params: dict | None) -> dict[str, torch.Tensor]:
        """Params by short name from ``params`` (full names) or the active param store."""
        if params is not None and not hasattr(params, "keys"):
            raise TypeError(
                f"{type(self).__name__}: params must be a dict of the guide's params by name "
                f"(SVI's result.params) or None for the fitted ones, got "
                f"{type(params).__name__}. Pyro's guide.median(*model_args) and "
                f"quantiles(qs, *model_args) take the model's arguments: here the guide, "
                f"once set up (by SVI or a call guide(*args)), needs none: guide.median()"
            )
        if self._fixed_params is not None:
            return dict(self._fixed_params)
        values = {}
        for short in self._param_specs():
            name = self._full_name(short)
            if params is not None:
                if name not in params:
                    raise KeyError(
                        f"{type(self).__name__}: params has no entry {name!r}; the guide's "
                        f"params are {self.param_names} (pass SVI's result.params)"
                    )
                values[short] = torch.as_tensor(params[name])
            else:
                values[short] = self._stored(name)
        return values

    def _stored(self, name: str) -> torch.Tensor:
        """The param ``name`` from the store of the last SVI that fitted this guide or,
        where the caller chose a store (``param_scope``) or no SVI has it, from the
        active store."""
        fitted = self._fitted_source()
        if fitted is not None and name in fitted:
            return fitted[name]
        try:
            return param(name)
        except KeyError:
            pass
        raise KeyError(
            f"{type(self).__name__}: param {name!r} is not in the active param store"
            + (" nor in its SVI's" if fitted is not None else "")
            + "; fit the guide first (SVI.step or SVI.run), or pass params= (svi.get_params() "
            "or SVI.run's result.params)"
        )

    # -- the guide -------------------------------------------------------------------
    def __call__(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """Draw every latent site of the model; returns ``{site: value}``."""
        raise NotImplementedError

    # -- posterior summaries -----------------------------------------------------------
    def median(self, params: dict | None = None) -> dict[str, torch.Tensor]:
        """The posterior median of each latent site, constrained (full size under plates)."""
        raise NotImplementedError

    def quantiles(
        self, qs: Sequence[float] | torch.Tensor, params: dict | None = None
    ) -> dict[str, torch.Tensor]:
        """Marginal quantiles per site, shape ``(len(qs),) + site shape``, constrained.

        Taken elementwise in unconstrained space and mapped through ``biject_to(support)``;
        for supports whose bijection is not elementwise (simplex, ...) they are quantiles of
        the unconstrained coordinates, mapped, as in Pyro.
        """
        raise NotImplementedError

    def sample_posterior(
        self, num_samples: int, params: dict | None = None, seed: int | None = None
    ) -> dict[str, torch.Tensor]:
        """``num_samples`` joint draws from the guide: ``{site: (num_samples,) + shape}``.

        With ``seed`` the draws are reproducible and leave torch's global generator as it
        was; without it they come from the global generator.
        """
        self._require_prototype("sample_posterior")
        if seed is None:
            return self._sample_posterior(int(num_samples), params)
        with _seeded(seed):
            return self._sample_posterior(int(num_samples), params)

    def _sample_posterior(self, num_samples: int, params: dict | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _constrain(self, unconstrained: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            name: self.latents[name].transform(value).detach()
            for name, value in unconstrained.items()
        }


class _seeded:
    """Seed torch's global generator inside a block and restore it after (like ``seed``)."""

    def __init__(self, rng_seed: int):
        self.handler = seed(rng_seed=rng_seed)

    def __enter__(self):
        self.handler.__enter__()

    def __exit__(self, *exc):
        self.handler.__exit__(*exc)
        return None


def as_quantiles(qs, dtype: torch.dtype) -> torch.Tensor:
    qs = torch.as_tensor(qs, dtype=dtype)
    if qs.dim() != 1:
        raise ValueError(f"qs must be a 1-d sequence of probabilities, got shape {tuple(qs.shape)}")
    if not bool(((qs > 0) & (qs < 1)).all()):
        raise ValueError(f"quantile levels must lie in (0, 1), got {qs.tolist()}")
    return qs
