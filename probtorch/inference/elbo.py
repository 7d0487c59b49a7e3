"""Evidence lower bounds for SVI: ``Trace_ELBO``, ``TraceMeanField_ELBO``, ``TraceGraph_ELBO``,
``RenyiELBO``. The loss is ``-ELBO``.

An ELBO runs the guide, then the model with the guide's values replayed, and combines the log
densities of the two traces. Particles are evaluated in one batched pass: model and guide run
inside an extra plate of size ``num_particles`` to the left of every plate of the model (as
Pyro's ``vectorize_particles``), so a model must put its batch dimensions on the left (as any
model with plates does); ``vectorize_particles=False`` runs them one after the other instead.

The work is split the way the compiled SVI step needs it:

* :meth:`ELBO.prepare` runs once, eagerly, with validation: it checks that guide and model
  agree (every latent site of the model is sampled by the guide, with a support inside the
  model's and the same shape; errors name the site) and fixes what the later runs need
  (the particle dimension, which sites get analytic KLs or score-function terms).
* :meth:`ELBO.compute` is a pure function of the current parameters: no validation, no
  Python branching on tensor values, so ``torch.compile(fullgraph=True)`` captures it. It
  returns ``(surrogate_loss, loss, state)``: the gradient of ``surrogate_loss`` is the
  gradient estimate, ``loss`` the ``-ELBO`` estimate, ``state`` the new baseline averages
  (TraceGraph_ELBO).

Example::

    >>> import torch, probtorch as pt, probtorch.distributions as dist
    >>> def model(y):
    ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pt.plate("n", len(y)):
    ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> def guide(y):
    ...     pt.sample("mu", dist.Normal(pt.param("loc", torch.tensor(0.0)), 1.0))
    >>> loss = Trace_ELBO(num_particles=10).differentiable_loss(model, guide, torch.zeros(3))
    >>> loss.shape, loss.requires_grad
    (torch.Size([]), True)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints, kl_divergence
from torch.utils._pytree import tree_map_only

from ..handlers import Trace, distribution_log_prob, replay, site_log_prob, trace
from ..primitives import plate
from ..runtime import Message, Messenger
from ..validation import innermost, torch_validation
from .enumeration import EnumerateSites, Factor, Variable, enumerable, sum_out
from .provenance import Provenance, sources, tracking

__all__ = ["ELBO", "Trace_ELBO", "TraceMeanField_ELBO", "TraceGraph_ELBO", "RenyiELBO"]

_PARTICLES = "_num_particles_vectorized"


class _Seeded(Messenger):
    """Let sample sites draw from torch's global generator.

    ``seed`` sets and restores the generator state, which compiled code cannot do; SVI
    manages the generator on the host and marks the sites seeded with this handler.
    """

    provides_randomness = True

    def process_message(self, msg: Message) -> None:
        msg.extra["seeded"] = True


class _Record(Messenger):
    """A light ``trace``: keeps sample and plate sites, without validation (compiled runs)."""

    def __init__(self):
        super().__init__()
        self.trace = Trace()

    def postprocess_message(self, msg: Message) -> None:
        # (a plate's given indices too, flagged ``extra["indices_given"]``, as trace
        # records them: the model replays the guide's rows)
        if msg.type in ("sample", "plate") and msg.name not in self.trace:
            self.trace[msg.name] = msg


def _is_delta(fn) -> bool:
    """Whether ``fn`` is a point mass (through reshaping wrappers).

    An autoguide's joint draw reaches each site as a ``Delta`` whose ``log_density`` holds
    the site's share of ``log q``; the registered ``KL(Delta || p) = -log p(v)`` leaves it
    out (in Pyro too: the mean-field loss came out lower than Trace_ELBO's by ``log q``'s
    Jacobian terms), so such sites take the Monte Carlo term, which is exact for them.
    """
    return isinstance(innermost(fn), pyro_dist.Delta)


def _is_latent(site: Message) -> bool:
    return site.type == "sample" and not site.is_observed


@dataclass
class ELBOPlan:
    """What :meth:`ELBO.prepare` fixes for the compiled runs of one model/guide pair."""

    max_plate_nesting: int
    guide_latents: tuple[str, ...]
    model_sites: tuple[str, ...]
    # observed sites of the guide (pt.factor): part of log q, as in Pyro
    guide_factors: tuple[str, ...] = ()
    analytic_kl: frozenset = frozenset()  # TraceMeanField_ELBO
    # TraceGraph_ELBO: per non-reparameterized guide site, the guide and model sites
    # downstream of it (the Rao-Blackwellized cost).
    downstream: dict = field(default_factory=dict)
    initial_state: dict = field(default_factory=dict)
    # TraceEnum_ELBO: the model's discrete latent sites, not in the guide, summed out
    enumerated: tuple[str, ...] = ()
    # TraceEnum_ELBO: the guide's discrete sites marked infer={"enumerate": "parallel"},
    # whose expectation is taken exactly (each value weighted by its probability)
    guide_enumerated: tuple[str, ...] = ()
    # whether a run may have other sample sites (a loop over a subsampled plate's rows,
    # f"z_{i}"), each run then planned from its own traces: eager runs only (SVI's
    # compiled step fixes the sites; SVI(compile=False) sets this)
    sites_may_change: bool = True


# -- support and shape checks -------------------------------------------------------------
def _base_constraint(c):
    while isinstance(c, constraints.independent):
        c = c.base_constraint
    return c


def _bound(x):
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            return None
        return float(x.reshape(()))
    return float(x)


def _as_interval(c):
    """``(low, high, low_closed, high_closed)`` for real intervals, else None."""
    c = _base_constraint(c)
    inf = math.inf
    if isinstance(c, constraints._Real):
        return (-inf, inf, False, False)
    if isinstance(c, constraints._GreaterThanEq):
        return (_bound(c.lower_bound), inf, True, False)
    if isinstance(c, constraints._GreaterThan):
        return (_bound(c.lower_bound), inf, False, False)
    if isinstance(c, constraints._LessThan):
        return (-inf, _bound(c.upper_bound), False, False)
    if isinstance(c, constraints._HalfOpenInterval):
        return (_bound(c.lower_bound), _bound(c.upper_bound), True, False)
    if isinstance(c, constraints._Interval):
        return (_bound(c.lower_bound), _bound(c.upper_bound), True, True)
    return None


def _support_inside(guide_support, model_support) -> bool | None:
    """Is the guide's support inside the model's? None when it cannot be decided statically."""
    if constraints.is_dependent(guide_support) or constraints.is_dependent(model_support):
        return None
    g, m = _as_interval(guide_support), _as_interval(model_support)
    if g is not None and m is not None:
        if None in g[:2] or None in m[:2]:
            return None
        low_ok = g[0] > m[0] or (g[0] == m[0] and (m[2] or not g[2]))
        high_ok = g[1] < m[1] or (g[1] == m[1] and (m[3] or not g[3]))
        return low_ok and high_ok
    g, m = _base_constraint(guide_support), _base_constraint(model_support)
    if type(g) is not type(m):
        # subclasses (e.g. Pyro's softplus_positive) share the set of their base class
        return isinstance(g, type(m)) or None if g.is_discrete == m.is_discrete else False
    if isinstance(g, constraints._IntegerInterval):
        return _bound(g.lower_bound) >= _bound(m.lower_bound) and _bound(g.upper_bound) <= _bound(
            m.upper_bound
        )
    return True


def _describe_fn(fn) -> str:
    return (
        f"{type(fn).__name__} with batch_shape {tuple(fn.batch_shape)}, "
        f"event_shape {tuple(fn.event_shape)}"
    )


def _check_pair(name: str, guide_site: Message, model_site: Message) -> None:
    guide_fn, model_fn = guide_site.fn, model_site.fn
    try:
        g_support, m_support = guide_fn.support, model_fn.support
    except NotImplementedError:
        g_support = m_support = None
    if g_support is not None:
        # a Delta's support is nominal (real): its value is its only point, as in Pyro's
        # MAP guides of a constrained latent (Delta(pt.param(..., constraint=positive)))
        point_mass = isinstance(innermost(guide_fn), pyro_dist.Delta)
        inside = None if point_mass else _support_inside(g_support, m_support)
        if inside is None and not constraints.is_dependent(m_support):
            inside = bool(torch.all(m_support.check(guide_site.value)))
        if inside is False and point_mass:
            raise ValueError(
                f"site {name!r}: the guide's Delta is at a value outside the model's "
                f"{type(model_fn).__name__}'s support {m_support}; give the guide's param "
                f"that constraint, e.g. pt.param(..., constraint=constraints.positive)"
            )
        if inside is False:
            raise ValueError(
                f"site {name!r}: the guide's {type(guide_fn).__name__} has support "
                f"{g_support}, but the model's {type(model_fn).__name__} has support "
                f"{m_support}; the guide must draw values inside the model's support "
                f"(e.g. a LogNormal or a transformed Normal for a positive latent)"
            )
    sample_shape = torch.Size(model_site.kwargs.get("sample_shape", ()))
    expected = sample_shape + model_fn.batch_shape + model_fn.event_shape
    shape = guide_site.value.shape
    if shape != expected:
        raise ValueError(
            f"site {name!r}: the guide draws values of shape {tuple(shape)} "
            f"({_describe_fn(guide_fn)}), but the model's site has shape {tuple(expected)} "
            f"({_describe_fn(model_fn)}); give the guide the same shape, e.g. sample it "
            f"inside the same plates or use .to_event()"
        )


class _CheckAgainstGuide(Messenger):
    """Check each model site against the guide's as soon as the model reaches it.

    Early, so that a guide value outside the model's support is reported as such, not as a
    failure of a later site that uses the value.
    """

    def __init__(self, fn, guide_trace: Trace):
        super().__init__(fn)
        self.guide_trace = guide_trace

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or msg.name not in self.guide_trace:
            return
        guide_site = self.guide_trace[msg.name]
        if not _is_latent(guide_site) or guide_site.infer.get("is_auxiliary", False):
            return
        if msg.is_observed:
            raise ValueError(
                f"the guide samples site {msg.name!r}, which the model observes; remove it "
                f"from the guide"
            )
        _check_pair(msg.name, guide_site, msg)


# -- helpers for batched particles -------------------------------------------------------
def _other_sites(plan: ELBOPlan, model_trace: Trace, guide_trace: Trace):
    """``(who, trace, new, gone)`` for the first of model and guide that ran other sample
    sites than ``plan`` holds (a loop over the data's length, called with longer data; a
    loop over a subsampled plate's rows); ``None`` where both ran the planned ones."""
    for who, tr, planned in (
        ("model", model_trace, plan.model_sites),
        ("guide", guide_trace, plan.guide_latents + plan.guide_factors),
    ):
        sites = [name for name, site in tr.items() if site.type == "sample"]
        if len(sites) == len(planned) and all(
            name in tr and tr[name].type == "sample" for name in planned
        ):
            continue  # (each eager step: one pass, no list searched per site)
        known = set(planned)
        new = [n for n in sites if n not in known]
        gone = [n for n in planned if n not in tr]
        if new or gone:
            return who, tr, new, gone
    return None


def _looped(tr: Trace, new: list) -> bool:
    """Whether the ``new`` sites of ``tr`` all lie in loops over subsampled plates' rows
    (``msg.extra["looped_plates"]``), whose names change with each subsample."""
    return bool(new) and all(tr[n].extra.get("looped_plates") for n in new)


def _replannable(plan: ELBOPlan) -> bool:
    """Whether a run's plan can be made from its own traces: not where sites are summed
    out (chosen before the run) or carry state between steps (decaying baselines)."""
    return not (plan.enumerated or plan.guide_enumerated or plan.initial_state)


def _other_sites_error(plan: ELBOPlan, who, tr, new, gone) -> ValueError:
    """The refusal of a run with other sample sites than the plan's, naming the looped
    subsampled plates that renamed them, if they did (:func:`_looped`)."""
    message = (
        f"the {who} ran other sample sites than on the first call (new: "
        f"{new[:5]}{' ...' if len(new) > 5 else ''}, missing: {gone[:5]}"
        f"{' ...' if len(gone) > 5 else ''}): "
    )
    if not _looped(tr, new):
        return ValueError(
            message + "SVI and the ELBO fix their plan of the sites on the first call. Use a "
            "new SVI (and ELBO) for each set of sites (e.g. each sequence length), or pad the "
            "data to one length and mask it (pt.handlers.mask or obs_mask)"
        )
    plates = dict.fromkeys(p for n in new for p in tr[n].extra["looped_plates"])
    named = ", ".join(repr(p) for p in plates)
    loop = (
        f"sites named by the rows of the subsampled plate {named} in a loop (`for i in "
        f"pt.plate(...)`) change every call"
    )
    if plan.sites_may_change:  # eager, but planned once: summed-out sites, baselines
        remedy = (
            "summed-out (enumerated) sites and decaying-average baselines are planned once, "
            "so use a vectorized plate (`with pt.plate(...):`)"
        )
    else:
        remedy = (
            "a compiled SVI step fixes its sites on the first call: SVI(..., "
            "compile=False) plans each step's sites anew, or use a vectorized plate "
            "(`with pt.plate(...):`)"
        )
    return ValueError(f"{message}{loop}; {remedy}")


def _per_particle(x: torch.Tensor, pdim: int | None, num: int) -> torch.Tensor:
    """Sum ``x`` over everything but the particle dim: shape ``(num,)`` (or ``()``)."""
    if pdim is None:
        return x.sum()
    if x.dim() < -pdim:
        # the same for every particle
        return x.sum().expand(num)
    return x.movedim(x.dim() + pdim, 0).reshape(num, -1).sum(-1)


def _sum_to(value: torch.Tensor, keep_dims: set) -> torch.Tensor:
    """Sum out every dim of ``value`` that is not in ``keep_dims`` (negative), keeping dims."""
    for d in range(-value.dim(), 0):
        if d not in keep_dims and value.shape[d] != 1:
            value = value.sum(d, keepdim=True)
    return value


class ELBO:
    """Base class of the ELBOs. ``loss = -ELBO``, averaged over ``num_particles`` draws.

    Args:
        num_particles: draws from the guide per estimate.
        vectorize_particles: draw all particles in one batched pass (an extra plate to the
            left of the model's plates) rather than one after another.

    Pyro's ``max_plate_nesting``, ``retain_graph`` and ``strict_enumeration_warning`` are
    taken for ported code: the plates are found by running the model (``TraceEnum_ELBO``
    reads ``max_plate_nesting`` as a bound), and SVI differentiates each step's graph once.
    """

    def __init__(
        self,
        num_particles: int = 1,
        vectorize_particles: bool = True,
        *,
        max_plate_nesting: int | None = None,
        retain_graph: bool | None = None,
        strict_enumeration_warning: bool = True,
    ):
        self.max_plate_nesting = max_plate_nesting
        if int(num_particles) < 1:
            raise ValueError(f"num_particles must be >= 1, got {num_particles}")
        self.num_particles = int(num_particles)
        self.vectorize_particles = bool(vectorize_particles)
        self._eager_state: dict = {}

    # -- public eager API (Pyro's) ---------------------------------------------------------
    def loss(self, model: Callable, guide: Callable, *args, **kwargs) -> float:
        """An estimate of ``-ELBO`` (a float), with params from the active param store."""
        with torch.no_grad():
            return float(self._surrogate_and_loss(model, guide, args, kwargs)[1])

    def differentiable_loss(self, model: Callable, guide: Callable, *args, **kwargs):
        """A surrogate loss whose gradient (by autograd) estimates the gradient of ``-ELBO``.

        Its value is ``-ELBO`` for the reparameterized ELBOs; for ``TraceGraph_ELBO`` it also
        holds the score-function and baseline terms (:meth:`loss` estimates ``-ELBO``).
        """
        return self._surrogate_and_loss(model, guide, args, kwargs)[0]

    def loss_and_grads(self, model: Callable, guide: Callable, *args, **kwargs) -> float:
        """Pyro's: an estimate of ``-ELBO`` (a float), with the gradient of the surrogate
        loss accumulated into the ``.grad`` of the params it reads (those of the active
        param store, unconstrained, and of modules), for a training loop of your own.

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> def model():
            ...     pt.sample("x", dist.Normal(0.0, 1.0), obs=torch.tensor(1.0))
            >>> def guide():
            ...     pt.param("unused", torch.tensor(0.0))
            >>> store = pt.ParamStore()
            >>> with pt.param_scope(store):
            ...     loss = Trace_ELBO().loss_and_grads(model, guide)
            >>> round(loss, 4)  # -log N(1; 0, 1)
            1.4189
        """
        surrogate, loss = self._surrogate_and_loss(model, guide, args, kwargs)
        if surrogate.requires_grad:
            surrogate.backward()
        return float(loss.detach())

    def _surrogate_and_loss(self, model, guide, args, kwargs):
        plan = self.prepare(model, guide, args, kwargs)
        state = (
            self._eager_state
            if set(self._eager_state) == set(plan.initial_state)
            else (plan.initial_state)
        )
        with _Seeded():
            surrogate, loss, state = self.compute(model, guide, args, kwargs, plan, state)
        self._eager_state = state
        return surrogate, loss

    # -- machinery used by SVI ------------------------------------------------------------
    def _traces(self, model, guide, args, kwargs, plan, validate=False) -> tuple[Trace, Trace]:
        """Guide trace, then model trace with the guide's values replayed."""
        if plan is not None and plan.guide_enumerated:
            enumerate_guide = EnumerateSites(plan.guide_enumerated, self._first_enum_dim(plan))
            enumerate_guide.fn = guide
            guide = enumerate_guide
        if validate:
            guide_tracer = trace(guide)
        else:
            guide_tracer = _Record()
            guide_tracer.fn = guide
        particles = None
        if plan is not None and self.vectorize_particles and self.num_particles > 1:
            particles = plate(_PARTICLES, self.num_particles, dim=-(plan.max_plate_nesting + 1))
        if particles is None:
            guide_tracer(*args, **kwargs)
        else:
            with particles:
                guide_tracer(*args, **kwargs)
        guide_trace = guide_tracer.trace
        replayed = replay(model, trace=guide_trace)
        if plan is not None and plan.enumerated:
            first = self._first_enum_dim(plan) - len(plan.guide_enumerated)
            enumerate_ = EnumerateSites(plan.enumerated, first)
            enumerate_.fn = replayed
            replayed = enumerate_
        if validate:
            model_tracer = trace(_CheckAgainstGuide(replayed, guide_trace))
        else:
            model_tracer = _Record()
            model_tracer.fn = replayed
        if particles is None:
            model_tracer(*args, **kwargs)
        else:
            with particles:
                model_tracer(*args, **kwargs)
        return model_tracer.trace, guide_tracer.trace

    def _particle_dim(self, plan: ELBOPlan) -> int | None:
        if self.vectorize_particles and self.num_particles > 1:
            return -(plan.max_plate_nesting + 1)
        return None

    def _first_enum_dim(self, plan: ELBOPlan) -> int:
        """Where the first summed-out site's values lie: left of the plates and particles."""
        pdim = self._particle_dim(plan)
        return (pdim if pdim is not None else -plan.max_plate_nesting) - 1

    def prepare(self, model: Callable, guide: Callable, args: tuple, kwargs: dict) -> ELBOPlan:
        """Run guide and model once, eagerly, with checks; fix the plan of later runs."""
        with torch_validation(False), _Seeded():
            try:
                model_trace, guide_trace = self._traces(model, guide, args, kwargs, None, True)
            except Exception as error:
                if hasattr(error, "add_note"):
                    error.add_note("(raised while tracing the guide, then the model, once)")
                raise
            plan = self._check(model_trace, guide_trace)
            self._extend_plan(plan, model_trace, guide_trace)
            if self.vectorize_particles and self.num_particles > 1:
                try:
                    _, _, state = self.compute(model, guide, args, kwargs, plan, None)
                except Exception as error:
                    raise ValueError(
                        f"running the model and guide for {self.num_particles} particles at "
                        f"once failed ({type(error).__name__}: {error}). Particles are a "
                        f"batch dimension at dim {self._particle_dim(plan)}, left of the "
                        f"model's plates, so tensors must broadcast from the right (e.g. "
                        f"(x * w).sum(-1), not x @ w). Or use vectorize_particles=False."
                    ) from error
                self._check_particle_shapes(model, guide, args, kwargs, plan)
            else:
                _, _, state = self.compute(model, guide, args, kwargs, plan, None)
            plan.initial_state = {k: v.detach() for k, v in state.items()}
        return plan

    def _check_particle_shapes(self, model, guide, args, kwargs, plan: ELBOPlan) -> None:
        """Raise where a site's log density has more batch dims than the plates and the
        particle dim: the model broadcast a latent drawn per particle against another
        dim, and the loss would count each observation once per pair of particles."""
        model_trace, guide_trace = self._traces(model, guide, args, kwargs, plan)
        allowed = plan.max_plate_nesting + 1 + len(plan.enumerated) + len(plan.guide_enumerated)
        for where, tr in (("model", model_trace), ("guide", guide_trace)):
            for name, site in tr.items():
                if site.type != "sample":
                    continue
                shape = tuple(site_log_prob(site).shape)
                if len(shape) > allowed:
                    raise ValueError(
                        f"site {name!r} of the {where} has a log density of shape {shape} "
                        f"with {self.num_particles} particles drawn at once along dim "
                        f"{self._particle_dim(plan)}, but its plates allow {allowed} batch "
                        f"dims (particles included): a value drawn per particle was "
                        f"broadcast against another dim (e.g. w.unsqueeze(-2) where the "
                        f"particle dim is -2). Write the model so that latent values can "
                        f"carry extra batch dims on the left, or use "
                        f"vectorize_particles=False."
                    )

    def _check(self, model_trace: Trace, guide_trace: Trace) -> ELBOPlan:
        model_latents = [n for n, s in model_trace.items() if _is_latent(s)]
        guide_latents = [n for n, s in guide_trace.items() if _is_latent(s)]
        for name in model_latents:
            if name not in guide_trace or guide_trace[name].type != "sample":
                if self._sums_out(model_trace[name]):
                    continue
                site = model_trace[name]
                summable = enumerable(site)
                how = site.infer.get("enumerate")
                if summable:
                    advice = (
                        f". A discrete site the guide leaves out is summed out of the "
                        f"model by TraceEnum_ELBO (as in Pyro), not by {type(self).__name__}"
                    )
                elif how is not None and site.fn.support.is_discrete:
                    advice = (
                        f". Its infer={{'enumerate': {how!r}}} asks for an enumeration that "
                        f"probtorch does not do: TraceEnum_ELBO sums out discrete sites the "
                        f"guide leaves out in parallel (make it 'parallel' or remove it)"
                    )
                else:
                    advice = ""
                raise ValueError(
                    f"latent site {name!r} of the model ({type(site.fn).__name__})"
                    f" is not sampled by the guide; the guide must sample every latent site "
                    f"of the model (or observe the site in the model with obs=)" + advice
                )
        for name in guide_latents:
            site = guide_trace[name]
            if site.infer.get("is_auxiliary", False):
                continue
            if name not in model_trace or model_trace[name].type != "sample":
                raise ValueError(
                    f"the guide samples site {name!r}, which is not a sample site of the "
                    f"model; guide sites must match the model's latent sites by name (mark "
                    f"extra guide sites infer={{'is_auxiliary': True}})"
                )
        self._check_reparam(guide_trace, guide_latents)
        guide_factors = [n for n, s in guide_trace.items() if s.type == "sample" and s.is_observed]
        for name in guide_factors:
            if name in model_trace and model_trace[name].type == "sample":
                raise ValueError(
                    f"the guide observes site {name!r}, which is a site of the model too: "
                    f"observations belong to the model (the guide's would be taken as part "
                    f"of log q); remove it from the guide"
                )
            if getattr(guide_trace[name].fn, "has_rsample", False) is not True:
                raise ValueError(
                    f"the guide's factor (observed site) {name!r} is part of log q; "
                    f"{type(self).__name__} differentiates it along reparameterized draws, "
                    f"so declare that it comes from them: pt.factor({name!r}, log_factor, "
                    f"has_rsample=True)"
                )
        nesting = 0
        for tr in (model_trace, guide_trace):
            for site in tr.values():
                if site.type == "sample":
                    nesting = max(nesting, site_log_prob(site).dim())
                    for frame in site.cond_indep_stack:
                        nesting = max(nesting, -frame.dim)
        return ELBOPlan(
            max_plate_nesting=nesting,
            guide_latents=tuple(guide_latents),
            guide_factors=tuple(guide_factors),
            model_sites=tuple(n for n, s in model_trace.items() if s.type == "sample"),
        )

    def _sums_out(self, site: Message) -> bool:
        """Whether the model's latent ``site``, which the guide does not sample, is summed
        out of the model's density (TraceEnum_ELBO)."""
        return False

    def _check_reparam(self, guide_trace: Trace, guide_latents: list) -> None:
        for name in guide_latents:
            fn = guide_trace[name].fn
            if not fn.has_rsample:
                raise ValueError(
                    f"guide site {name!r} ({type(fn).__name__}) is not reparameterizable "
                    f"(has_rsample is False), so {type(self).__name__} cannot differentiate "
                    f"through its draws; use TraceGraph_ELBO (score-function gradients), or "
                    f"a reparameterizable guide distribution"
                )

    def _extend_plan(self, plan: ELBOPlan, model_trace: Trace, guide_trace: Trace) -> None:
        pass

    def compute(self, model, guide, args, kwargs, plan: ELBOPlan, state: dict | None):
        """``(surrogate_loss, loss, new_state)`` for the current params; pure, compilable."""
        num = self.num_particles
        if self.vectorize_particles or num == 1:
            model_trace, guide_trace = self._traces(model, guide, args, kwargs, plan)
            run_plan = self._plan_of_run(plan, model_trace, guide_trace)
            return self._from_traces(model_trace, guide_trace, run_plan, state)
        surrogates, losses = [], []
        for _ in range(num):
            model_trace, guide_trace = self._traces(model, guide, args, kwargs, plan)
            run_plan = self._plan_of_run(plan, model_trace, guide_trace)
            surrogate, loss, state = self._from_traces(model_trace, guide_trace, run_plan, state)
            surrogates.append(surrogate)
            losses.append(loss)
        return self._combine_sequential(surrogates, losses, state)

    def _plan_of_run(self, plan: ELBOPlan, model_trace: Trace, guide_trace: Trace) -> ELBOPlan:
        """``plan``, where the run has its sample sites; where its new sites are those of a
        loop over a subsampled plate's rows and ``plan.sites_may_change``, the plan of this
        run, made and checked from its traces as :meth:`prepare` makes the first; else a
        ValueError naming the sites (and the looped plates)."""
        other = _other_sites(plan, model_trace, guide_trace)
        if other is None:
            return plan
        if _looped(other[1], other[2]) and plan.sites_may_change and _replannable(plan):
            run_plan = self._check(model_trace, guide_trace)
            # (the traces' dims hold the particles: the plates' nesting is the plan's)
            run_plan.max_plate_nesting = plan.max_plate_nesting
            self._extend_plan(run_plan, model_trace, guide_trace)
            if _replannable(run_plan):
                return run_plan
        raise _other_sites_error(plan, *other)

    def _combine_sequential(self, surrogates, losses, state):
        return torch.stack(surrogates).mean(), torch.stack(losses).mean(), state

    def _elbo_particles(self, model_trace, guide_trace, plan, kl_sites=frozenset()):
        """Per-particle ELBO: ``(num_particles,)`` when vectorized, else ``()``."""
        pdim, num = self._particle_dim(plan), self.num_particles
        elbo = self._model_log_density(model_trace, plan, kl_sites)
        for name in plan.guide_latents:
            site = guide_trace[name]
            if name in kl_sites:
                kl = kl_divergence(site.fn, model_trace[name].fn)
                if site.mask is False:
                    kl = torch.zeros_like(kl)
                elif site.mask is not None and site.mask is not True:
                    kl = torch.where(site.mask, kl, torch.zeros((), dtype=kl.dtype))
                if site.scale is not None:
                    kl = site.scale * kl
                term = -_per_particle(kl, pdim, num)
            else:
                term = -_per_particle(site_log_prob(site), pdim, num)
            elbo = term if elbo is None else elbo + term
        for name in plan.guide_factors:
            term = -_per_particle(site_log_prob(guide_trace[name]), pdim, num)
            elbo = term if elbo is None else elbo + term
        return elbo

    def _model_log_density(self, model_trace, plan, kl_sites=frozenset()):
        """``log p`` of the model's sites (but ``kl_sites``) per particle."""
        pdim, num = self._particle_dim(plan), self.num_particles
        elbo = None
        for name in plan.model_sites:
            if name in kl_sites:
                continue
            term = _per_particle(site_log_prob(model_trace[name]), pdim, num)
            elbo = term if elbo is None else elbo + term
        return elbo

    def _from_traces(self, model_trace, guide_trace, plan, state):
        elbo = self._elbo_particles(model_trace, guide_trace, plan)
        loss = -elbo.mean()
        return loss, loss, {}


class Trace_ELBO(ELBO):
    """The standard ELBO estimator: ``E_q[log p(x, z) - log q(z)]`` by reparameterized draws.

    Every guide site must be reparameterizable (``has_rsample``); for discrete or otherwise
    non-reparameterizable guide sites use :class:`TraceGraph_ELBO`.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("z", dist.Normal(0.0, 1.0))
        >>> def guide():
        ...     pt.sample("z", dist.Normal(0.0, 1.0))   # the exact posterior: ELBO = log p = 0
        >>> abs(Trace_ELBO(num_particles=4).loss(model, guide))
        0.0
    """


class TraceEnum_ELBO(ELBO):
    """Trace_ELBO with the model's discrete latent sites that the guide leaves out summed
    out of the model's density (Pyro's ``TraceEnum_ELBO``, with the enumeration in the
    model): ``E_q[log sum_z p(x, z, theta) - log q(theta)]``, the sum exact, by parallel
    enumeration over the plates (:mod:`probtorch.inference.enumeration`, as HMC/NUTS sum
    them out). A site is summed out whether or not it is marked
    ``infer={"enumerate": "parallel"}``; it needs a finite support. An autoguide leaves
    such sites out when built on ``pt.handlers.block(model, hide=[...])``.

    A discrete guide site marked ``infer={"enumerate": "parallel"}``
    (``pt.handlers.config_enumerate`` marks them all, as Pyro's; a semi-supervised VAE's
    label) takes all its values at once, and
    each term of ``log p - log q`` that depends on it is weighted by its guide probability:
    the expectation over it is exact, its gradient too. A guide that enumerates cannot be
    combined with discrete model sites summed out in one ELBO; unmarked discrete guide
    sites are refused (TraceGraph_ELBO takes them with score-function gradients).

    Args:
        num_particles, vectorize_particles: as for :class:`Trace_ELBO`.
        max_plate_nesting: Pyro's argument; found from the model's plates here (a value
            below what the model uses is refused).

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model(y):
        ...     loc = pt.sample("loc", dist.Normal(0.0, 1.0))
        ...     with pt.plate("data", len(y)):
        ...         z = pt.sample("z", dist.Bernoulli(0.5))
        ...         pt.sample("y", dist.Normal(loc * (2 * z - 1), 1.0), obs=y)
        >>> def guide(y):
        ...     pt.sample("loc", dist.Delta(torch.tensor(0.0)))
        >>> y = torch.tensor([0.5, -1.0])
        >>> round(TraceEnum_ELBO().loss(model, guide, y), 4)  # -log N(0|0,1) - log N(y|0,1)
        3.3818
    """

    def __init__(
        self,
        num_particles: int = 1,
        vectorize_particles: bool = True,
        max_plate_nesting: int | None = None,
        **pyros,
    ):
        super().__init__(
            num_particles, vectorize_particles, max_plate_nesting=max_plate_nesting, **pyros
        )

    def _sums_out(self, site: Message) -> bool:
        return enumerable(site)

    def _check_reparam(self, guide_trace: Trace, guide_latents: list) -> None:
        drawn = []
        for name in guide_latents:
            site = guide_trace[name]
            if _guide_enumerated(site):
                continue
            if site.fn.support.is_discrete:
                raise ValueError(
                    f"guide site {name!r} is discrete ({type(site.fn).__name__}) and not "
                    f"enumerated: mark it infer={{'enumerate': 'parallel'}} (or decorate "
                    f"the guide with pt.handlers.config_enumerate) and TraceEnum_ELBO takes "
                    f"the expectation over its values exactly; or leave it out of the "
                    f"guide, and TraceEnum_ELBO sums it out of the model (for an autoguide, "
                    f"build it on "
                    f"pt.handlers.block(model, hide=[{name!r}])); or use TraceGraph_ELBO"
                )
            drawn.append(name)
        super()._check_reparam(guide_trace, drawn)

    def _extend_plan(self, plan: ELBOPlan, model_trace: Trace, guide_trace: Trace) -> None:
        if self.max_plate_nesting is not None and self.max_plate_nesting < plan.max_plate_nesting:
            raise ValueError(
                f"max_plate_nesting={self.max_plate_nesting}, but the model's sites use "
                f"{plan.max_plate_nesting} batch dims; leave it out (probtorch finds it)"
            )
        plan.enumerated = tuple(
            name
            for name, site in model_trace.items()
            if _is_latent(site) and name not in guide_trace and self._sums_out(site)
        )
        plan.guide_enumerated = tuple(
            name for name in plan.guide_latents if _guide_enumerated(guide_trace[name])
        )
        if plan.enumerated and plan.guide_enumerated:
            raise ValueError(
                f"TraceEnum_ELBO: the guide enumerates {list(plan.guide_enumerated)} and the "
                f"model's {list(plan.enumerated)} are summed out of the model; probtorch does "
                f"one or the other in one ELBO, not both. Sample those model sites in the "
                f"guide too (enumerated), or leave the guide's out of it"
            )

    def _model_log_density(self, model_trace, plan, kl_sites=frozenset()):
        if not plan.enumerated:
            return super()._model_log_density(model_trace, plan, kl_sites)
        pdim, num = self._particle_dim(plan), self.num_particles
        factors = [Factor.of_site(model_trace[name]) for name in plan.model_sites]
        nesting = plan.max_plate_nesting + (pdim is not None)
        if pdim is None:
            return sum_out(factors, nesting)
        per_particle = sum_out(factors, nesting, keep={_PARTICLES}).reshape(-1)
        return per_particle.expand(num) if per_particle.numel() == 1 else per_particle

    def _elbo_particles(self, model_trace, guide_trace, plan, kl_sites=frozenset()):
        if not plan.guide_enumerated:
            return super()._elbo_particles(model_trace, guide_trace, plan, kl_sites)
        return _enumerated_guide_elbo(
            model_trace, guide_trace, plan, self._particle_dim(plan), self.num_particles
        )


def _guide_enumerated(site: Message) -> bool:
    """Whether a guide site is enumerated by TraceEnum_ELBO (marked, as Pyro asks)."""
    return site.infer.get("enumerate") == "parallel" and enumerable(site)


def _enumerated_guide_elbo(model_trace, guide_trace, plan, pdim, num) -> torch.Tensor:
    """The ELBO per particle with the guide's enumerated sites' expectation exact: each
    term of ``log p - log q`` (one site's) that varies with some of them is weighted by
    their joint guide probability (computed by :func:`sum_out` from the guide's factors of
    those sites, with the term's plates kept) and summed over their values."""
    nesting = plan.max_plate_nesting + (pdim is not None)
    variables: dict[int, Variable] = {}
    for name in plan.guide_enumerated:
        for dim, variable in guide_trace[name].extra["enum_vars"].items():
            if variables.setdefault(dim, variable) != variable:
                raise ValueError(
                    f"guide sites {variables[dim].name!r} and {variable.name!r} are enumerated "
                    f"along the same dim {dim} (a pt.markov loop in the guide): TraceEnum_ELBO "
                    f"enumerates a guide's sites each along a dim of its own"
                )
    guide_factors = [
        Factor.of_site(guide_trace[name], apply_scale=False) for name in plan.guide_enumerated
    ]
    costs = [(model_trace[name], 1.0) for name in plan.model_sites]
    costs += [(guide_trace[name], -1.0) for name in plan.guide_latents + plan.guide_factors]
    weights: dict[tuple, torch.Tensor] = {}
    elbo = None
    for site, sign in costs:
        cost = sign * site_log_prob(site)
        plates = frozenset(frame.name for frame in site.cond_indep_stack)
        names = []
        for dim in range(-cost.dim(), -nesting):
            if cost.shape[dim] > 1:
                if dim not in variables:
                    raise ValueError(
                        f"site {site.name!r} has log density shape {tuple(cost.shape)}, "
                        f"whose dim {dim} is neither a plate's nor an enumerated guide "
                        f"site's ({', '.join(repr(v.name) for v in variables.values())}): "
                        f"declare every batch dim with a pt.plate"
                    )
                names.append(variables[dim].name)
        if names:
            key = (frozenset(names), plates)
            if key not in weights:
                weights[key] = sum_out(guide_factors, nesting, keep=plates, target=set(names))
            log_weight = weights[key]
            # a value of probability 0 adds nothing (its cost may be -inf: 0 * -inf is
            # nan, and so would its gradient be, without the cost set to 0 first)
            cost = torch.where(log_weight > -math.inf, cost, torch.zeros((), dtype=cost.dtype))
            cost = log_weight.exp() * cost
        term = _per_particle(cost, pdim, num)
        elbo = term if elbo is None else elbo + term
    return elbo


class TraceMeanField_ELBO(ELBO):
    """Trace_ELBO with the KL term of each latent site in closed form where torch has it.

    For a latent site whose guide and model distributions have a registered
    ``torch.distributions.kl_divergence``, the term ``E_q[log p(z) - log q(z)]`` is replaced by
    ``-KL(q || p)`` (less variance); other sites are estimated by Monte Carlo as in
    :class:`Trace_ELBO`. Correct when the guide is mean-field (each guide factor does not
    depend on other latent draws through the model's structure), as in Pyro.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("z", dist.Normal(0.0, 1.0))
        >>> def guide():
        ...     pt.sample("z", dist.Normal(1.0, 1.0))
        >>> TraceMeanField_ELBO().loss(model, guide)   # KL(N(1,1) || N(0,1)) = 0.5
        0.5
    """

    def _extend_plan(self, plan, model_trace, guide_trace):
        analytic = set()
        for name in plan.guide_latents:
            if name not in model_trace or _is_delta(guide_trace[name].fn):
                continue
            try:
                kl_divergence(guide_trace[name].fn, model_trace[name].fn)
            except NotImplementedError:
                continue
            analytic.add(name)
        plan.analytic_kl = frozenset(analytic)

    def _from_traces(self, model_trace, guide_trace, plan, state):
        elbo = self._elbo_particles(model_trace, guide_trace, plan, plan.analytic_kl)
        loss = -elbo.mean()
        return loss, loss, {}


class RenyiELBO(ELBO):
    """The Renyi alpha-divergence bound (Li & Turner 2016); ``alpha=0`` is the IWAE bound.

    ``loss = -1/(1-alpha) * log mean_k exp((1-alpha) * (log p(x, z_k) - log q(z_k)))`` over
    ``num_particles`` draws ``z_k``. Where every site of the model and guide lies in the
    same plates (a VAE's local latents), each element of those plates is weighted on its
    own, ``sum_i log mean_k w_ik``, as in Pyro (and its subsampling scale multiplies the
    sum; with a subsampled plate the particles must be vectorized, so that they share the
    subsample). Larger ``num_particles`` gives a tighter bound;
    ``alpha=1`` would be the ELBO (use :class:`Trace_ELBO`). Guide sites must be
    reparameterizable.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     z = pt.sample("z", dist.Normal(0.0, 1.0))
        ...     pt.sample("x", dist.Normal(z, 1.0), obs=torch.tensor(1.0))
        >>> def guide():   # the exact posterior N(1/2, 1/2): every weight is p(x)
        ...     pt.sample("z", dist.Normal(0.5, 0.5**0.5))
        >>> round(RenyiELBO(alpha=0.0, num_particles=5).loss(model, guide), 4)   # -log N(1|0,2)
        1.5155
    """

    def __init__(
        self, alpha: float = 0.0, num_particles: int = 2, vectorize_particles=True, **pyros
    ):
        if float(alpha) == 1.0:
            raise ValueError("RenyiELBO: alpha=1 is the ordinary ELBO; use Trace_ELBO")
        super().__init__(num_particles, vectorize_particles, **pyros)
        self.alpha = float(alpha)

    def _bound(self, elbo_particles: torch.Tensor) -> torch.Tensor:
        scaled = (1.0 - self.alpha) * elbo_particles
        log_mean = torch.logsumexp(scaled, 0) - math.log(scaled.shape[0])
        return log_mean / (1.0 - self.alpha)

    def _from_traces(self, model_trace, guide_trace, plan, state):
        pointwise = self._pointwise_elbo(model_trace, guide_trace, plan)
        sequential = not self.vectorize_particles and self.num_particles > 1
        if pointwise is not None:
            elbo, scale = pointwise
            if sequential:  # one particle's: combined with the others' below
                return scale, -elbo, {}
            if self._particle_dim(plan) is not None:
                elbo = elbo.movedim(self._particle_dim(plan), 0)
            else:
                elbo = elbo.unsqueeze(0)
            loss = -scale * self._bound(elbo).sum()
            return loss, loss, {}
        elbo = self._elbo_particles(model_trace, guide_trace, plan)
        loss = -self._bound(elbo.reshape(-1))
        return loss, loss, {}

    def _combine_sequential(self, surrogates, losses, state):
        if losses[0].dim() > 0:  # per element of the plates (see _pointwise_elbo)
            loss = -surrogates[0] * self._bound(-torch.stack(losses)).sum()
            return loss, loss, state
        # Sequential particles: each ``loss`` is -elbo of one particle (num_particles=1 bound).
        loss = -self._bound(-torch.stack(losses))
        return loss, loss, state

    def _pointwise_elbo(self, model_trace, guide_trace, plan):
        """Where every site lies in the same plates (a VAE's or IWAE's local latents), as
        Pyro's: ``(log p - log q)`` per particle and per element of those plates (their dims
        kept, each weighted on its own: ``sum_i log mean_k w_ik``, a tighter bound than
        weighting whole traces), and the sites' common subsampling scale, applied outside
        the log-mean; None where no plate holds every site, or the scales differ."""
        sites = [model_trace[n] for n in plan.model_sites]
        sites += [guide_trace[n] for n in plan.guide_latents + plan.guide_factors]
        common = None
        for site in sites:
            frames = {f for f in site.cond_indep_stack if f.dim is not None}
            frames = {(f.name, f.dim, f.size != f.subsample_size) for f in frames}
            common = frames if common is None else common & frames
        sequential = not self.vectorize_particles and self.num_particles > 1
        subsampled = sorted(
            {f.name for site in sites for f in site.cond_indep_stack if f.size != f.subsample_size}
        )
        if sequential and subsampled:
            raise ValueError(
                f"RenyiELBO with vectorize_particles=False draws a new subsample of plate(s) "
                f"{subsampled} for each particle, and weights of particles on other data do "
                f"not make a bound; use vectorize_particles=True (all particles on one "
                f"subsample) or the full data"
            )
        # (the particles' own plate is no data plate)
        common = {(name, dim, sub) for name, dim, sub in common or () if name != _PARTICLES}
        if not common:
            return None
        scales = set()
        for site in sites:
            scale = 1.0 if site.scale is None else site.scale
            if isinstance(scale, torch.Tensor):
                if scale.numel() != 1:
                    return None
                scale = float(scale)
            scales.add(float(scale))
        if len(scales) != 1:
            return None
        keep = {dim for _, dim, _ in common}
        pdim = self._particle_dim(plan)
        if pdim is not None:
            keep.add(pdim)
        elbo = None
        for i, site in enumerate(sites):
            sign = 1.0 if i < len(plan.model_sites) else -1.0  # log p, then log q
            term = sign * _sum_to(site_log_prob(site, apply_scale=False), keep)
            elbo = term if elbo is None else elbo + term
        # the same rank for every particle's (dims of size one up to the outermost kept)
        width = -min(keep)
        elbo = elbo.reshape((1,) * (width - elbo.dim()) + tuple(elbo.shape))
        return elbo, scales.pop()


class TraceGraph_ELBO(ELBO):
    """ELBO with score-function gradients for non-reparameterizable guide sites.

    For each guide site without ``rsample`` (discrete sites, or ``fn.has_rsample_(False)``) the
    gradient estimate adds ``log q(z) * (downstream cost - baseline)``, where the downstream
    cost holds only the terms of the sites whose log density is computed from ``z``
    (Pyro's provenance tracking, by one tracked run of the guide and model; where ``z`` is
    read into Python, as in ``if z > 0``, every site after it) and, within a plate, only
    the same plate element (Rao-Blackwellization over plates). Baselines are set
    per guide site, as in Pyro::

        pt.sample("z", dist.Bernoulli(p), infer={"baseline": {
            "use_decaying_avg_baseline": True, "baseline_beta": 0.9}})
        pt.sample("z", dist.Bernoulli(p), infer={"baseline": {
            "nn_baseline": net, "nn_baseline_input": x}})   # net registered with pt.module
        pt.sample("z", dist.Bernoulli(p), infer={"baseline": {"baseline_value": b}})

    A neural or given baseline is fitted by adding ``(cost - baseline)^2`` to the surrogate
    loss; the decaying average is SVI state (updated after it is used, so the estimate
    stays unbiased).

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     z = pt.sample("z", dist.Bernoulli(0.5))
        ...     pt.sample("x", dist.Normal(z, 1.0), obs=torch.tensor(1.0))
        >>> def guide():
        ...     p = pt.param("p", torch.tensor(0.5), constraint=dist.constraints.unit_interval)
        ...     pt.sample("z", dist.Bernoulli(p))
        >>> loss = TraceGraph_ELBO().differentiable_loss(model, guide)
        >>> loss.requires_grad
        True
    """

    def _check_reparam(self, guide_trace, guide_latents):
        pass

    def prepare(self, model: Callable, guide: Callable, args: tuple, kwargs: dict) -> ELBOPlan:
        plan = super().prepare(model, guide, args, kwargs)
        if plan.downstream:
            _keep_dependent_costs(plan, model, guide, args, kwargs)
        return plan

    def _extend_plan(self, plan, model_trace, guide_trace):
        model_order = {n: i for i, n in enumerate(plan.model_sites)}
        guide_order = {n: i for i, n in enumerate(guide_trace)}
        latents = list(plan.guide_latents)
        for i, name in enumerate(latents):
            if guide_trace[name].fn.has_rsample:
                continue
            # the guide's factors after the site are part of its downstream log q
            factors = [f for f in plan.guide_factors if guide_order[f] > guide_order[name]]
            guide_nodes = tuple(latents[i:]) + tuple(factors)
            # Pyro's dense graph: a model site depends on every model site before it.
            first = min((model_order[n] for n in guide_nodes if n in model_order), default=None)
            children = ()
            if first is not None:
                children = tuple(
                    n for n in plan.model_sites[first + 1 :] if n not in set(guide_nodes)
                )
            plan.downstream[name] = (guide_nodes, children)
            options = guide_trace[name].infer.get("baseline", {})
            unknown = set(options) - {
                "use_decaying_avg_baseline",
                "baseline_beta",
                "nn_baseline",
                "nn_baseline_input",
                "baseline_value",
            }
            if unknown:
                raise ValueError(f"guide site {name!r}: unknown baseline option(s) {unknown}")
            if "nn_baseline" in options and "nn_baseline_input" not in options:
                raise ValueError(
                    f"guide site {name!r}: nn_baseline needs nn_baseline_input (the input of "
                    f"the baseline network)"
                )

    def _from_traces(self, model_trace, guide_trace, plan, state):
        pdim, num = self._particle_dim(plan), self.num_particles
        initializing = state is None
        new_state = {}
        elbo = self._elbo_particles(model_trace, guide_trace, plan)
        surrogate = elbo
        for name in plan.guide_latents:
            site = guide_trace[name]
            if not site.fn.has_rsample:
                # No pathwise entropy term for non-reparameterized sites (as Pyro): its
                # expected gradient is zero; the score term below carries the entropy.
                log_q = _per_particle(site_log_prob(site), pdim, num)
                surrogate = surrogate + (log_q - log_q.detach())
        baseline_loss = None
        for name, (guide_nodes, children) in plan.downstream.items():
            site = guide_trace[name]
            keep = {f.dim for f in site.cond_indep_stack}
            # a term keeps a dim only where it lies in the same plate, by name: another
            # plate at the same dim is not conditionally independent of the site
            plates = {(f.name, f.dim) for f in site.cond_indep_stack}
            cost = None
            terms = []
            for node in guide_nodes:
                if node in model_trace:
                    terms.append((model_trace[node], site_log_prob(model_trace[node])))
                terms.append((guide_trace[node], -site_log_prob(guide_trace[node])))
            for node in children:
                terms.append((model_trace[node], site_log_prob(model_trace[node])))
            for term_site, value in terms:
                frames = {(f.name, f.dim) for f in term_site.cond_indep_stack}
                shared = {dim for _, dim in plates & frames}
                value = _sum_to(value, shared)
                cost = value if cost is None else cost + value
            cost = cost.detach()
            score = _sum_to(distribution_log_prob(site.fn, site.value), keep)
            options = site.infer.get("baseline", {})
            baseline = None
            if options.get("use_decaying_avg_baseline", False):
                beta = float(options.get("baseline_beta", 0.9))
                reduced = (
                    cost if pdim is None or cost.dim() < -pdim else cost.mean(pdim, keepdim=True)
                )
                key = f"baseline_avg/{name}"
                old = torch.zeros_like(reduced) if initializing else state[key]
                new_state[key] = beta * old + (1 - beta) * reduced
                baseline = old
            for key in ("nn_baseline", "baseline_value"):
                if key not in options:
                    continue
                if key == "nn_baseline":
                    # its input detached (as Pyro): fitting the baseline must not move
                    # the guide's params that the input is computed from
                    detached = tree_map_only(
                        torch.Tensor, torch.Tensor.detach, options["nn_baseline_input"]
                    )
                    value = options["nn_baseline"](detached)
                else:
                    value = options["baseline_value"]
                value = torch.as_tensor(value)
                fit = ((cost - value) ** 2).sum() / num
                baseline_loss = fit if baseline_loss is None else baseline_loss + fit
                baseline = value if baseline is None else baseline + value
            advantage = cost if baseline is None else cost - baseline
            surrogate = surrogate + _per_particle(score * advantage.detach(), pdim, num)
        surrogate_loss = -surrogate.mean()
        if baseline_loss is not None:
            surrogate_loss = surrogate_loss + baseline_loss
        # the surrogate's value differs from -ELBO only by terms with zero expectation
        return surrogate_loss, -elbo.mean(), new_state


class _TrackDraws(Messenger):
    """Draw the named latent sites as :class:`~.provenance.Provenance` tensors."""

    def __init__(self, fn: Callable, names: set):
        super().__init__(fn)
        self.names = names

    def process_message(self, msg: Message) -> None:
        if msg.type == "sample" and msg.name in self.names and msg.value is None:
            value = msg.fn.sample(msg.kwargs.get("sample_shape", ()))
            # with the sites its distribution was computed from (a chain of discrete draws)
            msg.value = Provenance(value, sources(value) | {msg.name})


def _keep_dependent_costs(plan: ELBOPlan, model, guide, args: tuple, kwargs: dict) -> None:
    """Pyro's provenance tracking for ``TraceGraph_ELBO``: narrow each non-reparameterized
    site's downstream costs (``plan.downstream``, the dense graph: every site after it) to
    the sites whose log density is computed from its draw, found by one run of the guide
    and model with the draws tracked. The terms left out have zero expected product with
    the site's score, so the gradient stays unbiased and its variance falls. A site whose
    tracked value was read into Python (``bool(z > 0)``, ``z.item()``: control flow the
    tracking cannot follow), or a run that fails, keeps the dense graph."""
    tracked = set(plan.downstream)
    try:
        with torch_validation(False), torch.no_grad(), _Seeded(), tracking() as escaped:
            guide_tracer = _Record()
            guide_tracer.fn = _TrackDraws(guide, tracked)
            guide_tracer(*args, **kwargs)
            model_tracer = _Record()
            model_tracer.fn = replay(model, trace=guide_tracer.trace)
            model_tracer(*args, **kwargs)
            found = [
                {
                    n: sources(site_log_prob(site))
                    for n, site in tr.trace.items()
                    if site.type == "sample"
                }  # fmt: skip
                for tr in (guide_tracer, model_tracer)
            ]
    except Exception:  # (a model the tracking cannot run: the dense graph is unbiased)
        return
    guide_sources, model_sources = found
    everything = frozenset(tracked)  # what a site the run did not see may depend on
    for name, (guide_nodes, children) in plan.downstream.items():
        if name in escaped:
            continue
        kept_guide = tuple(
            n
            for n in guide_nodes
            if name in guide_sources.get(n, everything) or name in model_sources.get(n, ())
        )
        kept_children = tuple(n for n in children if name in model_sources.get(n, everything))
        plan.downstream[name] = (kept_guide, kept_children)


def _jit_version(base: type) -> type:
    """Pyro's ``Jit`` version of ``base``: SVI compiles every ELBO's step here, so it is
    ``base``, taking Pyro's ``ignore_jit_warnings`` and ``jit_options`` (unused)."""

    def __init__(self, *args, ignore_jit_warnings: bool = False, jit_options=None, **kwargs):
        base.__init__(self, *args, **kwargs)

    name = f"Jit{base.__name__}"
    doc = (
        f"Pyro's ``{name}``, for ported code: :class:`{base.__name__}` (SVI compiles every "
        f"ELBO's step; ``ignore_jit_warnings`` and ``jit_options`` are accepted and unused)."
    )
    return type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


JitTrace_ELBO = _jit_version(Trace_ELBO)
JitTraceEnum_ELBO = _jit_version(TraceEnum_ELBO)
JitTraceGraph_ELBO = _jit_version(TraceGraph_ELBO)
JitTraceMeanField_ELBO = _jit_version(TraceMeanField_ELBO)
