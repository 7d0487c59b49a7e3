"""``biject_to`` for probtorch: torch's registry with compile-friendly replacements.

Lookups fall through to ``torch.distributions.biject_to`` (which Pyro extends), except for
constraints whose torch transform does not compile under ``vmap``. torch's constraints map
as before for user code that calls torch's ``biject_to``; torch's ``biject_to`` and
``transform_to`` learn probtorch's own constraint types (``less_than_eq``, ``zero_sum``), as
Pyro's are added to them, so that code written for torch or Pyro finds them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributions import biject_to as _torch_biject_to
from torch.distributions import constraints
from torch.distributions import transform_to as _torch_transform_to
from torch.distributions.constraint_registry import ConstraintRegistry
from torch.distributions.transforms import (
    CorrCholeskyTransform,
    IndependentTransform,
    Transform,
)

from .zero_sum import ZeroSumConstraint, ZeroSumTransform

__all__ = [
    "biject_to",
    "LessThanEq",
    "less_than_eq",
    "CompilableCorrCholeskyTransform",
    "LowerCholeskyVectorTransform",
    "PositiveDefiniteVectorTransform",
]


def _strict_lower_size(m: int) -> int:
    """``n`` with ``n * (n - 1) / 2 == m``."""
    n = round((1 + math.sqrt(1 + 8 * m)) / 2)
    if n * (n - 1) // 2 != m:
        raise ValueError(
            f"a vector of size {m} is not the strict lower triangle of a square matrix"
        )
    return n


class CompilableCorrCholeskyTransform(CorrCholeskyTransform):
    """``CorrCholeskyTransform`` that compiles under ``vmap`` and ``torch.func.grad``.

    torch's version reads and writes the lower triangle through a boolean mask, which has a
    data-dependent shape for the compiler; this one uses static integer indices (a gather
    to build the matrix, so no in-place writes under autograd).
    """

    def _call(self, x):
        x = torch.tanh(x)
        eps = torch.finfo(x.dtype).eps
        x = x.clamp(min=-1 + eps, max=1 - eps)
        n = _strict_lower_size(x.shape[-1])
        # position (i, j) of the matrix reads element index[i, j] of [0, x]: 0 off the
        # strict lower triangle, 1 + k for its k-th element in row-major order
        rows, cols = torch.tril_indices(n, n, offset=-1, device=x.device)
        index = torch.zeros(n, n, dtype=torch.long, device=x.device)
        index[rows, cols] = torch.arange(1, rows.numel() + 1, device=x.device)
        padded = torch.cat([x.new_zeros(x.shape[:-1] + (1,)), x], dim=-1)
        r = padded[..., index.flatten()].reshape(x.shape[:-1] + (n, n))
        z1m_cumprod_sqrt = (1 - r * r).sqrt().cumprod(-1)
        r = r + torch.eye(n, dtype=r.dtype, device=r.device)
        return r * F.pad(z1m_cumprod_sqrt[..., :-1], [1, 0], value=1)

    def _inverse(self, y):
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, offset=-1, device=y.device)
        y_cumsum = 1 - torch.cumsum(y * y, dim=-1)
        y_cumsum_shifted = F.pad(y_cumsum[..., :-1], [1, 0], value=1)
        t = y[..., rows, cols] / y_cumsum_shifted[..., rows, cols].sqrt()
        return (t.log1p() - t.neg().log1p()) / 2

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        y1m_cumsum = 1 - (y * y).cumsum(dim=-1)
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, offset=-2, device=y.device)
        stick_breaking_logdet = 0.5 * y1m_cumsum[..., rows, cols].log().sum(-1)
        tanh_logdet = -2 * (x + F.softplus(-2 * x) - math.log(2.0)).sum(dim=-1)
        return stick_breaking_logdet + tanh_logdet


def _lower_size(m: int) -> int:
    """``n`` with ``n * (n + 1) / 2 == m``."""
    n = round((math.sqrt(1 + 8 * m) - 1) / 2)
    if n * (n + 1) // 2 != m:
        raise ValueError(f"a vector of size {m} is not the lower triangle of a square matrix")
    return n


class _LowerTriangleVectorTransform(Transform):
    """Bijections from a real vector of size ``n (n + 1) / 2`` to ``n x n`` matrices."""

    domain = constraints.real_vector
    bijective = True

    def __eq__(self, other):
        return type(other) is type(self)

    def forward_shape(self, shape):
        n = _lower_size(shape[-1])
        return torch.Size(shape[:-1]) + (n, n)

    def inverse_shape(self, shape):
        n = shape[-1]
        return torch.Size(shape[:-2]) + (n * (n + 1) // 2,)


class LowerCholeskyVectorTransform(_LowerTriangleVectorTransform):
    """Bijection from a real vector of size ``n (n + 1) / 2`` to an ``n x n`` lower-triangular
    matrix with a positive diagonal (a Cholesky factor): the vector fills the lower triangle
    row by row and the diagonal is exponentiated (NumPyro's ``LowerCholeskyTransform``).

    torch's ``LowerCholeskyTransform`` maps matrices to matrices and ignores the upper
    triangle, so it is not a bijection and ``biject_to(lower_cholesky)`` is not registered
    there.

    Example::

        >>> t = LowerCholeskyVectorTransform()
        >>> L = t(torch.zeros(3))
        >>> L
        tensor([[1., 0.],
                [0., 1.]])
        >>> t.inv(L)
        tensor([0., 0., 0.])
    """

    codomain = constraints.lower_cholesky

    def _call(self, x):
        n = _lower_size(x.shape[-1])
        rows, cols = torch.tril_indices(n, n, device=x.device)
        # element (i, j) reads index[i, j] of [0, x]: 0 above the diagonal
        index = torch.zeros(n, n, dtype=torch.long, device=x.device)
        index[rows, cols] = torch.arange(1, rows.numel() + 1, device=x.device)
        on_diagonal = rows == cols
        x = torch.where(on_diagonal, x.exp(), x)
        padded = torch.cat([x.new_zeros(x.shape[:-1] + (1,)), x], dim=-1)
        return padded[..., index.flatten()].reshape(x.shape[:-1] + (n, n))

    def _inverse(self, y):
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, device=y.device)
        x = y[..., rows, cols]
        return torch.where(rows == cols, x.log(), x)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        return y.diagonal(dim1=-2, dim2=-1).log().sum(-1)


class PositiveDefiniteVectorTransform(_LowerTriangleVectorTransform):
    """Bijection from a real vector of size ``n (n + 1) / 2`` to an ``n x n`` positive-definite
    matrix ``L L^T``, ``L`` from :class:`LowerCholeskyVectorTransform` (NumPyro's
    ``biject_to(positive_definite)``).

    Its log-Jacobian is with respect to the lower triangle of the matrix (its free
    coordinates): ``n log 2 + sum_i (n - i + 1) log L_ii`` (1-based ``i``) plus the Cholesky
    map's own ``sum_i log L_ii``.

    Example::

        >>> t = PositiveDefiniteVectorTransform()
        >>> t(torch.tensor([0.0, 1.0, 0.0]))
        tensor([[1., 1.],
                [1., 2.]])
    """

    codomain = constraints.positive_definite

    def _call(self, x):
        L = LowerCholeskyVectorTransform()(x)
        return L @ L.mT

    def _inverse(self, y):
        return LowerCholeskyVectorTransform().inv(torch.linalg.cholesky(y))

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        n = _lower_size(x.shape[-1])
        # log L_ii is x at the diagonal's place in the row-major lower triangle
        i = torch.arange(n, device=x.device)
        log_diag = x[..., i * (i + 3) // 2]
        # d(L L^T)/dL over lower triangles: 2^n prod_i L_ii^(n - i + 1); then dL/dx: prod L_ii
        order = torch.arange(n, 0, -1, dtype=x.dtype, device=x.device) + 1
        return n * math.log(2.0) + (order * log_diag).sum(-1)


class LessThanEq(constraints.less_than):
    """The closed half line ``(-inf, upper_bound]``: the mirror of torch's
    ``greater_than_eq`` (torch has no ``less_than_eq``). A subclass of ``less_than`` so that
    code asking for an upper half line finds ``upper_bound``; ``biject_to`` maps it like
    ``less_than`` (``upper_bound - exp(x)``).

    Example::

        >>> c = less_than_eq(1.0)
        >>> c.check(torch.tensor([1.0, 1.5]))
        tensor([ True, False])
        >>> float(biject_to(c)(torch.tensor(0.0)))
        0.0
    """

    def check(self, value):
        return value <= self.upper_bound

    def __repr__(self) -> str:  # (torch's drops the first letter, expecting _LessThan)
        return f"LessThanEq(upper_bound={self.upper_bound})"


less_than_eq = LessThanEq


class _FallbackRegistry(ConstraintRegistry):
    def __call__(self, constraint):
        if type(constraint) in self._registry:
            return super().__call__(constraint)
        if isinstance(constraint, constraints.independent):
            # as torch's rule, but with this registry's transform for the base constraint
            # (zero_sum, lower_cholesky... inside ``.to_event``)
            return IndependentTransform(
                self(constraint.base_constraint), constraint.reinterpreted_batch_ndims
            )
        return _torch_biject_to(constraint)


biject_to = _FallbackRegistry()
biject_to.register(constraints.corr_cholesky)(lambda constraint: CompilableCorrCholeskyTransform())
biject_to.register(constraints.lower_cholesky)(lambda constraint: LowerCholeskyVectorTransform())
biject_to.register(constraints.positive_definite)(
    lambda constraint: PositiveDefiniteVectorTransform()
)
biject_to.register(ZeroSumConstraint)(lambda constraint: ZeroSumTransform(constraint.event_dim))
# probtorch's own constraint types in torch's registries (the closed half line maps as the
# open one: its end has measure zero)
_torch_biject_to.register(LessThanEq)(
    lambda constraint: _torch_biject_to(constraints.less_than(constraint.upper_bound))
)
_torch_transform_to.register(LessThanEq)(
    lambda constraint: _torch_transform_to(constraints.less_than(constraint.upper_bound))
)
for _registry in (_torch_biject_to, _torch_transform_to):
    _registry.register(ZeroSumConstraint)(lambda constraint: ZeroSumTransform(constraint.event_dim))
# A mixture of one family has that family's support: a latent MixtureSameFamily site is
# unconstrained through its components' bijection.
biject_to.register(constraints.MixtureSameFamilyConstraint)(
    lambda constraint: biject_to(constraint.base_constraint)
)
