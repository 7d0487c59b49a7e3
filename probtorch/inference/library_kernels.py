"""Triangular solves, matrix products and Cholesky factors called straight through
BLAS/LAPACK from a replayed NUTS call.

A NUTS step whose model solves with a Cholesky factor (``MultivariateNormal`` with a
``scale_tril`` or a covariance matrix, a Gaussian process) or multiplies by a dense metric
makes those operations as library calls between Inductor's kernels, and
:class:`~.generated_call.CallTape` replays them through torch (``out=`` forms and Python
bindings). Most of such a call is torch's work around the BLAS routine (argument
parsing, checks, the copy of the right-hand side into the result, the batch loop): a
100 x 100 triangular solve with 4 right-hand sides took 6.7 us through torch and 3.95 us
as one C++ function that copies the right-hand side and calls the same ``dtrsm_`` (one
core). The C++ functions here do that for ``trsm``, ``gemm`` and ``potrf``, with every
address, offset and leading dimension fixed when the replayed call is bound.

They are built as part of the library that holds a compiled graph's small kernels (or
its one kernel; :mod:`.combined_kernels`), so they cost no build of their own; where none
was built in this process (several compile threads, not Linux) the replay keeps torch's
call. The routine is the one torch's library exports (its address is looked up there and
passed with each call, so nothing is linked or made global); where it exports none,
torch's call stays. A direct call is used only where it wrote the recorded result bit for
bit (checked once, when the call is recorded): where torch calls BLAS with other
arguments, or sums a small batched product itself, torch's call stays.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable

import torch

from .call_program import symbol_address
from .kernel_source import PRELUDE

__all__ = [
    "SOURCES",
    "direct_cholesky",
    "direct_matmul",
    "direct_matvec",
    "own_matvec",
    "direct_solve_triangular",
    "register",
]


# X[b] = op(A[b])^-1 B[b] (left) or B[b] op(A[b])^-1 (right), X column-major with leading
# dimension ldx; A[b] is read column-major with leading dimension lda (transposed where
# the tensor is row-major); offsets[b] = element offsets of A[b], B[b], X[b].
_TRSM = (
    PRELUDE
    + r"""
using probtorch_trsm = void (*)(const char*, const char*, const char*, const char*, const int*,
                                const int*, const {t}*, const {t}*, const int*, {t}*,
                                const int*);
extern "C" void kernel(const {t}* A, const {t}* B, {t}* X, const int64_t* offsets,
                       int64_t batch, int64_t rows, int64_t cols, int64_t b_row,
                       int64_t b_col, int64_t ldx, int64_t lda, int64_t mode, int64_t blas)
{{
    const auto trsm = reinterpret_cast<probtorch_trsm>(blas);
    const char side = (mode & 8) ? 'R' : 'L';
    const char uplo = (mode & 1) ? 'U' : 'L';
    const char trans = (mode & 2) ? 'T' : 'N';
    const char diag = (mode & 4) ? 'U' : 'N';
    const int m = static_cast<int>(rows), n = static_cast<int>(cols);
    const int ld_a = static_cast<int>(lda), ld_x = static_cast<int>(ldx);
    const {t} one = 1;
    for (int64_t k = 0; k < batch; ++k) {{
        const {t}* a = A + offsets[3 * k];
        const {t}* b = B + offsets[3 * k + 1];
        {t}* x = X + offsets[3 * k + 2];
        for (int64_t j = 0; j < cols; ++j)
            for (int64_t i = 0; i < rows; ++i)
                x[i + j * ldx] = b[i * b_row + j * b_col];
        trsm(&side, &uplo, &trans, &diag, &m, &n, &one, a, &ld_a, x, &ld_x);
    }}
}}
"""
)

# C[b] = op(A[b]) op(B[b]), all column-major (m x n, inner dimension k); offsets[b] =
# element offsets of A[b], B[b], C[b]; mode: 1 transposes A, 2 transposes B.
_GEMM = (
    PRELUDE
    + r"""
