"""``NUTS`` and ``HMC``: the sampler kernels the ``MCMC`` driver runs.

A kernel holds its configuration, builds the model's potential on ``setup`` and advances a
:class:`SamplerState` (batched over chains) by one transition per ``sample`` call. The
per-leapfrog state machines live in :mod:`.nuts` and :mod:`.hmc`; the executor that runs
them (compiled chunks) in :mod:`.executor`; warmup adaptation in :mod:`.warmup`.
"""

from __future__ import annotations

import difflib
import inspect
import math
import operator
import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ...validation import torch_validation
from ..init_strategies import init_to_uniform
from ..potential import Potential, initialize_model
from ..potential_fn import model_from_potential_fn, named_potential_fn
from ..potential_hole import hole_value_and_grad
from . import sampler_build
from .adaptation import mass_sqrt_from_inverse, welford_update_batch
from .executor import ChunkedLoop, InPlaceLoop, SplitLoop
from .hmc import hmc_draw_randomness, hmc_init, hmc_iteration, metropolis, trajectory_steps
from .hmc_block import draw_hmc_block_randomness, hmc_block_iteration, init_hmc_block
from .integrator import kinetic_energy, leapfrog, sample_momentum
from .lean import TieredBuild, build_lean_loop
from .nuts import (
    TransitionResult,
    draw_randomness,
    init_transition,
    nuts_iteration,
    transition_result,
)
from .nuts_block import block_iteration, draw_block_randomness, init_block, with_momenta
from .ported_options import refuse_ported_options
from .warmup import AdaptState

__all__ = [
    "SamplerState",
    "SegmentResult",
    "NUTS",
    "HMC",
    "find_reasonable_step_size",
    "lean_is_faster",
    "empty_stats",
]

STAT_NAMES = (
    "diverging", "energy", "tree_depth", "num_steps", "accept_prob", "step_size",
    "potential_energy",
)  # fmt: skip


# Models whose largest tensor per chain has at most this many elements get scalar C++:
# their loops are a few elements long, and vectorized code pays the setup of a vector loop
# and its tail on each. Eight schools (10 dims, 8 observations), 4 chains, one core, p25
# per quick call in one process, alternating: scalar code 5.6-6.0 us, vectorized with
# scalar tails (``codegen_options``' choice for larger models) 9.8 us, vectorized with
# Inductor's masked tails 14.9 us. From about a hundred elements vectorized code is as
# fast (the 100-d Gaussian: 89 / 88 us on the lean executor) and then faster (hierarchical
# regression, 919 observations: 46 / 56 us; logistic regression, 5000: 188 / 509 us).
SCALAR_CODE_MAX_NUMEL = 64


def codegen_options(potential: Potential) -> dict:
    """Inductor options for a sampler's compiled step on ``potential``'s model.

    Vectorized code gets scalar loop tails (``cpp.enable_loop_tail_vec=False``): a loop
    over D elements runs D // 8 vectors of 8 (float64, AVX2) and the rest one element at a
    time, where Inductor's default runs the rest as one masked vector, whose loads and
    stores copy through a stack buffer. Every loop of the NUTS step over a latent dimension
    has such a tail unless D is a multiple of 8, and the masked variant is as long as the
    vector body, so this also shortens the C++ source Inductor writes and the compiler
    reads. Per call (4 chains, one core, both compiled in one process and timed
    alternately, p25, both orders where two are given): hierarchical regression 78 -> 68
    and 77.5 -> 65 us, 100-d Gaussian diagonal 75 -> 66 and 49 -> 42.5, dense 70 -> 63;
    logistic regression and the SAAS GP unchanged (about 500 and 450 us, their time is in
    the likelihood's library calls and long loops). Compiling logistic regression's step
    from cold caches: 41 -> 37 s (source 205 -> 171 KB).
    """
    if potential.largest_numel <= SCALAR_CODE_MAX_NUMEL:
        # No vector ISA has a width of 1 bit, so Inductor picks none. (``cpp.vec_isa_ok=False``
        # did the same only partly: its answer is cached per process, so code generated
        # in a fresh process differed, and a fresh process compiling first with it emitted
        # vector code without the vector headers.)
        return {"cpp.simdlen": 1}
    return {"cpp.enable_loop_tail_vec": False}


# dtype of each per-transition statistic where it is not the state's floating dtype
_STAT_DTYPES = {"diverging": torch.bool, "tree_depth": torch.int64, "num_steps": torch.int64}


def empty_stats(z: torch.Tensor, n: int = 0) -> dict[str, torch.Tensor]:
    """Uninitialized per-transition statistics for ``n`` transitions of ``z``'s chains,
    ``(C, n)`` each, in their dtypes (``diverging`` bool, step counts int64, the rest
    ``z``'s): with ``n = 0``, those of no transitions, which keep the dtypes when joined."""
    C = z.shape[0]
    return {
        name: torch.empty(C, n, dtype=_STAT_DTYPES.get(name, z.dtype), device=z.device)
        for name in STAT_NAMES
    }


def _raised_in(error: BaseException, fn) -> bool:
    """Whether ``error`` was raised inside a call of the function ``fn``."""
    code = getattr(fn, "__code__", None)
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


def _potential_fn_call_note(init_params, num_chains: int) -> str:
    """What a ``potential_fn`` kernel called the function with, for a failure in it."""
    if isinstance(init_params, torch.Tensor):
        return (
            "init_params was one tensor, so potential_fn was called with one tensor "
            "(NumPyro's form); pass a dict {name: tensor} to have it called with a dict"
        )
    shapes = {k: tuple(torch.as_tensor(v).shape) for k, v in dict(init_params or {}).items()}
    if num_chains == 1:
        return f"potential_fn was called with a dict of tensors shaped as init_params: {shapes}"
    return (
        f"potential_fn was called with one chain's values: with num_chains={num_chains}, "
        f"each init_params value has a leading chain dimension (given: {shapes}), which the "
        f"function does not see"
    )


