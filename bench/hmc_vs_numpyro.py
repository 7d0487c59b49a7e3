"""HMC against NumPyro's: seconds per transition in the sampling phase.

HMC with 10 leapfrog steps, 4 chains vectorized, float64, after a 200-transition warmup, on
the models of bench/mcmc.py: the fastest of two ``run`` calls of 3000 draws after
``warmup``. NumPyro compiles its sampling loop again in every ``run``; JAX's compile events
are taken out of its time (as mcmc.py does). Run each library in its own process on one
core, as bench/README.md describes for mcmc.py::

    XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
        PROBTORCH_EXECUTOR=quick taskset -c 1 python bench/hmc_vs_numpyro.py numpyro logreg
"""

import sys
import time

from harness import jax_compile_intervals
from mcmc import _union_length, make_data, numpyro_model, probtorch_model

NUM_STEPS, NUM_WARMUP, NUM_CHAINS, NUM_SAMPLES, REPEATS = 10, 200, 4, 3000, 2


def numpyro_seconds(name: str) -> list[float]:
    import jax
    import numpyro

    numpyro.enable_x64()
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    from numpyro.infer import HMC, MCMC

    compiles = jax_compile_intervals()
    fn, args = numpyro_model(name, make_data(name))
    times = []
    for _ in range(REPEATS):
        kernel = HMC(fn, num_steps=NUM_STEPS)
        mcmc = MCMC(kernel, num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS,
                    chain_method="vectorized", progress_bar=False)  # fmt: skip
        mcmc.warmup(jax.random.PRNGKey(0), *args)
        jax.block_until_ready(mcmc.post_warmup_state)
        start = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(1), *args)
        jax.block_until_ready(mcmc.get_samples())
        end = time.perf_counter()
        times.append(end - start - _union_length(compiles, start, end))
    return times


def probtorch_seconds(name: str) -> list[float]:
    import torch

    from probtorch.inference import HMC, MCMC

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    fn, args = probtorch_model(name, make_data(name))
    times = []
    for _ in range(REPEATS):  # run() after warmup() compiles nothing
        mcmc = MCMC(HMC(fn, num_steps=NUM_STEPS), num_warmup=NUM_WARMUP,
                    num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS, seed=0,
                    progress_bar=False)  # fmt: skip
        mcmc.warmup(*args)
        start = time.perf_counter()
        mcmc.run(*args)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    lib, name = sys.argv[1], sys.argv[2]
    times = (numpyro_seconds if lib == "numpyro" else probtorch_seconds)(name)
    per = min(times) / NUM_SAMPLES
    print(
        f"{lib} {name}: {NUM_SAMPLES} draws in {min(times):.3f} s (sampling, compile taken "
        f"out) -> {per * 1e6:.1f} us per transition, {1 / per:.0f} transitions/s per chain"
    )


if __name__ == "__main__":
    main()
