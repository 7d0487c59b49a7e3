"""Many NUTS transitions per chain in one state machine: the block executor's graph.

:func:`block_iteration` advances every chain by one leapfrog step, and also does what
happens between transitions: a chain that finishes a transition records its draw, updates
its step-size adaptation, and starts its next transition at the next iteration, without
waiting for the other chains' longer trees. A block ends for a chain after ``t_limit``
transitions, or when its share of pre-drawn leaf uniforms could not cover another full
tree. The host then reads the draws and starts the next block. The mass-matrix statistics
are updated on the host from each block's draws (they are only needed at window ends), so
the graph does not carry a (co)variance update on every leapfrog step.

Random numbers are drawn on the host per block (:func:`draw_block_randomness`), so eager and
compiled execution give the same draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .adaptation import DualAveragingState, dual_averaging_update
from .integrator import kinetic_energy, sample_momentum, velocity
from .nuts import (
    RESET_FIELDS,
    NUTSState,
    init_transition,
    nuts_step,
    start_transition,
    transition_result,
)

__all__ = [
    "BlockRandomness",
    "BlockOutputs",
    "BlockState",
    "draw_block_randomness",
    "with_momenta",
    "init_block",
    "block_iteration",
    "empty_outputs",
    "record",
    "finish_transitions",
    "at",
    "put",
    "select",
]


class BlockRandomness(NamedTuple):
    momentum_noise: torch.Tensor  # (C, T, D)
    go_right: torch.Tensor  # (C, T, max_depth)
    merge_u: torch.Tensor  # (C, T, max_depth)
    leaf_u: torch.Tensor  # (C, leaf_budget)
    # each transition's momentum, velocity and kinetic energy, from the noise and the metric
    # (:func:`with_momenta`, as ``run_segment`` does); None: block_iteration computes them
    # at every iteration (eager callers only: the compiled executors take tensors only)
    momentum: torch.Tensor | None = None  # (C, T, D)
    velocity: torch.Tensor | None = None  # (C, T, D)
    kinetic: torch.Tensor | None = None  # (C, T)


class BlockOutputs(NamedTuple):
    """Per-transition results; row ``T`` is a scratch row for chains that did not finish."""

    z: torch.Tensor  # (C, T + 1, D)
    potential_energy: torch.Tensor  # (C, T + 1)
    energy: torch.Tensor
    tree_depth: torch.Tensor
    num_steps: torch.Tensor
    accept_prob: torch.Tensor
    diverging: torch.Tensor
    step_size: torch.Tensor


class BlockState(NamedTuple):
    tree: NUTSState
    need_init: torch.Tensor  # (C,) start a new transition at the next iteration
    block_done: torch.Tensor  # (C,)
    t: torch.Tensor  # (C,) transitions finished in this block
    leaf_pos: torch.Tensor  # (C,) leaf uniforms used by finished transitions
    z: torch.Tensor  # current point
    potential_energy: torch.Tensor
    grad: torch.Tensor
    minv_grad: torch.Tensor  # M^{-1} grad
    step_size: torch.Tensor
    dual_averaging: DualAveragingState
    out: BlockOutputs


def draw_block_randomness(C, T, D, max_depth, leaf_budget, dtype, device=None) -> BlockRandomness:
    return BlockRandomness(
        torch.randn(C, T, D, dtype=dtype, device=device),
        torch.rand(C, T, max_depth, device=device) < 0.5,
        torch.rand(C, T, max_depth, dtype=dtype, device=device),
        torch.rand(C, leaf_budget, dtype=dtype, device=device),
    )


def with_momenta(
    rand: BlockRandomness, mass_sqrt: torch.Tensor, inverse_mass: torch.Tensor
) -> BlockRandomness:
    """``rand`` with every transition's momentum ``r ~ N(0, M)`` from its noise, its
    velocity ``M^{-1} r`` and kinetic energy, for the whole block at once.

    :func:`block_iteration` starts a transition at every iteration for the chains that
    need one and keeps the other chains' trees, so it would compute all three per leapfrog
    step; with a dense metric that is two of the five matrix-vector products per step.
    """
    r = sample_momentum(mass_sqrt, rand.momentum_noise)
    v = velocity(inverse_mass, r)
    return rand._replace(momentum=r, velocity=v, kinetic=kinetic_energy(inverse_mass, r, v))


def init_block(
    z, potential_energy, grad, inverse_mass, step_size, dual_averaging, t_limit, T, max_depth
):
    """A block state whose chains start a fresh transition at ``z`` (under the metric
    ``inverse_mass``, fixed for the block)."""
    C, D = z.shape
    zeros_noise = torch.zeros_like(z)
    mass_one = torch.ones_like(z)
    tree = init_transition(z, potential_energy, grad, zeros_noise, mass_one, mass_one, max_depth)
    zeros_long = torch.zeros(C, dtype=torch.int64, device=z.device)
    return BlockState(
        tree,
        torch.ones(C, dtype=torch.bool, device=z.device),
        t_limit <= 0,
        zeros_long.clone(),
        zeros_long.clone(),
        z.clone(),
        potential_energy.clone(),
        grad.clone(),
        velocity(inverse_mass, grad).clone(),
        step_size.clone(),
        DualAveragingState(*(x.clone() for x in dual_averaging)),
        empty_outputs(z, T),
    )


def empty_outputs(z: torch.Tensor, T: int) -> BlockOutputs:
    """Zeroed per-transition outputs for a block of ``T`` transitions per chain at ``z``."""
    C, D = z.shape
    out_float = torch.zeros(C, T + 1, dtype=z.dtype, device=z.device)
    out_long = torch.zeros(C, T + 1, dtype=torch.int64, device=z.device)
    return BlockOutputs(
        torch.zeros(C, T + 1, D, dtype=z.dtype, device=z.device),
        out_float.clone(), out_float.clone(), out_long.clone(), out_long.clone(),
        out_float.clone(), out_long.bool(), out_float.clone(),
    )  # fmt: skip


def record(out: BlockOutputs, slot: torch.Tensor, result, step_size: torch.Tensor) -> BlockOutputs:
    """``out`` with row ``slot[c]`` of chain ``c`` set to its transition ``result``."""
    return BlockOutputs(
        put(out.z, slot, result.z),
        put(out.potential_energy, slot, result.potential_energy),
        put(out.energy, slot, result.energy),
        put(out.tree_depth, slot, result.tree_depth),
        put(out.num_steps, slot, result.num_steps),
        put(out.accept_prob, slot, result.accept_prob),
        put(out.diverging, slot, result.diverging),
        put(out.step_size, slot, step_size),
    )


def finish_transitions(bs, finished, t_idx, result, adapt_step_size, target_accept_prob):
    """What a block does for the chains whose transition ``finished`` at this iteration:
    record ``result`` in row ``t_idx`` of the outputs (the others write to the scratch row
    T), update dual averaging (if ``adapt_step_size``) and count the transition. Returns
    the outputs, dual-averaging state, step sizes and transition counts."""
    T = bs.out.z.shape[1] - 1
    slot = torch.where(finished, t_idx, torch.full_like(t_idx, T))
    out = record(bs.out, slot, result, bs.step_size)
    adapt_step = finished & adapt_step_size
    da_new = dual_averaging_update(bs.dual_averaging, result.accept_prob, target_accept_prob)
    dual_averaging = DualAveragingState(
        *(select(adapt_step, n, o) for n, o in zip(da_new, bs.dual_averaging))
    )
    step_size = torch.where(adapt_step, torch.exp(da_new.log_step_size), bs.step_size)
    return out, dual_averaging, step_size, bs.t + finished.to(bs.t.dtype)


def at(buf: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``buf[c, index[c]]`` for a (C, T, ...) buffer."""
    idx = index.reshape(index.shape + (1,) * (buf.dim() - 1))
    idx = idx.expand((buf.shape[0], 1) + buf.shape[2:])
    return buf.gather(1, idx).squeeze(1)


