"""``infer_discrete``: a model whose discrete latent sites are drawn from their posterior.

Pyro's ``pyro.infer.infer_discrete`` (and NumPyro's): the model runs with each discrete
site that HMC/NUTS would sum out given a value drawn from its conditional distribution
given the data and the model's other sites (``temperature=1``), or their most probable
joint value (``temperature=0``, Viterbi's algorithm for a ``pt.markov`` chain).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

from ..handlers import block, condition, do, replay, substitute, trace
from ..primitives import RandomnessError
from ..runtime import Message, Messenger, get_stack
from .enumeration import enumerable
from .potential import Potential
from .provenance import Provenance, sources, tracking

__all__ = ["infer_discrete"]


def _is_discrete_latent(msg: Message) -> bool:
    """A latent sample site that NUTS sums out (a finite support)."""
    return msg.type == "sample" and not msg.is_observed and enumerable(msg)


def _first_value(msg: Message) -> torch.Tensor | None:
    """A placeholder value for a discrete latent site in the pass that reads the others,
    tracked (:class:`~.provenance.Provenance`): what is computed from it is found."""
    if msg.value is not None or not _is_discrete_latent(msg):
        return None
    support = msg.fn.enumerate_support(expand=True)
    return Provenance(support[0].expand(msg.fn.batch_shape + msg.fn.event_shape), {msg.name})


class _NoteDrawn(Messenger):
    """Note the latent sites that no handler inside the model gave a value (drawn)."""

    def __init__(self, fn: Callable):
        super().__init__(fn)
        self.drawn: set[str] = set()

    def process_message(self, msg: Message) -> None:
        if msg.type == "sample" and not msg.is_observed and msg.value is None:
            self.drawn.add(msg.name)


# Handlers outside infer_discrete that give sites values: its reading pass does not see them
_VALUE_HANDLERS = (condition, substitute, replay, do)


def _check_outer_handlers() -> None:
    outer = sorted({type(h).__name__ for h in get_stack() if isinstance(h, _VALUE_HANDLERS)})
    if outer:
        raise ValueError(
            f"infer_discrete runs inside {outer}: its reading pass does not see handlers "
            f"outside it, so the discrete sites would be drawn given other values than the "
            f"run shows; put them inside, infer_discrete({outer[0]}(model, ...)) (for MCMC "
            f"draws, Predictive(model, samples, infer_discrete=True))"
        )


def _check_drawn(values, drawn: set, escaped: set) -> None:
    """A continuous site drawn in the reading pass from a distribution computed from a
    discrete site's placeholder would be a draw given that placeholder, not given the
    discrete site's posterior: refused (give it a value inside the model)."""
    for name in values:
        site = values[name]
        if name not in drawn or _is_discrete_latent(site):
            continue
        parents = sorted(sources(site.value) | escaped)
        if parents:
            raise ValueError(
                f"infer_discrete: continuous latent site {name!r} is drawn from its "
                f"distribution, which depends on the discrete site(s) {parents}; give it a "
                f"value inside the model (pt.handlers.replay(model, trace=guide_trace), "
                f"condition), as Pyro's infer_discrete expects"
            )


def _seeded() -> bool:
    return any(handler.provides_randomness for handler in get_stack())


