"""Discrete latent sites summed out of a model's log density, as Pyro's and NumPyro's HMC do.

HMC and NUTS move continuous latent values only. A discrete latent site whose distribution
has a finite support (``Bernoulli``, ``Categorical``, ``Binomial``, ...) is enumerated in
parallel instead: :class:`EnumerateSites` sets its value to its whole support, laid along
a batch dimension of its own to the left of the model's plates (the first such site at
``-(max_plate_nesting + 1)``, the next one left of it, ...), so that every log density that
depends on it broadcasts over its values. :func:`sum_out` then sums those dimensions out of
the product of all factors (log-sum-exp in log space) by variable elimination over the
plates: a discrete site local to a plate is summed out before the product over that plate,
a global one after it (tensor variable elimination, Obermeyer et al. 2019, the algorithm of
``pyro.ops.contract``). The result is the model's log density with the discrete sites
marginalized: a smooth function of the continuous ones, which NUTS samples. Models whose
discrete sites couple two plates that are not nested (a site in plate ``a`` and one in
plate ``b`` read together in plates ``a`` and ``b``) have no such elimination order and
are refused.

Example::

    >>> import torch, probtorch as pt, probtorch.distributions as dist
    >>> from probtorch.handlers import trace
    >>> def model():
    ...     z = pt.sample("z", dist.Bernoulli(0.25))
    ...     with pt.plate("data", 2):
    ...         pt.sample("y", dist.Normal(3.0 * z, 1.0), obs=torch.tensor([0.1, 2.9]))
    >>> collect = CollectFactors()
    >>> with collect, EnumerateSites({"z"}, first_dim=-2):
    ...     model()
    >>> normal = dist.Normal(torch.tensor([[0.0], [3.0]]), 1.0)
    >>> by_hand = torch.logsumexp(
    ...     torch.tensor([0.75, 0.25]).log() + normal.log_prob(torch.tensor([0.1, 2.9])).sum(-1), 0
    ... )
    >>> torch.allclose(sum_out(collect.factors, plate_nesting=1), by_hand)
    True
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import torch

from ..handlers import site_log_prob
from ..runtime import Message, Messenger

__all__ = [
    "EnumerateSites",
    "CollectFactors",
    "Factor",
    "enumerable",
    "plate_nesting",
    "sum_out",
    "pointwise_log_likelihood",
]


MAX_DIMS = 62  # of one chain's tensors: torch's 64, less the chains' and one to spare


def enumerable(site: Message) -> bool:
    """Whether a latent site is discrete and can be summed out by parallel enumeration."""
    return (
        site.fn.support.is_discrete
        and bool(getattr(site.fn, "has_enumerate_support", False))
        and site.infer.get("enumerate", "parallel") == "parallel"
    )


def plate_nesting(sites: Iterable[Message]) -> int:
    """How many batch dimensions the model's plates take (``-min(dim)``, 0 without)."""
    dims = [frame.dim for site in sites for frame in site.cond_indep_stack]
    return -min(dims) if dims else 0


@dataclass(frozen=True)
class Factor:
    """One site's log density, with the plates it lies in (name -> (dim, subsample size,
    size)). A subsampled plate's scale (size / subsample size) is applied where the
    product over the plate is taken, after the sum over the discrete sites local to it,
    so that the estimate stays unbiased; only a scale of the user's (``pt.handlers.scale``)
    is in ``log_prob``."""

    name: str
    log_prob: torch.Tensor
    plates: dict[str, tuple[int, int, int]]
    observed: bool

    @classmethod
    def of_site(
        cls, msg: Message, log_prob: torch.Tensor | None = None, apply_scale: bool = True
    ) -> Factor:
        """The site's factor; its log density (masked, and scaled by the user's scale with
        ``apply_scale``) unless ``log_prob`` is given."""
        plates = {f.name: (f.dim, f.subsample_size, f.size) for f in msg.cond_indep_stack}
        if log_prob is None:
            # a summed-out site's values do not vary along its plates: its density from the
            # distribution before the plates broadcast it (size 1 along them, which the
            # product over a plate counts ``size`` times) is the same, for less work (the
            # gradient of a Categorical's normalized probabilities per element of the plate
            # took 70 % of a compiled mixture's)
            fn = msg.extra.get("unexpanded_fn") if msg.extra.get("enumerated") else None
            log_prob = site_log_prob(msg, apply_scale=False, fn=fn)
            if apply_scale and msg.scale is not None:
                log_prob = (msg.scale / _plate_scale(plates.values())) * log_prob
        return cls(msg.name, log_prob, plates, msg.is_observed)