using probtorch_gemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                                const {t}*, const {t}*, const int*, const {t}*, const int*,
                                const {t}*, {t}*, const int*);
extern "C" void kernel(const {t}* A, const {t}* B, {t}* C, const int64_t* offsets,
                       int64_t batch, int64_t rows, int64_t cols, int64_t inner, int64_t lda,
                       int64_t ldb, int64_t ldc, int64_t mode, int64_t blas)
{{
    const auto gemm = reinterpret_cast<probtorch_gemm>(blas);
    const char trans_a = (mode & 1) ? 'T' : 'N';
    const char trans_b = (mode & 2) ? 'T' : 'N';
    const int m = static_cast<int>(rows), n = static_cast<int>(cols);
    const int k = static_cast<int>(inner);
    const int ld_a = static_cast<int>(lda), ld_b = static_cast<int>(ldb);
    const int ld_c = static_cast<int>(ldc);
    const {t} one = 1, zero = 0;
    for (int64_t i = 0; i < batch; ++i)
        gemm(&trans_a, &trans_b, &m, &n, &k, &one, A + offsets[3 * i], &ld_a,
             B + offsets[3 * i + 1], &ld_b, &zero, C + offsets[3 * i + 2], &ld_c);
}}
"""
)

# y = op(A) x, A column-major (rows x cols, leading dimension lda), x and y with strides
# incx, incy; mode 1 transposes A. torch's mv calls the same gemv with beta 0.
_GEMV = (
    PRELUDE
    + r"""
using probtorch_gemv = void (*)(const char*, const int*, const int*, const {t}*, const {t}*,
                                const int*, const {t}*, const int*, const {t}*, {t}*,
                                const int*);
extern "C" void kernel(const {t}* A, const {t}* x, {t}* y, int64_t rows, int64_t cols,
                       int64_t lda, int64_t incx, int64_t incy, int64_t mode, int64_t blas)
{{
    const auto gemv = reinterpret_cast<probtorch_gemv>(blas);
    const char trans = (mode & 1) ? 'T' : 'N';
    const int m = static_cast<int>(rows), n = static_cast<int>(cols);
    const int ld_a = static_cast<int>(lda), inc_x = static_cast<int>(incx);
    const int inc_y = static_cast<int>(incy);
    const {t} one = 1, zero = 0;
    gemv(&trans, &m, &n, &one, A, &ld_a, x, &inc_x, &zero, y, &inc_y);
}}
"""
)

# y = A x computed here (no BLAS): A is rows x cols with strides (sr, sc), one of them 1.
# Column-major A (sr == 1): blocks of rows accumulated over the columns in order, four
# vectors at a time; row-major A (sc == 1): dot products of four rows at a time. Each y[i]
# is summed in a fixed order (the same bits every call). x is read with stride incx, y
# written with stride incy. In a unit of scalar code (a small model's graph, compiled with
# cpp.simdlen=1, has no vector types) plain dot products, one row after the other.
_MATVEC = (
    PRELUDE
    + r"""
