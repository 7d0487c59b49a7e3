"""Discrete latent sites summed out of the potential (parallel enumeration), as Pyro's and
NumPyro's HMC do: the potential against brute-force sums over every assignment, the
pointwise log likelihood against the same, NUTS against a posterior by quadrature, the
compiled sampler against the eager one, and the errors for what cannot be summed out."""

import itertools
import math
import warnings

import arviz as az
import numpy as np
import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import substitute, trace
from probtorch.inference import HMC, MCMC, NUTS, SVI, Predictive, Trace_ELBO, TraceEnum_ELBO
from probtorch.inference.autoguide import AutoDelta
from probtorch.inference.potential import Potential

pytestmark = pytest.mark.usefixtures("float64")

LOCS = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
PRIOR = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
SWITCH = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)


def nested(w, y):
    """A global discrete site, a discrete site local to plate A (depending on the global
    one), observations in plate C and in plate B nested in A, a continuous scale."""
    scale = pt.sample("scale", dist.HalfNormal(2.0))
    z1 = pt.sample("z1", dist.Categorical(PRIOR))
    with pt.plate("C", w.shape[0]):
        pt.sample("w", dist.Normal(LOCS[z1], scale), obs=w)
    with pt.plate("A", y.shape[0], dim=-2):
        z2 = pt.sample("z2", dist.Bernoulli(SWITCH[z1]))
        with pt.plate("B", y.shape[1], dim=-1):
            pt.sample("y", dist.Normal(LOCS[z1] * z2 - 0.5 * z2, scale), obs=y)


def _nested_data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, generator=g), torch.randn(4, 2, generator=g)


def _assignments():
    """Every value of (z1, z2) in ``nested`` for 4 elements of plate A."""
    for a in range(3):
        for bits in itertools.product([0.0, 1.0], repeat=4):
            yield {"z1": torch.tensor(a), "z2": torch.tensor(bits).reshape(4, 1)}


def test_potential_sums_the_discrete_sites_out_exactly():
    w, y = _nested_data()
    potential = Potential(nested, (w, y), compile=False)
    assert potential.enumerated == {"z1", "z2"} and potential.site_names == ["scale"]
    z = torch.tensor([[0.3], [-0.4]], dtype=torch.float64)
    for chain in range(2):
        scale = z[chain, 0].exp()
        joint = [
            trace(substitute(nested, data={**values, "scale": scale})).get_trace(w, y)
            for values in _assignments()
        ]
        log_marginal = torch.logsumexp(torch.stack([t.log_prob_sum() for t in joint]), 0)
        expected = -(log_marginal + z[chain, 0])  # log |d scale / dz| = z
        torch.testing.assert_close(potential(z)[chain], expected, rtol=1e-12, atol=1e-12)
    value, grad = potential.value_and_grad(z)
    torch.testing.assert_close(value, potential(z))
    assert torch.isfinite(grad).all()


def test_pointwise_log_likelihood_sums_the_discrete_sites_out_per_element():
    """``log p(w_c | scale)`` and ``log p(y_ab | scale)``, each marginal over the discrete
    sites' prior (what LOO needs of a mixture)."""
    w, y = _nested_data()
    potential = Potential(nested, (w, y), compile=False)
    scales = torch.tensor([0.8, 1.7], dtype=torch.float64)
    log_lik = potential.log_likelihood({"scale": scales})
    assert log_lik["w"].shape == (2, 3) and log_lik["y"].shape == (2, 4, 2)
    for i, scale in enumerate(scales):
        # w_c: sum over z1 of p(z1) p(w_c | z1)
        per_z1 = PRIOR.log()[:, None] + dist.Normal(LOCS[:, None], scale).log_prob(w)
        torch.testing.assert_close(log_lik["w"][i], torch.logsumexp(per_z1, 0))
        # y_ab: sum over z1 and z2_a of p(z1) p(z2_a | z1) p(y_ab | z1, z2_a)
        terms = []
        for a, bit in itertools.product(range(3), [0.0, 1.0]):
            prior = PRIOR[a].log() + dist.Bernoulli(SWITCH[a]).log_prob(torch.tensor(bit))
            loc = LOCS[a] * bit - 0.5 * bit
            terms.append(prior + dist.Normal(loc, scale).log_prob(y))
        torch.testing.assert_close(log_lik["y"][i], torch.logsumexp(torch.stack(terms), 0))


def test_discrete_draws_follow_their_conditional_distribution():
    """20,000 draws of (z1, z2) given one value of the scale, against the probabilities of
    the 48 assignments by brute force: each frequency within 5 standard errors (the local
    sites are summed out first, so the global site is drawn first, then the local ones
    given it)."""
    w, y = _nested_data()
    potential = Potential(nested, (w, y), compile=False)
    S, scale = 20000, torch.tensor(0.9, dtype=torch.float64)
    draws = potential.sample_discrete({"scale": scale.expand(S)}, seed=0)
    assert draws["z1"].shape == (S,) and draws["z2"].shape == (S, 4, 1)
    keys, log_joint = [], []
    for values in _assignments():
        tr = trace(substitute(nested, data={**values, "scale": scale})).get_trace(w, y)
        log_joint.append(tr.log_prob_sum())
        keys.append((int(values["z1"]), *values["z2"].reshape(-1).long().tolist()))
    exact = torch.softmax(torch.stack(log_joint), 0)
    drawn = [
        (a, *b) for a, b in zip(draws["z1"].tolist(), draws["z2"].reshape(S, 4).long().tolist())
    ]
    index = torch.tensor([keys.index(key) for key in drawn])
    freq = torch.bincount(index, minlength=len(keys)).double() / S
    se = (exact * (1 - exact) / S).sqrt()
    assert ((freq - exact).abs() <= 5 * se + 1e-12).all(), ((freq - exact).abs() / se).max()
    again = potential.sample_discrete({"scale": scale.expand(S)}, seed=0)
    assert all(torch.equal(again[k], draws[k]) for k in draws)


def test_temperature_zero_gives_the_most_probable_assignment():
    """Max-product in place of the sums: the joint argmax of the 48 assignments, for each
    of several values of the scale, global site first then the local one given it."""
    w, y = _nested_data()
    potential = Potential(nested, (w, y), compile=False)
    scales = torch.tensor([0.3, 0.9, 2.0, 4.0], dtype=torch.float64)
    best = potential.sample_discrete({"scale": scales}, temperature=0)
    for i, scale in enumerate(scales):
        assignments = list(_assignments())
        log_joint = torch.stack(
            [
                trace(substitute(nested, data={**v, "scale": scale})).get_trace(w, y).log_prob_sum()
                for v in assignments
            ]
        )
        expected = assignments[int(log_joint.argmax())]
        assert int(best["z1"][i]) == int(expected["z1"])
        assert torch.equal(best["z2"][i], expected["z2"].to(best["z2"].dtype))
    with pytest.raises(ValueError, match="temperature must be 0 or 1"):
        potential.sample_discrete({"scale": scales}, temperature=0.5)


def continuous_given_discrete(y):
    """A continuous latent site whose distribution depends on a summed-out site."""
    z = pt.sample("z", dist.Categorical(PRIOR))
    x = pt.sample("x", dist.Normal(LOCS[z], 0.7))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(x, 1.0), obs=y)


def test_a_continuous_site_may_depend_on_a_summed_out_one():
    y = torch.tensor([0.4, 1.1, 2.3], dtype=torch.float64)
    potential = Potential(continuous_given_discrete, (y,), compile=False)
    z = torch.tensor([[0.2], [1.5]], dtype=torch.float64)
    x = z[:, :1]
    prior = torch.logsumexp(PRIOR.log() + dist.Normal(LOCS, 0.7).log_prob(x), -1)
    expected = -(prior + dist.Normal(x, 1.0).log_prob(y).sum(-1))
    torch.testing.assert_close(potential(z), expected)


TRANSITIONS = torch.tensor(
    [[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]], dtype=torch.float64
)


def chain(y):
    """A hidden Markov chain written as a Python loop: each state a site of its own."""
    scale = pt.sample("scale", dist.HalfNormal(1.0))
    state = 0
    for t in range(y.shape[0]):
        state = pt.sample(f"z{t}", dist.Categorical(TRANSITIONS[state]))
        pt.sample(f"y{t}", dist.Normal(LOCS[state], scale), obs=y[t])


