"""``probtorch::matvec``: a matrix-vector product with probtorch's own loops, for the SVI
step.

A logistic regression's SVI step (N=5000, D=25, one core) spends most of its time in two
matrix-vector products with the design matrix, ``X @ beta`` and the gradient's
``X.T @ r``, which torch makes through MKL's gemv (10.3 and 8.7 us for the column-major
design here). :func:`use_own_matvec` replaces the ``aten.mv`` nodes of a captured graph by
this operator, whose kernel (:func:`~.library_kernels.own_matvec`, built with a compiled
step's small kernels) takes 6.6 and 7.0 us. Inductor calls it as a library call, and a
recorded call replays it as a direct C call (:class:`~.generated_call.CallTape`). Its sums
are in another order than BLAS's, so compiled and eager results differ by roundings, as
they do wherever Inductor fuses a reduction.

Example::

    >>> a, x = torch.arange(6.0).reshape(3, 2), torch.tensor([1.0, 2.0])
    >>> torch.ops.probtorch.matvec(a, x).tolist()
    [2.0, 8.0, 14.0]
"""

from __future__ import annotations

import torch

from . import library_kernels

__all__ = ["use_own_matvec"]

_LIBRARY = torch.library.Library("probtorch", "DEF")
_LIBRARY.define("matvec(Tensor self, Tensor vec) -> Tensor")
_LIBRARY.define("matvec.out(Tensor self, Tensor vec, *, Tensor(a!) out) -> Tensor(a!)")


def _matvec_into(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``a @ x`` into ``out`` with the own kernel (contiguous copies of what it cannot
    read); torch's ``mv`` where the kernel is not built (no C++ compiler, not Linux)."""
    if not library_kernels._KINDS["matvec"].get(out.dtype):
        from .combined_kernels import build_library

        build_library()
    if not library_kernels._KINDS["matvec"].get(out.dtype):  # not built, or another dtype
        return torch.mv(a, x, out=out)
    call = library_kernels.own_matvec(a, x, out)
    if call is not None:
        call()
        return out
    result = torch.empty_like(out, memory_format=torch.contiguous_format)
    call = library_kernels.own_matvec(a.contiguous(), x.contiguous(), result)
    if call is None:  # sizes that do not match: torch's error names them
        return torch.mv(a, x, out=out)
    call()
    return out.copy_(result)


@torch.library.impl(_LIBRARY, "matvec", "CompositeExplicitAutograd")
def _matvec(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if a.device.type != "cpu":
        return torch.mv(a, x)
    return _matvec_into(a, x, a.new_empty(a.shape[0]))


@torch.library.impl(_LIBRARY, "matvec.out", "CompositeExplicitAutograd")
def _matvec_out(a: torch.Tensor, x: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    if a.device.type != "cpu":
        return torch.mv(a, x, out=out)
    return _matvec_into(a, x, out)


@torch.library.register_fake("probtorch::matvec")
def _matvec_fake(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    torch._check(a.dim() == 2 and x.dim() == 1 and a.shape[1] == x.shape[0])
    return a.new_empty(a.shape[0])


def use_own_matvec(gm: torch.fx.GraphModule) -> int:
    """Replace the graph's float32 and float64 CPU ``aten.mv`` nodes by
    ``probtorch::matvec``; the number replaced."""
    replaced = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.mv.default:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            continue
        if value.dtype not in (torch.float32, torch.float64):
            continue
        node.target = torch.ops.probtorch.matvec.default
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced
