"""Summaries and ArviZ export of MCMC draws (ESS and R-hat come from ArviZ)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from scipy import stats as scipy_stats

from ..._caller import warn_at_caller
from ...validation import num_event_dims

__all__ = ["ess_and_rhat", "summary_table", "to_inference_data", "site_dims", "split_rank_rhat"]

# ArviZ's names for the sample statistics.
_ARVIZ_STATS = {
    "diverging": "diverging",
    "energy": "energy",
    "tree_depth": "tree_depth",
    "num_steps": "n_steps",
    "step_size": "step_size",
    "accept_prob": "acceptance_rate",
    "mean_accept_prob": "mean_accept_prob",  # NumPyro's, kept under its name by from_numpyro
}


def _numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def _arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def split_rank_rhat(draws: np.ndarray) -> float:
    """Rank-normalized split R-hat (Vehtari et al. 2021) of ``(chains, draws)`` values.

    It gives ArviZ's ``az.rhat`` for two or more chains; ArviZ returns nan for one chain,
    where this splits the single chain into halves as NumPyro and Stan do.
    """
    draws = np.asarray(draws, dtype=np.float64)
    half = draws.shape[1] // 2
    if half < 2 or not np.all(np.isfinite(draws)):
        return float("nan")
    split = np.concatenate([draws[:, :half], draws[:, -half:]])

    def z_scale(x):
        ranks = scipy_stats.rankdata(x, method="average").reshape(x.shape)
        return scipy_stats.norm.ppf((ranks - 3 / 8) / (x.size + 1 / 4))

    def rhat(x):
        n = x.shape[1]
        within = np.mean(np.var(x, axis=1, ddof=1))
        between = n * np.var(np.mean(x, axis=1), ddof=1)
        return float(np.sqrt((between / within + n - 1) / n))

    bulk = rhat(z_scale(split))
    tail = rhat(z_scale(np.abs(split - np.median(split))))
    return max(bulk, tail)


def ess_and_rhat(value: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Bulk ESS and R-hat (ArviZ's) per scalar of draws ``(chains, draws, *shape)``, each
    of ``shape``; nan for a constant scalar (a fixed deterministic), and with one chain the
    R-hat of its two halves (ArviZ's needs two chains)."""
    az = _arviz()
    draws = _numpy(value).astype(np.float64)
    C, S = draws.shape[:2]
    flat = draws.reshape(C, S, -1)
    ess, rhat = [], []
    for i in range(flat.shape[2]):
        scalar = flat[:, :, i]
        if np.ptp(scalar) == 0:  # a constant has no ESS or R-hat
            ess.append(math.nan)
            rhat.append(math.nan)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ess.append(float(az.ess(scalar, method="bulk")))
            rhat.append(split_rank_rhat(scalar) if C == 1 else float(az.rhat(scalar)))
    shape = draws.shape[2:]
    return np.array(ess).reshape(shape), np.array(rhat).reshape(shape)


def summary_table(samples: dict[str, torch.Tensor], prob: float = 0.9) -> str:
    """A table of mean, sd, central ``prob`` interval, median, bulk ESS and R-hat per scalar.

    ``samples`` map site names to draws of shape ``(chains, draws, ...)``; ``prob`` lies
    in (0, 1).
    """
    if not 0 < prob < 1:
        raise ValueError(
            f"prob is the mass of the central interval and must lie in (0, 1), got {prob!r}"
        )
    low_q, high_q = (1 - prob) / 2, 1 - (1 - prob) / 2
    width = max([16] + [len(n) + 2 + 4 * max(len(v.shape) - 2, 0) for n, v in samples.items()])
    header = (
        f"{'':>{width}} {'mean':>9} {'std':>9} {f'{100 * low_q:g}%':>9} {'50%':>9} "
        f"{f'{100 * high_q:g}%':>9} {'n_eff':>9} {'r_hat':>7}"
    )
    lines = [header]
    for name, value in samples.items():
        draws = _numpy(value).astype(np.float64)
        C, S = draws.shape[:2]
        flat = draws.reshape(C, S, -1)
        ess, rhat = (a.reshape(-1) for a in ess_and_rhat(value))
        shape = draws.shape[2:]
        for i in range(flat.shape[2]):
            column = flat[:, :, i].reshape(-1)
            index = np.unravel_index(i, shape) if shape else ()
            label = name + (f"[{','.join(map(str, index))}]" if shape else "")
            q = np.quantile(column, [low_q, 0.5, high_q])
            lines.append(
                f"{label:>{width}} {column.mean():9.2f} {column.std(ddof=1):9.2f} {q[0]:9.2f} "
                f"{q[1]:9.2f} {q[2]:9.2f} {ess[i]:9.1f} {rhat[i]:7.3f}"
            )
    return "\n".join(lines)