def test_a_chain_of_discrete_sites_is_summed_out_as_the_forward_algorithm_does():
    """Twenty states summed out one at a time (variable elimination), not as one
    3 ** 20 tensor, and equal to the forward recursion."""
    y = torch.randn(20, generator=torch.Generator().manual_seed(3))
    potential = Potential(chain, (y,), compile=False)
    z = torch.tensor([[-0.3]], dtype=torch.float64)
    scale = z[0, 0].exp()
    alpha = TRANSITIONS[0].log() + dist.Normal(LOCS, scale).log_prob(y[0])
    for t in range(1, y.shape[0]):
        alpha = torch.logsumexp(alpha[:, None] + TRANSITIONS.log(), 0)
        alpha = alpha + dist.Normal(LOCS, scale).log_prob(y[t])
    expected = -(torch.logsumexp(alpha, 0) + dist.HalfNormal(1.0).log_prob(scale) + z[0, 0])
    torch.testing.assert_close(potential(z)[0], expected)


def test_too_many_discrete_sites_for_torch_dims_are_refused_with_advice():
    potential = Potential(chain, (torch.zeros(70),), compile=False)
    advice = r"'z62' is discrete site number 63.*64 dims.*pt.markov.*DiscreteHMM"
    with pytest.raises(ValueError, match=advice):
        potential(torch.zeros(1, 1))


def mixture(y):
    """Two components with a known first location: the weight and the second location."""
    p = pt.sample("p", dist.Beta(2.0, 2.0))
    mu = pt.sample("mu", dist.Normal(0.0, 3.0))
    with pt.plate("data", y.shape[0]):
        z = pt.sample("z", dist.Bernoulli(p))
        pt.sample("y", dist.Normal(torch.where(z > 0, mu, -1.0), 1.0), obs=y)


def _mixture_data(n=80):
    g = torch.Generator().manual_seed(1)
    second = torch.rand(n, generator=g) < 0.3
    noise = torch.randn(n, generator=g, dtype=torch.float64)
    return torch.where(second, 2.5 + noise, -1.0 + noise)


def _mixture_log_posterior_grid(y, size=600):
    """``(p, mu, log density)`` of the mixture's posterior on a grid (p along dim 0)."""
    p = torch.linspace(1e-4, 1 - 1e-4, size, dtype=torch.float64)[:, None]
    mu = torch.linspace(0.5, 4.5, size, dtype=torch.float64)[None, :]
    mix = torch.logaddexp(
        (1 - p[..., None]).log() + dist.Normal(-1.0, 1.0).log_prob(y),
        p[..., None].log() + dist.Normal(mu[..., None], 1.0).log_prob(y),
    )
    log_post = dist.Beta(2.0, 2.0).log_prob(p) + dist.Normal(0.0, 3.0).log_prob(mu) + mix.sum(-1)
    return p, mu, log_post


def test_compiled_sampler_of_an_enumerated_model_draws_what_the_eager_one_draws():
    from probtorch.inference.compile import count_compiles

    y = _mixture_data()
    runs = {}
    for compiled in (False, True):
        kernel = NUTS(mixture, step_size=0.3, adapt_step_size=False, adapt_mass_matrix=False,
                      compile=compiled)  # fmt: skip
        mcmc = MCMC(kernel, num_warmup=0, num_samples=30, num_chains=3, seed=2,
                    progress_bar=False)  # fmt: skip
        with count_compiles() as first:
            mcmc.run(y)
        runs[compiled] = mcmc
    assert first.graph_breaks == 0
    for name, value in runs[False].get_samples().items():
        torch.testing.assert_close(runs[True].get_samples()[name], value, rtol=0, atol=1e-10)
    assert set(runs[True].get_samples()) == {"p", "mu"}
    compiled = runs[True]
    compiled.post_warmup_state = compiled.last_state
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        compiled.run(y)
    assert later.graph_breaks == 0 and later.graphs == 0


# -- pt.markov: a chain's sites reuse the dims of earlier steps ---------------------------
def markov_chain(y, history=1, keep=False):
    """``chain`` with its loop in ``pt.markov``: with ``history=2`` each state depends on
    the two before it (a second-order chain), through a table indexed by both."""
    scale = pt.sample("scale", dist.HalfNormal(1.0))
    states = [0] * history
    for t in pt.markov(range(y.shape[0]), history=history, keep=keep):
        if history == 1:
            probs = TRANSITIONS[states[-1]]
        else:
            probs = SECOND_ORDER[states[-2], states[-1]]
        state = pt.sample(f"z{t}", dist.Categorical(probs))
        pt.sample(f"y{t}", dist.Normal(LOCS[state], scale), obs=y[t])
        states = states[1:] + [state]


SECOND_ORDER = torch.softmax(
    torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64), -1
)


def _forward(y, scale, history=1):
    """log p(y | scale) by the forward recursion (over pairs of states for history 2)."""
    emit = dist.Normal(LOCS, scale).log_prob(y[:, None])  # (T, 3)
    if history == 1:
        alpha = TRANSITIONS[0].log() + emit[0]
        for t in range(1, len(y)):
            alpha = torch.logsumexp(alpha[:, None] + TRANSITIONS.log(), 0) + emit[t]
        return torch.logsumexp(alpha, 0)
    # alpha[a, b]: states t-1 = a, t = b; the states before 0 are 0
    alpha = torch.full((3, 3), -math.inf, dtype=torch.float64)
    alpha[0] = SECOND_ORDER[0, 0].log() + emit[0]
    for t in range(1, len(y)):
        alpha = torch.logsumexp(alpha[:, :, None] + SECOND_ORDER.log(), 0) + emit[t]
    return torch.logsumexp(alpha.reshape(-1), 0)


def _enumerated_dims(model, args):
    """The dim along which each summed-out site's values lie in one run of the potential."""
    potential = Potential(model, args, compile=False)
    tracer = trace()
    was = pt.is_validation_enabled()
    pt.enable_validation(False)  # (as the potential runs it: values broadcast over the data)
    try:
        with tracer:
            with pt.handlers.substitute(data={"scale": torch.tensor(1.0, dtype=torch.float64)}):
                potential._run_model()
    finally:
        pt.enable_validation(was)
    return {
        name: -site.value.dim()
        for name, site in tracer.trace.items()
        if site.extra.get("enumerated")
    }