def put(buf: torch.Tensor, index: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``buf[c, index[c]] = value[c]`` (functional).

    ``index_put`` rather than ``scatter``: Inductor turns a chain of index_puts into in-place
    writes (one copy of the buffer per compiled call, none when the buffer is updated in
    place), where each scatter copies the whole buffer.
    """
    chains = torch.arange(buf.shape[0], device=buf.device)
    return buf.index_put((chains, index), value.to(buf.dtype))


def select(mask: torch.Tensor, new, old):
    m = mask.reshape(mask.shape + (1,) * (new.dim() - 1))
    return torch.where(m, new, old)


def block_iteration(
    bs: BlockState,
    rand: BlockRandomness,
    inverse_mass: torch.Tensor,
    mass_sqrt: torch.Tensor,
    t_limit: torch.Tensor,
    adapt_step_size: torch.Tensor,
    value_and_grad: Callable,
    max_depth: int,
    max_delta_energy: float,
    target_accept_prob: float,
) -> BlockState:
    """One leapfrog step for every chain, plus the bookkeeping between transitions."""
    T = bs.out.z.shape[1] - 1
    leaf_budget = rand.leaf_u.shape[1]
    t_idx = bs.t.clamp(max=T - 1)

    # start a new transition where the previous one finished
    if rand.momentum is not None:
        r, v, kinetic = (at(x, t_idx) for x in (rand.momentum, rand.velocity, rand.kinetic))
        fresh = start_transition(
            bs.z, bs.potential_energy, bs.grad, bs.minv_grad, r, v, kinetic, max_depth
        )
    else:
        noise = at(rand.momentum_noise, t_idx)
        fresh = init_transition(
            bs.z, bs.potential_energy, bs.grad, noise, mass_sqrt, inverse_mass, max_depth
        )
    starting = bs.need_init & ~bs.block_done
    reset = {
        name: select(starting, getattr(fresh, name), getattr(bs.tree, name))
        for name in RESET_FIELDS
    }
    tree = bs.tree._replace(**reset)
    tree = tree._replace(done=tree.done | bs.block_done)

    # one leapfrog of the transition in progress
    leaf_index = (bs.leaf_pos + tree.num_steps).clamp(max=leaf_budget - 1)
    u_leaf = rand.leaf_u.gather(1, leaf_index.unsqueeze(-1)).squeeze(-1)
    new_tree = nuts_step(
        tree,
        at(rand.go_right, t_idx),
        at(rand.merge_u, t_idx),
        u_leaf,
        value_and_grad,
        bs.step_size,
        inverse_mass,
        max_depth,
        max_delta_energy,
        # a chain that finishes restarts at the next iteration, or its block is done and
        # its tree is not read again
        freeze_finished=False,
    )
    finished = new_tree.done & ~tree.done
    result = transition_result(new_tree)

    out, dual_averaging, step_size, t = finish_transitions(
        bs, finished, t_idx, result, adapt_step_size, target_accept_prob
    )
    leaf_pos = bs.leaf_pos + torch.where(finished, new_tree.num_steps, torch.zeros_like(bs.t))
    out_of_leaves = leaf_pos + (2**max_depth) > leaf_budget
    block_done = bs.block_done | (finished & ((t >= t_limit) | out_of_leaves))
    return BlockState(
        new_tree,
        finished,
        block_done,
        t,
        leaf_pos,
        select(finished, result.z, bs.z),
        torch.where(finished, result.potential_energy, bs.potential_energy),
        select(finished, result.grad, bs.grad),
        select(finished, result.minv_grad, bs.minv_grad),
        step_size,
        dual_averaging,
        out,
    )
