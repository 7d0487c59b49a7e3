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

``--model`` takes one of bench/mcmc.py's models instead (its data, sampler options and
latent sites; adapted runs only, 1000 warmup + 1000 draws as there): it prints the
gradients per run, the min bulk ESS over every scalar (bench/mcmc.py's figure), per 1000
gradients, and how often each scalar was the worst.
``--numpyro-stan-criterion`` runs NumPyro with Stan's U-turn criterion (the full momentum
sum; NumPyro subtracts half of the two end momenta from it, Betancourt 2017, A.4.2).

Usage::

    python bench/ess_per_gradient.py --lib probtorch --mode fixed --seeds 10
    python bench/ess_per_gradient.py --lib numpyro --mode fixed --seeds 10
    python bench/ess_per_gradient.py --lib numpyro --model hier_reg --numpyro-stan-criterion
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

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


def _bench():
    """bench/mcmc.py, for its models and data."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mcmc as bench

    return bench


def run_bench_model(lib: str, model: str, seed: int, warmup_apart: bool = False):
    """One adapted run of bench/mcmc.py's ``model``: the latent draws (chain, draw, ...)
    and the number of gradient evaluations of the sampling phase."""
    bench = _bench()
    opts = bench.MODEL_OPTS[model]
    data = bench.make_data(model)
    if lib == "probtorch":
        import torch

        from probtorch.inference import MCMC, NUTS

        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float64)
        fn, args = bench.probtorch_model(model, data)
        mcmc = MCMC(NUTS(fn, **opts), num_warmup=NUM_WARMUP, num_samples=1000,
                    num_chains=NUM_CHAINS, progress_bar=False, seed=seed)  # fmt: skip
        mcmc.run(*args, extra_fields=("num_steps",))
        steps = mcmc.get_extra_fields()["num_steps"]
    else:
        import jax
        import numpyro
        from numpyro.infer import MCMC, NUTS

        numpyro.enable_x64()
        fn, args = bench.numpyro_model(model, data)
        mcmc = MCMC(NUTS(fn, **opts), num_warmup=NUM_WARMUP, num_samples=1000,
                    num_chains=NUM_CHAINS, chain_method="vectorized",
                    progress_bar=False)  # fmt: skip
        if warmup_apart:  # as bench/mcmc.py times the phases: warmup, then run
            mcmc.warmup(jax.random.PRNGKey(2 * seed), *args, extra_fields=("num_steps",))
            mcmc.run(jax.random.PRNGKey(2 * seed + 1), *args, extra_fields=("num_steps",))
        else:
            mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("num_steps",))
        steps = mcmc.get_extra_fields()["num_steps"]
    samples = mcmc.get_samples(group_by_chain=True)
    draws = {k: np.asarray(samples[k]) for k in bench.LATENT[model]}
    return draws, int(np.asarray(steps).sum())


def bench_model_main(args) -> None:
    bench = _bench()
    grads, ess, worst = [], [], collections.Counter()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        draws, g = run_bench_model(args.lib, args.model, seed, args.numpyro_warmup_apart)
        stats = bench.posterior_stats(args.model, draws)
        grads.append(g)
        ess.append(stats["min_bulk_ess"])
        worst[stats["min_ess_param"]] += 1
        print(f"  seed {seed}: gradients {g}, min bulk ESS {stats['min_bulk_ess']:.0f} "
              f"({stats['min_ess_param']})", flush=True)  # fmt: skip
    grads, ess = np.array(grads, float), np.array(ess)
    per = 1e3 * ess / grads
    se = lambda x: x.std(ddof=1) / np.sqrt(len(x))  # noqa: E731
    label = args.lib + (" (Stan's criterion)" if args.numpyro_stan_criterion else "")
    print(f"{label}, {args.model}, {args.seeds} seeds: gradients {grads.mean():.0f} +- "
          f"{se(grads):.0f}; min bulk ESS {ess.mean():.0f} +- {se(ess):.0f}; per 1000 "
          f"gradients {per.mean():.1f} +- {se(per):.1f}; worst scalar {dict(worst)}")  # fmt: skip


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
    parser.add_argument("--model", default=None,
                        help="one of bench/mcmc.py's models (adapted runs) instead of the "
                        "25-d Gaussian")  # fmt: skip
    parser.add_argument("--numpyro-warmup-apart", action="store_true",
                        help="with --model: NumPyro's warmup and draws in two calls with "
                        "their own keys, as bench/mcmc.py runs them")  # fmt: skip
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    if args.numpyro_stan_criterion:
        use_stan_criterion_in_numpyro()
    if args.model is not None:
        return bench_model_main(args)
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
