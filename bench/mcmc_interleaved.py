"""Sampling speed of probtorch and NumPyro, their runs taking turns on one core.

bench/mcmc.py runs every library in its own fresh process (cold compile caches, the
honest time to result), one run each; on a shared 2-core machine such single runs move by
tens of percent between half hours, and not by the same factor for both libraries (the
100-d Gaussian's probtorch sampling phase measured 65k gradients/s in a bench run and 88k
a few minutes later in another process). This script starts one worker process per
library, both pinned to the same CPU, which compile and warm up their sampler, and then
alternates their sampling phases for ``--rounds`` rounds: each round runs probtorch and
then NumPyro (the order swaps every round), each continuing from its own post-warmup state
with a new seed, so the two runs of a round are seconds apart on the same core. It reports,
per round and as medians: gradient evaluations per second, min bulk ESS, ESS/s, and the
paired ratios (probtorch / NumPyro) of one round's two runs. (A first version ran both
libraries in one process: the diagonal Gaussian's medians were 55k gradients/s for probtorch
and 106k for NumPyro there, against 89k and 120k in two processes a quarter of an hour
later, so both were slower in one process, probtorch more.)

Compile time and time to result are not measured here (bench/mcmc.py does); compilation
inside a timed NumPyro run (its sampling loop is traced again per run) is taken out with
JAX's compile events, as bench/mcmc.py does.

Usage::

    python bench/mcmc_interleaved.py --models hier_reg gauss100_diag --rounds 5 --cpu 0
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np
from harness import XLA_FLAGS, environment, jax_compile_intervals

HERE = Path(__file__).resolve().parent


def _setup_probtorch(model: str, num_warmup: int, num_samples: int, num_chains: int):
    """probtorch's sampler, compiled and warmed up: a function that runs one timed sampling
    phase with a given seed and returns (seconds, gradient evaluations, draws)."""
    import mcmc as bench
    import torch

    from probtorch.inference import MCMC, NUTS

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    opts = bench.MODEL_OPTS[model]
    kw = {"dense_mass": opts["dense_mass"], "max_tree_depth": opts["max_tree_depth"]}
    fn, args = bench.probtorch_model(model, bench.make_data(model))
    mcmc = MCMC(
        NUTS(fn, executor="quick", **kw),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        seed=0,
        progress_bar=False,
    )
    mcmc.run(*args, extra_fields=("num_steps",))  # compile and warm up

    def run(seed: int):
        mcmc.seed = seed  # continues from the post-warmup state: sampling only
        t0 = time.perf_counter()
        mcmc.run(*args, extra_fields=("num_steps",))
        seconds = time.perf_counter() - t0
        samples = mcmc.get_samples(group_by_chain=True)
        draws = {k: samples[k].numpy() for k in bench.LATENT[model]}
        steps = int(mcmc.get_extra_fields(group_by_chain=True)["num_steps"].sum())
        return seconds, steps, draws

    return run


def _setup_numpyro(model: str, num_warmup: int, num_samples: int, num_chains: int):
    """NumPyro's sampler (vectorized chains), as :func:`_setup_probtorch`."""
    import jax
    import mcmc as bench
    import numpyro
    from numpyro.infer import MCMC, NUTS

    numpyro.enable_x64()
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    compiles = jax_compile_intervals()
    opts = bench.MODEL_OPTS[model]
    kw = {"dense_mass": opts["dense_mass"], "max_tree_depth": opts["max_tree_depth"]}
    fn, args = bench.numpyro_model(model, bench.make_data(model))
    mcmc = MCMC(
        NUTS(fn, **kw),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        chain_method="vectorized",
        progress_bar=False,
    )
    fields = ("num_steps",)
    mcmc.warmup(jax.random.PRNGKey(0), *args, extra_fields=fields)
    mcmc.run(jax.random.PRNGKey(1), *args, extra_fields=fields)  # compile the sampling loop
    jax.block_until_ready(mcmc.get_samples())

    def run(seed: int):
        del compiles[:]
        t0 = time.perf_counter()
        mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=fields)
        samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
        t1 = time.perf_counter()
        seconds = (t1 - t0) - bench._union_length(compiles, t0, t1)
        draws = {k: np.asarray(samples[k]) for k in bench.LATENT[model]}
        steps = int(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum())
        return seconds, steps, draws

    return run


