"""Many HMC transitions per chain in one state machine, as :mod:`.nuts_block` for NUTS.

:func:`hmc_block_iteration` advances every chain by one leapfrog step; a chain whose
trajectory ends makes its Metropolis decision, records the draw, updates its step-size
adaptation and starts its next trajectory at the next iteration, without waiting for
chains with more steps (a fixed trajectory length over per-chain step sizes). A block ends
for a chain after ``t_limit`` transitions. Momenta and acceptance uniforms are drawn on the
host per block (:func:`draw_hmc_block_randomness`), so eager and compiled execution give the
same draws; the mass-matrix statistics are updated on the host from each block's draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .adaptation import DualAveragingState
from .hmc import HMCState, hmc_iteration, hmc_start, metropolis, trajectory_steps
from .integrator import kinetic_energy, sample_momentum
from .nuts_block import BlockOutputs, at, empty_outputs, finish_transitions, select

__all__ = [
    "HMCBlockRandomness",
    "HMCBlockState",
    "draw_hmc_block_randomness",
    "init_hmc_block",
    "hmc_block_iteration",
]


class HMCBlockRandomness(NamedTuple):
    momentum: torch.Tensor  # (C, T, D) each transition's momentum r ~ N(0, M)
    kinetic: torch.Tensor  # (C, T) its kinetic energy
    accept_u: torch.Tensor  # (C, T) the Metropolis uniforms


class HMCBlockState(NamedTuple):
    traj: HMCState
    need_init: torch.Tensor  # (C,) start a new trajectory at the next iteration
    block_done: torch.Tensor  # (C,)
    t: torch.Tensor  # (C,) transitions finished in this block
    z: torch.Tensor  # current point
    potential_energy: torch.Tensor
    grad: torch.Tensor
    step_size: torch.Tensor
    dual_averaging: DualAveragingState
    out: BlockOutputs


def draw_hmc_block_randomness(
    C: int, T: int, mass_sqrt: torch.Tensor, inverse_mass: torch.Tensor
) -> HMCBlockRandomness:
    """Momenta and acceptance uniforms for ``T`` transitions of ``C`` chains (the metric is
    fixed for a block), drawn from torch's generator in this order."""
    D = mass_sqrt.shape[1]
    dtype, device = mass_sqrt.dtype, mass_sqrt.device
    noise = torch.randn(C, T, D, dtype=dtype, device=device)
    accept_u = torch.rand(C, T, dtype=dtype, device=device)
    r = sample_momentum(mass_sqrt, noise)
    return HMCBlockRandomness(r, kinetic_energy(inverse_mass, r), accept_u)


def init_hmc_block(z, potential_energy, grad, step_size, dual_averaging, t_limit, T):
    """A block state whose chains start a fresh trajectory at ``z``."""
    C = z.shape[0]
    zeros = torch.zeros(C, dtype=z.dtype, device=z.device)
    zeros_long = torch.zeros(C, dtype=torch.int64, device=z.device)
    traj = HMCState(
        z.clone(), potential_energy.clone(), grad.clone(), zeros.clone(),
        z.clone(), torch.zeros_like(z), potential_energy.clone(), grad.clone(),
        zeros_long.clone(), zeros_long.clone(), torch.ones(C, dtype=torch.bool, device=z.device),
    )  # fmt: skip
    return HMCBlockState(
        traj,
        torch.ones(C, dtype=torch.bool, device=z.device),
        t_limit <= 0,
        zeros_long.clone(),
        z.clone(),
        potential_energy.clone(),
        grad.clone(),
        step_size.clone(),
        DualAveragingState(*(x.clone() for x in dual_averaging)),
        empty_outputs(z, T),
    )


def hmc_block_iteration(
    bs: HMCBlockState,
    rand: HMCBlockRandomness,
    inverse_mass: torch.Tensor,
    t_limit: torch.Tensor,
    adapt_step_size: torch.Tensor,
    value_and_grad: Callable,
    num_steps: int | None,
    trajectory_length: float | None,
    max_steps: int,
    target_accept_prob: float,
) -> HMCBlockState:
    """One leapfrog step for every chain, plus the bookkeeping between transitions."""
    T = bs.out.z.shape[1] - 1
    t_idx = bs.t.clamp(max=T - 1)

    # start a new trajectory where the previous one finished
    r, kinetic = at(rand.momentum, t_idx), at(rand.kinetic, t_idx)
    steps = trajectory_steps(bs.step_size, num_steps, trajectory_length, max_steps)
    fresh = hmc_start(bs.z, bs.potential_energy, bs.grad, r, kinetic, steps)
    starting = bs.need_init & ~bs.block_done
    traj = HMCState(*(select(starting, f, o) for f, o in zip(fresh, bs.traj)))
    traj = traj._replace(done=traj.done | bs.block_done)

    new_traj = hmc_iteration(traj, value_and_grad, bs.step_size, inverse_mass)
    finished = new_traj.done & ~traj.done
    result = metropolis(new_traj, inverse_mass, at(rand.accept_u, t_idx))

    out, dual_averaging, step_size, t = finish_transitions(
        bs, finished, t_idx, result, adapt_step_size, target_accept_prob
    )
    block_done = bs.block_done | (finished & (t >= t_limit))
    return HMCBlockState(
        new_traj,
        finished,
        block_done,
        t,
        select(finished, result.z, bs.z),
        torch.where(finished, result.potential_energy, bs.potential_energy),
        select(finished, result.grad, bs.grad),
        step_size,
        dual_averaging,
        out,
    )