class SamplerState(NamedTuple):
    """Where each chain is and how it moves (step size and metric), batched over chains."""

    z: torch.Tensor  # (C, D) unconstrained position
    potential_energy: torch.Tensor  # (C,)
    grad: torch.Tensor  # (C, D)
    step_size: torch.Tensor  # (C,)
    inverse_mass: torch.Tensor  # (C, D) diagonal or (C, D, D) dense
    mass_sqrt: torch.Tensor  # M^{1/2}: (C, D) or Cholesky factor (C, D, D)


class SegmentResult(NamedTuple):
    """What :meth:`run_segment` returns: the new state, adaptation state, draws and stats."""

    state: SamplerState
    adapt: AdaptState
    draws: torch.Tensor  # (C, n, D) unconstrained
    stats: dict  # name -> (C, n)
    interrupted: bool


def _mass_blocks(dense_mass) -> list[tuple[str, ...]] | None:
    """``dense_mass``'s site blocks, or None for ``True``/``False``."""
    if isinstance(dense_mass, bool):
        return None
    ok = isinstance(dense_mass, (list, tuple)) and all(
        isinstance(g, (list, tuple)) and g and all(isinstance(n, str) for n in g)
        for g in dense_mass
    )
    if not ok:
        raise TypeError(
            f"dense_mass must be True, False or a list of tuples of latent site names, e.g. "
            f"[('beta', 'alpha')]; got {dense_mass!r}"
        )
    return [tuple(g) for g in dense_mass]


def _site_blocks(potential: Potential, blocks, option: str) -> list:
    """``(names, index)`` per block of site names: the block's coordinates in the flat
    vector; a name that is no latent site or a site in two blocks is an error naming
    ``option``."""
    sites = {s.name: s for s in potential.sites}
    seen: set[str] = set()
    result = []
    for names in blocks:
        unknown = [n for n in names if n not in sites]
        if unknown:
            raise ValueError(
                f"{option} names {unknown}, which are not latent sites of this model; its "
                f"latent sites are {potential.site_names}"
            )
        twice = sorted({n for n in names if n in seen or names.count(n) > 1})
        if twice:
            raise ValueError(f"{option} puts site(s) {twice} in more than one block")
        seen.update(names)
        index = torch.cat(
            [torch.arange(sites[n].offset, sites[n].offset + sites[n].size) for n in names]
        ).to(potential.device)
        result.append((names, index))
    return result


def _inverse_mass_from_blocks(potential: Potential, blocks: dict, dense: bool) -> torch.Tensor:
    """NumPyro's ``inverse_mass_matrix`` dict (tuples of site names -> each block's
    diagonal, or with ``dense_mass`` its matrix or diagonal) as one array over the flat
    vector; the coordinates of sites in no block keep 1 on the diagonal.

    >>> import probtorch as pt, probtorch.distributions as dist
    >>> def model():
    ...     pt.sample("a", dist.Normal(torch.zeros(2), 1.0).to_event(1))
    ...     pt.sample("b", dist.Normal(0.0, 1.0))
    >>> _inverse_mass_from_blocks(
    ...     Potential(model, compile=False), {("b",): torch.tensor([4.0])}, False)
    tensor([1., 1., 4.])
    """
    inverse_mass = torch.ones(potential.dim, dtype=potential.dtype, device=potential.device)
    if dense:
        inverse_mass = torch.diag(inverse_mass)
    keys = [(k,) if isinstance(k, str) else tuple(k) for k in blocks]
    for (names, index), value in zip(
        _site_blocks(potential, keys, "inverse_mass_matrix"), blocks.values()
    ):
        value = torch.as_tensor(value, dtype=potential.dtype, device=potential.device)
        n = len(index)
        if value.shape == (n,):  # a diagonal block (NumPyro's form outside dense blocks)
            if dense:
                inverse_mass[index, index] = value
            else:
                inverse_mass[index] = value
        elif value.shape == (n, n) and dense:
            inverse_mass[index[:, None], index] = value
        else:
            want = f"({n},) or ({n}, {n})" if dense else f"({n},)"
            raise ValueError(
                f"inverse_mass_matrix[{names!r}] must have shape {want} for those sites' {n} "
                f"unconstrained dims (dense_mass={dense}), got {tuple(value.shape)}"
            )
    return inverse_mass


