"""``Predictive``: prior and posterior predictive draws, batched over samples.

The model runs with its observations removed (every observed sample site is drawn from its
distribution instead; ``factor`` sites and values fixed by ``pt.handlers.condition`` are
left alone), and with its latent sites
substituted by posterior draws: given ones (e.g. ``MCMC.get_samples()``), or draws from a
guide and its fitted params. With no draws at all it gives the prior predictive.

Batching: the model runs once for all ``S`` samples, inside an outer
plate of size ``S`` at batch dim ``-(max_plate_nesting + 1)``, where ``max_plate_nesting``
(the most batch dims of any sample site, plates included) is read from one unbatched run.
The model's own plates (automatic dims count from ``-1``) stay to the right of it. Each
latent draw gets its sample dim left of its batch dims; if the model fails that way (or a
site comes out with a shape that does not fit), it runs again with Pyro's layout, where a
vector latent ``w`` keeps shape ``(S, D)`` so that ``w @ X.T`` works. The model must
broadcast over the extra dim (use plates; avoid ``.item()`` and reshapes of latent
values). ``parallel=False`` runs the model once per sample in a Python loop and works for
every model (``X @ w`` with a vector latent ``w``, for one). The default, ``parallel=None``,
batches where the model allows and otherwise runs the loop; ``parallel=True`` raises where
the model does not batch.

Randomness: ``predictive(*args, seed=0)`` is reproducible and leaves torch's global
generator as it was. Without ``seed`` the run draws its seed from torch's global generator
(so ``torch.manual_seed`` makes it reproducible too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from .._caller import warn_at_caller
from .._errors import explaining_rng_key
from ..handlers import Trace, seed, substitute, trace
from ..params import fitted_params
from ..primitives import deterministic, plate
from ..runtime import Message, Messenger, get_stack
from ..validation import num_event_dims
from .autoguide.base import AutoGuide
from .potential import Potential

__all__ = ["Predictive", "log_likelihood"]

_PARTICLE_PLATE = "_num_predictive_samples"
_RETURN = "_RETURN"  # in return_sites: the model's return value, as in Pyro


class _uncondition(Messenger):
    """Drop the observations of observed sample sites (not factors): they are drawn instead.
    Values fixed with ``pt.handlers.condition`` are kept, as Pyro's and NumPyro's
    ``Predictive`` keep them (a hyperparameter fixed before fitting, say).

    A distribution whose observation broadcast it to a larger batch shape is expanded to
    that shape, so that the draws have the shape of the data.
    """

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or not msg.is_observed or msg.infer.get("is_auxiliary"):
            return
        if msg.extra.get("conditioned"):
            # its value kept, as a given draw is (not an observation, which the batched
            # run would count once per sample)
            msg.is_observed = False
            return
        obs = msg.value
        if isinstance(obs, torch.Tensor):
            fn = msg.fn
            obs_batch = obs.shape[: max(obs.dim() - num_event_dims(fn), 0)]
            try:
                batch_shape = torch.broadcast_shapes(obs_batch, fn.batch_shape)
            except RuntimeError:
                batch_shape = fn.batch_shape
            if batch_shape != fn.batch_shape:
                msg.fn = fn.expand(batch_shape)
        msg.value = None
        msg.is_observed = False


class _check_draw_shapes(Messenger):
    """Name a posterior draw whose shape is not its site's in the model (before the model
    fails further on with a bare broadcasting error)."""

    def __init__(self, fn, draws: dict, sample_shape: tuple, batch_ndims: int):
        super().__init__(fn)
        self.draws, self.sample_shape, self.batch_ndims = draws, sample_shape, batch_ndims

    def postprocess_message(self, msg: Message) -> None:
        if msg.type != "sample" or msg.name not in self.draws or msg.is_observed:
            return
        value, fn = self.draws[msg.name], msg.fn
        sample_shape = tuple(msg.kwargs.get("sample_shape", ()))
        expected = sample_shape + tuple(fn.batch_shape + fn.event_shape)
        try:
            fits = torch.broadcast_shapes(value.shape, expected) == expected
        except RuntimeError:
            fits = False
        if fits:
            return
        hint = ""
        subsampled = [f for f in msg.cond_indep_stack if f.subsample_size != f.size]
        if subsampled:
            frame = subsampled[0]
            hint = (
                f" The site is in plate {frame.name!r}, which subsamples {frame.subsample_size} "
                f"of {frame.size}: give draws of the subsample's size"
            )
        elif self.batch_ndims == 1 and value.dim() > len(expected) and len(self.sample_shape) == 1:
            hint = (
                " If the draws are grouped by chain (MCMC.get_samples(group_by_chain=True): "
                "(chains, draws, ...)), pass batch_ndims=2, or take get_samples() without "
                "group_by_chain"
            )
        lead = "x".join(str(n) for n in self.sample_shape)
        raise ValueError(
            f"posterior_samples[{msg.name!r}]: each of the {lead} draws has shape "
            f"{tuple(value.shape)}, but site {msg.name!r} ({type(fn).__name__}) has shape "
            f"{expected} in the model with these arguments.{hint}"
        )


def _is_latent(site: Message) -> bool:
    return site.type == "sample" and not site.is_observed and not site.infer.get("is_auxiliary")


def _batch_ndim(site: Message) -> int:
    return site.value.dim() - num_event_dims(site.fn)


def _max_plate_nesting(tr: Trace) -> int:
    nesting = 0
    for site in tr.values():
        if site.type != "sample":
            continue
        nesting = max(nesting, _batch_ndim(site))
        for frame in site.cond_indep_stack:
            nesting = max(nesting, -frame.dim)
    return nesting


def _check_samples(posterior_samples: dict, num_samples: int | None, batch_ndims: int):
    """The leading (sample) shape shared by all ``posterior_samples``."""
    if not isinstance(posterior_samples, dict) or not posterior_samples:
        raise ValueError("posterior_samples must be a non-empty dict {site: (S, ...) tensor}")
    shapes = {}
    for name, value in posterior_samples.items():
        if not isinstance(value, torch.Tensor) or value.dim() < batch_ndims:
            got = f" of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""
            raise ValueError(
                f"posterior_samples[{name!r}] must be a tensor with {batch_ndims} leading "
                f"sample dimension{'s' if batch_ndims > 1 else ''} (batch_ndims="
                f"{batch_ndims}), got {type(value).__name__}{got}"
            )
        shapes[name] = tuple(value.shape[:batch_ndims])
    if len(set(shapes.values())) > 1:
        shown = ", ".join(
            f"{name!r}: {shape[0] if batch_ndims == 1 else shape}" for name, shape in shapes.items()
        )
        raise ValueError(
            f"posterior_samples must all have the same leading (sample) "
            f"dimension{'s' if batch_ndims > 1 else ''}; got {shown}"
        )
    shape = next(iter(shapes.values()))
    if num_samples is not None and int(num_samples) != math.prod(shape):
        warn_at_caller(
            f"num_samples={num_samples} but posterior_samples hold {math.prod(shape)} draws; "
            f"using the {math.prod(shape)} draws (slice the samples for fewer)",
            UserWarning,
        )
    return shape


class Predictive:
    """Draws from the prior or posterior predictive distribution of a model.

    Args:
        model: the model function.
        posterior_samples: ``{site: (S, ...) tensor}`` of posterior draws of latent sites
            (e.g. ``MCMC.get_samples()``); sites the model lacks are ignored.
        guide: a guide (an autoguide, or any callable drawing the latent sites) to draw
            ``num_samples`` posterior samples from; not together with ``posterior_samples``.
        params: ``{name: constrained value}`` of the guide's (and the model's) params, e.g.
            SVI's ``result.params``. Without it, those of the SVI that last fitted the
            guide or the model are used, as Pyro's one param store holds
            them after ``svi.step``; inside ``pt.param_scope(store)``, or where no SVI
            fitted them, params are read from the active store.
        num_samples: the number of draws; required without ``posterior_samples``.
        return_sites: the sites to return (latent, observed or deterministic; ``"_RETURN"``
            for the model's return value, a tensor, as in Pyro). By default, as in NumPyro,
            the sample sites that are not in the posterior draws (observed sites, and
            latent ones the draws lack) and all deterministic sites.
        parallel: ``True`` runs the model once for all samples (see the module docs) and
            raises where the model does not batch; ``False`` runs it once per sample; the
            default ``None`` batches where the model allows and loops otherwise.
        batch_ndims: the number of leading sample dims of ``posterior_samples``: 1 for
            ``(S, ...)`` draws, 2 for ``(chains, draws, ...)`` ones (e.g.
            ``MCMC.get_samples(group_by_chain=True)``), which the results then keep.
        infer_discrete: as NumPyro's: draw the discrete latent sites that HMC/NUTS summed
            out (a mixture's assignments) from their distribution given each posterior
            draw and the data the model is called with
            (:meth:`~probtorch.inference.potential.Potential.sample_discrete`), return them,
            and predict the other sites given them. Without it they are drawn from their
            prior given the draw, as new data would be.

    Calling it with the model's arguments (and ``seed=`` for reproducible draws) returns
    ``{site: (S, ...) tensor}``.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model(n, y=None):
        ...     mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        ...     with pt.plate("data", n):
        ...         pt.sample("y", dist.Normal(mu, 0.1), obs=y)
        >>> prior = Predictive(model, num_samples=500)(3, seed=0)
        >>> prior["y"].shape
        torch.Size([500, 3])
        >>> post = Predictive(model, posterior_samples={"mu": torch.full((4,), 5.0)})
        >>> out = post(3, y=torch.zeros(3), seed=0)
        >>> sorted(out), bool((out["y"] - 5.0).abs().max() < 1.0)
        (['y'], True)
    """

    def __init__(
        self,
        model: Callable,
        posterior_samples: dict | None = None,
        guide: Callable | None = None,
        params: dict | None = None,
        num_samples: int | None = None,
        return_sites: Sequence[str] | None = None,
        parallel: bool | None = None,
        batch_ndims: int = 1,
        infer_discrete: bool = False,
    ):
        if not callable(model):
            raise TypeError(f"Predictive needs a callable model, got {model!r}")
        if posterior_samples is not None and guide is not None:
            raise ValueError("Predictive takes posterior_samples or guide, not both")
        if isinstance(batch_ndims, bool) or not isinstance(batch_ndims, int) or batch_ndims < 1:
            raise ValueError(f"batch_ndims must be an integer >= 1, got {batch_ndims!r}")
        if posterior_samples is not None:
            self._sample_shape = _check_samples(posterior_samples, num_samples, batch_ndims)
            num_samples = math.prod(self._sample_shape)
        elif batch_ndims != 1:
            raise ValueError(
                f"batch_ndims={batch_ndims} applies to posterior_samples; without them the "
                f"draws have one leading dim of size num_samples"
            )
        elif num_samples is None:
            raise ValueError(
                "Predictive needs num_samples when no posterior_samples are given (for the "
                "prior predictive, or the number of draws from the guide)"
            )
        num_samples = int(num_samples)
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if posterior_samples is None:
            self._sample_shape = (num_samples,)
        if return_sites is not None:
            if isinstance(return_sites, str):
                raise TypeError(f"return_sites must be a list of names, got {return_sites!r}")
            return_sites = list(return_sites)
        self.model = model
        self.posterior_samples = posterior_samples
        self.guide = guide
        self.params = params
        self.num_samples = num_samples
        self.return_sites = return_sites
        if parallel is not None and not isinstance(parallel, bool):
            raise TypeError(f"parallel must be True, False or None, got {parallel!r}")
        self.parallel = parallel
        self.batch_ndims = batch_ndims
        self.infer_discrete = bool(infer_discrete)

    def __call__(self, *args, seed: int | None = None, **kwargs) -> dict[str, torch.Tensor]:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        params = self._params_of_call()
        call = "Predictive(...)(*args, **kwargs)"
        with explaining_rng_key(args, call, "its seed= argument"):
            with torch.no_grad(), _seed(int(seed)):
                samples, subsamples = self._posterior_draws(args, kwargs, params)
                discrete = self._discrete_draws(samples, args, kwargs, int(seed), params)
                out = self._predict({**samples, **discrete}, subsamples, args, kwargs, params)
                if self.return_sites is None:
                    out = {**discrete, **out}
        return {
            name: value.reshape(self._sample_shape + value.shape[1:]) for name, value in out.items()
        }

    def _params_of_call(self) -> dict | None:
        """The params this call substitutes: those given, else (where the caller chose no
        store with ``param_scope``) those of the SVI that last fitted the guide, or the
        model, as Pyro's one param store would hold them after ``svi.step``; else None (the
        active store)."""
        if self.params is not None:
            return self.params
        return fitted_params(self.guide, self.model)

    # -- posterior draws -------------------------------------------------------------
    def _posterior_draws(self, args, kwargs, params) -> tuple[dict, dict]:
        """The posterior draws ``{site: (S, ...)}``, and the indices of the guide's
        subsampled plates ``{plate: indices}``, one subsample for every draw, which the
        model's plates then take too (as in SVI, where the model replays the guide's)."""
        if self.posterior_samples is not None:
            lead = self.batch_ndims
            samples = {
                name: value.reshape((self.num_samples,) + value.shape[lead:])
                for name, value in self.posterior_samples.items()
            }
            return samples, {}
        if self.guide is None:
            return {}, {}
        if isinstance(self.guide, AutoGuide):
            self.guide._ensure_prototype(args, kwargs)
            # (without params given it reads its fitted store itself, as guide.median() does)
            draws = self.guide.sample_posterior(self.num_samples, params=self.params)
            return self._subsampled(draws, args, kwargs, params)
        guide = self.guide
        if params is not None:
            guide = substitute(guide, data=params)
        proto = trace(guide).get_trace(*args, **kwargs)
        indices = _subsample_indices(proto)
        guide = substitute(guide, data=indices)
        names = [name for name, site in proto.items() if _is_latent(site)]
        draws = _run(guide, {}, self.num_samples, proto, names, self.parallel, args, kwargs)
        return draws, indices

    def _subsampled(self, draws: dict, args, kwargs, params) -> tuple[dict, dict]:
        """An autoguide's full-size draws cut to the rows of the subsamples this call of the
        model takes (its plates' own or its arguments'), and those plates' indices."""
        model = self.model if params is None else substitute(self.model, data=params)
        rows = _RowsOfSubsample(model, draws)
        rows(*args, **kwargs)
        cut = {}
        for name, value in draws.items():
            for dim, plate_name in rows.cuts.get(name, ()):
                value = value.index_select(dim, rows.indices[plate_name])
            cut[name] = value
        return cut, rows.indices

    def _discrete_draws(self, samples, args, kwargs, rng_seed, params) -> dict[str, torch.Tensor]:
        """With ``infer_discrete``: the summed-out discrete sites drawn given each draw."""
        if not self.infer_discrete:
            return {}
        potential = _potential_of_draws(
            self.model,
            params,
            args,
            kwargs,
            samples,
            "Predictive(infer_discrete=True) draws the discrete sites given the continuous "
            "ones, but the posterior draws lack",
        )
        return potential.sample_discrete(samples, seed=rng_seed, num_draws=self.num_samples)

    # -- the model ---------------------------------------------------------------------
    def _predict(self, samples, subsamples, args, kwargs, params) -> dict[str, torch.Tensor]:
        model = self.model
        if self.return_sites is not None and _RETURN in self.return_sites:
            model = _record_return(model)
        model = _uncondition(model)
        if params is not None:
            model = substitute(model, data=params)
        model = substitute(model, data=subsamples)
        first = {name: value[0] for name, value in samples.items()}
        checked = model  # a guide's draws are shaped by the model's sites
        if self.posterior_samples is not None:
            checked = _check_draw_shapes(model, first, self._sample_shape, self.batch_ndims)
        proto = trace(substitute(checked, data=first)).get_trace(*args, **kwargs)
        names = self._return_names(proto, samples)
        # The model's own subsampled plates: one subsample for every draw, batched or not.
        model = substitute(model, data=_subsample_indices(proto))
        return _run(model, samples, self.num_samples, proto, names, self.parallel, args, kwargs)

    def _return_names(self, proto: Trace, samples: dict) -> list[str]:
        sites = {
            name: site
            for name, site in proto.items()
            if (site.type == "sample" and not site.infer.get("is_auxiliary"))
            or site.type == "deterministic"
        }
        if self.return_sites is None:
            return [
                name
                for name, site in sites.items()
                if site.type == "deterministic" or name not in samples
            ]
        unknown = [name for name in self.return_sites if name not in sites]
        if unknown:
            raise ValueError(
                f"return_sites {unknown} are not sample or deterministic sites of the model; "
                f"its sites are {list(sites)}"
            )
        return list(self.return_sites)