SETUPS = {"probtorch": _setup_probtorch, "numpyro": _setup_numpyro}


def _worker(lib: str, model: str, settings: tuple, cpu: int, conn) -> None:
    """One library's sampler in its own process: set up, then run a sampling phase for
    every seed received, answering with its figures; None ends it."""
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    os.environ["XLA_FLAGS"] = XLA_FLAGS
    sys.path.insert(0, str(HERE))
    import mcmc as bench

    run = SETUPS[lib](model, *settings)
    conn.send("ready")
    while (seed := conn.recv()) is not None:
        seconds, steps, draws = run(seed)
        ess = bench.posterior_stats(model, draws)["min_bulk_ess"]
        conn.send({
            "sample_s": seconds,
            "grad_evals": steps,
            "grad_per_s": steps / seconds,
            "min_bulk_ess": ess,
            "ess_per_s": ess / seconds,
        })  # fmt: skip


def measure(model: str, rounds: int, settings: tuple, cpu: int) -> dict:
    context = multiprocessing.get_context("spawn")
    workers = {}
    for lib in ("probtorch", "numpyro"):
        here, there = context.Pipe()
        process = context.Process(target=_worker, args=(lib, model, settings, cpu, there))
        process.start()
        workers[lib] = (process, here)
    try:
        for _, conn in workers.values():
            if conn.recv() != "ready":
                raise RuntimeError("a worker failed to set up")
        rows = []
        for r in range(rounds):
            order = ("probtorch", "numpyro") if r % 2 == 0 else ("numpyro", "probtorch")
            row = {}
            for lib in order:
                workers[lib][1].send(1000 + r)
                row[lib] = workers[lib][1].recv()
            rows.append(row)
            print(f"{model} round {r}: " + "  ".join(
                f"{lib} {row[lib]['grad_per_s']:.0f} grad/s, ESS {row[lib]['min_bulk_ess']:.0f}, "
                f"{row[lib]['ess_per_s']:.0f} ESS/s" for lib in ("probtorch", "numpyro")
            ), flush=True)  # fmt: skip
    finally:
        for process, conn in workers.values():
            if process.is_alive():
                conn.send(None)
            process.join(timeout=60)
    summary = {}
    for metric in ("grad_per_s", "ess_per_s", "min_bulk_ess", "sample_s"):
        pt = [row["probtorch"][metric] for row in rows]
        nu = [row["numpyro"][metric] for row in rows]
        summary[metric] = {
            "probtorch_median": float(np.median(pt)),
            "numpyro_median": float(np.median(nu)),
            "paired_ratio_median": float(np.median([a / b for a, b in zip(pt, nu)])),
            "paired_ratio_min": float(min(a / b for a, b in zip(pt, nu))),
            "paired_ratio_max": float(max(a / b for a, b in zip(pt, nu))),
        }
    return {"rounds": rows, "summary": summary}


def main(argv=None) -> None:
    import mcmc as bench

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=bench.MODELS, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--num-chains", type=int, default=4)
    ap.add_argument("--num-warmup", type=int, default=1000)
    ap.add_argument("--num-samples", type=int, default=1000)
    ap.add_argument("--cpu", type=int, default=0, help="the one CPU to run on (-1: any)")
    ap.add_argument("--out", default=str(HERE / "results_interleaved.json"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    env = environment()
    for model in args.models:
        settings = (args.num_warmup, args.num_samples, args.num_chains)
        rec = measure(model, args.rounds, settings, args.cpu)
        rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        rec["settings"] = vars(args) | {"models": [model]}
        rec["environment"] = env
        results[model] = rec
        s = rec["summary"]
        print(
            f"== {model}: median over {args.rounds} paired rounds, probtorch / NumPyro: "
            f"grad/s {s['grad_per_s']['paired_ratio_median']:.2f} "
            f"({s['grad_per_s']['probtorch_median']:.0f} / "
            f"{s['grad_per_s']['numpyro_median']:.0f}), "
            f"ESS/s {s['ess_per_s']['paired_ratio_median']:.2f}",
            flush=True,
        )
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
