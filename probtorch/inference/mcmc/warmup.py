"""Stan's warmup: step size by dual averaging throughout, mass matrix in slow windows."""

from __future__ import annotations

import torch

from .adaptation import (
    dual_averaging_final,
    dual_averaging_init,
    dual_averaging_update,
    mass_sqrt_from_inverse,
    warmup_windows,
    welford_final,
    welford_init,
    welford_update,
)

__all__ = ["WarmupAdapter"]


class WarmupAdapter:
    """Adapts a kernel's :class:`SamplerState` after each warmup transition.

    At the end of each slow window the mass matrix is set from the window's draws
    (regularized as in Stan), the step-size heuristic is re-run and dual averaging restarts;
    at the end of warmup the step size becomes dual averaging's running average.
    """

    def __init__(self, kernel, num_warmup: int):
        self.kernel = kernel
        self.num_warmup = num_warmup
        self.windows = warmup_windows(num_warmup) if kernel.adapt_mass_matrix else []
        self._window_ends = {end - 1 for _, end in self.windows}
        self._dual_averaging = None
        self._welford = None

    def init(self, state) -> None:
        if self.kernel.adapt_step_size:
            self._dual_averaging = dual_averaging_init(state.step_size)

    def _in_window(self, t: int) -> bool:
        return any(start <= t < end for start, end in self.windows)

    def update(self, t: int, state, result):
        """The state for transition ``t + 1`` after warmup transition ``t``."""
        kernel = self.kernel
        if kernel.adapt_step_size:
            self._dual_averaging = dual_averaging_update(
                self._dual_averaging, result.accept_prob, kernel.target_accept_prob
            )
            state = state._replace(step_size=torch.exp(self._dual_averaging.log_step_size))
        if self._in_window(t):
            if self._welford is None:
                C, D = state.z.shape
                self._welford = welford_init(C, D, kernel.dense_mass, state.z.dtype, state.z.device)
            self._welford = welford_update(self._welford, state.z)
            if t in self._window_ends:
                inverse_mass = welford_final(self._welford)
                self._welford = None
                state = state._replace(
                    inverse_mass=inverse_mass, mass_sqrt=mass_sqrt_from_inverse(inverse_mass)
                )
                if kernel.adapt_step_size:
                    state = kernel.reset_step_size(state)
                    self._dual_averaging = dual_averaging_init(state.step_size)
        if t == self.num_warmup - 1 and kernel.adapt_step_size:
            state = state._replace(step_size=dual_averaging_final(self._dual_averaging))
        return state
