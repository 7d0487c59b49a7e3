"""Parameter stores: named learnable tensors kept unconstrained, returned constrained.

There is a default store for interactive use (:func:`get_param_store`); inference
(``SVI``) gives each run a store of its own through the :class:`param_scope` handler, so two
runs never share hidden global state.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.distributions import constraints

from ._caller import warn_at_caller
from .distributions.constraint_registry import biject_to
from .runtime import Message, Messenger, get_stack

__all__ = ["ParamStore", "clear_param_store", "get_param_store", "param_scope"]


class ParamStore:
    """A dict-like store ``name -> constrained value``; unconstrained leaves are trained.

    Example::

        >>> store = ParamStore()
        >>> v = store.setdefault("s", torch.tensor(3.0), constraints.positive)
        >>> float(v.detach()), float(store.unconstrained("s").detach().exp())
        (3.0, 3.0)
    """

    def __init__(self):
        self._unconstrained: dict[str, torch.Tensor] = {}
        self._constraints: dict[str, constraints.Constraint] = {}

    def setdefault(
        self,
        name: str,
        init_value: torch.Tensor | Callable[[], torch.Tensor] | None,
        constraint: constraints.Constraint = constraints.real,
    ) -> torch.Tensor:
        """The constrained value of ``name``, created from ``init_value`` if it is new."""
        current = self._unconstrained.get(name)
        if (
            isinstance(init_value, torch.nn.Parameter)
            and current is not None
            and current is not init_value
            and not isinstance(current, torch.nn.Parameter)
            and current.shape == init_value.shape
        ):
            # a module's parameter whose value was loaded (load, set_state) before the
            # module was registered: the module takes the value, the store the parameter
            self._unconstrained[name] = _written_in_place(init_value, current)
        if name not in self._unconstrained:
            if init_value is None:
                raise KeyError(
                    f"param {name!r} is not in the param store and has no init_value (params "
                    f"fitted by SVI live in its own store: svi.param_store, or "
                    f"svi.get_params())"
                )
            if callable(init_value) and not isinstance(init_value, torch.Tensor):
                init_value = init_value()
            self._set(name, init_value, constraint)
        return self[name]

    def _set(self, name: str, value: torch.Tensor, constraint: constraints.Constraint) -> None:
        if isinstance(value, torch.nn.Parameter) and constraint is constraints.real:
            # An nn.Module's parameter is stored as itself so the module trains in place.
            self._unconstrained[name] = value
        else:
            value = torch.as_tensor(value)
            if not value.is_floating_point():
                raise ValueError(
                    f"param {name!r}: init_value has dtype {value.dtype}; params are trained "
                    f"by gradients and must be floating point (e.g. torch.tensor(3.0))"
                )
            if not bool(torch.all(constraint.check(value))):
                raise ValueError(
                    f"param {name!r}: init_value of shape {tuple(value.shape)} does not "
                    f"satisfy its constraint {constraint}"
                )
            with torch.no_grad():
                unconstrained = biject_to(constraint).inv(value.detach())
            self._unconstrained[name] = unconstrained.clone().requires_grad_(True)
        self._constraints[name] = constraint

    def __setitem__(self, name: str, value: torch.Tensor) -> None:
        current = self._unconstrained.get(name)
        if isinstance(current, torch.nn.Parameter) and not isinstance(value, torch.nn.Parameter):
            # a module's parameter (pt.module): written in place, so the module sees it
            value = torch.as_tensor(value, dtype=current.dtype, device=current.device)
            if value.shape != current.shape:
                raise ValueError(
                    f"param {name!r} is a module parameter of shape {tuple(current.shape)}; "
                    f"got a value of shape {tuple(value.shape)}"
                )
            _written_in_place(current, value)
            return
        self._set(name, value, self._constraints.get(name, constraints.real))

    def __getitem__(self, name: str) -> torch.Tensor:
        try:
            constraint = self._constraints[name]
        except KeyError:
            if self is _DEFAULT_STORE and any(name in store for store in _SVI_STORES):
                raise KeyError(
                    f"param {name!r} is not in the default store: SVI keeps the params it "
                    f"fits in its own store (svi.param_store[{name!r}], or svi.get_params())"
                ) from None
            raise
        unconstrained = self._unconstrained[name]
        if constraint is constraints.real:
            return unconstrained
        return biject_to(constraint)(unconstrained)

    def __contains__(self, name: str) -> bool:
        return name in self._unconstrained

    def __len__(self) -> int:
        return len(self._unconstrained)

    def __iter__(self) -> Iterator[str]:
        return iter(self._unconstrained)

    def keys(self):
        return self._unconstrained.keys()

    def items(self):
        return [(name, self[name]) for name in self._unconstrained]

    def values(self):
        return [self[name] for name in self._unconstrained]

    # Pyro's ParamStoreDict names, for code ported from Pyro.
    def get_param(
        self,
        name: str,
        init_tensor: torch.Tensor | None = None,
        constraint: constraints.Constraint = constraints.real,
        event_dim: int | None = None,
    ) -> torch.Tensor:
        """Pyro's: the constrained value of ``name``, created from ``init_tensor`` if new
        (``event_dim`` matters only to :func:`probtorch.param` inside plates)."""
        return self.setdefault(name, init_tensor, constraint)

    def get_all_param_names(self) -> list[str]:
        return list(self._unconstrained)

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Pyro's: ``(name, unconstrained leaf)`` pairs, the tensors an optimizer trains."""
        return list(self._unconstrained.items())

    def match(self, name: str) -> dict[str, torch.Tensor]:
        """Pyro's: ``{name: constrained value}`` of the params whose names match the regular
        expression ``name`` (``re.match``, from the start)."""
        pattern = re.compile(name)
        return {key: self[key] for key in self._unconstrained if pattern.match(key)}

    def unconstrained(self, name: str) -> torch.Tensor:
        """The trainable leaf tensor behind ``name``."""
        return self._unconstrained[name]

    def constraint(self, name: str) -> constraints.Constraint:
        return self._constraints[name]

    def parameters(self) -> list[torch.Tensor]:
        """The trainable leaves, for an optimizer."""
        return list(self._unconstrained.values())

    def __delitem__(self, name: str) -> None:
        del self._unconstrained[name]
        del self._constraints[name]

    def clear(self) -> None:
        self._unconstrained.clear()
        self._constraints.clear()

    def get_state(self) -> dict:
        """The unconstrained values and the constraints, by name (copies)."""
        return {
            "params": {k: v.detach().clone() for k, v in self._unconstrained.items()},
            "constraints": dict(self._constraints),
        }

    def set_state(self, state: dict) -> None:
        """Replace the contents with ``state`` (from :meth:`get_state`). A module parameter
        registered here (``pt.module``) is written in place, so the module sees the values."""
        old = self._unconstrained
        self._unconstrained, self._constraints = {}, {}
        for name, value in state["params"].items():
            constraint = _canonical(state["constraints"][name])
            current = old.get(name)
            if (
                isinstance(current, torch.nn.Parameter)
                and constraint is constraints.real
                and current.shape == value.shape
            ):
                self._unconstrained[name] = _written_in_place(current, value)
            else:
                self._unconstrained[name] = value.detach().clone().requires_grad_(True)
            self._constraints[name] = constraint

    def save(self, path) -> None:
        """Save the params and their constraints to ``path`` (``torch.save``).

        Params only, as Pyro's ``ParamStoreDict.save``: the store keeps params, not the
        modules whose parameters ``pt.module`` registers, so a module's buffers (a
        ``BatchNorm``'s running statistics) and its frozen parameters are not saved; save
        them with the module (``torch.save(net.state_dict(), path)``).

        Example::

            >>> import os, tempfile
            >>> store = ParamStore()
            >>> _ = store.setdefault("s", torch.tensor(2.0), constraints.positive)
            >>> path = os.path.join(tempfile.mkdtemp(), "params.pt")
            >>> store.save(path)
            >>> loaded = ParamStore()
            >>> loaded.load(path)
            >>> float(loaded["s"].detach()), loaded.constraint("s") is constraints.positive
            (2.0, True)
        """
        if self is _DEFAULT_STORE:
            fitted = {name for store in _SVI_STORES for name in store if name not in self}
            if fitted:
                warn_at_caller(
                    f"saving the default param store, which lacks {len(fitted)} param(s) an "
                    f"SVI fitted (e.g. {sorted(fitted)[0]!r}): SVI keeps them in its own "
                    f"store, saved by svi.param_store.save(path)"
                )
        torch.save(self.get_state(), path)

    def load(self, path, map_location=None) -> None:
        """Replace the contents with those saved at ``path`` by :meth:`save`. The file holds
        pickled constraint objects: load only files you trust."""
        state = torch.load(path, map_location=map_location, weights_only=False)
        self.set_state(state)


