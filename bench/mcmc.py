"""Side-by-side NUTS benchmark: probtorch vs NumPyro vs Pyro on the same models and data.

Every (library, model, variant) runs in fresh subprocesses (pinned to one CPU with ``taskset``
where available, one thread each, cold compile caches), twice:

1. a *probe*: ``num_warmup=0, num_samples=1``; its wall time (``first_draw_s``) is the time
   to the first transition from a cold start: tracing, initialization, the step-size
   heuristic and, for the compiled libraries, compilation.
2. the *full run*: ``num_warmup`` warmup and ``num_samples`` draws per chain, timed by phase.
   Phase boundaries: probtorch's ``MCMC`` exposes none, so the benchmark wraps the
   ``run_warmup`` function the driver calls (timing only, no behaviour change); NumPyro runs
   ``mcmc.warmup(...)`` then ``mcmc.run(...)``; Pyro's ``hook_fn`` is called after every
   transition with its stage ("Warmup"/"Sample"), and the time since the previous call is
   charged to that stage. Compilation inside the run comes from the libraries' compile
   events (Dynamo's compile start/end callbacks; JAX's ``/jax/core/compile/*`` durations,
   with synchronous CPU dispatch) and is reported as ``compile_s`` and taken out of the
   warmup and sampling phases.

Gradient evaluations in the sampling phase: the sum of ``num_steps`` over draws and chains
(probtorch and NumPyro ``extra_fields``); for Pyro, calls of the leapfrog integrator's
``potential_grad`` are counted during the "Sample" stage. ESS is ArviZ's bulk ESS, minimum
over every scalar of every latent sample site (constrained space). bench/README.md has the
details.

Usage::

    python bench/mcmc.py --models eight_schools logreg --libs probtorch numpyro pyro \\
        --out bench/results_mcmc.json
    python bench/mcmc.py --write-results --out bench/results_mcmc.json   # -> bench/RESULTS.md

See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
from harness import (
    RESULT_TAG,
    XLA_FLAGS,
    cpu_seconds,
    environment,
    jax_compile_intervals,
    spawn,
    timed_into,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PROBTORCH_VARIANTS = (
    "vectorized",
    "sequential",
    "vectorized-lean",
    "vectorized-auto-cached",
    "vectorized-split",
    "vectorized-split-machine",
    "vectorized-auto-machine",
)
MODELS = (
    "eight_schools",
    "logreg",
    "hier_reg",
    "saas_gp",
    "gauss100_diag",
    "gauss100_dense",
    "gmm",
)
LIBS = ("probtorch", "numpyro", "pyro")

# Per-model sampler options, the same for every library.
MODEL_OPTS = {
    "eight_schools": {"dense_mass": False, "max_tree_depth": 10},
    "logreg": {"dense_mass": False, "max_tree_depth": 10},
    "hier_reg": {"dense_mass": False, "max_tree_depth": 10},
    # BoTorch's fit_fully_bayesian_model_nuts: full (dense) mass, max_tree_depth=6.
    "saas_gp": {"dense_mass": True, "max_tree_depth": 6},
    "gauss100_diag": {"dense_mass": False, "max_tree_depth": 10},
    "gauss100_dense": {"dense_mass": True, "max_tree_depth": 10},
    # discrete assignments summed out by each library's parallel enumeration
    "gmm": {"dense_mass": False, "max_tree_depth": 10},
}

# Pyro runs its chains one after another on this machine (num_chains > cpu_count - 1), and
# its per-leapfrog overhead is large: by default ("auto") it runs the models below with
# fewer chains/draws, stated in the results. (chains, warmup, samples)
PYRO_AUTO = {
    "saas_gp": (1, 500, 500),
    "gauss100_diag": (1, 500, 500),
    "gmm": (1, 500, 500),
}


# ---------------------------------------------------------------------------------------
# Data: numpy, fixed seeds, identical for every library
# ---------------------------------------------------------------------------------------
def make_data(model: str) -> dict:
    if model == "eight_schools":
        return {
            "sigma": np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]),
            "y": np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]),
        }
    if model == "logreg":
        rng = np.random.default_rng(1)
        n, d = 5000, 25
        X = rng.standard_normal((n, d))
        beta = rng.standard_normal(d)
        p = 1.0 / (1.0 + np.exp(-(X @ beta)))
        y = (rng.uniform(size=n) < p).astype(np.float64)
        return {"X": X, "y": y}
    if model == "hier_reg":
        rng = np.random.default_rng(2)
        J, N = 85, 919
        # unequal group sizes, each >= 1, summing to N (radon-like: a few large counties)
        sizes = 1 + rng.multinomial(N - J, rng.dirichlet(np.full(J, 0.7)))
        group = np.repeat(np.arange(J), sizes)
        x = rng.standard_normal(N)
        a = 1.5 + 0.4 * rng.standard_normal(J)
        y = a[group] - 0.7 * x + 0.8 * rng.standard_normal(N)
        return {"group": group.astype(np.int64), "x": x, "y": y, "J": J}
    if model == "saas_gp":
        rng = np.random.default_rng(3)
        n, d = 30, 10
        X = rng.uniform(size=(n, d))
        f = np.sin(2 * np.pi * X[:, 0]) + 4.0 * (X[:, 1] - 0.5) ** 2 + 0.5 * X[:, 2]
        y = f + 0.05 * rng.standard_normal(n)
        y = (y - y.mean()) / y.std()
        return {"X": X, "y": y}
    if model in ("gauss100_diag", "gauss100_dense"):
        rng = np.random.default_rng(4)
        d = 100
        Q, R = np.linalg.qr(rng.standard_normal((d, d)))
        Q = Q * np.sign(np.diag(R))  # a uniformly random rotation
        variances = np.logspace(0.0, 2.0, d)  # condition number 100
        cov = (Q * variances) @ Q.T
        cov = 0.5 * (cov + cov.T)
        return {"scale_tril": np.linalg.cholesky(cov), "d": d}
    if model == "gmm":
        rng = np.random.default_rng(5)
        n = 1000
        z = rng.choice(3, size=n, p=[0.3, 0.5, 0.2])
        y = np.array([-3.0, 0.0, 4.0])[z] + rng.standard_normal(n)
        return {"y": y}
    if model == MACHINE_PREBUILD:
        return {"d": 3}
    raise ValueError(f"unknown model {model!r}")


# "vectorized-split-machine" / "vectorized-auto-machine": before the timed run, a run of
# this model (a standard normal of 3 or 100 dimensions, the timed model's code class, with
# its sampler settings, executor="split") in the same cold caches builds the split
# executor's model-independent sampler graph, as any earlier model on the machine would
# have (with executor="auto": in its background); the timed run (executor="split", or the
# default "auto", which finds the graph) then compiles its gradient only
MACHINE_PREBUILD = "machine_prebuild"


# latent sample sites whose draws enter the ESS, per model (same names in every library)
LATENT = {
    "eight_schools": ("mu", "tau", "theta_decentered"),
    "logreg": ("beta",),
    "hier_reg": ("mu_a", "sigma_a", "a_raw", "b", "sigma_y"),
    "saas_gp": ("outputscale", "mean", "noise", "kernel_tausq", "_kernel_inv_length_sq"),
    "gauss100_diag": ("x",),
    "gauss100_dense": ("x",),
    "gmm": ("weights", "loc0", "gaps", "scale"),
    MACHINE_PREBUILD: ("x",),
}
MIN_INFERRED_NOISE_LEVEL = 1e-4  # BoTorch's floor on the inferred noise variance


# ---------------------------------------------------------------------------------------
# Models: probtorch (vmapped over chains, so written for one chain)
# ---------------------------------------------------------------------------------------
def probtorch_model(model: str, data: dict):
    import torch

    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.reparam import LocScaleReparam

    t = {k: torch.as_tensor(v) for k, v in data.items() if isinstance(v, np.ndarray)}
    if model == MACHINE_PREBUILD:

        def standard_normal(d):
            pt.sample("x", dist.Normal(torch.zeros(d), 1.0).to_event(1))

        return standard_normal, (data["d"],)
    if model == "eight_schools":

        def eight_schools(sigma, y):
            mu = pt.sample("mu", dist.Normal(0.0, 5.0))
            tau = pt.sample("tau", dist.HalfCauchy(5.0))
            with pt.plate("school", len(sigma)):
                theta = pt.sample("theta", dist.Normal(mu, tau))
                pt.sample("y", dist.Normal(theta, sigma), obs=y)

        fn = pt.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(0.0)})
        return fn, (t["sigma"], t["y"])
    if model == "logreg":

        def logreg(X, y):
            beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            # As in the NumPyro and Pyro models. Under the chain vmap this is a product with
            # one column per chain, which probtorch's NarrowMatmul pass computes transposed
            # (graph_passes.py; until the sixth session this model was written beta @ X.T).
            logits = X @ beta
            with pt.plate("n", X.shape[0]):
                pt.sample("y", dist.Bernoulli(logits=logits), obs=y)

        return logreg, (t["X"], t["y"])
    if model == "hier_reg":
        J = data["J"]

        def hier_reg(group, x, y):
            mu_a = pt.sample("mu_a", dist.Normal(0.0, 5.0))
            sigma_a = pt.sample("sigma_a", dist.HalfNormal(5.0))
            with pt.plate("groups", J):
                a_raw = pt.sample("a_raw", dist.Normal(0.0, 1.0))
            a = pt.deterministic("a", mu_a + sigma_a * a_raw)
            b = pt.sample("b", dist.Normal(0.0, 5.0))
            sigma_y = pt.sample("sigma_y", dist.HalfNormal(5.0))
            with pt.plate("n", len(y)):
                pt.sample("y", dist.Normal(a[..., group] + b * x, sigma_y), obs=y)

        return hier_reg, (t["group"], t["x"], t["y"])
    if model == "saas_gp":

        def saas_gp(X, y):
            n, d = X.shape
            outputscale = pt.sample("outputscale", dist.Gamma(2.0, 0.15))
            mean = pt.sample("mean", dist.Normal(0.0, 1.0))
            noise = MIN_INFERRED_NOISE_LEVEL + pt.sample("noise", dist.Gamma(0.9, 10.0))
            tausq = pt.sample("kernel_tausq", dist.HalfCauchy(0.1))
            inv_length_sq = pt.sample(
                "_kernel_inv_length_sq", dist.HalfCauchy(torch.ones(d)).to_event(1)
            )
            lengthscale = (tausq * inv_length_sq).rsqrt()
            Xs = X / lengthscale
            sq = (Xs[:, None, :] - Xs[None, :, :]).pow(2).sum(-1)
            r = sq.clamp_min(1e-30).sqrt()
            s5 = math.sqrt(5.0) * r
            k = (1.0 + s5 + (5.0 / 3.0) * r.pow(2)) * torch.exp(-s5)
            K = outputscale * k + noise * torch.eye(n)
            # As BoTorch writes it. A K that is not numerically positive definite at a
            # proposal gives NaN (a divergence), as in NumPyro: probtorch evaluates
            # potentials under probtorch.inference.safe_linalg.nan_on_failure.
            pt.sample("Y", dist.MultivariateNormal(mean.expand(n), covariance_matrix=K), obs=y)

        return saas_gp, (t["X"], t["y"])
    if model in ("gauss100_diag", "gauss100_dense"):
        d = data["d"]

        def gauss(scale_tril):
            pt.sample("x", dist.MultivariateNormal(torch.zeros(d), scale_tril=scale_tril))

        return gauss, (t["scale_tril"],)
    if model == "gmm":

        def gmm(y):
            # three components, ordered locations (no label switching between chains); the
            # assignments z are summed out by enumeration
            weights = pt.sample("weights", dist.Dirichlet(torch.ones(3)))
            loc0 = pt.sample("loc0", dist.Normal(0.0, 5.0))
            with pt.plate("gap", 2):
                gaps = pt.sample("gaps", dist.HalfNormal(5.0))
            locs = torch.cat([loc0[None], loc0 + torch.cumsum(gaps, -1)])
            scale = pt.sample("scale", dist.HalfNormal(2.0))
            with pt.plate("n", y.shape[0]):
                z = pt.sample("z", dist.Categorical(weights))
                pt.sample("y", dist.Normal(locs[z], scale), obs=y)

        return gmm, (t["y"],)
    raise ValueError(model)


# ---------------------------------------------------------------------------------------
# Models: NumPyro
# ---------------------------------------------------------------------------------------
def numpyro_model(model: str, data: dict):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    t = {k: jnp.asarray(v) for k, v in data.items() if isinstance(v, np.ndarray)}
    if model == "eight_schools":

        def eight_schools(sigma, y):
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
            with numpyro.plate("school", len(sigma)):
                theta_dec = numpyro.sample("theta_decentered", dist.Normal(0.0, 1.0))
                theta = numpyro.deterministic("theta", mu + tau * theta_dec)
                numpyro.sample("y", dist.Normal(theta, sigma), obs=y)

        return eight_schools, (t["sigma"], t["y"])
    if model == "logreg":

        def logreg(X, y):
            beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            with numpyro.plate("n", X.shape[0]):
                numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

        return logreg, (t["X"], t["y"])
    if model == "hier_reg":
        J = data["J"]

        def hier_reg(group, x, y):
            mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 5.0))
            sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(5.0))
            with numpyro.plate("groups", J):
                a_raw = numpyro.sample("a_raw", dist.Normal(0.0, 1.0))
            a = numpyro.deterministic("a", mu_a + sigma_a * a_raw)
            b = numpyro.sample("b", dist.Normal(0.0, 5.0))
            sigma_y = numpyro.sample("sigma_y", dist.HalfNormal(5.0))
            with numpyro.plate("n", len(y)):
                numpyro.sample("y", dist.Normal(a[group] + b * x, sigma_y), obs=y)

        return hier_reg, (t["group"], t["x"], t["y"])
    if model == "saas_gp":

        def saas_gp(X, y):
            n, d = X.shape
            outputscale = numpyro.sample("outputscale", dist.Gamma(2.0, 0.15))
            mean = numpyro.sample("mean", dist.Normal(0.0, 1.0))
            noise = MIN_INFERRED_NOISE_LEVEL + numpyro.sample("noise", dist.Gamma(0.9, 10.0))
            tausq = numpyro.sample("kernel_tausq", dist.HalfCauchy(0.1))
            inv_length_sq = numpyro.sample(
                "_kernel_inv_length_sq", dist.HalfCauchy(jnp.ones(d)).to_event(1)
            )
            lengthscale = 1.0 / jnp.sqrt(tausq * inv_length_sq)
            Xs = X / lengthscale
            sq = ((Xs[:, None, :] - Xs[None, :, :]) ** 2).sum(-1)
            r = jnp.sqrt(jnp.clip(sq, 1e-30))
            s5 = math.sqrt(5.0) * r
            k = (1.0 + s5 + (5.0 / 3.0) * r**2) * jnp.exp(-s5)
            K = outputscale * k + noise * jnp.eye(n)
            numpyro.sample(
                "Y",
                dist.MultivariateNormal(jnp.broadcast_to(mean, (n,)), covariance_matrix=K),
                obs=y,
            )

        return saas_gp, (t["X"], t["y"])
    if model in ("gauss100_diag", "gauss100_dense"):
        d = data["d"]

        def gauss(scale_tril):
            numpyro.sample("x", dist.MultivariateNormal(jnp.zeros(d), scale_tril=scale_tril))

        return gauss, (t["scale_tril"],)
    if model == "gmm":

        def gmm(y):
            weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(3)))
            loc0 = numpyro.sample("loc0", dist.Normal(0.0, 5.0))
            with numpyro.plate("gap", 2):
                gaps = numpyro.sample("gaps", dist.HalfNormal(5.0))
            locs = jnp.concatenate([loc0[None], loc0 + jnp.cumsum(gaps, -1)])
            scale = numpyro.sample("scale", dist.HalfNormal(2.0))
            with numpyro.plate("n", y.shape[0]):
                z = numpyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
                numpyro.sample("y", dist.Normal(locs[z], scale), obs=y)

        return gmm, (t["y"],)
    raise ValueError(model)


# ---------------------------------------------------------------------------------------
# Models: Pyro
# ---------------------------------------------------------------------------------------
def pyro_model(model: str, data: dict):
    import pyro
    import pyro.distributions as dist
    import torch

    t = {k: torch.as_tensor(v) for k, v in data.items() if isinstance(v, np.ndarray)}
    if model == "eight_schools":

        def eight_schools(sigma, y):
            mu = pyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = pyro.sample("tau", dist.HalfCauchy(5.0))
            with pyro.plate("school", len(sigma)):
                theta_dec = pyro.sample("theta_decentered", dist.Normal(0.0, 1.0))
                theta = pyro.deterministic("theta", mu + tau * theta_dec)
                pyro.sample("y", dist.Normal(theta, sigma), obs=y)

        return eight_schools, (t["sigma"], t["y"])
    if model == "logreg":

        def logreg(X, y):
            beta = pyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            logits = (X @ beta[..., None])[..., 0]
            with pyro.plate("n", X.shape[0]):
                pyro.sample("y", dist.Bernoulli(logits=logits), obs=y)

        return logreg, (t["X"], t["y"])
    if model == "hier_reg":
        J = data["J"]

        def hier_reg(group, x, y):
            mu_a = pyro.sample("mu_a", dist.Normal(0.0, 5.0))
            sigma_a = pyro.sample("sigma_a", dist.HalfNormal(5.0))
            with pyro.plate("groups", J):
                a_raw = pyro.sample("a_raw", dist.Normal(0.0, 1.0))
            a = pyro.deterministic("a", mu_a + sigma_a * a_raw)
            b = pyro.sample("b", dist.Normal(0.0, 5.0))
            sigma_y = pyro.sample("sigma_y", dist.HalfNormal(5.0))
            with pyro.plate("n", len(y)):
                pyro.sample("y", dist.Normal(a[..., group] + b * x, sigma_y), obs=y)

        return hier_reg, (t["group"], t["x"], t["y"])
    if model == "saas_gp":

        def saas_gp(X, y):
            n, d = X.shape
            outputscale = pyro.sample("outputscale", dist.Gamma(2.0, 0.15))
            mean = pyro.sample("mean", dist.Normal(0.0, 1.0))
            noise = MIN_INFERRED_NOISE_LEVEL + pyro.sample("noise", dist.Gamma(0.9, 10.0))
            tausq = pyro.sample("kernel_tausq", dist.HalfCauchy(0.1))
            inv_length_sq = pyro.sample(
                "_kernel_inv_length_sq", dist.HalfCauchy(torch.ones(d)).to_event(1)
            )
            lengthscale = (tausq * inv_length_sq).rsqrt()
            Xs = X / lengthscale
            sq = (Xs[:, None, :] - Xs[None, :, :]).pow(2).sum(-1)
            r = sq.clamp_min(1e-30).sqrt()
            s5 = math.sqrt(5.0) * r
            k = (1.0 + s5 + (5.0 / 3.0) * r.pow(2)) * torch.exp(-s5)
            K = outputscale * k + noise * torch.eye(n)
            pyro.sample("Y", dist.MultivariateNormal(mean.expand(n), covariance_matrix=K), obs=y)

        return saas_gp, (t["X"], t["y"])
    if model in ("gauss100_diag", "gauss100_dense"):
        d = data["d"]

        def gauss(scale_tril):
            pyro.sample("x", dist.MultivariateNormal(torch.zeros(d), scale_tril=scale_tril))

        return gauss, (t["scale_tril"],)
    if model == "gmm":

        def gmm(y):
            weights = pyro.sample("weights", dist.Dirichlet(torch.ones(3)))
            loc0 = pyro.sample("loc0", dist.Normal(0.0, 5.0))
            with pyro.plate("gap", 2):
                gaps = pyro.sample("gaps", dist.HalfNormal(5.0))
            locs = torch.cat([loc0[None], loc0 + torch.cumsum(gaps, -1)])
            scale = pyro.sample("scale", dist.HalfNormal(2.0))
            with pyro.plate("n", y.shape[0]):
                z = pyro.sample("z", dist.Categorical(weights))  # Pyro's HMC enumerates it
                pyro.sample("y", dist.Normal(locs[z], scale), obs=y)

        return gmm, (t["y"],)
    raise ValueError(model)


# ---------------------------------------------------------------------------------------
# Workers: one run in this process, timed by phase
# ---------------------------------------------------------------------------------------
_cpu = cpu_seconds


def run_probtorch(model, cfg):
    import importlib

    if cfg.get("builds_header"):
        # an untimed earlier run stands for executor="auto"'s background builds, which build
        # Inductor's precompiled header at once (probtorch.inference.precompiled_header)
        os.environ["PROBTORCH_DEFER_HEADER"] = "0"
    t_import = time.perf_counter()  # the library's imports: see "import_s" in the README
    import torch

    from probtorch.inference import MCMC, NUTS

    import_s = time.perf_counter() - t_import
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    device = cfg.get("device", "cpu")
    if device != "cpu":  # the data, the models' constants and so the sampler on the GPU
        torch.set_default_device(device)

    driver = importlib.import_module("probtorch.inference.mcmc.mcmc")
    warmups = []  # (start, end, cpu at start, cpu at end): one per chain when sequential
    original = driver.run_warmup

    def timed_run_warmup(*args, **kwargs):
        start = (time.perf_counter(), _cpu())
        try:
            return original(*args, **kwargs)
        finally:
            warmups.append((start[0], time.perf_counter(), start[1], _cpu()))

    driver.run_warmup = timed_run_warmup

    # Dynamo reports the outermost compile (tracing, AOT autograd, Inductor, the C++
    # compiler) as start/end callbacks: keep them as intervals.
    from torch._dynamo.callback import callback_handler

    compiles, open_at, compile_cpu = [], [], []
    callback_handler.register_start_callback(
        lambda a: open_at.append((time.perf_counter(), _cpu()))
    )

    def on_compile_end(a):
        (start, cpu), now = open_at.pop(), time.perf_counter()
        compiles.append((start, now))
        compile_cpu.append(_cpu() - cpu)  # with one CPU, the C++ compiler runs as a child

    callback_handler.register_end_callback(on_compile_end)

    # The lean executor builds its AOTInductor kernel, and the quick path captures its chunk
    # (make_fx) and compiles it with Inductor, outside Dynamo's callbacks: time them too.
    timed = timed_into(compiles, compile_cpu)

    kernels = importlib.import_module("probtorch.inference.mcmc.kernels")
    if hasattr(kernels, "build_lean_loop"):
        kernels.build_lean_loop = timed(kernels.build_lean_loop)
    executor_mod = importlib.import_module("probtorch.inference.mcmc.executor")
    if hasattr(executor_mod, "InPlaceLoop"):
        executor_mod.trace_in_place = timed(executor_mod.trace_in_place)
        executor_mod.InPlaceLoop._compile = timed(executor_mod.InPlaceLoop._compile)
    if hasattr(executor_mod, "SplitLoop"):  # the split executor: gradient, sampler graph
        executor_mod._compiled_fills = timed(executor_mod._compiled_fills)
        executor_mod.load_graph = timed(executor_mod.load_graph)
    data = make_data(model)
    if model == MACHINE_PREBUILD:  # as many dimensions as puts it in the timed model's class
        data["d"] = _prebuild_dim(cfg["like"])
    fn, args = probtorch_model(model, data)
    opts = MODEL_OPTS[cfg.get("like", model)]
    kw = {"dense_mass": opts["dense_mass"], "max_tree_depth": opts["max_tree_depth"]}
    # "vectorized": the quick path; "vectorized-lean": NUTS(..., executor="lean");
    # "vectorized-auto-cached": executor="auto" in a second process (the package is on disk);
    # "vectorized-split" / "vectorized-split-machine": executor="split", first model on the
    # machine / after another model built the sampler graph (MACHINE_PREBUILD);
    # "vectorized-auto-machine": the default executor="auto" after that build
    # "sequential" / "sequential-<executor>": chain_method="sequential"
    # (the "-cached" / "-machine" suffixes say what ran before, not the executor)
    chain_method, _, executor = cfg["variant"].partition("-")
    kw["executor"] = executor.split("-")[0] or "quick"
    mcmc = MCMC(
        NUTS(fn, **kw),
        num_warmup=cfg["num_warmup"],
        num_samples=cfg["num_samples"],
        num_chains=cfg["num_chains"],
        chain_method=chain_method,
        seed=cfg.get("seed", 0),
        progress_bar=False,
    )
    t0, c0 = time.perf_counter(), _cpu()
    mcmc.run(*args, extra_fields=("num_steps",))
    if device != "cpu":
        torch.cuda.synchronize()
    t1, c1 = time.perf_counter(), _cpu()
    # Before sampling: the set-up up to the first warmup, and each warmup (one per chain with
    # chain_method="sequential", whose chains sample between them); no warmup (probe):
    # sampling starts at t0.
    before = [(t0, warmups[0][0] if warmups else t0)] + [(s, e) for s, e, _, _ in warmups]
    pre_s = sum(e - s for s, e in before)
    pre_cpu = (warmups[0][2] - c0 if warmups else 0.0) + sum(b - a for _, _, a, b in warmups)
    pre_compile = sum(_union_length(compiles, s, e) for s, e in before)
    samples = mcmc.get_samples(group_by_chain=True)
    draws = {k: samples[k].cpu().numpy() for k in LATENT[model]}
    num_steps = mcmc.get_extra_fields(group_by_chain=True)["num_steps"]
    diverging = mcmc.get_extra_fields(group_by_chain=True)["diverging"]
    return {
        "import_s": import_s,
        "total_s": t1 - t0,
        "total_cpu_s": c1 - c0,
        "pre_sample_s": pre_s,
        "pre_sample_cpu_s": pre_cpu,
        "pre_sample_compile_s": pre_compile,
        "sample_s": t1 - t0 - pre_s,
        "sample_cpu_s": c1 - c0 - pre_cpu,
        "sample_compile_s": _union_length(compiles, t0, t1) - pre_compile,
        "compile_events": len(compiles),
        "compile_cpu_s": sum(compile_cpu),
        "sample_grad_evals": int(num_steps.sum()),
        "divergences": int(diverging.sum()),
        "compiled": bool(mcmc.kernel.potential.compiled),
        "block_loop": type(getattr(mcmc.kernel, "_block_loop", None)).__name__,
        "device": str(mcmc.kernel.potential.device),
    }, draws


def _prebuild_dim(model: str) -> int:
    """Dimensions of a standard normal whose sampler is compiled as ``model``'s is: scalar
    code for models of at most ``SCALAR_CODE_MAX_NUMEL`` elements, vector code otherwise
    (probtorch.inference.mcmc.kernels.codegen_options)."""
    from probtorch.inference.mcmc.kernels import SCALAR_CODE_MAX_NUMEL
    from probtorch.inference.potential import Potential

    fn, args = probtorch_model(model, make_data(model))
    return 3 if Potential(fn, args).largest_numel <= SCALAR_CODE_MAX_NUMEL else 100


def _union_length(intervals: list, lo: float, hi: float) -> float:
    """Length of the union of ``(start, end)`` intervals, clipped to ``[lo, hi]``."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def run_numpyro(model, cfg):
    t_import = time.perf_counter()
    import jax
    import numpyro

    numpyro.enable_x64()  # before numpyro.infer, as the script always did
    from numpyro.infer import MCMC, NUTS

    import_s = time.perf_counter() - t_import

    # Synchronous dispatch (also set as JAX_CPU_ENABLE_ASYNC_DISPATCH by spawn): otherwise
    # the sequential chain method traces and compiles chain k+1 while chain k still runs
    # and compile intervals would hold execution. One jitted loop per run: no cost.
    if cfg.get("device", "cpu") == "cpu":
        jax.config.update("jax_cpu_enable_async_dispatch", False)

    # JAX reports tracing, lowering and XLA compilation as durations: keep them as
    # intervals (nested traces overlap) to take compilation out of the sampling phase.
    compiles = jax_compile_intervals()

    fn, args = numpyro_model(model, make_data(model))
    opts = MODEL_OPTS[model]
    mcmc = MCMC(
        NUTS(fn, dense_mass=opts["dense_mass"], max_tree_depth=opts["max_tree_depth"]),
        num_warmup=cfg["num_warmup"],
        num_samples=cfg["num_samples"],
        num_chains=cfg["num_chains"],
        chain_method=cfg["variant"],
        progress_bar=False,
    )
    fields = ("num_steps", "diverging")
    seed = cfg.get("seed", 0)
    t0, c0 = time.perf_counter(), _cpu()
    if cfg["num_warmup"] > 0:
        mcmc.warmup(jax.random.PRNGKey(2 * seed), *args, extra_fields=fields)
        jax.block_until_ready(mcmc.post_warmup_state)
    tw, cw = time.perf_counter(), _cpu()
    mcmc.run(jax.random.PRNGKey(2 * seed + 1), *args, extra_fields=fields)
    samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    t1, c1 = time.perf_counter(), _cpu()
    extra = mcmc.get_extra_fields(group_by_chain=True)
    draws = {k: np.asarray(samples[k]) for k in LATENT[model]}
    # mcmc.run after mcmc.warmup traces and compiles its sampling loop again (once per
    # chain with chain_method="sequential"): taken out of sampling by derive().
    return {
        "import_s": import_s,
        "total_s": t1 - t0,
        "total_cpu_s": c1 - c0,
        "pre_sample_s": tw - t0,
        "pre_sample_cpu_s": cw - c0,
        "pre_sample_compile_s": _union_length(compiles, t0, tw),
        "sample_s": t1 - tw,
        "sample_cpu_s": c1 - cw,
        "sample_compile_s": _union_length(compiles, tw, t1),
        "sample_grad_evals": int(np.asarray(extra["num_steps"]).sum()),
        "divergences": int(np.asarray(extra["diverging"]).sum()),
        "device": str(jax.devices()[0]),
    }, draws


