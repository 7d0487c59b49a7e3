"""Side-by-side SVI benchmark: probtorch vs NumPyro vs Pyro, steps per second.

Two models, the same data, the same initial values and the same optimizer in the three
libraries (float32, Adam, one particle, ``Trace_ELBO``):

* ``logreg``: logistic regression (N=5000, D=25, N(0, 1) prior) with an ``AutoNormal``
  guide (locs initialized to 0, ``init_scale=0.1``), Adam lr 1e-2;
* ``vae``: a VAE on 2000 binary vectors of dimension 64 (drawn from a random 4-d latent
  model, fixed seed), latent dimension 8, MLP decoder 8-128-64 (ReLU) giving Bernoulli
  logits, amortized MLP encoder 64-128-16 (loc and log-scale of an 8-d Normal), minibatches
  of 256 by plate subsampling; the networks start from the same weights in every library
  (drawn once with numpy; NumPyro's MLP is written with ``numpyro.param`` arrays, Pyro and
  probtorch use ``torch.nn`` modules); Adam lr 1e-3.

Each (model, library, variant) runs in a fresh subprocess, pinned with ``taskset`` to one CPU,
one thread (``torch.set_num_threads(1)``, XLA single-thread flags), with a cold Inductor
cache for probtorch; the ``-cached`` probtorch variants run after an untimed first process
that filled the caches (a user's second session). In that process:

1. *time to result*: from nothing (guide and SVI objects not yet built) to the end of
   ``num_steps`` steps (``svi.run`` in probtorch and NumPyro, a ``svi.step()`` loop in Pyro);
   this includes tracing and compilation. Compilation is also timed from the compilers'
   own events (Dynamo's compile callbacks, JAX's ``/jax/core/compile/*`` durations).
   ``first_call_s``: time to the end of the first call that returns losses (probtorch: the
   first block of ``steps_per_call`` steps; Pyro: the first step; NumPyro: the whole run,
   one call).
2. *steady state*: ``reps`` further calls of ``steady_steps`` steps each on the same SVI
   object, each timed in wall and CPU time (``time.process_time``); the median is reported.
   Compilation that happens in these calls (NumPyro's ``svi.run`` traces its loop again on
   every call) is taken out of the wall time and reported.
3. *final loss*: the mean loss of the last 10% of the steps of (1), and ``-ELBO`` of the
   final parameters of (1) evaluated by one common numpy function (many particles, fixed
   seed), so that the three libraries are compared on the same estimator.

Usage::

    python bench/svi.py --out bench/results_svi.json            # run everything
    python bench/svi.py --models vae --libs probtorch --steps-per-call 1 8
    python bench/svi.py --write-results                          # -> "## SVI" in RESULTS.md

See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import math
import statistics
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

MODELS = ("logreg", "vae")
LIBS = ("probtorch", "numpyro", "pyro")

# steps of the time-to-result run; steps per steady-state call (divisible by 1, 8, 32)
NUM_STEPS = {"logreg": 5000, "vae": 2000}
STEADY_STEPS = {
    "logreg": {"probtorch": 8192, "numpyro": 8192, "pyro": 1000},
    "vae": {"probtorch": 1024, "numpyro": 1024, "pyro": 300},
}
LR = {"logreg": 1e-2, "vae": 1e-3}
INIT_SCALE = 0.1
VAE = {"n": 2000, "dim": 64, "latent": 8, "hidden": 128, "batch": 256}
SECTION = "## SVI"
NOTES_HEADING = "### What limits probtorch"


# ---------------------------------------------------------------------------------------
# Data and initial values: numpy, fixed seeds, identical for every library
# ---------------------------------------------------------------------------------------
def make_data(model: str) -> dict:
    if model == "logreg":
        rng = np.random.default_rng(1)
        n, d = 5000, 25
        X = rng.standard_normal((n, d))
        beta = rng.standard_normal(d)
        p = 1.0 / (1.0 + np.exp(-(X @ beta)))
        y = (rng.uniform(size=n) < p).astype(np.float32)
        return {"X": X.astype(np.float32), "y": y}
    if model == "vae":
        rng = np.random.default_rng(5)
        z = rng.standard_normal((VAE["n"], 4))
        W = 2.0 * rng.standard_normal((4, VAE["dim"]))
        b = rng.standard_normal(VAE["dim"])
        p = 1.0 / (1.0 + np.exp(-(z @ W + b)))
        x = (rng.uniform(size=p.shape) < p).astype(np.float32)
        return {"x": x}
    raise ValueError(f"unknown model {model!r}")


VAE_LAYERS = {  # name: (fan_in, fan_out), weights stored as (fan_in, fan_out)
    "enc1": (VAE["dim"], VAE["hidden"]),
    "enc2": (VAE["hidden"], 2 * VAE["latent"]),
    "dec1": (VAE["latent"], VAE["hidden"]),
    "dec2": (VAE["hidden"], VAE["dim"]),
}


def vae_init() -> dict:
    """torch.nn.Linear's default init (U(-1/sqrt(fan_in), 1/sqrt(fan_in))), drawn by numpy."""
    rng = np.random.default_rng(7)
    out = {}
    for name, (fan_in, fan_out) in VAE_LAYERS.items():
        bound = 1.0 / math.sqrt(fan_in)
        out[f"{name}_w"] = rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32)
        out[f"{name}_b"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return out


def _torch_mlps():
    """Encoder and decoder as torch.nn modules holding :func:`vae_init`'s weights."""
    import torch

    init = vae_init()

    def mlp(first, second):
        layers = []
        for name in (first, second):
            fan_in, fan_out = VAE_LAYERS[name]
            lin = torch.nn.Linear(fan_in, fan_out)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(init[f"{name}_w"].T.copy()))
                lin.bias.copy_(torch.from_numpy(init[f"{name}_b"]))
            layers.append(lin)
        return torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1])

    return mlp("enc1", "enc2"), mlp("dec1", "dec2")


