"""The lean executor (AOTInductor chunk + C++ loop) draws exactly what the quick path draws."""

import time

import pytest
import torch
from models import eight_schools, eight_schools_data

import probtorch as pt
from probtorch.inference import MCMC, NUTS
from probtorch.inference.mcmc import lean
from probtorch.reparam import LocScaleReparam


@pytest.fixture
def model_and_data():
    torch.set_default_dtype(torch.float64)
    args, kwargs = eight_schools_data()
    model = pt.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(0.0)})
    return model, args, kwargs


def _run(model, args, kwargs, executor):
    mcmc = MCMC(
        NUTS(model, executor=executor, block_size=16),
        num_warmup=60,
        num_samples=60,
        num_chains=2,
        seed=3,
        progress_bar=False,
    )
    mcmc.run(*args, **kwargs)
    return mcmc


@pytest.mark.slow
def test_lean_executor_matches_quick_path_draw_for_draw(model_and_data, tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    model, args, kwargs = model_and_data
    quick = _run(model, args, kwargs, "quick")
    lean_run = _run(model, args, kwargs, "lean")
    assert type(lean_run.kernel._block_loop).__name__ == "LeanLoop"
    for name, value in quick.get_samples().items():
        torch.testing.assert_close(lean_run.get_samples()[name], value, rtol=1e-10, atol=1e-10)
    for name in ("num_steps", "diverging", "tree_depth"):
        assert torch.equal(
            lean_run._stats[name], quick._stats[name]
        ), f"{name} differs between executors"
    # a second sampler of the same model and shapes loads the cached package
    assert len(list(tmp_path.glob("nuts_chunk_*.pt2"))) == 1
    start = time.perf_counter()
    again = _run(model, args, kwargs, "lean")
    assert time.perf_counter() - start < 60
    torch.testing.assert_close(again.get_samples()["mu"], quick.get_samples()["mu"])


def test_lean_executor_falls_back_with_a_warning(model_and_data, monkeypatch, tmp_path):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))

    def no_toolchain():
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(lean, "_load_driver", no_toolchain)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", lambda *a, **k: None)
    model, args, kwargs = model_and_data
    with pytest.warns(UserWarning, match="lean executor could not be built.*quick path"):
        mcmc = _run(model, args, kwargs, "lean")
    assert type(mcmc.kernel._block_loop).__name__ == "ChunkedLoop"
    assert mcmc.get_samples()["mu"].shape == (120,)
