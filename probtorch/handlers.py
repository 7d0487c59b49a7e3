"""Effect handlers: lower-case classes usable as decorators and context managers.

``handler(model, ...)`` returns a callable model; ``with handler(...):`` applies it to a
block. Each handler overrides one or two ``Messenger`` methods.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable

import numpy as np
import torch

from ._errors import with_message
from .rng import set_rng_seed
from .runtime import Message, Messenger, apply_stack
from .validation import check_sample_site, is_validation_enabled, readable

__all__ = [
    "Trace",
    "trace",
    "seed",
    "substitute",
    "condition",
    "uncondition",
    "lift",
    "block",
    "replay",
    "scale",
    "mask",
    "do",
    "reparam",
    "infer_config",
    "config_enumerate",
]


def site_log_prob(site: Message, apply_scale: bool = True, fn=None) -> torch.Tensor:
    """Log density of one sample site, broadcast over its plates, masked and scaled
    (``fn``: another distribution to evaluate it with, one that broadcasts to the site's)."""
    log_prob = distribution_log_prob(site.fn if fn is None else fn, site.value)
    if site.mask is not None and site.mask is not True:
        mask = site.mask
        if mask is False:
            log_prob = torch.zeros_like(log_prob)
        else:
            log_prob = torch.where(mask, log_prob, torch.zeros((), dtype=log_prob.dtype))
    if apply_scale and site.scale is not None:
        log_prob = site.scale * log_prob
    return log_prob


# where distributions keep the distributions they are built from: Independent, expanded,
# masked and transformed ones; MixtureSameFamily
_WRAPPED = ("base_dist", "_component_distribution", "_mixture_distribution")


def distribution_log_prob(fn, value: torch.Tensor) -> torch.Tensor:
    """``fn.log_prob(value)``; where torch's validation default is off (inference), also
    without the checks of distributions built while it was on (:func:`_unvalidated_log_prob`)."""
    if torch.distributions.Distribution._validate_args:
        return fn.log_prob(value)
    return _unvalidated_log_prob(fn, value)


def _unvalidated_log_prob(fn, value: torch.Tensor) -> torch.Tensor:
    """``fn.log_prob(value)`` without the checks of value that ``fn`` and the distributions
    it wraps would make because they were built while validation was on (a prior built
    once outside the model, Pyro's ``PyroSample(prior)``): their data-dependent branch
    cannot be compiled, and inference runs with validation off after checking each site
    once."""
    validating, pending = [], [fn]
    while pending:
        inner = pending.pop()
        if getattr(inner, "_validate_args", False):  # set on the instance
            validating.append(inner)
        for name in _WRAPPED:
            part = getattr(inner, name, None)
            if isinstance(part, torch.distributions.Distribution):
                pending.append(part)
    if not validating:
        return fn.log_prob(value)
    for inner in validating:
        inner._validate_args = False
    try:
        return fn.log_prob(value)
    finally:
        for inner in validating:
            inner._validate_args = True


def _named_site_log_prob(site: Message, apply_scale: bool = True) -> torch.Tensor:
    """:func:`site_log_prob`, whose errors name the site, its distribution and the shapes
    (as Pyro's ``Trace.compute_log_prob`` does): a value replayed or substituted with the
    wrong shape fails here, far from where it was given."""
    try:
        return site_log_prob(site, apply_scale=apply_scale)
    except (ValueError, RuntimeError, TypeError, IndexError) as error:
        fn, value = site.fn, site.value
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        where = (
            f"{type(fn).__name__} with batch_shape {tuple(fn.batch_shape)}, event_shape "
            f"{tuple(fn.event_shape)}"
            if isinstance(fn, torch.distributions.Distribution)
            else type(fn).__name__
        )
        mask = site.mask
        if isinstance(mask, torch.Tensor):
            where += f", mask of shape {tuple(mask.shape)}"
        kind = "observed" if site.is_observed else "latent"
        plates = [frame.name for frame in site.cond_indep_stack]
        message = (
            f"computing the log density of site {site.name!r} ({kind}; {where}; value of "
            f"shape {shape}; plates {plates}) failed: {error}"
        )
        raise with_message(error, message) from error


class Trace(OrderedDict):
    """An ordered record ``name -> Message`` of one run of a model.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     with pt.plate("data", 3):
        ...         pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(3))
        >>> tr = pt.handlers.trace(model).get_trace()
        >>> tr.log_densities()["y"].shape
        torch.Size([3])
    """

    def sample_sites(self, observed: bool | None = None) -> dict[str, Message]:
        return {
            name: site
            for name, site in self.items()
            if site.type == "sample" and (observed is None or site.is_observed == observed)
        }

    def compute_log_prob(self) -> None:
        """Store ``site.log_prob`` on every sample site (masked, scaled)."""
        for site in self.sample_sites().values():
            if site.log_prob is None:
                site.log_prob = _named_site_log_prob(site)

    def log_densities(self) -> dict[str, torch.Tensor]:
        """Per-site log densities, broadcast over plates, masked and scaled."""
        self.compute_log_prob()
        return {name: site.log_prob for name, site in self.sample_sites().items()}

    def log_prob_sum(
        self, site_filter: Callable[[str, Message], bool] | None = None
    ) -> torch.Tensor:
        """The log joint density of the trace: the sum over all sample sites (those for
        which ``site_filter(name, site)`` holds, as Pyro's)."""
        total = None
        for name, log_prob in self.log_densities().items():
            if site_filter is not None and not site_filter(name, self[name]):
                continue
            term = log_prob.sum()
            total = term if total is None else total + term
        return torch.zeros(()) if total is None else total

    def log_likelihood(self, factors: bool = False) -> dict[str, torch.Tensor]:
        """Pointwise log likelihood of the observed sites (masked, not scaled); with
        ``factors``, of the ``pt.factor`` sites too (observed sites in NumPyro, whose
        ``log_likelihood`` counts them)."""
        return {
            name: _named_site_log_prob(site, apply_scale=False)
            for name, site in self.sample_sites(observed=True).items()
            if (factors or not site.infer.get("is_auxiliary", False))
            and not site.infer.get("prior_term", False)  # (a prior's factor: NeuTraReparam's)
        }

    @property
    def nodes(self) -> Trace:
        """Pyro's spelling: ``trace.nodes[name]["value"]``."""
        return self

    def format_shapes(self, compute_log_prob: bool = False, last_site: str | None = None) -> str:
        """A table of each site's shapes (Pyro's ``Trace.format_shapes``): batch dims left
        of ``|``, event dims right of it; for a sample site its distribution's, its value's
        and (once computed, or with ``compute_log_prob``) its log density's; a plate's
        indices; a param's and a deterministic site's value. ``last_site`` ends the table
        at that site.

        Example::

            >>> import probtorch as pt, probtorch.distributions as dist
            >>> def model():
            ...     with pt.plate("n", 5):
            ...         pt.sample("x", dist.Normal(torch.zeros(2), 1.0).to_event(1))
            >>> tr = pt.handlers.trace(pt.handlers.seed(model, 0)).get_trace()
            >>> print(tr.format_shapes(compute_log_prob=True))
            Trace Shapes:
             Param Sites:
            Sample Sites:
                  n plate 5 |
                   x dist 5 | 2
                    value 5 | 2
                 log_prob 5 |
        """
        if compute_log_prob:
            self.compute_log_prob()
        params, others = [], []
        for name, site in self.items():
            if site.type == "param":
                params.append((name, tuple(site.value.shape), None))
            elif site.type == "sample":
                event = len(site.fn.event_shape)
                value = tuple(site.value.shape)
                cut = len(value) - event
                others.append(
                    (f"{name} dist", tuple(site.fn.batch_shape), tuple(site.fn.event_shape))
                )
                others.append(("value", value[:cut], value[cut:]))
                if site.log_prob is not None:
                    others.append(("log_prob", tuple(site.log_prob.shape), ()))
            elif site.type == "plate":
                others.append((f"{name} plate", tuple(site.value.shape), ()))
            elif site.type == "deterministic":
                others.append((f"{name} value", tuple(torch.as_tensor(site.value).shape), ()))
            if name == last_site:
                break
        rows = [("Trace Shapes:", (), None), ("Param Sites:", (), None)] + params
        rows += [("Sample Sites:", (), None)] + others
        return _shape_table(rows)

    @property
    def trace(self) -> Trace:
        """Itself: ``with pt.handlers.trace() as tr`` gives the trace (as NumPyro), and
        Pyro's ``tr.trace`` (its messenger's record) reads the same."""
        return self

    @property
    def stochastic_nodes(self) -> list[str]:
        """The latent sample sites' names (Pyro's)."""
        return list(self.sample_sites(observed=False))

    @property
    def observation_nodes(self) -> list[str]:
        """The observed sample sites' names (Pyro's)."""
        return list(self.sample_sites(observed=True))

    @property
    def param_nodes(self) -> list[str]:
        """The params' names (Pyro's)."""
        return [name for name, site in self.items() if site.type == "param"]


def _shape_table(rows: list[tuple[str, tuple, tuple | None]]) -> str:
    """Rows ``(label, batch dims, event dims or None)`` aligned: labels right, batch dims in
    right-aligned columns, ``|``, event dims left-aligned (no ``|`` for None)."""
    nb = max(len(batch) for _, batch, _ in rows)
    ne = max(len(event or ()) for _, _, event in rows)
    label_width = max(len(label) for label, _, _ in rows)
    cells = [[""] * (nb - len(batch)) + [str(d) for d in batch] for _, batch, _ in rows]
    events = [
        [str(d) for d in (event or ())] + [""] * (ne - len(event or ())) for *_, event in rows
    ]
    batch_widths = [max(len(row[i]) for row in cells) for i in range(nb)]
    event_widths = [max(len(row[i]) for row in events) for i in range(ne)]
    lines = []
    for (label, _, event), batch_cells, event_cells in zip(rows, cells, events):
        parts = [label.rjust(label_width)]
        parts += [cell.rjust(width) for cell, width in zip(batch_cells, batch_widths)]
        if event is not None:
            parts.append("|")
            parts += [cell.ljust(width) for cell, width in zip(event_cells, event_widths)]
        lines.append(" ".join(parts).rstrip())
    return "\n".join(lines)


def equal_indices(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two plates' index tensors hold the same rows in the same order; ``None``
    where their values cannot be read (compiled runs: the eager run checked them)."""
    if a is b:
        return True
    if not (readable(a) and readable(b)):
        return None
    return a.shape == b.shape and bool(torch.equal(a, b.to(a.device)))


def _same_given_indices(first: Message, msg: Message) -> bool:
    """Whether two builds of a plate were both given the same indices (``subsample=``)."""
    both_given = first.extra.get("indices_given") and msg.extra.get("indices_given")
    return bool(both_given) and equal_indices(first.value, msg.value) is not False


class trace(Messenger):
    """Record every site of a run in a :class:`Trace`.

    Sample sites are checked eagerly (distribution parameters, observed shapes and
    support) while validation is enabled (:func:`probtorch.enable_validation`).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("x", dist.Normal(0.0, 1.0))
        >>> tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace()
        >>> list(tr)
        ['x']
    """

    def __init__(self, fn: Callable | None = None):
        super().__init__(fn)
        self.trace = Trace()

    @property
    def trace(self) -> Trace:
        """The record of the latest run (one record for every model that one ``trace()``
        handler wraps, as in Pyro)."""
        return (self if self._shared is None else self._shared)._record

    @trace.setter
    def trace(self, record: Trace) -> None:
        (self if self._shared is None else self._shared)._record = record

    def __enter__(self):
        super().__enter__()
        self.trace = Trace()
        return self.trace

    def postprocess_message(self, msg: Message) -> None:
        # (a plate's given indices are recorded too, flagged ``extra["indices_given"]``, so
        # a replay gives the model the guide's rows, as in Pyro)
        if msg.name in self.trace:
            first = self.trace[msg.name]
            if (
                msg.type == "plate"
                and first.type == "plate"
                and msg.value is not first.value
                and not _same_given_indices(first, msg)
            ):
                size, subsample_size = msg.args
                if subsample_size < size:  # another draw: other rows than the trace's
                    raise ValueError(
                        f"plate {msg.name!r} is built twice in one run with "
                        f"subsample_size={subsample_size} of {size}: each build draws its "
                        f"own subsample, and a replay of this trace would give the second "
                        f"the first's rows. Build it once and enter it twice (p = "
                        f"pt.plate(...); with p: ...; with p: ...), or pass subsample=indices"
                    )
            if msg.type in ("plate", "param") and first.type == msg.type:
                # A plate of one name may be built more than once and a param may be read
                # several times (as in Pyro); the first site is kept.
                return
            raise ValueError(
                f"two sites are named {msg.name!r} ({self.trace[msg.name].type} and "
                f"{msg.type}); site names must be unique within one run of the model"
            )
        if msg.type == "sample" and is_validation_enabled():
            check_sample_site(msg)
        self.trace[msg.name] = msg

    def get_trace(self, *args, **kwargs) -> Trace:
        self(*args, **kwargs)
        return self.trace


class seed(Messenger):
    """Give the model random numbers from generators seeded with ``rng_seed``: torch's, and,
    as Pyro's, Python's ``random`` and NumPy's global one (a minibatch a model picks with
    ``np.random`` is reproducible too).

    The generators' states are saved on entry and restored on exit, so a seeded model is
    reproducible and does not disturb the caller's random streams.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> bool(pt.handlers.seed(model, 3)() == pt.handlers.seed(model, 3)())
        True
    """

    provides_randomness = True

    def __init__(self, fn: Callable | None = None, rng_seed: int | None = None):
        if rng_seed is None and fn is not None and not callable(fn):
            fn, rng_seed = None, fn
        if rng_seed is None:
            raise ValueError("seed needs an integer rng_seed")
        super().__init__(fn)
        self.rng_seed = int(rng_seed)
        self._saved: list = []

    def __enter__(self):
        super().__enter__()  # refuses re-entry before the generators' states are saved
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self._saved.append(
            (
                torch.random.get_rng_state(),
                torch.cuda.get_rng_state_all() if cuda else None,
                random.getstate(),
                np.random.get_state(),
            )
        )
        set_rng_seed(self.rng_seed)
        return self

    def __exit__(self, *exc):
        cpu_state, cuda_state, python_state, numpy_state = self._saved.pop()
        torch.random.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        return super().__exit__(*exc)

    def process_message(self, msg: Message) -> None:
        msg.extra["seeded"] = True


class substitute(Messenger):
    """Replace the values of latent sample sites and params by ``data[name]``.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> float(pt.handlers.substitute(model, data={"x": torch.tensor(0.5)})())
        0.5
    """

    def __init__(
        self,
        fn: Callable | None = None,
        data: dict | None = None,
        substitute_fn: Callable[[Message], torch.Tensor | None] | None = None,
    ):
        super().__init__(fn)
        if (data is None) == (substitute_fn is None):
            raise ValueError("substitute needs exactly one of data= or substitute_fn=")
        self.data = data
        self.substitute_fn = substitute_fn

    def process_message(self, msg: Message) -> None:
        if msg.type not in ("sample", "param", "plate") or msg.is_observed:
            return
        if self.data is not None:
            value = self.data.get(msg.name)
        else:
            value = self.substitute_fn(msg)
        if value is not None:
            msg.value = value


def _as_site_value(where: str, name: str, value) -> torch.Tensor:
    """``value`` given to site ``name`` (by a handler or ``obs=``: ``where``), as a tensor;
    an error naming both for what is no number or array."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{where}: the value for site {name!r} must be a tensor, a number or an array "
            f"of numbers, got {type(value).__name__} {value!r:.60} ({error})"
        ) from None


