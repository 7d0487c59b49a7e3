"""The lean executor (AOTInductor chunk + C++ loop) draws exactly what the quick path draws,
whether it is built before the run ("lean"), loaded from the cache or built in the background
while the quick path samples ("auto")."""

import os
import subprocess
import sys
import time

import pytest
import torch
from filelock import FileLock
from models import eight_schools, eight_schools_data

import probtorch as pt
from probtorch.inference import MCMC, NUTS
from probtorch.inference.mcmc import kernels as nuts_kernels
from probtorch.inference.mcmc import lean, sampler_build
from probtorch.inference.mcmc.executor import InPlaceLoop
from probtorch.reparam import LocScaleReparam


@pytest.fixture(scope="session")
def package_dir(tmp_path_factory):
    """A package cache shared by the pytest-xdist workers: the package is built once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # basetemp is per worker; its parent per run
        base = base.parent
    root = base / "lean_packages"
    root.mkdir(exist_ok=True)
    return root


def _lean_run_locked(package_dir, model, args, kwargs):
    """A lean run (building the package unless another worker has): one build at a time."""
    with FileLock(str(package_dir / "build.lock")):
        return _run(model, args, kwargs, "lean")


@pytest.fixture(autouse=True)
def _no_sampler_graph(monkeypatch):
    """These tests follow "auto" where no split sampler graph is kept (and none is built:
    test_split_executor.py tests that), so it goes on to the lean executor."""
    monkeypatch.setattr(sampler_build, "start", lambda *args: None)


@pytest.fixture
def model_and_data():
    torch.set_default_dtype(torch.float64)
    args, kwargs = eight_schools_data()
    model = pt.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(0.0)})
    return model, args, kwargs


def _run(model, args, kwargs, executor, kernel=None):
    kernel = kernel or NUTS(model, executor=executor, block_size=16)
    mcmc = MCMC(kernel, num_warmup=60, num_samples=60, num_chains=2, seed=3, progress_bar=False)
    mcmc.run(*args, **kwargs)
    return mcmc


def _assert_same_draws(run, reference):
    for name, value in reference.get_samples().items():
        assert torch.equal(run.get_samples()[name], value), f"{name} differs between executors"
    for name in ("num_steps", "diverging", "tree_depth", "step_size"):
        assert torch.equal(run._stats[name], reference._stats[name]), f"{name} differs"


@pytest.mark.slow
def test_lean_executor_matches_quick_path_draw_for_draw(model_and_data, package_dir, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(package_dir))
    model, args, kwargs = model_and_data
    quick = _run(model, args, kwargs, "quick")
    lean_run = _lean_run_locked(package_dir, model, args, kwargs)
    assert type(lean_run.kernel._block_loop).__name__ == "LeanLoop"
    _assert_same_draws(lean_run, quick)
    # a second sampler of the same model and shapes loads the cached package
    assert len(list(package_dir.glob("nuts_chunk_*.pt2"))) == 1
    start = time.perf_counter()
    again = _run(model, args, kwargs, "lean")
    assert time.perf_counter() - start < 60
    _assert_same_draws(again, quick)


@pytest.mark.slow
def test_auto_executor_uses_a_cached_package_at_once(model_and_data, package_dir, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(package_dir))
    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    model, args, kwargs = model_and_data
    _lean_run_locked(package_dir, model, args, kwargs)  # the package is on disk
    quick = _run(model, args, kwargs, "quick")
    auto = _run(model, args, kwargs, "auto")
    loop = auto.kernel._block_loop
    assert type(loop).__name__ == "LeanLoop", "the cached package was not used"
    assert auto.kernel._tiered.pending is False  # nothing was built
    _assert_same_draws(auto, quick)


@pytest.mark.slow
@pytest.mark.parametrize("lean_faster", [True, False], ids=["lean-faster", "lean-slower"])
def test_auto_executor_switches_mid_run_without_changing_the_draws(
    model_and_data, package_dir, monkeypatch, lean_faster
):
    """The package becomes ready after a few blocks (as when a background build finishes):
    the run continues on the lean loop from the quick path's state for a trial of
    LEAN_TRIAL_BLOCKS blocks, keeps it if its time per call is lower (here decided by a
    stand-in for lean_is_faster, given the measured times), else goes back to the quick
    path for good; the draws are those of a quick run either way."""
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(package_dir))
    model, args, kwargs = model_and_data
    _lean_run_locked(package_dir, model, args, kwargs)  # the package is on disk
    quick = _run(model, args, kwargs, "quick")
    real_poll = lean.TieredBuild.poll
    polls = []

    def late_poll(self):
        polls.append(1)
        return real_poll(self) if len(polls) > 3 else None

    monkeypatch.setattr(lean.TieredBuild, "poll", late_poll)
    timings = []

    def decide(quick_per_call, lean_per_call):
        timings.append((list(quick_per_call), list(lean_per_call)))
        return lean_faster

    monkeypatch.setattr(nuts_kernels, "lean_is_faster", decide)
    quick_calls, lean_calls = [], []
    real_quick, real_lean = InPlaceLoop.__call__, lean.LeanLoop.__call__
    monkeypatch.setattr(
        InPlaceLoop, "__call__", lambda self, *a: quick_calls.append(1) or real_quick(self, *a)
    )
    monkeypatch.setattr(
        lean.LeanLoop, "__call__", lambda self, *a: lean_calls.append(1) or real_lean(self, *a)
    )
    kernel = NUTS(model, executor="auto", block_size=16)
    auto = _run(model, args, kwargs, "auto", kernel)
    assert len(quick_calls) >= 3 and len(lean_calls) >= nuts_kernels.LEAN_TRIAL_BLOCKS
    # the three quick blocks were timed (the chunk is compiled before the first one starts)
    [(quick_times, lean_times)] = timings
    assert len(quick_times) == 3 and len(lean_times) == nuts_kernels.LEAN_TRIAL_BLOCKS
    assert all(t > 0 for t in quick_times + lean_times)
    if lean_faster:
        assert len(quick_calls) == 3
        assert type(kernel._block_loop).__name__ == "LeanLoop"
    else:
        assert len(lean_calls) == nuts_kernels.LEAN_TRIAL_BLOCKS
        assert type(kernel._block_loop).__name__ == "InPlaceLoop"
        assert kernel._lean_slower
    _assert_same_draws(auto, quick)
    if not lean_faster:  # the sampler's next run stays on the quick path from the start
        lean_calls.clear()
        _run(model, args, kwargs, "auto", kernel)
        assert lean_calls == [] and kernel._tiered is None


@pytest.mark.slow
def test_auto_executor_builds_in_the_background(model_and_data, tmp_path, monkeypatch):
    """With nothing cached, the run samples on the quick path while another process builds
    the package; the next run of the same model loads it."""
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    model, args, kwargs = model_and_data
    kernel = NUTS(model, executor="auto", block_size=16)
    first = _run(model, args, kwargs, "auto", kernel)
    build = kernel._tiered
    assert build.failed is None
    build.wait(timeout=900)
    assert build._process.returncode == 0, open(next(tmp_path.glob("*.log"))).read()
    assert [p.name for p in tmp_path.iterdir()] == [build.path.rsplit("/", 1)[1]]
    second = _run(model, args, kwargs, "auto", kernel)
    assert type(kernel._block_loop).__name__ == "LeanLoop"
    _assert_same_draws(second, first)


def test_auto_executor_stays_quick_on_one_cpu(model_and_data, tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "0")
    model, args, kwargs = model_and_data
    mcmc = _run(model, args, kwargs, "auto")
    assert type(mcmc.kernel._block_loop).__name__ == "InPlaceLoop"
    assert not mcmc.kernel._tiered.pending
    assert list(tmp_path.iterdir()) == []


def test_auto_executor_warns_when_the_background_build_fails(
    model_and_data, tmp_path, monkeypatch
):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    monkeypatch.setattr(
        lean,
        "_start_build",
        lambda *a: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]),
    )
    model, args, kwargs = model_and_data
    kernel = NUTS(model, executor="auto", block_size=16)
    # the fake build exits at once; the run polls it at every block after the first
    with pytest.warns(UserWarning, match="background build exited with 3.*quick path"):
        mcmc = _run(model, args, kwargs, "auto", kernel)
    assert kernel._tiered.failed.startswith("background build exited with 3")
    assert type(kernel._block_loop).__name__ == "InPlaceLoop"
    assert mcmc.get_samples()["mu"].shape == (120,)


def test_executor_is_checked():
    with pytest.raises(ValueError, match="executor must be 'quick', 'lean', 'auto' or 'split'"):
        NUTS(eight_schools, executor="fast")


def test_lean_executor_falls_back_with_a_warning(model_and_data, monkeypatch, tmp_path):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))

    def no_toolchain():
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(lean, "_load_driver", no_toolchain)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: None)
    model, args, kwargs = model_and_data
    with pytest.warns(UserWarning, match="lean executor could not be built.*quick path"):
        mcmc = _run(model, args, kwargs, "lean")
    assert type(mcmc.kernel._block_loop).__name__ == "InPlaceLoop"
    assert mcmc.get_samples()["mu"].shape == (120,)


def test_auto_executor_builds_nothing_for_a_sampler_off_the_cpu(model_and_data, monkeypatch):
    """The lean package's C++ loop and the split sampler graph are built and measured on
    CPUs only: ``"auto"`` keeps a sampler on another device (CUDA) on the quick path. A
    block on the meta device stands in for one on a GPU."""
    model, args, kwargs = model_and_data
    builds = []
    monkeypatch.setattr(nuts_kernels, "TieredBuild", lambda *a, **k: builds.append("lean"))
    monkeypatch.setattr(nuts_kernels, "build_lean_loop", lambda *a, **k: builds.append("lean"))
    monkeypatch.setattr(sampler_build, "start", lambda *a: builds.append("split"))
    kernel = NUTS(model, executor="auto")
    kernel.setup(args, kwargs, num_chains=2, rng_seed=0)
    quick_loop = kernel._block_loop
    assert isinstance(quick_loop, InPlaceLoop)
    block = type("Block", (), {"z": torch.zeros(2, 10, device="meta")})()
    kernel._use_split(block, ())
    kernel._use_lean(block, ())
    assert builds == [] and kernel._block_loop is quick_loop
    assert not kernel._split_pending and not kernel._lean_pending
