"""Summaries and ArviZ export of MCMC draws (ESS and R-hat come from ArviZ)."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from scipy import stats as scipy_stats

__all__ = ["summary_table", "to_inference_data"]

# ArviZ's names for the sample statistics.
_ARVIZ_STATS = {
    "diverging": "diverging",
    "energy": "energy",
    "tree_depth": "tree_depth",
    "num_steps": "n_steps",
    "step_size": "step_size",
    "accept_prob": "acceptance_rate",
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


def summary_table(samples: dict[str, torch.Tensor], prob: float = 0.9) -> str:
    """A table of mean, sd, central ``prob`` interval, median, bulk ESS and R-hat per scalar.

    ``samples`` map site names to draws of shape ``(chains, draws, ...)``.
    """
    az = _arviz()
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
        ess = [float(az.ess(flat[:, :, i], method="bulk")) for i in range(flat.shape[2])]
        if C == 1:  # ArviZ needs two chains (nan and a warning); split the one in halves
            rhat = [split_rank_rhat(flat[:, :, i]) for i in range(flat.shape[2])]
        else:
            rhat = [float(az.rhat(flat[:, :, i])) for i in range(flat.shape[2])]
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


def to_inference_data(potential, samples: dict[str, torch.Tensor], stats: dict[str, torch.Tensor]):
    """Build ``arviz.InferenceData``: posterior, sample_stats, observed_data, log_likelihood."""
    az = _arviz()
    posterior = {k: _numpy(v) for k, v in samples.items()}
    sample_stats = {_ARVIZ_STATS[k]: _numpy(v) for k, v in stats.items() if k in _ARVIZ_STATS}
    if "potential_energy" in stats:
        sample_stats["lp"] = -_numpy(stats["potential_energy"])
    trace = potential.prototype_trace
    observed = {
        name: _numpy(site.value)
        for name, site in trace.sample_sites(observed=True).items()
        if not site.infer.get("is_auxiliary", False)
    }
    log_likelihood = {}
    if samples and observed:
        C, S = next(iter(samples.values())).shape[:2]
        flat = {k: v.reshape((C * S,) + v.shape[2:]) for k, v in samples.items()}
        pointwise = potential.log_likelihood(flat)
        log_likelihood = {k: _numpy(v.reshape((C, S) + v.shape[1:])) for k, v in pointwise.items()}
    return az.from_dict(
        posterior=posterior,
        sample_stats=sample_stats,
        observed_data=observed or None,
        log_likelihood=log_likelihood or None,
    )