class condition(Messenger):
    """Observe sample sites at ``data[name]``: they become likelihood terms. ``data`` may
    also be a :class:`Trace`, whose sample sites' values are observed (as in Pyro). A value
    ``None`` leaves its site latent, as in Pyro (``data={"y": y}`` with ``y=None`` for a
    prior predictive run).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> conditioned = pt.handlers.condition(model, {"x": torch.tensor(1.0)})
        >>> tr = pt.handlers.trace(conditioned).get_trace()
        >>> tr["x"].is_observed
        True
    """

    def __init__(self, fn: Callable | None = None, data: dict | Trace | None = None):
        super().__init__(fn)
        self.data = {} if data is None else data

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or msg.name not in self.data:
            return
        value = self.data[msg.name]
        if isinstance(self.data, Trace):  # a recorded run, as in Pyro: its sample sites
            if value.type != "sample":
                return
            value = value.value
        if value is None:  # as in Pyro: the site stays latent (a prior predictive run)
            return
        msg.value = _as_site_value("condition", msg.name, value)
        msg.is_observed = True
        msg.extra["conditioned"] = True  # fixed by the user: Predictive keeps the value


class uncondition(Messenger):
    """Draw the observed sample sites instead of observing them (Pyro's
    ``poutine.uncondition``): a model written with ``obs=`` simulates its data. The
    observation stays in the site's ``infer["obs"]`` (with ``infer["was_observed"]``);
    ``pt.factor`` sites, which draw nothing, stay as they are.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model(y):
        ...     return pt.sample("y", dist.Normal(0.0, 1.0), obs=y)
        >>> tr = pt.handlers.trace(pt.handlers.seed(pt.handlers.uncondition(model), 0))
        >>> site = tr.get_trace(torch.tensor(5.0))["y"]
        >>> site.is_observed, float(site.infer["obs"]), bool(site.value != 5.0)
        (False, 5.0, True)
    """

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or not msg.is_observed or msg.infer.get("is_auxiliary"):
            return
        msg.infer = {**msg.infer, "obs": msg.value, "was_observed": True}
        msg.value = None
        msg.is_observed = False


