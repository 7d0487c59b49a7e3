"""Warmup adaptation as in Stan: dual averaging of the step size, windowed mass matrix.

Each piece is an ``(init, update, final)`` triple over state batched on the chain dimension;
:func:`warmup_windows` gives Stan's schedule (initial buffer 75, slow windows doubling from
25, terminal buffer 50, scaled down for short warmups).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = [
    "DualAveragingState",
    "dual_averaging_init",
    "dual_averaging_update",
    "dual_averaging_final",
    "WelfordState",
    "welford_init",
    "welford_update",
    "welford_update_batch",
    "welford_final",
    "warmup_windows",
    "mass_sqrt_from_inverse",
    "WarmupSegment",
    "warmup_segments",
]


class DualAveragingState(NamedTuple):
    log_step_size: torch.Tensor  # x_t, the step size used next (log)
    log_step_size_avg: torch.Tensor  # x_bar_t, the running average (log)
    gradient_avg: torch.Tensor  # H_bar_t
    count: torch.Tensor  # t
    mu: torch.Tensor  # shrinkage target log(10 * step_size0)


def dual_averaging_init(step_size: torch.Tensor) -> DualAveragingState:
    """Start dual averaging at ``step_size`` (per chain), shrinking towards ``10 * step_size``."""
    log_step = torch.log(step_size)
    zeros = torch.zeros_like(log_step)
    return DualAveragingState(log_step, zeros, zeros, zeros, log_step + math.log(10.0))


def dual_averaging_update(
    state: DualAveragingState,
    accept_prob: torch.Tensor,
    target_accept_prob: float = 0.8,
    gamma: float = 0.05,
    t0: float = 10.0,
    kappa: float = 0.75,
) -> DualAveragingState:
    """Nesterov dual averaging (Hoffman & Gelman 2014, Alg. 5) with Stan's constants."""
    count = state.count + 1
    eta = 1.0 / (count + t0)
    accept_prob = torch.nan_to_num(accept_prob, nan=0.0)
    gradient_avg = (1 - eta) * state.gradient_avg + eta * (target_accept_prob - accept_prob)
    log_step = state.mu - count.sqrt() / gamma * gradient_avg
    weight = count.pow(-kappa)
    log_step_avg = weight * log_step + (1 - weight) * state.log_step_size_avg
    return DualAveragingState(log_step, log_step_avg, gradient_avg, count, state.mu)


def dual_averaging_final(state: DualAveragingState) -> torch.Tensor:
    """The adapted step size: the exponentiated running average."""
    return torch.exp(state.log_step_size_avg)


class WelfordState(NamedTuple):
    mean: torch.Tensor  # (C, D)
    m2: torch.Tensor  # (C, D) diagonal or (C, D, D) dense
    count: torch.Tensor  # (C,) draws seen per chain


def welford_init(num_chains: int, dim: int, dense: bool, dtype, device=None) -> WelfordState:
    mean = torch.zeros(num_chains, dim, dtype=dtype, device=device)
    shape = (num_chains, dim, dim) if dense else (num_chains, dim)
    count = torch.zeros(num_chains, dtype=dtype, device=device)
    return WelfordState(mean, torch.zeros(shape, dtype=dtype, device=device), count)


def welford_update(state: WelfordState, z: torch.Tensor) -> WelfordState:
    """Add one draw per chain to the running mean and (co)variance."""
    count = state.count + 1
    delta = z - state.mean
    mean = state.mean + delta / count.unsqueeze(-1)
    delta_after = z - mean
    if state.m2.dim() == 3:
        m2 = state.m2 + delta.unsqueeze(-1) * delta_after.unsqueeze(-2)
    else:
        m2 = state.m2 + delta * delta_after
    return WelfordState(mean, m2, count)


