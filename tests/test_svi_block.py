"""The in-place compiled SVI block (probtorch/inference/svi_block.py) against eager SVI."""

import os
import signal
import threading
import warnings

import pytest
import torch
from torch import nn

import probtorch as pt
import probtorch.distributions as dist
from probtorch.distributions import constraints
from probtorch.inference import SVI, Trace_ELBO, call_program, generated_call, svi_block
from probtorch.inference.compile import count_compiles
from probtorch.inference.svi_block import InPlaceBlock


@pytest.fixture(autouse=True)
def _float64():
    torch.set_default_dtype(torch.float64)


SCALE = 1.0
SHIFT = torch.zeros(())


def global_model(y, n):
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Normal(mu + SHIFT, SCALE * n), obs=y)


def guide(y, n):
    loc = pt.param("loc", torch.tensor(0.0))
    scale = pt.param("scale", torch.tensor(1.0), constraint=constraints.positive)
    pt.sample("mu", dist.Normal(loc, scale))


def _pair(model, guide, **kwargs):
    def make(compile):
        return SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=compile, seed=7,
                   **kwargs)  # fmt: skip

    return make(True), make(False)


def _same(compiled, eager, *args, steps=6):
    a = compiled.run(steps, *args, progress_bar=False)
    b = eager.run(steps, *args, progress_bar=False)
    torch.testing.assert_close(a.losses, b.losses, rtol=1e-10, atol=1e-10)
    for name in b.params:
        torch.testing.assert_close(a.params[name], b.params[name], rtol=1e-10, atol=1e-10)
    return a


def test_runs_follow_changes_the_model_reads_from_outside_its_arguments():
    global SCALE, SHIFT
    y = torch.linspace(-1.0, 3.0, 7)
    compiled, eager = _pair(global_model, guide, steps_per_call=2)
    try:
        with count_compiles() as stats:
            _same(compiled, eager, y, 1)
            _same(compiled, eager, y, 1)  # nothing changed: no new graph
        assert stats.graphs == 1 and stats.graph_breaks == 0
        assert isinstance(compiled._blocks[(2, True)], InPlaceBlock)
        with count_compiles() as stats:
            SCALE = 2.0  # a global float
            _same(compiled, eager, y, 1)
            SHIFT.add_(0.5)  # a global tensor changed in place
            _same(compiled, eager, y, 1)
            SHIFT = torch.tensor(-1.0)  # a global tensor replaced
            _same(compiled, eager, y, 1)
            _same(compiled, eager, y, 3)  # a non-tensor argument
        assert stats.graphs == 4
    finally:
        SCALE, SHIFT = 1.0, torch.zeros(())