class lift(Messenger):
    """Turn ``pt.param`` sites into sample sites from a prior (Pyro's ``poutine.lift``): a
    model with learnable parameters becomes a Bayesian one.

    ``prior`` is a distribution for every param, or a dict of distributions by param name
    (other params stay params). A param read twice in one run is one site: later reads
    return the first draw.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.param("w", torch.tensor(1.0)) * 2.0
        >>> lifted = pt.handlers.lift(model, prior={"w": dist.Normal(0.0, 1.0)})
        >>> tr = pt.handlers.trace(pt.handlers.seed(lifted, 0)).get_trace()
        >>> tr["w"].type, bool(tr["w"].value != 1.0)
        ('sample', True)
    """

    def __init__(self, fn: Callable | None = None, prior=None):
        super().__init__(fn)
        if isinstance(prior, dict):
            bad = {k: type(v).__name__ for k, v in prior.items() if not _is_distribution(v)}
        else:
            bad = {} if _is_distribution(prior) else {"prior": type(prior).__name__}
        if bad:
            raise TypeError(
                f"lift: prior must be a distribution or a dict of distributions by param "
                f"name; got {bad}"
            )
        self.prior = prior
        self._drawn: dict[str, Message] = {}

    def __enter__(self):
        self._drawn = {}  # one draw per param per run
        return super().__enter__()

    def process_message(self, msg: Message) -> None:
        if msg.type != "param":
            return
        if isinstance(self.prior, dict):
            if msg.name not in self.prior:
                return
            prior = self.prior[msg.name]
        else:
            prior = self.prior
        from .primitives import _sample_default  # (primitives imports this module)

        msg.type, msg.fn, msg.args, msg.kwargs = "sample", prior, (), {}
        msg.default, msg.is_observed = _sample_default, False
        first = self._drawn.get(msg.name)
        if first is not None:  # a second read: the first draw, seen by no further handler
            msg.value, msg.is_observed, msg.stop = first.value, True, True
        else:
            self._drawn[msg.name] = msg