def _integer(name: str, value) -> int:
    """``value`` as an int (NumPy's integers and 10.0 too), refusing 2.5 and "3" by
    ``name``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _check_positive_metric(inverse_mass: torch.Tensor, dense: bool) -> None:
    """Refuse an inverse mass matrix that is not finite and positive (definite): with one,
    every transition diverged and the chains stood still."""
    if not bool(torch.isfinite(inverse_mass).all()):
        raise ValueError("inverse_mass_matrix has entries that are not finite")
    if not dense:
        if not bool((inverse_mass > 0).all()):
            bad = inverse_mass[inverse_mass <= 0][:5].tolist()
            raise ValueError(f"inverse_mass_matrix must be positive, got entries {bad}")
        return
    _, info = torch.linalg.cholesky_ex(inverse_mass)
    if bool((info != 0).any()):
        raise ValueError(
            "inverse_mass_matrix (dense_mass=True) must be symmetric positive definite; its "
            "Cholesky factorization failed"
        )


def block_mass_mask(potential: Potential, blocks: list | None) -> torch.Tensor | None:
    """The (D, D) mask of a structured dense metric: each block's sites jointly, every other
    coordinate on the diagonal; None for a diagonal or fully dense one.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("a", dist.Normal(torch.zeros(2), 1.0).to_event(1))
        ...     pt.sample("b", dist.Normal(0.0, 1.0))
        >>> block_mass_mask(Potential(model, compile=False), [("a",)]).int()
        tensor([[1, 1, 0],
                [1, 1, 0],
                [0, 0, 1]], dtype=torch.int32)
    """
    if not blocks:
        return None
    mask = torch.eye(potential.dim, dtype=torch.bool, device=potential.device)
    for _, index in _site_blocks(potential, blocks, "dense_mass"):
        mask[index.unsqueeze(-1), index] = True
    return mask


def find_reasonable_step_size(
    value_and_grad: Callable,
    state: SamplerState,
    max_iter: int = 100,
) -> torch.Tensor:
    """Stan's initial step-size heuristic, per chain.

    Double (or halve) the step size until the acceptance probability of one leapfrog step
    from the current point, with fresh momentum, crosses 0.8.
    """
    z, pe, grad = state.z, state.potential_energy, state.grad
    step = state.step_size.clone()
    log_target = math.log(0.8)

    def delta_h(step):
        r = sample_momentum(state.mass_sqrt, torch.randn_like(z))
        h0 = pe + kinetic_energy(state.inverse_mass, r)
        _, r_new, pe_new, _ = leapfrog(value_and_grad, z, r, grad, step, state.inverse_mass)
        h = pe_new + kinetic_energy(state.inverse_mass, r_new)
        h = torch.where(torch.isnan(h), torch.full_like(h, math.inf), h)
        return h0 - h

    direction_up = delta_h(step) > log_target
    searching = torch.ones_like(direction_up)
    for _ in range(max_iter):
        dh = delta_h(step)
        stop = torch.where(direction_up, ~(dh > log_target), ~(dh < log_target))
        searching = searching & ~stop
        if not bool(searching.any()):
            break
        step = torch.where(searching, torch.where(direction_up, 2 * step, 0.5 * step), step)
        step = step.clamp(1e-8, 1e7)
    return step


def _check_options(kernel: type, options: dict) -> None:
    """A clear TypeError for an option neither ``kernel`` nor the common kernel takes."""
    known = [
        name
        for cls in (kernel, _HamiltonianKernel)
        for name, param in inspect.signature(cls.__init__).parameters.items()
        if param.kind is inspect.Parameter.KEYWORD_ONLY or name == "model"
    ]
    refuse_ported_options(kernel.__name__, options)
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise TypeError(
                f"{kernel.__name__} got an unexpected option {name!r}{hint} Its options: "
                f"{', '.join(sorted(set(known)))}"
            )


class _HamiltonianKernel:
    """What NUTS and HMC share: the potential, initialization, metric and adaptation options."""

    def __init__(
        self,
        model: Callable | None = None,
        *,
        potential_fn: Callable | None = None,
        step_size: float = 1.0,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        dense_mass: bool | Sequence[Sequence[str]] = False,
        inverse_mass_matrix: torch.Tensor | None = None,
        target_accept_prob: float = 0.8,
        init_strategy: Callable = init_to_uniform,
        find_heuristic_step_size: bool = True,
        compile: bool | None = None,
        chunk_size: int = 1,
    ):
        if (model is None) == (potential_fn is None):
            raise TypeError(
                f"{type(self).__name__} needs a model function or a potential_fn (not both), "
                f"got model={model!r}, potential_fn={potential_fn!r}"
            )
        given, what = (model, "model") if potential_fn is None else (potential_fn, "potential_fn")
        if not callable(given):
            raise TypeError(f"{type(self).__name__}: {what} must be callable, got {given!r}")
        if not 0 < step_size < math.inf:
            raise ValueError(f"step_size must be positive and finite, got {step_size}")
        if not 0 < target_accept_prob < 1:
            raise ValueError(f"target_accept_prob must lie in (0, 1), got {target_accept_prob}")
        self.model = model
        self.potential_fn = potential_fn
        self.step_size = float(step_size)
        self.adapt_step_size = adapt_step_size
        self.adapt_mass_matrix = adapt_mass_matrix
        self.mass_blocks = _mass_blocks(dense_mass)
        self.dense_mass = bool(dense_mass)  # structured blocks are kept as a dense matrix
        self._mass_mask: torch.Tensor | None = None
        self.inverse_mass_matrix = inverse_mass_matrix
        self.target_accept_prob = target_accept_prob
        self.init_strategy = init_strategy
        self.find_heuristic_step_size = find_heuristic_step_size
        self.compile = compile
        self.chunk_size = chunk_size
        self.potential: Potential | None = None

    # -- set-up ---------------------------------------------------------------------
    def setup(
        self,
        model_args: tuple,
        model_kwargs: dict,
        num_chains: int,
        rng_seed: int,
        init_params: dict | None = None,
        find_step_size: bool = True,
    ) -> SamplerState:
        """The chains' first state. ``find_step_size=False`` keeps the kernel's
        ``step_size`` instead of running the step-size heuristic (MCMC passes it for a run
        without warmup, which adapts nothing)."""
        model, given = self.model, init_params
        if self.potential_fn is not None:
            potential_fn, init_params = named_potential_fn(self.potential_fn, init_params)
            model = model_from_potential_fn(
                potential_fn, init_params, num_chains, model_args, model_kwargs
            )
        try:
            potential, z0 = initialize_model(
                model,
                model_args,
                model_kwargs,
                num_chains=num_chains,
                init_strategy=self.init_strategy,
                init_params=init_params,
                rng_seed=rng_seed,
                compile=self.compile,
            )
        except Exception as error:
            if self.potential_fn is not None and _raised_in(error, self.potential_fn):
                error.add_note(_potential_fn_call_note(given, num_chains))
            raise
        self.potential = potential
        self._mass_mask = block_mass_mask(potential, self.mass_blocks)
        # Set-up and the step-size heuristic call the potential a few dozen times: eagerly,
        # which saves compiling a second graph (about as long as the sampler's own). Its
        # first batched call finds a model that runs eagerly, chain by chain (reading latent
        # values in Python), before the sampler is built (compiled or not).
        pe, grad = potential.eager_value_and_grad(z0)
        self._build(potential)
        inverse_mass = self._initial_inverse_mass(num_chains, potential.dim, z0)
        step = torch.full((num_chains,), self.step_size, dtype=z0.dtype, device=z0.device)
        state = SamplerState(z0, pe, grad, step, inverse_mass, mass_sqrt_from_inverse(inverse_mass))
        if self.adapt_step_size and self.find_heuristic_step_size and find_step_size:
            state = self.reset_step_size(state)
        return state

    def _initial_inverse_mass(self, num_chains: int, dim: int, z0: torch.Tensor) -> torch.Tensor:
        """The given ``inverse_mass_matrix`` (the identity if none) for every chain: of
        shape ``(D,)`` (``(D, D)`` with ``dense_mass``), one per chain ``(num_chains,
        ...)``, or NumPyro's dict of blocks by tuples of site names; checked positive."""
        given = self.inverse_mass_matrix
        expected = (dim, dim) if self.dense_mass else (dim,)
        if isinstance(given, dict):
            given = _inverse_mass_from_blocks(self.potential, given, self.dense_mass)
        if given is None:
            eye = torch.ones(dim, dtype=z0.dtype, device=z0.device)
            given = torch.diag(eye) if self.dense_mass else eye
        given = torch.as_tensor(given, dtype=z0.dtype, device=z0.device)
        allowed = [expected, (1, *expected), (num_chains, *expected)]
        # a symmetric (D, D) matrix for a diagonal metric is a dense metric given by mistake,
        # not one diagonal per chain (which num_chains == D would also allow)
        matrix_given = (
            not self.dense_mass
            and given.shape == (dim, dim)
            and dim > 1
            and torch.equal(given, given.T)
            and not bool((given == given[:1]).all())
        )
        if given.shape not in allowed or matrix_given:
            hint = (
                " (a symmetric matrix: for a dense metric pass dense_mass=True, else its diagonal)"
                if not self.dense_mass and given.shape == (dim, dim)
                else ""
            )
            raise ValueError(
                f"inverse_mass_matrix must have shape {expected} (dense_mass={self.dense_mass}), "
                f"or {(num_chains, *expected)} for one per chain, for the {dim} unconstrained "
                f"dims of sites {self.potential.site_names}; got {tuple(given.shape)}{hint}"
            )
        if self.dense_mass:  # exactly symmetric: see integrator.velocity
            given = self.restrict_mass(0.5 * (given + given.transpose(-1, -2)))
        _check_positive_metric(given, self.dense_mass)
        return given.expand((num_chains,) + expected).clone()

    def restrict_mass(self, inverse_mass: torch.Tensor) -> torch.Tensor:
        """``inverse_mass`` with the entries outside ``dense_mass``'s blocks set to zero
        (unchanged for a diagonal or fully dense metric)."""
        if self._mass_mask is None:
            return inverse_mass
        return inverse_mass * self._mass_mask.to(inverse_mass.dtype)

    def reset_step_size(self, state: SamplerState) -> SamplerState:
        """Re-run the step-size heuristic from the current points (Stan does after each window)."""
        with torch_validation(False):
            step = find_reasonable_step_size(self.potential.raw_value_and_grad, state)
        return state._replace(step_size=step)

    def _build(self, potential: Potential) -> None:
        raise NotImplementedError

    def _tell_compiling(self, loop, progress: Callable | None, num_transitions: int) -> None:
        """Call ``progress.compiling()`` (where ``progress`` has it) if a segment of
        ``num_transitions`` starts by compiling ``loop``: there are transitions to run, the
        potential is compiled and the loop has never run. A first compile takes seconds
        (10-25 s for the benchmark models on a machine's first run), during which a progress
        bar would otherwise stand at 0 without saying why."""
        notice = getattr(progress, "compiling", None)
        if notice is None or loop is None or num_transitions <= 0:
            return
        if self.potential.compiled and not loop.calls:
            notice()

    def sample(self, state: SamplerState) -> tuple[SamplerState, TransitionResult]:
        """One transition for every chain."""
        raise NotImplementedError

    def _start_block(self, state: SamplerState, adapt: AdaptState, t_limit, flags):
        """The block state and the loop's other arguments for the next block."""
        raise NotImplementedError

    def _prepare_block(self, block, block_args) -> None:
        """Choose the loop for the next block (NUTS: the split or lean executor)."""

    def _run_block(self, block, block_args):
        """One block on the current loop; returns the new block state and that loop."""
        loop = self._block_loop
        return loop(block, *block_args), loop

    def run_segment(
        self,
        state: SamplerState,
        adapt: AdaptState,
        num_transitions: int,
        adapt_step_size: bool = False,
        collect_mass: bool = False,
        progress: Callable | None = None,
    ) -> SegmentResult:
        """``num_transitions`` transitions per chain, in blocks of ``block_size``: each
        chain starts its next transition without waiting for the others, and adapts after
        each one as told.

        The step size follows dual averaging when ``adapt_step_size``; draws feed the
        mass-matrix estimate when ``collect_mass`` (from each block's draws).
        ``progress(n, step_size, divergences)`` is called after each block with its
        transitions and divergences (the caller keeps the phase's totals), and
        ``progress.compiling()``, where it has one, before a first block that compiles the
        sampler. On KeyboardInterrupt the transitions finished so far are kept (the ones in
        progress are dropped) and chains are cut to the shortest.
        """
        C, D = state.z.shape
        T, device = self.block_size, state.z.device
        draws = state.z.new_empty(C, num_transitions, D)
        stats = empty_stats(state.z, num_transitions)
        filled, reported = [0] * C, 0
        remaining = torch.full((C,), num_transitions, dtype=torch.int64, device=device)
        flags = (torch.tensor(bool(adapt_step_size), device=device),)
        interrupted = False
        self._tell_compiling(self._block_loop, progress, num_transitions)
        try:
            while bool((remaining > 0).any()):
                t_limit = remaining.clamp(max=self.block_size)
                block, block_args = self._start_block(state, adapt, t_limit, flags)
                self._prepare_block(block, block_args)
                block, loop = self._run_block(block, block_args)
                out = block.out._asdict()
                for c, k in enumerate(block.t.tolist()):
                    if k:
                        draws[c, filled[c] : filled[c] + k] = out["z"][c, :k]
                        for name in STAT_NAMES:
                            stats[name][c, filled[c] : filled[c] + k] = out[name][c, :k]
                        filled[c] += k
                state = state._replace(
                    z=block.z,
                    potential_energy=block.potential_energy,
                    grad=block.grad,
                    step_size=block.step_size,
                )
                welford = adapt.welford
                if collect_mass:
                    block_draws = [out["z"][c, :k] for c, k in enumerate(block.t.tolist())]
                    if len(set(block.t.tolist())) == 1:  # the usual case: one batched update
                        welford = welford_update_batch(welford, torch.stack(block_draws))
                    else:  # chains finished different numbers of transitions
                        welford = _welford_per_chain(welford, block_draws)
                adapt = AdaptState(block.dual_averaging, welford)
                if loop.interrupted:
                    raise KeyboardInterrupt  # the finished transitions above are kept
                remaining = remaining - block.t
                if progress is not None:
                    divergences = int(block.out.diverging[:, :T].sum())
                    progress(min(filled) - reported, state.step_size, divergences)
                    reported = min(filled)
        except KeyboardInterrupt:
            interrupted = True
        kept = min(filled)  # chains may be uneven after an interrupt
        stats = {k: v[:, :kept] for k, v in stats.items()}
        return SegmentResult(state, adapt, draws[:, :kept], stats, interrupted)