def test_module_training_flags_and_optimizer_settings_recompile():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Dropout(0.3), nn.Linear(8, 2))
    x = torch.randn(20, 3)
    y = torch.randn(20)

    def model(x, y):
        w = pt.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        with pt.plate("n", len(y)):
            pt.sample("y", dist.Normal(x[:, :2] @ w, 1.0), obs=y)

    def amortized_guide(x, y):
        h = pt.module("net", net)(x).mean(0)
        pt.sample("w", dist.Normal(h, 0.5).to_event(1))

    initial = {k: v.clone() for k, v in net.state_dict().items()}
    results = {}
    for compile in (True, False):
        net.load_state_dict(initial)
        net.train()
        svi = SVI(model, amortized_guide, pt.optim.Adam(lr=0.01), Trace_ELBO(),
                  compile=compile, seed=3)  # fmt: skip
        first = svi.run(4, x, y, progress_bar=False).losses
        net.eval()  # no dropout from here on: another graph
        second = svi.run(4, x, y, progress_bar=False).losses
        svi.optim.hyper["betas"] = (0.5, 0.6)
        third = svi.run(4, x, y, progress_bar=False).losses
        results[compile] = (first, second, third)
    for a, b in zip(*results.values()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def branching_model(y):
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    scale = 1.0 if mu > 0 else 2.0  # decided by a value: cannot be one graph
    pt.sample("y", dist.Normal(mu, scale).expand([len(y)]).to_event(1), obs=y)


@pytest.mark.parametrize("how", ["run", "step", "both"])
def test_a_step_that_cannot_be_one_graph_runs_eagerly_with_one_warning(how):
    # as the samplers do, and as Pyro's SVI runs every step: the results are compile=False's
    y = torch.linspace(-1.0, 3.0, 4)
    losses = {}
    for compile in (True, False):
        svi = SVI(branching_model, lambda y: guide(y, 1), pt.optim.Adam(lr=0.05), Trace_ELBO(),
                  compile=compile, seed=7)  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if how == "run":
                first = svi.run(3, y, progress_bar=False).losses
                second = svi.run(2, y, progress_bar=False).losses
            elif how == "step":
                first = torch.tensor([svi.step(y) for _ in range(3)])
                second = torch.tensor([svi.step(y) for _ in range(2)])
            else:  # each its own block: the second does not try to compile again
                first = svi.run(3, y, progress_bar=False).losses
                second = torch.tensor([svi.step(y) for _ in range(2)])
        notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        if compile:
            assert len(notes) == 1, notes
            assert "running the SVI step eagerly" in notes[0]
            assert "Data-dependent branching" in notes[0] and "branching_model" in notes[0]
            assert "torch.where" in notes[0] and "compile=False to SVI" in notes[0]
        else:
            assert notes == []
        losses[compile] = torch.cat([first, second])
    torch.testing.assert_close(losses[True], losses[False], rtol=0, atol=0)


def test_a_step_that_branches_on_a_float_and_on_a_value_runs_eagerly():
    # the float is first tried as a tensor, then as a number; neither compiles
    def model(y, tau=1.0):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0 if tau > 0.5 else 5.0))
        scale = 1.0 if mu > 0 else 2.0
        pt.sample("y", dist.Normal(mu, scale).expand([len(y)]).to_event(1), obs=y)

    y = torch.linspace(-1.0, 3.0, 4)
    losses = {}
    for compile in (True, False):
        svi = SVI(model, lambda y, tau: guide(y, 1), pt.optim.Adam(lr=0.05), Trace_ELBO(),
                  compile=compile, seed=2)  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses[compile] = torch.cat(
                [svi.run(2, y, tau=tau, progress_bar=False).losses for tau in (0.3, 2.0)]
            )
        notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        if compile:
            assert len(notes) == 1 and "running the SVI step eagerly" in notes[0], notes
        else:
            assert notes == []
    torch.testing.assert_close(losses[True], losses[False], rtol=0, atol=0)


def test_a_generator_made_in_the_guide_runs_the_step_eagerly_with_compile_falses_draws():
    # the initial value drawn from a generator of the guide's own at every step: a captured
    # graph drew it from torch's global generator instead, so the losses depended on what
    # the caller had drawn before (and differed from compile=False's)
    def own_generator_guide(y):
        init = torch.randn(3, generator=torch.Generator().manual_seed(1))
        loc = pt.param("loc", init)
        with pt.plate("data", 3):
            pt.sample("mu", dist.Normal(loc, 0.3))

    def local_model(y):
        with pt.plate("data", 3):
            mu = pt.sample("mu", dist.Normal(0.0, 1.0))
            pt.sample("y", dist.Normal(mu, 0.5), obs=y)

    y = torch.tensor([-1.0, 0.5, 2.0])
    losses = []
    for compile in (True, True, False):
        torch.randn(len(losses) + 1)  # the caller's own draws, different each time
        svi = SVI(local_model, own_generator_guide, pt.optim.Adam(lr=0.05), Trace_ELBO(),
                  compile=compile, seed=4)  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses.append(svi.run(5, y, progress_bar=False).losses)
        notes = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        assert len(notes) == int(compile), notes
        if compile:
            assert "running the SVI step eagerly" in notes[0] and "torch.Generator" in notes[0]
    for other in losses[1:]:
        torch.testing.assert_close(other, losses[0], rtol=0, atol=0)


def test_an_error_of_the_users_code_in_a_compiled_step_is_raised_as_it_is():
    # Dynamo reports it as "Observed exception"; the advice about one graph was wrong
    def late_guide(y, extra):
        loc = pt.param("a", torch.tensor(0.0))
        if extra:
            loc = loc + pt.param("b", torch.tensor(0.0))
        pt.sample("mu", dist.Normal(loc, 1.0))

    svi = SVI(
        lambda y, extra: global_model(y, 1.0), late_guide, pt.optim.Adam(lr=0.1), Trace_ELBO()
    )
    svi.step(torch.ones(3), False)
    with pytest.raises(ValueError, match="param 'b' did not exist when SVI was initialized"):
        svi.step(torch.ones(3), True)