def _plate_scale(plates: Iterable[tuple[int, int, int]]) -> float:
    scale = 1.0
    for _, subsample_size, size in plates:
        scale *= size / subsample_size if subsample_size else 1.0
    return scale


class EnumerateSites(Messenger):
    """Set each named discrete site to its whole support, along a dimension of its own.

    The ``k``-th site reached takes dimension ``first_dim - k``; ``sizes`` maps each
    dimension to the size of its support once the model has run.
    """

    def __init__(self, names: Collection[str], first_dim: int):
        super().__init__()
        self.names = names
        self.first_dim = first_dim
        self.sizes: dict[int, int] = {}
        self.site_dims: dict[str, int] = {}
        self.supports: dict[str, torch.Tensor] = {}

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample" or msg.name not in self.names or msg.is_observed:
            return
        dim = self.first_dim - len(self.sizes)
        if -dim + len(msg.fn.event_shape) > MAX_DIMS:
            raise ValueError(
                f"site {msg.name!r} is discrete site number {len(self.sizes) + 1} to be summed "
                f"out, along dim {dim}; torch tensors have at most 64 dims (one of them for the "
                f"chains). Each discrete site takes a dim of its own (probtorch has no "
                f"pyro.markov to reuse them along a chain): marginalize a long chain in the "
                f"model, e.g. with Pyro's DiscreteHMM distribution or a forward recursion "
                f"in pt.factor"
            )
        support = msg.fn.enumerate_support(expand=False)
        size = support.shape[0]
        event_shape = tuple(msg.fn.event_shape)
        msg.value = support.reshape((size,) + (1,) * (-dim - 1) + event_shape)
        msg.extra["enumerated"] = True
        self.sizes[dim] = size
        self.site_dims[msg.name] = dim
        self.supports[msg.name] = support


class CollectFactors(Messenger):
    """Keep every sample site's log density (masked, and scaled unless ``apply_scale`` is
    False) with its plates."""

    def __init__(self, apply_scale: bool = True):
        super().__init__()
        self.apply_scale = apply_scale
        self.factors: list[Factor] = []

    def postprocess_message(self, msg: Message) -> None:
        if msg.type == "sample":
            self.factors.append(Factor.of_site(msg, apply_scale=self.apply_scale))


def _checked(factor: Factor, ndim: int, nesting: int, sizes: dict[int, int]) -> torch.Tensor:
    """The factor's log density with ``ndim`` dimensions, after checking that each of its
    batch dimensions is one of its plates' or an enumerated site's."""
    log_prob = factor.log_prob
    if log_prob.dim() > ndim:
        raise ValueError(_shape_error(factor, nesting, sizes, -log_prob.dim()))
    log_prob = log_prob.reshape((1,) * (ndim - log_prob.dim()) + tuple(log_prob.shape))
    plate_sizes = {dim: size for dim, size, _ in factor.plates.values()}
    for dim in range(-ndim, 0):
        size = log_prob.shape[dim]
        allowed = sizes.get(dim) if dim < -nesting else plate_sizes.get(dim)
        if size != 1 and size != allowed:
            raise ValueError(_shape_error(factor, nesting, sizes, dim))
    return log_prob


def _shape_error(factor: Factor, nesting: int, sizes: dict[int, int], dim: int) -> str:
    plates = ", ".join(f"{name!r} at dim {d}" for name, (d, _, _) in factor.plates.items())
    return (
        f"site {factor.name!r} has log density shape {tuple(factor.log_prob.shape)}, whose "
        f"dim {dim} is neither one of its plates' ({plates or 'none'}) nor a dimension of "
        f"an enumerated discrete site (dims {sorted(sizes, reverse=True)}, left of the "
        f"model's {nesting} plate dims). The model has discrete latent sites that are "
        f"summed out, and then every batch dimension must be declared: put the site in a "
        f"pt.plate, or move the dimension into the event with .to_event()"
    )


def _enum_dims(term: torch.Tensor, sizes: dict[int, int]) -> frozenset[int]:
    return frozenset(d for d in sizes if term.shape[d] > 1)


def _product(term: torch.Tensor, plates: Iterable[tuple[int, int, int]]) -> torch.Tensor:
    """The log of the product over plates: a sum along each plate dimension (a term
    constant along it counts ``subsample size`` times), scaled by a subsampled plate's
    ``size / subsample size``."""
    plates = sorted(plates)
    for dim, subsample_size, _ in plates:
        if term.shape[dim] == 1:
            term = term * subsample_size
        else:
            term = term.sum(dim, keepdim=True)
    scale = _plate_scale(plates)
    return term if scale == 1.0 else term * scale