def _is_distribution(value) -> bool:
    return isinstance(value, torch.distributions.Distribution)


class block(Messenger):
    """Hide sites from the handlers outside this one (all sites unless told otherwise).

    As in Pyro, a site is hidden if its name is in ``hide``, or its type in ``hide_types``,
    or if it is neither in ``expose`` nor of a type in ``expose_types`` while ``hide_all``
    holds; for this an observed sample site has the type ``"observe"``, and a plate's
    subsample site both ``"plate"`` and ``"sample"`` (Pyro's type for it). ``hide_all`` is
    True unless ``expose_all`` is, and is then set by each of ``hide`` (False), ``expose``
    (True), ``hide_types`` (False), ``expose_types`` (True) that is given, in this order.
    ``hide_fn(msg)`` (or ``expose_fn(msg)``, its negation) replaces the rule.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("a", dist.Normal(0.0, 1.0))
        ...     pt.sample("b", dist.Normal(0.0, 1.0))
        ...     pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
        >>> seeded = pt.handlers.seed(model, rng_seed=0)
        >>> list(pt.handlers.trace(pt.handlers.block(seeded, hide=["a"])).get_trace())
        ['b', 'y']
        >>> list(pt.handlers.trace(pt.handlers.block(seeded, hide_types=["observe"])).get_trace())
        ['a', 'b']
    """

    def __init__(
        self,
        fn: Callable | None = None,
        hide_fn: Callable[[Message], bool] | None = None,
        expose_fn: Callable[[Message], bool] | None = None,
        hide_all: bool | None = None,
        expose_all: bool = False,
        hide: Iterable[str] | None = None,
        expose: Iterable[str] | None = None,
        hide_types: Iterable[str] | None = None,
        expose_types: Iterable[str] | None = None,
    ):
        super().__init__(fn)
        if hide_fn is not None and expose_fn is not None:
            raise ValueError("block: give only one of hide_fn or expose_fn")
        if hide_fn is not None:
            self.hide_fn = hide_fn
        elif expose_fn is not None:
            self.hide_fn = lambda msg: not expose_fn(msg)
        else:
            self.hide_fn = _block_rule(hide_all, expose_all, hide, expose, hide_types, expose_types)

    def process_message(self, msg: Message) -> None:
        if self.hide_fn(msg):
            msg.stop = True


