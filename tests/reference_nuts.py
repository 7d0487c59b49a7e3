"""A plain, eager, one-chain NUTS transition written for clarity, not speed.

It keeps every leaf of the trajectory in Python lists and checks the no-U-turn criterion of
every (sub)tree by brute force, as in Stan's recursive ``build_tree`` (checks around each
merged tree and across its two halves), with the same random numbers as the compiled state
machine: a direction and a merge uniform per doubling, a uniform per leaf. The compiled
kernel must reproduce it draw for draw.
"""

import math

import torch


def _no_uturn(inv_mass, r_minus, r_plus, rho):
    return (
        float((inv_mass * r_plus * rho).sum()) > 0 and float((inv_mass * r_minus * rho).sum()) > 0
    )


def _merged_ok(inv_mass, first, second):
    """Stan's three checks for two neighbouring parts, each a list of momenta in order."""
    rho_a, rho_b = sum(first), sum(second)
    return (
        _no_uturn(inv_mass, first[0], second[-1], rho_a + rho_b)
        and _no_uturn(inv_mass, first[0], second[0], rho_a + second[0])
        and _no_uturn(inv_mass, first[-1], second[-1], rho_b + first[-1])
    )


def reference_transition(
    value_and_grad, z, pe, grad, noise, go_right, merge_u, leaf_u, step_size, inv_mass,
    max_depth=10, max_delta_energy=1000.0,
):  # fmt: skip
    """One NUTS transition for one chain with a diagonal inverse mass ``inv_mass`` (D,)."""
    r0 = noise / inv_mass.sqrt()
    h0 = float(pe) + 0.5 * float((inv_mass * r0 * r0).sum())
    tree = [(z, r0, pe, grad)]  # leaves in time order
    proposal = tree[0]
    log_w = 0.0
    num_steps, sum_accept, diverging, depth = 0, 0.0, False, 0
    while depth < max_depth:
        right = bool(go_right[depth])
        edge = tree[-1] if right else tree[0]
        eps = step_size if right else -step_size
        sub, sub_log_w, sub_prop, invalid = [], -math.inf, None, False
        for n in range(2**depth):
            z_e, r_e, _, g_e = edge
            r_half = r_e - 0.5 * eps * g_e
            z_new = z_e + eps * inv_mass * r_half
            pe_new, g_new = value_and_grad(z_new)
            r_new = r_half - 0.5 * eps * g_new
            h = float(pe_new) + 0.5 * float((inv_mass * r_new * r_new).sum())
            delta = h - h0
            if math.isnan(delta):
                delta = math.inf
            sum_accept += min(1.0, math.exp(-delta)) if delta < math.inf else 0.0
            leaf = (z_new, r_new, pe_new, g_new)
            new_log_w = float(torch.logaddexp(torch.tensor(sub_log_w), torch.tensor(-delta)))
            if n == 0 or float(leaf_u[num_steps]) < math.exp(-delta - new_log_w):
                sub_prop = leaf
            num_steps += 1
            sub_log_w = new_log_w
            sub.append(leaf)
            edge = leaf
            if delta > max_delta_energy:
                diverging = invalid = True
                break
            for j in range(1, depth + 1):  # every sub-subtree that ends at this leaf
                size = 2**j
                if (n + 1) % size:
                    break
                block = [leaf[1] for leaf in sub[n + 1 - size : n + 1]]
                if not _merged_ok(inv_mass, block[: size // 2], block[size // 2 :]):
                    invalid = True
                    break
            if invalid:
                break
        if invalid:
            break
        if float(merge_u[depth]) < math.exp(sub_log_w - log_w):
            proposal = sub_prop
        log_w = float(torch.logaddexp(torch.tensor(log_w), torch.tensor(sub_log_w)))
        old = [leaf[1] for leaf in tree]
        new = [leaf[1] for leaf in sub]
        tree = tree + sub if right else list(reversed(sub)) + tree
        depth += 1
        first, second = (old, new) if right else (list(reversed(new)), old)
        if not _merged_ok(inv_mass, first, second):
            break
    return proposal, dict(
        num_steps=num_steps,
        accept_prob=sum_accept / max(num_steps, 1),
        diverging=diverging,
        tree_depth=depth,
    )
