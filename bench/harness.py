"""What the benchmarks in bench/ share: the worker subprocess, its environment, and what
is recorded about the machine and the code under test.

Each measured run is a fresh process (``python <script> --worker <cfg json>``) with one
thread for every library, optionally pinned to a CPU with ``taskset``; it prints one line
``@@RESULT@@{json}``. probtorch workers get an empty Inductor cache (cold compiles) unless
``cfg["warm_cache"]`` is set.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
RESULT_TAG = "@@RESULT@@"
VERSIONED = ("torch", "probtorch", "numpyro", "jax", "jaxlib", "pyro-ppl", "arviz", "numpy")


def loadavg() -> list:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def probtorch_version() -> str | None:
    """The git commit of the probtorch tree under test, '+dirty' if probtorch/ has edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "probtorch"],
            cwd=ROOT, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return None
    return (head + ("+dirty" if dirty else "")) or None


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children (compiler processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def timed_into(intervals: list, cpu: list | None = None):
    """A decorator that records each call's ``(start, end)`` wall times in ``intervals``
    (and its CPU seconds in ``cpu``): compiles that run outside Dynamo's callbacks."""

    def timed(fn):
        def wrapper(*args, **kwargs):
            start, cpu0 = time.perf_counter(), cpu_seconds()
            try:
                return fn(*args, **kwargs)
            finally:
                intervals.append((start, time.perf_counter()))
                if cpu is not None:
                    cpu.append(cpu_seconds() - cpu0)

        return wrapper

    return timed


def jax_compile_intervals() -> list:
    """A list that JAX fills with the ``(start, end)`` wall times of its tracing, lowering
    and XLA compilation from now on (its compile events report durations; nested traces
    overlap, so callers take the union)."""
    from jax import monitoring

    intervals = []

    def on_event(name, duration, **kwargs):
        if name.startswith("/jax/core/compile/"):
            end = time.perf_counter()
            intervals.append((end - duration, end))

    monitoring.register_event_duration_secs_listener(on_event)
    return intervals


def worker_env(cold_cache: str | None, device: str = "cpu") -> dict:
    """One thread for torch, BLAS and XLA; ``cold_cache``: an empty compile-cache dir
    (probtorch keeps Inductor's precompiled C++ header there too, and on a GPU Triton its
    kernels); ``device="cuda"``: JAX on the GPU, allocating as it goes (as torch does)
    rather than taking most of the GPU's memory at start."""
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=XLA_FLAGS,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        JAX_PLATFORMS="cpu",
        JAX_CPU_ENABLE_ASYNC_DISPATCH="false",
        PYTHONWARNINGS="ignore",
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    if device != "cpu":
        env.update(JAX_PLATFORMS=device, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if cold_cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cold_cache
        env["PROBTORCH_CACHE_DIR"] = cold_cache  # the lean executor's AOTInductor builds
        env["TRITON_CACHE_DIR"] = os.path.join(cold_cache, "triton")
    return env


def spawn(script: str, cfg: dict, cpu: str | None, timeout: float) -> dict:
    """Run ``script --worker cfg`` in a fresh process; its result dict, or ``{"error": ...}``."""
    cache = None
    if cfg["lib"] == "probtorch" and not cfg.get("warm_cache"):
        cache = tempfile.mkdtemp(prefix="bench_inductor_")  # cold compile every time
    env = worker_env(cache, cfg.get("device", "cpu"))
    cmd = [sys.executable, str(Path(script).resolve()), "--worker", json.dumps(cfg)]
    if cpu is not None and shutil.which("taskset"):
        cmd = ["taskset", "-c", cpu] + cmd
    if cfg.get("prebuild"):  # a second run: an untimed first run fills the caches
        first = [c if c != cmd[-1] else json.dumps(cfg["prebuild"]) for c in cmd]
        pre = subprocess.run(first, env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
        if pre.returncode != 0:  # else the timed run would be a cold one, mislabelled
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
            return {"error": f"prebuild exit {pre.returncode}: {pre.stderr[-3000:]}"}
    load0 = loadavg()
    code = probtorch_version() if cfg["lib"] == "probtorch" else None
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "loadavg": load0}
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    wall = time.perf_counter() - t0
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            out = json.loads(line[len(RESULT_TAG) :])
            out.update(
                process_wall_s=wall, loadavg=load0, loadavg_end=loadavg(), probtorch_code=code
            )
            return out
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"error": f"exit {proc.returncode}: {tail}", "loadavg": load0}


def environment() -> dict:
    """The machine, the library versions and the probtorch commit."""
    import importlib.metadata as md

    versions = {}
    for pkg in VERSIONED:
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model_name = next(
            (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if "Model name" in ln), ""
        )
    except OSError:
        model_name = ""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = float("nan")
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": model_name,
        "nproc": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        "xla_flags": XLA_FLAGS,
        "probtorch_code": probtorch_version(),
    }