@pytest.mark.parametrize("history", [1, 2])
def test_a_markov_chain_longer_than_torch_dims_allow_is_the_forward_recursion(history):
    """A 100-step chain (refused without pt.markov: 100 sites, 64 dims) reuses history + 1
    dims, and its potential is the forward recursion's, to 1e-12."""
    y = torch.randn(100, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    dims = _enumerated_dims(markov_chain, (y, history))
    assert sorted(set(dims.values()), reverse=True) == [-1 - k for k in range(history + 1)]
    assert [dims[f"z{t}"] for t in range(6)] == [-1 - t % (history + 1) for t in range(6)]
    potential = Potential(markov_chain, (y, history), compile=False)
    z = torch.tensor([[-0.3], [0.4]], dtype=torch.float64)
    for c in range(2):
        scale = z[c, 0].exp()
        expected = -(_forward(y, scale, history) + dist.HalfNormal(1.0).log_prob(scale) + z[c, 0])
        torch.testing.assert_close(potential(z)[c], expected, rtol=1e-12, atol=1e-12)


def markov_sequences(y):
    """Independent chains, one per column of ``y``, in a plate around the markov loop (as
    Pyro's HMM examples write several sequences)."""
    scale = pt.sample("scale", dist.HalfNormal(1.0))
    with pt.plate("sequences", y.shape[1]):
        state = 0
        for t in pt.markov(range(y.shape[0])):
            state = pt.sample(f"z{t}", dist.Categorical(TRANSITIONS[state]))
            pt.sample(f"y{t}", dist.Normal(LOCS[state], scale), obs=y[t])


def test_markov_chains_in_a_plate_are_each_the_forward_recursion():
    y = torch.randn(70, 3, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    potential = Potential(markov_sequences, (y,), compile=False)
    z = torch.tensor([[0.1]], dtype=torch.float64)
    scale = z[0, 0].exp()
    log_lik = sum(_forward(y[:, n], scale) for n in range(3))
    expected = -(log_lik + dist.HalfNormal(1.0).log_prob(scale) + z[0, 0])
    torch.testing.assert_close(potential(z)[0], expected, rtol=1e-12, atol=1e-12)


def hmm_site(y):
    """``markov_chain`` with its chain summed out in one site: Pyro's DiscreteHMM, whose
    initial state is the one before the first observation (state 0 here)."""
    scale = pt.sample("scale", dist.HalfNormal(1.0))
    initial = torch.tensor([0.0, -math.inf, -math.inf], dtype=torch.float64)
    emission = dist.Normal(LOCS, scale)
    hmm = dist.DiscreteHMM(initial, TRANSITIONS.log(), emission, duration=y.shape[0])
    pt.sample("y", hmm, obs=y)


def test_discrete_hmm_is_the_markov_loop_and_pyros_values_under_vmap_and_compile():
    """probtorch's DiscreteHMM (Pyro's runs its log under an old-style autograd.Function,
    which vmap refuses) equals the markov loop's potential, compiled and eager, and Pyro's
    own log density and gradient, also with transitions of probability 0."""
    import pyro.distributions as pyro_dist

    from probtorch.inference.compile import count_compiles

    y = torch.randn(30, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    z = torch.tensor([[-0.2], [0.3], [0.0]], dtype=torch.float64)
    loop = Potential(markov_chain, (y,), compile=False).value_and_grad(z)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with count_compiles() as compiles:
            compiled = Potential(hmm_site, (y,), compile=True)
            site = compiled.value_and_grad(z)
    assert compiles.graph_breaks == 0 and compiled.compiled
    for a, b in zip(site, loop):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

    logits = torch.randn(4, 5, 3, 3, generator=torch.Generator().manual_seed(1)).double()
    logits[..., 0, 2] = -math.inf  # a transition that never happens
    logits.requires_grad_(True)
    value = torch.randn(4, 5, generator=torch.Generator().manual_seed(2)).double()
    args = (torch.zeros(3, dtype=torch.float64), logits, dist.Normal(LOCS, 1.0))
    ours = dist.DiscreteHMM(*args).log_prob(value)
    theirs = pyro_dist.DiscreteHMM(*args).log_prob(value)
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_theirs,) = torch.autograd.grad(theirs.sum(), logits)
    assert torch.isfinite(g_ours).all()
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-12, atol=1e-12)


TREE = ((True, False), (False, (True, True)))  # a binary tree with 5 leaves
TREE_BRANCH = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
TREE_LEAF = torch.tensor([0.15, 0.9], dtype=torch.float64)


def _tree_model():
    """Pyro's recursive markov model (its test_enum_recycling_reentrant): each branch's
    state depends on its parent's; a step is a depth of recursion."""

    def subtree(data, state=0, address=""):
        if isinstance(data, bool):
            obs = torch.tensor(float(data), dtype=torch.float64)
            pt.sample(f"leaf_{address}", dist.Bernoulli(TREE_LEAF[state]), obs=obs)
            return
        for branch, letter in zip(data, "ab"):
            name = f"branch_{address + letter}"
            child = pt.sample(name, dist.Categorical(TREE_BRANCH[state]))
            recurse(branch, child, address + letter)

    recurse = pt.markov(subtree, history=1)

    def tree(data):
        scale = pt.sample("scale", dist.HalfNormal(1.0))
        pt.sample("s", dist.Normal(0.0, scale), obs=torch.tensor(0.3, dtype=torch.float64))
        recurse(data)

    return tree


def test_a_recursive_markov_tree_reuses_dims_by_depth_and_sums_out_exactly():
    """Siblings sampled after a subtree returns are one step below their parent (not
    steps after the subtree's sites): the potential equals the brute-force sum over the
    256 assignments of the 8 branches (it took the parent's dim and was wrong)."""
    tree = _tree_model()
    names = ["branch_" + a for a in ("a", "aa", "ab", "b", "ba", "bb", "bba", "bbb")]
    dims = _enumerated_dims(tree, (TREE,))
    assert len(set(dims.values())) < len(names)  # dims are reused
    assert dims["branch_ab"] != dims["branch_a"] and dims["branch_bba"] != dims["branch_bb"]
    scale = torch.tensor(0.8, dtype=torch.float64)
    log_joint = []
    for values in itertools.product(range(2), repeat=len(names)):
        data = {**dict(zip(names, map(torch.tensor, values))), "scale": scale}
        log_joint.append(trace(substitute(tree, data=data)).get_trace(TREE).log_prob_sum())
    z = scale.log().reshape(1, 1)
    expected = -(torch.logsumexp(torch.stack(log_joint), 0) + z[0, 0])
    torch.testing.assert_close(Potential(tree, (TREE,), compile=False)(z)[0], expected)


def test_markov_keep_reuses_no_dims_and_gives_the_same_potential():
    y = torch.randn(8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    dims = _enumerated_dims(markov_chain, (y, 1, True))
    assert sorted(dims.values(), reverse=True) == [-1 - t for t in range(8)]
    z = torch.tensor([[0.2]], dtype=torch.float64)
    kept = Potential(markov_chain, (y, 1, True), compile=False)(z)
    reused = Potential(markov_chain, (y, 1), compile=False)(z)
    plain = Potential(chain, (y,), compile=False)(z)
    torch.testing.assert_close(kept, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reused, plain, rtol=1e-12, atol=1e-12)


def _chain_assignments(T):
    for values in itertools.product(range(3), repeat=T):
        yield {f"z{t}": torch.tensor(v) for t, v in enumerate(values)}


@pytest.mark.parametrize("history", [1, 2])
def test_discrete_draws_and_the_best_path_of_a_markov_chain(history):
    """20,000 draws of five states whose sites share dims, against the 243 paths by brute
    force (each frequency within 5 standard errors); temperature 0 gives the most probable
    path (Viterbi's)."""
    y = torch.tensor([-1.2, 0.3, 0.6, 2.4, 1.9], dtype=torch.float64)
    potential = Potential(markov_chain, (y, history), compile=False)
    S, scale = 20000, torch.tensor(0.9, dtype=torch.float64)
    draws = potential.sample_discrete({"scale": scale.expand(S)}, seed=0)
    keys, log_joint = [], []
    for values in _chain_assignments(len(y)):
        data = {**values, "scale": scale}
        tr = trace(substitute(markov_chain, data=data)).get_trace(y, history)
        log_joint.append(tr.log_prob_sum())
        keys.append(tuple(int(v) for v in values.values()))
    exact = torch.softmax(torch.stack(log_joint), 0)
    drawn = torch.stack([draws[f"z{t}"] for t in range(len(y))], -1).long()
    index = torch.tensor([keys.index(tuple(row)) for row in drawn.tolist()])
    freq = torch.bincount(index, minlength=len(keys)).double() / S
    # each path expected 10 times or more on its own, the rarer ones pooled (a normal
    # approximation of a count needs that many: one draw of a path of probability 5e-7
    # is 10 "standard errors" out)
    common = exact * S >= 10
    freq = torch.cat([freq[common], freq[~common].sum(0, keepdim=True)])
    exact = torch.cat([exact[common], exact[~common].sum(0, keepdim=True)])
    se = (exact * (1 - exact) / S).sqrt()
    assert ((freq - exact).abs() <= 5 * se + 1e-12).all(), ((freq - exact).abs() / se).max()
    best = potential.sample_discrete({"scale": scale.expand(1)}, temperature=0)
    path = tuple(int(best[f"z{t}"][0]) for t in range(len(y)))
    assert path == keys[int(torch.stack(log_joint).argmax())]


def _smoothed_and_best(y, scale):
    """Each state's marginal given ``y`` (forward-backward) and the most probable path
    (Viterbi), for ``markov_chain`` with history 1."""
    emit = dist.Normal(LOCS, scale).log_prob(y[:, None])  # (T, 3)
    log_t = TRANSITIONS.log()
    alpha, delta, back = [TRANSITIONS[0].log() + emit[0]], TRANSITIONS[0].log() + emit[0], []
    for t in range(1, len(y)):
        alpha.append(torch.logsumexp(alpha[-1][:, None] + log_t, 0) + emit[t])
        back.append((delta[:, None] + log_t).argmax(0))
        delta = (delta[:, None] + log_t).amax(0) + emit[t]
    beta = [torch.zeros(3, dtype=y.dtype)]
    for t in range(len(y) - 1, 0, -1):
        beta.insert(0, torch.logsumexp(log_t + emit[t] + beta[0], 1))
    marginals = torch.softmax(torch.stack(alpha) + torch.stack(beta), -1)
    path = [int(delta.argmax())]
    for pointers in reversed(back):
        path.insert(0, int(pointers[path[0]]))
    return marginals, path


def test_a_long_chain_is_drawn_in_one_run_of_the_model():
    """A 60-step chain: each state's frequency over 4,000 draws against forward-backward
    (within 5 standard errors) and temperature 0 against Viterbi's path, with the model run
    a fixed number of times, not once per state (backward sampling after one forward sum:
    the cost is linear in the chain's length)."""
    y = torch.randn(60, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.5
    runs = []

    def counted(y):
        runs.append(None)
        markov_chain(y)

    potential = Potential(counted, (y,), compile=False)
    S, scale = 4000, torch.tensor(0.8, dtype=torch.float64)
    before = len(runs)
    draws = potential.sample_discrete({"scale": scale.expand(S)}, seed=0)
    assert len(runs) - before == 1
    marginals, path = _smoothed_and_best(y, scale)
    states = torch.stack([draws[f"z{t}"] for t in range(len(y))], -1).long()  # (S, T)
    freq = torch.nn.functional.one_hot(states, 3).double().mean(0)
    # binomial standard errors, at least one draw's worth (a state of probability 1e-5
    # drawn once would be 40 of its standard errors out)
    se = (marginals * (1 - marginals)).clamp_min(1 / S).div(S).sqrt()
    assert ((freq - marginals).abs() <= 5 * se).all(), ((freq - marginals).abs() / se).max()
    best = potential.sample_discrete({"scale": scale.expand(2)}, temperature=0)
    assert [int(best[f"z{t}"][1]) for t in range(len(y))] == path


def test_trace_enum_elbo_sums_out_a_markov_chain():
    """With the scale conditioned, the loss is minus the forward recursion's log density."""
    y = torch.randn(80, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    scale = torch.tensor(0.7, dtype=torch.float64)
    model = pt.handlers.condition(markov_chain, data={"scale": scale})
    loss = TraceEnum_ELBO().loss(model, lambda y: None, y)
    expected = -(_forward(y, scale) + dist.HalfNormal(1.0).log_prob(scale))
    assert loss == pytest.approx(float(expected), rel=1e-12)


def test_vectorized_markov_and_a_negative_history_are_refused():
    with pytest.raises(NotImplementedError, match=r"dim=-2.*vectorized markov.*pt.markov\(range"):
        pt.markov(dim=-2)
    with pytest.raises(ValueError, match="history must be >= 0, got -1"):
        pt.markov(range(3), history=-1)


@pytest.mark.parametrize("which", ["nested", "mixture", "chain", "markov"])
def test_the_compiled_potential_sums_out_without_graph_breaks(which):
    """torch.compile captures the elimination whole (it fell back to eager, 25x slower:
    Dynamo cannot trace max(..., key=))."""
    from probtorch.inference.compile import count_compiles

    model, args = {
        "nested": (nested, _nested_data()),
        "mixture": (mixture, (_mixture_data(),)),
        "chain": (chain, (torch.randn(6, generator=torch.Generator().manual_seed(0)),)),
        "markov": (markov_chain, (torch.randn(8, generator=torch.Generator().manual_seed(0)),)),
    }[which]
    potential = Potential(model, args, compile=True)
    z = 0.1 * torch.randn(3, potential.dim, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with count_compiles() as compiles:
            value, grad = potential.value_and_grad(z)
    assert compiles.graph_breaks == 0 and potential.compiled
    eager_value, eager_grad = Potential(model, args, compile=False).value_and_grad(z)
    torch.testing.assert_close(value, eager_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, eager_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_nuts_on_a_mixture_against_the_posterior_by_quadrature():
    """The posterior of (p, mu) on a 600 x 600 grid; means within 4 MCSE, sds within 10 %,
    R-hat < 1.01, no divergences; the log likelihood in the InferenceData is the
    mixture's per observation; posterior predictive draws the discrete site afresh."""
    y = _mixture_data()
    p, mu, log_post = _mixture_log_posterior_grid(y)
    weights = torch.softmax(log_post.reshape(-1), 0).reshape(log_post.shape)
    exact = {}
    for name, grid in (("p", p), ("mu", mu)):
        mean = float((weights * grid).sum())
        exact[name] = (mean, float((weights * (grid - mean) ** 2).sum().sqrt()))
    mcmc = MCMC(NUTS(mixture), num_warmup=500, num_samples=1000, num_chains=4, seed=0,
                progress_bar=False)  # fmt: skip
    mcmc.run(y)
    samples = mcmc.get_samples(group_by_chain=True)
    for name, (mean, sd) in exact.items():
        chains = samples[name].numpy()
        ess = float(az.ess(chains, method="bulk"))
        assert ess > 800, (name, ess)
        assert float(az.rhat(chains)) < 1.01
        assert abs(chains.mean() - mean) < 4 * sd / math.sqrt(ess), (name, chains.mean(), mean)
        assert abs(chains.std(ddof=1) - sd) < 0.1 * sd, (name, chains.std(ddof=1), sd)
    assert int(mcmc.get_extra_fields()["diverging"].sum()) == 0

    log_lik = mcmc.to_inference_data().log_likelihood["y"].values  # (chain, draw, data)
    draws = {k: v.reshape(-1, 1) for k, v in mcmc.get_samples().items()}
    expected = torch.logaddexp(
        (1 - draws["p"]).log() + dist.Normal(-1.0, 1.0).log_prob(y),
        draws["p"].log() + dist.Normal(draws["mu"], 1.0).log_prob(y),
    )
    np.testing.assert_allclose(log_lik.reshape(-1, y.shape[0]), expected.numpy(), rtol=1e-10)

    predictive = Predictive(mixture, mcmc.get_samples())(y, seed=0)
    assert predictive["z"].shape == (4000, y.shape[0])
    assert set(np.unique(predictive["z"].numpy())) == {0.0, 1.0}


def test_predictive_infer_discrete_draws_the_assignments_given_the_data():
    """NumPyro's ``Predictive(..., infer_discrete=True)``: the assignments drawn given each
    posterior draw and the data (frequencies against the exact conditional probabilities),
    returned, and the observed site predicted given them."""
    y = _mixture_data(12)
    S = 4000
    draws = {"p": torch.full((S,), 0.3), "mu": torch.full((S,), 2.5)}
    out = Predictive(mixture, draws, infer_discrete=True)(y, seed=1)
    assert set(out) == {"z", "y"} and out["z"].shape == out["y"].shape == (S, 12)
    second = 0.3 * dist.Normal(2.5, 1.0).log_prob(y).exp()
    exact = second / (second + 0.7 * dist.Normal(-1.0, 1.0).log_prob(y).exp())
    freq = out["z"].mean(0)
    assert ((freq - exact).abs() <= 5 * (exact * (1 - exact) / S).sqrt() + 1e-9).all()
    residual = out["y"] - torch.where(out["z"] > 0, 2.5, -1.0)  # y given z: N(loc(z), 1)
    assert abs(float(residual.mean())) < 5 / math.sqrt(residual.numel())
    prior = Predictive(mixture, draws)(y, seed=1)  # without: the prior's assignments
    assert abs(float(prior["z"].mean()) - 0.3) < 5 * math.sqrt(0.21 / prior["z"].numel())
    with pytest.raises(ValueError, match=r"infer_discrete.*lack \['mu'\]"):
        Predictive(mixture, {"p": draws["p"]}, infer_discrete=True)(y, seed=1)


# -- SVI: TraceEnum_ELBO ---------------------------------------------------------------
@pytest.mark.parametrize("num_particles", [1, 3])
def test_trace_enum_elbo_is_minus_the_marginal_log_density_without_guided_sites(num_particles):
    """With the continuous site observed (conditioned) the guide samples nothing and the
    loss is minus the model's log density with the discrete sites summed out: the
    potential energy less its log-Jacobian, whatever the number of particles."""
    w, y = _nested_data()
    scale = torch.tensor(0.8, dtype=torch.float64)
    model = pt.handlers.condition(nested, data={"scale": scale})
    loss = TraceEnum_ELBO(num_particles=num_particles).loss(model, lambda w, y: None, w, y)
    z = scale.log().reshape(1, 1)
    expected = Potential(nested, (w, y), compile=False)(z)[0] + z[0, 0]
    torch.testing.assert_close(torch.tensor(loss), expected)

    def point(y):  # a point-mass guide on a real-valued site: log q = 0
        pt.sample("x", dist.Delta(torch.tensor(0.4, dtype=torch.float64)))

    y = torch.tensor([0.4, 1.1, 2.3], dtype=torch.float64)
    loss = TraceEnum_ELBO(num_particles=num_particles).loss(continuous_given_discrete, point, y)
    expected = Potential(continuous_given_discrete, (y,), compile=False)(torch.full((1, 1), 0.4))
    torch.testing.assert_close(torch.tensor(loss), expected[0])


def labelled_model(x):
    """A class per point (as a semi-supervised VAE's label) and a latent per point given it."""
    with pt.plate("data", x.shape[0]):
        y = pt.sample("y", dist.Categorical(PRIOR))
        z = pt.sample("z", dist.Normal(LOCS[y], 1.0))
        pt.sample("x", dist.Normal(z, 0.5), obs=x)


# (initial values drawn once, outside: a generator made in the guide at every step would
# make SVI run the step eagerly)
LOGITS = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Z_LOCS = torch.randn(4, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)


def enumerating_guide(x, spread=None):
    """q(y) enumerated; z given y a point mass (spread None, for an exact ELBO) or normal."""
    logits = pt.param("logits", LOGITS.clone())
    locs = pt.param("locs", Z_LOCS.clone())
    with pt.plate("data", x.shape[0]):
        y = pt.sample("y", dist.Categorical(logits=logits), infer={"enumerate": "parallel"})
        loc = locs[torch.arange(x.shape[0]), y]  # (3, 4) for the three values of y
        pt.sample("z", dist.Delta(loc) if spread is None else dist.Normal(loc, spread))


def _labelled_elbo_by_hand(x, logits, locs):
    q = torch.softmax(logits, -1)  # (4, 3)
    terms = (
        PRIOR.log()
        + dist.Normal(LOCS, 1.0).log_prob(locs)
        + dist.Normal(locs, 0.5).log_prob(x[:, None])
        - q.log()
    )
    return (q * terms).sum()


def test_trace_enum_elbo_takes_the_expectation_over_enumerated_guide_sites_exactly():
    """Pyro's guide-side enumeration (a semi-supervised VAE's unlabelled ELBO): the loss is
    the sum over the labels of q(y) (log p - log q), with its gradient, for 1 and 3
    particles."""
    x = torch.tensor([-1.2, 0.4, 0.6, 2.2], dtype=torch.float64)
    store = pt.ParamStore()
    with pt.param_scope(store):
        for num_particles in (1, 3):
            elbo = TraceEnum_ELBO(num_particles=num_particles)
            loss = elbo.differentiable_loss(labelled_model, enumerating_guide, x)
            logits, locs = store["logits"], store["locs"]
            expected = -_labelled_elbo_by_hand(x, logits, locs)
            torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
            grads = torch.autograd.grad(loss, [logits, locs])
            by_hand = torch.autograd.grad(expected, [logits, locs])
            for a, b in zip(grads, by_hand):
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_config_enumerate_marks_the_guide_as_pyros_does():
    """``@config_enumerate`` on a guide whose label is unmarked: the same exact loss as the
    marked guide; its continuous site is left unmarked, and a site marked otherwise keeps
    its mark (refused by name, as sequential enumeration is not done)."""
    from probtorch.inference import config_enumerate

    x = torch.tensor([-1.2, 0.4, 0.6, 2.2], dtype=torch.float64)

    @config_enumerate
    def unmarked(x):
        logits = pt.param("logits", LOGITS.clone())
        locs = pt.param("locs", Z_LOCS.clone())
        with pt.plate("data", x.shape[0]):
            y = pt.sample("y", dist.Categorical(logits=logits))
            pt.sample("z", dist.Delta(locs[torch.arange(x.shape[0]), y]))

    with pt.param_scope(pt.ParamStore()):
        loss = TraceEnum_ELBO().loss(labelled_model, unmarked, x)
        tr = pt.handlers.trace(pt.handlers.seed(unmarked, 0)).get_trace(x)
    with pt.param_scope(pt.ParamStore()):
        assert loss == pytest.approx(TraceEnum_ELBO().loss(labelled_model, enumerating_guide, x))
    assert tr["y"].infer == {"enumerate": "parallel"} and tr["z"].infer == {}

    def sequential(x):
        pt.sample("y", dist.Categorical(logits=LOGITS[0]), infer={"enumerate": "sequential"})

    assert pt.handlers.trace(pt.handlers.seed(config_enumerate(sequential), 0)).get_trace(x)[
        "y"
    ].infer == {"enumerate": "sequential"}
    with pytest.raises(NotImplementedError, match=r"\['num_samples'\].*Monte Carlo"):
        config_enumerate(sequential, num_samples=10)
    config_enumerate(sequential, num_samples=None)  # Pyro's default, spelled out


def test_an_enumerated_guide_in_a_subsampled_plate_is_scaled_as_its_terms_are():
    x = torch.tensor([-1.2, 0.4, 0.6, 2.2], dtype=torch.float64)
    idx = torch.tensor([3, 1])

    def model(x):
        with pt.plate("data", 4, subsample=idx):
            y = pt.sample("y", dist.Categorical(PRIOR))
            z = pt.sample("z", dist.Normal(LOCS[y], 1.0))
            pt.sample("x", dist.Normal(z, 0.5), obs=x[idx])

    def guide(x):
        logits = pt.param("logits", LOGITS.clone())
        locs = pt.param("locs", Z_LOCS.clone())
        with pt.plate("data", 4, subsample=idx):
            q = dist.Categorical(logits=logits[idx])
            y = pt.sample("y", q, infer={"enumerate": "parallel"})
            pt.sample("z", dist.Delta(locs[idx][torch.arange(2), y]))

    store = pt.ParamStore()
    with pt.param_scope(store):
        loss = TraceEnum_ELBO().loss(model, guide, x)
        expected = -2.0 * _labelled_elbo_by_hand(x[idx], store["logits"][idx], store["locs"][idx])
    assert loss == pytest.approx(float(expected.detach()), rel=1e-12)


def test_an_enumerated_guide_with_the_exact_posterior_gives_minus_the_log_evidence():
    """With q(y) the posterior of y, the ELBO is log p(x) (here with z a point mass at
    its value in the model, conditioned), the model-side enumeration's value."""
    x = torch.tensor([-1.2, 0.4, 0.6, 2.2], dtype=torch.float64)
    z = torch.tensor([-0.9, 0.1, 0.8, 1.7], dtype=torch.float64)
    model = pt.handlers.condition(labelled_model, data={"z": z})
    joint = PRIOR.log() + dist.Normal(LOCS, 1.0).log_prob(z[:, None])  # (4, 3)
    posterior = joint - joint.logsumexp(-1, keepdim=True)

    def exact(x):
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Categorical(logits=posterior), infer={"enumerate": "parallel"})

    loss = TraceEnum_ELBO().loss(model, exact, x)
    summed_out = TraceEnum_ELBO().loss(model, lambda x: None, x)
    assert loss == pytest.approx(summed_out, rel=1e-12)


def test_svi_with_an_enumerated_guide_compiles_as_it_runs_eagerly():
    x = torch.tensor([-1.2, 0.4, 0.6, 2.2], dtype=torch.float64)
    losses = {}
    for compile in (True, False):
        svi = SVI(labelled_model, lambda x: enumerating_guide(x, 0.3), pt.optim.Adam(lr=0.05),
                  TraceEnum_ELBO(), compile=compile, seed=4)  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            losses[compile] = svi.run(30, x, progress_bar=False).losses
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-10, atol=1e-10)
    assert losses[True][-5:].mean() < losses[True][:5].mean()


def test_trace_enum_elbo_refuses_a_discrete_guide_site_and_a_small_max_plate_nesting():
    w, y = _nested_data()

    def guide(w, y):
        pt.sample("scale", dist.LogNormal(0.0, 1.0))
        pt.sample("z1", dist.Categorical(PRIOR))

    def scale_guide(w, y):
        pt.sample("scale", dist.LogNormal(0.0, 1.0))

    def half_enumerated(w, y):  # z1 enumerated in the guide, z2 summed out of the model
        pt.sample("scale", dist.LogNormal(0.0, 1.0))
        pt.sample("z1", dist.Categorical(PRIOR), infer={"enumerate": "parallel"})

    not_marked = r"guide site 'z1' is discrete.*and not enumerated.*'enumerate': 'parallel'"
    with pytest.raises(ValueError, match=not_marked + r".*block\(model"):
        TraceEnum_ELBO().loss(nested, guide, w, y)
    with pytest.raises(ValueError, match=r"guide enumerates \['z1'\].*\['z2'\].*not both"):
        TraceEnum_ELBO().loss(nested, half_enumerated, w, y)
    with pytest.raises(ValueError, match=r"max_plate_nesting=1.*2 batch dims"):
        TraceEnum_ELBO(max_plate_nesting=1).loss(nested, scale_guide, w, y)


def test_trace_elbo_names_trace_enum_elbo_for_a_discrete_site_the_guide_leaves_out():
    y = _mixture_data(10)
    guide = AutoDelta(pt.handlers.block(mixture, hide=["z"]))
    svi = SVI(mixture, guide, pt.optim.Adam(lr=0.05), Trace_ELBO())
    with pytest.raises(ValueError, match=r"'z'.*not sampled by the guide.*summed out.*"
                       r"TraceEnum_ELBO.*not by Trace_ELBO"):  # fmt: skip
        svi.step(y)


def test_svi_fits_a_mixture_with_its_assignments_summed_out():
    """Pyro's recipe: an autoguide on the model with the assignments hidden, and
    TraceEnum_ELBO; compiled SVI's point estimate (AutoDelta: a MAP estimate) lands on the
    posterior's mode found on a grid."""
    y = _mixture_data()
    guide = AutoDelta(pt.handlers.block(mixture, hide=["z"]))
    svi = SVI(mixture, guide, pt.optim.Adam(lr=0.05), TraceEnum_ELBO())
    result = svi.run(800, y, progress_bar=False)
    point = guide.median(result.params)
    assert set(point) == {"p", "mu"}
    p, mu, log_post = _mixture_log_posterior_grid(y)  # the mode, on a grid of 0.007 steps
    best = int(log_post.argmax())
    p_map, mu_map = float(p.reshape(-1)[best // 600]), float(mu.reshape(-1)[best % 600])
    assert abs(float(point["p"]) - p_map) < 0.01 and abs(float(point["mu"]) - mu_map) < 0.01


def test_trace_enum_elbo_scales_a_subsampled_plate_after_the_sum():
    """A discrete site local to a subsampled plate: its sum is taken per element and the
    plate's scale applied to the product, so the loss averaged over every subsample is the
    full data's loss (scaling inside the sum would not be)."""
    y = torch.tensor([-1.3, 0.2, 2.1, 0.9], dtype=torch.float64)

    def model(y, subsample=None):
        with pt.plate("n", 4, subsample=subsample) as idx:
            z = pt.sample("z", dist.Bernoulli(0.3))
            pt.sample("y", dist.Normal(torch.where(z > 0, 2.0, -1.0), 1.0), obs=y[idx])

    elbo, guide = TraceEnum_ELBO(), lambda y, subsample=None: None
    full = elbo.loss(model, guide, y)
    pairs = [torch.tensor(pair) for pair in itertools.combinations(range(4), 2)]
    average = sum(elbo.loss(model, guide, y, subsample=pair) for pair in pairs) / len(pairs)
    assert abs(average - full) < 1e-10


# -- what cannot be summed out -----------------------------------------------------------
def _with_scale(body):
    def model():
        pt.sample("scale", dist.HalfNormal(1.0))
        body()

    return model


def test_a_discrete_site_whose_values_cannot_be_listed_is_refused_by_name():
    model = _with_scale(lambda: pt.sample("k", dist.Poisson(3.0)))
    with pytest.raises(ValueError, match=r"latent site 'k' has the discrete distribution Poisson.*"
                       r"cannot list its values.*infinite support"):  # fmt: skip
        Potential(model, compile=False)
    # finite, but one joint value: the advice is a plate
    model = _with_scale(lambda: pt.sample("k", dist.Bernoulli(0.5).expand([3]).to_event(1)))
    with pytest.raises(ValueError, match=r"'k'.*\.to_event\(\) makes.*pt.plate"):
        Potential(model, compile=False)

    # a Binomial whose total_count varies along its plate cannot list one set of values
    def body():
        with pt.plate("n", 3):
            pt.sample("k", dist.Binomial(torch.tensor([1.0, 2.0, 3.0]), 0.5))

    with pytest.raises(ValueError, match=r"latent site 'k' \(Binomial\).*cannot be listed.*"
                       r"Inhomogeneous"):  # fmt: skip
        Potential(_with_scale(body), compile=False)


def test_sequential_enumeration_is_refused_by_name():
    model = _with_scale(
        lambda: pt.sample("k", dist.Bernoulli(0.5), infer={"enumerate": "sequential"})
    )
    with pytest.raises(ValueError, match=r"'k'.*'enumerate': 'sequential'.*'parallel'"):
        Potential(model, compile=False)
    with pytest.raises(ValueError, match=r"'k'.*not sampled by the guide.*'enumerate': "
                       r"'sequential'.*TraceEnum_ELBO.*parallel"):  # fmt: skip
        TraceEnum_ELBO().loss(model, lambda: pt.sample("scale", dist.LogNormal(0.0, 1.0)))


def test_an_undeclared_batch_dimension_is_refused_with_the_site_and_dim():
    def body():
        pt.sample("k", dist.Bernoulli(0.5))
        pt.sample("x", dist.Normal(torch.zeros(3), 1.0))  # batch dim -1, in no plate

    with pytest.raises(ValueError, match=r"site 'x' has batch shape \(3,\), whose dim -1.*"
                       r"pt.plate.*to_event"):  # fmt: skip
        Potential(_with_scale(body), compile=False)


def test_discrete_sites_of_two_crossed_plates_are_refused_as_intractable():
    def body():
        with pt.plate("A", 2, dim=-2):
            a = pt.sample("a", dist.Bernoulli(0.5))
        with pt.plate("B", 3, dim=-1):
            b = pt.sample("b", dist.Bernoulli(0.5))
        with pt.plate("A", 2, dim=-2), pt.plate("B", 3, dim=-1):
            pt.sample("y", dist.Normal(a + b, 1.0), obs=torch.zeros(2, 3))

    potential = Potential(_with_scale(body), compile=False)
    with pytest.raises(ValueError, match=r"'a', 'b'.*\['A', 'B'\].*not nested"):
        potential(torch.zeros(1, 1))


def test_a_site_reading_a_summed_out_value_outside_its_plate_is_refused():
    """Another plate at the same dim pairs the elements up wrongly: the density was silently
    that of one value of 'a' shared by the whole plate (-9.43 against -7.23 by brute force
    in the reviewer's case)."""

    def body():
        with pt.plate("A", 2, dim=-1):
            a = pt.sample("a", dist.Bernoulli(0.5))
        with pt.plate("A2", 2, dim=-1):
            pt.sample("y", dist.Normal(a, 1.0), obs=torch.zeros(2))

    potential = Potential(_with_scale(body), compile=False)
    refused = r"'y' depends on the summed-out discrete site 'a', which lies in plates \['A'\]"
    with pytest.raises(ValueError, match=refused + r" that 'y' is not in.*same pt.plate"):
        potential(torch.zeros(1, 1))


def test_a_model_whose_only_latent_sites_are_summed_out_has_nothing_to_sample():
    def model():
        pt.sample("k", dist.Bernoulli(0.5))

    mcmc = MCMC(NUTS(model, compile=False), num_warmup=2, num_samples=2, progress_bar=False)
    with pytest.raises(ValueError, match=r"no continuous latent.*\['k'\].*summed out"):
        mcmc.run()


def test_discrete_draws_of_a_model_without_continuous_latent_sites():
    """Predictive(infer_discrete=True) with the continuous part given as params: each
    assignment against its exact conditional probability."""

    def model(y):
        loc = pt.param("loc", torch.tensor(0.0))
        with pt.plate("n", y.shape[0]):
            z = pt.sample("z", dist.Bernoulli(0.5))
            pt.sample("y", dist.Normal(torch.where(z > 0, loc, -loc), 1.0), obs=y)

    y, S = torch.tensor([-1.0, 0.2, 1.5]), 4000
    params = {"loc": torch.tensor(1.0)}
    out = Predictive(model, params=params, num_samples=S, infer_discrete=True)(y, seed=0)
    up, down = dist.Normal(1.0, 1.0).log_prob(y).exp(), dist.Normal(-1.0, 1.0).log_prob(y).exp()
    exact = up / (up + down)
    freq = out["z"].mean(0)
    assert out["z"].shape == (S, 3)
    assert ((freq - exact).abs() <= 5 * (exact * (1 - exact) / S).sqrt()).all()


def test_discrete_draws_of_a_model_that_reads_latent_values_in_python():
    """vmap cannot batch ``float(loc)``: the draws are then made one draw at a time, as the
    log likelihood is (this raised vmap's .item() error)."""

    def model(y):
        loc = pt.sample("loc", dist.Normal(0.0, 3.0))
        sign = 1.0 if float(loc) > 0 else -1.0
        with pt.plate("n", y.shape[0]):
            z = pt.sample("z", dist.Bernoulli(0.5))
            pt.sample("y", dist.Normal(sign * torch.where(z > 0, loc, -loc), 1.0), obs=y)

    y, S = torch.tensor([-1.0, 0.2, 1.5]), 800
    potential = Potential(model, (y,), compile=False)
    locs = torch.tensor([1.0, -1.0]).repeat_interleave(S)
    z = potential.sample_discrete({"loc": locs}, seed=0)["z"]
    assert z.shape == (2 * S, 3)
    up, down = dist.Normal(1.0, 1.0).log_prob(y).exp(), dist.Normal(-1.0, 1.0).log_prob(y).exp()
    exact = up / (up + down)  # the same for loc = -1: sign * loc is 1 either way
    for freq in (z[:S].mean(0), z[S:].mean(0)):
        assert ((freq - exact).abs() <= 5 * (exact * (1 - exact) / S).sqrt()).all()


def test_deterministic_sites_of_summed_out_values_are_left_out_with_a_warning():
    """They have no value per draw (they took the whole support's shape, and
    to_inference_data named that dim after a plate); Predictive(infer_discrete=True)
    computes them."""

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        pt.deterministic("twice", 2 * mu)
        with pt.plate("n", y.shape[0]):
            z = pt.sample("z", dist.Bernoulli(0.5))
            shift = pt.deterministic("shift", mu + z)
            pt.sample("y", dist.Normal(shift, 1.0), obs=y)

    y = torch.tensor([0.1, 1.2, 0.7])
    mcmc = MCMC(NUTS(model, compile=False), num_warmup=5, num_samples=5, progress_bar=False)
    with pytest.warns(UserWarning, match=r"deterministic sites \['shift'\] depend on discrete"):
        mcmc.run(y)
    assert set(mcmc.get_samples()) == {"mu", "twice"}
    assert set(mcmc.to_inference_data().posterior.data_vars) == {"mu", "twice"}
    out = Predictive(model, mcmc.get_samples(), infer_discrete=True)(y, seed=0)
    torch.testing.assert_close(out["shift"], mcmc.get_samples()["mu"][:, None] + out["z"])


@pytest.mark.parametrize("read", ["if", "int"])
def test_reading_a_summed_out_value_in_python_is_explained(read):
    def model():
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        z = pt.sample("z", dist.Bernoulli(0.5))
        loc = (mu if z else -mu) if read == "if" else [mu, -mu][int(z)]
        pt.sample("y", dist.Normal(loc, 1.0), obs=torch.tensor(0.3))

    with pytest.raises(ValueError, match=r"reads the value of a discrete site that is summed "
                       r"out \(\['z'\]\) in Python.*torch.where"):  # fmt: skip
        Potential(model, compile=False)


def test_hmc_also_samples_an_enumerated_model():
    y = _mixture_data(20)
    mcmc = MCMC(HMC(mixture, num_steps=5, compile=False), num_warmup=20, num_samples=10,
                progress_bar=False, seed=0)  # fmt: skip
    mcmc.run(y)
    assert mcmc.get_samples()["p"].shape == (10,)


def test_a_user_scale_multiplies_the_log_of_the_sum_over_discrete_sites():
    # pt.handlers.scale (manual minibatch scaling, N / B) was applied to each term inside
    # the sum over z: -sum_i log sum_z (p(z) p(y_i|z))^s, 24.97494 here, against Pyro's and
    # the exact -s sum_i log p(y_i), 24.24338
    y = torch.tensor([-2.1, 0.3, 2.4])
    w, locs, s = torch.tensor([0.3, 0.7]), torch.tensor([-1.8, 2.0]), 4.0

    def model():
        with pt.plate("n", 3), pt.handlers.scale(scale=s):
            z = pt.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            pt.sample("y", dist.Normal(locs[z], 1.0), obs=y)

    log_p = torch.logsumexp(w.log() + dist.Normal(locs, 1.0).log_prob(y[:, None]), -1)
    loss = TraceEnum_ELBO().loss(model, lambda: None)
    assert loss == pytest.approx(-(s * log_p).sum().item(), rel=1e-12)

    def shifted():  # NUTS's potential, the same way: at shift = 0, the prior's and s log p
        shift = pt.sample("shift", dist.Normal(0.0, 1.0))
        with pt.plate("n", 3), pt.handlers.scale(scale=s):
            z = pt.sample("z", dist.Categorical(w))
            pt.sample("y", dist.Normal(locs[z] + shift, 1.0), obs=y)

    value, _ = Potential(shifted, compile=False).value_and_grad(torch.zeros(1, 1))
    exact = -(dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0)) + s * log_p.sum())
    torch.testing.assert_close(value[0], exact)

    def unshared():  # z unscaled, y scaled: no one scale for the log of their sum
        with pt.plate("n", 3):
            z = pt.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            with pt.handlers.scale(scale=s):
                pt.sample("y", dist.Normal(locs[z], 1.0), obs=y)

    with pytest.raises(ValueError, match=r"sites 'z' \(scale 1\) and 'y' \(scale 4\) have "
                       r"different pt.handlers.scale but are summed over together with the "
                       r"discrete sites \['z'\]"):  # fmt: skip
        TraceEnum_ELBO().loss(unshared, lambda: None)


def test_a_mask_leaves_a_summed_out_sites_own_term_and_masks_the_sites_reading_it():
    # As Pyro's TraceEnum_ELBO: pt.handlers.mask over a summed-out z drops y's masked terms
    # but keeps p(z), whose sum over z is 1. Masking p(z) too gave each masked row
    # sum_z 1 = K (log 2 here; 4 log 2 in a padded HMM) and, where a masked z feeds an
    # unmasked site, another posterior.
    y, keep = torch.tensor([0.3, 5.0]), torch.tensor([True, False])
    w, locs = torch.tensor([0.5, 0.5]), torch.tensor([0.0, 0.7])

    def model():
        with pt.plate("n", 2), pt.handlers.mask(mask=keep):
            z = pt.sample("z", dist.Categorical(w), infer={"enumerate": "parallel"})
            pt.sample("y", dist.Normal(locs[z], 1.0), obs=y)

    log_p = torch.logsumexp(w.log() + dist.Normal(locs, 1.0).log_prob(y[0]), -1)
    assert TraceEnum_ELBO().loss(model, lambda: None) == pytest.approx(-log_p.item(), rel=1e-12)

    def shifted():  # NUTS's potential: at shift = 0, the prior's and log p
        shift = pt.sample("shift", dist.Normal(0.0, 1.0))
        with pt.plate("n", 2), pt.handlers.mask(mask=keep):
            z = pt.sample("z", dist.Categorical(w))
            pt.sample("y", dist.Normal(locs[z] + shift, 1.0), obs=y)

    value, _ = Potential(shifted, compile=False).value_and_grad(torch.zeros(1, 1))
    exact = -(dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0)) + log_p)
    torch.testing.assert_close(value[0], exact)


def test_an_initial_value_for_a_summed_out_site_is_refused_as_such():
    """``init_params`` naming the mixture's assignments ``z``: the error said ``z`` was no
    latent site of the model; it is one, summed out, which takes no initial value."""
    y = _mixture_data(20)
    mcmc = MCMC(NUTS(mixture, compile=False), num_warmup=2, num_samples=2, progress_bar=False)
    init = {"p": torch.tensor(0.5), "mu": torch.tensor(1.0)}
    refused = r"init_params has \['z'\], discrete site\(s\) that HMC/NUTS sum out "
    with pytest.raises(ValueError, match=refused + r".*take no initial value.*infer_discrete"):
        mcmc.run(y, init_params={**init, "z": torch.zeros(20, dtype=torch.long)})


# -- infer_discrete (Pyro's handler) -------------------------------------------------------
def test_infer_discrete_draws_each_assignment_from_its_posterior(float64):
    """``mixture`` with p and mu replayed from a guide's trace (Pyro's pattern): z_i given
    y_i is Bernoulli(q_i), q_i = p N(y_i; mu, 1) / (p N(y_i; mu, 1) + (1 - p) N(y_i; -1, 1)).
    Three groups of 300 equal points; each group's frequency of z = 1 over four seeded
    calls (1200 draws) within 4 standard errors of q. temperature=0 gives [q > 1/2]; an
    outer trace records the final run once, z latent, p and mu at the replayed values."""
    from probtorch.inference import infer_discrete

    y = torch.tensor([-1.5, 0.6, 2.5], dtype=torch.float64).repeat_interleave(300)
    p, mu = torch.tensor(0.3, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)

    def guide(y):
        pt.sample("p", dist.Delta(p))
        pt.sample("mu", dist.Delta(mu))

    guide_trace = trace(pt.handlers.seed(guide, rng_seed=0)).get_trace(y)
    trained = pt.handlers.replay(mixture, trace=guide_trace)
    one = dist.Normal(mu, 1.0).log_prob(y[::300]).exp() * p
    zero = dist.Normal(-1.0, 1.0).log_prob(y[::300]).exp() * (1 - p)
    q = one / (one + zero)
    draws = []
    for seed in range(4):
        tr = trace(pt.handlers.seed(infer_discrete(trained), rng_seed=seed)).get_trace(y)
        assert not tr["z"].is_observed and float(tr["p"].value) == 0.3
        assert [name for name in tr if name in ("p", "mu", "z", "y")] == ["p", "mu", "z", "y"]
        draws.append(tr["z"].value.reshape(3, 300))
    freq = torch.cat(draws, 1).mean(1)
    se = (q * (1 - q) / 1200).sqrt()
    assert bool(((freq - q).abs() <= 4 * se + 1e-12).all()), (freq, q)
    viterbi = infer_discrete(trained, first_available_dim=-2, temperature=0)
    most_probable = trace(viterbi).get_trace(y)["z"].value.reshape(3, 300)
    assert torch.equal(most_probable, (q > 0.5).to(most_probable.dtype)[:, None].expand(3, 300))


def test_infer_discrete_viterbi_path_of_a_markov_chain(float64):
    """temperature=0 on a ``pt.markov`` chain: the most probable joint path, against the
    best of all 3^6 paths scored by hand; as a decorator with Pyro's arguments."""
    from probtorch.inference import infer_discrete

    y = torch.tensor([-1.2, 0.3, 2.4, 1.8, -0.7, 0.6], dtype=torch.float64)
    scale = torch.tensor(0.8, dtype=torch.float64)
    conditioned = pt.handlers.condition(markov_chain, data={"scale": scale})

    @infer_discrete(first_available_dim=-1, temperature=0)
    def decoder(y):
        return conditioned(y)

    tr = trace(decoder).get_trace(y)
    path = [int(tr[f"z{t}"].value) for t in range(6)]
    emit = dist.Normal(LOCS, scale).log_prob(y[:, None])

    def score(states):
        total, previous = 0.0, 0
        for t, s in enumerate(states):
            total += float(TRANSITIONS[previous, s].log() + emit[t, s])
            previous = s
        return total

    best = max(itertools.product(range(3), repeat=6), key=score)
    assert path == list(best)


def test_infer_discrete_errors_and_a_model_without_discrete_sites():
    from probtorch.inference import infer_discrete

    with pytest.raises(ValueError, match="temperature must be 1 .* or 0"):
        infer_discrete(mixture, temperature=0.5)
    with pytest.raises(ValueError, match="first_available_dim must be a negative integer"):
        infer_discrete(mixture, first_available_dim=1)
    y = _mixture_data(5)
    fixed = pt.handlers.condition(mixture, data={"p": torch.tensor(0.5), "mu": torch.tensor(2.0)})
    with pytest.raises(pt.RandomnessError, match=r"infer_discrete\(temperature=1\).*\['z'\]"):
        infer_discrete(fixed)(y)

    # (review helper-59) a continuous site drawn given a discrete site's placeholder, and
    # handlers outside that the reading pass would not see, are refused; subsampling too
    def downstream(y):
        z = pt.sample("z", dist.Bernoulli(0.5))
        mu = pt.sample("mu", dist.Normal(10.0 * z, 1.0))
        pt.sample("y", dist.Normal(mu, 10.0), obs=y[0])

    with pytest.raises(ValueError, match=r"'mu' is drawn .* depends on the discrete .*\['z'\]"):
        pt.handlers.seed(infer_discrete(downstream), rng_seed=0)(y)
    outer = pt.handlers.condition(infer_discrete(mixture), data={"p": torch.tensor(0.5)})
    with pytest.raises(ValueError, match=r"runs inside \['condition'\].*put them inside"):
        pt.handlers.seed(outer, rng_seed=0)(y)

    def subsampled(y):
        with pt.plate("data", len(y), subsample_size=2) as idx:
            z = pt.sample("z", dist.Bernoulli(0.5))
            pt.sample("y", dist.Normal(z, 1.0), obs=y[idx])

    with pytest.raises(
        ValueError, match="infer_discrete sums the discrete sites out over the full"
    ):
        pt.handlers.seed(infer_discrete(subsampled), rng_seed=0)(y)

    def continuous(y):
        return pt.sample("m", dist.Normal(0.0, 1.0), obs=y[0])

    with pytest.warns(UserWarning, match="no discrete latent site"):
        assert float(infer_discrete(continuous)(y)) == float(y[0])


def _hmm_log_likelihood(y, trans, loc):
    """log p(y) of one chain by the forward algorithm: z_0 ~ trans[0], z_t ~ trans[z_{t-1}],
    y_t ~ Normal(loc * z_t, 1)."""
    from scipy import stats
    from scipy.special import logsumexp

    trans = np.log(trans)
    alpha = None
    for t, y_t in enumerate(y):
        emit = stats.norm(loc * np.arange(2), 1.0).logpdf(y_t)
        prior = trans[0] if t == 0 else logsumexp(alpha[:, None] + trans, axis=0)
        alpha = prior + emit
    return logsumexp(alpha)


def test_sequences_of_markov_chains_in_an_iterated_plate_reuse_dims(float64):
    """Pyro's ``examples/hmm.py`` model_0: ``for i in pt.plate("seqs", 40)`` around a
    ``pt.markov`` chain per sequence. Each iteration's discrete sites reuse the dims of the
    earlier iterations' (they had taken two new dims each: refused past 31 sequences);
    the ELBO and the potential are the forward algorithm's, sequence by sequence. A plain
    ``range`` loop gives no independence and is refused, the message naming the plate."""
    from scipy import stats

    num_seqs, length = 40, 3
    y = torch.randn(length, num_seqs, generator=torch.Generator().manual_seed(0))
    trans = torch.tensor([[0.8, 0.2], [0.3, 0.7]])

    def model(loop):
        loc = pt.sample("loc", dist.Normal(0.0, 1.0))
        for i in loop("seqs", num_seqs):
            z = 0
            for t in pt.markov(range(length)):
                z = pt.sample(f"z_{i}_{t}", dist.Categorical(trans[z]))
                pt.sample(f"y_{i}_{t}", dist.Normal(loc * z, 1.0), obs=y[t, i])

    loc = 0.3
    exact = stats.norm.logpdf(loc) + sum(
        _hmm_log_likelihood(y[:, i].numpy(), trans.numpy(), loc) for i in range(num_seqs)
    )
    guide = lambda loop: pt.sample("loc", dist.Delta(torch.tensor(loc)))  # noqa: E731
    loss = TraceEnum_ELBO().loss(model, guide, pt.plate)
    assert loss == pytest.approx(-exact, rel=1e-10)
    potential = Potential(model, (pt.plate,), compile=False)
    assert float(potential(torch.tensor([[loc]]))) == pytest.approx(-exact, rel=1e-10)
    with pytest.raises(ValueError, match=r"for i in pt.plate\('sequences', N\)"):
        TraceEnum_ELBO().loss(model, guide, lambda name, n: range(n))


def test_a_scale_per_row_around_a_global_summed_out_site_is_refused(float64):
    """A tensor ``pt.handlers.scale`` multiplies the log of a sum over discrete sites
    elementwise: around a global summed-out site it had weighted every row by the sum of
    the scales (a loss of -6 log p(y) for scales [1, 2, 3]); refused as by Pyro and by
    probtorch's potential, naming the site. Inside the plate it is exact."""
    y, locs = torch.tensor([-2.1, 0.3, 2.4]), torch.tensor([-1.8, 2.0])
    weights = torch.tensor([1.0, 2.0, 3.0])

    def model():
        with pt.handlers.scale(scale=weights):
            g = pt.sample("g", dist.Bernoulli(0.4))
            with pt.plate("n", 3):
                z = pt.sample("z", dist.Bernoulli(0.3 + 0.4 * g))
                pt.sample("y", dist.Normal(locs[z.long()] + g, 1.0), obs=y)

    with pytest.raises(ValueError, match=r"site 'g' has a pt.handlers.scale of shape \(3,\)"):
        TraceEnum_ELBO().loss(model, lambda: None)

    def local():
        with pt.plate("n", 3), pt.handlers.scale(scale=weights):
            z = pt.sample("z", dist.Bernoulli(0.3))
            pt.sample("y", dist.Normal(locs[z.long()], 1.0), obs=y)

    per_row = torch.logsumexp(
        torch.stack([math.log(0.7) + dist.Normal(locs[0], 1.0).log_prob(y),
                     math.log(0.3) + dist.Normal(locs[1], 1.0).log_prob(y)]), 0
    )  # fmt: skip
    expected = -float((weights * per_row).sum())
    assert TraceEnum_ELBO().loss(local, lambda: None) == pytest.approx(expected, rel=1e-12)