def run_pyro(model, cfg):
    t_import = time.perf_counter()
    import pyro
    import pyro.ops.integrator as integrator
    import torch
    from pyro.infer import MCMC, NUTS

    import_s = time.perf_counter() - t_import

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    pyro.set_rng_seed(cfg.get("seed", 0))
    counts = {"grad": 0}
    original = integrator.potential_grad

    def counting_potential_grad(potential_fn, z):
        counts["grad"] += 1
        return original(potential_fn, z)

    integrator.potential_grad = counting_potential_grad
    # as BoTorch does for SAAS: a failed Cholesky in a proposal is a divergence, not an error
    integrator.register_exception_handler(
        "torch_linalg", lambda e: isinstance(e, torch.linalg.LinAlgError)
    )
    acc = {"Warmup": [0.0, 0.0, 0], "Sample": [0.0, 0.0, 0]}  # wall, cpu, grads
    last = {}

    def hook(kernel, samples, stage, i):
        now, cpu = time.perf_counter(), _cpu()
        a = acc[stage.split()[0]]  # "Warmup [0]" / "Sample [0]"
        a[0] += now - last["t"]
        a[1] += cpu - last["c"]
        a[2] += counts["grad"] - last["g"]
        last.update(t=now, c=cpu, g=counts["grad"])

    fn, args = pyro_model(model, make_data(model))
    opts = MODEL_OPTS[model]
    mcmc = MCMC(
        NUTS(fn, full_mass=opts["dense_mass"], max_tree_depth=opts["max_tree_depth"]),
        num_samples=cfg["num_samples"],
        warmup_steps=cfg["num_warmup"],
        num_chains=cfg["num_chains"],
        hook_fn=hook,
        disable_progbar=True,
    )
    t0, c0 = time.perf_counter(), _cpu()
    last.update(t=t0, c=c0, g=0)
    mcmc.run(*args)
    t1, c1 = time.perf_counter(), _cpu()
    samples = mcmc.get_samples(group_by_chain=True)
    draws = {k: samples[k].numpy() for k in LATENT[model]}
    div = None
    if cfg["num_samples"] >= 4:  # Pyro's diagnostics need 4 draws per chain
        div = sum(len(v) for v in mcmc.diagnostics().get("divergences", {}).values())
    sample_s = acc["Sample"][0]
    return {
        "import_s": import_s,
        "total_s": t1 - t0,
        "total_cpu_s": c1 - c0,
        # everything before the sampling stage's transitions: setup + warmup (all chains)
        "pre_sample_s": (t1 - t0) - sample_s,
        "pre_sample_cpu_s": (c1 - c0) - acc["Sample"][1],
        "sample_s": sample_s,
        "sample_cpu_s": acc["Sample"][1],
        "pre_sample_compile_s": 0.0,  # Pyro NUTS runs eagerly (jit_compile=False)
        "sample_compile_s": 0.0,
        "sample_grad_evals": acc["Sample"][2],
        "divergences": div,
        "sequential_chains": cfg["num_chains"] > max(os.cpu_count() - 1, 1),
    }, draws


