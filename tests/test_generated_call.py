"""Calling Inductor's generated code without AOT autograd's wrappers: used only where one
checked call equals the compiled artifact's, with the same results afterwards."""

import pytest
import torch
from test_inplace_loop import _args, _start, _walk
from torch._inductor.codecache import PyCodeCache
from torch.fx.experimental.proxy_tensor import make_fx

from probtorch.inference import generated_call
from probtorch.inference.generated_call import direct_call, generated_module
from probtorch.inference.mcmc.executor import ChunkedLoop, InPlaceLoop


def _step_in_place(x, noise_scale):
    """Writes ``x``; reads a constant made while tracing (lifted as a buffer) and draws
    random numbers inside the graph."""
    shift = torch.tensor([0.5, -1.0, 2.0])
    x.copy_(torch.tanh(x + shift) + noise_scale * torch.randn(3))
    return (x.sum(),)


def _compiled(fn, inputs):
    gm = make_fx(fn)(*[t.clone() for t in inputs])
    loaded = len(PyCodeCache.modules)
    compiled = torch._inductor.standalone_compile(gm, inputs, dynamic_shapes="from_example_inputs")
    return gm, compiled, generated_module(PyCodeCache.modules[loaded:])


def test_direct_call_equals_the_compiled_artifact_and_keeps_the_random_state():
    inputs = [torch.zeros(3), torch.tensor(0.1)]
    gm, compiled, module = _compiled(_step_in_place, inputs)
    assert generated_call.lifted_constants(gm)  # the traced constant is passed by the wrapper
    torch.manual_seed(3)
    call = direct_call(compiled, gm, module, inputs, written=[0])
    assert call is not None
    assert torch.equal(inputs[0], torch.zeros(3))  # the check ran on copies
    # the check drew no numbers from the caller's random stream
    torch.manual_seed(3)
    expected_x = torch.zeros(3)
    expected = [compiled(expected_x, inputs[1]) for _ in range(3)]
    torch.manual_seed(3)
    got = [call([inputs[0], inputs[1]]) for _ in range(3)]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(expected, got))
    assert torch.equal(inputs[0], expected_x)


def test_direct_call_is_refused_when_it_would_compute_something_else(monkeypatch):
    inputs = [torch.zeros(3), torch.tensor(0.1)]
    gm, compiled, module = _compiled(_step_in_place, inputs)
    # constants in another order than the wrapper's (here: a wrong value) fail the check
    monkeypatch.setattr(generated_call, "lifted_constants", lambda gm: [torch.ones(3)])
    assert direct_call(compiled, gm, module, inputs, written=[0]) is None
    # the wrong number of arguments raises inside the generated code: refused too
    monkeypatch.setattr(generated_call, "lifted_constants", lambda gm: [])
    assert direct_call(compiled, gm, module, inputs, written=[0]) is None
    monkeypatch.undo()
    assert direct_call(compiled, gm, module, inputs, written=[0]) is not None
    assert direct_call(compiled, gm, None, inputs, written=[0]) is None  # no module found
    monkeypatch.setenv("PROBTORCH_DIRECT_CALL", "0")
    assert direct_call(compiled, gm, module, inputs, written=[0]) is None


@pytest.mark.parametrize("nan", [False, True])
def test_bitwise_equal_counts_nans_as_equal(nan):
    a = torch.tensor([1.0, float("nan") if nan else 2.0, -0.0])
    assert generated_call._bitwise_equal((a, [a]), (a.clone(), [a.clone()]))
    assert not generated_call._bitwise_equal(a, torch.tensor([1.0, 2.5, -0.0]))
    assert not generated_call._bitwise_equal(a, a.double())


def test_in_place_loop_uses_the_direct_call_with_the_same_results(monkeypatch):
    runs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("PROBTORCH_DIRECT_CALL", setting)
        loop = InPlaceLoop(_walk)
        runs[setting] = loop(_start(), *_args())
        ((call, _, _),) = loop._compiled.values()
        assert call.__qualname__.startswith("direct_call.") == (setting == "1")
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))
    eager = ChunkedLoop(_walk, compiled=False)(_start(), *_args())
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], eager))


def _step_with_solve(x, scale_tril, noise_scale):
    """Writes ``x``; a library call (the triangular solve) between two kernels, whose result
    the second kernel reads through a view; a lifted constant; random numbers in the graph."""
    shift = torch.tensor([0.5, -1.0, 2.0])
    y = torch.linalg.solve_triangular(scale_tril, (x + shift).unsqueeze(-1), upper=False)
    x.copy_(torch.tanh(y.squeeze(-1)) + noise_scale * torch.randn(3))
    return (x.sum(), y)


def _solve_inputs():
    scale_tril = torch.tensor([[2.0, 0.0, 0.0], [0.3, 1.0, 0.0], [-0.2, 0.4, 1.5]])
    return [torch.zeros(3), scale_tril, torch.tensor(0.1)]