class NUTS(_HamiltonianKernel):
    """The No-U-Turn Sampler (Stan's multinomial variant), compiled, vectorized over chains.

    Args:
        model: the model function.
        potential_fn: instead of a model, as in NumPyro and Pyro: ``potential_fn(values)``
            returns the potential energy (negative log density up to a constant) of one
            point, ``values`` a dict of unconstrained (real) tensors by name. The run then
            needs ``init_params`` of those names and shapes, with a leading chain dimension
            when ``num_chains > 1``, and takes no model arguments
            (:mod:`probtorch.inference.potential_fn`).
        step_size: initial step size (adapted during warmup unless ``adapt_step_size=False``).
        adapt_step_size: dual-averaging step-size adaptation during warmup.
        adapt_mass_matrix: windowed mass-matrix adaptation during warmup.
        dense_mass: adapt a dense (rather than diagonal) mass matrix; or, as in NumPyro, a
            list of tuples of latent site names, each a block of sites whose joint
            (co)variance is adapted, the other sites diagonal, e.g. ``[("beta", "alpha")]``.
            The blocks are kept as a dense matrix with zeros between them: the estimate of
            a block-diagonal metric at the cost per step of a dense one (a given
            ``inverse_mass_matrix`` is cut to the blocks too).
        inverse_mass_matrix: the initial inverse mass matrix over the ``D`` unconstrained
            dims, ``(D,)`` or, with ``dense_mass``, ``(D, D)`` (positive, or symmetric
            positive definite); one per chain with a leading ``num_chains``; or NumPyro's
            dict from tuples of site names to each block's diagonal (matrix with
            ``dense_mass``), 1 on the diagonal elsewhere.
        target_accept_prob: the acceptance statistic dual averaging aims for.
        max_tree_depth: at most ``2**max_tree_depth - 1`` leapfrog steps per draw.
        init_strategy: where chains start (see :mod:`probtorch.inference.init_strategies`).
        find_heuristic_step_size: run Stan's step-size heuristic at set-up and after each
            mass-matrix window (on by default, as Stan; with ``False`` each window's dual
            averaging starts from the step size adapted so far, NumPyro's default).
        max_delta_energy: an energy error above this is a divergence (positive).
        compile: compile the sampler (default: ``PROBTORCH_COMPILE``, on).
        chunk_size: leapfrog iterations unrolled per compiled call. Compile time grows with
            it, the host overhead per iteration shrinks. Eight schools (centered, 4 chains,
            1000 + 1000, one core): first run 16.5 / 13.5 / 29 s and 7.5 / 6.6 / 6.3 s for
            the 1000 + 1000 run with chunks 1 / 2 / 4 (the first run with chunk 1 also paid
            the process's one-time compiler start-up). 1 is the default (the shortest time
            to the first draw); 2 or 4 pay off for long runs.
        block_size: transitions per chain between returns to Python.
        executor: ``"quick"`` (an in-place graph compiled by Inductor in this process,
            :class:`~probtorch.inference.mcmc.executor.InPlaceLoop`: seconds to build),
            ``"lean"`` (AOTInductor with a C++ loop: 15-25 s to build on one core, cached on
            disk; per 4-chain leapfrog step on eight schools about 8 us, as fast as the quick
            path's replayed call, but loaded in milliseconds by later runs; see
            :mod:`probtorch.inference.mcmc.lean`) or ``"auto"`` (the default; the
            environment variable ``PROBTORCH_EXECUTOR`` changes it): ``"split"`` when the
            sampler graph for these settings is kept on disk (an earlier model built it;
            CPU only for now),
            else the quick path while background processes build the sampler graph for
            later models (:mod:`probtorch.inference.mcmc.sampler_build`) and this model's
            lean package; on that path the lean executor is used at once when its package
            is cached, else once its build finishes (where two CPUs are free, see
            :func:`~probtorch.inference.mcmc.lean.background_builds_allowed`), switching to
            it at a block boundary when it is ready, for good only if its time per leapfrog
            step beats the quick path's (:func:`lean_is_faster`, over a trial of
            ``LEAN_TRIAL_BLOCKS`` blocks; otherwise this sampler stays on the quick path,
            also in later runs). The draws are the same on every path. ``"split"``
            (opt-in): the model's gradient compiled apart from the sampler, whose graph is
            compiled once per sampler setting and kept on disk for every later model
            (:class:`~probtorch.inference.mcmc.executor.SplitLoop`): a new model compiles
            in 6-15 s instead of 16-30 s on one core (benchmark models); the first one
            on a machine pays the sampler's compile once (about 25 s; ``"auto"`` pays it
            in the background, :mod:`~probtorch.inference.mcmc.prebuild` ahead).

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference import MCMC
        >>> def model():
        ...     pt.sample("x", dist.Normal(1.0, 2.0))
        >>> mcmc = MCMC(NUTS(model, compile=False), num_warmup=100, num_samples=100,
        ...             progress_bar=False, seed=0)
        >>> mcmc.run()
        >>> mcmc.get_samples()["x"].shape
        torch.Size([100])
    """

    def __init__(
        self,
        model: Callable | None = None,
        *,
        max_tree_depth: int = 10,
        max_delta_energy: float = 1000.0,
        block_size: int = 64,
        executor: str | None = None,
        **kwargs,
    ):
        _check_options(type(self), kwargs)
        super().__init__(model, **kwargs)
        if executor is None:
            executor = os.environ.get("PROBTORCH_EXECUTOR", "auto").strip().lower() or "auto"
        if executor not in ("quick", "lean", "auto", "split"):
            raise ValueError(
                f"executor must be 'quick', 'lean', 'auto' or 'split', got {executor!r}"
            )
        self.executor = executor
        if isinstance(max_tree_depth, (tuple, list)):
            raise TypeError(
                f"max_tree_depth must be one integer, got {max_tree_depth!r}: NumPyro's "
                f"(warmup, sampling) pair is not supported"
            )
        max_tree_depth = _integer("max_tree_depth", max_tree_depth)
        if not 1 <= max_tree_depth <= 20:
            raise ValueError(f"max_tree_depth must lie in [1, 20], got {max_tree_depth}")
        if not max_delta_energy > 0:
            raise ValueError(
                f"max_delta_energy must be positive, got {max_delta_energy} (an energy error "
                f"above it is a divergence; Stan's and NumPyro's is 1000, inf counts none)"
            )
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.max_tree_depth = int(max_tree_depth)
        self.max_delta_energy = float(max_delta_energy)
        self.block_size = int(block_size)
        self._lean_slower = False  # "auto": a trial found the lean loop slower (kept across runs)
        # leaf uniforms per chain and block: room for several maximal trees
        self.leaf_budget = max(4 * 2**self.max_tree_depth, 64 * self.block_size)

    def _build(self, potential: Potential) -> None:
        value_and_grad = potential.raw_value_and_grad
        max_depth, max_delta = self.max_tree_depth, self.max_delta_energy
        target = self.target_accept_prob

        def iteration(state, rand, step_size, inverse_mass):
            return nuts_iteration(
                state, rand, value_and_grad, step_size, inverse_mass, max_depth, max_delta
            )

        def block_step(state, rand, inverse_mass, mass_sqrt, t_limit, adapt_step):
            return block_iteration(
                state, rand, inverse_mass, mass_sqrt, t_limit, adapt_step,
                value_and_grad, max_depth, max_delta, target,
            )  # fmt: skip

        self._block_step = block_step
        self._codegen = codegen_options(potential)
        self._loop = ChunkedLoop(
            iteration, self.chunk_size, potential.compiled, options=self._codegen
        )
        if potential.compiled and self.executor == "split":
            self._block_loop = split_block_loop(
                value_and_grad=value_and_grad, options=self._codegen, **self._split_settings()
            )
        elif potential.compiled:
            self._block_loop = InPlaceLoop(
                block_step, self.chunk_size, done=_block_done, options=self._codegen
            )
        else:
            self._block_loop = ChunkedLoop(block_step, self.chunk_size, False, done=_block_done)
        self._lean_pending = potential.compiled and (
            self.executor == "lean" or (self.executor == "auto" and not self._lean_slower)
        )
        # "auto": the split path if its sampler graph is kept, decided at the first block
        self._split_pending = potential.compiled and self.executor == "auto"
        self._value_and_grad = value_and_grad
        self._sampler_build: sampler_build.SamplerBuild | None = None
        self._tiered: TieredBuild | None = None
        # "auto": seconds per call of the quick loop's blocks, and of the lean loop's during
        # its trial (self._trial: (quick loop, lean loop) while it runs)
        self._quick_per_call: list[float] = []
        self._lean_per_call: list[float] = []
        self._trial: tuple | None = None

    def _split_settings(self) -> dict:
        """:func:`split_block_loop`'s sampler settings."""
        return {"max_depth": self.max_tree_depth, "max_delta": self.max_delta_energy,
                "target": self.target_accept_prob, "chunk_size": self.chunk_size}  # fmt: skip

    def _use_split(self, block, block_args) -> None:
        """``"auto"``: take the split path if the sampler graph for these settings and
        inputs is kept on disk (then no lean package is looked for: the model's gradient
        compiles in seconds); else start building it in the background
        (:mod:`.sampler_build`) for later runs, and go on as before."""
        self._split_pending = False
        if block.z.device.type != "cpu":  # not yet run on CUDA: the quick path there
            return
        loop = split_block_loop(
            value_and_grad=self._value_and_grad, options=self._codegen, **self._split_settings()
        )
        if loop.load_kept(block, *block_args):
            self._block_loop, self._lean_pending = loop, False
            return
        path = loop.kept_path(block, *block_args)
        self._sampler_build = sampler_build.start(
            self._split_settings(), self._codegen, block, block_args, path
        )

    def _use_lean(self, block, block_args) -> None:
        """Set up the lean executor on first use (from the first block's shapes).

        ``"lean"`` builds it now (or loads it from the cache); ``"auto"`` loads it if it is
        cached and otherwise starts a background build that :meth:`_poll_lean` picks up.
        """
        self._lean_pending = False
        if self.executor == "auto" and block.z.device.type != "cpu":
            return  # the lean package's C++ loop is measured on CPUs only: the quick path
        build = build_lean_loop if self.executor == "lean" else TieredBuild
        result = build(
            self._block_step,
            block,
            block_args,
            self.chunk_size,
            done=_block_done,
            key=f"nuts-L{self.max_tree_depth}-{self.max_delta_energy}-{self.target_accept_prob}",
            inductor_configs=self._codegen,
        )
        if isinstance(result, TieredBuild):
            self._tiered = result
            traced = result.traced
            result = result.poll()
            if result is None and traced is not None and isinstance(self._block_loop, InPlaceLoop):
                self._block_loop.adopt(traced)  # the quick path, without tracing again
        if result is not None:
            self._block_loop = result

    def _poll_lean(self) -> None:
        """Try the lean executor once its background build has finished (after at least one
        block of the quick path was timed, to compare it with)."""
        if self._tiered is None or self._lean_slower or self._trial is not None:
            return
        loop = self._tiered.poll()
        if loop is None or loop is self._block_loop:
            return
        if isinstance(self._block_loop, InPlaceLoop):
            if not self._quick_per_call:
                return
            self._trial = (self._block_loop, loop)
        self._block_loop = loop

    def _run_block(self, block, block_args):
        """One block on the current loop, timed per call for the lean loop's trial; returns
        the new block state and the loop that ran it."""
        loop = self._block_loop
        calls, compiled = loop.calls, len(getattr(loop, "_compiled", ()))
        start = time.perf_counter()
        block = loop(block, *block_args)
        seconds, calls = time.perf_counter() - start, loop.calls - calls
        if calls <= 0 or compiled != len(getattr(loop, "_compiled", ())):
            return block, loop  # nothing ran, or the time includes a compilation
        if isinstance(loop, InPlaceLoop):
            self._quick_per_call.append(seconds / calls)
        elif self._trial is not None and loop is self._trial[1]:
            self._lean_per_call.append(seconds / calls)
            if len(self._lean_per_call) >= LEAN_TRIAL_BLOCKS:
                quick_loop = self._trial[0]
                self._trial = None
                if not lean_is_faster(self._quick_per_call[-8:], self._lean_per_call):
                    self._lean_slower = True
                    self._block_loop = quick_loop
        return block, loop

    def _start_block(self, state, adapt, t_limit, flags):
        C, D = state.z.shape
        T, L = self.block_size, self.max_tree_depth
        rand = draw_block_randomness(C, T, D, L, self.leaf_budget, state.z.dtype, state.z.device)
        rand = with_momenta(rand, state.mass_sqrt, state.inverse_mass)
        block = init_block(
            state.z, state.potential_energy, state.grad, state.inverse_mass,
            state.step_size, adapt.dual_averaging, t_limit, T, L,
        )  # fmt: skip
        return block, (rand, state.inverse_mass, state.mass_sqrt, t_limit) + flags

    def _prepare_block(self, block, block_args) -> None:
        if self._split_pending:
            self._use_split(block, block_args)
        if self._lean_pending:
            self._use_lean(block, block_args)
        else:
            self._poll_lean()

    def sample(self, state: SamplerState) -> tuple[SamplerState, TransitionResult]:
        C, D = state.z.shape
        rand = draw_randomness(C, D, self.max_tree_depth, state.z.dtype, state.z.device)
        tree = init_transition(
            state.z,
            state.potential_energy,
            state.grad,
            rand.momentum_noise,
            state.mass_sqrt,
            state.inverse_mass,
            self.max_tree_depth,
        )
        tree = self._loop(tree, rand, state.step_size, state.inverse_mass)
        if self._loop.interrupted:  # Ctrl-C inside the tree: no transition
            raise KeyboardInterrupt
        result = transition_result(tree)
        new_state = state._replace(
            z=result.z, potential_energy=result.potential_energy, grad=result.grad
        )
        return new_state, result