def _sample_posterior(
    fn: Callable, temperature: int, strict_enumeration_warning: bool, *args, **kwargs
):
    # One pass hidden from the handlers outside (an outer trace sees only the final run):
    # the values of the continuous latent sites (replayed, conditioned or drawn inside
    # ``fn``), with the discrete ones at a placeholder; then their conditional draw.
    _check_outer_handlers()
    with block(hide_fn=lambda msg: msg.type != "param"):
        noted = _NoteDrawn(fn)
        placeholders = substitute(noted, substitute_fn=_first_value)
        with torch.no_grad(), tracking() as escaped:
            values = trace(placeholders).get_trace(*args, **kwargs)
        _check_drawn(values, noted.drawn, escaped)
        if not any(_is_discrete_latent(site) for site in values.values()):
            if strict_enumeration_warning:
                warnings.warn(
                    "infer_discrete found no discrete latent site to draw: the model runs as it is",
                    stacklevel=3,
                )
            return fn(*args, **kwargs)
        try:
            potential = Potential(fn, args, kwargs, compile=False)
        except ValueError as error:
            if "subsample" not in str(error):
                raise
            raise ValueError(
                f"infer_discrete sums the discrete sites out over the full data: {error}"
            ) from error
        if temperature == 1 and not _seeded():
            names = sorted(potential.enumerated)
            raise RandomnessError(
                f"infer_discrete(temperature=1) draws the discrete site(s) {names}, which "
                f"needs random numbers, but no seed handler is active: wrap it, "
                f"probtorch.handlers.seed(infer_discrete(model), rng_seed=0)(*args), or "
                f"take their most probable value with temperature=0"
            )
        seed = int(torch.randint(0, 2**62, ()).item()) if temperature == 1 else 0
        continuous = {name: values[name].value for name in potential.site_names}
        batched = {name: value.unsqueeze(0) for name, value in continuous.items()}
        drawn = potential.sample_discrete(batched, seed=seed, temperature=temperature)
    discrete = {name: value.squeeze(0) for name, value in drawn.items()}
    return substitute(fn, data={**continuous, **discrete})(*args, **kwargs)


def infer_discrete(
    fn: Callable | None = None,
    first_available_dim: int | None = None,
    temperature: int = 1,
    *,
    strict_enumeration_warning: bool = True,
) -> Callable:
    """The model ``fn`` with its discrete latent sites drawn from their posterior given the
    data and its other sites, as Pyro's ``infer_discrete``.

    The discrete sites are those NUTS sums out (a finite support; no
    ``config_enumerate`` needed). Each call runs ``fn`` once hidden from the handlers
    around it, to read the values of its continuous latent sites (replayed or
    conditioned inside ``fn``, as ``replay(model, guide_trace)``, or drawn from their
    prior), sums the discrete ones out, and runs ``fn`` again with the discrete sites at a
    joint draw from their conditional distribution (``temperature=1``; it needs a
    ``pt.handlers.seed`` around) or at their most probable joint value
    (``temperature=0``) and the continuous ones at the values read. An outer ``trace``
    records that last run: the discrete sites are latent sites holding the values drawn.
    A continuous site drawn in ``fn`` from a distribution computed from a discrete site,
    handlers that give values from outside (``condition(infer_discrete(model))``: put them
    inside) and a subsampled plate are refused, naming them.
    ``first_available_dim`` is accepted for Pyro's code and not needed: the
    enumeration dims are chosen left of the model's plates. To draw the discrete sites
    for every draw of an MCMC run, use ``Predictive(model, samples, infer_discrete=True)``.

    Example (the most probable component of each point of a two-component mixture)::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def mixture(y):
        ...     with pt.plate("data", len(y)):
        ...         z = pt.sample("z", dist.Bernoulli(0.5))
        ...         pt.sample("y", dist.Normal(4.0 * z - 2.0, 1.0), obs=y)
        >>> viterbi = infer_discrete(mixture, first_available_dim=-2, temperature=0)
        >>> tr = pt.handlers.trace(viterbi).get_trace(torch.tensor([-2.5, 1.5, 0.3]))
        >>> tr["z"].value
        tensor([0., 1., 1.])
    """
    if first_available_dim is not None and (
        isinstance(first_available_dim, bool)
        or not isinstance(first_available_dim, int)
        or first_available_dim >= 0
    ):
        raise ValueError(
            f"infer_discrete: first_available_dim must be a negative integer (a dim counted "
            f"from the right), got {first_available_dim!r}"
        )
    if temperature not in (0, 1) or isinstance(temperature, bool):
        raise ValueError(
            f"infer_discrete: temperature must be 1 (draw) or 0 (most probable value), got "
            f"{temperature!r}"
        )
    if fn is None:  # as a decorator
        return functools.partial(
            infer_discrete,
            first_available_dim=first_available_dim,
            temperature=temperature,
            strict_enumeration_warning=strict_enumeration_warning,
        )
    return functools.wraps(fn)(
        functools.partial(_sample_posterior, fn, temperature, strict_enumeration_warning)
    )
