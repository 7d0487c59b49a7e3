"""Hamiltonian Monte Carlo with a fixed number of leapfrog steps, as a per-leapfrog state machine.

Chains may use different numbers of steps (a fixed trajectory length over per-chain step
sizes, :func:`trajectory_steps`); a chain that has taken its steps waits, frozen, for the
others. :func:`metropolis` accepts or rejects the end point. One transition at a time
(``HMC.sample``) starts with :func:`hmc_init`; blocks of transitions
(:mod:`.hmc_block`) with :func:`hmc_start`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from .integrator import kinetic_energy, leapfrog, sample_momentum
from .nuts import TransitionResult
from .nuts_block import select

DIVERGENCE_ENERGY = 1000.0  # an energy error above this marks a divergent trajectory

__all__ = [
    "HMCRandomness",
    "HMCState",
    "hmc_draw_randomness",
    "hmc_start",
    "hmc_init",
    "hmc_iteration",
    "trajectory_steps",
    "metropolis",
]


class HMCRandomness(NamedTuple):
    momentum_noise: torch.Tensor  # (C, D)
    accept_u: torch.Tensor  # (C,)


class HMCState(NamedTuple):
    z0: torch.Tensor
    pe0: torch.Tensor
    g0: torch.Tensor
    energy0: torch.Tensor
    z: torch.Tensor
    r: torch.Tensor
    pe: torch.Tensor
    g: torch.Tensor
    steps_left: torch.Tensor
    num_steps: torch.Tensor
    done: torch.Tensor


def hmc_draw_randomness(num_chains, dim, dtype, device=None) -> HMCRandomness:
    return HMCRandomness(
        torch.randn(num_chains, dim, dtype=dtype, device=device),
        torch.rand(num_chains, dtype=dtype, device=device),
    )


def hmc_start(z, potential_energy, grad, r, kinetic, num_steps) -> HMCState:
    """A trajectory from ``z`` with momentum ``r`` of kinetic energy ``kinetic``."""
    return HMCState(
        z, potential_energy, grad, potential_energy + kinetic,
        z, r, potential_energy, grad,
        num_steps, torch.zeros_like(num_steps), num_steps <= 0,
    )  # fmt: skip


def hmc_init(z, potential_energy, grad, momentum_noise, mass_sqrt, inverse_mass, num_steps):
    """:func:`hmc_start` with momentum from ``momentum_noise``, in buffers of its own."""
    r = sample_momentum(mass_sqrt, momentum_noise)
    start = hmc_start(z, potential_energy, grad, r, kinetic_energy(inverse_mass, r), num_steps)
    return HMCState(*(x.clone() for x in start))


def trajectory_steps(
    step_size: torch.Tensor,
    num_steps: int | None,
    trajectory_length: float | None,
    max_steps: int,
) -> torch.Tensor:
    """Leapfrog steps per chain: ``num_steps``, or ``ceil(trajectory_length / step_size)``
    within ``[1, max_steps]``."""
    if num_steps is not None:
        return torch.full(step_size.shape, num_steps, dtype=torch.int64, device=step_size.device)
    # clamped before the cast: a tiny or nan step size would overflow int64 (nan: max_steps)
    steps = torch.ceil(trajectory_length / step_size).nan_to_num(nan=max_steps)
    return steps.clamp(1, max_steps).to(torch.int64)


def hmc_iteration(
    state: HMCState,
    value_and_grad: Callable,
    step_size: torch.Tensor,
    inverse_mass: torch.Tensor,
) -> HMCState:
    s = state
    active = ~s.done
    z, r, pe, g = leapfrog(value_and_grad, s.z, s.r, s.g, step_size, inverse_mass)
    bad = ~torch.isfinite(pe) | ~torch.isfinite(g).all(-1)
    steps_left = s.steps_left - 1
    a1, a2 = active, active.unsqueeze(-1)
    return HMCState(
        s.z0, s.pe0, s.g0, s.energy0,
        torch.where(a2, z, s.z), torch.where(a2, r, s.r),
        torch.where(a1, pe, s.pe), torch.where(a2, g, s.g),
        torch.where(a1, steps_left, s.steps_left),
        torch.where(a1, s.num_steps + 1, s.num_steps),
        s.done | (active & ((steps_left <= 0) | bad)),
    )  # fmt: skip


def metropolis(traj: HMCState, inverse_mass: torch.Tensor, u: torch.Tensor) -> TransitionResult:
    """Accept a finished trajectory's end point with probability ``min(1, exp(-dH))``."""
    energy = traj.pe + kinetic_energy(inverse_mass, traj.r)
    delta = energy - traj.energy0
    delta = torch.where(torch.isnan(delta), torch.full_like(delta, math.inf), delta)
    accept_prob = torch.exp(torch.clamp(-delta, max=0.0))
    accept = u < accept_prob
    return TransitionResult(
        select(accept, traj.z, traj.z0),
        torch.where(accept, traj.pe, traj.pe0),
        select(accept, traj.g, traj.g0),
        torch.where(accept, energy, traj.energy0),
        torch.zeros_like(traj.num_steps),
        traj.num_steps,
        accept_prob,
        delta > DIVERGENCE_ENERGY,
    )
