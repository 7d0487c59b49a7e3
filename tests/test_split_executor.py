"""The split executor: the sampler compiled once with the model's gradient left out
(probtorch::potential_hole), kept on disk and loaded for other models and sizes; the
gradient compiled per model and run from the sampler's program."""

import os
import warnings
from typing import NamedTuple

import pytest
import torch

from probtorch.inference import call_program, potential_hole
from probtorch.inference.mcmc import executor, sampler_cache
from probtorch.inference.mcmc.executor import InPlaceLoop, SplitLoop
from probtorch.inference.potential_hole import hole_value_and_grad


class Descent(NamedTuple):
    z: torch.Tensor  # (C, D)
    steps: torch.Tensor  # (C,)
    done: torch.Tensor  # (C,)


def _descent(value_and_grad):
    """Gradient descent per chain, a chain stopping after ``limit`` steps."""

    def iteration(state: Descent, rate: torch.Tensor, limit: torch.Tensor) -> Descent:
        _, grad = value_and_grad(state.z)
        active = ~state.done
        z = torch.where(active.unsqueeze(-1), state.z - rate.unsqueeze(-1) * grad, state.z)
        steps = state.steps + active.long()
        return Descent(z, steps, state.done | (steps >= limit))

    return iteration


def _quadratic(D, dtype):
    """A model's value and gradient: a quadratic bowl whose data only the gradient sees."""
    center = torch.linspace(-1.0, 2.0, D, dtype=dtype)
    weight = torch.linspace(0.5, 1.5, D, dtype=dtype)

    def value_and_grad(z):
        r = z - center
        return 0.5 * (weight * r * r).sum(-1), weight * r

    return value_and_grad


def _start(C, D, dtype):
    z = torch.arange(C * D, dtype=dtype).reshape(C, D) / (C * D)
    zeros = torch.zeros(C, dtype=torch.long)
    return Descent(z, zeros, torch.zeros(C, dtype=torch.bool))


def _args(C, dtype):
    rate = torch.linspace(0.1, 0.3, C, dtype=dtype)
    return rate, torch.arange(C) * 3 + 5


def _eager(C, D, dtype):
    vg, state = _quadratic(D, dtype), _start(C, D, dtype)
    iteration = _descent(vg)
    while not bool(state.done.all()):
        state = iteration(state, *_args(C, dtype))
    return state


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    return tmp_path


def _entries(cache_dir):
    return sorted(p.name for p in (cache_dir / "sampler-graphs").iterdir())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_split_loop_equals_the_in_place_loop(dtype, cache_dir):
    C, D = 3, 5
    vg = _quadratic(D, dtype)
    split = SplitLoop(_descent(hole_value_and_grad), vg, graph_name="descent")
    whole = InPlaceLoop(_descent(vg))
    got = split(_start(C, D, dtype), *_args(C, dtype))
    expected = whole(_start(C, D, dtype), *_args(C, dtype))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert got.steps.tolist() == [5, 8, 11]
    assert split._fallback is None and len(split._compiled) == 1
    _assert_one_program(split)


def _assert_one_program(split: SplitLoop):
    """The sampler's step is one C++ program, and the gradient a C call in it (its own
    program), not a Python step."""
    ((run, _, _),) = split._compiled.values()
    bind = getattr(run, "bind", None)
    assert getattr(bind, "__self__", None) is not None and bind.__self__.use_program
    ((z_key, (_, direct)),) = split._gradient.items()
    shape, dtype = z_key[0][0], z_key[0][2]
    z = torch.zeros(shape, dtype=dtype)
    call = direct(z, z.new_zeros(shape[0]), torch.zeros_like(z))
    assert call is not None and call.func is call_program._runner[0]


def _forbid_tracing(monkeypatch, what="kept"):
    """Make any further trace of a sampler graph fail the test."""

    def no_trace(*args, **kwargs):
        raise AssertionError(f"the {what} sampler graph was traced again")

    monkeypatch.setattr(executor, "trace_in_place", no_trace)


