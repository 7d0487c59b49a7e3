"""What probtorch changes in torch for the oldest torch it supports (2.11).

``Distribution.expand`` makes its new instance with ``self.__new__(type(self))``. Dynamo in
torch 2.11 cannot trace ``object.__new__`` reached through an instance, so any compiled
model whose distributions are expanded (every ``plate``) broke the graph there; it traces
the same call reached through the class. On torch 2.11-2.12 probtorch replaces torch's
``Distribution._get_checked_instance`` with one that calls ``type(self).__new__`` — the same
function, so the same instance — and leaves torch 2.13 and later untouched.

probtorch requires torch 2.13 (pyproject.toml); this lets its samplers run where an older
torch is installed and cannot be replaced (the GPU machine's image has torch 2.11:
bench/gpu_check.py). Under torch 2.11 the test suite had 4 failures left after this patch
(2026-12-04): compiled random draws differ from eager ones with the same seed in
``rsample`` of a compiled model, ``MixtureSameFamily.sample`` and a compiled SVI block
(NUTS draws its random numbers outside the compiled graph and is not affected), and the
lean executor's AOTInductor package did not build.

Inductor's first compile imports ``torch.utils.mkldnn``, whose classes use
``torch.jit.script_method``, deprecated in torch 2.13: every user's first compiled sampler
showed torch's ``DeprecationWarning`` about code that is not theirs (and a test run with
warnings as errors failed its first compile). probtorch imports that module on import, with
that one warning silenced.

Two more messages about torch's code, not the user's, are kept from users
(:func:`silence_torch_internal_messages`): Inductor's lowering of ``torch.diagonal`` (a
multivariate normal's log determinant reaches it) calls the deprecated
``torch._prims_common.check``, and every first compile of such a model showed torch's
``FutureWarning``; and AOTInductor logs "is missing a c-shim implementation, using proxy
executor as fallback" for each linear-algebra call (Cholesky, triangular solves) in a lean
package it builds, a fallback that runs correctly; and ``standalone_compile`` logs
"artifact generation failed, cannot save" where a graph's cache artifacts cannot be
serialized (an SVI step with a low-rank or Cholesky-factor guide, a Wishart model), which
matters only to a caller who saves the artifacts: probtorch uses them in the process. Any
other warning or log line is left alone.

Empty batches. torch sums a log density's event dimensions (``_sum_rightmost``: an
``Independent``'s ``log_prob``, a transformed distribution's Jacobian) and checks an
event-shaped constraint (``constraints.independent``) by reshaping to ``batch_shape +
(-1,)``, which torch refuses for a tensor of no elements ("cannot reshape tensor of 0
elements into shape [0, -1]"). A model with a plate of size 0 over an event-shaped site (a
Dirichlet, a vector ``Normal(...).to_event(1)``, an angle or simplex under an autoguide)
therefore failed, in Pyro as here. probtorch sums, and reduces the check, over those
dimensions directly when a tensor has no elements (:func:`patch_empty_event_reductions`);
tensors with elements take torch's own code, so nothing else changes.

Example::

    >>> import torch
    >>> from torch.distributions import Normal
    >>> Normal(0.0, 1.0).expand([3]).batch_shape
    torch.Size([3])
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch.distributions import Distribution

__all__ = [
    "needs_expand_patch",
    "patch_distribution_expand",
    "import_inductor_deps_quietly",
    "silence_torch_internal_messages",
    "patch_empty_event_reductions",
]


def needs_expand_patch(version: str = torch.__version__) -> bool:
    """Whether this torch's Dynamo needs :func:`patch_distribution_expand` (before 2.13).

    >>> needs_expand_patch("2.11.0+cu130"), needs_expand_patch("2.13.0+cpu")
    (True, False)
    """
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) < (2, 13)


_torch_get_checked_instance = Distribution._get_checked_instance


def _get_checked_instance(self, cls, _instance=None):
    """torch's, but a new instance is made through the class: traceable by torch 2.11's
    Dynamo. A given instance and the missing-``expand`` error are left to torch's."""
    if _instance is None and type(self).__init__ == cls.__init__:
        new_cls = type(self)
        return new_cls.__new__(new_cls)
    return _torch_get_checked_instance(self, cls, _instance)


def patch_distribution_expand() -> None:
    """Replace ``Distribution._get_checked_instance`` on torch before 2.13 (see above)."""
    if needs_expand_patch():
        Distribution._get_checked_instance = _get_checked_instance