def _written_in_place(parameter: torch.nn.Parameter, value: torch.Tensor) -> torch.nn.Parameter:
    """``parameter`` (a module's) with ``value`` copied into it, so the module sees it."""
    with torch.no_grad():
        parameter.copy_(value)
    return parameter


def same_constraint(a: constraints.Constraint, b: constraints.Constraint) -> bool:
    """Whether two constraint objects are the same constraint: the same class with equal
    attributes (tensor bounds compared by value). An unpickled copy of a constraint is
    another object.

    >>> import pickle
    >>> same_constraint(pickle.loads(pickle.dumps(constraints.positive)), constraints.positive)
    True
    >>> same_constraint(constraints.interval(0.0, 1.0), constraints.interval(0.0, 2.0))
    False
    """
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    left, right = vars(a), vars(b)
    if left.keys() != right.keys():
        return False
    for key, x in left.items():
        y = right[key]
        if isinstance(x, constraints.Constraint) and isinstance(y, constraints.Constraint):
            same = same_constraint(x, y)
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            same = (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.shape == y.shape
                and bool(torch.equal(x, y.to(x.device, x.dtype)))
            )
        else:
            try:
                same = bool(x == y)
            except Exception:  # noqa: BLE001 - not comparable: not the same
                same = False
        if not same:
            return False
    return True