def _block_rule(hide_all, expose_all, hide, expose, hide_types, expose_types):
    """Pyro's default ``hide_fn`` of ``block`` (its ``_make_default_hide_fn``)."""
    if hide_all is None:
        hide_all = not expose_all  # (Pyro asks for hide_all=False with expose_all=True)
    elif hide_all and expose_all:
        raise ValueError("block: hide_all and expose_all cannot both be True")
    if hide is not None:
        hide_all = False
    if expose is not None:
        hide_all = True
    if hide_types is not None:
        hide_all = False
    if expose_types is not None:
        hide_all = True
    hide = frozenset(() if hide is None else hide)
    expose = frozenset(() if expose is None else expose)
    hide_types = frozenset(() if hide_types is None else hide_types)
    expose_types = frozenset(() if expose_types is None else expose_types)
    if hide & expose:
        raise ValueError(f"block: cannot hide and expose a site: {sorted(hide & expose)}")
    if hide_types & expose_types:
        raise ValueError(
            f"block: cannot hide and expose a site type: {sorted(hide_types & expose_types)}"
        )

    def hide_fn(msg: Message) -> bool:
        msg_type = "observe" if msg.type == "sample" and msg.is_observed else msg.type
        # a plate's subsample site is a "sample" site in Pyro: expose_types=["sample"] must
        # expose it, or a blocked guide's rows would not reach the model
        types = {msg_type, "sample"} if msg_type == "plate" else {msg_type}
        if msg.name in hide or types & hide_types:
            return True
        return hide_all and msg.name not in expose and not types & expose_types

    return hide_fn


