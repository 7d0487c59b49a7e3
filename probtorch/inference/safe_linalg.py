"""Failed factorizations become NaN instead of exceptions while a potential is evaluated.

A proposal far in the tails can make a model's covariance matrix numerically indefinite.
``torch.linalg.cholesky`` then raises (also inside compiled code), which would end a run
that Stan or NumPyro continue: there the failed Cholesky gives NaN, the leapfrog step is a
divergence and the trajectory stops. :class:`nan_on_failure` gives probtorch the same
behaviour for the factorizations that raise on bad input (``cholesky``, ``inv``,
``solve``), by routing them through their ``*_ex`` variants and writing NaN into the
batch elements whose factorization failed. It is a ``TorchFunctionMode``: Dynamo traces
through it, so the compiled kernels contain only the ``*_ex`` calls.

Run eagerly, the mode costs a Python call per torch operation (about a fifth of a small
model's eager, vmapped gradient). :class:`FactorizationGuard` therefore runs eager code
that does not factorize without it.

Example::

    >>> import torch
    >>> bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    >>> with nan_on_failure():
    ...     torch.linalg.cholesky(bad).isnan().all().item()
    True
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.overrides import TorchFunctionMode

__all__ = ["FactorizationGuard", "nan_on_failure", "traced"]


def _nan_where(info: torch.Tensor, out: torch.Tensor, matrix_dims: int) -> torch.Tensor:
    failed = (info != 0).reshape(info.shape + (1,) * matrix_dims)
    return torch.where(failed, torch.full_like(out, float("nan")), out)


def _cholesky(input, *, upper=False, out=None):
    if out is not None:
        return torch.linalg.cholesky(input, upper=upper, out=out)
    factor, info = torch.linalg.cholesky_ex(input, upper=upper)
    return _nan_where(info, factor, 2)


def _inv(input, *, out=None):
    if out is not None:
        return torch.linalg.inv(input, out=out)
    inverse, info = torch.linalg.inv_ex(input)
    return _nan_where(info, inverse, 2)


def _solve(A, B, *, left=True, out=None):
    if out is not None:
        return torch.linalg.solve(A, B, left=left, out=out)
    result, info = torch.linalg.solve_ex(A, B, left=left)
    # B may be a vector (k,) or a batch of matrices; broadcast info over its trailing dims.
    return _nan_where(info, result, result.dim() - info.dim())


_REPLACEMENTS = {
    torch.linalg.cholesky: _cholesky,
    torch.linalg.inv: _inv,
    torch.linalg.solve: _solve,
}


class nan_on_failure(TorchFunctionMode):
    """Within this context, ``linalg.cholesky/inv/solve`` return NaN where they would raise."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        replacement = _REPLACEMENTS.get(func)
        if replacement is not None:
            return replacement(*args, **kwargs)
        return func(*args, **kwargs)


class _nan_on_failure_noting(nan_on_failure):
    """:class:`nan_on_failure` that notes whether a factorization was called (eager use
    only: compiled code enters the plain mode)."""

    factorized = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _REPLACEMENTS:
            self.factorized = True
        return super().__torch_function__(func, types, args, kwargs)


def traced() -> bool:
    """Whether ``torch.compile`` (Dynamo) or ``make_fx`` is capturing the running code."""
    return torch.compiler.is_compiling() or get_proxy_mode() is not None


class FactorizationGuard:
    """Calls ``run()`` under :class:`nan_on_failure` where it is traced (the graph must
    hold the ``*_ex`` calls) and, eagerly, for a function that factorizes: its first eager
    call runs under the mode and finds out. A function that did not factorize then runs
    without the mode; should a factorization raise after all (another branch), that call
    runs again under it, and every later one. ``run`` must start afresh on each call.

    Why not run every function unguarded until a factorization raises: under ``vmap`` one
    chain's failure raises for the whole batch, and a model that catches
    ``LinAlgError`` itself (adding jitter) would take its fallback for every chain.

    >>> guard = FactorizationGuard()
    >>> guard(lambda: torch.ones(2).sum().item()), guard.guarded
    (2.0, False)
    >>> bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    >>> guard(lambda: torch.linalg.cholesky(bad).isnan().all().item()), guard.guarded
    (True, True)
    """

    def __init__(self) -> None:
        self.guarded: bool | None = None  # unknown until the first eager call

    def __call__(self, run):
        if traced() or self.guarded:
            with nan_on_failure():
                return run()
        if self.guarded is None:
            mode = _nan_on_failure_noting()
            with mode:
                result = run()
            self.guarded = mode.factorized
            return result
        try:
            return run()
        except torch.linalg.LinAlgError:
            self.guarded = True
            with nan_on_failure():
                return run()
