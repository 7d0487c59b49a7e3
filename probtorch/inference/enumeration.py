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
marginalized: a smooth function of the continuous ones, which NUTS samples.

In a ``pt.markov`` loop a site takes the dim of a site more than ``history`` steps back,
so that a long chain fits torch's 64 dims: each factor records which site holds each of
its dims (:class:`Variable`), and factors whose sites share a dim are moved apart where
they are multiplied. Models whose discrete sites couple two plates that are not nested (a
site in plate ``a`` and one in plate ``b`` read together in plates ``a`` and ``b``) have
no such elimination order and are refused.

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

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import torch

from ..handlers import distribution_log_prob, site_log_prob
from ..runtime import Message, Messenger
from ..validation import readable

__all__ = [
    "EnumerateSites",
    "CollectFactors",
    "Factor",
    "Variable",
    "enumerable",
    "plate_nesting",
    "sum_out",
    "draw_eliminated",
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
class Variable:
    """A summed-out site: its number (the order the model reached it in), name, support
    size and the dim its values lie along (which sites of a ``pt.markov`` loop share)."""

    index: int
    name: str
    size: int
    dim: int


@dataclass(frozen=True)
class Factor:
    """One site's log density, with the plates it lies in (name -> (dim, subsample size,
    size)) and the summed-out sites whose values lie along its dims (dim -> :class:`Variable`:
    the sites that held those dims when it ran). A subsampled plate's scale (size /
    subsample size) is applied where the product over the plate is taken, after the sum
    over the discrete sites local to it, so that the estimate stays unbiased. A scale of
    the user's (``pt.handlers.scale``) is ``scale``, not in ``log_prob``: it multiplies the
    log of the sum over the discrete sites, not each term inside it, as Pyro's
    ``TraceEnum_ELBO`` does (the sites summed over together must share it)."""

    name: str
    log_prob: torch.Tensor
    plates: dict[str, tuple[int, int, int]]
    observed: bool
    variables: dict[int, Variable] = field(default_factory=dict)
    scale: object = 1.0

    @classmethod
    def of_site(
        cls, msg: Message, log_prob: torch.Tensor | None = None, apply_scale: bool = True
    ) -> Factor:
        """The site's factor: its log density (masked) and, with ``apply_scale``, the
        user's scale; or ``log_prob`` as given, with no scale added."""
        plates = {f.name: (f.dim, f.subsample_size, f.size) for f in msg.cond_indep_stack}
        scale = 1.0  # (a given log_prob is taken as it is, scaled or not)
        if log_prob is None:
            # a summed-out site's values do not vary along its plates: its density from the
            # distribution before the plates broadcast it (size 1 along them, which the
            # product over a plate counts ``size`` times) is the same, for less work (the
            # gradient of a Categorical's normalized probabilities per element of the plate
            # took 70 % of a compiled mixture's)
            if msg.extra.get("enumerated"):
                # As Pyro's TraceEnum_ELBO: a summed-out site's own term takes no mask
                # (pt.handlers.mask); the sites that read it do. Masked, each of its values
                # would weigh 1 and the sum add log K (a padded HMM step).
                fn = msg.extra.get("unexpanded_fn")
                log_prob = distribution_log_prob(msg.fn if fn is None else fn, msg.value)
            else:
                log_prob = site_log_prob(msg, apply_scale=False)
            if apply_scale and msg.scale is not None:
                scale = msg.scale / _plate_scale(plates.values())
        variables = msg.extra.get("enum_vars", {})
        return cls(msg.name, log_prob, plates, msg.is_observed, variables, scale)


def _plate_scale(plates: Iterable[tuple[int, int, int]]) -> float:
    scale = 1.0
    for _, subsample_size, size in plates:
        scale *= size / subsample_size if subsample_size else 1.0
    return scale


class EnumerateSites(Messenger):
    """Set each named discrete site to its whole support, along a dimension of its own.

    The first site reached takes dimension ``first_dim``, each next one the dim left of
    the last, except in a ``pt.markov`` loop: there a site takes the dim of a site more
    than ``history`` steps back, where there is one. Every sample site's message gets the
    summed-out sites that hold the dims when it runs (``msg.extra["enum_vars"]``, dim ->
    :class:`Variable`), which its :class:`Factor` keeps. ``variables`` maps each site to
    its :class:`Variable` and ``supports`` to its values, once the model has run.
    """

    def __init__(self, names: Collection[str], first_dim: int):
        super().__init__()
        self.names = names
        self.first_dim = first_dim
        self.supports: dict[str, torch.Tensor] = {}
        self.variables: dict[str, Variable] = {}
        self._holders: dict[int, Variable] = {}  # dim -> the site whose values lie along it
        self._steps: dict[int, tuple] = {}  # variable index -> its markov frames
        self._held = self._holders.copy()  # what messages record (a copy per change)

    def process_message(self, msg: Message) -> None:
        if msg.type != "sample":
            return
        if msg.name in self.names and not msg.is_observed:
            self._enumerate(msg)
        msg.extra["enum_vars"] = self._held

    def _enumerate(self, msg: Message) -> None:
        steps = msg.extra.get("markov", ())
        dim = self._free_dim(steps)
        if -dim + len(msg.fn.event_shape) > MAX_DIMS:
            raise ValueError(
                f"site {msg.name!r} is discrete site number {len(self.variables) + 1} to be "
                f"summed out, along dim {dim}; torch tensors have at most 64 dims (one of "
                f"them for the chains). Each discrete site takes a dim of its own unless a "
                f"loop over a chain's steps is written `for t in pt.markov(range(T)):` (its "
                f"sites reuse the dims of earlier steps) and a loop over independent "
                f"sequences `for i in pt.plate('sequences', N):` (the sites of one reuse the "
                f"dims of earlier ones; not `for i in range(N)`); or marginalize the chain in the "
                f"model, e.g. with the DiscreteHMM distribution (one site for the whole "
                f"chain) or a forward recursion in pt.factor"
            )
        support = msg.fn.enumerate_support(expand=False)
        size = support.shape[0]
        event_shape = tuple(msg.fn.event_shape)
        msg.value = support.reshape((size,) + (1,) * (-dim - 1) + event_shape)
        msg.extra["enumerated"] = True
        variable = Variable(len(self.variables), msg.name, size, dim)
        self.variables[msg.name] = variable
        self._steps[variable.index] = steps
        self._holders[dim] = variable
        self._held = self._holders.copy()
        self.supports[msg.name] = support

    def _free_dim(self, steps: tuple) -> int:
        """The dim for a site at markov ``steps``: the rightmost one whose holder is more
        than ``history`` steps back in a loop both are in, else a new one."""
        if steps:
            for dim in sorted(self._holders, reverse=True):
                if _far_apart(self._steps[self._holders[dim].index], steps):
                    return dim
        return self.first_dim - len(self._holders)


def _far_apart(a: tuple, b: tuple) -> bool:
    """Whether two sites at markov frames ``a`` and ``b`` ((loop, step, history), outermost
    first) cannot depend on each other: in the same iteration of every loop enclosing one
    of them, and more than ``history`` steps apart in it."""
    for (loop, step, history), (other, other_step, _) in zip(a, b):
        if loop is not other:
            return False
        if abs(step - other_step) > history:
            return True
        if step != other_step:
            return False
    return False


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


@dataclass
class _Term:
    """A log density and the summed-out sites along its dims (variable index -> dim, for
    the dims where it has more than one element)."""

    tensor: torch.Tensor
    dims: dict[int, int]


def _term(factor: Factor, ndim: int, nesting: int) -> _Term:
    """The factor's log density with ``ndim`` dimensions and its summed-out sites, after
    checking that each of its batch dimensions is one of its plates' or such a site's."""
    log_prob = factor.log_prob
    if log_prob.dim() > ndim:
        raise ValueError(_shape_error(factor, nesting, -log_prob.dim()))
    log_prob = log_prob.reshape((1,) * (ndim - log_prob.dim()) + tuple(log_prob.shape))
    plate_sizes = {dim: size for dim, size, _ in factor.plates.values()}
    dims = {}
    for dim in range(-ndim, 0):
        size = log_prob.shape[dim]
        if size == 1:
            continue
        if dim < -nesting:
            variable = factor.variables.get(dim)
            if variable is None or variable.size != size:
                raise ValueError(_shape_error(factor, nesting, dim))
            dims[variable.index] = dim
        elif size != plate_sizes.get(dim):
            raise ValueError(_shape_error(factor, nesting, dim))
    return _Term(log_prob, dims)


def _shape_error(factor: Factor, nesting: int, dim: int) -> str:
    plates = ", ".join(f"{name!r} at dim {d}" for name, (d, _, _) in factor.plates.items())
    held = ", ".join(f"{v.name!r} at dim {d}" for d, v in sorted(factor.variables.items()))
    return (
        f"site {factor.name!r} has log density shape {tuple(factor.log_prob.shape)}, whose "
        f"dim {dim} is neither one of its plates' ({plates or 'none'}) nor a dimension of "
        f"an enumerated discrete site ({held or 'none'}, left of the model's {nesting} "
        f"plate dims). The model has discrete latent sites that are summed out, and then "
        f"every batch dimension must be declared: put the site in a pt.plate, or move the "
        f"dimension into the event with .to_event()"
    )


def _aligned(terms: list[_Term], nesting: int, fixed: dict[int, int] | None = None) -> _Term:
    """The sum of ``terms`` (a product of densities), with each summed-out site along one
    dim: sites of a ``pt.markov`` loop that share a dim, in terms multiplied together, are
    moved apart (to dims no site in them holds). ``fixed`` places sites first."""
    layout = dict(fixed or {})
    used = set(layout.values())
    free = -nesting - 1
    for term in terms:
        for index, dim in term.dims.items():
            if index in layout:
                continue
            if dim in used:
                while free in used:
                    free -= 1
                dim = free
            layout[index] = dim
            used.add(dim)
    ndim = max([t.tensor.dim() for t in terms] + [-d for d in used])
    tensors = []
    for term in terms:
        tensor = term.tensor
        tensor = tensor.reshape((1,) * (ndim - tensor.dim()) + tuple(tensor.shape))
        if any(layout[i] != d for i, d in term.dims.items()):
            # a permutation: each site to its place, the plates kept, size-1 dims anywhere
            source = {layout[i]: d for i, d in term.dims.items()}
            source.update((d, d) for d in range(-nesting, 0))
            taken = set(source.values())
            spare = [d for d in range(-ndim, 0) if d not in taken]
            places = [p for p in range(-ndim, 0) if p not in source]
            source.update(zip(places, spare))
            tensor = tensor.permute([ndim + source[p] for p in range(-ndim, 0)])
        tensors.append(tensor)
    return _Term(_add(tensors), {i: layout[i] for t in terms for i in t.dims})


def _product(term: _Term, plates: Iterable[tuple[int, int, int]]) -> _Term:
    """The log of the product over plates: a sum along each plate dimension (a term
    constant along it counts ``subsample size`` times), scaled by a subsampled plate's
    ``size / subsample size``."""
    plates = sorted(plates)
    tensor = term.tensor
    for dim, subsample_size, _ in plates:
        if tensor.shape[dim] == 1:
            tensor = tensor * subsample_size
        else:
            tensor = tensor.sum(dim, keepdim=True)
    scale = _plate_scale(plates)
    return _Term(tensor if scale == 1.0 else tensor * scale, term.dims)


def _scaled(term: _Term, scale) -> _Term:
    if isinstance(scale, float) and scale == 1.0:
        return term
    return _Term(term.tensor * scale, term.dims)


def _common_scale(factors: list[Factor], names: dict[int, str], indices) -> object:
    """The user's scale shared by the factors summed over together: the log of their sum
    over the discrete sites is multiplied by it (Pyro's ``TraceEnum_ELBO`` asks for one
    scale there too). Where values can be read, they must agree."""
    scales = [f.scale for f in factors]
    first = scales[0]
    for factor, scale in zip(factors, scales):
        if scale is first or not _readable_scale(scale) or not _readable_scale(first):
            continue  # (compiled code: the eager evaluation before it checked them)
        same = torch.equal(*torch.broadcast_tensors(torch.as_tensor(scale), torch.as_tensor(first)))
        if not same:
            summed = sorted({names[i] for i in indices})
            raise ValueError(
                f"sites {factors[0].name!r} (scale {_shown(first)}) and {factor.name!r} "
                f"(scale {_shown(scale)}) have different pt.handlers.scale but are summed over "
                f"together with the discrete sites {summed}: the scale multiplies the log of "
                f"that sum, so they must share it, as in Pyro. Put the scale handler around "
                f"all of them (the discrete sites too; a scale per element of a plate only "
                f"inside that plate), or scale by a subsampled plate"
            )
    _check_scale_in_plates(first, factors, {names[i] for i in indices})
    return first


def _check_scale_in_plates(scale, factors: list[Factor], summed: set[str]) -> None:
    """A scale per element (a tensor) multiplies the log of a sum over discrete sites
    elementwise, so each summed-out site must lie in the plates along its dims (a global
    site under a scale per row: its sum's log would be counted once per row, by every
    row's weight)."""
    if not isinstance(scale, torch.Tensor) or scale.dim() == 0:
        return
    dims = [d for d in range(-scale.dim(), 0) if scale.shape[d] != 1]
    for factor in factors:
        if factor.name not in summed:
            continue
        plate_dims = {dim for dim, _, _ in factor.plates.values()}
        outside = [d for d in dims if d not in plate_dims]
        if outside:
            raise ValueError(
                f"the summed-out discrete site {factor.name!r} has a pt.handlers.scale of "
                f"shape {tuple(scale.shape)}, whose dims {outside} are none of its plates' "
                f"({sorted(factor.plates) or 'none'}): the scale multiplies the log of the "
                f"sum over that site elementwise, which a site outside the plate cannot "
                f"take (Pyro refuses any tensor scale here). Scale the sites inside the "
                f"plate only, with the discrete sites among them in the plate, or use a "
                f"scalar scale"
            )


def _readable_scale(scale) -> bool:
    return not isinstance(scale, torch.Tensor) or readable(scale)


def _shown(scale) -> str:
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        return f"{float(scale):g}"
    return f"{scale:g}" if isinstance(scale, float) else f"tensor of shape {tuple(scale.shape)}"


def _add(terms: list[torch.Tensor]) -> torch.Tensor:
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def _sumproduct(
    terms: list[_Term],
    eliminate: Iterable[int],
    sizes: dict[int, int],
    nesting: int,
    maximize: bool = False,
    tape: list | None = None,
) -> _Term:
    """The log of the product of ``terms`` with the sites ``eliminate`` summed out, one at
    a time (variable elimination): each time the site whose terms make the smallest
    intermediate, so that a chain of sites (``z[t]`` drawn given ``z[t - 1]``) costs
    linearly in its length, not exponentially. Each site's joint term, before its sum, is
    appended to ``tape`` as ``(site, its sites' dims, tensor)``, where one is given."""
    live = dict(enumerate(terms))  # term number -> term
    uses: dict[int, dict[int, None]] = {}  # site -> numbers of the terms it is in
    for number, term in live.items():
        for index in term.dims:
            uses.setdefault(index, {})[number] = None
    pending = set(eliminate) & set(uses)
    cost: dict[int, int] = {}

    def cost_of(index: int) -> int:  # (plain loops: Dynamo traces them)
        joint: dict[int, None] = {}
        extent = 1
        for n in uses[index]:
            term = live[n]
            joint.update(dict.fromkeys(term.dims))
            elements = 1
            for size in term.tensor.shape[term.tensor.dim() - nesting :]:
                elements *= int(size)
            extent = max(extent, elements)
        for i in joint:
            extent *= sizes[i]
        return extent

    for index in sorted(pending):
        cost[index] = cost_of(index)
    # the cheapest site next (the lowest-numbered of equals): a heap of (cost, site), whose
    # entries of sites summed out already or of older costs are skipped when they come up
    heap = [(cost[index], index) for index in sorted(pending)]  # sorted: a heap already
    next_number = len(live)
    while pending:
        best, index = _heap_pop(heap)
        if index not in pending or cost[index] != best:
            continue
        pending.remove(index)
        numbers = list(uses.pop(index))
        joint = _aligned([live.pop(n) for n in numbers], nesting)
        if tape is not None:
            tape.append((index, dict(joint.dims), joint.tensor))
        dim = joint.dims.pop(index)
        if maximize:  # max-product: the best assignment's log density (MAP decoding)
            reduced = torch.amax(joint.tensor, dim=dim, keepdim=True)
        else:
            reduced = torch.logsumexp(joint.tensor, dim=dim, keepdim=True)
        live[next_number] = _Term(reduced, joint.dims)
        for other in joint.dims:
            for n in numbers:
                uses[other].pop(n, None)
            uses[other][next_number] = None
        next_number += 1
        for other in sorted(joint.dims):
            if other in pending:
                cost[other] = cost_of(other)
                _heap_push(heap, (cost[other], other))
    return _aligned(list(live.values()), nesting)


def _heap_push(heap: list, item: tuple) -> None:
    """``heapq.heappush`` in Python: Dynamo cannot trace the C one."""
    heap.append(item)
    child = len(heap) - 1
    while child > 0:
        parent = (child - 1) // 2
        if heap[parent] <= item:
            break
        heap[child] = heap[parent]
        child = parent
    heap[child] = item


def _heap_pop(heap: list) -> tuple:
    """``heapq.heappop`` in Python: Dynamo cannot trace the C one."""
    last = heap.pop()
    if not heap:
        return last
    top, size, parent = heap[0], len(heap), 0
    while True:
        child = 2 * parent + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if last <= heap[child]:
            break
        heap[parent] = heap[child]
        parent = child
    heap[parent] = last
    return top


def _components(terms: list, indices: set[int], key=lambda t: t) -> list:
    """Partition ``terms`` into groups connected by shared sites among ``indices`` (``key``
    gives a term's :class:`_Term`); returns ``(group, its sites)`` pairs, in the order of
    each group's first term. Union-find over the sites, so that a long chain's terms are
    grouped in time linear in their number (merging sets of sites was quadratic in a
    ``pt.markov`` chain's length)."""
    parent: dict[int, int] = {}

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    sites_of = []
    for term in terms:
        mine = [index for index in key(term).dims if index in indices]
        for index in mine:
            if index not in parent:
                parent[index] = index
        for index in mine[1:]:
            a, b = root(mine[0]), root(index)
            if a != b:
                parent[b] = a
        sites_of.append(mine)
    groups: dict[object, tuple[list, list]] = {}
    for number, (term, mine) in enumerate(zip(terms, sites_of)):
        # a term without such sites is a group of its own
        group = groups.setdefault(root(mine[0]) if mine else -1 - number, ([], []))
        group[0].append(term)
        group[1].extend(mine)
    return [(members, set(sites)) for members, sites in groups.values()]


def _eliminate(
    tree: dict[frozenset, list], eliminate, sizes, frames, names, nesting, maximize, tape=None
):
    """Sum out every site in ``eliminate`` of a connected group of terms, leaf plates
    first; returns ``(ordinal, term)`` pairs with none of them left."""
    site_ordinal: dict[int, frozenset] = {}
    for ordinal, terms in tree.items():
        for term in terms:
            for index in term.dims:
                if index in eliminate:
                    site_ordinal[index] = site_ordinal.get(index, ordinal) & ordinal
    pending: dict[frozenset, set[int]] = {}
    for index, ordinal in site_ordinal.items():
        pending.setdefault(ordinal, set()).add(index)
    root = frozenset.intersection(*tree)
    while any(pending.values()):
        leaf = None
        for ordinal in tree:  # the first deepest ordinal (a loop: Dynamo traces it)
            if leaf is None or len(ordinal) > len(leaf):
                leaf = ordinal
        terms = tree.pop(leaf)
        local = pending.pop(leaf, set())
        for group, indices in _components(terms, local):
            term = _sumproduct(group, indices, sizes, nesting, maximize, tape)
            left = set(term.dims)
            parents = [o for o, ds in pending.items() if ds & left]
            parent = frozenset.union(*parents) if parents else root
            if leaf != root:
                if parent == leaf:
                    raise ValueError(_intractable(leaf, left, names))
                term = _product(term, (frames[p] for p in leaf - parent))
            tree.setdefault(parent, []).append(term)
    return [(ordinal, term) for ordinal, terms in tree.items() for term in terms]


def _check_in_plates(factor: Factor, site: str, plates: dict) -> None:
    """A factor that depends on a summed-out site must lie in all of the site's plates: the
    site takes a value per element of each (another plate at the same dim, say, would pair
    its elements up with the site's values wrongly)."""
    missing = [name for name in plates if name not in factor.plates]
    if missing and factor.name != site:
        raise ValueError(
            f"site {factor.name!r} depends on the summed-out discrete site {site!r}, which "
            f"lies in plates {missing} that {factor.name!r} is not in (its plates: "
            f"{sorted(factor.plates) or 'none'}). A site that reads a value drawn per element "
            f"of a plate must be inside that plate: use the same pt.plate object or name, "
            f"not another plate at the same dim"
        )


def _intractable(leaf: frozenset, indices: Iterable[int], names: dict[int, str]) -> str:
    sites = ", ".join(repr(names[i]) for i in sorted(indices))
    return (
        f"the discrete sites {sites} are summed out, but they are read together in plates "
        f"{sorted(leaf)} that are not nested inside one another: no order of summing them "
        f"out is tractable. Use a Python loop (sequential) for one of those plates, or "
        f"marginalize those sites in the model by hand"
    )


def sum_out(
    factors: list[Factor],
    plate_nesting: int,
    keep: Collection[str] = (),
    target: Collection[str] = (),
    maximize: bool = False,
    tape: list[tuple[Variable, dict[int, int], torch.Tensor]] | None = None,
) -> torch.Tensor:
    """The log of the product of ``factors`` with the summed-out discrete sites (each
    factor's :attr:`Factor.variables`, left of the ``plate_nesting`` plate dimensions)
    summed out.

    Plates named in ``keep`` are not multiplied out: the result keeps their dimensions (a
    pointwise log likelihood), as its ``plate_nesting`` trailing dimensions; otherwise it
    is a scalar. Sites named in ``target`` are not summed out either (a conditional
    distribution of their values): the result then has each along its own dim
    (:attr:`Variable.dim`) and the plates' dims. With ``maximize``, the sites are maxed out
    instead of summed (max-product: the log density of the best assignment).

    Where ``tape`` (a list) is given, each site summed out is appended to it as
    ``(variable, dims, joint)``: ``joint`` is the log of the product of the terms that hold
    the site when it is summed out, before the sum, and ``dims`` maps the summed-out sites
    along its dims (the site's own and those summed out after it) to those dims, by
    :attr:`Variable.index`. :func:`draw_eliminated` draws the sites from it.
    """
    ndim = max([plate_nesting] + [f.log_prob.dim() for f in factors])
    variables = {v.index: v for f in factors for v in f.variables.values()}
    names = {i: v.name for i, v in variables.items()}
    kept = {i for i, v in variables.items() if v.name in target}
    sizes = {i: v.size for i, v in variables.items()}
    eliminate = set(sizes) - kept
    frames: dict[str, tuple[int, int, int]] = {}
    tree: dict[frozenset, list] = {}
    site_names = set(names.values())
    own_plates = {f.name: f.plates for f in factors if f.name in site_names}
    for factor in factors:
        frames.update(factor.plates)
        term = _term(factor, ndim, plate_nesting)
        for index in term.dims:
            _check_in_plates(factor, names[index], own_plates.get(names[index], {}))
        ordinal = frozenset(factor.plates) - frozenset(keep)
        tree.setdefault(ordinal, []).append((term, factor))

    results = []
    pairs = [(ordinal, term, factor) for ordinal, terms in tree.items() for term, factor in terms]
    for group, indices in _components(pairs, eliminate, key=lambda pair: pair[1]):
        if not indices:  # no site summed out: each term scaled as it is
            group = [(o, _scaled(t, f.scale), f) for o, t, f in group]
        if not indices and not keep and not kept:  # as the log joint sums it
            for ordinal, term, _ in group:
                scale = _plate_scale(frames[p] for p in ordinal)
                tensor = term.tensor.sum()
                results.append(_Term(tensor if scale == 1.0 else tensor * scale, {}))
            continue
        common = 1.0 if not indices else _common_scale([f for _, _, f in group], names, indices)
        subtree: dict[frozenset, list] = {}
        for ordinal, term, _ in group:
            subtree.setdefault(ordinal, []).append(term)
        steps: list | None = None if tape is None else []
        eliminated = _eliminate(
            subtree, eliminate, sizes, frames, names, plate_nesting, maximize, steps
        )
        if tape is not None:
            tape.extend((variables[i], dims, joint) for i, dims, joint in steps)
        for ordinal, term in eliminated:
            results.append(_product(_scaled(term, common), (frames[p] for p in ordinal)))
    if not results:
        return torch.zeros(())
    if kept:
        home = {i: variables[i].dim for i in kept}
        return _aligned(results, plate_nesting, fixed=home).tensor
    total = _add([term.tensor for term in results])
    if not keep:
        return total.sum()
    return total.reshape(total.shape[total.dim() - plate_nesting :])


def draw_eliminated(
    steps: list[tuple[Variable, dict[int, int]]],
    joints: list[torch.Tensor],
    plate_nesting: int,
    shapes: dict[str, tuple[int, ...]],
    generator: torch.Generator | None = None,
    maximize: bool = False,
) -> dict[str, torch.Tensor]:
    """Draws of the summed-out sites from their joint distribution, from the ``tape`` of
    :func:`sum_out`: its ``(variable, dims)`` as ``steps`` and its joints, each with one
    leading dimension of draws, as ``joints``.

    The sites are drawn in the reverse of the order they were summed out in, each from
    its joint term at the values drawn for the sites summed out after it (those along
    its other dims): backward sampling after a forward sum, as forward-filter
    backward-sample draws a hidden Markov chain, so that the cost is linear in the number
    of sites. With ``maximize`` (after a max-product ``sum_out``) each site takes its most
    probable value instead, which gives the most probable joint assignment (Viterbi).
    Returns each site's index into its support, shaped ``(draws, *shapes[name])``:
    ``shapes`` gives each site's batch shape, padded on the left to the plate dims.
    """
    drawn: dict[int, torch.Tensor] = {}
    result = {}
    for (variable, dims), joint in zip(reversed(steps), reversed(joints)):
        logits = joint
        for index, dim in dims.items():
            if index == variable.index:
                continue
            chosen = drawn[index]  # (draws, *plate dims)
            chosen = chosen.reshape(
                chosen.shape[:1] + (1,) * (logits.dim() - chosen.dim()) + chosen.shape[1:]
            )
            shape = list(torch.broadcast_shapes(logits.shape, chosen.shape))
            shape[dim] = logits.shape[dim]
            logits = logits.expand(shape)
            shape[dim] = 1
            logits = torch.gather(logits, dim, chosen.expand(shape))
        logits = logits.movedim(dims[variable.index], -1)
        draws = logits.shape[0]
        plates = logits.shape[logits.dim() - 1 - plate_nesting : -1]
        logits = logits.reshape((draws,) + plates + (variable.size,))
        logits = logits.expand((draws,) + tuple(shapes[variable.name]) + (variable.size,))
        if maximize:
            index = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.reshape(-1, variable.size), -1)
            index = torch.multinomial(probs, 1, generator=generator).reshape(logits.shape[:-1])
        drawn[variable.index] = index
        result[variable.name] = index
    return result


def _enumerated_in(factor: Factor, nesting: int) -> bool:
    shape = factor.log_prob.shape
    return any(size > 1 for size in shape[: max(len(shape) - nesting, 0)])


def pointwise_log_likelihood(
    factors: list[Factor], observed: Iterable[str], plate_nesting: int
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
        joint = sum_out(latent + [factor], plate_nesting, keep=keep)
        if latent:
            joint = joint - sum_out(latent, plate_nesting, keep=keep)
        plate_dims = {dim for dim, _, _ in factor.plates.values()}
        while joint.dim() and joint.shape[0] == 1 and -joint.dim() not in plate_dims:
            joint = joint.squeeze(0)
        result[name] = joint
    return result