RUNNERS = {"probtorch": run_probtorch, "numpyro": run_numpyro, "pyro": run_pyro}


def posterior_stats(model: str, draws: dict) -> dict:
    """Min bulk ESS over every scalar, and per-scalar means/sds (for cross-library checks)."""
    import arviz as az

    ds = az.convert_to_dataset({k: np.asarray(v, dtype=np.float64) for k, v in draws.items()})
    ess = az.ess(ds, method="bulk")
    per = {}
    means, sds = {}, {}
    for k, v in draws.items():
        e = np.atleast_1d(np.asarray(ess[k].values)).ravel()
        flat = np.asarray(v).reshape(v.shape[0] * v.shape[1], -1)
        for j in range(flat.shape[1]):
            name = k if flat.shape[1] == 1 else f"{k}[{j}]"
            per[name] = float(e[j])
            means[name] = float(flat[:, j].mean())
            sds[name] = float(flat[:, j].std())
    worst = min(per, key=per.get)
    return {
        "min_bulk_ess": per[worst],
        "min_ess_param": worst,
        "means": means,
        "sds": sds,
    }


def worker(args) -> None:
    cfg = json.loads(args.worker)
    model, lib = cfg["model"], cfg["lib"]
    info, draws = RUNNERS[lib](model, cfg)
    if cfg["num_samples"] > 1:
        info.update(posterior_stats(model, draws))
    print(RESULT_TAG + json.dumps(info))


