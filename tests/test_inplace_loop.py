"""The in-place chunk executor (NUTS's quick path): same results as the torch.compile chunk
and as eager, one compile per signature, a fallback, and Ctrl-C between whole chunks."""

import os
import signal
import threading
from typing import NamedTuple

import pytest
import torch

from probtorch.inference.compile import count_compiles
from probtorch.inference.generated_call import BufferPool
from probtorch.inference.mcmc import executor
from probtorch.inference.mcmc.executor import ChunkedLoop, InPlaceLoop


class Walk(NamedTuple):
    x: torch.Tensor  # (C, D)
    steps: torch.Tensor  # (C,)
    twin: torch.Tensor  # (C,) always equal to steps: a state written whole
    done: torch.Tensor  # (C,)


def _walk(state: Walk, noise: torch.Tensor, limit: torch.Tensor) -> Walk:
    """A chain-batched state machine: a chain stops after ``limit`` steps."""
    active = ~state.done
    i = state.steps.clamp(max=noise.shape[1] - 1)
    step = noise.gather(1, i.view(-1, 1, 1).expand(-1, 1, noise.shape[2])).squeeze(1)
    x = torch.where(active.unsqueeze(-1), torch.tanh(state.x + 0.1 * step), state.x)
    steps = state.steps + active.long()
    return Walk(x, steps, state.twin + active.long(), state.done | (steps >= limit))


def _start(C=3, D=4):
    zeros = torch.zeros(C, dtype=torch.long)
    return Walk(torch.zeros(C, D), zeros, zeros.clone(), torch.zeros(C, dtype=torch.bool))


def _args(C=3, D=4, T=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(C, T, D, generator=g), torch.tensor([5, 17, 40][:C])


@pytest.mark.parametrize("chunk_size", [1, 3])
def test_in_place_loop_equals_compiled_and_eager_chunks(chunk_size):
    state, args = _start(), _args()
    results = [
        loop(state, *args)
        for loop in (
            InPlaceLoop(_walk, chunk_size),
            ChunkedLoop(_walk, chunk_size, compiled=True),
            ChunkedLoop(_walk, chunk_size, compiled=False),
        )
    ]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    assert results[0].steps.tolist() == [5, 17, 40]
    assert torch.equal(state.x, torch.zeros(3, 4)), "the caller's state was written to"


def test_in_place_loop_takes_strided_state_and_arguments():
    """Expanded and transposed inputs: the chunk is compiled for contiguous buffers and
    its inputs are laid out so (its generated code does not check strides)."""
    noise = torch.randn(1, 50, 4, generator=torch.Generator().manual_seed(3)).expand(3, 50, 4)
    limit = torch.tensor([5, 17, 40])
    start = _start()._replace(x=torch.linspace(-1, 1, 12).reshape(4, 3).t())
    expected = ChunkedLoop(_walk, compiled=False)(start, noise, limit)
    out = InPlaceLoop(_walk)(start, noise, limit)
    # the compiled tanh is vectorized (Sleef): on some CPUs (AVX-512) one ulp from eager's
    for a, b in zip(out, expected):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=4e-7, atol=1e-7)
        else:
            assert torch.equal(a, b)


def test_in_place_loop_compiles_once_per_signature():
    loop = InPlaceLoop(_walk)
    with count_compiles() as first:
        loop(_start(), *_args())
    with count_compiles() as same, torch.compiler.set_stance("fail_on_recompile"):
        loop(_start(), *_args(seed=1))
    with count_compiles() as other:
        out = loop(_start(C=2), *_args(C=2))
    assert (first.graphs, same.graphs, other.graphs) == (1, 0, 1)
    assert first.graph_breaks == same.graph_breaks == other.graph_breaks == 0
    assert out.steps.tolist() == [5, 17]


