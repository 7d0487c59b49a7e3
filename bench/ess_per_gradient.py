"""Effective draws per gradient evaluation: probtorch's NUTS transition against NumPyro's.

Sampling speed is gradient evaluations per second times effective draws per gradient. This
script measures the second factor alone, on a 25-dimensional Gaussian with scales 0.5 to 2
(so trajectories must cover a range of lengths), 4 chains x 2000 draws per seed:

- ``--mode fixed``: step size 0.5, identity metric, no warmup: the transition kernels alone
  (the U-turn criterion decides every trajectory's length);
- ``--mode adapt``: 1000 warmup iterations with the default step-size and diagonal-metric
  adaptation of each library.

It prints, over the seeds, the mean and standard error of the bulk ESS per thousand
gradient evaluations, averaged over the 25 coordinates, their minimum, and for x**2.
``--numpyro-stan-criterion`` runs NumPyro with Stan's U-turn criterion (the full momentum
sum; NumPyro subtracts half of the two end momenta from it, Betancourt 2017, A.4.2).

Usage::

    python bench/ess_per_gradient.py --lib probtorch --mode fixed --seeds 10
    python bench/ess_per_gradient.py --lib numpyro --mode fixed --seeds 10
"""

from __future__ import annotations

import argparse
import os

import arviz as az
import numpy as np

D = 25
SCALES = np.linspace(0.5, 2.0, D)
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES = 4, 1000, 2000
# --mode fixed: the same NUTS options in both libraries
FIXED = dict(step_size=0.5, adapt_step_size=False, adapt_mass_matrix=False)


def run_probtorch(adapt: bool, seed: int):
    import torch

    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.inference import MCMC, NUTS

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    scales = torch.tensor(SCALES)

    def model():
        pt.sample("x", dist.Normal(torch.zeros(D), scales).to_event(1))

    kernel = NUTS(model) if adapt else NUTS(model, **FIXED)
    mcmc = MCMC(kernel, num_warmup=NUM_WARMUP if adapt else 0, num_samples=NUM_SAMPLES,
                num_chains=NUM_CHAINS, progress_bar=False, seed=seed)  # fmt: skip
    mcmc.run(extra_fields=("num_steps",))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    return draws, int(mcmc.get_extra_fields()["num_steps"].sum())


def use_stan_criterion_in_numpyro() -> None:
    """NumPyro's U-turn check with Stan's momentum sum: the half end momenta NumPyro takes
    out of the sum are put back before its check."""
    import jax
    import numpyro.infer.hmc_util as hmc_util

    numpyro_angle = hmc_util._momentum_angle

    def momentum_angle(inverse_mass_matrix, r_left, r_right, r_sum):
        if isinstance(inverse_mass_matrix, dict):  # per block: it calls this one per block
            return numpyro_angle(inverse_mass_matrix, r_left, r_right, r_sum)
        full = jax.tree.map(lambda s, a, b: s + (a + b) / 2, r_sum, r_left, r_right)
        return numpyro_angle(inverse_mass_matrix, r_left, r_right, full)

    hmc_util._momentum_angle = momentum_angle


def run_numpyro(adapt: bool, seed: int):
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    jax.config.update("jax_enable_x64", True)
    scales = jnp.asarray(SCALES)

    def model():
        numpyro.sample("x", dist.Normal(jnp.zeros(D), scales).to_event(1))

    kernel = NUTS(model) if adapt else NUTS(model, **FIXED)
    mcmc = MCMC(kernel, num_warmup=NUM_WARMUP if adapt else 0, num_samples=NUM_SAMPLES,
                num_chains=NUM_CHAINS, chain_method="vectorized", progress_bar=False)  # fmt: skip
    mcmc.run(jax.random.PRNGKey(seed), extra_fields=("num_steps",))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["x"])
    return draws, int(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum())


def bulk_ess(draws: np.ndarray) -> np.ndarray:
    """ArviZ's bulk ESS of each coordinate of ``draws`` (chains, draws, D)."""
    return np.asarray(az.ess(az.convert_to_dataset({"x": draws}), method="bulk")["x"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", choices=("probtorch", "numpyro"), required=True)
    parser.add_argument("--mode", choices=("fixed", "adapt"), default="fixed")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=200)
    parser.add_argument("--numpyro-stan-criterion", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    if args.numpyro_stan_criterion:
        use_stan_criterion_in_numpyro()
    run = run_probtorch if args.lib == "probtorch" else run_numpyro
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        draws, grads = run(args.mode == "adapt", seed)
        ess, ess_sq = bulk_ess(draws), bulk_ess(draws**2)
        rows.append((grads, 1e3 * ess.mean() / grads, 1e3 * ess.min() / grads,
                     1e3 * ess_sq.mean() / grads))  # fmt: skip
    rows = np.array(rows)
    se = rows.std(axis=0, ddof=1) / np.sqrt(len(rows))
    label = args.lib + (" (Stan's criterion)" if args.numpyro_stan_criterion else "")
    print(f"{label}, {args.mode}, {args.seeds} seeds: gradients {rows[:, 0].mean():.0f}; "
          f"ESS per 1000 gradients: mean over x {rows[:, 1].mean():.1f} +- {se[1]:.1f}, "
          f"min over x {rows[:, 2].mean():.1f} +- {se[2]:.1f}, "
          f"mean over x**2 {rows[:, 3].mean():.1f} +- {se[3]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
