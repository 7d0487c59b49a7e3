"""Triangular solves called straight through BLAS from a replayed NUTS call.

A NUTS step whose model solves with a Cholesky factor (``MultivariateNormal`` with a
``scale_tril`` or a covariance matrix, a Gaussian process) makes those solves as library
calls between Inductor's kernels, and :class:`~.generated_call.CallTape` replays them
through ``torch.linalg.solve_triangular(..., out=)``. Most of such a call is torch's
work around the BLAS routine (argument parsing, checks, the copy of the right-hand side
into the result, the batch loop): a 100 x 100 solve with 4 right-hand sides took 6.7 us
through torch and 3.95 us as one C++ function that copies the right-hand side and calls
the same ``dtrsm_`` (one core). The C++ functions here do that, with every address,
offset and leading dimension fixed when the replayed call is bound.

They are built as part of the library that holds a compiled graph's small kernels
(:mod:`.combined_kernels`), so they cost no build of their own; where none was built in
this process (several compile threads, a graph of one kernel) the replay keeps torch's
call. The BLAS routine is the one torch's library exports (its address is looked up
there and passed with each call, so nothing is linked or made global); where it exports
none, torch's call stays. A direct call is used only where it wrote the recorded result
bit for bit (checked once, when the call is recorded): where torch calls BLAS with other
arguments, torch's call stays.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from collections.abc import Callable

import torch

__all__ = ["SOURCES", "direct_solve_triangular", "register"]

_PRELUDE = "#include <torch/csrc/inductor/cpp_prefix.h>"

# X[b] = op(A[b])^-1 B[b] (left) or B[b] op(A[b])^-1 (right), X column-major with leading
# dimension ldx; A[b] is read column-major with leading dimension lda (transposed where
# the tensor is row-major); offsets[b] = element offsets of A[b], B[b], X[b].
_TRSM = (
    _PRELUDE
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

# The functions' argument types and sources, in the order :func:`register` expects, and
# the BLAS routine each calls.
_ROUTINES = {torch.float64: "dtrsm_", torch.float32: "strsm_"}
SOURCES: list[tuple[list[str], str]] = [
    (
        [f"const {t}*", f"const {t}*", f"{t}*", "const int64_t*", *["int64_t"] * 9],
        _TRSM.format(t=t),
    )
    for t in ("double", "float")
]

_lock = threading.Lock()
_trsm: dict[torch.dtype, tuple[Callable, int]] = {}


def _blas_address(name: str) -> int | None:
    """The address of the BLAS routine ``name`` that torch's own library exports (torch
    calls the same one), or None."""
    import ctypes

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def register(functions: list[Callable]) -> None:
    """Take the built :data:`SOURCES` functions (in order) into use, those whose BLAS
    routine torch exports. The first registration stays."""
    with _lock:
        if _trsm:
            return
        for dtype, function in zip(_ROUTINES, functions):
            address = _blas_address(_ROUTINES[dtype])
            if address:
                _trsm[dtype] = (function, address)


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

    Example (where the functions were built; see the module docstring)::

        >>> A = torch.tensor([[2.0, 0.0], [1.0, 4.0]], dtype=torch.float64)
        >>> B = torch.tensor([[2.0], [5.0]], dtype=torch.float64)
        >>> out = torch.empty(2, 1, dtype=torch.float64)
        >>> solve = direct_solve_triangular(A, B, out, upper=False)
        >>> solve is None or (solve(), out)[1].tolist() == [[1.0], [1.0]]
        True
    """
    kernel, blas = _trsm.get(out.dtype, (None, 0))
    if kernel is None or not (A.dtype == B.dtype == out.dtype) or out.device.type != "cpu":
        return None
    if A.dim() < 2 or B.dim() < 2 or out.dim() < 2 or A.shape[-1] != A.shape[-2]:
        return None
    rows, cols = out.shape[-2:]
    if B.shape[-2:] != out.shape[-2:] or A.shape[-1] != (rows if left else cols):
        return None
    batch = tuple(out.shape[:-2])
    try:
        if torch.broadcast_shapes(A.shape[:-2], B.shape[:-2], batch) != batch:
            return None
    except RuntimeError:
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
