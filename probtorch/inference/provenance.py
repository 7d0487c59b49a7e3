"""Provenance tracking: which sample sites a tensor was computed from.

:class:`Provenance` is a tensor that carries the names of the sites its value depends on
through every torch operation (``detach`` included: a detached value still depends on the
draw statistically). ``TraceGraph_ELBO`` runs the guide and model once with its
non-reparameterized draws tracked, so that a draw's score-function term counts only the
costs computed from it (Pyro's provenance tracking). A tracked value read into Python
(``bool``, ``item``, ``tolist``, ``numpy``...), a shape computed from it (``nonzero``, a
boolean mask) and a tracked value written into an untracked tensor (in place) may carry the
dependence where the tracking cannot see it; :func:`tracking` notes them, and the caller
then keeps every later cost.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["Provenance", "sources", "tracking"]

# Tensor methods and functions whose result is a Python value read from the data
_ESCAPES = frozenset(
    {
        "__bool__",
        "__int__",
        "__float__",
        "__complex__",
        "__index__",
        "item",
        "tolist",
        "numpy",
        "__array__",
        "equal",
        "allclose",
        "is_nonzero",
    }
)
# Functions whose result's shape depends on the values (a later len() or .shape reads them)
_VALUE_SHAPED = frozenset(
    {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}
)
_ESCAPED: list[set] = []  # one set per active tracking(): names read into Python


class Provenance(torch.Tensor):
    """A tensor with ``_sources``, the site names its value was computed from.

    Example::

        >>> x = Provenance(torch.tensor(2.0), {"z"})
        >>> sources((x * 3).exp() + torch.ones(2))
        frozenset({'z'})
    """

    _sources: frozenset = frozenset()

    @staticmethod
    def __new__(cls, data: torch.Tensor, names=()):
        tensor = data.as_subclass(cls)
        tensor._sources = frozenset(names)
        return tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        names = frozenset().union(*(sources(a) for a in flat if isinstance(a, torch.Tensor)))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if names and _ESCAPED and _escapes(func, args, kwargs):
            _ESCAPED[-1].update(names)
        if not names:
            return out
        return tree_map(lambda t: _tag(t, names), out)


def _escapes(func, args: tuple, kwargs: dict) -> bool:
    """Whether a call on tracked values loses track of them: a Python value read from
    them, a shape that depends on them, or a write into an untracked tensor (in place,
    ``out=``, ``t[i] = z``), which later reads of that tensor would not carry."""
    name = getattr(func, "__name__", "")
    if name in _ESCAPES or name in _VALUE_SHAPED:
        return True
    if name == "__getitem__" and len(args) > 1:
        index, _ = tree_flatten(args[1])
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return True  # a boolean mask: its count of True sets the shape
    written = kwargs.get("out")
    if written is None and args and (name == "__setitem__" or _in_place(name)):
        written = args[0]
    return written is not None and not isinstance(written, Provenance)


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_") and name != "requires_grad_"


def _tag(value, names: frozenset):
    if not isinstance(value, torch.Tensor):
        return value
    tagged = value if isinstance(value, Provenance) else value.as_subclass(Provenance)
    tagged._sources = sources(value) | names
    return tagged


def sources(value) -> frozenset:
    """The site names ``value`` was computed from (none for an untracked value)."""
    return getattr(value, "_sources", frozenset())


@contextlib.contextmanager
def tracking():
    """Collect the names of tracked values read into Python within the block.

    Example::

        >>> with tracking() as escaped:
        ...     _ = bool(Provenance(torch.tensor(1.0), {"z"}) > 0)
        >>> escaped
        {'z'}
    """
    escaped: set = set()
    _ESCAPED.append(escaped)
    try:
        yield escaped
    finally:
        _ESCAPED.pop()
