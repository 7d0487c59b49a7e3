"""probtorch on a CUDA GPU: one prepared script for a session that is lent one.

Checks the compiled engines on the GPU, then runs the NUTS benchmark there
(``bench/mcmc.py --device cuda``: probtorch and NumPyro, both chain methods) for as long as a
time budget allows. Each step's outcome is written to ``OUT/gpu_check.json`` as soon as it
is known, and the benchmark's runs to ``OUT/results_mcmc_gpu.json`` (bench/mcmc.py's format)
as each finishes, so a run cut short keeps what it did.

Checks (sampling with ``torch.set_default_device(device)``, as a user would on a GPU):

- ``compiled_matches_eager`` (float64, float32): eight schools, NUTS with a fixed step size,
  compiled (quick path) against ``compile=False`` from the same seed: leading draws that
  agree, no graph breaks, and a continued run compiles nothing (``fail_on_recompile``);
- ``closed_form`` (float64, float32): a normal mean with known noise under the default
  executor (which stays on the quick path off the CPU): posterior mean within 4 Monte Carlo
  standard errors of the exact one, sd within 10 %, R-hat < 1.01, no divergences;
- ``hmc``: the same posterior with compiled HMC;
- ``svi``: a compiled SVI step (AutoNormal) on the same model puts the guide within half a
  posterior sd of the exact posterior mean.

Usage, on the device machine (bench/README.md, "GPU check", has the whole command)::

    python3 bench/gpu_check.py --out "$OUT" --budget 360

and on a CPU, as a dry run of the same steps with short runs::

    python bench/gpu_check.py --device cpu --quick --budget 200 --out /tmp/gpu_dry

Render the benchmark into bench/RESULTS.md after copying it to bench/results_mcmc_gpu.json:
``python bench/mcmc.py --write-results --out bench/results_mcmc.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

# (model, library, chain method), most wanted first: eight schools both ways (the GPU's
# default chain method), then the others' vectorized pairs, then more sequential runs.
BENCH_ORDER = [
    ("eight_schools", "probtorch", "vectorized"),
    ("eight_schools", "numpyro", "vectorized"),
    ("eight_schools", "probtorch", "sequential"),
    ("logreg", "probtorch", "vectorized"),
    ("logreg", "numpyro", "vectorized"),
    ("saas_gp", "probtorch", "vectorized"),
    ("saas_gp", "numpyro", "vectorized"),
    ("eight_schools", "numpyro", "sequential"),
    ("logreg", "probtorch", "sequential"),
    ("hier_reg", "probtorch", "vectorized"),
    ("hier_reg", "numpyro", "vectorized"),
    ("gauss100_dense", "probtorch", "vectorized"),
    ("gauss100_dense", "numpyro", "vectorized"),
    ("gauss100_diag", "probtorch", "vectorized"),
    ("gauss100_diag", "numpyro", "vectorized"),
    ("logreg", "numpyro", "sequential"),
    ("saas_gp", "probtorch", "sequential"),
    ("saas_gp", "numpyro", "sequential"),
    # the lean executor (AOTInductor package, C++ loop), never run on a GPU: "auto" keeps
    # a GPU sampler off it until it is measured there
    ("eight_schools", "probtorch", "vectorized-lean"),
    ("logreg", "probtorch", "vectorized-lean"),
]
MIN_JOB_S = 60.0  # a benchmark job is not started with less of the budget left


class Report:
    """``OUT/gpu_check.json``, rewritten after every step."""

    def __init__(self, out: Path):
        self.path = out / "gpu_check.json"
        self.data = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "checks": {}}

    def add(self, name: str, result: dict) -> None:
        self.data["checks"][name] = result
        status = "ok" if result.get("ok") else ("FAILED" if "ok" in result else "info")
        print(f"[{status}] {name}: {json.dumps(result, default=str)[:600]}", flush=True)
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def run_check(report: Report, name: str, fn, *args) -> None:
    start = time.perf_counter()
    try:
        result = fn(*args)
    except Exception as error:  # a failed check is reported; the others still run
        result = {"ok": False, "error": f"{type(error).__name__}: {error}",
                  "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
    result["seconds"] = round(time.perf_counter() - start, 1)
    report.add(name, result)


def environment(device: str) -> dict:
    import torch

    info = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, sms=props.multi_processor_count)  # fmt: skip
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    for pkg in ("pyro", "arviz", "numpyro", "jax"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception as error:  # noqa: BLE001 -- a missing peer is information here
            info[pkg] = f"unavailable: {type(error).__name__}: {error}"
    return info


def _on(device: str, dtype):
    """Sample on ``device`` in ``dtype`` (torch's defaults, as a user's script sets them)."""
    import torch

    torch.set_default_device(device)
    torch.set_default_dtype(dtype)


def _eight_schools(dtype):
    import torch
    from mcmc import make_data, probtorch_model

    fn, args = probtorch_model("eight_schools", make_data("eight_schools"))
    return fn, tuple(a.to(dtype) if torch.is_floating_point(a) else a for a in args)


def check_compiled_matches_eager(device: str, dtype_name: str, num_samples: int) -> dict:
    import torch

    from probtorch.inference import MCMC, NUTS
    from probtorch.inference.compile import count_compiles

    dtype = getattr(torch, dtype_name)
    _on(device, dtype)
    fn, args = _eight_schools(dtype)
    runs = {}
    for compiled in (False, True):
        kernel = NUTS(fn, compile=compiled, executor="quick", step_size=0.3,
                      adapt_step_size=False, adapt_mass_matrix=False)  # fmt: skip
        mcmc = MCMC(kernel, num_warmup=0, num_samples=num_samples, num_chains=4, seed=1,
                    progress_bar=False)  # fmt: skip
        with count_compiles() as first:
            mcmc.run(*args, extra_fields=("num_steps",))
        runs[compiled] = (mcmc, first)
    (eager, _), (comp, first) = runs[False], runs[True]
    tol = 1e-8 if dtype == torch.float64 else 1e-4
    e_steps = eager.get_extra_fields(group_by_chain=True)["num_steps"]
    c_steps = comp.get_extra_fields(group_by_chain=True)["num_steps"]
    e_z = torch.cat([v.reshape(4, num_samples, -1) for v in
                     eager.get_samples(group_by_chain=True).values()], -1)  # fmt: skip
    c_z = torch.cat([v.reshape(4, num_samples, -1) for v in
                     comp.get_samples(group_by_chain=True).values()], -1)  # fmt: skip
    same = (e_steps == c_steps).all(0) & ((e_z - c_z).abs().amax((0, 2)) < tol)
    leading = int(same.long().cumprod(0).sum())
    # a continued run reuses the compiled graphs
    comp.post_warmup_state = comp.last_state
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        comp.run(*args)
    need = 10 if dtype == torch.float64 else 3
    return {
        "ok": bool(
            leading >= min(need, num_samples)
            and first.graph_breaks == 0
            and later.graph_breaks == 0
            and later.graphs == 0
            and comp.kernel.potential.compiled
        ),  # fmt: skip
        "leading_draws_agreeing": leading,
        "draws": num_samples,
        "tolerance": tol,
        "max_abs_diff_first_10": float((e_z[:, :10] - c_z[:, :10]).abs().max()),
        "graph_breaks": first.graph_breaks,
        "graphs_first_run": first.graphs,
        "graphs_continued_run": later.graphs,
        "block_loop": type(comp.kernel._block_loop).__name__,
        "draws_device": str(comp.get_samples()["mu"].device),
    }


def _known_noise(n: int = 20):
    """y_i ~ N(mu, 1), mu ~ N(0, 10^2): the exact posterior of mu."""
    import torch

    import probtorch as pt
    import probtorch.distributions as dist

    g = torch.Generator().manual_seed(0)
    y = 1.5 + torch.randn(n, generator=g, dtype=torch.float64, device="cpu")
    y = y.to(torch.get_default_device(), torch.get_default_dtype())

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("n", len(y)):
            pt.sample("obs", dist.Normal(mu, 1.0), obs=y)

    precision = 1 / 10.0**2 + n
    return model, y, float(y.sum()) / precision, precision**-0.5


def _posterior_ok(mcmc, exact_mean: float, exact_sd: float, max_rhat: float) -> dict:
    import arviz as az
    import numpy as np

    draws = mcmc.get_samples(group_by_chain=True)["mu"].double().cpu().numpy()
    ess = float(az.ess(draws, method="bulk"))
    rhat = float(az.rhat(draws))
    mean, sd = float(np.mean(draws)), float(np.std(draws))
    z = (mean - exact_mean) / (exact_sd / math.sqrt(ess))
    divergences = int(mcmc.get_extra_fields()["diverging"].sum())
    return {
        "ok": bool(abs(z) < 4 and abs(sd / exact_sd - 1) < 0.1 and rhat < max_rhat
                   and divergences == 0),  # fmt: skip
        "mean": mean, "exact_mean": exact_mean, "z": z, "sd": sd, "exact_sd": exact_sd,
        "ess_bulk": ess, "r_hat": rhat, "divergences": divergences,
    }  # fmt: skip


def check_closed_form(device: str, dtype_name: str, kernel_name: str, sizes) -> dict:
    import torch

    from probtorch.inference import HMC, MCMC, NUTS

    _on(device, getattr(torch, dtype_name))
    model, y, exact_mean, exact_sd = _known_noise()
    # HMC: a trajectory of about a quarter period of the (adapted) Gaussian; 8 steps of the
    # adapted size came near a whole period, where HMC chains barely move (R-hat 1.36)
    kernel = NUTS(model) if kernel_name == "nuts" else HMC(model, trajectory_length=1.5)
    mcmc = MCMC(kernel, num_warmup=sizes[0], num_samples=sizes[1], num_chains=4, seed=0,
                progress_bar=False)  # fmt: skip
    start = time.perf_counter()
    mcmc.run(y)
    # R-hat < 1.01 needs the full run's draws; --quick's short runs are held to 1.05
    result = _posterior_ok(mcmc, exact_mean, exact_sd, 1.01 if sizes[1] >= 1000 else 1.05)
    loop = getattr(kernel, "_block_loop", None) or kernel._loop  # NUTS / HMC
    result.update(run_s=round(time.perf_counter() - start, 2), loop=type(loop).__name__,
                  compiled=kernel.potential.compiled)  # fmt: skip
    return result


def check_svi(device: str) -> dict:
    import torch

    import probtorch as pt
    from probtorch.inference import SVI, Trace_ELBO
    from probtorch.inference.autoguide import AutoNormal

    _on(device, torch.float64)
    model, y, exact_mean, exact_sd = _known_noise()
    guide = AutoNormal(model)
    # lr 0.01: over seeds 0-4 on a CPU, 1000 steps left the guide's location within 0.19
    # posterior sd of the exact mean (lr 0.05: up to 0.49; 500 steps at 0.01: up to 0.89)
    svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(), seed=0)
    start = time.perf_counter()
    result = svi.run(1000, y, progress_bar=False)
    mean = float(guide.median(result.params)["mu"])
    return {
        "ok": bool(abs(mean - exact_mean) < 0.5 * exact_sd and svi.compiled),
        "mean": mean, "exact_mean": exact_mean, "exact_sd": exact_sd,
        "final_loss": float(result.losses[-1]), "run_s": round(time.perf_counter() - start, 2),
    }  # fmt: skip


def run_bench(report: Report, args, deadline: float) -> None:
    out = args.out / "results_mcmc_gpu.json"
    settings = ["--num-warmup", "100", "--num-samples", "100"] if args.quick else []
    done, skipped = [], []
    for model, lib, method in BENCH_ORDER:
        left = deadline - time.perf_counter()
        if left < MIN_JOB_S:
            skipped.append(f"{model}/{lib}/{method}")
            continue
        cmd = [
            sys.executable, str(HERE / "mcmc.py"), "--device", args.device, "--models", model,
            "--libs", lib, "--no-probe", "--cpu", "none", "--out", str(out), "--timeout",
            str(int(left)), *settings,
        ]  # fmt: skip
        chain_method, _, executor = method.partition("-")  # "vectorized-lean": executor="lean"
        cmd += [f"--{lib}-chain-methods", chain_method]
        if executor:
            cmd += ["--probtorch-executors", executor]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        print(proc.stdout.strip(), flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], flush=True)
        done.append({"job": f"{model}/{lib}/{method}", "rc": proc.returncode,
                     "seconds": round(time.perf_counter() - start, 1)})  # fmt: skip
        report.data["checks"]["bench"] = {"jobs": done, "results": out.name}
        report.save()  # after every job; printed once at the end
    report.add("bench", {"jobs": done, "skipped_for_budget": skipped, "results": out.name})


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_out")))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for the whole script")
    ap.add_argument("--quick", action="store_true", help="short runs (a dry run on a CPU)")
    ap.add_argument("--no-bench", dest="bench", action="store_false")
    args = ap.parse_args(argv)
    deadline = time.perf_counter() + args.budget
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible to torch")
    report.add("environment", environment(args.device))
    sizes = (100, 200) if args.quick else (500, 1000)
    for dtype in ("float64", "float32"):
        run_check(report, f"compiled_matches_eager_{dtype}", check_compiled_matches_eager,
                  args.device, dtype, 20)  # fmt: skip
        run_check(report, f"closed_form_nuts_{dtype}", check_closed_form, args.device, dtype,
                  "nuts", sizes)  # fmt: skip
    run_check(report, "closed_form_hmc_float64", check_closed_form, args.device, "float64",
              "hmc", sizes)  # fmt: skip
    run_check(report, "svi_float64", check_svi, args.device)
    torch.set_default_device("cpu")
    if args.bench:
        run_bench(report, args, deadline)
    failed = [k for k, v in report.data["checks"].items() if v.get("ok") is False]
    report.data["failed"] = failed
    report.save()
    print(f"done in {args.budget - (deadline - time.perf_counter()):.0f} s; failed: {failed}")


if __name__ == "__main__":
    main()