def test_a_block_that_writes_into_its_data_falls_back():
    # (Inside SVI's gradient transform torch itself refuses such writes; the check guards
    # the in-place graph, whose buffers would otherwise be the caller's tensors.)
    def block(flat, opt_state, elbo_state, last_good, active, lrs, args, kwargs):
        args[0].add_(1.0)
        return flat + args[0].sum(), opt_state, elbo_state, last_good, flat.sum()[None]

    calls = []

    def fallback():
        calls.append(1)
        return block

    run = InPlaceBlock(block, {}, fallback=fallback)
    data = torch.zeros(3)
    with pytest.warns(UserWarning, match="writes into"):
        out = run(torch.zeros(2), (), {}, torch.zeros(2), None, torch.ones(1), (data,), {})
    assert calls == [1] and torch.equal(data, torch.ones(3))
    assert torch.equal(out[0], torch.full((2,), 3.0))


def test_step_uses_the_guarded_block_and_agrees_with_run():
    y = torch.linspace(-1.0, 3.0, 7)
    compiled, eager = _pair(global_model, guide)
    _same(compiled, eager, y, 1, steps=3)
    for _ in range(3):
        torch.testing.assert_close(compiled.step(y, 1), eager.step(y, 1), rtol=1e-10, atol=1e-10)
    assert not isinstance(compiled._blocks[(1, False)], InPlaceBlock)
    _same(compiled, eager, y, 1, steps=3)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="SIGINT is delivered to the main thread",
)
def test_ctrl_c_stops_a_run_between_whole_blocks(default_sigint):
    y = torch.linspace(-1.0, 3.0, 7)
    compiled, eager = _pair(global_model, guide, steps_per_call=2)
    _same(compiled, eager, y, 1, steps=2)  # compiled before the timer starts
    # the interrupted run is checked against the same compiled SVI run without interrupt
    # (the thousands of steps it makes in 0.3 s took eager ~100 s on two busy cores)
    reference = _pair(global_model, guide, steps_per_call=2)[0]
    reference.run(2, y, 1, progress_bar=False)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.warns(RuntimeWarning, match="interrupted after"):
            result = compiled.run(10**7, y, 1, progress_bar=False)
    finally:
        timer.cancel()
    done = len(result.losses)
    assert 0 < done < 10**7 and done % 2 == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    expected = reference.run(done, y, 1, progress_bar=False)
    torch.testing.assert_close(result.losses, expected.losses, rtol=1e-10, atol=1e-10)
    for name in expected.params:
        torch.testing.assert_close(result.params[name], expected.params[name])


@pytest.mark.parametrize("direct", ["1", "0"])
def test_block_calls_generated_code_directly_with_eagers_results(monkeypatch, direct):
    """The block's graph runs through Inductor's generated code without AOT autograd's
    wrappers (probtorch/inference/generated_call.py) unless PROBTORCH_DIRECT_CALL=0; the
    random draws inside the graph and the results are the same either way."""
    monkeypatch.setenv("PROBTORCH_DIRECT_CALL", direct)
    y = torch.linspace(-1.0, 3.0, 7)
    compiled, eager = _pair(global_model, guide, steps_per_call=3)
    _same(compiled, eager, y, 1.0, steps=9)
    blocks = [b for b in compiled._blocks.values() if isinstance(b, InPlaceBlock)]
    graphs = [graph for block in blocks for graph in block._compiled.values()]
    assert graphs
    for graph in graphs:
        assert graph.fn.__qualname__.startswith("direct_call.") == (direct == "1")
        # the call is recorded and replayed (generated_call.CallTape) where direct
        assert hasattr(graph.fn, "bind") == (direct == "1")


def logistic_model(X, y):
    beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pt.plate("n", X.shape[0]):
        pt.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def logistic_guide(X, y):
    loc = pt.param("loc", torch.zeros(X.shape[1]))
    scale = pt.param("scale", torch.full((X.shape[1],), 0.1), constraint=constraints.positive)
    pt.sample("beta", dist.Normal(loc, scale).to_event(1))


