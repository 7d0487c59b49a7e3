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
model's eager, vmapped gradient). :class:`GuardAfterFailure` therefore runs eager code
without it until a factorization raises, then runs that evaluation again under the mode,
and every later one: the same values, since a factorization that succeeds gives the same
result either way.

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

__all__ = ["GuardAfterFailure", "nan_on_failure", "traced"]


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


def traced() -> bool:
    """Whether ``torch.compile`` (Dynamo) or ``make_fx`` is capturing the running code."""
    return torch.compiler.is_compiling() or get_proxy_mode() is not None


class GuardAfterFailure:
    """Calls ``run()`` under :class:`nan_on_failure` where it is being traced (the graph
    must hold the ``*_ex`` calls) or once a factorization has raised in an eager call;
    otherwise eagerly without it, running it again under the mode where a factorization
    raises. ``run`` must start afresh on each call (no state left from a failed one).

    >>> guard = GuardAfterFailure()
    >>> guard(lambda: torch.linalg.cholesky(torch.eye(2)).sum().item()), guard.failed
    (2.0, False)
    >>> bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])
    >>> guard(lambda: torch.linalg.cholesky(bad).isnan().all().item()), guard.failed
    (True, True)
    """

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, run):
        if traced() or self.failed:
            with nan_on_failure():
                return run()
        try:
            return run()
        except torch.linalg.LinAlgError:
            self.failed = True
            with nan_on_failure():
                return run()