class _RowsOfSubsample(Messenger):
    """Runs the model with a guide's first full-size draw at each latent site, cut to the
    rows of each enclosing subsampled plate. Records ``cuts[site]``, the ``(dim, plate)``
    pairs it cut along (dims from the right, so they apply to all draws at once), and the
    ``indices`` of those plates."""

    def __init__(self, fn, draws: dict):
        super().__init__(fn)
        self.draws = draws
        self.cuts: dict[str, list[tuple[int, str]]] = {}
        self.indices: dict[str, torch.Tensor] = {}

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or msg.is_observed or msg.name not in self.draws:
            return
        value = self.draws[msg.name][0]
        event_dim = num_event_dims(msg.fn)
        cuts = []
        for handler in get_stack():
            if not (isinstance(handler, plate) and handler.selects_rows):
                continue
            cut = handler.rows_of(value, event_dim, f"site {msg.name!r}'s guide draw")
            if cut is not value:
                cuts.append((handler.dim - event_dim, handler.name))
                self.indices[handler.name] = handler.indices
            value = cut
        self.cuts[msg.name] = cuts
        msg.value = value


def _subsample_indices(tr: Trace) -> dict[str, torch.Tensor]:
    """``{plate: indices}`` of the plates that drew a subsample in the run ``tr``."""
    return {
        name: site.value
        for name, site in tr.items()
        if site.type == "plate" and site.args[1] < site.args[0]
    }


