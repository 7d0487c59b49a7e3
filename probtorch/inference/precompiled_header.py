"""Inductor's precompiled C++ header, built once it has paid for itself.

Every C++ kernel Inductor builds starts with its prelude (``torch/csrc/inductor/cpp_prefix.h``:
ATen's vector classes, 5.9 MB of preprocessed C++, about 1.8 s for g++ to parse). At the
first build with a given torch, compiler and set of flags Inductor precompiles that prelude
into a header (130-290 MB) and every later build loads it instead. On this project's 2-core
machines (one core, cold caches, single runs) the header took 4.8-6.7 s to build and saved
0.9-3.5 s per kernel build after it (the builds replayed alone, medians: 7.0-7.9 s and
1.8-2.2 s); a NUTS step is one or two builds (the six benchmark models' quick path), so on a
machine's first model the header cost more than it saved: eight schools spent 6.8 s in g++
with it against 2.7 s without, logistic regression 9.6 against 7.3 s, the SAAS GP 11.3
against 10.6 s.

:func:`defer_header_builds` lets a compile use the header when it is built and otherwise
go without it, until the kernels built without it on this machine would have paid for it
(:data:`RENT_LIMIT` of them: the rule of renting skis until the rent reaches the price,
never more than twice the best choice made knowing the future). Each such kernel is
counted in a file beside the header (every kernel a process asks a header for once it has
generated code: Inductor asks before it looks for the kernel on disk, so a kernel found
there may count too; a process that only loads cached graphs counts none). Processes
that build in the background (the sampler graph and lean package builds, ``prebuild``)
build the header at once, off the sampler's path, so with ``executor="auto"`` a machine's
second model finds it. The kernels are the
same either way: Inductor hashes a build's command before it adds the header, so a
kernel built without the header is found in the cache by a process that has it.

``PROBTORCH_DEFER_HEADER=0`` builds it at the first compile, as Inductor does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RENT_LIMIT", "building_headers", "defer_header_builds", "deferring"]

# Kernels built without the header on a machine (per header) before a compile builds it:
# 4.8-6.7 s to build against 0.9-3.5 s more per kernel without it (module docstring).
RENT_LIMIT = 3

_FALSE = {"0", "false", "no", "off"}
_installed = [False]
_locating = threading.Lock()


def deferring() -> bool:
    """Whether compiles in this process go without a header that is not built yet
    (``PROBTORCH_DEFER_HEADER``, default on).

    Example::

        >>> isinstance(deferring(), bool)
        True
    """
    return os.environ.get("PROBTORCH_DEFER_HEADER", "1").strip().lower() not in _FALSE


@contextlib.contextmanager
def building_headers():
    """Build a missing header at once inside this block (and in processes started in it):
    for builds off the sampler's path, such as ``prebuild``.

    Example::

        >>> with building_headers():
        ...     deferring()
        False
    """
    previous = os.environ.get("PROBTORCH_DEFER_HEADER")
    os.environ["PROBTORCH_DEFER_HEADER"] = "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PROBTORCH_DEFER_HEADER"]
        else:
            os.environ["PROBTORCH_DEFER_HEADER"] = previous


@dataclass(frozen=True)
class _Header:
    path: str  # what g++ is told to -include
    target: str  # the precompiled header g++ loads instead (path + ".gch")
    lock: str  # the file lock Inductor holds while it builds the header

    @property
    def rent_file(self) -> str:
        return self.path + ".rent"

    def built(self) -> bool:
        """The header is there and nobody is writing it."""
        if not os.path.exists(self.target):
            return False
        from filelock import FileLock, Timeout

        try:
            with FileLock(self.lock, timeout=0):
                return os.path.exists(self.target)
        except Timeout:  # another process is building it: a half-written file
            return False

    def rent_paid(self) -> int:
        try:
            return os.path.getsize(self.rent_file)
        except OSError:
            return 0

    def pay_rent(self) -> None:
        try:
            with open(self.rent_file, "ab") as f:  # one byte per kernel: appends are atomic
                f.write(b".")
        except OSError:  # a read-only cache: the header is never built in the foreground
            pass


def _generated_code() -> bool:
    """Inductor generated code in this process (a graph not found in its cache): the kernels
    it asks a header for are being built. Inductor asks before it looks for a kernel on disk,
    so a process that only loads cached graphs would otherwise pay rent for nothing."""
    from torch._dynamo.utils import counters

    made = counters["inductor"]
    return made["fxgraph_cache_miss"] + made["fxgraph_cache_bypass"] > 0


def header_on_demand(codecache, build: Callable[..., str]) -> Callable[..., str | None]:
    """Inductor's ``_precompile_header`` (``build``) made to return ``None`` (compile
    without a header) while the header is not built and this machine has built fewer than
    :data:`RENT_LIMIT` kernels without it. Where the header goes is asked of Inductor's own
    code (``build.__wrapped__``) with its build step recorded instead of run."""
    locate_uncached = build.__wrapped__

    @functools.cache
    def locate(header_dir: str, header: str, command_line: str, **command) -> _Header | None:
        # Inductor's build step is swapped for a recorder for the call (about 0.2 s, once
        # per header and process). Inductor binds that step when it asks for a header, on
        # the thread that compiles, so only a second thread compiling at this moment in the
        # same process could pick up the recorder.
        seen = []
        with _locating:
            run_build = codecache._worker_compile_cpp
            codecache._worker_compile_cpp = lambda lock, builders: seen.append(
                (lock, [b.get_target_file_path() for b in builders])
            )
            try:
                path = locate_uncached(header, command_line, **command)
            finally:
                codecache._worker_compile_cpp = run_build
        if len(seen) != 1 or len(seen[0][1]) != 1:  # not the Inductor this was written for
            return None
        lock, (target,) = seen[0]
        return _Header(path=path, target=target, lock=lock)

    @functools.wraps(build)
    def precompile_header(header: str, command_line: str, **command) -> str | None:
        if not deferring():
            return build(header, command_line, **command)
        found = locate(codecache._HEADER_DIR, header, command_line, **command)
        if found is None:
            return build(header, command_line, **command)
        if found.built():
            return found.path
        if found.rent_paid() >= RENT_LIMIT:
            return build(header, command_line, **command)
        if _generated_code():
            found.pay_rent()
        return None

    precompile_header.locate = locate
    return precompile_header


def defer_header_builds() -> None:
    """Compile without Inductor's precompiled C++ header until it pays for itself (module
    docstring). Once per process; a no-op where Inductor's internals differ from what this
    expects (torch other than 2.13).

    Example::

        >>> defer_header_builds()  # idempotent
    """
    if _installed[0]:
        return
    _installed[0] = True
    try:
        from torch._inductor import codecache

        build = codecache._precompile_header
        build.__wrapped__  # noqa: B018 - functools.cache's undecorated function
        codecache._worker_compile_cpp  # noqa: B018
        codecache._HEADER_DIR  # noqa: B018
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return
    codecache._precompile_header = header_on_demand(codecache, build)