# ---------------------------------------------------------------------------------------
# Orchestration: fresh subprocesses, one per probe/full run
# ---------------------------------------------------------------------------------------


def jobs_for(models, libs, args) -> list[dict]:
    jobs = []
    for model in models:
        for lib in libs:
            chains, warmup, samples = args.num_chains, args.num_warmup, args.num_samples
            variants = [None]
            if lib == "numpyro":
                variants = list(args.numpyro_chain_methods)
            if lib == "probtorch":
                variants = [m if e == "quick" else f"{m}-{e}"
                            for m in args.probtorch_chain_methods
                            for e in args.probtorch_executors]  # fmt: skip
            if lib == "pyro" and args.pyro == "auto" and model in PYRO_AUTO:
                chains, warmup, samples = PYRO_AUTO[model]
            elif lib == "pyro" and args.pyro not in ("auto", "full"):
                chains, warmup, samples = (int(x) for x in args.pyro.split(","))
            for variant in variants:
                if lib == "numpyro" and chains == 1 and variant == "sequential":
                    continue
                job = {
                    "model": model,
                    "lib": lib,
                    "variant": variant or _default_variant(lib, chains),
                    "num_chains": chains,
                    "num_warmup": warmup,
                    "num_samples": samples,
                    "warm_cache": args.warm_cache,
                    "device": args.device,
                }
                if variant == "vectorized-auto-cached":  # after a lean run of the same model
                    job["prebuild"] = dict(job, variant="vectorized-lean", num_warmup=0,
                                           num_samples=1, builds_header=True)  # fmt: skip
                if variant in ("vectorized-split-machine", "vectorized-auto-machine"):
                    # after a run of another model built the sampler graph
                    job["prebuild"] = dict(job, model=MACHINE_PREBUILD, like=model,
                                           variant="vectorized-split", num_warmup=20,
                                           num_samples=20, builds_header=True)  # fmt: skip
                jobs.append(job)
    return jobs


