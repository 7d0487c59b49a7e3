"""The NUTS state machine agrees draw for draw with the eager reference in reference_nuts.py.

1. :mod:`probtorch.inference.mcmc.nuts` driven directly (``draw_randomness``,
   ``init_transition``, ``nuts_iteration``, ``transition_result``), batched over chains with
   per-chain step sizes and diagonal metrics, against ``reference_transition`` run chain by
   chain on the same random numbers.
2. The block executor the MCMC driver runs (``NUTS.run_segment``: chains start their next
   tree without waiting, step-size adaptation in the graph) against the reference, replaying
   the block's random numbers.
3. Compiled against eager: ``NUTS(compile=True)`` gives the eager kernel's draws, with no
   graph breaks and no recompiles after the first transition.
"""

import math

import pytest
import torch
from models import MODELS
from reference_nuts import reference_transition

from probtorch.inference import NUTS
from probtorch.inference.compile import count_compiles
from probtorch.inference.mcmc import kernels as nuts_kernels
from probtorch.inference.mcmc.adaptation import dual_averaging_update
from probtorch.inference.mcmc.nuts import (
    draw_randomness,
    init_transition,
    nuts_iteration,
    transition_result,
)
from probtorch.inference.mcmc.nuts_block import draw_block_randomness
from probtorch.inference.mcmc.warmup import init_adapt_state
from probtorch.inference.potential import Potential, initialize_model
from probtorch.validation import torch_validation

NUM_CHAINS = 4
ATOL = 1e-10


pytestmark = pytest.mark.usefixtures("float64")


def _compiled_potential(name):
    """The model's potential, compiled: the reference evaluates it thousands of times, and
    eagerly (a traced model under vmap) each evaluation costs milliseconds."""
    model, make_data = MODELS[name]
    args, kwargs = make_data()
    return Potential(model, args, kwargs, compile=True)


def _single_chain(potential):
    """``z (D,) -> (potential energy, grad)`` for the reference, through the public API."""

    def value_and_grad(z):
        value, grad = potential.value_and_grad(z.unsqueeze(0))
        return value[0], grad[0]

    return value_and_grad