def _compiled_with_tape(inputs):
    gm = make_fx(_step_with_solve)(*[t.clone() for t in inputs])
    call, pool = generated_call.compile_graph(
        gm, inputs, {}, written=[0], pool_buffers=True, replay=True
    )
    return call, pool


def test_replayed_call_makes_the_generated_codes_kernel_and_library_calls_bit_for_bit():
    inputs = _solve_inputs()
    call, pool = _compiled_with_tape(inputs)
    tape = call.bind.__self__
    assert tape.num_kernels >= 2 and tape.num_library_calls >= 1  # the solve among them
    # a kernel after the solve reads what it returned (directly or through a view)
    late = [p[0] for step in tape._steps if step[0] == "k" for p in step[2]]
    assert "o" in late or "v" in late
    # the solve is made through torch's binding; Inductor's seed draw (random) is not
    ops = [step for step in tape._steps if step[0] == "op"]
    assert [step[5] is torch._C._linalg.linalg_solve_triangular for step in ops].count(True) == 1
    assert all(step[5] is None for step in ops if "solve" not in str(step[1]))
    assert torch.equal(inputs[0], torch.zeros(3))  # the checks ran on copies
    for start in (torch.zeros(3), torch.tensor([0.3, -2.0, 1.0])):  # two inputs lists
        direct_x, replay_x = start.clone(), start.clone()
        torch.manual_seed(5)
        expected = []
        for _ in range(3):
            pool.start()
            expected.append([t.clone() for t in call([direct_x, *inputs[1:]])])
        torch.manual_seed(5)
        step = call.bind([replay_x, *inputs[1:]])
        got = [[t.clone() for t in step()] for _ in range(3)]
        assert generated_call._bitwise_equal(expected, got)
        assert torch.equal(direct_x, replay_x)


def _step_with_hidden_solve(x, scale_tril, noise_scale):
    """:func:`_step_with_solve` that does not return the solve's result."""
    return _step_with_solve(x, scale_tril, noise_scale)[:1]


def test_replay_makes_a_library_call_through_its_out_overload_into_fixed_buffers():
    inputs = _solve_inputs()
    gm = make_fx(_step_with_hidden_solve)(*[t.clone() for t in inputs])
    call, pool = generated_call.compile_graph(
        gm, inputs, {}, written=[0], pool_buffers=True, replay=True
    )
    tape = call.bind.__self__
    assert tape.num_out_calls == 1  # the solve (Inductor's seed draw is an out= call already)
    direct_x, replay_x = torch.zeros(3), torch.zeros(3)
    torch.manual_seed(5)
    expected = []
    for _ in range(3):
        pool.start()
        expected.append(call([direct_x, *inputs[1:]])[0].clone())
    torch.manual_seed(5)
    step = call.bind([replay_x, *inputs[1:]])
    got = [step()[0].clone() for _ in range(3)]
    assert generated_call._bitwise_equal(expected, got)
    assert torch.equal(direct_x, replay_x)
    # the plan found the solve's out= overload
    solve = torch.ops.aten.linalg_solve_triangular
    scale_tril = inputs[1]
    assert generated_call._out_plan(
        solve.default, (scale_tril, torch.ones(3, 1)), {"upper": False},
        solve.default(scale_tril, torch.ones(3, 1), upper=False),
    )[0] is solve.out


def test_out_plan_is_refused_for_random_mutating_and_view_calls():
    x = torch.ones(3)
    aten = torch.ops.aten
    plan = generated_call._out_plan
    assert plan(aten.bernoulli.p, (x, 0.5), {}, aten.bernoulli.p(x, 0.5)) is None
    assert plan(aten.add_.Tensor, (x.clone(), x), {}, x) is None
    assert plan(aten.view.default, (x, [3, 1]), {}, x.view(3, 1)) is None
    assert plan(aten.add.Tensor, (x, x), {}, aten.add.Tensor(x, x))[0] is aten.add.out


def test_replay_is_refused_when_it_cannot_be_shown_to_compute_the_same(monkeypatch):
    inputs = _solve_inputs()
    call, pool = _compiled_with_tape(inputs)
    gm = make_fx(_step_with_solve)(*[t.clone() for t in inputs])
    generated = pool._module

    def another(args):  # a reference that computes something else
        args[0].add_(1.0)
        return call(args)

    def replay(reference):
        return generated_call.replay_call(
            reference, generated, generated_call.lifted_constants(gm), inputs, [0], pool.start
        )

    assert replay(call) is not None
    assert replay(another) is None
    assert generated_call.replay_call(call, None, [], inputs, [0]) is None
    monkeypatch.setenv("PROBTORCH_REPLAY_CALL", "0")
    assert replay(call) is None


