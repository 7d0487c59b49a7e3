"""Warnings located at the user's code.

``warnings.warn(..., stacklevel=N)`` with a counted ``N`` names a line of probtorch where
the call chain is longer than counted (a run started through another method, a helper
function added in between); Python prints that line under the message. probtorch's warnings
are about the user's call (an SVI run, an MCMC run), so they name the first frame outside
this package.

Example::

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_at_caller("about your call")
    >>> caught[0].filename.endswith("_caller.py")
    False
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn_at_caller"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_caller(message, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` located at the first frame outside probtorch."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
