"""C++ that probtorch adds to the CPU kernels Inductor generates for probtorch's compiles.

Inductor ends every vectorized sum, product, maximum or minimum over a row with
``at::vec::vec_reduce_all``, a horizontal reduction of the accumulator vector. ATen
implements it with shuffles for ``float`` only; for ``double`` it takes its generic path:
for each lane it stores the vector to the stack, copies one lane into a zeroed array and
loads that back as a vector (seven round trips through memory for AVX-512's eight lanes,
each a store-forwarding stall of 10-20 cycles). A NUTS transition reduces over the
dimensions once per chain for every dot product it needs (kinetic energy, the U-turn
checks, the tree's sums: 14 in one loop of its step), so in float64 those round trips took
about 45 % of the sampler kernel's time on hierarchical regression (perf, 4 chains x 89
dimensions). :data:`DOUBLE_REDUCE_ALL` gives ``double`` the shuffle reduction ATen gives
``float`` (AVX-512 and AVX2; other ISAs keep ATen's code): the lanes are combined as a
tree instead of in order, so sums differ from the generic path's in the last bits, as
``float``'s do.

:func:`patch_inductor_kernels` makes Inductor put it after the C++ prelude of every CPU
kernel it generates while probtorch's graph passes are configured (probtorch's compiles,
not a user's own ``torch.compile``); :class:`~.graph_passes.ProbtorchPasses` carries
:data:`VERSION` (a hash of the code) in its cache key, so kernels cached without it, or
with another version of it, are not reused.

Example::

    >>> src = PRELUDE + '\\nextern "C" void kernel(double* out) { out[0] = 1.0; }'
    >>> with_reductions(src).count("VecReduceAllSIMD<double, Op>")
    1
    >>> without_reductions(with_reductions(src)) == src.replace(PRELUDE, "", 1)
    True
"""

from __future__ import annotations

import hashlib
import threading

__all__ = [
    "DOUBLE_REDUCE_ALL",
    "PRELUDE",
    "VERSION",
    "patch_inductor_kernels",
    "with_reductions",
    "without_reductions",
]

PRELUDE = "#include <torch/csrc/inductor/cpp_prefix.h>"

DOUBLE_REDUCE_ALL = r"""
#ifndef PROBTORCH_REDUCE_ALL_DOUBLE
#define PROBTORCH_REDUCE_ALL_DOUBLE
#if defined(__GNUC__) && !defined(_MSC_VER) && \
    (defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2))
namespace at::vec {
template <typename Op>
struct VecReduceAllSIMD<double, Op> {
  static inline double apply(const Op& vec_fun, const Vectorized<double>& acc_vec) {
    using Vec = Vectorized<double>;
    Vec v = acc_vec;
#if defined(CPU_CAPABILITY_AVX512)
    Vec w = _mm512_shuffle_f64x2(v, v, 0x4E);  // swap the 256-bit halves
    v = vec_fun(v, w);
    w = _mm512_shuffle_f64x2(v, v, 0xB1);  // swap the 128-bit quarters within each half
    v = vec_fun(v, w);
    w = _mm512_permute_pd(v, 0x55);  // swap the lanes of each 128-bit quarter
    v = vec_fun(v, w);
    return _mm512_cvtsd_f64(v);
#else
    Vec w = _mm256_permute2f128_pd(v, v, 0x1);  // swap the 128-bit halves
    v = vec_fun(v, w);
    w = _mm256_shuffle_pd(v, v, 0x5);  // swap the lanes of each half
    v = vec_fun(v, w);
    return _mm256_cvtsd_f64(v);
#endif
  }
};
}  // namespace at::vec
#endif
#endif  // PROBTORCH_REDUCE_ALL_DOUBLE
"""
VERSION = "reduce-all-double-" + hashlib.sha256(DOUBLE_REDUCE_ALL.encode()).hexdigest()[:12]


def with_reductions(source: str) -> str:
    """``source`` (a kernel's C++) with :data:`DOUBLE_REDUCE_ALL` after its prelude; the
    same where it has no prelude or has the code already."""
    if PRELUDE not in source or "PROBTORCH_REDUCE_ALL_DOUBLE" in source:
        return source
    return source.replace(PRELUDE, PRELUDE + DOUBLE_REDUCE_ALL, 1)


def without_reductions(source: str) -> str:
    """``source`` without its prelude and without :data:`DOUBLE_REDUCE_ALL` after it (for a
    unit of several kernels that puts both once at its top)."""
    return source.replace(PRELUDE + DOUBLE_REDUCE_ALL, "", 1).replace(PRELUDE, "", 1)


_patched = [False]
_lock = threading.Lock()


def _probtorch_compile() -> bool:
    from torch._inductor import config

    from .graph_passes import ProbtorchPasses

    return isinstance(config.post_grad_custom_pre_pass, ProbtorchPasses)


def patch_inductor_kernels() -> None:
    """Once per process: Inductor's CPU kernel groups add :data:`DOUBLE_REDUCE_ALL` to their
    C++ while :class:`~.graph_passes.ProbtorchPasses` is Inductor's post-grad pass. Nothing
    changes if Inductor's code generator is not laid out as this expects."""
    with _lock:
        if _patched[0]:
            return
        _patched[0] = True
        try:
            from torch._inductor.codegen.cpp import KernelGroup
        except ImportError:  # pragma: no cover - other torch versions
            return
        original = getattr(KernelGroup, "codegen_group", None)
        if original is None:  # pragma: no cover - other torch versions
            return

        def codegen_group(self, *args, **kwargs):
            source = original(self, *args, **kwargs)
            return with_reductions(source) if _probtorch_compile() else source

        KernelGroup.codegen_group = codegen_group
