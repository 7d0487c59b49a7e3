"""The No-U-Turn Sampler as a flat state machine: one iteration = one leapfrog per chain.

This is Stan's NUTS (multinomial sampling over the trajectory, the generalized no-U-turn
criterion including the checks across neighbouring subtrees, biased progressive sampling
between subtrees, a divergence when the energy error exceeds ``max_delta_energy``), laid out
iteratively as in NumPyro: a new subtree of ``2**depth`` leaves is built one leaf at a time,
with uniform progressive (multinomial) sampling inside it, and the U-turn checks of every
sub-subtree that ends at the current leaf are done from ``max_depth`` checkpoints (the
bit tricks of NumPyro's ``_leaf_idx_to_ckpt_idxs``), extended with the momenta Stan's
cross-subtree checks need.

Every chain runs its own tree, in lockstep with the others: a chain that has finished its
transition is frozen (``torch.where``) until all are done. There is no Python branching on
tensor values, so a chunk of iterations compiles into one graph. Random numbers are drawn
outside, per transition (:class:`TransitionRandomness`), so compiled and eager execution
give the same draws.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .integrator import kinetic_energy, leapfrog_velocity, sample_momentum, velocity

__all__ = [
    "TransitionRandomness",
    "NUTSState",
    "draw_randomness",
    "init_transition",
    "start_transition",
    "nuts_iteration",
    "nuts_step",
    "transition_result",
]


class TransitionRandomness(NamedTuple):
    """The random numbers one NUTS transition may use, per chain."""

    momentum_noise: torch.Tensor  # (C, D) standard normal
    go_right: torch.Tensor  # (C, max_depth) bool: direction of each doubling
    merge_u: torch.Tensor  # (C, max_depth) uniform: biased progressive sampling
    leaf_u: torch.Tensor  # (C, 2**max_depth) uniform: multinomial sampling per leaf


class NUTSState(NamedTuple):
    """The state of one NUTS transition in progress, batched over chains."""

    # trajectory edges and the current proposal
    z_left: torch.Tensor
    r_left: torch.Tensor
    g_left: torch.Tensor
    z_right: torch.Tensor
    r_right: torch.Tensor
    g_right: torch.Tensor
    z_prop: torch.Tensor
    pe_prop: torch.Tensor
    g_prop: torch.Tensor
    energy0: torch.Tensor  # Hamiltonian at the start
    log_weight: torch.Tensor  # log sum of the tree's leaf weights
    rho: torch.Tensor  # sum of the tree's momenta
    depth: torch.Tensor  # completed (valid) doublings
    done: torch.Tensor
    # the subtree being built
    leaf: torch.Tensor  # index of the next leaf in the subtree
    z_sub: torch.Tensor
    r_sub: torch.Tensor
    pe_sub: torch.Tensor
    g_sub: torch.Tensor
    log_weight_sub: torch.Tensor
    rho_sub: torch.Tensor
    r_sub_first: torch.Tensor  # momentum of the subtree's first leaf
    r_inner: torch.Tensor  # momentum of the edge the subtree grows from
    r_prev: torch.Tensor  # momentum of the previous leaf
    # Checkpoints, one row per level of the subtrees open at the current leaf (stored at the
    # even leaf where such a subtree starts), holding what their U-turn checks need so that
    # each check is a few dot products with the current leaf's momentum sum and velocity:
    ckpt_u: torch.Tensor  # (C, max_depth, D) momentum sum of the subtree before the start
    ckpt_w: torch.Tensor  # (C, max_depth, D) the same without the leaf before the start
    ckpt_vu: torch.Tensor  # (C, max_depth) start velocity . ckpt_u
    ckpt_vpw: torch.Tensor  # (C, max_depth) velocity of the leaf before . ckpt_w
    # (C, max_depth) > 0 where the enclosing subtree's first half is no U-turn (the smaller
    # of Stan's two criterion values, kept as a float: Inductor mis-compiles shifted booleans)
    ckpt_first: torch.Tensor
    # velocities M^{-1} r of the previous leaf and of the checkpointed momenta, kept so that
    # each leapfrog multiplies by the metric for a few momenta only (not 3 * max_depth)
    v_prev: torch.Tensor
    ckpt_v: torch.Tensor  # (C, max_depth, D) at the start
    ckpt_v_prev: torch.Tensor  # (C, max_depth, D) at the leaf before the start
    # velocities of the edges' momenta, of the subtree's first leaf and of the edge it grows
    # from: Stan's checks across subtrees need them at every leaf (three products with a
    # dense metric per leapfrog otherwise)
    v_left: torch.Tensor
    v_right: torch.Tensor
    v_sub_first: torch.Tensor
    v_inner: torch.Tensor
    # M^{-1} g at the edges, the subtree's sample and the proposal: a leapfrog step updates
    # the velocity with it, so that with a dense metric it multiplies by the metric once
    # (M^{-1} of the new gradient), not twice (the half-step momentum and the new momentum)
    mg_left: torch.Tensor
    mg_right: torch.Tensor
    mg_sub: torch.Tensor
    mg_prop: torch.Tensor
    # statistics
    num_steps: torch.Tensor
    sum_accept: torch.Tensor
    diverging: torch.Tensor
    # Hamiltonian at the subtree's sample and at the proposal, kept so that the draw's
    # energy needs no product with the metric when the transition ends
    energy_sub: torch.Tensor
    energy_prop: torch.Tensor


def draw_randomness(
    num_chains: int, dim: int, max_depth: int, dtype: torch.dtype, device=None
) -> TransitionRandomness:
    """Draw one transition's random numbers from torch's generator."""
    return TransitionRandomness(
        torch.randn(num_chains, dim, dtype=dtype, device=device),
        torch.rand(num_chains, max_depth, device=device) < 0.5,
        torch.rand(num_chains, max_depth, dtype=dtype, device=device),
        torch.rand(num_chains, 2**max_depth, dtype=dtype, device=device),
    )


def init_transition(
    z: torch.Tensor,
    potential_energy: torch.Tensor,
    grad: torch.Tensor,
    momentum_noise: torch.Tensor,
    mass_sqrt: torch.Tensor,
    inverse_mass: torch.Tensor,
    max_depth: int,
) -> NUTSState:
    """Start a transition at ``z``: fresh momentum, a one-point tree."""
    r = sample_momentum(mass_sqrt, momentum_noise)
    v = velocity(inverse_mass, r)
    kinetic = kinetic_energy(inverse_mass, r, v)
    mg = velocity(inverse_mass, grad)
    return start_transition(z, potential_energy, grad, mg, r, v, kinetic, max_depth)


def start_transition(
    z: torch.Tensor,
    potential_energy: torch.Tensor,
    grad: torch.Tensor,
    minv_grad: torch.Tensor,
    r: torch.Tensor,
    v: torch.Tensor,
    kinetic: torch.Tensor,
    max_depth: int,
) -> NUTSState:
    """:func:`init_transition` from ``M^{-1} grad`` and a momentum ``r`` already drawn,
    its velocity ``v = M^{-1} r`` and its kinetic energy ``r . v / 2``."""
    C, D = z.shape
    energy0 = potential_energy + kinetic
    zeros_cd = torch.zeros_like(z)
    zeros_c = torch.zeros_like(potential_energy)
    long_zeros = torch.zeros(C, dtype=torch.int64, device=z.device)
    false = torch.zeros(C, dtype=torch.bool, device=z.device)
    ckpt = torch.zeros(C, max_depth, D, dtype=z.dtype, device=z.device)
    ckpt_dot = torch.zeros(C, max_depth, dtype=z.dtype, device=z.device)
    # .clone(): every state tensor its own buffer (compiled in-place updates need that)
    return NUTSState(
        z.clone(), r.clone(), grad.clone(),
        z.clone(), r.clone(), grad.clone(),
        z.clone(), potential_energy.clone(), grad.clone(),
        energy0, zeros_c.clone(), r.clone(), long_zeros.clone(), false.clone(),
        long_zeros.clone(), z.clone(), r.clone(), potential_energy.clone(), grad.clone(),
        zeros_c.clone(), zeros_cd.clone(), zeros_cd.clone(), zeros_cd.clone(), r.clone(),
        ckpt.clone(), ckpt.clone(), ckpt_dot.clone(), ckpt_dot.clone(), ckpt_dot.clone(),
        v.clone(), ckpt.clone(), ckpt.clone(),
        v.clone(), v.clone(), zeros_cd.clone(), zeros_cd.clone(),
        minv_grad.clone(), minv_grad.clone(), minv_grad.clone(), minv_grad.clone(),
        long_zeros.clone(), zeros_c.clone(), false.clone(),
        energy0.clone(), energy0.clone(),
    )  # fmt: skip


# Fields a transition writes before it reads them: the subtree's at its first leaf, each
# checkpoint at an even leaf of the subtree that reads it. A new transition need not reset
# them; it must set all the others (RESET_FIELDS, as init_transition makes them).
WRITTEN_BEFORE_READ = frozenset(
    ("z_sub", "r_sub", "pe_sub", "g_sub", "log_weight_sub", "rho_sub", "r_sub_first", "r_inner")
    + ("energy_sub", "mg_sub")
    + ("ckpt_u", "ckpt_w", "ckpt_vu", "ckpt_vpw", "ckpt_first", "ckpt_v", "ckpt_v_prev")
    + ("v_sub_first", "v_inner")
)
RESET_FIELDS = tuple(name for name in NUTSState._fields if name not in WRITTEN_BEFORE_READ)


def _popcount(x: torch.Tensor, bits: int) -> torch.Tensor:
    shifts = torch.arange(bits, device=x.device)
    return ((x.unsqueeze(-1) >> shifts) & 1).sum(-1)


def _no_uturn(v_minus, v_plus, rho) -> torch.Tensor:
    """Stan's criterion: both ends' velocities point along the momentum sum."""
    return ((v_plus * rho).sum(-1) > 0) & ((v_minus * rho).sum(-1) > 0)


def _uturn_margin(v_minus, v_plus, rho) -> torch.Tensor:
    """The smaller of the two values :func:`_no_uturn` compares with 0 (> 0: no U-turn)."""
    return torch.minimum((v_plus * rho).sum(-1), (v_minus * rho).sum(-1))


def nuts_iteration(
    state: NUTSState,
    rand: TransitionRandomness,
    value_and_grad: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    step_size: torch.Tensor,
    inverse_mass: torch.Tensor,
    max_depth: int,
    max_delta_energy: float = 1000.0,
) -> NUTSState:
    """Advance every unfinished chain by one leapfrog step of its NUTS transition."""
    u_leaf = rand.leaf_u.gather(-1, state.num_steps.unsqueeze(-1)).squeeze(-1)
    return nuts_step(
        state, rand.go_right, rand.merge_u, u_leaf, value_and_grad, step_size, inverse_mass,
        max_depth, max_delta_energy,
    )  # fmt: skip


def nuts_step(
    state: NUTSState,
    go_right: torch.Tensor,
    merge_u: torch.Tensor,
    u_leaf: torch.Tensor,
    value_and_grad: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    step_size: torch.Tensor,
    inverse_mass: torch.Tensor,
    max_depth: int,
    max_delta_energy: float = 1000.0,
    freeze_finished: bool = True,
) -> NUTSState:
    """:func:`nuts_iteration` with this transition's random numbers given directly.

    ``go_right`` and ``merge_u`` are ``(C, max_depth)``, one per doubling; ``u_leaf`` is the
    uniform for the leaf this iteration adds, ``(C,)``. With ``freeze_finished=False`` only
    ``done`` stays set for chains that had finished; their other fields hold values nobody
    may read (for callers that restart finished chains at once, as the block executor
    does: one select fewer per state field in its graph).
    """
    s = state
    active = ~s.done
    levels = torch.arange(max_depth, device=s.leaf.device)
    depth_idx = s.depth.clamp(max=max_depth - 1).unsqueeze(-1)
    right_now = go_right.gather(-1, depth_idx).squeeze(-1)
    right = right_now.unsqueeze(-1)

    # one leapfrog from the edge the subtree grows from
    z_edge = torch.where(right, s.z_right, s.z_left)
    r_edge = torch.where(right, s.r_right, s.r_left)
    v_edge = torch.where(right, s.v_right, s.v_left)
    g_edge = torch.where(right, s.g_right, s.g_left)
    mg_edge = torch.where(right, s.mg_right, s.mg_left)
    signed_step = torch.where(right_now, step_size, -step_size)
    z, r, v, pe, g, mg = leapfrog_velocity(
        value_and_grad, z_edge, r_edge, v_edge, g_edge, mg_edge, signed_step, inverse_mass
    )
    energy = pe + kinetic_energy(inverse_mass, r, v)
    delta = energy - s.energy0
    delta = torch.where(torch.isnan(delta), torch.full_like(delta, float("inf")), delta)
    leaf_diverging = delta > max_delta_energy
    accept_prob = torch.exp(torch.clamp(-delta, max=0.0))
    log_w_leaf = -delta

    # multinomial sampling inside the subtree, one leaf at a time
    first = s.leaf == 0
    neg_inf = torch.full_like(delta, float("-inf"))
    log_w_sub = torch.logaddexp(torch.where(first, neg_inf, s.log_weight_sub), log_w_leaf)
    take = first | (u_leaf < torch.exp(log_w_leaf - log_w_sub))
    take_ = take.unsqueeze(-1)
    z_sub = torch.where(take_, z, s.z_sub)
    r_sub = torch.where(take_, r, s.r_sub)
    pe_sub = torch.where(take, pe, s.pe_sub)
    energy_sub = torch.where(take, energy, s.energy_sub)
    g_sub = torch.where(take_, g, s.g_sub)
    mg_sub = torch.where(take_, mg, s.mg_sub)
    first_ = first.unsqueeze(-1)
    rho_sub = torch.where(first_, torch.zeros_like(r), s.rho_sub) + r
    r_sub_first = torch.where(first_, r, s.r_sub_first)
    r_inner = torch.where(first_, r_edge, s.r_inner)
    v_sub_first = torch.where(first_, v, s.v_sub_first)
    v_inner = torch.where(first_, v_edge, s.v_inner)

    # checkpoints: at an even leaf, store what the checks of the subtrees starting here need
    leaf = s.leaf
    idx_max = _popcount(leaf >> 1, max_depth)
    trailing_ones = _popcount(((leaf + 1) & ~leaf) - 1, max_depth + 1)
    idx_min = idx_max - trailing_ones + 1
    even = (leaf & 1) == 0
    at_max = levels == idx_max.unsqueeze(-1)  # (C, L)
    # one row per chain is written (index_put: D elements per chain, not max_depth * D);
    # the clamp only matters for chains whose values nobody reads (see freeze_finished)
    chains = torch.arange(leaf.shape[0], device=leaf.device)
    slot = idx_max.clamp(0, max_depth - 1)

    def store(buf, value):
        keep = even.reshape(even.shape + (1,) * (value.dim() - 1))
        return buf.index_put((chains, slot), torch.where(keep, value, buf[chains, slot]))

    u = rho_sub - r  # the subtree's momentum sum before this leaf
    w = u - s.r_prev
    ckpt_u = store(s.ckpt_u, u)
    ckpt_w = store(s.ckpt_w, w)
    ckpt_vu = store(s.ckpt_vu, (v * u).sum(-1))
    ckpt_vpw = store(s.ckpt_vpw, (s.v_prev * w).sum(-1))
    ckpt_v = store(s.ckpt_v, v)
    ckpt_v_prev = store(s.ckpt_v_prev, s.v_prev)
    # the subtree starting here is the second half of the one starting a level below (the
    # enclosing subtree, whose first half ends at the previous leaf): check that first half
    # now, while the momentum sum is its own. Row slot - 1 is read after the stores, which
    # leave it as it was (the value at slot 0 is never read); reading a buffer after its
    # update lets the compiled graph write it in place instead of copying it.
    below = (slot - 1).clamp(min=0)
    first_half = rho_sub - ckpt_u[chains, below]
    ckpt_first = store(s.ckpt_first, _uturn_margin(ckpt_v[chains, below], v, first_half))

    # at odd leaves (where the stores above keep every row: reading the stored buffers lets
    # the compiled graph update them in place instead of copying them), check every
    # sub-subtree that ends here, levels idx_min..idx_max. Level i starts at checkpoint i,
    # its second half at checkpoint i + 1, or at this leaf for the smallest (whose first
    # half is its start: the check of the whole covers it). Stan's criterion on the whole
    # (start velocity and v against rho_sub - u), on the first half extended by the second's
    # first leaf, and on the second half extended by the first's last leaf: every momentum
    # sum is rho_sub minus a stored one, so each check is a difference of dot products,
    # four D-long reductions per level.
    v_rho = (v * rho_sub).sum(-1, keepdim=True)
    rho_ = rho_sub.unsqueeze(1)
    v_ = v.unsqueeze(1)
    # (a check is "both values > 0", i.e. their minimum > 0; a NaN fails it either way)
    whole_ok = ((ckpt_v * rho_).sum(-1) > ckpt_vu) & (v_rho > (ckpt_u * v_).sum(-1))
    second_at_ckpt = torch.minimum(
        (ckpt_v_prev * rho_).sum(-1) - ckpt_vpw, v_rho - (ckpt_w * v_).sum(-1)
    )
    second_at_leaf = _uturn_margin(s.v_prev, v, r + s.r_prev).unsqueeze(-1)

    def next_level(x):  # row i + 1 at row i (the last row is never read: it is at_max there)
        return torch.nn.functional.pad(x[:, 1:], (0, 1))

    keeps_going = (
        whole_ok
        & (at_max | (next_level(ckpt_first) > 0))
        & (torch.where(at_max, second_at_leaf, next_level(second_at_ckpt)) > 0)
    )
    checked = (
        (~even).unsqueeze(-1)
        & (levels >= idx_min.unsqueeze(-1))
        & (levels <= idx_max.unsqueeze(-1))
    )
    sub_turning = (checked & ~keeps_going).any(-1)

    # subtree finished: merge it into the tree (biased progressive sampling)
    next_leaf = leaf + 1
    sub_done = (next_leaf == (1 << s.depth)) | sub_turning | leaf_diverging
    valid = sub_done & ~sub_turning & ~leaf_diverging
    u_merge = merge_u.gather(-1, depth_idx).squeeze(-1)
    accept_sub = valid & (u_merge < torch.exp(log_w_sub - s.log_weight))
    accept_ = accept_sub.unsqueeze(-1)
    z_prop = torch.where(accept_, z_sub, s.z_prop)
    pe_prop = torch.where(accept_sub, pe_sub, s.pe_prop)
    energy_prop = torch.where(accept_sub, energy_sub, s.energy_prop)
    g_prop = torch.where(accept_, g_sub, s.g_prop)
    mg_prop = torch.where(accept_, mg_sub, s.mg_prop)
    log_weight = torch.where(valid, torch.logaddexp(s.log_weight, log_w_sub), s.log_weight)
    v_outer = torch.where(right, s.v_left, s.v_right)
    rho_total = s.rho + rho_sub
    v_new = v
    # Stan's checks around the merged tree and across the two parts (each part extended by
    # the neighbouring point of the other); they do not depend on the direction.
    tree_keeps_going = (
        _no_uturn(v_outer, v_new, rho_total)
        & _no_uturn(v_outer, v_sub_first, s.rho + r_sub_first)
        & _no_uturn(v_inner, v_new, rho_sub + r_inner)
    )
    rho = torch.where(valid.unsqueeze(-1), rho_total, s.rho)
    depth = torch.where(valid, s.depth + 1, s.depth)
    finished = sub_done & (~valid | ~tree_keeps_going | (depth >= max_depth))

    # the edge the subtree grows from moves to the new leaf
    grow_right = right & active.unsqueeze(-1)
    grow_left = ~right & active.unsqueeze(-1)
    new = NUTSState(
        torch.where(grow_left, z, s.z_left),
        torch.where(grow_left, r, s.r_left),
        torch.where(grow_left, g, s.g_left),
        torch.where(grow_right, z, s.z_right),
        torch.where(grow_right, r, s.r_right),
        torch.where(grow_right, g, s.g_right),
        z_prop, pe_prop, g_prop,
        s.energy0, log_weight, rho, depth, s.done | finished,
        torch.where(sub_done, torch.zeros_like(next_leaf), next_leaf),
        z_sub, r_sub, pe_sub, g_sub, log_w_sub, rho_sub, r_sub_first, r_inner, r,
        ckpt_u, ckpt_w, ckpt_vu, ckpt_vpw, ckpt_first, v, ckpt_v, ckpt_v_prev,
        torch.where(grow_left, v, s.v_left), torch.where(grow_right, v, s.v_right),
        v_sub_first, v_inner,
        torch.where(grow_left, mg, s.mg_left), torch.where(grow_right, mg, s.mg_right),
        mg_sub, mg_prop,
        s.num_steps + 1, s.sum_accept + accept_prob, s.diverging | leaf_diverging,
        energy_sub, energy_prop,
    )  # fmt: skip
    if not freeze_finished:
        return new
    # chains that had already finished keep their state
    return NUTSState(*(_keep(active, n, o) for n, o in zip(new, s)))


def _keep(active: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    mask = active.reshape(active.shape + (1,) * (new.dim() - 1))
    return torch.where(mask, new, old)


class TransitionResult(NamedTuple):
    z: torch.Tensor
    potential_energy: torch.Tensor
    grad: torch.Tensor
    energy: torch.Tensor  # Hamiltonian at the draw (ArviZ's "energy")
    tree_depth: torch.Tensor
    num_steps: torch.Tensor
    accept_prob: torch.Tensor  # mean Metropolis acceptance over the trajectory
    diverging: torch.Tensor
    minv_grad: torch.Tensor | None = None  # M^{-1} grad (NUTS: the next transition's start)


def transition_result(state: NUTSState) -> TransitionResult:
    """The draw and the statistics of a finished transition (the proposal's Hamiltonian is
    kept along the tree, so no product with the metric is needed here)."""
    steps = state.num_steps.clamp(min=1).to(state.sum_accept.dtype)
    return TransitionResult(
        state.z_prop,
        state.pe_prop,
        state.g_prop,
        state.energy_prop,
        state.depth,
        state.num_steps,
        state.sum_accept / steps,
        state.diverging,
        state.mg_prop,
    )