def _canonical(constraint: constraints.Constraint) -> constraints.Constraint:
    """torch's module-level constraint object equal to ``constraint`` (code checks
    ``constraint is constraints.real``), or ``constraint`` itself."""
    for known in vars(constraints).values():
        if isinstance(known, constraints.Constraint) and same_constraint(known, constraint):
            return known
    return constraint


_DEFAULT_STORE = ParamStore()
# The stores of the SVI objects alive (``svi.param_store``), for the default store's hints
# to a Pyro user who looks for fitted params there (Pyro keeps one global store).
_SVI_STORES: weakref.WeakSet[ParamStore] = weakref.WeakSet()
# The store of the last SVI that fitted (stepped, ran or evaluated) each model and guide, so
# that Predictive reads their fitted params outside SVI, as an autoguide does.
_FITTED_BY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_fitted(fn: Callable, store: ParamStore) -> None:
    """Note that ``store`` holds the params an SVI fits for ``fn`` (a model or guide)."""
    try:
        _FITTED_BY[fn] = store
    except TypeError:  # a callable without weak references: Predictive reads the active store
        pass


def store_chosen() -> bool:
    """Whether the caller chose a store (an active :class:`param_scope`): then it is read,
    not the store of the SVI that fitted a guide or model.

    Example::

        >>> store_chosen()
        False
    """
    return any(isinstance(h, param_scope) for h in get_stack())


def fitted_params(*fns: Callable | None) -> dict[str, torch.Tensor] | None:
    """The params (detached, by name) of the SVI that last fitted the first of ``fns`` an SVI
    fitted, as Pyro's one param store holds them after ``svi.step``; None where the caller
    chose a store (:func:`store_chosen`: it is read instead) or none of ``fns`` was fitted.

    Example::

        >>> fitted_params(lambda: None) is None
        True
    """
    if store_chosen():
        return None
    for fn in fns:
        store = None if fn is None else fitted_store_of(fn)
        if store is not None:
            return {name: store[name].detach() for name in store}
    return None


def fitted_scope(fn: Callable | None):
    """A context in which ``pt.param`` sites read the store of the SVI that last fitted
    ``fn``, as Pyro's one param store holds them after ``svi.step`` (MCMC on a model whose
    params an SVI fitted); a context that changes nothing where the caller chose a store or
    no SVI fitted ``fn``.

    Example::

        >>> with fitted_scope(lambda: None):
        ...     active_store() is get_param_store()
        True
    """
    store = store_to_read(fn)
    return contextlib.nullcontext() if store is None else param_scope(store)


def store_to_read(fn: Callable | None) -> ParamStore | None:
    """The store of the SVI that last fitted ``fn``, unless the caller chose a store (then
    None: the active one is read) or no SVI fitted it.

    Example::

        >>> store_to_read(lambda: None) is None
        True
    """
    return None if fn is None or store_chosen() else fitted_store_of(fn)


def fitted_store_of(fn: Callable) -> ParamStore | None:
    """The store of the last SVI that fitted ``fn``, or None.

    Example::

        >>> fitted_store_of(lambda: None) is None
        True
    """
    for _ in range(16):  # through functools.wraps wrappers (NeuTraReparam's model)
        try:
            store = _FITTED_BY.get(fn)
        except TypeError:
            store = None
        if store is not None or getattr(fn, "__wrapped__", None) is None:
            return store
        fn = fn.__wrapped__
    return None


def active_store() -> ParamStore:
    """The store ``param`` sites read now: the innermost :class:`param_scope`'s, else the
    default store.

    Example::

        >>> active_store() is get_param_store()
        True
    """
    for handler in reversed(get_stack()):
        if isinstance(handler, param_scope):
            return handler.store
    return _DEFAULT_STORE


def get_param_store() -> ParamStore:
    """The default store used by ``param`` when no :class:`param_scope` is active."""
    return _DEFAULT_STORE


def clear_param_store() -> None:
    """Empty the default store (``pyro.clear_param_store``). Each ``SVI`` keeps its params in
    a store of its own (``svi.param_store``), which this leaves alone."""
    _DEFAULT_STORE.clear()


class param_scope(Messenger):
    """Serve ``param`` sites from ``store`` instead of the default store.

    Example::

        >>> import probtorch as pt
        >>> store = ParamStore()
        >>> with param_scope(store):
        ...     _ = pt.param("w", torch.zeros(2))
        >>> list(store.keys())
        ['w']
    """

    def __init__(self, store: ParamStore, fn=None):
        super().__init__(fn)
        self.store = store

    def process_message(self, msg: Message) -> None:
        if msg.type == "param" and msg.value is None:
            msg.value = self.store.setdefault(msg.name, msg.args[0], msg.kwargs["constraint"])