def _plates_fit(shape: tuple, event_dim: int, plates: dict) -> bool:
    """Whether every plate that reaches into the batch dims of ``shape`` spans one of its
    size there (or of size 1: a value broadcast along it)."""
    batch_ndim = len(shape) - event_dim
    return all(
        shape[batch_ndim + dim] in (1, frame.subsample_size)
        for dim, frame in plates.items()
        if -dim <= batch_ndim
    )


def _event_dim(site, shape: tuple, plates: dict) -> int:
    """A site's event dims: its distribution's; a deterministic site's ``event_dim``, or
    the fewest that line its batch dims up with the plates' sizes (0 if none do)."""
    if site.type == "sample" and site.fn is not None:
        return num_event_dims(site.fn)
    given = (site.kwargs or {}).get("event_dim")
    if given is not None:
        return given
    fits = (e for e in range(len(shape) + 1) if _plates_fit(shape, e, plates))
    return next(fits, 0)


def site_dims(site) -> list[str]:
    """ArviZ dim names for a site's value: the enclosing plate's name for a batch dim that a
    plate spans (at its size), ``{site}_dim_{i}`` (ArviZ's default) for the others."""
    shape = tuple(site.value.shape)
    plates = {frame.dim: frame for frame in site.cond_indep_stack}
    batch_ndim = len(shape) - _event_dim(site, shape, plates)
    dims = []
    for i, size in enumerate(shape):
        frame = plates.get(i - batch_ndim) if i < batch_ndim else None
        dims.append(
            frame.name if frame and size == frame.subsample_size else f"{site.name}_dim_{i}"
        )
    return dims


def _counted(site) -> torch.Tensor | None:
    """Where a site's observations count (its batch shape), if a mask leaves some out: the
    site's ``mask`` handler and a masked distribution (``fn.mask(m)``, ``obs_mask``)."""
    batch_shape = site.value.shape[: site.value.dim() - num_event_dims(site.fn)]
    counted = torch.ones(batch_shape, dtype=torch.bool, device=site.value.device)
    for mask in (site.mask, getattr(site.fn, "_mask", None)):
        if mask is False:
            counted = torch.zeros_like(counted)
        elif isinstance(mask, torch.Tensor):
            counted = counted & torch.broadcast_to(mask.bool(), batch_shape)
    return None if bool(counted.all()) else counted


def _chains_and_draws(value: torch.Tensor, chains: int, draws: int, name: str) -> np.ndarray:
    """Draws ``(chains * draws, ...)`` or ``(chains, draws, ...)`` as ``(chains, draws, ...)``;
    any other leading size ``n`` as one chain, ``(1, n, ...)``, with a warning (as ArviZ's
    converters): its draws are not the posterior's."""
    if value.shape[0] == chains * draws:
        return _numpy(value.reshape((chains, draws) + value.shape[1:]))
    if value.dim() >= 2 and tuple(value.shape[:2]) == (chains, draws):
        return _numpy(value)
    warn_at_caller(
        f"posterior_predictive[{name!r}] has shape {tuple(value.shape)}, which is neither "
        f"({chains * draws}, ...) nor ({chains}, {draws}, ...) for the posterior's {chains} "
        f"chains of {draws} draws: stored as one chain of {value.shape[0]} draws, not "
        f"matched to the posterior's"
    )
    return _numpy(value)[None]