@pytest.mark.parametrize("own", [True, False])
@pytest.mark.parametrize("steps_per_call", [1, 4])
def test_replayed_block_makes_products_and_draws_directly_with_eagers_results(
    monkeypatch, steps_per_call, own
):
    """The logistic regression's block is replayed as one C++ loop (call_program.py) with
    its matrix-vector products as direct calls of probtorch's own kernel (matvec_op.py;
    BLAS's gemv with PROBTORCH_OWN_MATVEC=0) and its guide's draws as ``normal_`` into
    fixed buffers (a Python step of the loop); losses and params agree with eager SVI
    (the same draws)."""
    monkeypatch.setattr(svi_block, "_OWN_MATVEC", own)
    programs = []
    run_program = call_program.run
    monkeypatch.setattr(call_program, "run", lambda *a: (programs.append(a[0]), run_program(*a))[1])
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(200, 5, generator=gen)
    y = (torch.rand(200, generator=gen) < torch.sigmoid(X @ torch.ones(5))).to(X.dtype)
    compiled, eager = _pair(logistic_model, logistic_guide, steps_per_call=steps_per_call)
    recorded = []
    original = generated_call.CallTape.record.__func__

    def spy(cls, module, constants, inputs):
        tape, out = original(cls, module, constants, inputs)
        recorded.append(tape)
        return tape, out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generated_call.CallTape, "record", classmethod(spy))
        _same(compiled, eager, X, y, steps=2 * steps_per_call + 1)
    assert recorded
    ops = [step for tape in recorded for step in tape._steps if step[0] == "op"]
    product = torch.ops.probtorch.matvec if own else torch.ops.aten.mv
    products = [s for s in ops if s[1] is product.default]
    draws = [s for s in ops if s[1] is torch.ops.aten.normal_functional.default]
    assert len(products) == 2 * steps_per_call * len(recorded)
    assert all(s[4] is not None and s[4][4] is not None for s in products)  # direct calls
    assert len(programs) == 3 + 1  # the three blocks, and the check when recording
    assert len(draws) == steps_per_call * len(recorded)
    assert all(s[4] is not None and s[4][0] is generated_call._normal_into for s in draws)


def test_the_probe_record_describes_operations_and_writes_nothing_outside():
    """The per-run probe is recorded eagerly (svi_block._OpRecord): tensors by where they
    came from, outside tensors by their values; writes into inputs or outside tensors (a
    module's running statistics) go to copies, so recording changes nothing."""
    outside = torch.ones(3)

    def probe(x):
        outside.add_(1.0)  # as a BatchNorm in training mode updates its running mean
        x.mul_(2.0)
        return (x + outside).sum()

    def record(x):
        recorder = svi_block._OpRecord([x])
        with recorder:
            probe(x)
        return recorder.ops

    x = torch.arange(3.0)
    first = record(x)
    assert torch.equal(outside, torch.ones(3)) and torch.equal(x, torch.arange(3.0))
    assert record(x) == first  # nothing changed: the same record
    assert record(torch.zeros(3)) == first  # other input values: the same record
    outside.fill_(5.0)  # an outside tensor's values changed: another record
    assert record(x) != first
    ops = [op for op, _, _ in first]
    assert ops[:2] == ["aten.add_.Tensor", "aten.mul_.Tensor"]
    assert first[1][2][0] == ("input", 0) and first[0][2][0][0] == (3,)  # input; digest


def test_a_prior_built_outside_the_model_with_a_stride_0_row_is_captured_in_place():
    # Pyro's PyroSample(dist.Normal(0., 10.).expand([1]).to_event(1)): loc and scale are
    # (1,) tensors of stride 0, which torch calls contiguous; the step's digest of the
    # constants it reads viewed them as bytes and failed, sending the step to torch.compile
    prior = dist.Normal(0.0, 10.0).expand([1]).to_event(1)
    assert prior.base_dist.loc.stride() == (0,)
    y = torch.linspace(-1.0, 3.0, 7)

    def model(y):
        b = pt.sample("b", prior)
        with pt.plate("n", 7):
            pt.sample("y", dist.Normal(b, 1.0), obs=y)

    def local_guide(y):
        loc = pt.param("loc", torch.zeros(1))
        pt.sample("b", dist.Normal(loc, 0.1).to_event(1))

    svi = SVI(model, local_guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        svi.run(20, y, progress_bar=False)
    assert not [w for w in caught if "could not be captured" in str(w.message)]