extern "C" void kernel(const {t}* A, const {t}* x, {t}* y, int64_t rows, int64_t cols,
                       int64_t sr, int64_t sc, int64_t incx, int64_t incy)
{{
#if !INDUCTOR_USE_VECTOR_TYPES()
    // a unit of scalar code (cpp.simdlen=1): Inductor's prelude has no vector types
    for (int64_t i = 0; i < rows; ++i) {{
        {t} acc = 0;
        for (int64_t j = 0; j < cols; ++j) acc = std::fma(A[i * sr + j * sc], x[j * incx], acc);
        y[i * incy] = acc;
    }}
#else
    using Vec = at::vec::Vectorized<{t}>;
    constexpr int64_t V = Vec::size();
    if (sr == 1) {{
        int64_t i = 0;
        for (; i + 4 * V <= rows; i += 4 * V) {{
            Vec a0(0), a1(0), a2(0), a3(0);
            for (int64_t j = 0; j < cols; ++j) {{
                const {t}* c = A + j * sc + i;
                const Vec b(x[j * incx]);
                a0 = at::vec::fmadd(Vec::loadu(c), b, a0);
                a1 = at::vec::fmadd(Vec::loadu(c + V), b, a1);
                a2 = at::vec::fmadd(Vec::loadu(c + 2 * V), b, a2);
                a3 = at::vec::fmadd(Vec::loadu(c + 3 * V), b, a3);
            }}
            {t} out[4 * V];
            a0.store(out); a1.store(out + V); a2.store(out + 2 * V); a3.store(out + 3 * V);
            for (int64_t k = 0; k < 4 * V; ++k) y[(i + k) * incy] = out[k];
        }}
        for (; i < rows; ++i) {{
            {t} acc = 0;
            for (int64_t j = 0; j < cols; ++j) acc = std::fma(A[i + j * sc], x[j * incx], acc);
            y[i * incy] = acc;
        }}
        return;
    }}
    // row-major: y[i] = A[i, :] . x, x contiguous (the caller checks incx == 1)
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4) {{
        const {t}* r0 = A + i * sr;
        const {t}* r1 = r0 + sr;
        const {t}* r2 = r1 + sr;
        const {t}* r3 = r2 + sr;
        Vec s0(0), s1(0), s2(0), s3(0);
        int64_t j = 0;
        for (; j + V <= cols; j += V) {{
            const Vec v = Vec::loadu(x + j);
            s0 = at::vec::fmadd(Vec::loadu(r0 + j), v, s0);
            s1 = at::vec::fmadd(Vec::loadu(r1 + j), v, s1);
            s2 = at::vec::fmadd(Vec::loadu(r2 + j), v, s2);
            s3 = at::vec::fmadd(Vec::loadu(r3 + j), v, s3);
        }}
        auto add = [](Vec& a, Vec& b) {{ return a + b; }};
        {t} t0 = at::vec::vec_reduce_all<{t}>(add, s0);
        {t} t1 = at::vec::vec_reduce_all<{t}>(add, s1);
        {t} t2 = at::vec::vec_reduce_all<{t}>(add, s2);
        {t} t3 = at::vec::vec_reduce_all<{t}>(add, s3);
        for (; j < cols; ++j) {{
            t0 = std::fma(r0[j], x[j], t0);
            t1 = std::fma(r1[j], x[j], t1);
            t2 = std::fma(r2[j], x[j], t2);
            t3 = std::fma(r3[j], x[j], t3);
        }}
        y[i * incy] = t0; y[(i + 1) * incy] = t1; y[(i + 2) * incy] = t2; y[(i + 3) * incy] = t3;
    }}
    for (; i < rows; ++i) {{
        const {t}* r = A + i * sr;
        Vec s(0);
        int64_t j = 0;
        for (; j + V <= cols; j += V) s = at::vec::fmadd(Vec::loadu(r + j), Vec::loadu(x + j), s);
        {t} acc = at::vec::vec_reduce_all<{t}>([](Vec& a, Vec& b) {{ return a + b; }}, s);
        for (; j < cols; ++j) acc = std::fma(r[j], x[j], acc);
        y[i * incy] = acc;
    }}
#endif
}}
"""
)

# L[b] = the Cholesky factor of A[b] as torch's linalg_cholesky_ex makes it: A copied into
# column-major L, LAPACK's potrf, the other triangle zeroed; info[b] = potrf's info.
_POTRF = (
    PRELUDE
    + r"""
