"""``biject_to`` for probtorch: torch's registry with compile-friendly replacements.

Lookups fall through to ``torch.distributions.biject_to`` (which Pyro extends), except for
constraints whose torch transform does not compile under ``vmap``. Nothing of torch's is
changed: user code that calls torch's ``biject_to`` sees torch's transforms.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.distributions import biject_to as _torch_biject_to
from torch.distributions import constraints
from torch.distributions.constraint_registry import ConstraintRegistry
from torch.distributions.transforms import CorrCholeskyTransform

from .zero_sum import ZeroSumConstraint, ZeroSumTransform

__all__ = ["biject_to", "CompilableCorrCholeskyTransform"]


class CompilableCorrCholeskyTransform(CorrCholeskyTransform):
    """``CorrCholeskyTransform`` whose ``log_abs_det_jacobian`` compiles under vmap.

    torch's version gathers the lower triangle with a boolean mask, which has a
    data-dependent shape for the compiler; this one uses static integer indices.
    """

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        y1m_cumsum = 1 - (y * y).cumsum(dim=-1)
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, offset=-2, device=y.device)
        stick_breaking_logdet = 0.5 * y1m_cumsum[..., rows, cols].log().sum(-1)
        tanh_logdet = -2 * (x + F.softplus(-2 * x) - math.log(2.0)).sum(dim=-1)
        return stick_breaking_logdet + tanh_logdet


class _FallbackRegistry(ConstraintRegistry):
    def __call__(self, constraint):
        if type(constraint) in self._registry:
            return super().__call__(constraint)
        return _torch_biject_to(constraint)


biject_to = _FallbackRegistry()
biject_to.register(constraints.corr_cholesky)(lambda constraint: CompilableCorrCholeskyTransform())
biject_to.register(ZeroSumConstraint)(lambda constraint: ZeroSumTransform(constraint.event_dim))
# A mixture of one family has that family's support: a latent MixtureSameFamily site is
# unconstrained through its components' bijection.
biject_to.register(constraints.MixtureSameFamilyConstraint)(
    lambda constraint: biject_to(constraint.base_constraint)
)
