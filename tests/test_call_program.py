"""A replayed call run as one C++ loop (call_program.py): the same results bit for bit as
the Python replay, used by the in-place loop where every call is a C function, refused
where one is not, and Ctrl-C still stops the loop between whole calls."""

import os
import signal
import sys
import threading
from typing import NamedTuple

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from probtorch.inference import call_program, generated_call
from probtorch.inference.mcmc.executor import ChunkedLoop, InPlaceLoop

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the loop is built on Linux only"
)


def _factor(n=6, seed=3):
    a = torch.randn(n, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.linalg.cholesky(a @ a.mT + n * torch.eye(n, dtype=torch.float64))


def _step(x, scale_tril):
    """Three kernels and two triangular solves, as a Gaussian model's gradient makes."""
    y = torch.tanh(x) + 1.0
    z = torch.linalg.solve_triangular(scale_tril, y.mT, upper=False)
    x.copy_(x + 0.1 * torch.linalg.solve_triangular(scale_tril.mT, z, upper=True).mT)
    return (x.sum(),)


def test_a_program_makes_the_replayed_calls_bit_for_bit():
    scale_tril, x = _factor(), torch.randn(4, 6, dtype=torch.float64)
    gm = make_fx(_step)(x.clone(), scale_tril)
    call, _ = generated_call.compile_graph(
        gm, [x.clone(), scale_tril], {}, written=[0], pool_buffers=True, replay=True
    )
    assert call_program.available()
    tape = call.bind.__self__
    assert tape.use_program  # replay_call checked one call through it
    by_python, by_program = x.clone(), x.clone()
    replay = call.bind([by_python, scale_tril])
    python_sums = [replay()[0].clone() for _ in range(5)]
    run = call.bind([by_program, scale_tril])
    steps = tape.num_kernels + tape.num_library_calls  # the kernels and the two solves
    assert run.program is not None and int(run.program[0]) == steps and tape.num_library_calls == 2
    calls = torch.zeros(1, dtype=torch.int64)
    call_program.run(run.program, torch.zeros((), dtype=torch.bool), 5, calls)
    assert int(calls[0]) == 5
    assert torch.equal(by_python, by_program)
    assert torch.equal(python_sums[-1], run.result[0])
    call_program.run(run.program, torch.ones((), dtype=torch.bool), 5, calls)
    assert int(calls[0]) == 1  # stops after a call that leaves the flag set


def test_program_refuses_functions_it_cannot_call():
    x = torch.zeros(3)
    assert call_program.program([(torch.sin, [x])]) is None  # no C function known

    def scaled(x, factor):  # stands for a binding of a C function with a float argument
        pass

    call_program.note_entry(scaled, 1, ["double*", "float"])
    assert call_program.program([(scaled, [x, 1.0])]) is None
    source = call_program.callers_source({0, 2})
    assert "probtorch_call_0(void* f" in source and "(int64_t, int64_t)>(f)(a[0], a[1])" in source


class Solve(NamedTuple):
    x: torch.Tensor  # (C, D)
    steps: torch.Tensor  # (C,)
    done: torch.Tensor  # (C,)


def _solve_walk(state: Solve, scale_tril: torch.Tensor, limit: torch.Tensor) -> Solve:
    """A chain-batched state machine whose step solves with a triangular factor twice."""
    active = ~state.done
    z = torch.linalg.solve_triangular(scale_tril, torch.tanh(state.x).mT + 1.0, upper=False)
    y = torch.linalg.solve_triangular(scale_tril.mT, z, upper=True).mT
    x = torch.where(active.unsqueeze(-1), state.x + 0.1 * y, state.x)
    steps = state.steps + active.long()
    return Solve(x, steps, state.done | (steps >= limit))


def _solve_start(C=3, D=6):
    return Solve(
        torch.zeros(C, D, dtype=torch.float64),
        torch.zeros(C, dtype=torch.long),
        torch.zeros(C, dtype=torch.bool),
    )


def test_in_place_loop_runs_its_calls_as_a_program_with_the_same_results(monkeypatch):
    used = []
    run = call_program.run

    def spy(*args):
        used.append(True)
        return run(*args)

    monkeypatch.setattr(call_program, "run", spy)
    args = (_factor(), torch.tensor([5, 17, 300]))
    with_program = InPlaceLoop(_solve_walk)(_solve_start(), *args)
    assert used
    monkeypatch.setattr(call_program, "available", lambda: False)
    used.clear()
    loop = InPlaceLoop(_solve_walk)
    without = loop(_solve_start(), *args)
    assert not used and loop.calls > 0
    assert all(torch.equal(a, b) for a, b in zip(with_program, without))
    eager = ChunkedLoop(_solve_walk, compiled=False)(_solve_start(), *args)
    assert with_program.steps.tolist() == [5, 17, 300]
    torch.testing.assert_close(with_program.x, eager.x, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread(),
    reason="SIGINT is delivered to the main thread",
)
def test_ctrl_c_stops_a_program_between_whole_calls(default_sigint, monkeypatch):
    loops = []
    run = call_program.run

    def counted(*args):
        loops.append(True)
        return run(*args)

    monkeypatch.setattr(call_program, "run", counted)
    loop = InPlaceLoop(_solve_walk)
    scale_tril = _factor()
    loop(_solve_start(), scale_tril, torch.tensor([1, 1, 1]))  # compiled before the timer
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        out = loop(_solve_start(), scale_tril, torch.tensor([10**12] * 3))
    finally:
        timer.cancel()
    assert loop.interrupted
    assert int(out.steps[0]) > 0 and torch.isfinite(out.x).all()
    assert (out.steps == out.steps[0]).all()  # every chain made the same whole calls
    assert len(loops) > 1  # through the program, interrupted between its C++ loops


def test_a_program_calls_python_steps_and_stops_at_their_exceptions():
    """A random draw of the replayed call (``normal_`` into a fixed buffer) is a Python
    step of the program: the same draws as the Python replay; a Python step that raises
    stops the loop, and its exception comes out of the call."""
    from test_generated_call import _step_with_draws

    inputs = [torch.zeros(3), torch.tensor(0.5)]
    gm = make_fx(_step_with_draws)(*[t.clone() for t in inputs])
    options = {"config_patches": {"fallback_random": True}}
    call, _ = generated_call.compile_graph(
        gm, inputs, options, written=[0], pool_buffers=True, replay=True
    )
    by_python, by_program = torch.zeros(3), torch.zeros(3)
    torch.manual_seed(4)
    replay = call.bind([by_python, inputs[1]])
    sums = [replay()[0].clone() for _ in range(3)]
    torch.manual_seed(4)
    run = call.bind([by_program, inputs[1]])
    assert run.program is not None
    calls = torch.zeros(1, dtype=torch.int64)
    call_program.run(run.program, torch.zeros((), dtype=torch.bool), 3, calls)
    assert int(calls[0]) == 3
    assert torch.equal(by_python, by_program) and torch.equal(sums[-1], run.result[0])

    def fails():
        raise ValueError("a failing step")

    touched = torch.zeros(1)
    steps = [(call_program.PYTHON, lambda: touched.add_(1)), (call_program.PYTHON, fails)]
    program = call_program.program(steps)  # steps keeps the callables alive
    with pytest.raises(SystemError) as raised:
        call_program.run(program, torch.zeros((), dtype=torch.bool), 5, calls)
    assert isinstance(raised.value.__cause__, ValueError)
    assert int(touched) == 1 and int(calls[0]) == 0  # stopped within the first call
    assert call_program.program([(call_program.PYTHON, "not callable")]) is None