def _default_variant(lib: str, chains: int) -> str:
    if lib == "probtorch":
        return "vectorized"
    return "sequential" if chains > 1 else "single"


def derive(rec: dict) -> dict:
    """Derived figures from the full run (and the probe, if any); with repeated full runs
    (``--repeats``: other seeds), the median of each figure over the runs."""
    runs = [rec.get("full", {}), *rec.get("more_full", [])]
    derived = [d for d in (_derive_one(rec, full) for full in runs) if d]
    if len(derived) <= 1:
        return derived[0] if derived else {}
    median = {k: float(np.median([d[k] for d in derived])) for k in derived[0]}
    ess = [d["min_bulk_ess"] for d in derived]
    return dict(median, repeats=len(derived), min_bulk_ess_range=[min(ess), max(ess)])


def _derive_one(rec: dict, full: dict) -> dict:
    probe = rec.get("probe") or {}
    if "error" in full or "total_s" not in full:
        return {}
    pre_c, smp_c = full.get("pre_sample_compile_s", 0.0), full.get("sample_compile_s", 0.0)
    sample_s = full["sample_s"] - smp_c
    # CPU time cannot be split by wall intervals: the sampling share of it, pro rata
    sample_cpu_s = full["sample_cpu_s"] * sample_s / full["sample_s"]
    # NumPyro: mcmc.run after mcmc.warmup compiles its loop again, an artifact of timing the
    # phases apart (one plain mcmc.run compiles once): left out of compile and total.
    total_s = full["total_s"] - (smp_c if rec["config"]["lib"] == "numpyro" else 0.0)
    ess = full.get("min_bulk_ess", float("nan"))
    # the script's time to result: the library's imports (probtorch imports torch's compiler
    # inside the run, at its first compile; JAX loads XLA at import) and the whole run
    to_result_s = full.get("import_s", float("nan")) + total_s
    return {
        "first_draw_s": probe.get("total_s", float("nan")),
        "compile_s": pre_c + (0.0 if rec["config"]["lib"] == "numpyro" else smp_c),
        "warmup_s": full["pre_sample_s"] - pre_c,
        "sample_s": sample_s,
        "total_s": total_s,
        "grad_per_s": full["sample_grad_evals"] / sample_s,
        "min_bulk_ess": ess,
        "ess_per_s_sample": ess / sample_s,
        "ess_per_s_total": ess / total_s,
        "import_s": full.get("import_s", float("nan")),
        "ess_per_s_to_result": ess / to_result_s,
        "ess_per_cpu_s_sample": ess / max(sample_cpu_s, 1e-9),
        "cpu_share_sample": sample_cpu_s / sample_s,
    }