@pytest.mark.parametrize("first_size", [(3, 5), (3, 3)])
def test_sampler_graph_is_kept_and_serves_other_sizes(first_size, cache_dir, monkeypatch):
    """A second loop (another model's gradient, other chains and dimensions) loads the
    kept graph: no trace, one entry on disk, the eager results. Built where the chains
    equal the dimensions, the graph still tells them apart: it is compiled on its trace's
    symbolic inputs (on real ones, Inductor gave equal sizes one symbol, and another
    model's run indexed one size by the other: heap corruption)."""
    dtype = torch.float64
    C0, D0 = first_size
    first = SplitLoop(_descent(hole_value_and_grad), _quadratic(D0, dtype), graph_name="descent")
    first(_start(C0, D0, dtype), *_args(C0, dtype))
    assert len(_entries(cache_dir)) == 1
    _forbid_tracing(monkeypatch)
    for C, D in [(3, 7), (4, 2), (2, 11), (5, 5)]:
        loop = SplitLoop(_descent(hole_value_and_grad), _quadratic(D, dtype), graph_name="descent")
        got = loop(_start(C, D, dtype), *_args(C, dtype))
        expected = _eager(C, D, dtype)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert loop._fallback is None
    assert len(_entries(cache_dir)) == 1


def test_kept_graph_is_not_used_against_its_guards(cache_dir):
    """Inputs that break a condition the graph was compiled under (here: the state's
    chains and the arguments' chains differ) are refused by the cache."""
    dtype = torch.float64
    loop = SplitLoop(_descent(hole_value_and_grad), _quadratic(4, dtype), graph_name="descent")
    state, args = _start(3, 4, dtype), _args(3, dtype)
    loop(state, *args)
    (entry,) = (cache_dir / "sampler-graphs").iterdir()
    leaves = [*state, *args, torch.zeros((), dtype=torch.bool)]
    assert sampler_cache.load(str(entry), leaves) is not None
    bad = [*state, *_args(4, dtype), torch.zeros((), dtype=torch.bool)]
    assert sampler_cache.load(str(entry), bad) is None


def test_hole_outside_a_filling_names_what_is_missing():
    with pytest.raises(RuntimeError, match="potential_hole.filling"):
        hole_value_and_grad(torch.zeros(2, 3))
    with potential_hole.filling(lambda z: (z.sum(-1), 2 * z)):
        value, grad = torch.ops.probtorch.potential_hole(torch.ones(2, 3))
        out = (torch.empty(2), torch.empty(2, 3))
        torch.ops.probtorch.potential_hole.out(torch.ones(2, 3), value=out[0], grad=out[1])
    assert value.tolist() == [3.0, 3.0] and torch.equal(grad, torch.full((2, 3), 2.0))
    assert torch.equal(out[0], value) and torch.equal(out[1], grad)


def _five_points_model():
    import probtorch as pt
    import probtorch.distributions as dist

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 3.0))
        sigma = pt.sample("sigma", dist.HalfNormal(2.0))
        with pt.plate("data", len(y)):
            pt.sample("y", dist.Normal(mu, sigma), obs=y)

    return model, torch.tensor([0.3, -1.2, 2.0, 0.7, 1.1])


def _nuts_run(kernel, y):
    from probtorch.inference import MCMC

    mcmc = MCMC(kernel, num_warmup=60, num_samples=60, num_chains=2, seed=3, progress_bar=False)
    mcmc.run(y)
    return mcmc.get_samples()


@pytest.mark.slow
def test_auto_builds_the_sampler_graph_in_the_background_then_takes_the_split_path(
    cache_dir, float64, monkeypatch
):
    """executor="auto" on a machine without the sampler graph: the quick path, while another
    process builds the graph; the next run loads it (no trace) and compiles only the
    gradient; executor="split" loads it too. The draws are the same on every path."""
    import subprocess
    import sys

    from probtorch.inference import NUTS
    from probtorch.inference.mcmc import lean

    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    # no lean package (its build is tested in test_lean_executor.py): a build that makes none
    monkeypatch.setattr(
        lean, "_start_build", lambda *a: subprocess.Popen([sys.executable, "-c", ""])
    )
    model, y = _five_points_model()
    kernel = NUTS(model, executor="auto")
    first = _nuts_run(kernel, y)
    assert type(kernel._block_loop) is InPlaceLoop
    build = kernel._sampler_build
    assert build is not None
    log = build.path + f".job{os.getpid()}.log"
    assert build.wait(timeout=600) == 0, open(log).read()
    assert sampler_cache.is_kept(build.path) and not os.path.exists(log)

    _forbid_tracing(monkeypatch)
    draws = {"auto, quick path": first, "auto, split path": _nuts_run(kernel, y)}
    loop = kernel._block_loop
    assert type(loop) is SplitLoop and loop._fallback is None
    assert kernel._sampler_build is None and kernel._tiered is None  # nothing else built
    _assert_one_program(loop)
    split = NUTS(model, executor="split")
    draws["split"] = _nuts_run(split, y)
    assert split._block_loop._fallback is None
    for name, got in draws.items():
        for site in ("mu", "sigma"):  # the same kernels' arithmetic, so the same bits
            assert torch.equal(got[site], first[site]), f"{site} differs on the {name}"