using probtorch_potrf = void (*)(const char*, const int*, {t}*, const int*, int*);
extern "C" void kernel(const {t}* A, {t}* L, int32_t* info, const int64_t* offsets,
                       int64_t batch, int64_t size, int64_t a_row, int64_t a_col, int64_t ldl,
                       int64_t upper, int64_t blas)
{{
    const auto potrf = reinterpret_cast<probtorch_potrf>(blas);
    const char uplo = upper ? 'U' : 'L';
    const int n = static_cast<int>(size), ld = static_cast<int>(ldl);
    for (int64_t k = 0; k < batch; ++k) {{
        const {t}* a = A + offsets[3 * k];
        {t}* l = L + offsets[3 * k + 1];
        for (int64_t j = 0; j < size; ++j)
            for (int64_t i = 0; i < size; ++i)
                l[i + j * ldl] = a[i * a_row + j * a_col];
        int result = 0;
        potrf(&uplo, &n, l, &ld, &result);
        info[offsets[3 * k + 2]] = result;
        for (int64_t j = 0; j < size; ++j)
            for (int64_t i = 0; i < size; ++i)
                if (upper ? i > j : i < j) l[i + j * ldl] = 0;
    }}
}}
"""
)

# The functions' argument types and sources, in the order :func:`register` expects, and
# the BLAS routine each calls.
_TYPES = {torch.float64: "double", torch.float32: "float"}
_ROUTINES = [
    ("trsm", torch.float64, "dtrsm_", _TRSM),
    ("trsm", torch.float32, "strsm_", _TRSM),
    ("gemm", torch.float64, "dgemm_", _GEMM),
    ("gemm", torch.float32, "sgemm_", _GEMM),
    ("potrf", torch.float64, "dpotrf_", _POTRF),
    ("potrf", torch.float32, "spotrf_", _POTRF),
    ("gemv", torch.float64, "dgemv_", _GEMV),
    ("gemv", torch.float32, "sgemv_", _GEMV),
    ("matvec", torch.float64, None, _MATVEC),  # no BLAS routine: computed here
    ("matvec", torch.float32, None, _MATVEC),
]
_ARGUMENT_TYPES = {
    "potrf": lambda t: [f"const {t}*", f"{t}*", "int32_t*", "const int64_t*", *["int64_t"] * 7],
    "gemv": lambda t: [f"const {t}*", f"const {t}*", f"{t}*", *["int64_t"] * 7],
    "matvec": lambda t: [f"const {t}*", f"const {t}*", f"{t}*", *["int64_t"] * 6],
}
SOURCES: list[tuple[list[str], str]] = [
    (
        _ARGUMENT_TYPES[kind](t)
        if kind in _ARGUMENT_TYPES
        else [f"const {t}*", f"const {t}*", f"{t}*", "const int64_t*", *["int64_t"] * 9],
        source.format(t=t),
    )
    for kind, dtype, _, source in _ROUTINES
    for t in [_TYPES[dtype]]
]

_lock = threading.Lock()
# routine kind -> dtype -> (built function, address of the BLAS routine it calls)
_KINDS: dict[str, dict[torch.dtype, tuple[Callable, int]]] = {
    kind: {} for kind in ("trsm", "gemm", "potrf", "gemv", "matvec")
}


def _blas_address(name: str) -> int | None:
    """The address of the BLAS routine ``name`` that torch's own library exports (torch
    calls the same one), or None."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    return symbol_address(path, name, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)


def register(functions: list[Callable]) -> None:
    """Take the built :data:`SOURCES` functions (in order) into use, those whose BLAS
    routine torch exports. The first registration stays."""
    with _lock:
        if any(_KINDS.values()):
            return
        for (kind, dtype, routine, _), function in zip(_ROUTINES, functions):
            address = _blas_address(routine) if routine else 0
            if address or routine is None:
                _KINDS[kind][dtype] = (function, address)