class replay(Messenger):
    """Give latent sample sites (and plate indices) the values recorded in ``trace``.

    As in Pyro, a replayed sample site takes the ``infer`` dict of the trace's site (a
    copy), and a site observed in ``trace`` cannot be replayed into a latent one.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     return pt.sample("x", dist.Normal(0.0, 1.0))
        >>> tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=1)).get_trace()
        >>> bool(pt.handlers.replay(model, trace=tr)() == tr["x"].value)
        True
    """

    def __init__(self, fn: Callable | None = None, trace: Trace | None = None):
        super().__init__(fn)
        if trace is None:
            raise ValueError("replay needs a trace")
        self.trace = trace

    def process_message(self, msg: Message) -> None:
        if msg.type not in ("sample", "plate") or msg.is_observed or msg.name not in self.trace:
            return
        guide_site = self.trace[msg.name]
        if guide_site.type != msg.type:
            raise ValueError(
                f"replay: site {msg.name!r} is a {msg.type} site in the model but a "
                f"{guide_site.type} site in the replayed trace"
            )
        if guide_site.is_observed:
            raise ValueError(
                f"replay: site {msg.name!r} must be sampled in trace, but it is observed "
                f"there (a latent site of the model cannot take an observed value)"
            )
        msg.value = guide_site.value
        if msg.type == "sample":
            msg.infer = dict(guide_site.infer)  # as in Pyro (a copy: the trace's stays)