def _record_return(model: Callable) -> Callable:
    """``model`` with its return value recorded as the deterministic site ``"_RETURN"``
    (Pyro's name for it in ``return_sites``)."""

    def recorded(*args, **kwargs):
        value = model(*args, **kwargs)
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"return_sites has {_RETURN!r}, the model's return value, but the model "
                f"returned a {type(value).__name__}: return a tensor (or record each value "
                f"with pt.deterministic)"
            )
        deterministic(_RETURN, value)
        return value

    return recorded


def _seed(rng_seed: int) -> seed:
    return seed(rng_seed=rng_seed)


def _run(fn, samples, num_samples, proto, names, parallel, args, kwargs):
    """Values of the sites ``names`` over ``num_samples`` runs of ``fn`` with ``samples``."""
    if parallel is False:
        return _run_loop(fn, samples, num_samples, names, args, kwargs)
    nesting = _max_plate_nesting(proto)
    first_error = None
    for rule in ("batch", "shape"):
        try:
            tr, out = _run_parallel(fn, samples, num_samples, proto, names, args, kwargs, rule)
            _check_per_sample(fn, tr, out, proto, samples, num_samples, names, args, kwargs)
            return out
        except Exception as error:  # noqa: BLE001  (the first layout's error is reported)
            first_error = first_error or error
    if parallel is None:
        return _run_loop(fn, samples, num_samples, names, args, kwargs)
    raise RuntimeError(
        f"Predictive(parallel=True) runs the model once for all {num_samples} samples, with "
        f"the samples along batch dim {-(nesting + 1)}, and that run failed: "
        f"{type(first_error).__name__}: {first_error}. The model must broadcast over that dim "
        f"(use plates; name the dims of reductions such as x.sum(-1); avoid .item() and "
        f"reshapes of latent values), or pass parallel=False (or leave parallel out) to run "
        f"it once per sample."
    ) from first_error