def to_inference_data(
    potential,
    samples: dict[str, torch.Tensor],
    stats: dict[str, torch.Tensor],
    posterior_predictive: dict | None = None,
    prior: dict | None = None,
    coords: dict | None = None,
    dims: dict | None = None,
    factors: bool = True,
    constant_data: dict | None = None,
    predictions: dict | None = None,
    predictions_constant_data: dict | None = None,
    pred_dims: dict | None = None,
    log_likelihood: bool = True,
):
    """Build ``arviz.InferenceData``: posterior, sample_stats, observed_data and
    log_likelihood (of the observed sites and, with ``factors``, as NumPyro's, of the
    ``pt.factor`` sites), and posterior_predictive, prior and prior_predictive where given.

    Dims are named after the plates, or as ``dims`` names them (a site's whole value, event
    dims included; its log likelihood takes the batch dims of them); observations a mask
    leaves out (``obs_mask``, ``handlers.mask``) are left out of ``log_likelihood`` and
    ``observed_data``, whose counted entries lie along one dim ``{site}_counted`` (for LOO),
    in place of the batch dims ``dims`` gives the site; so do its predictive draws.
    ``constant_data``, ``predictions`` and ``predictions_constant_data`` (named by
    ``pred_dims``) make those groups, as ``arviz.from_numpyro``'s; ``log_likelihood=False``
    leaves that group out. Dims and coords that do not fit the values are refused, naming
    the site.
    """
    az = _arviz()
    trace = potential.prototype_trace
    C, S = next(iter(samples.values())).shape[:2] if samples else (0, 0)
    site_dim_names = {
        name: site_dims(site)
        for name, site in trace.items()
        if site.type in ("sample", "deterministic") and isinstance(site.value, torch.Tensor)
    }
    user_dims = dict(dims or {})

    held: dict[str, set] = {"dims": set(), "pred_dims": set()}  # names a group holds

    def dataset(values: dict, default_dims, extra_dims=None, group="", given=user_dims):
        named = {**site_dim_names, **given, **(extra_dims or {})}
        named = {k: named[k] for k in values if k in named}
        _check_dims(group, values, named, 2 if default_dims is None else 0, coords, (C, S))
        held["pred_dims" if given is not user_dims else "dims"].update(values)
        return az.dict_to_dataset(
            values, library=None, coords=coords, dims=named, default_dims=default_dims
        )

    groups = {
        "posterior": dataset({k: _numpy(v) for k, v in samples.items()}, None, group="posterior")
    }
    sample_stats = {_ARVIZ_STATS[k]: _numpy(v) for k, v in stats.items() if k in _ARVIZ_STATS}
    if "potential_energy" in stats:
        sample_stats["lp"] = -_numpy(stats["potential_energy"])
    groups["sample_stats"] = az.dict_to_dataset(sample_stats, library=None, coords=coords)

    # the observed sites and the factors (pt.factor), which count in the log likelihood
    # (as NumPyro's) but observe nothing: they are left out of observed_data
    likelihood_sites = {
        name: site
        for name, site in trace.sample_sites(observed=True).items()
        if (factors or not site.infer.get("is_auxiliary", False))
        and not site.infer.get("prior_term", False)  # (NeuTraReparam's)
    }
    observed_sites = {
        name: site
        for name, site in likelihood_sites.items()
        if not site.infer.get("is_auxiliary", False)
    }
    counted = {name: _counted(site) for name, site in likelihood_sites.items()}
    observed, observed_dims, pointwise_dims = {}, {}, {}
    for name, site in likelihood_sites.items():
        value, batch_ndim = site.value, site.value.dim() - num_event_dims(site.fn)
        # the caller's dims name the whole value (as ArviZ's from_numpyro takes them); the
        # pointwise log likelihood has its batch dims only, and a masked site's counted
        # entries one dim of their own
        names = list(user_dims.get(name, site_dim_names[name]))
        if counted[name] is not None:
            value = value[counted[name]]
            names = [f"{name}_counted"] + names[batch_ndim:]
            batch_ndim = 1
        pointwise_dims[name] = names[:batch_ndim]
        if name in observed_sites:
            observed[name] = _numpy(value)
            observed_dims[name] = names
    if observed:
        groups["observed_data"] = dataset(observed, [], observed_dims, "observed_data")
    if samples and likelihood_sites and log_likelihood:
        flat = {k: v.reshape((C * S,) + v.shape[2:]) for k, v in samples.items()}
        log_likelihood = {}
        for name, value in potential.log_likelihood(flat).items():
            if name not in likelihood_sites:
                continue
            value = value.reshape((C, S) + value.shape[1:])
            if counted[name] is not None:
                value = value[:, :, counted[name]]
            log_likelihood[name] = _numpy(value)
        groups["log_likelihood"] = dataset(log_likelihood, None, pointwise_dims, "log_likelihood")

    def counted_only(values: dict) -> dict:
        """Predictive draws of a partly masked site at its counted entries, as in
        observed_data (so that ArviZ's checks pair each draw with its observation)."""
        return {
            k: v[(slice(None), slice(None), _numpy(counted[k]))]
            if counted.get(k) is not None
            else v
            for k, v in values.items()
        }

    if posterior_predictive:
        values = {k: _chains_and_draws(v, C, S, k) for k, v in posterior_predictive.items()}
        groups["posterior_predictive"] = dataset(
            counted_only(values), None, observed_dims, "posterior_predictive"
        )
    if prior:
        values = {k: _numpy(v)[None] for k, v in prior.items()}
        # an observed site, or the value that an obs_mask site combines
        observable = set(observed_sites) | {
            name.removesuffix("_observed") for name in observed_sites if name.endswith("_observed")
        }
        predictive = {k: v for k, v in values.items() if k in observable}
        latent = {k: v for k, v in values.items() if k not in observable}
        if latent:
            groups["prior"] = dataset(latent, None, group="prior")
        if predictive:
            groups["prior_predictive"] = dataset(
                counted_only(predictive), None, observed_dims, "prior_predictive"
            )
    given_pred = dict(pred_dims or {})
    if predictions:
        values = {k: _chains_and_draws(v, C, S, k) for k, v in predictions.items()}
        groups["predictions"] = dataset(values, None, group="predictions", given=given_pred)
    for group, data, given in (
        ("constant_data", constant_data, user_dims),
        ("predictions_constant_data", predictions_constant_data, given_pred),
    ):
        if data:
            values = {k: _numpy(torch.as_tensor(v)) for k, v in data.items()}
            groups[group] = dataset(values, [], group=group, given=given)
    for option, names in (("dims", user_dims), ("pred_dims", given_pred)):
        unknown = sorted(set(names) - held[option])
        if unknown:
            raise ValueError(
                f"to_inference_data: {option} names {unknown}, which no group holds; the "
                f"variables are {sorted(held[option])}"
            )
    return az.InferenceData(**groups)


def _check_dims(group: str, values: dict, named: dict, lead: int, coords, chains_draws):
    """Refuse dims that a value does not have and coords of another length than their
    dim, naming the site (ArviZ's errors name neither, or raise a bare KeyError)."""
    coords = coords or {}
    if lead:
        for dim, size in zip(("chain", "draw"), chains_draws, strict=True):
            if dim in coords and len(coords[dim]) != size:
                raise ValueError(
                    f"to_inference_data: coords[{dim!r}] has {len(coords[dim])} values for "
                    f"the run's {size} {dim}s"
                )
    for name, names in named.items():
        shape = values[name].shape[lead:]
        where = f"{name!r} in {group}" if group else repr(name)
        if len(names) > len(shape):
            raise ValueError(
                f"to_inference_data: dims for {where} name {len(names)} dims {list(names)}, "
                f"but its value has {len(shape)} (shape {tuple(shape)} per draw)"
            )
        for dim, size in zip(names, shape, strict=False):
            if dim in coords and len(coords[dim]) != size:
                raise ValueError(
                    f"to_inference_data: coords[{dim!r}] has {len(coords[dim])} values, but "
                    f"dim {dim!r} of {where} has size {size} (shape {tuple(shape)} per draw)"
                )