def _column_major(t: torch.Tensor) -> tuple[bool, int] | None:
    """``(transposed, leading dimension)`` reading the last two dimensions of ``t`` as a
    column-major matrix (of ``t``'s transpose where ``t`` is row-major), or None."""
    rows, cols = t.shape[-2:]
    row_stride, col_stride = t.stride()[-2:]
    if row_stride == 1 or rows == 1:
        ld = col_stride if cols > 1 else max(rows, 1)
        if ld >= max(rows, 1):
            return False, ld
    if col_stride == 1 or cols == 1:
        ld = row_stride if rows > 1 else max(cols, 1)
        if ld >= max(cols, 1):
            return True, ld
    return None


def _offsets(batch: tuple[int, ...], tensors: list[torch.Tensor]) -> torch.Tensor:
    """``(prod(batch), len(tensors))`` element offsets of each batch entry of each tensor,
    broadcasting tensors with fewer or unit batch dimensions."""
    strides = []
    for t in tensors:
        lead = len(batch) - (t.dim() - 2)
        own = t.stride()[:-2]
        strides.append(
            [0 if k < lead or t.shape[k - lead] == 1 else own[k - lead] for k in range(len(batch))]
        )
    rows = [
        [sum(i * s for i, s in zip(index, st)) for st in strides]
        for index in itertools.product(*(range(n) for n in batch))
    ]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, len(tensors))


def _checked(kind: str, out: torch.Tensor, *inputs: torch.Tensor) -> tuple | None:
    """``(built function, routine address, batch shape)`` for a ``kind`` call writing
    ``out`` from ``inputs`` (matrices or batches of them broadcasting to ``out``'s batch
    shape, all of ``out``'s dtype, on the CPU), or None."""
    kernel, routine = _KINDS[kind].get(out.dtype, (None, 0))
    if kernel is None or out.device.type != "cpu" or out.dim() < 2:
        return None
    if any(t.dtype != out.dtype or t.dim() < 2 for t in inputs):
        return None
    batch = tuple(out.shape[:-2])
    try:
        if torch.broadcast_shapes(*(t.shape[:-2] for t in inputs), batch) != batch:
            return None
    except RuntimeError:
        return None
    return kernel, routine, batch