def _run_loop(fn, samples, num_samples, names, args, kwargs):
    draws = {name: [] for name in names}
    for i in range(num_samples):
        data = {name: value[i] for name, value in samples.items()}
        tr = trace(substitute(fn, data=data)).get_trace(*args, **kwargs)
        for name in names:
            draws[name].append(tr[name].value)
    return {name: torch.stack(values) for name, values in draws.items()}


def _run_parallel(fn, samples, num_samples, proto, names, args, kwargs, rule):
    """One batched run with the sample dim placed by ``rule``:

    - ``"batch"``: left of all batch dims (a site with b batch dims gets
      ``max_plate_nesting - b`` ones after the sample dim), which suits elementwise use of
      event-shaped latents (``(x * w).sum(-1)``);
    - ``"shape"``: Pyro's layout, ``max_plate_nesting - value.dim()`` ones (none for a vector
      latent), which suits ``w @ X.T`` with a vector latent ``w``.
    Returns the batched run's trace and the values of ``names`` by sample. Raises if the
    model fails or a site comes out with a shape that does not fit.
    """
    nesting = _max_plate_nesting(proto)
    data = {}
    for name, value in samples.items():
        site = proto.get(name)
        if site is None or site.type != "sample":
            continue  # deterministic sites are recomputed; others are not in the model
        used = _batch_ndim(site) if rule == "batch" else site.value.dim()
        pad = (1,) * max(nesting - used, 0)
        data[name] = value.reshape((num_samples,) + pad + tuple(site.value.shape))
    with plate(_PARTICLE_PLATE, num_samples, dim=-(nesting + 1)):
        tr = trace(substitute(fn, data=data)).get_trace(*args, **kwargs)
    out = {}
    for name in names:
        value = tr[name].value
        shape = (num_samples,) + tuple(proto[name].value.shape)
        if tuple(value.shape) == shape:
            out[name] = value
        elif value.numel() == math.prod(shape):
            out[name] = value.reshape(shape)
        else:
            try:
                out[name] = torch.broadcast_to(value, shape).clone()
            except RuntimeError:
                raise RuntimeError(
                    f"site {name!r} has shape {tuple(value.shape)} when run for all samples "
                    f"at once, which does not fit its shape {tuple(proto[name].value.shape)} "
                    f"in one run"
                ) from None
    return tr, out