def _check_scale(scale) -> None:
    if isinstance(scale, torch.Tensor):
        # a tensor scale is checked where its values can be read: on eager runs (the first
        # run of a model), not inside a compiled sampler that takes it as an input
        if readable(scale) and not bool(torch.all(scale > 0)):
            bad = (~(scale > 0)).nonzero()
            shown = ", ".join(
                f"{tuple(i.tolist()) if len(i) > 1 else int(i[0]) if len(i) else '()'}: "
                f"{float(scale[tuple(i)]):g}"
                for i in bad[:5]
            )
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise ValueError(
                f"scale must be positive; the tensor of shape {tuple(scale.shape)} has "
                f"{len(bad)} entries at or below 0 (index: value) {shown}{more}"
            )
    elif not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")


class scale(Messenger):
    """Multiply the log densities of sample sites by ``scale`` (e.g. a minibatch factor).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
        >>> tr = pt.handlers.trace(pt.handlers.scale(model, scale=2.0)).get_trace()
        >>> round(float(tr.log_prob_sum()), 4)
        -1.8379
    """

    def __init__(self, fn: Callable | None = None, scale: float | torch.Tensor = 1.0):
        super().__init__(fn)
        _check_scale(scale)
        self.scale = scale

    def process_message(self, msg: Message) -> None:
        if msg.type == "sample":
            msg.scale = self.scale if msg.scale is None else self.scale * msg.scale


class mask(Messenger):
    """Zero the log densities of sample sites where ``mask`` is False.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     with pt.plate("data", 2):
        ...         pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(2))
        >>> masked = pt.handlers.mask(model, mask=torch.tensor([True, False]))
        >>> tr = pt.handlers.trace(masked).get_trace()
        >>> tr.log_densities()["y"][1].item()
        0.0
    """

    def __init__(self, fn: Callable | None = None, mask: bool | torch.Tensor = True):
        super().__init__(fn)
        if isinstance(mask, torch.Tensor) and mask.dtype != torch.bool:
            raise ValueError(f"mask must be a bool tensor, got dtype {mask.dtype}")
        if not isinstance(mask, (bool, torch.Tensor)):
            raise TypeError(
                f"mask must be True, False or a bool tensor (as in Pyro), got "
                f"{type(mask).__name__} {mask!r}"
            )
        self.mask = mask

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample":
            return
        if msg.mask is None:
            msg.mask = self.mask
        elif isinstance(msg.mask, bool) and isinstance(self.mask, bool):
            msg.mask = msg.mask and self.mask
        else:
            msg.mask = torch.as_tensor(msg.mask) & torch.as_tensor(self.mask)


class infer_config(Messenger):
    """Update each sample site's (observed ones too) and param's ``infer`` dict with
    ``config_fn(msg)`` (Pyro's ``poutine.infer_config``).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("k", dist.Bernoulli(0.5))
        >>> marked = pt.handlers.infer_config(model, lambda msg: {"enumerate": "parallel"})
        >>> pt.handlers.trace(pt.handlers.seed(marked, 0)).get_trace()["k"].infer
        {'enumerate': 'parallel'}
    """

    def __init__(self, fn: Callable | None = None, config_fn: Callable | None = None):
        super().__init__(fn)
        if config_fn is None:
            raise TypeError("infer_config needs config_fn, a function msg -> dict")
        self.config_fn = config_fn

    def process_message(self, msg: Message) -> None:
        if msg.type in ("sample", "param"):
            msg.infer = {**msg.infer, **self.config_fn(msg)}  # (not the caller's dict)


def config_enumerate(
    fn: Callable | None = None, default: str = "parallel", expand: bool = False, **options
):
    """Mark every discrete latent site of ``fn`` whose values can be listed
    (``has_enumerate_support``) ``infer={"enumerate": default}``, unless it is marked
    already (Pyro's ``config_enumerate``; a decorator, with or without arguments).

    TraceEnum_ELBO then takes the exact expectation over such a guide site's values, and
    sums such model sites out (as it does unmarked ones, as HMC/NUTS do). Only parallel
    enumeration is done: a site marked ``"sequential"`` is refused by name where it is
    enumerated. ``expand`` is accepted for Pyro's signature; values are never expanded.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> @pt.handlers.config_enumerate
        ... def guide():
        ...     pt.sample("k", dist.Categorical(torch.ones(3) / 3))
        ...     pt.sample("x", dist.Normal(0.0, 1.0))
        >>> tr = pt.handlers.trace(pt.handlers.seed(guide, 0)).get_trace()
        >>> tr["k"].infer, tr["x"].infer
        ({'enumerate': 'parallel'}, {})
    """
    options = {name: value for name, value in options.items() if value is not None}
    if options:
        unknown = sorted(options)
        hint = " (Monte Carlo enumeration is not done)" if "num_samples" in options else ""
        raise NotImplementedError(f"config_enumerate: options {unknown} are not supported{hint}")
    if default not in ("parallel", "sequential", None):
        raise ValueError(
            f"config_enumerate: default must be 'parallel', 'sequential' or None, got {default!r}"
        )
    if fn is None:
        return lambda fn: config_enumerate(fn, default=default, expand=expand)

    def config(msg: Message) -> dict:
        latent = msg.type == "sample" and not msg.is_observed
        if not (latent and getattr(msg.fn, "has_enumerate_support", False)):
            return {}
        return {"enumerate": msg.infer.get("enumerate", default)}

    return infer_config(fn, config)