def direct_solve_triangular(
    A: torch.Tensor,
    B: torch.Tensor,
    out: torch.Tensor,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> Callable[[], None] | None:
    """A function of no arguments that writes ``torch.linalg.solve_triangular(A, B,
    upper=upper, left=left, unitriangular=unitriangular)`` into ``out`` through BLAS, for
    these tensors (their addresses are fixed in it), or None where it cannot: no built
    function for the dtype, a layout BLAS cannot read, or a result that is not
    column-major. The caller checks it against torch (the bits may differ where torch
    reads the matrix in the other orientation).

    Example (on Linux, once the functions are built)::

        >>> from probtorch.inference.combined_kernels import build_library
        >>> build_library()
        True
        >>> A = torch.tensor([[2.0, 0.0], [1.0, 4.0]], dtype=torch.float64)
        >>> B = torch.tensor([[2.0], [5.0]], dtype=torch.float64)
        >>> out = torch.empty(1, 2, dtype=torch.float64).mT  # column-major, as torch's
        >>> solve = direct_solve_triangular(A, B, out, upper=False)
        >>> solve()
        >>> out.tolist()
        [[1.0], [1.0]]
    """
    checked = _checked("trsm", out, A, B)
    if checked is None or A.shape[-1] != A.shape[-2]:
        return None
    kernel, blas, batch = checked
    rows, cols = out.shape[-2:]
    if B.shape[-2:] != out.shape[-2:] or A.shape[-1] != (rows if left else cols):
        return None
    read_a, read_x = _column_major(A), _column_major(out)
    if read_a is None or read_x is None or read_x[0] or min(rows, cols) == 0:
        return None
    transposed, lda = read_a
    if max(lda, read_x[1], rows, cols) >= 2**31:
        return None
    mode = (upper != transposed) | (2 * transposed) | (4 * unitriangular) | (8 * (not left))
    offsets = _offsets(batch, [A, B, out])
    b_row, b_col = B.stride()[-2:]
    return functools.partial(
        kernel, A, B, out, offsets, offsets.shape[0], rows, cols, b_row, b_col,
        read_x[1], lda, mode, blas,
    )  # fmt: skip


def direct_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> Callable[[], None] | None:
    """A function of no arguments that writes ``a @ b`` (matrices, or batches of them of
    ``out``'s batch shape) into ``out`` through BLAS's gemm, for these tensors, or None
    where it cannot (see :func:`direct_solve_triangular`). A row-major ``out`` is computed
    as ``out^T = b^T a^T``, as torch computes it.

    Example (on Linux, once the functions are built)::

        >>> from probtorch.inference.combined_kernels import build_library
        >>> build_library()
        True
        >>> a = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
        >>> b = torch.tensor([[3.0], [4.0]], dtype=torch.float64)
        >>> out = torch.empty(1, 1, dtype=torch.float64)
        >>> product = direct_matmul(a, b, out)
        >>> product()
        >>> out.tolist()
        [[11.0]]
    """
    checked = _checked("gemm", out, a, b)
    if checked is None or a.shape[-1] != b.shape[-2]:
        return None
    kernel, blas, batch = checked
    rows, inner, cols = a.shape[-2], a.shape[-1], b.shape[-1]
    if out.shape[-2:] != (rows, cols) or min(rows, inner, cols) == 0:
        return None
    read_a, read_b, read_out = _column_major(a), _column_major(b), _column_major(out)
    if read_a is None or read_b is None or read_out is None:
        return None
    if read_out[0]:  # out is row-major: out^T (cols x rows) = b^T a^T
        first, second, m, n = (b, read_b), (a, read_a), cols, rows
        mode = (not read_b[0]) | (2 * (not read_a[0]))
    else:
        first, second, m, n = (a, read_a), (b, read_b), rows, cols
        mode = read_a[0] | (2 * read_b[0])
    (x, (_, ld_x)), (y, (_, ld_y)) = first, second
    if max(ld_x, ld_y, read_out[1], m, n, inner) >= 2**31:
        return None
    offsets = _offsets(batch, [x, y, out])
    return functools.partial(
        kernel, x, y, out, offsets, offsets.shape[0], m, n, inner, ld_x, ld_y, read_out[1],
        int(mode), blas,
    )  # fmt: skip


def direct_cholesky(
    A: torch.Tensor, L: torch.Tensor, info: torch.Tensor, *, upper: bool = False
) -> Callable[[], None] | None:
    """A function of no arguments that writes ``torch.linalg.cholesky_ex(A, upper=upper)``
    into ``(L, info)`` through LAPACK's potrf, for these tensors, or None where it cannot
    (see :func:`direct_solve_triangular`; ``L`` must be column-major, ``info`` int32).

    Example (on Linux, once the functions are built)::

        >>> from probtorch.inference.combined_kernels import build_library
        >>> build_library()
        True
        >>> A = torch.tensor([[4.0, 2.0], [2.0, 5.0]], dtype=torch.float64)
        >>> L, info = torch.empty(2, 2, dtype=torch.float64).mT, torch.empty((), dtype=torch.int32)
        >>> factor = direct_cholesky(A, L, info)
        >>> factor()
        >>> L.tolist(), int(info)
        ([[2.0, 0.0], [1.0, 2.0]], 0)
    """
    checked = _checked("potrf", L, A)
    if checked is None or info.dtype != torch.int32 or A.shape != L.shape:
        return None
    kernel, lapack, batch = checked
    if A.shape[-1] != A.shape[-2] or tuple(info.shape) != batch or A.shape[-1] == 0:
        return None
    read_l = _column_major(L)
    if read_l is None or read_l[0] or max(read_l[1], A.shape[-1]) >= 2**31:
        return None
    a_row, a_col = A.stride()[-2:]
    offsets = _offsets(batch, [A, L, info.reshape(*batch, 1, 1)])
    return functools.partial(
        kernel, A, L, info, offsets, offsets.shape[0], A.shape[-1], a_row, a_col, read_l[1],
        int(upper), lapack,
    )  # fmt: skip


def _matvec_checked(kind: str, a, x, out) -> tuple:
    """``(built function, routine address)`` for a ``kind`` call writing ``a @ x`` into
    ``out`` (a matrix, a vector and a vector of matching sizes, none empty, of one dtype,
    on the CPU), or ``(None, 0)``."""
    kernel, routine = _KINDS[kind].get(out.dtype, (None, 0))
    if kernel is None or out.device.type != "cpu" or a.dim() != 2 or x.dim() != 1:
        return None, 0
    if out.dim() != 1 or a.dtype != out.dtype or x.dtype != out.dtype:
        return None, 0
    rows, cols = a.shape
    if x.shape[0] != cols or out.shape[0] != rows or min(rows, cols) == 0:
        return None, 0
    return kernel, routine


def direct_matvec(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> Callable[[], None] | None:
    """A function of no arguments that writes ``a @ x`` (a matrix times a vector) into
    ``out`` through BLAS's gemv, as torch's ``mv`` does, for these tensors, or None where
    it cannot (see :func:`direct_solve_triangular`).

    Example (on Linux, once the functions are built)::

        >>> from probtorch.inference.combined_kernels import build_library
        >>> build_library()
        True
        >>> a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> out = torch.empty(2)
        >>> product = direct_matvec(a, torch.tensor([1.0, 1.0]), out)
        >>> product()
        >>> out.tolist()
        [3.0, 7.0]
    """
    kernel, blas = _matvec_checked("gemv", a, x, out)
    if kernel is None:
        return None
    rows, cols = a.shape
    read_a = _column_major(a)
    incx, incy = x.stride()[0], out.stride()[0]
    if read_a is None or incx < 1 or incy < 1:
        return None
    transposed, lda = read_a
    m, n = (cols, rows) if transposed else (rows, cols)
    if max(lda, m, n, incx, incy) >= 2**31:
        return None
    return functools.partial(kernel, a, x, out, m, n, lda, incx, incy, int(transposed), blas)


def own_matvec(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> Callable[[], None] | None:
    """A function of no arguments that writes ``a @ x`` (a matrix times a vector) into
    ``out`` with probtorch's own vectorized loops (not BLAS), for these tensors, or None
    where it cannot (no built function for the dtype, neither a row- nor a column-major
    matrix, or a strided vector with a row-major matrix). Each element is summed in a fixed
    order, so calls give the same bits; they are not BLAS's bits. One core, 5000 x 25
    float32, column-major: 6.6 us for ``a @ x`` and 7.0 us for ``a.T @ r`` against MKL's
    sgemv 10.3 and 8.7 us.

    Example (on Linux, once the functions are built)::

        >>> from probtorch.inference.combined_kernels import build_library
        >>> build_library()
        True
        >>> a = torch.arange(6.0).reshape(3, 2)
        >>> out = torch.empty(3)
        >>> product = own_matvec(a, torch.tensor([1.0, 2.0]), out)
        >>> product()
        >>> out.tolist()
        [2.0, 8.0, 14.0]
    """
    kernel, _ = _matvec_checked("matvec", a, x, out)
    if kernel is None:
        return None
    rows, cols = a.shape
    sr, sc = a.stride()
    incx, incy = x.stride()[0], out.stride()[0]
    if rows == 1:  # a row: read as a column-major matrix (sr is not used)
        sr = 1
    if cols == 1:  # a column: sc and incx are not used
        sc, incx = 1, 1
    column_major = sr == 1
    if not (column_major or sc == 1) or min(incx, incy) < 1:
        return None
    if not column_major and incx != 1:
        return None
    return functools.partial(kernel, a, x, out, rows, cols, sr, sc, incx, incy)
