"""Errors re-raised with the site's name in their message.

Example::

    >>> error = with_message(ValueError("shape mismatch"), "site 'x': shape mismatch")
    >>> type(error).__name__, str(error)
    ('ValueError', "site 'x': shape mismatch")
"""

from __future__ import annotations

__all__ = ["with_message"]


def with_message(
    error: BaseException, message: str, fallback: type[Exception] = RuntimeError
) -> BaseException:
    """An exception of ``error``'s type carrying ``message`` (``fallback`` for a type that
    takes other arguments); raise it ``from error`` to keep the original."""
    try:
        return type(error)(message)
    except Exception:  # an exception type whose constructor takes other arguments
        return fallback(message)
