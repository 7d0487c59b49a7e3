"""Executors: how a per-leapfrog state machine is run until every chain has finished.

The quick path, :class:`ChunkedLoop`, compiles a chunk of ``chunk_size`` unrolled
iterations into one graph (``torch.compile``, ``fullgraph=True``) and loops over it in
Python, checking the all-done flag once per chunk. With ``compile=False`` the same chunk
runs eagerly, with the same results.
"""

from __future__ import annotations

from collections.abc import Callable

from ...validation import torch_validation
from ..compile import compile_fn, skip_guards

__all__ = ["ChunkedLoop"]

# The generated host code checks every input's sizes, strides and alignment on each call
# (about sixty checks for a NUTS block state); the loop only feeds a chunk its own outputs,
# whose layout the first calls fixed, so the checks are left out: 126 -> 100 us per call on
# eight schools (4 chains, one core). ``cpp_wrapper`` would save 5 us more for 2 s of compile.
_UNCHECKED = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}


class ChunkedLoop:
    """Run ``iteration(state, *args)`` in chunks until ``state.done`` holds for every chain.

    Args:
        iteration: one state-machine step; returns the new state (a NamedTuple with a
            boolean ``done`` field, batched over chains).
        chunk_size: iterations unrolled per compiled call. Larger chunks cost fewer calls
            and more compile time; iterations of finished chains are wasted.
        compiled: compile the chunk.
        done: the state's all-finished flag, batched over chains.
        options: more Inductor options for the chunk (see :func:`~.kernels.codegen_options`).
    """

    def __init__(
        self,
        iteration: Callable,
        chunk_size: int = 4,
        compiled: bool = True,
        done: Callable = lambda state: state.done,
        options: dict | None = None,
    ):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self.compiled = compiled
        self.done = done

        def chunk(state, *args):
            for _ in range(chunk_size):
                state = iteration(state, *args)
            return state

        self._chunk = compile_fn(chunk, compiled, options={**_UNCHECKED, **(options or {})})
        self.calls = 0
        self.interrupted = False

    def __call__(self, state, *args):
        """The final state; on KeyboardInterrupt, the state after the last whole chunk."""
        self.interrupted = False
        with torch_validation(False):
            try:
                # The first two calls check Dynamo's guards (compiling if needed): the
                # second one gets the first one's outputs, which is what every later call
                # gets (same shapes, strides, dtypes and devices), so later calls skip the
                # guards (about 20% of the time per draw on eight schools).
                for _ in range(2):
                    if bool(self.done(state).all()):
                        return state
                    state = self._chunk(state, *args)
                    self.calls += 1
                with skip_guards(self.compiled):
                    while not bool(self.done(state).all()):
                        state = self._chunk(state, *args)
                        self.calls += 1
            except KeyboardInterrupt:
                self.interrupted = True
        return state