def test_a_failed_sampler_build_is_not_retried_and_warns_once(cache_dir, monkeypatch):
    from probtorch.inference.mcmc import sampler_build

    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    path = str(cache_dir / "sampler-graphs" / "entry")
    os.makedirs(os.path.dirname(path))
    job = path + ".job1"
    torch.save({"settings": {}, "options": {}, "block": None, "block_args": (), "path": path,
                "dtype": torch.float32}, job)  # fmt: skip
    with pytest.raises(TypeError):
        sampler_build._main(job)  # the job's settings are not a sampler's
    assert not os.path.exists(job)
    with open(sampler_build.failure_marker(path)) as f:
        assert f.read().startswith("TypeError: ")
    with pytest.warns(
        UserWarning, match=r"could not be built \(TypeError: .*delete .*entry.failed"
    ):
        assert sampler_build.start({}, {}, None, (), path) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sampler_build.start({}, {}, None, (), path) is None  # said once


def test_a_cache_that_cannot_be_written_keeps_the_quick_path_with_a_warning(tmp_path, monkeypatch):
    from probtorch.inference.mcmc import sampler_build

    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache directory would be
    path = str(blocker / "sampler-graphs" / "entry")
    with pytest.warns(UserWarning, match="cannot be built in the background"):
        assert sampler_build.start({}, {}, None, (), path) is None


def test_a_sampler_build_running_elsewhere_is_not_started_again(cache_dir, monkeypatch):
    from probtorch.inference.mcmc import sampler_build

    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "1")
    path = str(cache_dir / "sampler-graphs" / "entry")
    os.makedirs(os.path.dirname(path))
    open(f"{path}.job{os.getppid()}", "w").close()  # a live process's job
    assert sampler_build.start({}, {}, None, (), path) is None
    os.remove(f"{path}.job{os.getppid()}")
    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "0")  # one CPU: never in the background
    assert sampler_build.start({}, {}, None, (), path) is None
    assert os.listdir(os.path.dirname(path)) == []


