"""The split executor: the sampler compiled once with the model's gradient left out
(probtorch::potential_hole), kept on disk and loaded for other models and sizes; the
gradient compiled per model and run from the sampler's program."""

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
    # the sampler's step is one C++ program, and the gradient a C call in it (its own
    # program), not a Python step
    run, _, _ = split._compiled[next(iter(split._compiled))]
    assert getattr(run.bind, "__self__", None) is not None and run.bind.__self__.use_program
    ((_, direct),) = split._gradient.values()
    z = torch.zeros(C, D, dtype=dtype)
    call = direct(z, z.new_zeros(C), torch.zeros_like(z))
    assert call is not None and call.func is call_program._runner[0]


def test_sampler_graph_is_kept_and_serves_other_sizes(cache_dir, monkeypatch):
    """A second loop (another model's gradient, other chains and dimensions) loads the
    kept graph: no trace, one entry on disk, the eager results."""
    dtype = torch.float64
    first = SplitLoop(_descent(hole_value_and_grad), _quadratic(5, dtype), graph_name="descent")
    first(_start(3, 5, dtype), *_args(3, dtype))
    assert len(_entries(cache_dir)) == 1

    def no_trace(*args, **kwargs):
        raise AssertionError("the kept sampler graph was traced again")

    monkeypatch.setattr(executor, "trace_in_place", no_trace)
    for C, D in [(3, 7), (4, 2), (2, 11)]:
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


def test_nuts_split_executor_draws_as_the_quick_path(cache_dir, float64):
    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.inference import MCMC, NUTS

    y = torch.tensor([0.3, -1.2, 2.0, 0.7, 1.1])

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 3.0))
        sigma = pt.sample("sigma", dist.HalfNormal(2.0))
        with pt.plate("data", len(y)):
            pt.sample("y", dist.Normal(mu, sigma), obs=y)

    draws = {}
    for name in ("quick", "split"):
        mcmc = MCMC(NUTS(model, executor=name), num_warmup=60, num_samples=60, num_chains=2,
                    seed=3, progress_bar=False)  # fmt: skip
        mcmc.run(y)
        draws[name] = mcmc.get_samples()
        assert type(mcmc.kernel._block_loop) is (SplitLoop if name == "split" else InPlaceLoop)
        assert mcmc.kernel._block_loop._fallback is None
    for site in ("mu", "sigma"):  # the same kernels' arithmetic, so the same bits
        assert torch.equal(draws["split"][site], draws["quick"][site])


def test_split_loop_falls_back_with_a_warning_when_the_gradient_does_not_compile(
    cache_dir, monkeypatch
):
    def refuse(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(executor, "_compiled_fills", refuse)
    dtype = torch.float64
    loop = SplitLoop(_descent(hole_value_and_grad), _quadratic(4, dtype), graph_name="descent")
    with pytest.warns(UserWarning, match="could not be compiled.*no C.. compiler"):
        got = loop(_start(3, 4, dtype), *_args(3, dtype))
    for a, b in zip(got, _eager(3, 4, dtype)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