def _by_sample(value: torch.Tensor, num_samples: int, shape: torch.Size) -> torch.Tensor:
    """A batched run's ``value`` as ``(num_samples, *shape)``: the sample dim leftmost (as
    the batched run puts it), or absent where the value does not depend on the sample."""
    if value.numel() == num_samples * math.prod(shape):
        return value.reshape((num_samples,) + tuple(shape))
    return torch.broadcast_to(value.reshape(shape), (num_samples,) + tuple(shape))


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return bool(torch.equal(a, b))
    tol = 1e-10 if a.dtype == torch.float64 else 1e-4
    return bool(torch.allclose(a, b.to(a.dtype), rtol=tol, atol=tol, equal_nan=True))


def _summary(fn, value: torch.Tensor) -> list[torch.Tensor]:
    """What identifies a site's distribution for the check: its mean and variance where
    both are defined and finite, otherwise its log density at ``value``."""
    try:
        moments = [fn.mean, fn.variance]
    except (NotImplementedError, AttributeError, ValueError, RuntimeError):
        moments = []
    if moments and all(bool(torch.isfinite(m).all()) for m in moments):
        return moments
    return [fn.log_prob(value)]


def _check_per_sample(fn, tr, out, proto, samples, num_samples, names, args, kwargs):
    """Check a batched run against unbatched runs of its first and last sample.

    A model can run batched and still compute something else: a reduction without a dim
    (``theta.sum()``, ``theta - theta.mean()``) runs over the samples too, and a stack of
    scalars puts the sample dim second. Each checked sample runs alone on the batched run's
    values of every sample site; its deterministic sites must equal the batched ones, and
    the distributions of the sites it draws must equal the batched ones (:func:`_summary`;
    the given samples' own distributions need not batch: ``w @ X.T`` works with Pyro's
    layout, where they do not). Raises ``ValueError`` where they differ."""
    sites = {
        name: site
        for name, site in tr.items()
        if site.type in ("sample", "deterministic") and name in proto
    }
    values, batched_summary = {}, {}  # by sample; the drawn sites' distributions
    for name, site in sites.items():
        if site.type != "sample":
            continue
        try:
            values[name] = _by_sample(site.value, num_samples, proto[name].value.shape)
        except RuntimeError:
            raise ValueError(f"site {name!r} does not batch over the samples") from None
        if name not in samples:
            batched_summary[name] = _summary(site.fn, site.value)
    for i in sorted({0, num_samples - 1}):
        data = {name: value[i] for name, value in values.items()}
        one = trace(substitute(fn, data=data)).get_trace(*args, **kwargs)
        for name, site in sites.items():
            single = one.get(name)
            if single is None:
                raise ValueError(f"site {name!r} is missing from the run of sample {i} alone")
            if site.type == "deterministic" or name in names:
                batched = out[name][i] if name in out else None
                if batched is None:
                    batched = _by_sample(site.value, num_samples, single.value.shape)[i]
                if not _close(batched, single.value):
                    raise ValueError(
                        f"site {name!r}: the batched run's value for sample {i} differs from "
                        f"the model's value for that sample alone"
                    )
            if name in batched_summary:
                alone = _summary(single.fn, data[name])
                batched = [
                    _by_sample(b, num_samples, a.shape)[i]
                    for b, a in zip(batched_summary[name], alone)
                ]
                if len(batched) != len(alone) or not all(map(_close, batched, alone)):
                    raise ValueError(
                        f"site {name!r}: the batched run's distribution for sample {i} differs "
                        f"from the model's distribution for that sample alone (does the model "
                        f"reduce over a dim it does not name, e.g. x.sum() or x.mean()?)"
                    )