def test_split_loop_falls_back_with_a_warning_when_the_gradient_does_not_compile(
    cache_dir, monkeypatch
):
    def refuse(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(executor, "_compiled_fills", refuse)
    dtype = torch.float64
    loop = SplitLoop(_descent(hole_value_and_grad), _quadratic(4, dtype), graph_name="descent")
    with pytest.warns(UserWarning, match="gradient could not be compiled.*no C.. compiler"):
        got = loop(_start(3, 4, dtype), *_args(3, dtype))
    for a, b in zip(got, _eager(3, 4, dtype)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_a_prebuilt_sampler_graph_serves_the_first_model(cache_dir, monkeypatch):
    """build_sampler_graphs builds, before any model ran, the graph a model's sampler
    needs: executor="auto" takes the split path at its first run (no trace, no build in
    the background), and a second build of the same setting finds it kept."""
    from probtorch.inference import NUTS
    from probtorch.inference.mcmc.prebuild import SamplerSetting, build_sampler_graphs

    monkeypatch.setenv("PROBTORCH_LEAN_BACKGROUND", "0")
    setting = SamplerSetting(dtype="float32", code="scalar")  # built with 4 chains
    reports = []
    ((built, seconds, failure),) = build_sampler_graphs([setting], report=reports.append)
    assert built == setting and failure is None and seconds > 0
    said = "float32, diagonal metric, scalar code, several chains, max_tree_depth 10, "
    assert reports == [said + f"target_accept_prob 0.8: kept ({seconds:.1f} s)"]
    (entry,) = _entries(cache_dir)

    _forbid_tracing(monkeypatch, "prebuilt")
    model, y = _five_points_model()  # two latent scalars, float32, 2 chains: the setting above
    kernel = NUTS(model, executor="auto")
    draws = _nuts_run(kernel, y)
    loop = kernel._block_loop
    assert type(loop) is SplitLoop and loop._fallback is None
    assert loop.kept_paths == {str(cache_dir / "sampler-graphs" / entry)}  # loaded
    assert kernel._sampler_build is None and kernel._tiered is None
    assert torch.isfinite(draws["mu"]).all() and draws["mu"].shape == (120,)
    ((_, _, failure),) = build_sampler_graphs([setting], report=None)  # found kept: no trace
    assert failure is None and _entries(cache_dir) == [entry]


def test_prebuild_settings_and_command_line(monkeypatch, capsys):
    from probtorch.inference.mcmc import prebuild

    settings = prebuild.sampler_settings(num_chains=[1, 8, 4])
    assert len(settings) == 8 and sorted({s.num_chains for s in settings}) == [1, 4]
    with pytest.raises(ValueError, match="num_chains must be counts >= 1, got \\[0\\]"):
        prebuild.sampler_settings(num_chains=[0])
    with pytest.raises(ValueError, match="dtype 'float16' is not one of"):
        prebuild.SamplerSetting(dtype="float16")

    asked = []
    monkeypatch.setattr(
        prebuild, "build_sampler_graphs",
        lambda settings, jobs, report: asked.append((settings, jobs)) or [
            (s, 1.0, None if s.dense_mass else "no compiler") for s in settings
        ],
    )  # fmt: skip
    status = prebuild.main(["--dtype", "float32", "float64", "--dense-mass", "both",
                            "--code", "vector", "--num-chains", "4", "--jobs", "3",
                            "--max-tree-depth", "8"])  # fmt: skip
    ((settings, jobs),) = asked
    assert jobs == 3 and len(settings) == 4 and status == 2  # the diagonal ones "failed"
    assert {(s.dtype, s.dense_mass, s.code, s.num_chains, s.max_tree_depth) for s in settings} == {
        (d, m, "vector", 4, 8) for d in ("float32", "float64") for m in (False, True)
    }
    with pytest.raises(SystemExit):
        prebuild.main(["--dense-mass", "maybe"])
    assert "expected one of ['yes', 'no', 'both'], got 'maybe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prebuild.main(["--num-chains", "0"])
    assert "num_chains must be counts >= 1" in capsys.readouterr().err


def test_kept_scalar_graph_loads_its_kernels_with_its_own_options(cache_dir, monkeypatch):
    """A graph compiled as scalar code (``cpp.simdlen=1``, small models) builds or finds its
    C++ kernels at load time under the options it was compiled with: with Inductor's
    defaults they were compiled again with AVX-512 flags (a new cache key) at every load."""
    from torch._inductor import codecache
    from torch._inductor import config as inductor_config

    dtype, scalar = torch.float64, {"cpp.simdlen": 1}
    first = SplitLoop(
        _descent(hole_value_and_grad), _quadratic(5, dtype), options=scalar,
        graph_name="descent-scalar",
    )  # fmt: skip
    first(_start(3, 5, dtype), *_args(3, dtype))
    assert len(_entries(cache_dir)) == 1

    seen = []
    original = codecache.CppCodeCache.load_async.__func__

    def load_async(cls, *args, **kwargs):
        seen.append(inductor_config.cpp.simdlen)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(codecache.CppCodeCache, "load_async", classmethod(load_async))
    loop = SplitLoop(
        _descent(hole_value_and_grad), _quadratic(7, dtype), options=scalar,
        graph_name="descent-scalar",
    )  # fmt: skip
    state, args = _start(4, 7, dtype), _args(4, dtype)
    assert loop.load_kept(state, *args)
    got = loop(state, *args)
    for a, b in zip(got, _eager(4, 7, dtype)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert seen and set(seen) == {1}, seen


def test_split_fallback_runs_a_torch_func_gradient_inside_the_compiled_sampler(
    cache_dir, monkeypatch
):
    """The fallback's eager gradient runs inside the compiled sampler, on its first call
    too, where AOTAutograd checks custom operators in a dispatch mode that excludes
    functorch's keys (``Cannot access storage of TensorWrapper`` before)."""

    def refuse(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(executor, "_compiled_fills", refuse)
    dtype = torch.float64
    center = torch.linspace(-1.0, 2.0, 4, dtype=dtype)

    def single(z):
        return 0.5 * ((z - center) ** 2).sum()

    batched = torch.func.vmap(torch.func.grad_and_value(single))

    def value_and_grad(z):
        grad, value = batched(z)
        return value, grad

    loop = SplitLoop(_descent(hole_value_and_grad), value_and_grad, graph_name="descent")
    with pytest.warns(UserWarning, match="gradient could not be compiled.*no C.. compiler"):
        got = loop(_start(3, 4, dtype), *_args(3, dtype))
    want = _start(3, 4, dtype)
    iteration = _descent(value_and_grad)
    while not bool(want.done.all()):
        want = iteration(want, *_args(3, dtype))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
