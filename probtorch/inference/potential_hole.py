"""``probtorch::potential_hole``: the model's value and gradient as one opaque operator, so
that a sampler's graph can be compiled once for every model.

A NUTS step is the model's gradient inside a model-independent state machine (the tree,
its sampling and U-turn checks, step-size adaptation), and the machine is over half of
every compile: logistic regression's step (671 ATen nodes) compiled in 20.1 s, the same
step with the machine replaced by one gradient in 9.2 s. With the gradient as this
operator, the machine is a graph of its own that depends only on the sampler's settings;
traced with symbolic sizes it is compiled once and kept on disk for any number of chains
and dimensions (:class:`~.mcmc.executor.SplitLoop`, :mod:`.mcmc.sampler_cache`), and only
the gradient is compiled per model.

The operator computes ``(potential_energy, grad)`` of ``z`` (chains x dimensions) with the
function of the innermost :func:`filling` context. Its ``out=`` overload writes them into
given buffers; a recorded call (:class:`~.generated_call.CallTape`) replays it as one C
call: the gradient's own replayed program (:mod:`.call_program`), bound to the
machine's buffers, run by the program loop's runner (:func:`direct_fill`).

Example::

    >>> with filling(lambda z: (0.5 * (z * z).sum(-1), z.clone())):
    ...     value, grad = torch.ops.probtorch.potential_hole(torch.ones(2, 3))
    >>> value.tolist(), grad.shape
    ([1.5, 1.5], torch.Size([2, 3]))
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

__all__ = ["direct_fill", "filling", "hole_value_and_grad"]

_LIBRARY = torch.library.Library("probtorch", "FRAGMENT")
_LIBRARY.define("potential_hole(Tensor z) -> (Tensor, Tensor)")
_LIBRARY.define(
    "potential_hole.out(Tensor z, *, Tensor(a!) value, Tensor(b!) grad) -> (Tensor(a!), Tensor(b!))"
)


class _Filling(threading.local):
    def __init__(self):
        # (value_and_grad, direct, the dispatch keys included and excluded at filling())
        self.stack: list[tuple] = []


_filling = _Filling()


@contextlib.contextmanager
def filling(value_and_grad: Callable, direct: Callable | None = None) -> Iterator[None]:
    """Within the context, the operator computes ``value_and_grad(z)``.

    ``direct(z, value, grad)``, for the operator's replayed calls (:func:`direct_fill`):
    returns a function of no arguments that writes the same bits into the buffers ``value``
    and ``grad`` for the buffer ``z``, with ``.func`` and ``.args`` a C function's Python
    binding and its arguments (as ``functools.partial`` has them), or None.
    """
    keys = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())
    _filling.stack.append((value_and_grad, direct, keys))
    try:
        yield
    finally:
        _filling.stack.pop()


def _current() -> tuple:
    if not _filling.stack:
        raise RuntimeError(
            "probtorch::potential_hole was called outside potential_hole.filling(): no "
            "model gradient to compute"
        )
    return _filling.stack[-1]


def _filled(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The filling's value and gradient of ``z``, under the dispatch keys of its
    :func:`filling` call: on a compiled function's first call AOTAutograd checks custom
    operators for aliasing in a Python dispatch mode, which redispatches with the keys
    above it excluded (functorch's among them), and an eager ``torch.func`` gradient run
    there fails (``Cannot access storage of TensorWrapper``)."""
    value_and_grad, _, (include, exclude) = _current()
    with torch._C._ForceDispatchKeyGuard(include, exclude):
        return value_and_grad(z)


def hole_value_and_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The operator as a ``value_and_grad`` function for a sampler's iteration."""
    return torch.ops.probtorch.potential_hole(z)


@torch.library.impl(_LIBRARY, "potential_hole", "CompositeExplicitAutograd")
def _hole(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    value, grad = _filled(z)
    return value.clone(), grad.clone()


@torch.library.impl(_LIBRARY, "potential_hole.out", "CompositeExplicitAutograd")
def _hole_out(
    z: torch.Tensor, *, value: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    v, g = _filled(z)
    value.copy_(v)
    grad.copy_(g)
    return value, grad


@torch.library.register_fake("probtorch::potential_hole")
def _hole_fake(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    torch._check(z.dim() == 2, lambda: f"potential_hole takes (chains, dims), got {z.dim()}-d")
    return z.new_empty(z.shape[:1]), torch.empty_like(z, memory_format=torch.contiguous_format)


def direct_fill(z: torch.Tensor, value: torch.Tensor, grad: torch.Tensor) -> Callable | None:
    """The current :func:`filling`'s direct call for these buffers, or None."""
    direct = _current()[1]
    return direct(z, value, grad) if direct is not None else None