def test_in_place_loop_replays_the_call_with_the_same_results(monkeypatch):
    runs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("PROBTORCH_REPLAY_CALL", setting)
        loop = InPlaceLoop(_walk)
        runs[setting] = loop(_start(), *_args())
        ((call, _, _),) = loop._compiled.values()
        assert hasattr(call, "bind") == (setting == "1")
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))
    eager = ChunkedLoop(_walk, compiled=False)(_start(), *_args())
    assert all(torch.equal(a, b) for a, b in zip(runs["1"], eager))


def test_library_calls_are_replayed_through_torch_python_bindings():
    aten = torch.ops.aten
    x, y = torch.randn(2, 1, 3), torch.randn(2, 3, 4)
    binding = generated_call._python_binding
    assert binding(aten.linalg_solve_triangular.out) is torch._C._linalg.linalg_solve_triangular
    assert binding(aten.bmm.default) is torch._C._VariableFunctions.bmm
    # the out= plan of the solve carries its binding, checked bit for bit
    inputs = _solve_inputs()
    scale_tril, rhs = inputs[1], torch.ones(3, 1)
    solve = aten.linalg_solve_triangular.default
    plan = generated_call._out_plan(
        solve, (scale_tril, rhs), {"upper": False}, solve(scale_tril, rhs, upper=False)
    )
    assert plan[3] is torch._C._linalg.linalg_solve_triangular
    # a recorded call made again through its binding: deterministic calls that write only
    # their out= buffers, which alias nothing else
    same = generated_call._same_binding
    out = torch.empty(2, 1, 4)
    args = (torch.zeros(2, 1, 4), x, y)
    kwargs = {"beta": 0, "out": out}
    assert same(aten.baddbmm.out, args, kwargs, aten.baddbmm.out(*args, **kwargs)) is not None
    aliased = (out, x, y)  # the out buffer is an argument too: a second call differs
    assert same(aten.baddbmm.out, aliased, kwargs, aten.baddbmm.out(*aliased, **kwargs)) is None
    assert same(aten.bmm.default, (x, y), {}, torch.bmm(x, y)) is torch._C._VariableFunctions.bmm
    z = torch.ones(3)
    assert same(aten.bernoulli.p, (z, 0.5), {}, z) is None
    assert same(aten.add_.Tensor, (z.clone(), z), {}, z) is None
    assert same(aten.view.default, (z, [3, 1]), {}, z.view(3, 1)) is None
    assert same(aten.add.out, (z, z), {"out": z}, z) is None  # writes its own input
    # a binding that computes something else is not taken
    assert same(aten.bmm.default, (x, y), {}, torch.bmm(x, y) + 1) is None



def _step_with_draws(x, noise_scale):
    """Writes ``x`` from two draws of torch's generator inside the graph (Inductor's
    ``fallback_random``: torch's sampler, ``aten.normal_functional``)."""
    first = torch.empty(3).normal_()
    second = torch.empty(2, 3).normal_(1.0, 2.0)
    x.copy_(torch.tanh(x) + noise_scale * (first + second.sum(0)))
    return (x.sum(),)


def test_replay_draws_random_numbers_into_fixed_buffers_with_torchs_bits():
    """A random call of the generated code (``normal_functional``) is replayed as
    ``normal_`` into a buffer fixed when binding: the same draws bit for bit, the generator
    left in the same state, on every call."""
    inputs = [torch.zeros(3), torch.tensor(0.5)]
    gm = make_fx(_step_with_draws)(*[t.clone() for t in inputs])
    options = {"config_patches": {"fallback_random": True}}
    call, pool = generated_call.compile_graph(
        gm, inputs, options, written=[0], pool_buffers=True, replay=True
    )
    tape = call.bind.__self__
    draws = [s for s in tape._steps if s[0] == "op" and "normal" in str(s[1])]
    assert len(draws) == 2
    assert all(s[4] is not None and s[4][0] is generated_call._normal_into for s in draws)
    assert tape.num_out_calls >= 2
    direct_x, replay_x = torch.zeros(3), torch.zeros(3)
    torch.manual_seed(11)
    expected = []
    for _ in range(4):
        pool.start()
        expected.append(call([direct_x, inputs[1]])[0].clone())
    after_direct = torch.random.get_rng_state()
    torch.manual_seed(11)
    step = call.bind([replay_x, inputs[1]])
    got = [step()[0].clone() for _ in range(4)]
    assert generated_call._bitwise_equal(expected, got)
    assert torch.equal(direct_x, replay_x)
    assert torch.equal(torch.random.get_rng_state(), after_direct)


def test_random_plan_is_refused_for_another_generator():
    gen = torch.Generator().manual_seed(0)
    before = torch.random.get_rng_state()
    op = torch.ops.aten.normal_functional.default
    result = op(torch.empty(4), 0.0, 1.0, generator=gen)
    assert generated_call._random_plan(op, (torch.empty(4), 0.0, 1.0), {"generator": gen},
                                       result, before) is None  # fmt: skip
    assert torch.equal(torch.random.get_rng_state(), before)
