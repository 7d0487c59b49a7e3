"""The effect-handler runtime: the handler stack, ``Message`` and ``Messenger``.

Every primitive (``sample``, ``param``, ``plate``, ...) builds a :class:`Message` and passes
it through :func:`apply_stack`. Handlers (subclasses of :class:`Messenger`) sit on a
module-level stack and may inspect or change the message on its way down
(``process_message``, innermost handler first) and back up (``postprocess_message``, from
the outermost handler that saw it to the innermost, as in Pyro and NumPyro). The code is
plain Python with no dynamic tricks so that TorchDynamo can inline it when a model is traced
inside ``torch.compile``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = ["Message", "Messenger", "CondIndepStackFrame", "apply_stack", "get_stack"]

# Innermost handler last. Module-level on purpose: one model runs at a time in a thread.
_STACK: list[Messenger] = []


def get_stack() -> list[Messenger]:
    """The active handlers, outermost first (a copy)."""
    return list(_STACK)


class CondIndepStackFrame(NamedTuple):
    """One enclosing ``plate`` of a site: its name, batch dim, full size and subsample size."""

    name: str
    dim: int
    size: int
    subsample_size: int


class Message:
    """What a primitive sends through the handler stack; a trace stores one per site.

    Attribute access is the primary interface; ``msg["value"]`` also works, as in Pyro and
    NumPyro traces, with Pyro's dict view: ``"log_prob" in msg`` once it is computed,
    ``msg["scale"]`` 1.0 where the attribute is None, ``msg["log_prob_sum"]``, and keys of
    the user's own kept in ``extra``.
    """

    __slots__ = (
        "type",
        "name",
        "fn",
        "args",
        "kwargs",
        "value",
        "is_observed",
        "infer",
        "scale",
        "mask",
        "cond_indep_stack",
        "stop",
        "done",
        "default",
        "intermediates",
        "log_prob",
        "extra",
    )

    def __init__(
        self,
        type: str,
        name: str,
        fn: Any = None,
        args: tuple = (),
        kwargs: dict | None = None,
        value: Any = None,
        is_observed: bool = False,
        infer: dict | None = None,
        default: Callable[[Message], Any] | None = None,
    ):
        self.type = type
        self.name = name
        self.fn = fn
        self.args = args
        self.kwargs = {} if kwargs is None else kwargs
        self.value = value
        self.is_observed = is_observed
        self.infer = {} if infer is None else infer
        self.scale = None  # None means 1; a float or tensor otherwise
        self.mask = None  # None means all True; a bool or bool tensor otherwise
        self.cond_indep_stack: tuple[CondIndepStackFrame, ...] = ()
        self.stop = False  # handlers further out do not see the message
        self.done = False  # the value is final; the default is not run
        self.default = default  # computes the value when no handler supplied one
        self.intermediates: list = []
        self.log_prob = None  # filled by Trace.compute_log_prob
        self.extra: dict = {}

    # -- Pyro's dict view of a site: site["value"], "log_prob" in site, site.keys() -------
    def __getitem__(self, key: str) -> Any:
        if key in _ITEM_KEYS:
            value = getattr(self, key)
            return 1.0 if key == "scale" and value is None else value  # Pyro's default
        if key in self.extra:
            return self.extra[key]
        raise KeyError(
            f"site {self.name!r} has no entry {key!r}; its entries: {', '.join(_ITEM_KEYS)}"
        )

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _ITEM_KEYS and key != "log_prob_sum":
            setattr(self, key, value)
        else:  # a user's own entry, as in Pyro's dict
            self.extra[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.extra or (key in _ITEM_KEYS and getattr(self, key) is not None)

    def keys(self) -> list[str]:
        """The entries the site holds (those not None), as Pyro's site dict's keys."""
        return [key for key in (*_ITEM_KEYS, *self.extra) if key in self]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    @property
    def log_prob_sum(self) -> torch.Tensor | None:
        """The sum of ``log_prob`` once :meth:`Trace.compute_log_prob` has filled it."""
        return None if self.log_prob is None else self.log_prob.sum()

    def copy(self) -> Message:
        new = Message.__new__(Message)
        for slot in Message.__slots__:
            setattr(new, slot, getattr(self, slot))
        new.kwargs = dict(self.kwargs)
        new.infer = dict(self.infer)
        new.intermediates = list(self.intermediates)
        new.extra = dict(self.extra)
        return new

    def __repr__(self) -> str:
        value = self.value
        shown = tuple(value.shape) if isinstance(value, torch.Tensor) else value
        return f"Message(type={self.type!r}, name={self.name!r}, value={shown})"


_ITEM_KEYS = (*Message.__slots__, "log_prob_sum")


def apply_stack(msg: Message, outside_of: Messenger | None = None) -> Message:
    """Send ``msg`` down the handler stack, compute its value, then send it back up.

    With ``outside_of``, only the handlers further out than that one see the message (a
    handler that splits a site uses this to send the copy on without reprocessing it).
    """
    stack = _STACK
    if outside_of is not None:
        stack = _STACK[: _STACK.index(outside_of)]
    seen = 0
    for handler in reversed(stack):
        seen += 1
        handler.process_message(msg)
        if msg.stop:
            # A site hidden from the outer handlers (block) still draws from an outer
            # seed's generator, as in Pyro, whose seed is the global generator.
            for outer in stack[: len(stack) - seen]:
                if outer.provides_randomness:
                    msg.extra["seeded"] = True
            break
    if msg.value is None and not msg.done and msg.default is not None:
        msg.value = msg.default(msg)
    msg.done = True
    # Only the handlers that saw the message on the way down see it on the way up.
    for handler in stack[len(stack) - seen :]:
        handler.postprocess_message(msg)
    return msg


class Messenger:
    """Base class of effect handlers: a context manager that is also a decorator.

    ``handler(fn)(*args)`` runs ``fn`` with the handler active; ``with handler: ...`` does the
    same for a block. A handler built without a function, ``h = handler(...)``, is also a
    decorator: as in Pyro, each ``h(fn)`` is a new callable (a copy of ``h`` that runs
    ``fn``) that enters ``h`` itself, so one handler may wrap several functions. As in Pyro,
    a handler is not entered again while it is active (:meth:`_refuse_reentry`). Subclasses
    override ``process_message`` and/or ``postprocess_message``.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> class double(pt.Messenger):
        ...     def postprocess_message(self, msg):
        ...         if msg.type == "sample":
        ...             msg.value = 2 * msg.value
        >>> with double():
        ...     x = pt.sample("x", dist.Normal(1.0, 1.0), obs=torch.tensor(3.0))
        >>> float(x)
        6.0
    """

    provides_randomness = False  # seed: sample sites may draw from torch's generator

    def __init__(self, fn: Callable | None = None):
        if fn is not None and not callable(fn):
            raise TypeError(
                f"{type(self).__name__} expected a callable model as its first argument, "
                f"got {type(fn).__name__}"
            )
        self.fn = fn

    def __enter__(self):
        self._refuse_reentry()
        _STACK.append(self)
        return self

    def _refuse_reentry(self) -> None:
        """Refuse to enter this handler while it is already on the stack, as Pyro's
        ``Messenger`` does: every message would pass through it twice (a ``scale(2.0)``
        entered twice scales by 4, a plate broadcasts its dim twice), and the inner block's
        exit would take it off the stack for the rest of the outer one. Entered again after
        it exits, or by two models it wraps one after the other, it is fine. A subclass that
        changes state on entry before ``super().__enter__()`` calls this first; one that
        means to be re-entered (``markov``) pushes itself only on its first entry."""
        if self in _STACK:
            raise ValueError(self._reentry_message())

    def _reentry_message(self) -> str:
        name = type(self).__name__
        return (
            f"the {name} handler is entered again while it is active (`with h: with h:`, or "
            f"a model wrapped by h that calls another one wrapped by h); it would apply twice. "
            f"Build a second {name}(...) for the inner block (Pyro refuses this too)"
        )

    def __exit__(self, exc_type, exc_value, traceback):
        # Remove this handler even if an inner handler forgot to exit (exceptions).
        if self in _STACK:
            while _STACK and _STACK[-1] is not self:
                _STACK.pop()
            _STACK.pop()
        return None

    def process_message(self, msg: Message) -> None:
        pass

    def postprocess_message(self, msg: Message) -> None:
        pass

    def __call__(self, *args, **kwargs):
        if self.fn is None:
            # ``handler(...)(fn)``, or ``@handler(...)``: as in Pyro, a new callable that
            # shares this handler (each model decorated by one handler runs its own
            # function; the handler's state, such as a trace's record, is the shared one's)
            if len(args) == 1 and not kwargs and callable(args[0]):
                return self._bind(args[0])
            raise TypeError(f"{type(self).__name__} has no function to call")
        messenger = self if self._shared is None else self._shared
        # Explicit enter/exit rather than ``with self``: TorchDynamo cannot enter a context
        # manager created outside the compiled region, but it inlines these method calls, so
        # a model wrapped in handlers compiles.
        messenger.__enter__()
        try:
            result = self.fn(*args, **kwargs)
        except BaseException as error:
            messenger.__exit__(type(error), error, error.__traceback__)
            raise
        messenger.__exit__(None, None, None)
        return result

    # the handler a copy made by ``_bind`` enters when called (None: itself)
    _shared: Messenger | None = None

    def _bind(self, fn: Callable) -> Messenger:
        """A copy of this handler (of its class, with its attributes) that runs ``fn`` and,
        when called, enters this handler: the copy is what Pyro's ``handler(fn)`` is, a
        function wrapped in the shared handler."""
        bound = copy.copy(self)
        bound.fn = fn
        bound._shared = self if self._shared is None else self._shared
        return bound