def test_in_place_loop_falls_back_to_torch_compile_with_a_warning(monkeypatch):
    def untraceable(*args, **kwargs):
        raise RuntimeError("make_fx cannot take this op")

    monkeypatch.setattr(executor, "trace_in_place", untraceable)
    loop = InPlaceLoop(_walk)
    with pytest.warns(UserWarning, match="in-place NUTS chunk could not be compiled.*make_fx"):
        out = loop(_start(), *_args())
    assert isinstance(loop._fallback, ChunkedLoop)
    expected = ChunkedLoop(_walk, compiled=False)(_start(), *_args())
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="SIGINT is delivered to the main thread",
)
def test_ctrl_c_stops_the_in_place_loop_between_whole_chunks(default_sigint):
    """SIGINT while the loop runs: it stops after the call in progress, with the state of
    whole iterations (``steps`` and ``twin`` are written by the same chunk)."""
    loop = InPlaceLoop(_walk)
    endless = torch.tensor([10**12, 10**12, 10**12])
    noise = _args()[0]
    loop(_start(), noise, torch.tensor([1, 1, 1]))  # compiled before the timer starts
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        out = loop(_start(), noise, endless)
    finally:
        timer.cancel()
    assert loop.interrupted
    assert int(out.steps[0]) > 0
    assert torch.equal(out.steps, out.twin)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nuts_quick_path_uses_each_runs_data(float64):
    """The in-place chunk holds the model's data as constants: a second data set of the
    same shape must not reuse the first one's compiled graph (Inductor's cache keys on the
    constants' values), in the same process or from the disk cache."""
    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.inference import MCMC, NUTS

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("data", y.shape[0]):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)

    def draws(y, compile):
        kernel = NUTS(model, executor="quick", compile=compile, block_size=8)
        mcmc = MCMC(kernel, num_warmup=20, num_samples=20, num_chains=2, seed=1, progress_bar=False)
        mcmc.run(y)
        return mcmc.get_samples()["mu"]

    for y in (torch.full((5,), -3.0), torch.full((5,), 4.0)):
        compiled, eager = draws(y, True), draws(y, False)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-8)
        assert abs(float(compiled.mean()) - float(y.mean())) < 1.5


def test_buffer_pool_hands_out_the_first_calls_buffers(monkeypatch):
    """The chunk's intermediate buffers are reused from the third call on; results equal
    those of fresh buffers (PROBTORCH_POOL_BUFFERS=0). The pool also serves the two calls
    that check the direct call of the generated code. (Replayed calls, on by default, take
    no buffers from the pool: see the next test.)"""
    monkeypatch.setenv("PROBTORCH_REPLAY_CALL", "0")
    runs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("PROBTORCH_POOL_BUFFERS", setting)
        loop = InPlaceLoop(_walk)
        runs[setting] = loop(_start(), *_args())
        ((_, pool, _),) = loop._compiled.values()
        assert (pool is not None) == (setting == "1")
        assert pool is None or (pool.enabled and pool._calls == 42)
    assert pool is None and loop.calls == 40
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))


def test_a_replayed_call_uses_the_buffers_its_checks_took_from_the_pool():
    """The four checking calls (direct call, then the recorded call and the reference)
    start the pool; the 40 replayed calls reuse the recorded call's buffers without it."""
    loop = InPlaceLoop(_walk)
    result = loop(_start(), *_args())
    ((call, pool, _),) = loop._compiled.values()
    assert hasattr(call, "bind") and pool.enabled and pool._calls == 4 and loop.calls == 40
    eager = ChunkedLoop(_walk, compiled=False)(_start(), *_args())
    assert all(torch.equal(a, b) for a, b in zip(result, eager))


