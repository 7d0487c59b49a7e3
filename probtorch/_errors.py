"""Errors re-raised with the site's name (or a hint) in their message.

Example::

    >>> error = with_message(ValueError("shape mismatch"), "site 'x': shape mismatch")
    >>> type(error).__name__, str(error)
    ('ValueError', "site 'x': shape mismatch")
"""

from __future__ import annotations

import contextlib
import numbers

__all__ = ["explaining_rng_key", "rng_key_hint", "with_message"]


def with_message(
    error: BaseException, message: str, fallback: type[Exception] = RuntimeError
) -> BaseException:
    """An exception of ``error``'s type carrying ``message`` (``fallback`` for a type that
    takes other arguments); raise it ``from error`` to keep the original."""
    try:
        return type(error)(message)
    except Exception:  # an exception type whose constructor takes other arguments
        return fallback(message)


def rng_key_hint(error: TypeError, args: tuple, call: str, seed_at: str) -> str | None:
    """What to say where calling the model with ``args`` (by ``call``, e.g.
    ``"MCMC.run(*args, **kwargs)"``) failed on its positional arguments and the first looks
    like NumPyro's rng key (an integer, a JAX key), else None; the seed goes to ``seed_at``.

    >>> error = TypeError("model() takes 1 positional argument but 2 were given")
    >>> rng_key_hint(error, (0, None), "MCMC.run(*args)", "MCMC(seed=)").split(":")[0]
    "the first argument, 0, looks like NumPyro's rng key"
    """
    if not args or "positional argument" not in str(error):
        return None
    first = args[0]
    jax_key = type(first).__module__.startswith(("jax", "jaxlib"))
    if not (jax_key or (isinstance(first, numbers.Integral) and not isinstance(first, bool))):
        return None
    shown = repr(first) if not jax_key else "a JAX key"
    return (
        f"the first argument, {shown}, looks like NumPyro's rng key: probtorch's {call} "
        f"takes the model's arguments only, and the seed goes to {seed_at}"
    )


@contextlib.contextmanager
def explaining_rng_key(args: tuple, call: str, seed_at: str):
    """Re-raise a TypeError of the block with :func:`rng_key_hint`'s hint, where it has one.

    >>> with explaining_rng_key((0, 1), "run(*args)", "seed="):
    ...     (lambda x: x)(0, 1)
    Traceback (most recent call last):
    TypeError: ... (the first argument, 0, looks like NumPyro's rng key: ...)
    """
    try:
        yield
    except TypeError as error:
        hint = rng_key_hint(error, args, call, seed_at)
        if hint is None:
            raise
        raise with_message(error, f"{error} ({hint})") from error