class do(Messenger):
    """Intervene: set sample sites to ``data[name]`` and cut their dependence on parents.

    The site ``name`` is still drawn as usual (so its density is unchanged); the
    intervened value is recorded as the observed site ``f"{name}__CF"`` and is what the
    rest of the model sees.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     x = pt.sample("x", dist.Normal(0.0, 1.0))
        ...     return pt.sample("y", dist.Normal(x, 1.0))
        >>> intervened = pt.handlers.do(model, data={"x": torch.tensor(10.0)})
        >>> tr = pt.handlers.trace(pt.handlers.seed(intervened, 0)).get_trace()
        >>> float(tr["y"].fn.loc)
        10.0
    """

    def __init__(self, fn: Callable | None = None, data: dict | None = None):
        super().__init__(fn)
        self.data = {} if data is None else data

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or self.data.get(msg.name) is None:
            return  # (a value None intervenes on nothing, as in Pyro)
        value = _as_site_value("do", msg.name, self.data[msg.name])
        # The unintervened site goes on to the outer handlers under its own name.
        original = msg.copy()
        apply_stack(original, outside_of=self)
        msg.name = msg.name + "__CF"
        msg.value = value
        msg.is_observed = True
        msg.stop = True


class reparam(Messenger):
    """Rewrite sample sites with a :class:`~probtorch.reparam.Reparam` (non-centering, ...).

    ``config`` maps site names to reparameterizers, or is a callable ``msg -> Reparam|None``.
    The original site becomes a deterministic site whose value is computed from the new
    auxiliary sites.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.reparam import LocScaleReparam
        >>> def model():
        ...     return pt.sample("x", dist.Normal(1.0, 2.0))
        >>> m = pt.handlers.reparam(model, config={"x": LocScaleReparam(0.0)})
        >>> tr = pt.handlers.trace(pt.handlers.seed(m, 0)).get_trace()
        >>> list(tr), tr["x"].type
        (['x_decentered', 'x'], 'deterministic')
    """

    def __init__(self, fn: Callable | None = None, config=None):
        super().__init__(fn)
        if config is None:
            raise ValueError("reparam needs a config: a dict of site names or a callable")
        self.config = config

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample":
            return
        if isinstance(self.config, dict):
            reparameterizer = self.config.get(msg.name)
        else:
            reparameterizer = self.config(msg)
        if reparameterizer is None:
            return
        sample_shape = tuple(msg.kwargs.get("sample_shape", ()))
        if sample_shape:  # (Pyro's and NumPyro's reparameterizers drop it silently)
            raise ValueError(
                f"reparam: site {msg.name!r} has sample_shape {sample_shape}, which a "
                f"reparameterizer would drop; expand its distribution instead "
                f"(fn.expand({list(sample_shape)} + batch_shape), in a plate)"
            )
        new_fn, value = reparameterizer(msg.name, msg.fn, msg.value if msg.is_observed else None)
        if value is not None:
            if new_fn is None:
                msg.type = "deterministic"
                msg.kwargs = {"event_dim": len(msg.fn.event_shape)}
                msg.fn = None
                msg.value = value
                msg.is_observed = False
                msg.default = None
                return
            # (as Pyro's and NumPyro's: a value with a distribution, typically a Delta
            # whose log_density holds the Jacobian, is an observed factor)
            msg.value = value
            msg.is_observed = True
        msg.fn = new_fn
