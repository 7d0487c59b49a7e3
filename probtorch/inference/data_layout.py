"""Data arguments laid out for the matrix-vector products that read them.

A data matrix that a model only multiplies by a vector (``X @ beta`` in a regression, and
``X.T @ g`` in its gradient) is read twice per step by BLAS's matrix-vector product, whose
speed depends on the layout: with the longer dimension contiguous it is 1.1-2x faster than
with the shorter one (MKL sgemv on one core, 5000 x 25 float32: 13 against 20 us for the
pair; 50000 x 2: 16 against 100 us). NumPy and torch store a tall design matrix row by
row, the slow way. Under a sampler's chain ``vmap`` the vector is one column per chain,
and the products are ``aten.mm`` with a few columns; there too the longer dimension
contiguous is faster (MKL dgemm, 5000 x 25 float64, 4 chains, the two products as a NUTS
step computes them: 98 against 129 us; a logistic regression's NUTS sampling 199 -> 176
us per gradient evaluation of the 4 chains). :class:`DataLayout` finds, in one eager run
of the step, the tensor arguments used only as the matrix of ``aten.mv`` or as a factor of
``aten.mm`` whose other factor has at most 16 columns (or rows, on the left), and passes
copies with the longer dimension contiguous instead (one copy per tensor and run; same
values, same shapes, only the strides differ). Any other use of the tensor (indexing a
minibatch, elementwise arithmetic, a product with a wide matrix) leaves it as it is.

Example::

    >>> import torch
    >>> X, beta = torch.randn(500, 5), torch.randn(5)
    >>> layout = DataLayout.find(lambda X, b: X @ b, (X, beta), {})
    >>> (args, _) = layout.apply((X, beta), {})
    >>> layout.keys, args[0].stride(), torch.equal(args[0], X)
    ((('arg', 0),), (1, 500), True)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["DataLayout"]

_MATVEC = torch.ops.aten.mv.default
_MATMUL = torch.ops.aten.mm.default
_NARROW = 16  # the other factor's columns (or rows) for a matrix product to count
_MAX_COPY_BYTES = 1 << 30


def _short_side_contiguous(t) -> bool:
    """A 2-D floating tensor whose shorter dimension is the contiguous one."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or not t.dtype.is_floating_point:
        return False
    rows, cols = t.shape
    if rows == cols or min(rows, cols) < 2 or t.requires_grad:
        return False
    long_dim = 0 if rows > cols else 1
    return t.stride(long_dim) != 1 and t.stride(1 - long_dim) == 1


def _long_side_contiguous(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with the same values whose longer dimension is contiguous."""
    return t.t().contiguous().t() if t.shape[0] > t.shape[1] else t.contiguous()


def _product_factor(func, args: tuple, position: int) -> bool:
    """Whether argument ``position`` of ``func(*args)`` is the matrix of a matrix-vector
    product or a factor of a matrix product with a narrow other factor."""
    if func is _MATVEC:
        return position == 0
    if func is not _MATMUL or position not in (0, 1) or len(args) < 2:
        return False
    other = args[1 - position]
    if not isinstance(other, torch.Tensor) or other.dim() != 2:
        return False
    return (other.shape[1] if position == 0 else other.shape[0]) <= _NARROW


class _UseRecorder(TorchDispatchMode):
    """Records, per candidate tensor, whether every op that reads its memory is a
    matrix-vector product with the tensor itself (or its transpose) as the matrix, or a
    matrix product of it with a narrow factor (:func:`_product_factor`)."""

    def __init__(self, candidates: dict):
        super().__init__()
        self.by_storage = {}
        for key, t in candidates.items():
            self.by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((key, t))
        self.matvec: set = set()
        self.other: set = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "is_view", False):  # a view reads nothing; its uses are checked
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        for position, value in enumerate(flat):
            if not isinstance(value, torch.Tensor) or value.device.type == "meta":
                continue
            try:
                ptr = value.untyped_storage().data_ptr()
            except (RuntimeError, NotImplementedError):
                continue
            for key, t in self.by_storage.get(ptr, ()):
                as_matrix = (
                    _product_factor(func, args, position)
                    and value.storage_offset() == t.storage_offset()
                    and (  # the tensor itself or its transpose
                        (value.shape == t.shape and value.stride() == t.stride())
                        or (value.shape == t.shape[::-1] and value.stride() == t.stride()[::-1])
                    )
                )
                (self.matvec if as_matrix else self.other).add(key)
        return func(*args, **kwargs)


class DataLayout:
    """Which tensor arguments to pass with their longer dimension contiguous.

    Args:
        keys: ``("arg", position)`` or ``("kwarg", name)`` of the arguments to lay out.
    """

    def __init__(self, keys: tuple = ()):
        self.keys = tuple(keys)
        self._copies: dict = {}

    @classmethod
    def find(cls, fn: Callable, args: tuple, kwargs: dict) -> DataLayout:
        """Run ``fn(*args, **kwargs)`` once (no gradients, torch's generator states kept,
        warnings silenced) and choose the arguments it uses only as the matrix of
        matrix-vector products or as a factor of narrow matrix products."""
        candidates = {("arg", i): a for i, a in enumerate(args) if _short_side_contiguous(a)}
        candidates.update({("kwarg", k): v for k, v in kwargs.items() if _short_side_contiguous(v)})
        if not candidates:
            return cls()
        recorder = _UseRecorder(candidates)
        devices = sorted({t.get_device() for t in candidates.values() if t.device.type == "cuda"})
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad(), recorder:
                with warnings.catch_warnings():  # a probe: what it warns of, a real run says
                    warnings.simplefilter("ignore")
                    fn(*args, **kwargs)
        except Exception:  # a layout hint only: any failure keeps the user's layout
            return cls()
        return cls(sorted(recorder.matvec - recorder.other, key=str))

    def apply(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``(args, kwargs)`` with the chosen tensors replaced by re-laid-out copies.

        One copy per chosen argument is kept and reused while the argument is the same
        tensor, unchanged (same object, same version counter); a tensor passed as several
        arguments gets one copy. An argument that already has
        the fast layout, is not a tensor of the kind chosen, or is larger than
        ``_MAX_COPY_BYTES`` (the copy would double its memory) is passed as it is.
        """
        if not self.keys:
            return args, kwargs
        args, kwargs = list(args), dict(kwargs)
        made: dict = {}  # id(tensor) -> its copy: a tensor passed twice gets one copy
        for key in self.keys:
            kind, where = key
            box = args if kind == "arg" else kwargs
            if (kind == "arg" and where >= len(box)) or (kind == "kwarg" and where not in box):
                continue
            given = box[where]
            if id(given) not in made:
                made[id(given)] = self._copy(key, given)
            box[where] = made[id(given)]
        return tuple(args), kwargs

    def _copy(self, key, t):
        cached = self._copies.get(key)
        if cached is not None and cached[0] is t and cached[1] == t._version:
            return cached[2]
        if not _short_side_contiguous(t) or t.numel() * t.element_size() > _MAX_COPY_BYTES:
            return t
        copy = _long_side_contiguous(t)
        self._copies[key] = (t, t._version, copy)
        return copy