def _add(terms: list[torch.Tensor]) -> torch.Tensor:
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _intermediate_size(terms: list[torch.Tensor], dim: int) -> int:
    shapes = [t.shape for t in terms if t.shape[dim] > 1]
    return math.prod(torch.broadcast_shapes(*shapes)) if shapes else 0


def _sumproduct(
    terms: list[torch.Tensor], dims: Iterable[int], maximize: bool = False
) -> torch.Tensor:
    """The log of the product of ``terms`` with ``dims`` summed out, one dimension at a
    time (variable elimination): each time the dimension whose terms make the smallest
    intermediate, so that a chain of sites (``z[t]`` drawn given ``z[t - 1]``) costs
    linearly in its length, not exponentially."""
    terms, dims = list(terms), set(dims)
    while dims:
        dim, best = None, None
        for candidate in sorted(dims):  # (a loop, not min(key=): Dynamo traces it)
            size = _intermediate_size(terms, candidate)
            if best is None or size < best:
                dim, best = candidate, size
        dims.remove(dim)
        involved = [t for t in terms if t.shape[dim] > 1]
        if not involved:
            continue
        terms = [t for t in terms if t.shape[dim] == 1]
        total = _add(involved)
        if maximize:  # max-product: the best assignment's log density (MAP decoding)
            terms.append(torch.amax(total, dim=dim, keepdim=True))
        else:
            terms.append(torch.logsumexp(total, dim=dim, keepdim=True))
    return _add(terms)


def _components(terms: list, dims: set[int], sizes: dict[int, int], key=lambda t: t) -> list:
    """Partition ``terms`` into groups connected by shared dimensions among ``dims``
    (``key`` gives a term's tensor); returns ``(group, its dims)`` pairs in order."""
    groups: list[tuple[list, set[int]]] = []
    for term in terms:
        mine = set(_enum_dims(key(term), sizes) & dims)
        merged: tuple[list, set[int]] = ([], set())
        kept = []
        for group in groups:  # (by position: terms are tensors, which == cannot compare)
            if group[1] & mine:
                merged[0].extend(group[0])
                merged[1].update(group[1])
            else:
                kept.append(group)
        merged[0].append(term)
        merged[1].update(mine)
        groups = kept + [merged]
    return groups


def _eliminate(tree: dict[frozenset, list], sizes, frames, names, maximize=False) -> list:
    """Sum out every enumerated dimension of a connected group of terms, leaf plates first;
    returns ``(ordinal, term)`` pairs with no enumerated dimension left."""
    dim_ordinal: dict[int, frozenset] = {}
    for ordinal, terms in tree.items():
        for term in terms:
            for dim in _enum_dims(term, sizes):
                dim_ordinal[dim] = dim_ordinal.get(dim, ordinal) & ordinal
    pending: dict[frozenset, set[int]] = {}
    for dim, ordinal in dim_ordinal.items():
        pending.setdefault(ordinal, set()).add(dim)
    root = frozenset.intersection(*tree)
    while any(pending.values()):
        leaf = None
        for ordinal in tree:  # the first deepest ordinal (a loop: Dynamo traces it)
            if leaf is None or len(ordinal) > len(leaf):
                leaf = ordinal
        terms = tree.pop(leaf)
        local = pending.pop(leaf, set())
        for group, dims in _components(terms, local, sizes):
            term = _sumproduct(group, dims, maximize)
            left = _enum_dims(term, sizes)
            parents = [o for o, ds in pending.items() if ds & left]
            parent = frozenset.union(*parents) if parents else root
            if leaf != root:
                if parent == leaf:
                    raise ValueError(_intractable(leaf, left, names))
                term = _product(term, (frames[p] for p in leaf - parent))
            tree.setdefault(parent, []).append(term)
    return [(ordinal, term) for ordinal, terms in tree.items() for term in terms]


def _intractable(leaf: frozenset, dims: Iterable[int], names: dict[int, str]) -> str:
    sites = ", ".join(repr(names.get(d, f"dim {d}")) for d in sorted(dims, reverse=True))
    return (
        f"the discrete sites {sites} are summed out, but they are read together in plates "
        f"{sorted(leaf)} that are not nested inside one another: no order of summing them "
        f"out is tractable. Use a Python loop (sequential) for one of those plates, or "
        f"marginalize those sites in the model by hand"
    )