def welford_update_batch(state: WelfordState, draws: torch.Tensor) -> WelfordState:
    """Add ``draws`` of shape ``(C, n, D)`` at once (Chan et al.'s pairwise combination).

    Equal, up to rounding, to ``n`` calls of :func:`welford_update`. The NUTS block executor
    uses it on the host with each block's recorded draws, so the compiled graph carries no
    mass-matrix statistics.
    """
    n = draws.shape[1]
    if n == 0:
        return state
    batch_mean = draws.mean(1)
    centered = draws - batch_mean.unsqueeze(1)
    if state.m2.dim() == 3:
        batch_m2 = centered.transpose(1, 2) @ centered
    else:
        batch_m2 = (centered * centered).sum(1)
    count = state.count + n
    delta = batch_mean - state.mean
    weight = (state.count * n / count).unsqueeze(-1)  # n_a n_b / (n_a + n_b), per chain
    mean = state.mean + delta * (n / count).unsqueeze(-1)
    if state.m2.dim() == 3:
        m2 = state.m2 + batch_m2 + weight.unsqueeze(-1) * delta.unsqueeze(-1) * delta.unsqueeze(-2)
    else:
        m2 = state.m2 + batch_m2 + weight * delta * delta
    return WelfordState(mean, m2, count)


def welford_final(state: WelfordState) -> torch.Tensor:
    """Stan's regularized estimate: shrink towards 1e-3 * identity with weight 5 / (n + 5)."""
    n = state.count
    if bool((n < 2).any()):
        raise ValueError(f"welford_final needs at least two draws per chain, got {n.tolist()}")
    extra = (1,) * (state.m2.dim() - 1)
    n = n.reshape(n.shape + extra)
    covariance = state.m2 / (n - 1)
    shrink = 5.0 / (n + 5.0)
    if covariance.dim() == 3:
        # exactly symmetric (the running sums are not, by rounding): the samplers multiply
        # momenta by it from the right, r^T M^{-1}, which equals M^{-1} r only then
        covariance = 0.5 * (covariance + covariance.transpose(-1, -2))
        eye = torch.eye(covariance.shape[-1], dtype=covariance.dtype, device=covariance.device)
        return (n / (n + 5.0)) * covariance + 1e-3 * shrink * eye
    return (n / (n + 5.0)) * covariance + 1e-3 * shrink


def mass_sqrt_from_inverse(inverse_mass: torch.Tensor) -> torch.Tensor:
    """``M^{1/2}`` for momentum draws: elementwise for a diagonal, Cholesky of ``M`` if dense."""
    if inverse_mass.dim() == 2:
        return inverse_mass.rsqrt()
    return torch.linalg.cholesky(torch.linalg.inv(inverse_mass))


def warmup_windows(
    num_warmup: int, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25
) -> list[tuple[int, int]]:
    """Stan's slow adaptation windows as ``[start, end)`` iteration ranges.

    The mass matrix is estimated in each window and updated at its end; the step size is
    adapted throughout. Short warmups scale the buffers down to 15% / 75% / 10%, and warmups
    under 20 iterations adapt the step size only (no windows).

    Example::

        >>> warmup_windows(1000)
        [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    """
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = int(0.1 * num_warmup)
        base_window = num_warmup - (init_buffer + term_buffer)
    windows = []
    start, size = init_buffer, base_window
    end_slow = num_warmup - term_buffer
    while start < end_slow:
        end = start + size
        # a window whose successor would not fit grows to the end of the slow phase
        if windows and end + 2 * size > end_slow:
            end = end_slow
        windows.append((start, end))
        start, size = end, 2 * size
    return windows


class WarmupSegment(NamedTuple):
    """A run of warmup transitions with the same adaptation settings."""

    length: int
    collect_mass: bool  # feed draws to the mass-matrix estimate
    ends_window: bool  # update the mass matrix (and restart step-size adaptation) after it


def warmup_segments(num_warmup: int, windows: list[tuple[int, int]]) -> list[WarmupSegment]:
    """Split ``num_warmup`` transitions at the slow windows' boundaries.

    Example::

        >>> [tuple(s) for s in warmup_segments(200, warmup_windows(200))]
        [(75, False, False), (25, True, True), (50, True, True), (50, False, False)]
    """
    segments, t = [], 0
    for start, end in windows:
        if start > t:
            segments.append(WarmupSegment(start - t, False, False))
        segments.append(WarmupSegment(end - start, True, True))
        t = end
    if num_warmup > t:
        segments.append(WarmupSegment(num_warmup - t, False, False))
    return segments