def run_bench(args) -> None:
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() and not args.fresh else {}
    results.setdefault("runs", {})
    results["environment"] = environment()
    if args.device != "cpu":
        results["gpu"] = _gpu_info()
    results["settings"] = {
        "num_chains": args.num_chains,
        "num_warmup": args.num_warmup,
        "num_samples": args.num_samples,
        "pyro": args.pyro,
        "cpu": args.cpu,
        "device": args.device,
        "warm_cache": args.warm_cache,
        # probtorch keeps Inductor's precompiled C++ header in TORCHINDUCTOR_CACHE_DIR
        # (compile.keep_headers_with_cache), where a cold run finds none; it compiles without
        # it (precompiled_header.defer_header_builds), as a machine's first model does
        "inductor_header": "in the cold cache, deferred",
    }
    # repeats run every job once per seed, the libraries taking turns, so that each
    # library's median comes from the same stretch of time on a machine whose speed drifts
    seeds = range(args.first_seed, args.first_seed + args.repeats)
    for seed, cfg in itertools.product(seeds, jobs_for(args.models, args.libs, args)):
        key = f"{cfg['model']}/{cfg['lib']}/{cfg['variant']}"
        cfg = dict(cfg, seed=seed)
        print(
            f"== {key}: {cfg['num_chains']} chains x ({cfg['num_warmup']} warmup + "
            f"{cfg['num_samples']} draws), seed {seed}",
            flush=True,
        )
        if seed > 0:
            if key not in results["runs"]:
                raise SystemExit(f"--first-seed {args.first_seed}: {key} has no seed-0 run "
                                 f"in {out} to add seed {seed} to")  # fmt: skip
            rec = results["runs"][key]
            full = spawn(__file__, cfg, args.cpu, args.timeout)
            rec.setdefault("more_full", []).append(full)
            print(f"   full:  {_brief(full)}", flush=True)
            d = _derive_one(rec, full)
        else:
            rec = {"config": cfg, "started": _dt.datetime.now().isoformat(timespec="seconds")}
            if args.probe:
                probe_cfg = dict(cfg, num_warmup=0, num_samples=1)
                rec["probe"] = spawn(__file__, probe_cfg, args.cpu, args.timeout)
                print(f"   probe: {_brief(rec['probe'])}", flush=True)
            rec["full"] = spawn(__file__, cfg, args.cpu, args.timeout)
            print(f"   full:  {_brief(rec['full'])}", flush=True)
            d = _derive_one(rec, rec["full"])
        rec["derived"] = derive(rec)
        if d:
            print(
                f"   first draw {d['first_draw_s']:.1f}s compile {d['compile_s']:.1f}s "
                f"warmup {d['warmup_s']:.1f}s sample {d['sample_s']:.1f}s "
                f"total {d['total_s']:.1f}s | {d['grad_per_s']:.0f} grad/s "
                f"| min ESS {d['min_bulk_ess']:.0f} | ESS/s {d['ess_per_s_sample']:.1f} "
                f"(total {d['ess_per_s_total']:.2f}; imports {d['import_s']:.2f}s, "
                f"{d['ess_per_s_to_result']:.2f} with them)",
                flush=True,
            )
        results["runs"][key] = rec
        out.write_text(json.dumps(results, indent=1))
    if args.write_results:
        write_results(results, args)