def sum_out(
    factors: list[Factor],
    plate_nesting: int,
    sizes: dict[int, int] | None = None,
    names: dict[int, str] | None = None,
    keep: Collection[str] = (),
    target: Collection[int] = (),
    maximize: bool = False,
) -> torch.Tensor:
    """The log of the product of ``factors`` with the enumerated dimensions summed out.

    ``sizes``: support size per enumerated dimension (found from the factors' shapes left of
    the ``plate_nesting`` plate dimensions when omitted); ``names``: the enumerated site per
    dimension, for messages. Plates named in ``keep`` are not multiplied out: the result
    keeps their dimensions (a pointwise log likelihood), as its ``plate_nesting`` trailing
    dimensions; otherwise it is a scalar. Enumerated dimensions in ``target`` are not summed
    out either (a conditional distribution of their sites): the result then has all of the
    factors' dimensions. With ``maximize``, the enumerated dimensions are maxed out instead
    of summed (max-product: the log density of the best assignment).
    """
    ndim = max([plate_nesting] + [f.log_prob.dim() for f in factors])
    if sizes is None:
        sizes = {}
        for f in factors:
            shape = f.log_prob.shape
            for dim in range(-f.log_prob.dim(), -plate_nesting):
                if shape[dim] > 1:
                    sizes[dim] = shape[dim]
    names = names or {}
    checked_sizes, sizes = sizes, {d: n for d, n in sizes.items() if d not in target}
    frames: dict[str, tuple[int, int, int]] = {}
    tree: dict[frozenset, list] = {}
    for factor in factors:
        frames.update(factor.plates)
        term = _checked(factor, ndim, plate_nesting, checked_sizes)
        ordinal = frozenset(factor.plates) - frozenset(keep)
        tree.setdefault(ordinal, []).append(term)

    total = None
    pairs = [(ordinal, term) for ordinal, terms in tree.items() for term in terms]
    for group, dims in _components(pairs, set(sizes), sizes, key=lambda pair: pair[1]):
        if not dims and not keep and not target:  # as the log joint sums it
            for ordinal, term in group:
                scale = _plate_scale(frames[p] for p in ordinal)
                term = term.sum() if scale == 1.0 else term.sum() * scale
                total = term if total is None else total + term
            continue
        subtree: dict[frozenset, list] = {}
        for ordinal, term in group:
            subtree.setdefault(ordinal, []).append(term)
        for ordinal, term in _eliminate(subtree, sizes, frames, names, maximize):
            term = _product(term, (frames[p] for p in ordinal))
            total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    if target:
        return total
    if not keep:
        return total.sum()
    return total.reshape(total.shape[total.dim() - plate_nesting :])


def _enumerated_in(factor: Factor, nesting: int) -> bool:
    shape = factor.log_prob.shape
    return any(size > 1 for size in shape[: max(len(shape) - nesting, 0)])


def pointwise_log_likelihood(
    factors: list[Factor],
    observed: Iterable[str],
    plate_nesting: int,
    sizes: dict[int, int],
    names: dict[int, str] | None = None,
) -> dict[str, torch.Tensor]:
    """Each observed site's log likelihood per element of its plates, with the enumerated
    sites summed out given the continuous ones: ``log p(y_i | theta)``, where ``theta``
    are the continuous latent values (what LOO and WAIC need of a mixture model).

    For ``y_i`` this is the log of ``sum_z p(z | theta) p(y_i | z, theta)`` (the latent
    factors that depend on ``z``, normalized over it, times ``y_i``'s), computed as two
    eliminations with ``y``'s plates kept.
    """
    latent = [f for f in factors if not f.observed and _enumerated_in(f, plate_nesting)]
    by_name = {f.name: f for f in factors}
    result = {}
    for name in observed:
        factor = by_name[name]
        if not _enumerated_in(factor, plate_nesting):
            result[name] = factor.log_prob
            continue
        keep = set(factor.plates)
        joint = sum_out(latent + [factor], plate_nesting, sizes, names, keep=keep)
        if latent:
            joint = joint - sum_out(latent, plate_nesting, sizes, names, keep=keep)
        plate_dims = {dim for dim, _, _ in factor.plates.values()}
        while joint.dim() and joint.shape[0] == 1 and -joint.dim() not in plate_dims:
            joint = joint.squeeze(0)
        result[name] = joint
    return result
