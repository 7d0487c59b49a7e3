"""Hamiltonian Monte Carlo with a fixed number of leapfrog steps, as a per-leapfrog state machine.

Chains may use different numbers of steps (a fixed trajectory length over per-chain step
sizes); a chain that has taken its steps waits, frozen, for the others. The Metropolis
correction happens in :func:`hmc_result`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .integrator import kinetic_energy, leapfrog, sample_momentum

__all__ = ["HMCRandomness", "HMCState", "hmc_draw_randomness", "hmc_init", "hmc_iteration"]


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


def hmc_init(z, potential_energy, grad, momentum_noise, mass_sqrt, inverse_mass, num_steps):
    r = sample_momentum(mass_sqrt, momentum_noise)
    energy0 = potential_energy + kinetic_energy(inverse_mass, r)
    steps = num_steps.clone()
    return HMCState(
        z.clone(), potential_energy.clone(), grad.clone(), energy0,
        z.clone(), r, potential_energy.clone(), grad.clone(),
        steps, torch.zeros_like(steps), steps <= 0,
    )  # fmt: skip


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