def _torch_mlp_params(encoder, decoder) -> dict:
    out = {}
    for prefix, net in (("enc", encoder), ("dec", decoder)):
        for i, idx in ((1, 0), (2, 2)):
            out[f"{prefix}{i}_w"] = net[idx].weight.detach().numpy().T.copy()
            out[f"{prefix}{i}_b"] = net[idx].bias.detach().numpy().copy()
    return out


# ---------------------------------------------------------------------------------------
# Workers: one (model, library, variant) in this process
# ---------------------------------------------------------------------------------------
_cpu = cpu_seconds


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


def _steady(call, reps: int, steps: int, compiles: list) -> dict:
    """Time ``reps`` calls of ``call()`` (each ``steps`` steps): wall, CPU, compile inside."""
    walls, cpus, comp = [], [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        t1, c1 = time.perf_counter(), time.process_time()
        inside = _union_length(compiles, t0, t1)
        walls.append(t1 - t0 - inside)
        cpus.append(c1 - c0)
        comp.append(inside)
    return {
        "steady_steps": steps,
        "steady_wall_s": walls,
        "steady_cpu_s": cpus,
        "steady_compile_s": comp,
    }


def run_probtorch(model: str, cfg: dict) -> dict:
    import torch
    from torch._dynamo.callback import callback_handler

    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.inference import SVI, Trace_ELBO
    from probtorch.inference.autoguide import AutoNormal
    from probtorch.inference.init_strategies import init_to_value

    torch.set_num_threads(1)
    # Dynamo reports each outermost compile (tracing, AOT autograd, Inductor, the C++
    # compiler) as start/end callbacks.
    compiles, open_at = [], []
    callback_handler.register_start_callback(lambda a: open_at.append(time.perf_counter()))
    callback_handler.register_end_callback(
        lambda a: compiles.append((open_at.pop(), time.perf_counter()))
    )
    # SVI.run's in-place block captures its graph (make_fx) and compiles it with Inductor
    # outside Dynamo, and captures a probe at the start of each run: time them as compiles.
    svi_block = importlib.import_module("probtorch.inference.svi_block")

    timed = timed_into(compiles)
    for name in ("_compile", "_fingerprint"):
        if hasattr(svi_block.InPlaceBlock, name):
            setattr(svi_block.InPlaceBlock, name, timed(getattr(svi_block.InPlaceBlock, name)))

    data = {k: torch.from_numpy(v) for k, v in make_data(model).items()}
    t0, c0 = time.perf_counter(), _cpu()
    if model == "logreg":
        args = (data["X"], data["y"])

        def logreg(X, y):
            beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            with pt.plate("n", X.shape[0]):
                pt.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

        fn = logreg
        guide = AutoNormal(
            fn,
            init_loc_fn=init_to_value(values={"beta": torch.zeros(args[0].shape[1])}),
            init_scale=INIT_SCALE,
        )
    else:
        args = (data["x"],)
        encoder, decoder = _torch_mlps()
        L, B = VAE["latent"], VAE["batch"]

        def vae_model(x):
            dec = pt.module("decoder", decoder)
            with pt.plate("data", x.shape[0], subsample_size=B) as idx:
                z = pt.sample("z", dist.Normal(torch.zeros(L), torch.ones(L)).to_event(1))
                pt.sample("obs", dist.Bernoulli(logits=dec(z)).to_event(1), obs=x[idx])

        def vae_guide(x):
            enc = pt.module("encoder", encoder)
            with pt.plate("data", x.shape[0], subsample_size=B) as idx:
                h = enc(x[idx])
                pt.sample("z", dist.Normal(h[:, :L], h[:, L:].exp()).to_event(1))

        fn, guide = vae_model, vae_guide
    svi = SVI(
        fn,
        guide,
        pt.optim.Adam(lr=LR[model]),
        Trace_ELBO(),
        seed=0,
        steps_per_call=cfg["steps_per_call"],
    )
    first = []
    run_block = svi._run_block  # timing only: when the first block has returned

    def timed_run_block(*a, **k):
        out = run_block(*a, **k)
        if not first:
            first.append((time.perf_counter(), _cpu()))
        return out

    svi._run_block = timed_run_block
    result = svi.run(cfg["num_steps"], *args, progress_bar=False)
    t1, c1 = time.perf_counter(), _cpu()
    svi._run_block = run_block
    losses = result.losses.numpy()
    if model == "logreg":
        params = {
            "loc": result.params["auto.loc.beta"].numpy(),
            "scale": result.params["auto.scale.beta"].numpy(),
        }
    else:
        params = _torch_mlp_params(encoder, decoder)  # SVI syncs the modules after run
    n_compiles = len(compiles)
    steady = _steady(
        lambda: svi.run(cfg["steady_steps"], *args, progress_bar=False),
        cfg["reps"],
        cfg["steady_steps"],
        compiles,
    )
    return {
        "time_to_result_s": t1 - t0,
        "time_to_result_cpu_s": c1 - c0,
        "first_call_s": first[0][0] - t0,
        "first_call_steps": min(cfg["steps_per_call"], cfg["num_steps"]),
        "compile_s": _union_length(compiles, t0, t1),
        "compile_events": n_compiles,
        "steady_compile_events": len(compiles) - n_compiles,
        "losses": losses,
        "params": params,
        **steady,
    }


def run_numpyro(model: str, cfg: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal
    from numpyro.infer.initialization import init_to_value

    jax.config.update("jax_cpu_enable_async_dispatch", False)
    compiles = jax_compile_intervals()
    data = {k: jnp.asarray(v) for k, v in make_data(model).items()}
    t0, c0 = time.perf_counter(), _cpu()
    if model == "logreg":
        args = (data["X"], data["y"])

        def logreg(X, y):
            beta = numpyro.sample(
                "beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1)
            )
            with numpyro.plate("n", X.shape[0]):
                numpyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

        fn = logreg
        guide = AutoNormal(
            fn,
            init_loc_fn=init_to_value(values={"beta": jnp.zeros(args[0].shape[1])}),
            init_scale=INIT_SCALE,
        )
    else:
        args = (data["x"],)
        init = {k: jnp.asarray(v) for k, v in vae_init().items()}
        L, B = VAE["latent"], VAE["batch"]

        def mlp(prefix, h):
            p = {k: numpyro.param(k, init[k]) for k in init if k.startswith(prefix)}
            h = jax.nn.relu(h @ p[f"{prefix}1_w"] + p[f"{prefix}1_b"])
            return h @ p[f"{prefix}2_w"] + p[f"{prefix}2_b"]

        def vae_model(x):
            with numpyro.plate("data", x.shape[0], subsample_size=B) as idx:
                z = numpyro.sample("z", dist.Normal(jnp.zeros(L), jnp.ones(L)).to_event(1))
                logits = mlp("dec", z)
                numpyro.sample("obs", dist.Bernoulli(logits=logits).to_event(1), obs=x[idx])

        def vae_guide(x):
            with numpyro.plate("data", x.shape[0], subsample_size=B) as idx:
                h = mlp("enc", x[idx])
                numpyro.sample("z", dist.Normal(h[:, :L], jnp.exp(h[:, L:])).to_event(1))

        fn, guide = vae_model, vae_guide
    svi = SVI(fn, guide, numpyro.optim.Adam(LR[model]), Trace_ELBO())
    result = svi.run(jax.random.PRNGKey(0), cfg["num_steps"], *args, progress_bar=False)
    losses = np.asarray(jax.block_until_ready(result.losses))
    t1, c1 = time.perf_counter(), _cpu()
    if model == "logreg":
        params = {
            "loc": np.asarray(result.params["beta_auto_loc"]),
            "scale": np.asarray(result.params["beta_auto_scale"]),
        }
    else:
        params = {k: np.asarray(result.params[k]) for k in vae_init()}
    n_compiles = len(compiles)
    # svi.run traces and compiles its lax.scan again on every call (a new closure each
    # time); the steady state is that same scan over svi.update, jitted once and compiled
    # in an untimed call first.
    loop = jax.jit(
        lambda s: jax.lax.scan(
            lambda s, _: svi.update(s, *args), s, None, length=cfg["steady_steps"]
        )
    )
    state = [jax.block_until_ready(loop(result.state))[0]]

    def call():
        new_state, out = loop(state[-1])
        jax.block_until_ready(out)
        state.append(new_state)

    steady = _steady(call, cfg["reps"], cfg["steady_steps"], compiles)
    return {
        "time_to_result_s": t1 - t0,
        "time_to_result_cpu_s": c1 - c0,
        "first_call_s": t1 - t0,
        "first_call_steps": cfg["num_steps"],
        "compile_s": _union_length(compiles, t0, t1),
        "compile_events": n_compiles,
        "steady_compile_events": len(compiles) - n_compiles,
        "losses": losses,
        "params": params,
        **steady,
    }


def run_pyro(model: str, cfg: dict) -> dict:
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal
    from pyro.infer.autoguide.initialization import init_to_value

    torch.set_num_threads(1)
    pyro.set_rng_seed(0)
    pyro.clear_param_store()
    pyro.enable_validation(False)  # Pyro's fastest setting (validation is on by default)
    data = {k: torch.from_numpy(v) for k, v in make_data(model).items()}
    t0, c0 = time.perf_counter(), _cpu()
    if model == "logreg":
        args = (data["X"], data["y"])

        def logreg(X, y):
            beta = pyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
            with pyro.plate("n", X.shape[0]):
                pyro.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)

        fn = logreg
        guide = AutoNormal(
            fn,
            init_loc_fn=init_to_value(values={"beta": torch.zeros(args[0].shape[1])}),
            init_scale=INIT_SCALE,
        )
    else:
        args = (data["x"],)
        encoder, decoder = _torch_mlps()
        L, B = VAE["latent"], VAE["batch"]

        def vae_model(x):
            pyro.module("decoder", decoder)
            with pyro.plate("data", x.shape[0], subsample_size=B) as idx:
                z = pyro.sample("z", dist.Normal(torch.zeros(L), torch.ones(L)).to_event(1))
                pyro.sample("obs", dist.Bernoulli(logits=decoder(z)).to_event(1), obs=x[idx])

        def vae_guide(x):
            pyro.module("encoder", encoder)
            with pyro.plate("data", x.shape[0], subsample_size=B) as idx:
                h = encoder(x[idx])
                pyro.sample("z", dist.Normal(h[:, :L], h[:, L:].exp()).to_event(1))

        fn, guide = vae_model, vae_guide
    svi = SVI(fn, guide, pyro.optim.Adam({"lr": LR[model]}), Trace_ELBO())
    losses = [svi.step(*args)]
    t_first = time.perf_counter()
    for _ in range(cfg["num_steps"] - 1):
        losses.append(svi.step(*args))
    t1, c1 = time.perf_counter(), _cpu()
    if model == "logreg":
        store = pyro.get_param_store()
        params = {
            "loc": store["AutoNormal.locs.beta"].detach().numpy().copy(),
            "scale": store["AutoNormal.scales.beta"].detach().numpy().copy(),
        }
    else:
        params = _torch_mlp_params(encoder, decoder)

    def call():
        for _ in range(cfg["steady_steps"]):
            svi.step(*args)

    steady = _steady(call, cfg["reps"], cfg["steady_steps"], [])
    return {
        "time_to_result_s": t1 - t0,
        "time_to_result_cpu_s": c1 - c0,
        "first_call_s": t_first - t0,
        "first_call_steps": 1,
        "compile_s": 0.0,
        "compile_events": 0,
        "steady_compile_events": 0,
        "losses": np.asarray(losses, dtype=np.float64),
        "params": params,
        **steady,
    }


RUNNERS = {"probtorch": run_probtorch, "numpyro": run_numpyro, "pyro": run_pyro}


def worker(args) -> None:
    cfg = json.loads(args.worker)
    info = RUNNERS[cfg["lib"]](cfg["model"], cfg)
    losses = np.asarray(info.pop("losses"), dtype=np.float64)
    params = info.pop("params")
    tail = max(len(losses) // 10, 1)
    info["final_loss_tail"] = float(losses[-tail:].mean())
    info["final_loss_tail_steps"] = tail
    info["loss_first"] = float(losses[0])
    info["losses_finite"] = bool(np.isfinite(losses).all())
    info["eval"] = evaluate(cfg["model"], params)
    info["params_summary"] = {k: [float(v.mean()), float(v.std())] for k, v in params.items()}
    print(RESULT_TAG + json.dumps(info))


# ---------------------------------------------------------------------------------------
# The common loss estimate: -ELBO of the final params, numpy, float64, fixed seed
# ---------------------------------------------------------------------------------------
def _softplus(x):
    return np.logaddexp(0.0, x)


def _log_normal(x, loc, scale):
    return -0.5 * ((x - loc) / scale) ** 2 - np.log(scale) - 0.5 * math.log(2 * math.pi)


def evaluate(model: str, params: dict) -> dict:
    """``-ELBO`` (full data) of the final params by many draws: ``{"loss", "se"}``."""
    data = {k: v.astype(np.float64) for k, v in make_data(model).items()}
    rng = np.random.default_rng(123)
    p = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    if model == "logreg":
        S = 4000
        eps = rng.standard_normal((S, p["loc"].size))
        beta = p["loc"] + p["scale"] * eps
        logits = beta @ data["X"].T  # (S, N)
        loglik = (data["y"] * logits - _softplus(logits)).sum(-1)
        elbo = (
            loglik
            + _log_normal(beta, 0.0, 1.0).sum(-1)
            - _log_normal(beta, p["loc"], p["scale"]).sum(-1)
        )
    else:
        S, x, L = 200, data["x"], VAE["latent"]
        h = np.maximum(x @ p["enc1_w"] + p["enc1_b"], 0.0) @ p["enc2_w"] + p["enc2_b"]
        loc, scale = h[:, :L], np.exp(h[:, L:])
        elbo = np.empty(S)
        for s in range(S):  # one full-data ELBO draw per s
            z = loc + scale * rng.standard_normal(loc.shape)
            hd = np.maximum(z @ p["dec1_w"] + p["dec1_b"], 0.0)
            logits = hd @ p["dec2_w"] + p["dec2_b"]
            elbo[s] = (
                (x * logits - _softplus(logits)).sum()
                + _log_normal(z, 0.0, 1.0).sum()
                - _log_normal(z, loc, scale).sum()
            )
    return {"loss": float(-elbo.mean()), "se": float(elbo.std() / math.sqrt(len(elbo)))}


# ---------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------


def derive(r: dict) -> dict:
    """Steady-state rates (median over calls) and the setup cost of the time-to-result run."""
    if "error" in r:
        return {}
    steps = r["steady_steps"]
    wall = statistics.median(r["steady_wall_s"])
    cpu = statistics.median(r["steady_cpu_s"])
    rate = steps / wall
    return {
        "steps_per_s": rate,
        "steps_per_cpu_s": steps / cpu,
        "cpu_share": cpu / wall,
        # what the time-to-result run cost beyond its steps at the steady rate
        "setup_s": r["time_to_result_s"] - r["num_steps"] / rate,
    }


def _spc(variant: str) -> int:
    """steps_per_call of a probtorch variant name (``spc8``, ``spc1-cached``); 0 otherwise."""
    return int(variant[3:].split("-")[0]) if variant.startswith("spc") else 0


def jobs_for(args) -> list[dict]:
    jobs = []
    for model in args.models:
        for lib in args.libs:
            variants = [lib]
            if lib == "probtorch":
                variants = [f"spc{k}" for k in args.steps_per_call]
                variants += [f"spc{k}-cached" for k in args.cached_steps_per_call]
            for variant in variants:
                cfg = {
                    "model": model,
                    "lib": lib,
                    "variant": variant,
                    "num_steps": NUM_STEPS[model],
                    "steady_steps": STEADY_STEPS[model][lib],
                    "reps": args.reps,
                }
                if lib == "probtorch":
                    cfg["steps_per_call"] = _spc(variant)
                if variant.endswith("-cached"):  # a second process: caches filled by a first
                    k = cfg["steps_per_call"]
                    cfg["prebuild"] = dict(cfg, num_steps=k, steady_steps=k, reps=1)
                jobs.append(cfg)
    return jobs


def run_bench(args) -> None:
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() and not args.fresh else {}
    results.setdefault("runs", {})
    results["environment"] = environment()
    results["settings"] = {"cpu": args.cpu, "reps": args.reps, "float": "float32"}
    for cfg in jobs_for(args):
        key = f"{cfg['model']}/{cfg['lib']}/{cfg['variant']}"
        print(f"== {key}", flush=True)
        rec = spawn(__file__, cfg, args.cpu, args.timeout)
        rec.update(config=cfg, num_steps=cfg["num_steps"])
        rec["started"] = _dt.datetime.now().isoformat(timespec="seconds")
        if "error" in rec:
            print("   ERROR " + rec["error"].strip().splitlines()[-1][:300], flush=True)
        else:
            d = derive(rec)
            print(
                f"   {d['steps_per_s']:.0f} steps/s ({d['steps_per_cpu_s']:.0f}/CPU-s) | "
                f"first call {rec['first_call_s']:.1f}s, compile {rec['compile_s']:.1f}s | "
                f"{cfg['num_steps']} steps in {rec['time_to_result_s']:.1f}s | "
                f"loss {rec['final_loss_tail']:.2f}, eval {rec['eval']['loss']:.2f}"
                f"±{rec['eval']['se']:.2f} | load {rec['loadavg']}",
                flush=True,
            )
        results["runs"][key] = rec
        out.write_text(json.dumps(results, indent=1))
    if args.write_results:
        write_results(results, args)


# ---------------------------------------------------------------------------------------
# RESULTS.md: the "## SVI" section at the end (the text under NOTES_HEADING is kept)
# ---------------------------------------------------------------------------------------
def _fmt(x, nd=1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{nd}f}"


def _pm(ev: dict) -> str:
    nd = 2 if ev["se"] < 0.5 else 1
    return f"{ev['loss']:.{nd}f} ± {ev['se']:.{nd}f}"


def _best(runs: dict, model: str, lib: str):
    """The run with the most steps per CPU-second (cold-cache runs only)."""
    cands = [
        r
        for k, r in runs.items()
        if k.startswith(f"{model}/{lib}/") and "error" not in r and not k.endswith("-cached")
    ]
    return max(cands, key=lambda r: derive(r)["steps_per_cpu_s"], default=None)


def render_section(results: dict) -> str:
    env, runs, st = results.get("environment", {}), results.get("runs", {}), results["settings"]
    loads = [r["loadavg"] for r in runs.values() if r.get("loadavg")]
    lo = min((x[0] for x in loads), default=float("nan"))
    hi = max((x[0] for x in loads), default=float("nan"))
    lines = [
        SECTION,
        "",
        "probtorch vs NumPyro vs Pyro, SVI steps per second. Generated by "
        "`python bench/svi.py --write-results` from `bench/results_svi.json`; the method is in "
        "the docstring of bench/svi.py and in bench/README.md.",
        "",
        f"- Date: {env.get('date', '?')[:10]}; machine: {env.get('cpu_model', '?')}, "
        f"{env.get('nproc', '?')}-core shared CPU (other jobs ran on it: 1-minute load "
        f"average {_fmt(lo, 2)}–{_fmt(hi, 2)} at the starts of the runs).",
        "- Versions: "
        + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)
        + f"; probtorch tree {env.get('probtorch_code')}.",
        f"- Each run in a fresh process, `taskset -c {st.get('cpu')}`, one thread "
        f"(`torch.set_num_threads(1)`, XLA_FLAGS=`{XLA_FLAGS}`), float32, cold Inductor "
        "cache; Pyro with validation off (`pyro.enable_validation(False)`), its fastest "
        "setting.",
        f"- logreg: N=5000, D=25, AutoNormal (locs 0, init_scale {INIT_SCALE}), Adam lr "
        f"{LR['logreg']}, Trace_ELBO, one particle, {NUM_STEPS['logreg']} steps. vae: 2000 "
        f"binary 64-vectors, latent 8, encoder 64-128-16, decoder 8-128-64 (ReLU), same "
        f"initial weights in all three, minibatch 256 by plate subsampling, Adam lr "
        f"{LR['vae']}, {NUM_STEPS['vae']} steps.",
        "- steps/s: median over "
        f"{st.get('reps')} further calls after the time-to-result run (wall time less any "
        "compilation inside; steps per CPU-second alongside, the steadier figure on a shared "
        "core). first call: time to the end of the first call that returns losses "
        "(probtorch: a block of steps_per_call steps; Pyro: one step; NumPyro: the whole "
        "run). compile: the compilers' own events. setup: time to result less the steps at "
        "the steady rate. Final loss: mean of the last 10% of the per-step losses; "
        "−ELBO (eval): the final params of the time-to-result run, evaluated by one common "
        "numpy estimator (logreg 4000 draws, vae 200 full-data draws; ± standard error).",
        "",
        "| model | library | steps/s | steps/CPU-s | first call s | compile s | setup s "
        "| time to result s (steps) | final loss (last 10%) | −ELBO (eval) | load 1 min |",
        "|" + "---|" * 11,
    ]
    order = {m: i for i, m in enumerate(MODELS)}
    lib_order = {lib: i for i, lib in enumerate(LIBS)}

    def sort_key(k):
        model, lib, variant = k.split("/")
        return (order.get(model, 9), lib_order.get(lib, 9), variant.endswith("-cached"),
                _spc(variant))  # fmt: skip

    for key in sorted(runs, key=sort_key):
        r = runs[key]
        cfg = r["config"]
        lib = cfg["lib"]
        if lib == "probtorch":
            warm = ", second process: caches warm" if cfg.get("prebuild") else ""
            lib += f" (steps_per_call={cfg['steps_per_call']}{warm})"
        if "error" in r:
            err = r["error"].strip().splitlines()[-1][:100].replace("|", "/")
            lines.append(f"| {cfg['model']} | {lib} | failed: {err} |" + " |" * 8)
            continue
        d = derive(r)
        lines.append(
            f"| {cfg['model']} | {lib} | {_fmt(d['steps_per_s'])} | "
            f"{_fmt(d['steps_per_cpu_s'])} | {_fmt(r['first_call_s'])} | "
            f"{_fmt(r['compile_s'])} | {_fmt(d['setup_s'])} | "
            f"{_fmt(r['time_to_result_s'])} ({cfg['num_steps']}) | "
            f"{r['final_loss_tail']:.1f} | {_pm(r['eval'])} | "
            f"{_fmt(r['loadavg'][0], 2)} |"
        )
    lines += [
        "",
        "Ratios, probtorch (its best steps_per_call by steps/CPU-s) / other; > 1: probtorch "
        "is faster. Targets: ≥ 1 against NumPyro, ≥ 5 against Pyro (steps/s).",
        "",
        "| model | probtorch variant | vs | steps/s | steps/CPU-s | time to result "
        "(other / probtorch's soonest cold run, its steps_per_call) |",
        "|" + "---|" * 6,
    ]
    for model in MODELS:
        pt = _best(runs, model, "probtorch")
        if pt is None:
            continue
        p = derive(pt)
        soonest = min(
            (r for k, r in runs.items()
             if k.startswith(f"{model}/probtorch/") and "error" not in r
             and not k.endswith("-cached")),
            key=lambda r: r["time_to_result_s"],
        )  # fmt: skip
        for lib, name in (("numpyro", "NumPyro"), ("pyro", "Pyro")):
            o = _best(runs, model, lib)
            if o is None:
                continue
            od = derive(o)
            lines.append(
                f"| {model} | steps_per_call={pt['config']['steps_per_call']} | {name} | "
                f"{p['steps_per_s'] / od['steps_per_s']:.2f} | "
                f"{p['steps_per_cpu_s'] / od['steps_per_cpu_s']:.2f} | "
                f"{o['time_to_result_s'] / soonest['time_to_result_s']:.2f} "
                f"({soonest['config']['steps_per_call']}) |"
            )
    warm = [(k, r) for k, r in sorted(runs.items()) if k.endswith("-cached") and "error" not in r]
    if warm:
        lines += [
            "",
            "Time to result in a second process (probtorch's compile caches filled by a first "
            "one; NumPyro and Pyro keep no compile cache between processes, so their runs "
            "above are the comparison): other / probtorch, > 1: probtorch is sooner.",
            "",
            "| model | probtorch variant | time to result s | vs NumPyro | vs Pyro |",
            "|" + "---|" * 5,
        ]
        for _, r in warm:
            model = r["config"]["model"]
            others = [_best(runs, model, lib) for lib in ("numpyro", "pyro")]
            ratios = [
                f"{o['time_to_result_s'] / r['time_to_result_s']:.2f}" if o else "–"
                for o in others
            ]
            lines.append(
                f"| {model} | steps_per_call={r['config']['steps_per_call']} | "
                f"{_fmt(r['time_to_result_s'])} | {ratios[0]} | {ratios[1]} |"
            )
    return "\n".join(lines) + "\n"


def write_results(results: dict, args) -> None:
    path = Path(args.results_md)
    text = path.read_text() if path.exists() else ""
    notes = ""
    start = text.find("\n" + SECTION + "\n")
    if start >= 0:
        old = text[start + 1 :]
        text = text[: start + 1]
        at = old.find(NOTES_HEADING)
        if at >= 0:
            notes = old[at:]
    section = render_section(results)
    if notes:
        section += "\n" + notes.rstrip() + "\n"
    path.write_text(text.rstrip("\n") + "\n\n" + section)
    print(f"wrote the {SECTION!r} section of {path}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, help="default: all")
    ap.add_argument("--libs", nargs="+", choices=LIBS, help="default: all")
    ap.add_argument(
        "--steps-per-call", nargs="+", type=int, default=[1, 8, 32],
        help="probtorch SVI(steps_per_call=...) variants",
    )  # fmt: skip
    ap.add_argument(
        "--cached-steps-per-call", nargs="*", type=int, default=[1],
        help="probtorch variants also run in a second process with warm compile caches",
    )  # fmt: skip
    ap.add_argument("--reps", type=int, default=3, help="steady-state calls per run")
    ap.add_argument("--out", default=str(HERE / "results_svi.json"))
    ap.add_argument("--cpu", default="1", help="CPU list for taskset -c ('none': no pinning)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="per subprocess, seconds")
    ap.add_argument("--fresh", action="store_true", help="discard results already in --out")
    ap.add_argument(
        "--write-results", action="store_true",
        help="render --out into the SVI section of --results-md (after running --models/"
        "--libs if given; with neither, only render)",
    )  # fmt: skip
    ap.add_argument("--results-md", default=str(HERE / "RESULTS.md"))
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
