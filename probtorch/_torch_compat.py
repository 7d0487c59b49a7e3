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


import_inductor_deps_quietly()
silence_torch_internal_messages()
patch_distribution_expand()  # on import (probtorch/__init__.py imports this module)