def split_block_loop(
    *,
    value_and_grad: Callable,
    options: dict,
    max_depth: int,
    max_delta: float,
    target: float,
    chunk_size: int,
) -> SplitLoop:
    """The NUTS block on the split executor (:class:`~.executor.SplitLoop`): the sampler
    graph named by its settings, with the model's ``value_and_grad`` compiled apart, both
    with Inductor ``options`` (:func:`codegen_options`)."""

    def block_step(state, rand, inverse_mass, mass_sqrt, t_limit, adapt_step):
        return block_iteration(
            state, rand, inverse_mass, mass_sqrt, t_limit, adapt_step,
            hole_value_and_grad, max_depth, max_delta, target,
        )  # fmt: skip

    return SplitLoop(
        block_step, value_and_grad, chunk_size, done=_block_done,
        options=options, gradient_options=options,
        graph_name=f"nuts-block-L{max_depth}-{max_delta}-{target}-k{chunk_size}",
    )  # fmt: skip


LEAN_TRIAL_BLOCKS = 2  # blocks the lean loop runs before executor="auto" keeps or drops it


def lean_is_faster(quick_per_call: list[float], lean_per_call: list[float]) -> bool:
    """Whether ``executor="auto"`` keeps the lean loop: its fastest block's time per call
    against the quick path's recent fastest (minima: the blocks least disturbed by other
    work on the machine; both loops run the same graph, one call = one leapfrog step).

    Example::

        >>> lean_is_faster([8e-6, 9e-6], [6e-6, 7e-6])
        True
    """
    return min(lean_per_call) < min(quick_per_call)