def _gpu_info() -> dict:
    """The GPU's name and driver, from nvidia-smi (the orchestrating process imports no
    torch)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30,
        ).stdout.strip().splitlines()[0]  # fmt: skip
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    name, driver, memory = (x.strip() for x in out.split(","))
    return {"name": name, "driver": driver, "memory": memory}


def _brief(r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"].strip().splitlines()[-1][:200]
    return f"{r['total_s']:.1f}s (process {r['process_wall_s']:.1f}s, load {r['loadavg']})"


# ---------------------------------------------------------------------------------------
# RESULTS.md
# ---------------------------------------------------------------------------------------
def _fmt(x, nd=1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{nd}f}"


def _ratio(p: dict, o: dict, metric: str) -> str:
    """``p[metric] / o[metric]`` to two places; '–' where either lacks it (older runs)."""
    a, b = p.get(metric, float("nan")), o.get(metric, float("nan"))
    return "–" if math.isnan(a) or math.isnan(b) else f"{a / b:.2f}"


def _best_numpyro(runs: dict, model: str, metric: str):
    cands = [r for k, r in runs.items() if k.startswith(f"{model}/numpyro/") and r.get("derived")]
    return max(cands, key=lambda r: r["derived"][metric], default=None)


def _agreement(ref: dict, other: dict) -> float:
    """max over scalars of |mean difference| / reference sd."""
    m1, m2, s1 = ref["full"].get("means"), other["full"].get("means"), ref["full"].get("sds")
    if not m1 or not m2:
        return float("nan")
    return max(abs(m1[k] - m2[k]) / max(s1[k], 1e-12) for k in m1 if k in m2)


def write_results(results: dict, args) -> None:
    path = Path(args.results_md)
    env, runs = results.get("environment", {}), results.get("runs", {})
    for r in runs.values():
        r["derived"] = derive(r)  # from the raw timings, with this version's definitions
    lines = [
        "# MCMC benchmark: probtorch vs NumPyro vs Pyro (NUTS)",
        "",
        "Generated by `python bench/mcmc.py --write-results` from "
        "`bench/results_mcmc.json`; the method is described in bench/README.md.",
        "",
        f"- Date: {env.get('date', '?')}",
        f"- Machine: {env.get('cpu_model', '?')}, {env.get('nproc', '?')} CPUs "
        f"(`nproc`), {env.get('mem_gib', '?')} GiB; {env.get('platform', '')}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v),
        f"- Each run in a fresh process, `taskset -c {results.get('settings', {}).get('cpu')}`, "
        f"one thread (`torch.set_num_threads(1)`, XLA_FLAGS=`{XLA_FLAGS}`), float64, "
        "cold compile caches"
        + (
            ", Inductor's precompiled C++ header among them (a cold run compiles without it, "
            "as a machine's first model does: probtorch builds it once it pays for itself; "
            "the auto rows' earlier run built it, as executor='auto''s background builds do)."
            if results.get("settings", {}).get("inductor_header") == "in the cold cache, deferred"
            else ", Inductor's precompiled C++ header among them (built in every cold run, as on "
            "a machine's first compile)."
            if results.get("settings", {}).get("inductor_header")
            else " except Inductor's precompiled C++ header (kept under /tmp between runs "
            "before probtorch kept it in the cache directory; see bench/README.md)."
        ),
        "",
    ]
    lines += _runs_table(runs)
    lines += [
        "",
        "## Ratios (probtorch / other; > 1 means probtorch is better)",
        "",
        "NumPyro: its better chain method for each metric (vectorized or sequential). "
        "Agreement: max over scalars of |mean(probtorch) − mean(other)| / sd(other), "
        "a sanity check that both sample the same posterior (≲ 0.15 expected at these ESS).",
        "",
    ]
    lines += _ratios_table(runs)
    gpu = Path(args.gpu_results) if getattr(args, "gpu_results", None) else None
    if gpu and gpu.exists():
        lines += gpu_section(json.loads(gpu.read_text()))
    notes = Path(args.notes) if args.notes else None
    if notes and notes.exists():
        lines += ["", notes.read_text().rstrip()]
    text = "\n".join(lines) + "\n"
    # keep the sections other benchmarks render into the same file (bench/svi.py's "## SVI")
    old = path.read_text() if path.exists() else ""
    if "\n## SVI" in old:
        text += old[old.index("\n## SVI") :]
    path.write_text(text)
    print(f"wrote {path}")


def gpu_section(results: dict) -> list[str]:
    """RESULTS.md's section for ``bench/gpu_check.py``'s runs on a GPU."""
    env, runs = results.get("environment", {}), results.get("runs", {})
    for r in runs.values():
        r["derived"] = derive(r)
    gpu = results.get("gpu", {})
    lines = [
        "",
        "## On a GPU (bench/gpu_check.py)",
        "",
        f"- Date: {env.get('date', '?')}; GPU: {gpu.get('name', '?')} (driver "
        f"{gpu.get('driver', '?')}), host {env.get('cpu_model', '?')}, {env.get('nproc', '?')} "
        "CPUs",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v),
        "- Each run in a fresh process, cold compile caches (Inductor's and Triton's), "
        "float64, probtorch under `torch.set_default_device('cuda')`, NumPyro on JAX's GPU "
        "backend; no Pyro.",
        "",
    ]
    lines += _runs_table(runs)
    lines += ["", "Ratios against NumPyro on the GPU (its better chain method per metric):", ""]
    lines += _ratios_table(runs)
    return lines


def _runs_table(runs: dict) -> list[str]:
    """One row per (model, library, variant): the derived figures."""
    header = (
        "| model | library | chains × (warmup+draws) | first draw s | compile s | warmup s | "
        "sample s | total s | grad/s | min bulk ESS | ESS/s (sample) | ESS/s (total) | "
        "imports s | ESS/s (imports + total) | ESS/CPU-s (sample) | div | load (1 min) | "
        "bench wall s |"
    )
    lines = [header, "|" + "---|" * 18]
    order = {m: i for i, m in enumerate(MODELS)}
    for key in sorted(runs, key=lambda k: (order.get(k.split("/")[0], 99), k)):
        r = runs[key]
        cfg, d, full = r["config"], r.get("derived") or {}, r.get("full", {})
        plain = cfg["lib"] == "probtorch" and cfg["variant"] == "vectorized"
        lib = cfg["lib"] + ("" if plain else f" ({cfg['variant']})")
        setting = f"{cfg['num_chains']} × ({cfg['num_warmup']}+{cfg['num_samples']})"
        if d.get("repeats", 1) > 1:
            lo, hi = d["min_bulk_ess_range"]
            setting += f", median of {d['repeats']} seeds (ESS {lo:.0f}–{hi:.0f})"
        load = (full.get("loadavg") or [float("nan")])[0]
        if not d:
            err = (full.get("error") or r.get("probe", {}).get("error") or "?").strip()
            lines.append(
                f"| {cfg['model']} | {lib} | {setting} | failed: "
                f"{err.splitlines()[-1][:120].replace('|', '/')} |" + " |" * 14
            )
            continue
        wall = sum(f.get("process_wall_s", 0.0) for f in [full, *r.get("more_full", [])])
        wall += (r.get("probe") or {}).get("process_wall_s", 0.0)
        lines.append(
            f"| {cfg['model']} | {lib} | {setting} | {_fmt(d['first_draw_s'])} | "
            f"{_fmt(d['compile_s'])} | "
            f"{_fmt(d['warmup_s'])} | {_fmt(d['sample_s'])} | {_fmt(d['total_s'])} | "
            f"{d['grad_per_s']:.0f} | {d['min_bulk_ess']:.0f} | {_fmt(d['ess_per_s_sample'])} | "
            f"{_fmt(d['ess_per_s_total'], 2)} | {_fmt(d.get('import_s'), 2)} | "
            f"{_fmt(d.get('ess_per_s_to_result'), 2)} | {_fmt(d['ess_per_cpu_s_sample'])} | "
            f"{full.get('divergences', '–')} | {_fmt(load, 2)} | {wall:.0f} |"
        )
    return lines


def _ratios_table(runs: dict) -> list[str]:
    """probtorch's runs against NumPyro's better chain method and the longest Pyro run."""
    lines = [
        "| model | probtorch executor | vs | ESS/s (sample) | ESS/s (total) | "
        "ESS/s (imports + total) | grad/s | ESS/CPU-s | compile s (pt / other) | agreement |",
        "|" + "---|" * 10,
    ]
    # the known variants in their order, then any other in the runs ("sequential-lean", ...)
    ran = {k.split("/")[2] for k in runs if k.split("/")[1] == "probtorch"}
    variants = [v for v in PROBTORCH_VARIANTS if v in ran] + sorted(ran - {*PROBTORCH_VARIANTS})
    for model, variant in itertools.product(MODELS, variants):
        pt = runs.get(f"{model}/probtorch/{variant}")
        if not pt or not pt.get("derived"):
            continue
        p = pt["derived"]
        executor = variant.split("-", 1)[1] if "-" in variant else "quick"
        if variant.startswith("sequential"):
            executor = f"{executor}, chains sequential"
        others = []
        npy_s = _best_numpyro(runs, model, "ess_per_s_sample")
        npy_t = _best_numpyro(runs, model, "ess_per_s_total")
        if npy_s:
            others.append(("NumPyro", npy_s, npy_t))
        py = max(
            (r for k, r in runs.items() if k.startswith(f"{model}/pyro/") and r.get("derived")),
            key=lambda r: r["config"]["num_chains"] * r["config"]["num_samples"],
            default=None,
        )  # the longest Pyro run
        if py and variant == "vectorized":
            others.append(("Pyro", py, py))
        for name, o, o_t in others:
            od, otd = o["derived"], o_t["derived"]
            vs = f"{name} ({o['config']['variant']}"
            vs += ")" if o is o_t else f" / {o_t['config']['variant']})"
            lines.append(
                f"| {model} | {executor} | {vs} | "
                f"{p['ess_per_s_sample'] / od['ess_per_s_sample']:.2f} | "
                f"{p['ess_per_s_total'] / otd['ess_per_s_total']:.2f} | "
                f"{_ratio(p, otd, 'ess_per_s_to_result')} | "
                f"{p['grad_per_s'] / od['grad_per_s']:.2f} | "
                f"{p['ess_per_cpu_s_sample'] / od['ess_per_cpu_s_sample']:.2f} | "
                f"{_fmt(p['compile_s'])} / {_fmt(od['compile_s'])} | "
                f"{_fmt(_agreement(o, pt), 2)} |"
            )
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, help="default: all")
    ap.add_argument("--libs", nargs="+", choices=LIBS, help="default: all")
    ap.add_argument("--out", default=str(HERE / "results_mcmc.json"))
    ap.add_argument("--num-chains", type=int, default=4)
    ap.add_argument("--num-warmup", type=int, default=1000)
    ap.add_argument("--num-samples", type=int, default=1000)
    ap.add_argument(
        "--numpyro-chain-methods", nargs="+", default=["vectorized", "sequential"],
        choices=["vectorized", "sequential"],
    )  # fmt: skip
    ap.add_argument(
        "--probtorch-executors", nargs="+", default=["quick"],
        choices=["quick", "lean", "auto-cached", "split", "split-machine", "auto-machine"],
        help="NUTS(executor=...): 'quick' (Inductor, in-process), 'lean' (built before sampling), "
        "'auto-cached' (executor='auto' in a second process: caches warm), 'split' (the "
        "gradient compiled apart from the sampler graph; first model on the machine) and/or "
        "'split-machine' (the same after a run of another model built the sampler graph), "
        "'auto-machine' (the default executor='auto' after that build: it takes the split path)",
    )  # fmt: skip
    ap.add_argument(
        "--probtorch-chain-methods", nargs="+", default=["vectorized"],
        choices=["vectorized", "sequential"], help="MCMC(chain_method=...) for probtorch",
    )  # fmt: skip
    ap.add_argument(
        "--device", default="cpu", choices=["cpu", "cuda"],
        help="where probtorch and NumPyro sample (cuda: bench/gpu_check.py runs it)",
    )  # fmt: skip
    ap.add_argument(
        "--pyro", default="auto",
        help="'auto' (reduced settings for slow models, see PYRO_AUTO), 'full' (same as the "
        "others) or 'CHAINS,WARMUP,SAMPLES'",
    )  # fmt: skip
    ap.add_argument(
        "--cpu", default=str((os.cpu_count() or 1) - 1),
        help="CPU list for taskset -c ('none' to not pin)",
    )  # fmt: skip
    ap.add_argument(
        "--no-probe", dest="probe", action="store_false",
        help="skip the time-to-first-draw probe (a second cold start per run)",
    )  # fmt: skip
    ap.add_argument(
        "--repeats", type=int, default=1,
        help="full runs per job, with seeds 0, 1, ...; the libraries take turns and the "
        "tables show each figure's median (one seed's min bulk ESS moves by +-30%%)",
    )  # fmt: skip
    ap.add_argument("--timeout", type=float, default=3600.0, help="per subprocess, seconds")
    ap.add_argument(
        "--first-seed", type=int, default=0,
        help="the first seed of --repeats; seeds above 0 are added to the runs already in "
        "--out (more seeds for the medians)",
    )  # fmt: skip
    ap.add_argument("--warm-cache", action="store_true", help="reuse the Inductor disk cache")
    ap.add_argument("--fresh", action="store_true", help="discard results already in --out")
    ap.add_argument(
        "--write-results", action="store_true",
        help="render --out into --results-md (after running --models/--libs if given; "
        "with neither, only render)",
    )  # fmt: skip
    ap.add_argument("--results-md", default=str(HERE / "RESULTS.md"))
    ap.add_argument(
        "--gpu-results", default=str(HERE / "results_mcmc_gpu.json"),
        help="bench/gpu_check.py's runs, rendered as a section of --results-md if present",
    )  # fmt: skip
    ap.add_argument(
        "--notes", default=str(HERE / "results_notes.md"),
        help="markdown appended to --results-md (if the file exists)",
    )  # fmt: skip
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cpu == "none":
        args.cpu = None
    if args.worker:
        worker(args)
        return
    if args.write_results and args.models is None and args.libs is None:
        write_results(json.loads(Path(args.out).read_text()), args)
        return
    args.models = args.models or list(MODELS)
    args.libs = args.libs or list(LIBS)
    run_bench(args)


if __name__ == "__main__":
    main()