def _random_metric(dim, step_range, seed):
    """Per-chain step sizes in ``step_range`` and a diagonal inverse mass in [0.5, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    low, high = step_range
    step = low + (high - low) * torch.rand(NUM_CHAINS, generator=g)
    inverse_mass = 0.5 + torch.rand(NUM_CHAINS, dim, generator=g)
    return step, inverse_mass


def _assert_same_transition(label, proposal, stats, z, pe, num_steps, depth, diverging, accept):
    assert stats["num_steps"] == int(num_steps), label
    assert stats["tree_depth"] == int(depth), label
    assert stats["diverging"] == bool(diverging), label
    assert abs(stats["accept_prob"] - float(accept)) < ATOL, label
    torch.testing.assert_close(z, proposal[0], rtol=0, atol=ATOL, msg=label)
    torch.testing.assert_close(pe, proposal[2], rtol=0, atol=ATOL, msg=label)


# (model, step-size range, max tree depth, transitions): ordinary trees, trees cut at the maximum
# depth, step sizes large enough to diverge, and long steps. On these seeds each of Stan's four
# extra checks across neighbouring (sub)trees is what stops some tree in some case: removing any
# one of them from nuts_iteration fails this test.
CASES = {
    "eight_schools": ("eight_schools", (0.05, 0.35), 10, 20),
    "logistic_regression": ("logistic_regression", (0.05, 0.35), 10, 20),
    "logistic_regression_long_steps": ("logistic_regression", (0.05, 1.05), 10, 40),
    "eight_schools_max_depth": ("eight_schools", (0.01, 0.03), 4, 20),
    "eight_schools_divergent": ("eight_schools", (1.5, 4.0), 10, 20),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_machine_matches_reference(case):
    name, step_range, max_depth, num_transitions = CASES[case]
    model, make_data = MODELS[name]
    args, kwargs = make_data()
    potential, z = initialize_model(model, args, kwargs, num_chains=NUM_CHAINS, compile=True)
    step, inverse_mass = _random_metric(potential.dim, step_range, seed=1)
    pe, grad = potential.value_and_grad(z)
    single = _single_chain(potential)
    torch.manual_seed(0)
    seen = {"depths": set(), "diverging": 0}
    for t in range(num_transitions):
        rand = draw_randomness(NUM_CHAINS, potential.dim, max_depth, torch.float64)
        tree = init_transition(
            z, pe, grad, rand.momentum_noise, inverse_mass.rsqrt(), inverse_mass, max_depth
        )
        with torch_validation(False):
            while not bool(tree.done.all()):
                tree = nuts_iteration(
                    tree, rand, potential.value_and_grad, step, inverse_mass, max_depth
                )
        result = transition_result(tree)
        with torch_validation(False):
            for c in range(NUM_CHAINS):
                proposal, stats = reference_transition(
                    single, z[c], pe[c], grad[c], rand.momentum_noise[c], rand.go_right[c],
                    rand.merge_u[c], rand.leaf_u[c], step[c], inverse_mass[c], max_depth,
                )  # fmt: skip
                _assert_same_transition(
                    f"{case}: transition {t}, chain {c}", proposal, stats, result.z[c],
                    result.potential_energy[c], result.num_steps[c], result.tree_depth[c],
                    result.diverging[c], result.accept_prob[c],
                )  # fmt: skip
                # the energy kept along the tree is the proposal's Hamiltonian
                r_prop = proposal[1]
                energy = proposal[2] + 0.5 * (inverse_mass[c] * r_prop * r_prop).sum()
                torch.testing.assert_close(result.energy[c], energy, rtol=0, atol=ATOL)
                seen["depths"].add(stats["tree_depth"])
                seen["diverging"] += stats["diverging"]
        z, pe, grad = result.z, result.potential_energy, result.grad
    # the comparison covered what each case is for
    if case.endswith("max_depth"):
        assert max_depth in seen["depths"]
    if case.endswith("divergent"):
        assert seen["diverging"] > 0
    else:
        assert max(seen["depths"]) >= 3
    if not case.endswith("max_depth"):
        assert len(seen["depths"]) >= 2


# -- the block executor ------------------------------------------------------------------------
def _setup_kernel(name, compile, max_tree_depth=10, block_size=64, seed=1):
    model, make_data = MODELS[name]
    args, kwargs = make_data()
    kernel = NUTS(model, compile=compile, max_tree_depth=max_tree_depth, block_size=block_size)
    torch.manual_seed(0)
    state = kernel.setup(args, kwargs, num_chains=NUM_CHAINS, rng_seed=0)
    step, inverse_mass = _random_metric(kernel.potential.dim, (0.05, 0.35), seed)
    mass_sqrt = inverse_mass.rsqrt()
    state = state._replace(step_size=step, inverse_mass=inverse_mass, mass_sqrt=mass_sqrt)
    return kernel, state


def _replay_segment(kernel, state, result, seed, model_name):
    """Replay ``run_segment``'s transitions chain by chain with the reference transition.

    ``run_segment`` draws one ``BlockRandomness`` per block. In a block, chain ``c``'s
    ``i``-th transition uses row ``i`` of the momentum noise, directions and merge uniforms, and
    the leaf uniforms from where its previous transition stopped; its block ends after
    ``block_size`` transitions, or when the leaf uniforms left could not cover a full tree.
    Each transition starts from the segment's previous draw with the step size the segment
    recorded (rounding differences would otherwise grow along the chain); that the step sizes
    follow dual averaging is checked separately.

    Returns, per chain, ``(proposal, stats)`` per transition, and how many blocks ended on the
    leaf budget rather than the block size.
    """
    C, D = state.z.shape
    n = result.draws.shape[1]
    T, L, budget = kernel.block_size, kernel.max_tree_depth, kernel.leaf_budget
    torch.manual_seed(seed)  # every block makes at least one transition: n blocks suffice
    blocks = [draw_block_randomness(C, T, D, L, budget, state.z.dtype) for _ in range(n)]
    single = _single_chain(_compiled_potential(model_name))
    replay, early_block_ends = [], 0
    for c in range(C):
        block, i, leaf_pos, remaining = 0, 0, 0, n
        chain = []
        for t in range(n):
            z = state.z[c] if t == 0 else result.draws[c, t - 1]
            pe, grad = single(z)
            rand = blocks[block]
            chain.append(
                reference_transition(
                    single, z, pe, grad, rand.momentum_noise[c, i], rand.go_right[c, i],
                    rand.merge_u[c, i], rand.leaf_u[c, leaf_pos:],
                    result.stats["step_size"][c, t], state.inverse_mass[c], L,
                )
            )  # fmt: skip
            i, leaf_pos = i + 1, leaf_pos + chain[-1][1]["num_steps"]
            out_of_leaves = leaf_pos + 2**L > budget
            if i >= min(remaining, T) or out_of_leaves:
                early_block_ends += out_of_leaves and i < min(remaining, T)
                block, remaining, i, leaf_pos = block + 1, remaining - i, 0, 0
        replay.append(chain)
    return replay, early_block_ends


@pytest.mark.parametrize("adapt_step_size", [False, True])
def test_block_executor_matches_reference(adapt_step_size):
    """Several small blocks of deep trees, so that some end on the leaf budget."""
    kernel, state = _setup_kernel("eight_schools", compile=False, max_tree_depth=7, block_size=8)
    step, _ = _random_metric(kernel.potential.dim, (0.02, 0.06), seed=2)
    state = state._replace(step_size=step)
    n = 20
    adapt = init_adapt_state(state, dense=False)
    torch.manual_seed(5)
    result = kernel.run_segment(state, adapt, n, adapt_step_size=adapt_step_size)
    assert result.draws.shape == (NUM_CHAINS, n, kernel.potential.dim)
    stats = result.stats
    replay, early_block_ends = _replay_segment(kernel, state, result, 5, "eight_schools")
    with torch_validation(False):
        for c, chain in enumerate(replay):
            for t, (proposal, ref) in enumerate(chain):
                _assert_same_transition(
                    f"chain {c}, transition {t}", proposal, ref, result.draws[c, t],
                    stats["potential_energy"][c, t], stats["num_steps"][c, t],
                    stats["tree_depth"][c, t], stats["diverging"][c, t],
                    stats["accept_prob"][c, t],
                )  # fmt: skip
    # some block ended on the leaf budget rather than the block size
    assert early_block_ends > 0
    # the step sizes: fixed, or dual averaging over each transition's acceptance statistic
    if not adapt_step_size:
        assert torch.equal(stats["step_size"], state.step_size.unsqueeze(1).expand(-1, n))
        return
    da = adapt.dual_averaging
    expected = [state.step_size]
    for t in range(n):
        da = dual_averaging_update(da, stats["accept_prob"][:, t], kernel.target_accept_prob)
        expected.append(torch.exp(da.log_step_size))
    expected = torch.stack(expected, dim=1)
    torch.testing.assert_close(stats["step_size"], expected[:, :n], rtol=1e-12, atol=0)
    torch.testing.assert_close(result.state.step_size, expected[:, n], rtol=1e-12, atol=0)
    assert result.adapt.dual_averaging.count.tolist() == [n] * NUM_CHAINS


# -- compiled against eager ------------------------------------------------------------------
@pytest.mark.slow
def test_compiled_sample_matches_eager_without_recompiles():
    name = "logistic_regression"
    eager, state = _setup_kernel(name, compile=False)
    compiled, compiled_state = _setup_kernel(name, compile=True)
    assert compiled.potential.compiled and not eager.potential.compiled
    torch.testing.assert_close(compiled_state.z, state.z, rtol=0, atol=0)
    states = [state, state]  # eager, compiled
    steps = []

    def transition(t):
        results = []
        for i, kernel in enumerate((eager, compiled)):
            torch.manual_seed(100 + t)
            states[i], result = kernel.sample(states[i])
            results.append(result)
        expected, result = results
        label = f"transition {t}"
        assert torch.equal(result.num_steps, expected.num_steps), label
        assert torch.equal(result.tree_depth, expected.tree_depth), label
        assert torch.equal(result.diverging, expected.diverging), label
        torch.testing.assert_close(result.z, expected.z, rtol=0, atol=ATOL, msg=label)
        torch.testing.assert_close(
            result.accept_prob, expected.accept_prob, rtol=0, atol=ATOL, msg=label
        )
        steps.append(expected.num_steps)

    with count_compiles() as first:
        transition(0)
    assert first.graph_breaks == 0 and first.graphs >= 1
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        for t in range(1, 10):
            transition(t)
    assert later.graph_breaks == 0 and later.graphs == 0
    assert int(torch.stack(steps).max()) > compiled.chunk_size  # several chunks per tree


@pytest.mark.slow
def test_compiled_block_executor_matches_eager_without_recompiles():
    name = "logistic_regression"
    eager, state = _setup_kernel(name, compile=False, block_size=8)
    compiled, _ = _setup_kernel(name, compile=True, block_size=8)
    adapt = init_adapt_state(state, dense=False)
    runs = []
    for kernel in (eager, compiled):
        torch.manual_seed(7)
        with count_compiles() as first:
            a = kernel.run_segment(state, adapt, 12, adapt_step_size=True)
        # other flags and a second segment reuse the compiled graph
        with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
            b = kernel.run_segment(a.state, a.adapt, 12, collect_mass=True)
        runs.append((a, b, first, later))
    (ea, eb, _, _), (ca, cb, first, later) = runs
    assert first.graph_breaks == 0 and first.graphs >= 1
    assert later.graph_breaks == 0 and later.graphs == 0
    for e, c in ((ea, ca), (eb, cb)):
        assert torch.equal(c.stats["num_steps"], e.stats["num_steps"])
        assert torch.equal(c.stats["tree_depth"], e.stats["tree_depth"])
        torch.testing.assert_close(c.draws, e.draws, rtol=0, atol=ATOL)
        torch.testing.assert_close(c.stats["step_size"], e.stats["step_size"], rtol=1e-10, atol=0)
    torch.testing.assert_close(cb.adapt.welford.m2, eb.adapt.welford.m2, rtol=1e-10, atol=0)
    assert math.isfinite(float(cb.draws.abs().max()))


def test_block_momenta_drawn_per_block_give_the_per_iteration_draws(monkeypatch):
    """``run_segment`` computes each transition's momentum, velocity and kinetic energy once
    per block (``with_momenta``: a batched product with a dense metric); the block graph
    can also compute them itself at every iteration. Same draws and statistics."""
    kernel, state = _setup_kernel("eight_schools", compile=False, block_size=8)
    D = kernel.potential.dim
    g = torch.Generator().manual_seed(3)
    a = torch.randn(NUM_CHAINS, D, D, generator=g, dtype=torch.float64) / D**0.5
    inverse_mass = a @ a.transpose(1, 2) + 0.5 * torch.eye(D, dtype=torch.float64)
    inverse_mass = 0.5 * (inverse_mass + inverse_mass.transpose(1, 2))  # exactly symmetric
    mass_sqrt = torch.linalg.cholesky(torch.linalg.inv(inverse_mass))
    state = state._replace(inverse_mass=inverse_mass, mass_sqrt=mass_sqrt)
    results = {}
    for per_block in (True, False):
        if not per_block:
            monkeypatch.setattr(nuts_kernels, "with_momenta", lambda rand, *metric: rand)
        torch.manual_seed(5)
        results[per_block] = kernel.run_segment(state, init_adapt_state(state, dense=True), 12)
    a, b = results[True], results[False]
    torch.testing.assert_close(a.draws, b.draws, rtol=0, atol=ATOL)
    for name in ("energy", "potential_energy", "accept_prob"):
        torch.testing.assert_close(a.stats[name], b.stats[name], rtol=0, atol=ATOL)
    assert torch.equal(a.stats["num_steps"], b.stats["num_steps"])