def import_inductor_deps_quietly() -> None:
    """Import ``torch.utils.mkldnn`` with torch's own ``script_method`` deprecation silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"`torch\.jit\.script_method` is deprecated",
            category=DeprecationWarning,
        )
        import torch.utils.mkldnn  # noqa: F401


_PRIMS_CHECK_DEPRECATED = r"`torch\._prims_common\.check` is deprecated"


class _DropRecords(logging.Filter):
    """Drops the log records whose message contains ``fragment``."""

    def __init__(self, fragment: str):
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in str(record.msg)


# logger -> the message fragment dropped there (see the module doc)
_DROPPED_RECORDS = {
    "torch._inductor.ir": "is missing a c-shim implementation",
    "torch._inductor.standalone_compile": "standalone_compile artifact generation failed",
}


def silence_torch_internal_messages() -> None:
    """Keep torch's warning and log line about its own code from users (see the module doc):
    the warning only where Inductor's code raises it, the log line only on its logger.

    >>> silence_torch_internal_messages()
    >>> import logging
    >>> sum(isinstance(f, _DropRecords)
    ...     for f in logging.getLogger("torch._inductor.ir").filters)
    1
    """
    warnings.filterwarnings(
        "ignore",
        message=_PRIMS_CHECK_DEPRECATED,
        category=FutureWarning,
        module=r"torch\._inductor\.",
    )
    for name, fragment in _DROPPED_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) for f in logger.filters):
            logger.addFilter(_DropRecords(fragment))


_torch_sum_rightmost = torch.distributions.utils._sum_rightmost
_torch_independent_check = torch.distributions.constraints._IndependentConstraint.check


def _sum_rightmost(value: torch.Tensor, dim: int) -> torch.Tensor:
    """torch's ``_sum_rightmost``, but a tensor of no elements is summed over its ``dim``
    rightmost dimensions instead of reshaped (see the module doc)."""
    if dim == 0 or value.numel() != 0:
        return _torch_sum_rightmost(value, dim)
    return value.sum(tuple(range(-min(dim, value.dim()), 0)))  # all dims if dim > value.dim()


def _pyro_sum_rightmost_for_empty(pyro_sum_rightmost):
    """Pyro's ``sum_rightmost`` (negative and infinite ``dim`` too), with a tensor of no
    elements summed instead of reshaped."""

    def sum_rightmost(value, dim):
        if not isinstance(value, torch.Tensor) or value.numel() != 0:
            return pyro_sum_rightmost(value, dim)
        if dim < 0:
            dim += value.dim()
        if dim == 0:
            return value
        return value.sum(tuple(range(-min(dim, value.dim()), 0)))

    sum_rightmost.__doc__ = pyro_sum_rightmost.__doc__
    sum_rightmost.__wrapped__ = pyro_sum_rightmost
    return sum_rightmost


def _independent_check(self, value: torch.Tensor) -> torch.Tensor:
    """torch's ``_IndependentConstraint.check``, with a tensor of no elements reduced over
    its event dimensions instead of reshaped (see the module doc)."""
    n = self.reinterpreted_batch_ndims
    if value.numel() != 0 or n == 0 or value.dim() < self.event_dim:
        return _torch_independent_check(self, value)  # torch's error for too few dims too
    return self.base_constraint.check(value).all(dim=tuple(range(-n, 0)))


def patch_empty_event_reductions() -> None:
    """Let event-shaped densities and constraints take tensors of no elements (see the
    module doc), in every torch and Pyro module that imported the summing function.

    >>> import torch
    >>> from torch.distributions import Independent, Normal
    >>> Independent(Normal(torch.zeros(0, 3), 1.0), 1).log_prob(torch.zeros(0, 3)).shape
    torch.Size([0])
    """
    import sys

    import pyro.distributions  # noqa: F401  (imports the modules that use the functions)
    import pyro.distributions.util as pyro_util

    pyro_sum_rightmost = getattr(pyro_util.sum_rightmost, "__wrapped__", None)
    pyro_sum_rightmost = pyro_sum_rightmost or pyro_util.sum_rightmost
    patched = {
        ("_sum_rightmost", _torch_sum_rightmost): _sum_rightmost,
        ("sum_rightmost", pyro_sum_rightmost): _pyro_sum_rightmost_for_empty(pyro_sum_rightmost),
    }
    for name, module in list(sys.modules.items()):
        if not name.startswith(("torch.distributions", "pyro.")):
            continue
        for (attribute, original), replacement in patched.items():
            if getattr(module, attribute, None) is original:
                setattr(module, attribute, replacement)
    torch.distributions.constraints._IndependentConstraint.check = _independent_check


import_inductor_deps_quietly()
silence_torch_internal_messages()
patch_empty_event_reductions()
patch_distribution_expand()  # on import (probtorch/__init__.py imports this module)