def test_buffer_pool_turns_itself_off_when_a_call_asks_for_other_buffers():
    import types

    def allocate(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype)

    module = types.SimpleNamespace(empty_strided_cpu=allocate, call=lambda args: None)
    pool = BufferPool.attach(module)
    requests = [[((2, 3), (3, 1)), ((4,), (1,))], [((2, 3), (3, 1)), ((5,), (1,))]]
    got = []
    for call in requests + requests[1:]:
        pool.start()
        got.append([module.empty_strided_cpu(size, stride, torch.float32) for size, stride in call])
    assert not pool.enabled  # the second call asked for a (5,) buffer where the first had (4,)
    assert got[1][0] is got[0][0]  # pooled until then
    assert got[2][0] is not got[0][0] and got[2][1].shape == (5,)  # fresh buffers after


def test_view_pool_reuses_a_view_only_for_the_same_base_and_layout():
    import types

    made = []

    def reinterpret(base, size, stride, offset):
        made.append(base)
        return base.as_strided(size, stride, offset)

    module = types.SimpleNamespace(
        empty_strided_cpu=lambda size, stride, dtype: torch.empty_strided(size, stride),
        reinterpret_tensor=reinterpret,
        call=lambda args: None,
    )
    pool = BufferPool.attach(module)
    a, b = torch.arange(6.0), torch.arange(6.0)
    views = []
    for base in (a, a, b, b):
        pool.start()
        views.append(
            [module.reinterpret_tensor(base, (2, 2), (2, 1), 1),
             module.reinterpret_tensor(base, (3,), (2,), 0)]
        )  # fmt: skip
    assert views[1][0] is views[0][0] and views[1][1] is views[0][1]  # same base: reused
    assert views[2][0] is not views[0][0] and views[2][0]._base is b  # new base: made anew
    assert views[3][0] is views[2][0]
    assert len(made) == 4
    pool.start()
    other = module.reinterpret_tensor(b, (3,), (1,), 3)  # another layout at position 0
    assert other is not views[3][0] and torch.equal(other, torch.tensor([3.0, 4.0, 5.0]))


@pytest.mark.slow
def test_lean_loop_lays_inputs_out_as_its_package_was_traced(monkeypatch, tmp_path):
    """A package traced on a dense but permuted argument, then called with a contiguous one
    (as a later block's tensors may be): the inputs are copied to the traced layout, so the
    results are eager's (the package's code does not check strides)."""
    from probtorch.inference.mcmc import lean

    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(5)
    permuted = torch.randn(4, 50, 3, generator=g).permute(2, 1, 0)  # (3, 50, 4), not contiguous
    limit = torch.tensor([5, 17, 40])
    loop = lean.build_lean_loop(_walk, _start(), (permuted, limit), 1, lambda s: s.done)
    assert loop is not None
    noise = permuted.contiguous()
    out = loop(_start(), noise, limit)
    expected = ChunkedLoop(_walk, compiled=False)(_start(), noise, limit)
    assert all(torch.equal(a, b) for a, b in zip(out, expected))


class _Counted(NamedTuple):
    x: torch.Tensor
    n: torch.Tensor


def test_chunked_loop_goes_on_guarded_when_an_input_fits_no_compiled_graph():
    """After two guarded calls the loop skips Dynamo's guards; an input that fits neither
    compiled graph then makes Dynamo refuse to recompile (before running anything). The loop
    goes on with guards and gives the eager result, chunk by chunk (nothing is redone)."""
    mode = [0]

    def iteration(state):
        return _Counted(state.x * 2 + mode[0], state.n + 1)  # reads a Python value

    def done(state):
        mode[0] = int(state.n.max()) % 3  # which changes after every chunk
        return state.n >= 7

    start = _Counted(torch.zeros(2), torch.zeros(2, dtype=torch.long))
    eager = ChunkedLoop(iteration, chunk_size=1, compiled=False, done=done)(start)
    loop = ChunkedLoop(iteration, chunk_size=1, done=done)
    compiled = loop(start)
    torch.testing.assert_close(compiled.x, eager.x, rtol=0, atol=0)
    assert int(compiled.n[0]) == 7 and loop.calls == 7