def _potential_of_draws(model, params, args, kwargs, draws: dict, lack: str) -> Potential:
    """The model's potential (``params`` substituted), where ``draws`` hold a value for each
    of its continuous latent sites; else a ValueError: ``lack``, then the missing sites."""
    if params is not None:
        model = substitute(model, data=params)
    potential = Potential(model, args, kwargs, compile=False)
    missing = [name for name in potential.site_names if name not in draws]
    if missing:
        raise ValueError(
            f"{lack} {missing} (the model's continuous latent sites: {potential.site_names}; "
            f"discrete sites with a finite support are summed out)"
        )
    return potential


def log_likelihood(
    model: Callable,
    posterior_samples: dict,
    *args,
    batch_ndims: int = 1,
    params: dict | None = None,
    **kwargs,
) -> dict[str, torch.Tensor]:
    """The log likelihood of each observation at each posterior draw, as NumPyro's
    ``numpyro.infer.util.log_likelihood``: ``{site: (*batch, *site_batch_shape)}`` for
    each observed site, masked, not scaled, with discrete latent sites summed out.

    For LOO or WAIC (``arviz.loo``) of draws that did not come from :class:`MCMC` (whose
    ``to_inference_data()`` holds them already): a guide's draws from :class:`Predictive`,
    or another sampler's. ``posterior_samples`` hold a value per latent site (constrained,
    with ``batch_ndims`` leading dims: 1 for ``(draws,)``, 2 for ``(chains, draws)``);
    other entries (deterministic sites) are ignored. ``params`` are substituted into
    ``pt.param`` sites of the model; without them (and outside a ``pt.param_scope``) those
    of the SVI that last fitted the model, as :class:`Predictive` reads them. The result
    carries no autograd history (the model's params require grad), as ``MCMC.to_inference_data``'s.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model(y):
        ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pt.plate("n", len(y)):
        ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> y = torch.tensor([0.5, -1.0, 2.0])
        >>> ll = log_likelihood(model, {"mu": torch.zeros(4, 100)}, y, batch_ndims=2)
        >>> ll["y"].shape
        torch.Size([4, 100, 3])
        >>> torch.allclose(ll["y"][0, 0], dist.Normal(0.0, 1.0).log_prob(y))
        True
    """
    if batch_ndims not in (1, 2):
        raise ValueError(f"batch_ndims must be 1 (draws) or 2 (chains, draws), got {batch_ndims}")
    if not posterior_samples:
        raise ValueError("log_likelihood needs posterior_samples: a dict of draws per site")
    if params is None:  # the model's params as the SVI that fitted it left them, if one did
        params = fitted_params(model)
    potential = _potential_of_draws(
        model, params, args, kwargs, posterior_samples, "posterior_samples lack the latent sites"
    )
    samples = {name: torch.as_tensor(value) for name, value in posterior_samples.items()}
    first_name = next(iter(samples))
    first = samples[first_name]
    if first.dim() < batch_ndims:
        raise ValueError(
            f"posterior_samples[{first_name!r}] has shape {tuple(first.shape)}, fewer than "
            f"batch_ndims={batch_ndims} dims"
        )
    batch = tuple(first.shape[:batch_ndims])
    num = math.prod(batch)
    flat = {}
    for site in potential.sites:
        value = samples[site.name]
        if tuple(value.shape) != batch + tuple(site.shape):
            raise ValueError(
                f"posterior_samples[{site.name!r}] has shape {tuple(value.shape)}; with "
                f"batch_ndims={batch_ndims} and draws of shape {batch} (from "
                f"{first_name!r}), site {site.name!r} of shape {tuple(site.shape)} "
                f"needs {batch + tuple(site.shape)}"
            )
        flat[site.name] = value.reshape((num,) + tuple(site.shape)).to(potential.dtype)
    # Without autograd history, as MCMC.to_inference_data exports it: the model's params
    # (pt.param, pt.module) require grad, and the result is data for ArviZ (``.numpy()``).
    with torch.no_grad():
        if not flat:  # every latent site is summed out: one evaluation serves every draw
            one = potential.log_likelihood({})
            return {k: v[0].expand(batch + tuple(v.shape[1:])).clone() for k, v in one.items()}
        out = potential.log_likelihood(flat)
    return {name: value.reshape(batch + tuple(value.shape[1:])) for name, value in out.items()}
