"""The compile switch and compile diagnostics shared by the inference engines.

``compile=None`` anywhere in probtorch means "compile unless the environment variable
``PROBTORCH_COMPILE`` is ``0``"; ``compile=False`` runs the same functions eagerly, with the
same results.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import types
from collections.abc import Callable

import torch

__all__ = [
    "compile_enabled",
    "compile_fn",
    "inductor_base_options",
    "skip_guards",
    "CompileStats",
    "count_compiles",
    "note_direct_compile",
]

_FALSE = {"0", "false", "no", "off"}


def compile_enabled(compile: bool | None = None) -> bool:
    """Resolve a ``compile`` argument: an explicit bool wins, else ``PROBTORCH_COMPILE``.

    Example::

        >>> compile_enabled(False)
        False
    """
    if compile is not None:
        return bool(compile)
    return os.environ.get("PROBTORCH_COMPILE", "1").strip().lower() not in _FALSE


def _fresh_function(fn: Callable) -> Callable:
    """A copy of ``fn`` with its own code object.

    Dynamo keeps its cache and its recompile limit per code object. Functions made by one
    factory share a code object, so the 9th potential built in one process would silently
    fall back to eager. A fresh code object gives every compiled function its own cache.
    """
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


@contextlib.contextmanager
def inference_threads():
    """torch's intra-op threads while inference runs: ``PROBTORCH_NUM_THREADS`` (default 1).

    Samplers and SVI steps work on small tensors, where extra threads only add
    synchronization: with torch's default of one thread per core, a 4-d regression took
    7x longer (and its continued draws 19x) when other processes shared the cores, and no
    model measured here ran faster with more threads. ``PROBTORCH_NUM_THREADS=0`` keeps
    torch's setting (for large matrix products on idle cores).
    """
    wanted = int(os.environ.get("PROBTORCH_NUM_THREADS", "1"))
    previous = torch.get_num_threads()
    if wanted <= 0 or wanted == previous:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


_dynamo_patched = False


def _keep_torch_validation_default() -> None:
    """Apply Dynamo's one-time patches now, keeping torch's distribution validation default.

    The first ``torch.compile`` call in a process patches torch, and one of the patches
    turns ``torch.distributions`` validation off for the whole process, so a user's
    ``Normal(0, -1)`` after an MCMC run would pass silently. probtorch's compiled kernels
    switch validation off themselves while they run (``torch_validation(False)``).
    """
    global _dynamo_patched
    if _dynamo_patched:
        return
    _dynamo_patched = True
    prior = torch.distributions.Distribution._validate_args
    patcher = getattr(torch._dynamo.eval_frame, "TorchPatcher", None)
    if patcher is not None:
        patcher.patch()
    torch.distributions.Distribution.set_default_validate_args(prior)


def inductor_base_options() -> dict:
    """Inductor options every probtorch compilation uses (the C++ kernels, SVI steps and
    AOTInductor packages).

    Graph rewrites (:class:`~probtorch.inference.graph_passes.ProbtorchPasses`): a
    triangular matrix shared by the chains is solved once, not copied per chain
    (``BatchedTriangularSolve``), and a CPU matrix product with few columns (a data matrix
    times one vector per chain) is computed transposed, the order MKL runs 2-5x faster
    (``NarrowMatmul``), a batched row-times-matrix product (a dense metric's velocity) goes to
    BLAS instead of Inductor's loop (``RowTimesMatrixAsLibraryCall``), and a costly
    elementwise value broadcast to many times its size
    (inputs scaled by lengthscales, compared pairwise) is stored once instead of recomputed
    for every element it is broadcast to (``RealizeBroadcastOperands``). The C++ kernels
    reduce float64 vectors to a scalar with shuffles, as ATen does float32 ones, instead of
    through the stack (:mod:`~probtorch.inference.kernel_source`).

    On Linux x86-64 Inductor's vector ISA is taken from the CPU flags (``cpp.vec_isa_ok``)
    instead of being probed: Inductor otherwise compiles a test kernel for each ISA the CPU
    reports (AVX-512 VNNI, AVX-512, AVX2) and loads each in a child Python process, about
    3.6 s of a first compile with cold caches and 0.6-1.8 s in every later process on this
    2-core machine, for an answer the CPU flags already give on this platform (Linux clears
    a flag the OS cannot run; Inductor's C++20 needs a compiler that has these ISAs). The
    kernels are the same: with the flags or the probes Inductor picks the same ISA.
    Inductor's AVX-512 ISAs also compile and load two feature probes of their own
    (AVX-512 BF16 and VNNI intrinsics; the BF16 one twice, once per ISA) even then: 3.3 s
    of a first compile on a new machine, 0.3 s in every process. Those are answered from
    the CPU flags too (:func:`_trust_cpu_flags_for_isa_probes`); other probes (AMX) still
    run. ``PROBTORCH_PROBE_VEC_ISA=1`` restores all probes. Where
    ``TORCHINDUCTOR_CACHE_DIR`` is set, Inductor's precompiled C++ header is kept in it
    (:func:`keep_headers_with_cache`), and a compile builds that header only once it pays
    for itself (:mod:`~probtorch.inference.precompiled_header`).

    Example::

        >>> "post_grad_custom_pre_pass" in inductor_base_options()
        True
    """
    from .graph_passes import ProbtorchPasses
    from .kernel_source import patch_inductor_kernels
    from .precompiled_header import defer_header_builds

    patch_inductor_kernels()
    keep_headers_with_cache()
    defer_header_builds()
    options = {"post_grad_custom_pre_pass": ProbtorchPasses()}
    probe = os.environ.get("PROBTORCH_PROBE_VEC_ISA", "0").strip().lower() not in _FALSE
    if not probe and sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64"):
        options["cpp.vec_isa_ok"] = True
        _trust_cpu_flags_for_isa_probes()
    return options


# The Inductor cache directory the user set, read once when probtorch is imported: a
# compile inside ``torch._inductor.utils.fresh_cache()`` (which points the variable at a
# temporary directory and deletes it afterwards) must not move the header there.
_USER_INDUCTOR_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or None
_headers_placed = [False]


def keep_headers_with_cache() -> None:
    """Where ``TORCHINDUCTOR_CACHE_DIR`` was set when probtorch was imported, Inductor keeps
    its precompiled C++ header there (``<dir>/precompiled_headers``) rather than under the
    temporary directory.

    g++ reads Inductor's C++ prelude for every kernel it builds from a precompiled header,
    which Inductor builds at the first compile with a given torch, compiler and flags
    (5-7 s on this 2-core machine, 130-290 MB) and keeps in
    ``$TMPDIR/torchinductor_$USER/precompiled_headers`` whatever ``TORCHINDUCTOR_CACHE_DIR``
    says. A cache directory carried into a container image or a batch job (see
    :mod:`probtorch.inference.mcmc.prebuild`) then arrived without it: a logistic
    regression whose sampler graph the image kept compiled in 10.8 s on a fresh ``/tmp``
    against 5.1 s with the header (5.9 s with this). Without the variable both places are
    the same directory and nothing changes. The header's place is not part of a kernel's
    cache key (Inductor hashes the build command before adding the header), so kernels
    cached with the header elsewhere are found as before; a header Inductor already used in
    this process stays in use (it remembers one per command line). Once per process.

    Example::

        >>> keep_headers_with_cache()  # idempotent; a no-op without the variable
    """
    if _headers_placed[0]:
        return
    _headers_placed[0] = True
    if _USER_INDUCTOR_CACHE is None:
        return
    try:
        from torch._inductor import codecache
    except ImportError:  # pragma: no cover - other torch versions
        return
    if not hasattr(codecache, "_HEADER_DIR"):  # pragma: no cover - other torch versions
        return
    headers = os.path.join(os.path.abspath(_USER_INDUCTOR_CACHE), "precompiled_headers")
    codecache._HEADER_DIR = headers
    codecache._HEADER_LOCK_DIR = os.path.join(headers, "locks")


_isa_probes_settled = [False]


def _trust_cpu_flags_for_isa_probes() -> None:
    """Settle Inductor's list of vector ISAs once per process, answering its AVX-512 BF16
    and VNNI compile-and-load probes from the CPU flags (which torch already read: Inductor
    only probes a feature the CPU reports). Both intrinsics are in every g++ that compiles
    Inductor's C++20 (g++ 10 and later). Any other probe runs as usual; if Inductor's
    internals differ from what this expects, nothing is changed."""
    if _isa_probes_settled[0]:
        return
    _isa_probes_settled[0] = True
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor import cpu_vec_isa

        if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:  # settled already
            return
        trusted = {cpu_vec_isa.VecAVX512._avx512_bf16_code}
        trusted.add(cpu_vec_isa.VecAVX512VNNI._avx512_vnni_code)
        probe = cpu_vec_isa.VecISA.check_build
    except (ImportError, AttributeError):  # pragma: no cover - other torch versions
        return

    def check_build(isa, code):
        return True if code in trusted else probe(isa, code)

    cpu_vec_isa.VecISA.check_build = check_build
    try:
        with inductor_config.patch({"cpp.vec_isa_ok": True}):
            cpu_vec_isa.valid_vec_isa_list()
    finally:
        cpu_vec_isa.VecISA.check_build = probe


def compile_fn(
    fn: Callable, enabled: bool = True, threads: int = 1, options: dict | None = None
) -> Callable:
    """``torch.compile(fn, fullgraph=True, dynamic=False)`` on a fresh code object, or ``fn``.

    ``fullgraph=True`` turns any graph break into an error, so a compiled path never runs
    partly eager without anyone noticing. ``threads`` is the number of OpenMP threads of the
    generated C++ (``-1``: torch's intra-op thread count). The default, one thread, suits
    the small per-chain tensors of samplers: a fused NUTS kernel holds about a hundred
    OpenMP barriers, each of which can cost a scheduler time slice when cores are shared,
    which slowed calls by 100x under load. Matrix products still use torch's threads.
    """
    if not enabled:
        return fn
    _keep_torch_validation_default()
    return torch.compile(
        _fresh_function(fn),
        fullgraph=True,
        dynamic=False,
        options={**inductor_base_options(), "cpp.threads": threads, **(options or {})},
    )


def skip_guards(compiled: bool = True):
    """Skip Dynamo's guard checks on calls inside the block (a context manager).

    For loops that feed a compiled function its own outputs, or inputs of the shapes,
    strides, dtypes and devices it was compiled for (checked on its first calls): the
    guards then only cost time (about 20% per NUTS step on eight schools). This is
    Dynamo's ``skip_guard_eval_unsafe`` stance; ``PROBTORCH_CHECK_GUARDS=1`` keeps the
    guards, and so does any stance a user has set (e.g. ``force_eager``).
    """
    if not compiled or os.environ.get("PROBTORCH_CHECK_GUARDS") == "1":
        return contextlib.nullcontext()
    current = getattr(torch._dynamo.eval_frame, "_stance", None)
    if current is None or current.stance != "default":
        return contextlib.nullcontext()
    return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)


# graphs compiled by Inductor without Dynamo (the in-place NUTS chunk), for count_compiles
_direct_compiles = [0]


def note_direct_compile() -> None:
    """Count a graph compiled by Inductor directly (not through Dynamo) in
    :func:`count_compiles`."""
    _direct_compiles[0] += 1


class CompileStats:
    """What Dynamo did inside a :func:`count_compiles` block: the counts so far while the
    block runs, its totals after. ``graphs`` counts graphs compiled (first compiles and
    recompiles), Dynamo's and direct ones."""

    def __init__(self, snapshot: Callable[[], tuple[int, int]]):
        self._snapshot = snapshot
        self._before = snapshot()
        self._after: tuple[int, int] | None = None

    def _counts(self) -> tuple[int, int]:
        after = self._snapshot() if self._after is None else self._after
        return after[0] - self._before[0], after[1] - self._before[1]

    @property
    def graph_breaks(self) -> int:
        return self._counts()[0]

    @property
    def graphs(self) -> int:
        return self._counts()[1]

    def __repr__(self) -> str:
        return f"CompileStats(graph_breaks={self.graph_breaks}, graphs={self.graphs})"


@contextlib.contextmanager
def count_compiles():
    """Count graph breaks and compiled graphs inside the block.

    Example::

        >>> f = compile_fn(lambda x: x.sin() + 1)
        >>> with count_compiles() as stats:
        ...     _ = f(torch.zeros(3)); _ = f(torch.ones(3))
        ...     so_far = stats.graphs  # counted as the block runs
        >>> stats.graph_breaks, stats.graphs, so_far
        (0, 1, 1)
    """
    from torch._dynamo.utils import counters

    def snapshot():
        return (
            sum(counters["graph_break"].values()),
            counters["stats"]["unique_graphs"] + _direct_compiles[0],
        )

    stats = CompileStats(snapshot)
    try:
        yield stats
    finally:
        stats._after = snapshot()
