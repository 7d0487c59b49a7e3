"""Why torch.compile or ``make_fx`` could not capture a model, in one line that names
the refused operation, the line of library code where it happened and the user's own line
that reached it: for the warnings of the samplers and potentials that then run eagerly."""

from __future__ import annotations

import os
import re
import traceback

__all__ = ["eager_fallback_note", "raised_at", "uncompilable_reason", "untraceable_reason"]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_INSTALLED = re.compile(r"[/\\](?:site|dist)-packages[/\\]")
_TORCH = re.compile(r"[/\\](?:site|dist)-packages[/\\]torch[/\\]")


def uncompilable_reason(error: BaseException) -> str:
    r"""Dynamo's reason for refusing a function, and where: the innermost frame of the
    user code it reports, and the innermost one of the user's own (outside torch, Pyro and
    probtorch) when that is another.

    Example::

        >>> text = (
        ...     "Data-dependent branching\n  Explanation: ...\nfrom user code:\n"
        ...     '   File "/home/u/fit.py", line 5, in model\n'
        ...     '  File "/v/site-packages/pyro/distributions/d.py", line 12, in __init__\n'
        ... )
        >>> print(uncompilable_reason(RuntimeError(text)).replace(", ", ",\n"))
        Data-dependent branching,
        at .../pyro/distributions/d.py:12 (__init__),
        reached from /home/u/fit.py:5 (model)
    """
    text = str(error)
    lines = text.splitlines()
    reason = lines[0].strip() if lines else type(error).__name__
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', text.split("from user code:")[-1])
    return _located(reason, frames)


def untraceable_reason(error: BaseException) -> str:
    """Why ``make_fx`` could not trace a function, and where: the innermost frame of the
    traceback outside torch (and dispatch modes' hooks), and the innermost of the user's
    own when that is another."""
    text = str(error).strip()
    reason = text.splitlines()[0].strip() if text else "(no message)"
    if "_local_scalar_dense" in reason:  # make_fx's words for .item() or a tensor in an `if`
        reason = "a Python value read from a tensor (.item(), bool() or a branch on a tensor)"
    return f"{type(error).__name__}: {_located(reason, _outside_torch(error))}"


def raised_at(error: BaseException) -> tuple[str, bool]:
    """Where ``error`` was raised: the innermost frame of its traceback outside torch, and
    the innermost of the user's own when that is another ("" without such frames); and
    whether that innermost frame is the user's own code (not a library's or probtorch's).

    Example::

        >>> import torch
        >>> def model():
        ...     return bool(torch.ones(2) > 0)
        >>> try:
        ...     model()
        ... except RuntimeError as error:
        ...     where, users = raised_at(error)
        >>> where.endswith("(model)"), users
        (True, True)
    """
    frames = _outside_torch(error)
    users = bool(frames) and _is_users(frames[-1][0])
    return _where(frames), users


def _outside_torch(error: BaseException) -> list[tuple[str, str, str]]:
    """The frames (path, line, function) of ``error``'s traceback outside torch and
    dispatch modes' hooks."""
    return [
        (f.filename, str(f.lineno), f.name)
        for f in traceback.extract_tb(error.__traceback__)
        if not _TORCH.search(f.filename)
        and f.name not in ("__torch_function__", "__torch_dispatch__")
    ]


def _located(reason: str, frames: list[tuple[str, str, str]]) -> str:
    """``reason``, at the innermost of ``frames`` (path, line, function), reached from the
    innermost outside installed packages and probtorch."""
    return f"{reason}, {_where(frames)}" if frames else reason


def _where(frames: list[tuple[str, str, str]]) -> str:
    """ "at" the innermost of ``frames``, "reached from" the innermost of the user's own
    where that is another ("" without frames)."""
    if not frames:
        return ""

    def shown(frame):
        path, line, name = frame
        parts = _INSTALLED.split(path)
        if len(parts) > 1:
            path = ".../" + parts[-1]
        return f"{path}:{line} ({name})"

    inner = frames[-1]
    users = [f for f in frames if _is_users(f[0])]
    where = f"at {shown(inner)}"
    if users and users[-1] != inner:
        where += f", reached from {shown(users[-1])}"
    return where


def _is_users(path: str) -> bool:
    """Whether ``path`` is the user's code: outside installed packages and probtorch."""
    return not _INSTALLED.search(path) and not path.startswith(_PACKAGE_DIR + os.sep)


def eager_fallback_note(doing: str, error: BaseException, to: str = "") -> str:
    """The warning of a compiled function that runs eagerly from now on, ``doing`` what it
    does, because Dynamo refused the model with ``error``; ``to`` says where compile=False
    goes."""
    return (
        f"{doing}: torch.compile cannot capture the model ({uncompilable_reason(error)}). "
        f"Pass compile=False{to} to skip the attempt"
    )
