"""Stan's warmup: step size by dual averaging throughout, mass matrix in slow windows.

The kernel runs each :class:`~.adaptation.WarmupSegment` (transitions with fixed settings,
adapting inside); between segments the host closes a window: the mass matrix becomes the
window's regularized (co)variance estimate, the step-size heuristic runs again and dual
averaging restarts. At the end the step size becomes dual averaging's running average.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .adaptation import (
    DualAveragingState,
    WelfordState,
    dual_averaging_final,
    dual_averaging_init,
    mass_sqrt_from_inverse,
    warmup_segments,
    warmup_windows,
    welford_final,
    welford_init,
)

__all__ = ["AdaptState", "WarmupResult", "init_adapt_state", "run_warmup"]


class AdaptState(NamedTuple):
    dual_averaging: DualAveragingState
    welford: WelfordState


def init_adapt_state(state, dense: bool) -> AdaptState:
    C, D = state.z.shape
    return AdaptState(
        dual_averaging_init(state.step_size),
        welford_init(C, D, dense, state.z.dtype, state.z.device),
    )


class WarmupResult(NamedTuple):
    """What :func:`run_warmup` returns: the warmed-up state, the warmup transitions' draws
    ``(C, n, D)`` (unconstrained) and statistics (``(C, n)`` each), and whether a
    KeyboardInterrupt ended it (then ``n < num_warmup`` and the state is not adapted)."""

    state: object
    draws: torch.Tensor
    stats: dict
    interrupted: bool


def run_warmup(kernel, state, num_warmup: int, progress: Callable | None = None) -> WarmupResult:
    """Warm ``state`` up for ``num_warmup`` transitions."""
    windows = warmup_windows(num_warmup) if kernel.adapt_mass_matrix else []
    adapt = init_adapt_state(state, kernel.dense_mass)
    draws, stats = [], []

    def result(interrupted: bool) -> WarmupResult:
        names = stats[0].keys() if stats else ()
        joined = {k: torch.cat([s[k] for s in stats], dim=1) for k in names}
        C, D = state.z.shape
        z = torch.cat(draws, dim=1) if draws else state.z.new_zeros(C, 0, D)
        return WarmupResult(state, z, joined, interrupted)

    for segment in warmup_segments(num_warmup, windows):
        segment_result = kernel.run_segment(
            state,
            adapt,
            segment.length,
            adapt_step_size=kernel.adapt_step_size,
            collect_mass=segment.collect_mass,
            progress=progress,
        )
        state, adapt = segment_result.state, segment_result.adapt
        draws.append(segment_result.draws)
        stats.append(segment_result.stats)
        if segment_result.interrupted:
            return result(True)
        if segment.ends_window:
            inverse_mass = kernel.restrict_mass(welford_final(adapt.welford))
            state = state._replace(
                inverse_mass=inverse_mass, mass_sqrt=mass_sqrt_from_inverse(inverse_mass)
            )
            if kernel.adapt_step_size and kernel.find_heuristic_step_size:
                state = kernel.reset_step_size(state)  # Stan's; NumPyro's when asked
            adapt = init_adapt_state(state, kernel.dense_mass)
    if kernel.adapt_step_size and num_warmup > 0:
        state = state._replace(step_size=dual_averaging_final(adapt.dual_averaging))
    return result(False)