def _block_done(state) -> torch.Tensor:
    return state.block_done


def _welford_per_chain(welford, draws_per_chain: list[torch.Tensor]):
    """:func:`welford_update_batch` chain by chain, for blocks of uneven length."""
    parts = [
        welford_update_batch(type(welford)(*(x[c : c + 1] for x in welford)), d.unsqueeze(0))
        for c, d in enumerate(draws_per_chain)
    ]
    return type(welford)(*(torch.cat(xs) for xs in zip(*parts)))


class HMC(_HamiltonianKernel):
    """Hamiltonian Monte Carlo with a fixed number of leapfrog steps or trajectory length.

    Args:
        num_steps: leapfrog steps per draw; or
        trajectory_length: the integration time, ``num_steps = ceil(length / step_size)``
            per chain (default ``2 * pi`` when neither is given).
        max_steps: at most this many leapfrog steps per draw (``trajectory_length``).
        block_size: transitions per chain between returns to Python. A block runs the
            transitions of all chains as one state machine over leapfrog steps
            (:mod:`~probtorch.inference.mcmc.hmc_block`), compiled as an in-place graph as
            NUTS's blocks are: momentum, trajectory, Metropolis decision and step-size
            adaptation; a chain with fewer steps starts its next trajectory without waiting.
        Other arguments as for :class:`NUTS`.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference import MCMC
        >>> def model():
        ...     pt.sample("x", dist.Normal(0.0, 1.0))
        >>> mcmc = MCMC(HMC(model, num_steps=5, compile=False), num_warmup=50,
        ...             num_samples=50, progress_bar=False, seed=0)
        >>> mcmc.run()
        >>> mcmc.get_samples()["x"].shape
        torch.Size([50])
    """

    def __init__(
        self,
        model: Callable | None = None,
        *,
        num_steps: int | None = None,
        trajectory_length: float | None = None,
        max_steps: int = 1024,
        block_size: int = 64,
        **kwargs,
    ):
        _check_options(type(self), kwargs)
        super().__init__(model, **kwargs)
        if num_steps is not None and trajectory_length is not None:
            raise ValueError("give num_steps or trajectory_length, not both")
        if num_steps is not None:
            num_steps = _integer("num_steps", num_steps)
            if num_steps < 1:
                raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        max_steps = _integer("max_steps", max_steps)
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if trajectory_length is not None and not trajectory_length > 0:
            raise ValueError(f"trajectory_length must be positive, got {trajectory_length}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if num_steps is None and trajectory_length is None:
            trajectory_length = 2 * math.pi
        self.num_steps = num_steps
        self.trajectory_length = trajectory_length
        self.max_steps = int(max_steps)
        self.block_size = int(block_size)

    def _build(self, potential: Potential) -> None:
        value_and_grad = potential.raw_value_and_grad
        settings = (self.num_steps, self.trajectory_length, self.max_steps)
        target = self.target_accept_prob

        def iteration(state, step_size, inverse_mass):
            return hmc_iteration(state, value_and_grad, step_size, inverse_mass)

        def block_step(state, rand, inverse_mass, t_limit, adapt_step):
            return hmc_block_iteration(
                state, rand, inverse_mass, t_limit, adapt_step, value_and_grad, *settings, target
            )

        options = codegen_options(potential)
        if potential.compiled:  # in-place graphs, as NUTS's blocks
            self._loop = InPlaceLoop(iteration, self.chunk_size, options=options)
            self._block_loop = InPlaceLoop(
                block_step, self.chunk_size, done=_block_done, options=options
            )
        else:
            self._loop = ChunkedLoop(iteration, self.chunk_size, False, options=options)
            self._block_loop = ChunkedLoop(block_step, self.chunk_size, False, done=_block_done)

    def _start_block(self, state, adapt, t_limit, flags):
        C, T = state.z.shape[0], self.block_size
        rand = draw_hmc_block_randomness(C, T, state.mass_sqrt, state.inverse_mass)
        block = init_hmc_block(
            state.z, state.potential_energy, state.grad, state.step_size,
            adapt.dual_averaging, t_limit, T,
        )  # fmt: skip
        return block, (rand, state.inverse_mass, t_limit) + flags

    def sample(self, state: SamplerState) -> tuple[SamplerState, TransitionResult]:
        """One transition for every chain (outside the blocks :meth:`run_segment` runs)."""
        C, D = state.z.shape
        rand = hmc_draw_randomness(C, D, state.z.dtype, state.z.device)
        steps = trajectory_steps(
            state.step_size, self.num_steps, self.trajectory_length, self.max_steps
        )
        traj = hmc_init(
            state.z,
            state.potential_energy,
            state.grad,
            rand.momentum_noise,
            state.mass_sqrt,
            state.inverse_mass,
            steps,
        )
        traj = self._loop(traj, state.step_size, state.inverse_mass)
        if self._loop.interrupted:  # Ctrl-C inside the trajectory: no transition
            raise KeyboardInterrupt
        result = metropolis(traj, state.inverse_mass, rand.accept_u)
        new_state = state._replace(
            z=result.z, potential_energy=result.potential_energy, grad=result.grad
        )
        return new_state, result
