"""Tests of the modeling primitives: sample, param, plate, deterministic, factor, module.

Expected values come from scipy.stats or are computed by hand; random draws are compared
with the draws torch makes from the same seed.
"""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.distributions import constraints

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import replay, seed, substitute, trace
from probtorch.runtime import CondIndepStackFrame, get_stack

# float(param) is how a user reads a parameter; torch warns because params require grad.
pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")


@pytest.fixture
def f64():
    torch.set_default_dtype(torch.float64)  # conftest restores the default dtype


# -- sample ---------------------------------------------------------------------------


def test_sample_latent_draws_from_seeded_torch_generator():
    def model():
        a = pt.sample("a", dist.Normal(1.0, 2.0))
        b = pt.sample("b", dist.Poisson(3.0), sample_shape=(4,))
        return a, b

    a, b = seed(model, rng_seed=7)()
    torch.manual_seed(7)
    expected_a = dist.Normal(1.0, 2.0).rsample()
    expected_b = dist.Poisson(3.0).sample((4,))
    assert torch.equal(a, expected_a)
    assert torch.equal(b, expected_b)


def test_sample_latent_site_in_trace():
    def model():
        return pt.sample("x", dist.Normal(torch.zeros(3), 1.0), sample_shape=(2,))

    tr = trace(seed(model, rng_seed=0)).get_trace()
    site = tr["x"]
    assert site.type == "sample"
    assert not site.is_observed
    assert site.value.shape == (2, 3)
    assert site["value"] is site.value  # dict-style access, as in Pyro traces
    assert tr.nodes["x"] is site
    assert site.kwargs["sample_shape"] == (2,)
    assert site.cond_indep_stack == ()


def test_sample_latent_is_differentiable_rsample():
    loc = torch.tensor(0.5, requires_grad=True)

    def model():
        return pt.sample("x", dist.Normal(loc, 1.0))

    x = seed(model, rng_seed=0)()
    x.backward()
    assert loc.grad == 1.0  # x = loc + eps


def test_sample_observed_returns_obs_and_is_observed():
    def model(y):
        return pt.sample("y", dist.Normal(0.0, 1.0), obs=y)

    tr = trace(model).get_trace(torch.tensor(0.3))
    assert tr["y"].is_observed
    assert float(tr["y"].value) == pytest.approx(0.3)
    # plain Python numbers become tensors
    tr = trace(model).get_trace(2.0)
    assert isinstance(tr["y"].value, torch.Tensor)
    assert float(tr["y"].value) == 2.0


def test_sample_without_any_handler():
    y = torch.tensor([1.0, 2.0])
    assert pt.sample("y", dist.Normal(0.0, 1.0), obs=y) is y
    with pytest.raises(pt.RandomnessError, match="'x'"):
        pt.sample("x", dist.Normal(0.0, 1.0))


def test_sample_obs_mask_sites_and_value(f64):
    obs = torch.tensor([1.0, -2.0, 3.0, 0.5, -1.5])
    obs_mask = torch.tensor([True, False, True, False, True])
    loc, scale = 0.25, 1.5

    def model():
        with pt.plate("data", 5):
            return pt.sample("y", dist.Normal(loc, scale), obs=obs, obs_mask=obs_mask)

    tracer = trace(seed(model, rng_seed=3))
    value = tracer()
    tr = tracer.trace
    assert list(tr) == ["data", "y_unobserved", "y_observed", "y"]
    unobserved, observed = tr["y_unobserved"], tr["y_observed"]
    assert not unobserved.is_observed and unobserved.value.shape == (5,)
    # the observed site's entries left out by the mask hold the imputed values (any filler
    # the data have there, NaN say, counts for nothing and need not lie in the support)
    assert observed.is_observed
    assert torch.equal(observed.value, torch.where(obs_mask, obs, unobserved.value))
    # the combined value: observed entries where the mask is True, imputed elsewhere
    expected = torch.where(obs_mask, obs, unobserved.value)
    assert torch.equal(value, expected)
    assert tr["y"].type == "deterministic" and torch.equal(tr["y"].value, expected)
    assert torch.equal(value[obs_mask], obs[obs_mask])
    assert torch.equal(value[~obs_mask], unobserved.value[~obs_mask])

    # the observed half contributes where the mask is True; the unobserved site is a proper
    # draw from fn everywhere (unused where observed: it integrates to one there)
    lp = tr.log_densities()
    ref_obs = stats.norm(loc, scale).logpdf(obs.numpy())
    ref_unobs = stats.norm(loc, scale).logpdf(unobserved.value.numpy())
    m = obs_mask.numpy()
    np.testing.assert_allclose(lp["y_observed"].numpy(), np.where(m, ref_obs, 0.0), rtol=1e-12)
    np.testing.assert_allclose(lp["y_unobserved"].numpy(), ref_unobs, rtol=1e-12)
    assert tr.log_likelihood().keys() == {"y_observed"}


def test_obs_mask_takes_nan_filler_and_names_a_mask_that_does_not_fit():
    obs = torch.tensor([1.0, float("nan"), 3.0, float("nan")])
    obs_mask = ~obs.isnan()

    def model(mask=obs_mask):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("data", 4):
            return pt.sample("y", dist.Normal(mu, 1.0), obs=obs, obs_mask=mask)

    tr = trace(seed(model, rng_seed=0)).get_trace()
    assert bool(torch.isfinite(tr["y"].value).all())
    assert bool(torch.isfinite(tr.log_prob_sum()))
    with pytest.raises(ValueError, match=r"'y': obs_mask of shape \(3,\) does not fit obs of "
                       r"shape \(4,\).*batch shape \(4,\)"):  # fmt: skip
        trace(seed(model, rng_seed=0)).get_trace(torch.tensor([True, False, True]))


def test_sample_obs_mask_broadcasts_over_event_dims(f64):
    obs = torch.arange(8.0).reshape(4, 2)
    obs_mask = torch.tensor([True, False, False, True])

    def model():
        fn = dist.Normal(torch.zeros(4, 2), 1.0).to_event(1)
        return pt.sample("y", fn, obs=obs, obs_mask=obs_mask)

    tracer = trace(seed(model, rng_seed=0))
    value = tracer()
    unobserved = tracer.trace["y_unobserved"].value
    assert value.shape == (4, 2)
    assert torch.equal(value[obs_mask], obs[obs_mask])
    assert torch.equal(value[~obs_mask], unobserved[~obs_mask])
    lp = tracer.trace.log_densities()["y_observed"]
    ref = stats.norm.logpdf(obs.numpy()).sum(-1)
    np.testing.assert_allclose(lp.numpy(), np.where(obs_mask.numpy(), ref, 0.0), rtol=1e-12)


def test_sample_obs_mask_without_obs_raises():
    with pytest.raises(ValueError, match="'y'.*obs_mask was given without obs"):
        pt.sample("y", dist.Normal(0.0, 1.0), obs_mask=torch.tensor(True))


# -- param ----------------------------------------------------------------------------


def test_param_default_store_and_init_only_once():
    store = pt.get_param_store()
    w = pt.param("w", torch.tensor([1.0, 2.0]))
    assert "w" in store and len(store) == 1
    assert torch.equal(w, torch.tensor([1.0, 2.0]))
    assert w.requires_grad
    # a second call ignores its init value and returns the stored parameter
    again = pt.param("w", torch.tensor([5.0, 5.0]))
    assert again is store.unconstrained("w")
    assert torch.equal(again, torch.tensor([1.0, 2.0]))
    # without init value a known param is fine, an unknown one is an error
    assert torch.equal(pt.param("w"), w)
    with pytest.raises(KeyError, match="'nope'"):
        pt.param("nope")
    # plain numbers are accepted
    assert pt.param("c", 3).item() == 3.0


@pytest.mark.parametrize(
    "constraint, init, unconstrained",
    [
        (constraints.positive, 2.0, math.log(2.0)),
        (constraints.unit_interval, 0.25, math.log(0.25 / 0.75)),
        (constraints.interval(1.0, 3.0), 2.5, math.log(0.75 / 0.25)),
        (constraints.greater_than(-1.0), 0.0, 0.0),
    ],
)
def test_param_constraints(f64, constraint, init, unconstrained):
    value = pt.param("p", torch.tensor(init), constraint=constraint)
    store = pt.get_param_store()
    assert float(value) == pytest.approx(init, abs=1e-12)
    assert float(store.unconstrained("p")) == pytest.approx(unconstrained, abs=1e-12)
    assert store.constraint("p") is constraint
    # optimizing the unconstrained leaf changes the constrained value consistently
    with torch.no_grad():
        store.unconstrained("p").add_(10.0)
    moved = float(pt.param("p"))
    assert bool(constraint.check(torch.tensor(moved)))
    assert moved == pytest.approx(
        float(dist.biject_to(constraint)(torch.tensor(unconstrained + 10.0))), abs=1e-12
    )


def test_param_simplex_constraint_round_trip(f64):
    init = torch.tensor([0.2, 0.3, 0.5])
    value = pt.param("probs", init, constraint=constraints.simplex)
    assert torch.allclose(value, init, atol=1e-12)
    assert pt.get_param_store().unconstrained("probs").shape == (2,)


def test_param_init_outside_constraint_raises():
    with pytest.raises(ValueError, match="'s'.*constraint"):
        pt.param("s", torch.tensor(-1.0), constraint=constraints.positive)


def test_param_gradient_flows_to_unconstrained_leaf(f64):
    s = pt.param("s", torch.tensor(2.0), constraint=constraints.positive)
    s.backward()
    # d exp(u) / du = exp(u) = 2
    assert float(pt.get_param_store().unconstrained("s").grad) == pytest.approx(2.0)


def test_param_init_from_callable_called_once():
    calls = []

    def init():
        calls.append(1)
        return torch.full((2, 2), 0.5)

    first = pt.param("m", init, constraint=constraints.unit_interval)
    second = pt.param("m", init, constraint=constraints.unit_interval)
    assert len(calls) == 1
    assert torch.allclose(first, torch.full((2, 2), 0.5))
    assert torch.equal(first, second)


def test_param_scope_uses_separate_store():
    store_a, store_b = pt.ParamStore(), pt.ParamStore()

    def model():
        return pt.param("w", torch.tensor(1.0))

    with pt.param_scope(store_a):
        w_a = model()
    w_b = pt.param_scope(store_b, model)()
    with torch.no_grad():
        store_a.unconstrained("w").fill_(4.0)
    assert "w" not in pt.get_param_store()
    assert list(store_a.keys()) == ["w"] and list(store_b.keys()) == ["w"]
    assert w_a is store_a.unconstrained("w") and w_b is store_b.unconstrained("w")
    assert float(pt.param_scope(store_a, model)()) == 4.0
    assert float(pt.param_scope(store_b, model)()) == 1.0
    # outside any scope the default store is used again
    assert float(model()) == 1.0 and "w" in pt.get_param_store()


def test_param_site_in_trace_and_substitute():
    def model():
        return pt.param("p", torch.tensor(0.5), constraint=constraints.unit_interval)

    tr = trace(model).get_trace()
    assert tr["p"].type == "param"
    assert float(tr["p"].value) == pytest.approx(0.5)
    sub = substitute(model, data={"p": torch.tensor(0.9)})
    assert float(sub()) == pytest.approx(0.9)
    assert float(pt.param("p")) == pytest.approx(0.5)  # the store is untouched


def test_param_read_twice_in_one_run():
    def model():
        a = pt.param("a", torch.tensor(1.0))
        b = pt.param("a", torch.tensor(1.0))
        return a, b

    tr = trace(model).get_trace()
    assert list(tr) == ["a"]
    assert float(tr["a"].value) == 1.0


# -- plate ----------------------------------------------------------------------------


def test_plate_broadcasts_sites_at_automatic_dims():
    def model():
        with pt.plate("outer", 3) as outer:
            a = pt.sample("a", dist.Normal(0.0, 1.0))
            with pt.plate("inner", 2):
                b = pt.sample("b", dist.Normal(0.0, 1.0))
                c = pt.sample("c", dist.Normal(torch.zeros(3), 1.0))
        return outer, a, b, c

    tracer = trace(seed(model, rng_seed=0))
    outer, a, b, c = tracer()
    tr = tracer.trace
    assert torch.equal(outer, torch.arange(3))
    assert a.shape == (3,)
    assert b.shape == (2, 3)
    assert c.shape == (2, 3)
    outer_frame = CondIndepStackFrame("outer", -1, 3, 3)
    inner_frame = CondIndepStackFrame("inner", -2, 2, 2)
    assert tr["a"].cond_indep_stack == (outer_frame,)
    # innermost plate first, as in NumPyro
    assert tr["b"].cond_indep_stack == (inner_frame, outer_frame)
    assert tr["b"].fn.batch_shape == (2, 3)
    assert tr["outer"].type == "plate" and torch.equal(tr["outer"].value, torch.arange(3))
    assert tr.log_densities()["b"].shape == (2, 3)
    assert get_stack() == []


def test_plate_explicit_dim():
    def model():
        with pt.plate("rows", 3, dim=-2):
            x = pt.sample("x", dist.Normal(0.0, 1.0))
            with pt.plate("cols", 4):  # automatic: the free dim -1
                y = pt.sample("y", dist.Normal(0.0, 1.0))
        with pt.plate("deep", 2, dim=-3):
            z = pt.sample("z", dist.Normal(torch.zeros(5), 1.0))
        return x, y, z

    tracer = trace(seed(model, rng_seed=0))
    x, y, z = tracer()
    assert x.shape == (3, 1)
    assert y.shape == (3, 4)
    assert z.shape == (2, 1, 5)
    assert tracer.trace["y"].cond_indep_stack == (
        CondIndepStackFrame("cols", -1, 4, 4),
        CondIndepStackFrame("rows", -2, 3, 3),
    )


def test_a_plate_of_one_element_adds_its_dim():
    """As in Pyro and NumPyro (it left the batch shape as it was: a site in a plate of size
    1 had shape (), so that ``torch.cat`` of it with other vectors failed)."""

    def model():
        with pt.plate("one", 1):
            x = pt.sample("x", dist.Normal(0.0, 1.0))
        with pt.plate("rows", 1, dim=-2):
            y = pt.sample("y", dist.Normal(0.0, 1.0))
        return x, y

    x, y = seed(model, rng_seed=0)()
    assert x.shape == (1,) and y.shape == (1, 1)


def test_plate_automatic_dim_skips_dims_of_enclosing_plates():
    def model():
        with pt.plate("a", 2, dim=-1):
            with pt.plate("b", 3, dim=-2):
                with pt.plate("c", 4):
                    return pt.sample("x", dist.Normal(0.0, 1.0))

    assert seed(model, rng_seed=0)().shape == (4, 3, 2)


def test_plate_explicit_dim_collision_and_bad_arguments():
    with pytest.raises(ValueError, match="plate 'b': dim -1 is already used"):
        with pt.plate("a", 2):
            with pt.plate("b", 2, dim=-1):
                pass
    assert get_stack() == []
    with pytest.raises(ValueError, match="dim must be negative"):
        pt.plate("p", 3, dim=0)
    with pytest.raises(ValueError, match="size must be >= 0"):
        pt.plate("p", -1)
    with pytest.raises(ValueError, match=r"subsample_size must lie in \[1, size=3\]"):
        pt.plate("p", 3, subsample_size=4)


def test_plate_reused_twice():
    def model(data_x, data_y):
        p = pt.plate("data", 4)
        with p:
            x = pt.sample("x", dist.Normal(0.0, 1.0), obs=data_x)
        with p:
            y = pt.sample("y", dist.Normal(0.0, 1.0), obs=data_y)
        return x, y

    tr = trace(model).get_trace(torch.zeros(4), torch.ones(4))
    assert list(tr) == ["data", "x", "y"]
    frame = CondIndepStackFrame("data", -1, 4, 4)
    assert tr["x"].cond_indep_stack == (frame,) == tr["y"].cond_indep_stack


@pytest.mark.parametrize(
    "kwargs", [{}, {"subsample_size": 2}, {"dim": -2}], ids=["full", "subsampled", "dim"]
)
def test_a_plate_entered_again_while_active_is_refused(kwargs):
    """As Pyro (``duplicate plate 'data'``): a plate entered again inside itself put its
    frame on the sites twice, scaled a subsample's sites twice (2.5 ** 2), and the inner
    block's exit reset its dim, so the outer block's next site failed with a TypeError."""
    p = pt.plate("data", 5, **kwargs)
    dim = kwargs.get("dim", -1)
    refused = (
        rf"plate 'data' is entered while a plate named 'data' \(size 5, dim {dim}\) is active "
        r"\(the same plate entered again;.*Enter a plate once"
    )

    def inner():
        with p:
            pt.sample("x", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=refused):
        with trace(), seed(rng_seed=0), p:
            with p:
                pass
    assert get_stack() == []
    with pytest.raises(ValueError, match=refused):
        with seed(rng_seed=0), p, pt.plate("other", 3, dim=-3):
            inner()  # a function run inside the plate that enters it again
    assert get_stack() == []
    with trace() as tr, seed(rng_seed=0):  # entered again after it exits: as before
        with p:
            pt.sample("a", dist.Normal(0.0, 1.0))
        with p:
            pt.sample("b", dist.Normal(0.0, 1.0))
    frame = CondIndepStackFrame("data", kwargs.get("dim", -1), 5, kwargs.get("subsample_size", 5))
    for name in ("a", "b"):
        assert tr[name].cond_indep_stack == (frame,)
        assert tr[name].value.shape == (frame.subsample_size,) + (1,) * (-frame.dim - 1)
        assert tr[name].scale == (None if frame.subsample_size == 5 else 2.5)


def test_a_markov_entered_again_while_active_is_its_next_step():
    """Unlike a plate, a ``markov`` is meant to be re-entered (Pyro's ReentrantMessenger):
    each entry is one step deeper; it is on the handler stack once."""
    m = pt.markov(history=1)
    with trace() as tr, seed(rng_seed=0):
        with m:
            pt.sample("a", dist.Normal(0.0, 1.0))
            with m:
                assert get_stack().count(m) == 1
                pt.sample("b", dist.Normal(0.0, 1.0))
        with m:  # and entered again after it exits
            pt.sample("c", dist.Normal(0.0, 1.0))
    assert [tr[name].extra["markov"][0][1:] for name in "abc"] == [(1, 1), (2, 1), (1, 1)]
    assert get_stack() == [] and m.depth == 0


def test_plate_reused_twice_with_subsample_uses_the_same_indices():
    def model():
        p = pt.plate("data", 10, subsample_size=3)
        with p as first:
            pass
        with p as second:
            pass
        return first, second

    tracer = trace(seed(model, rng_seed=4))
    first, second = tracer()
    assert torch.equal(first, second)
    assert torch.equal(tracer.trace["data"].value, first)


def test_plate_subsample_indices_are_seeded():
    def model():
        with pt.plate("data", 10, subsample_size=4) as idx:
            return idx

    idx = seed(model, rng_seed=11)()
    torch.manual_seed(11)
    assert torch.equal(idx, torch.randperm(10)[:4])
    assert len(set(idx.tolist())) == 4
    assert torch.equal(seed(model, rng_seed=11)(), idx)
    with pytest.raises(pt.RandomnessError, match="plate 'data'.*seed"):
        trace(model)()
    # full-size plates need no random numbers
    with trace():
        with pt.plate("full", 3) as full:
            pass
    assert torch.equal(full, torch.arange(3))


def test_plate_subsample_sizes_sites_and_scales_log_density(f64):
    data = torch.linspace(-2.0, 2.0, 10)

    def model():
        with pt.plate("data", 10, subsample_size=4) as idx:
            pt.sample("y", dist.Normal(0.5, 2.0), obs=data[idx])
        return idx

    tracer = trace(seed(model, rng_seed=2))
    idx = tracer()
    tr = tracer.trace
    assert tr["y"].cond_indep_stack == (CondIndepStackFrame("data", -1, 10, 4),)
    assert tr["y"].scale == pytest.approx(2.5)
    expected = 2.5 * stats.norm(0.5, 2.0).logpdf(data[idx].numpy())
    np.testing.assert_allclose(tr.log_densities()["y"].numpy(), expected, rtol=1e-12)
    assert float(tr.log_prob_sum()) == pytest.approx(expected.sum(), rel=1e-12)
    # pointwise log likelihood is not scaled
    np.testing.assert_allclose(tr.log_likelihood()["y"].numpy(), expected / 2.5, rtol=1e-12)


def test_plate_subsample_with_plate_size_one_batch_is_expanded(f64):
    def model():
        with pt.plate("data", 6, subsample_size=2):
            return pt.sample("z", dist.Normal(0.0, 1.0))

    assert seed(model, rng_seed=0)().shape == (2,)


def _subsampled_loglik(model, data, idx):
    tr = trace(substitute(model, data={"data": idx})).get_trace(data)
    return float(tr.log_prob_sum())


@pytest.mark.parametrize("subsample_size", [1, 2, 3])
def test_plate_subsample_average_over_all_subsamples_is_full_log_likelihood(f64, subsample_size):
    data = torch.tensor([0.3, -1.2, 2.5, 0.0, 1.1, -0.7])
    n = len(data)

    def model(data):
        with pt.plate("data", n, subsample_size=subsample_size) as idx:
            pt.sample("y", dist.StudentT(4.0, 0.2, 1.3), obs=data[idx])

    full = stats.t(4.0, 0.2, 1.3).logpdf(data.numpy()).sum()
    subsets = list(itertools.combinations(range(n), subsample_size))
    assert len(subsets) == math.comb(n, subsample_size)
    values = [_subsampled_loglik(model, data, torch.tensor(s)) for s in subsets]
    assert np.mean(values) == pytest.approx(full, abs=1e-10)
    # a partition into disjoint subsamples is also unbiased
    if n % subsample_size == 0:
        blocks = torch.arange(n).reshape(-1, subsample_size)
        disjoint = [_subsampled_loglik(model, data, b) for b in blocks]
        assert np.mean(disjoint) == pytest.approx(full, abs=1e-10)


def test_nested_subsampled_plates_multiply_scales(f64):
    def model():
        with pt.plate("a", 6, subsample_size=3):
            with pt.plate("b", 4, subsample_size=1):
                pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(1, 3))

    tr = trace(seed(model, rng_seed=0)).get_trace()
    assert tr["y"].scale == pytest.approx(2.0 * 4.0)
    assert float(tr.log_prob_sum()) == pytest.approx(8.0 * 3 * stats.norm.logpdf(0.0))


def test_plate_replayed_indices():
    def model():
        with pt.plate("data", 20, subsample_size=5) as idx:
            pt.sample("x", dist.Normal(0.0, 1.0))
        return idx

    guide_trace = trace(seed(model, rng_seed=1)).get_trace()
    replayed = trace(seed(replay(model, trace=guide_trace), rng_seed=2)).get_trace()
    assert torch.equal(replayed["data"].value, guide_trace["data"].value)
    assert torch.equal(replayed["x"].value, guide_trace["x"].value)
    unreplayed = seed(model, rng_seed=2)()
    assert not torch.equal(unreplayed, guide_trace["data"].value)


def test_plate_without_handlers_and_param_not_broadcast():
    with pt.plate("data", 5, subsample_size=2) as idx:
        assert len(get_stack()) == 1
        assert idx.shape == (2,)
        w = pt.param("w", torch.tensor(1.0))
    assert w.shape == ()
    assert get_stack() == []


# -- deterministic, factor, module ----------------------------------------------------


def test_deterministic():
    value = torch.tensor([1.0, 2.0])
    assert pt.deterministic("d", value) is value  # no handler

    def model():
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        return pt.deterministic("double", 2 * x)

    tracer = trace(seed(model, rng_seed=0))
    out = tracer()
    tr = tracer.trace
    assert tr["double"].type == "deterministic"
    assert torch.equal(out, 2 * tr["x"].value)
    assert torch.equal(tr["double"].value, out)
    assert set(tr.log_densities()) == {"x"}
    assert float(tr.log_prob_sum()) == pytest.approx(
        float(stats.norm.logpdf(float(tr["x"].value))), rel=1e-6
    )


def test_factor_adds_to_log_prob_sum(f64):
    def model():
        pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.5))
        pt.factor("penalty", torch.tensor(-3.25))
        with pt.plate("data", 3):
            pt.factor("vector", torch.tensor([0.5, 1.0, -2.0]))

    tr = trace(model).get_trace()
    site = tr["penalty"]
    assert site.type == "sample" and site.is_observed
    assert site.infer["is_auxiliary"]
    assert float(tr.log_densities()["penalty"]) == -3.25
    assert tr.log_densities()["vector"].tolist() == [0.5, 1.0, -2.0]
    expected = stats.norm.logpdf(0.5) - 3.25 + (0.5 + 1.0 - 2.0)
    assert float(tr.log_prob_sum()) == pytest.approx(expected, abs=1e-12)
    assert set(tr.log_likelihood()) == {"y"}


def test_factor_gradient():
    theta = torch.tensor(2.0, requires_grad=True)

    def model():
        pt.factor("f", -(theta**2))

    trace(model).get_trace().log_prob_sum().backward()
    assert float(theta.grad) == -4.0


def test_module_registers_parameters():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    assert pt.module("net", net) is net
    store = pt.get_param_store()
    assert sorted(store.keys()) == ["net$$$bias", "net$$$weight"]
    # the module's own parameters are stored, so training the store trains the module
    assert store.unconstrained("net$$$weight") is net.weight
    assert store.unconstrained("net$$$bias") is net.bias

    def model():
        pt.module("net", net)

    tr = trace(model).get_trace()
    assert list(tr) == ["net$$$weight", "net$$$bias"]
    assert all(site.type == "param" for site in tr.values())
    assert tr["net$$$weight"].value is net.weight


def test_module_in_param_scope():
    net = torch.nn.Linear(2, 1)
    store = pt.ParamStore()
    with pt.param_scope(store):
        pt.module("net", net)
    assert sorted(store.keys()) == ["net$$$bias", "net$$$weight"]
    assert len(pt.get_param_store()) == 0
    assert set(map(id, store.parameters())) == {id(p) for p in net.parameters()}


def test_plate_expansion_keeps_has_rsample_flag():
    """A distribution marked non-reparameterized stays so when a plate expands it."""

    def model():
        with pt.plate("n", 3):
            pt.sample("x", dist.Normal(0.0, 1.0).has_rsample_(False))

    site = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace()["x"]
    assert site.fn.batch_shape == (3,)
    assert site.fn.has_rsample is False


def test_a_plate_takes_the_size_of_indices_a_handler_gives():
    """The model replaying a guide that subsamples a plate the model leaves full (Pyro)."""

    def model(subsample_size=None):
        with pt.plate("data", 10, subsample_size=subsample_size):
            return pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(3))

    given = {"data": torch.tensor([7, 1, 4])}
    tr = trace(substitute(model, data=given)).get_trace()
    assert tr["y"].cond_indep_stack == (CondIndepStackFrame("data", -1, 10, 3),)
    assert tr["y"].scale == pytest.approx(10 / 3)
    with pytest.raises(ValueError, match=r"plate 'data': subsample_size=2 but .* gave 3 indices"):
        trace(substitute(model, data=given)).get_trace(subsample_size=2)


def test_a_param_with_event_dim_inside_a_subsampled_plate_gives_the_rows_of_the_subsample():
    def guide():
        with pt.plate("data", 10, subsample_size=3) as idx:
            loc = pt.param("loc", torch.arange(10.0), event_dim=0)
            pairs = pt.param("pairs", torch.arange(20.0).reshape(10, 2), event_dim=1)
            whole = pt.param("whole", torch.arange(10.0))  # no event_dim: left as it is
        return idx, loc, pairs, whole

    with pt.param_scope(pt.ParamStore()):
        idx, loc, pairs, whole = seed(guide, rng_seed=0)()
    assert torch.equal(loc, idx.float())
    assert torch.equal(pairs, torch.arange(20.0).reshape(10, 2)[idx])
    assert whole.shape == (10,)

    def wrong():
        with pt.plate("data", 10, subsample_size=3):
            pt.param("loc", torch.zeros(4), event_dim=0)

    with (
        pt.param_scope(pt.ParamStore()),
        pytest.raises(
            ValueError,
            match=r"param 'loc': shape \(4,\) with event_dim=0 .* plate 'data'.*size is 10",
        ),
    ):
        seed(wrong, rng_seed=0)()


def test_a_local_guide_with_params_cut_to_the_subsample_fits_each_row():
    from probtorch.inference import SVI, Trace_ELBO

    y = torch.arange(8.0)

    def model():
        with pt.plate("data", 8, subsample_size=3) as idx:
            z = pt.sample("z", dist.Normal(0.0, 10.0))
            pt.sample("y", dist.Normal(z, 0.1), obs=y[idx])

    def guide():
        with pt.plate("data", 8, subsample_size=3):
            loc = pt.param("loc", torch.zeros(8), event_dim=0)
            pt.sample("z", dist.Normal(loc, 0.05))

    svi = SVI(model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), seed=0)
    svi.run(1500, progress_bar=False)
    # each row's loc meets its own datum (other rows' data would put it units away)
    torch.testing.assert_close(svi.get_params()["loc"], y, atol=0.5, rtol=0)


def test_an_iterated_plate_runs_the_body_per_index_with_the_subsample_scale(f64):
    data = torch.tensor([0.3, -1.2, 2.5, 0.0, 1.1, -0.7])

    def model(subsample_size=None):
        seen = []
        for i in pt.plate("rows", 6, subsample_size=subsample_size):
            seen.append(i)
            pt.sample(f"y_{i}", dist.Normal(0.5, 2.0), obs=data[i])
        return seen

    tracer = trace(seed(model, rng_seed=3))
    assert tracer() == list(range(6))
    expected = stats.norm(0.5, 2.0).logpdf(data.numpy()).sum()
    assert float(tracer.trace.log_prob_sum()) == pytest.approx(expected, rel=1e-12)
    tracer = trace(seed(model, rng_seed=3))
    seen = tracer(subsample_size=2)
    assert seen == tracer.trace["rows"].value.tolist() and len(set(seen)) == 2
    assert all(tracer.trace[f"y_{i}"].scale == pytest.approx(3.0) for i in seen)
    expected = 3.0 * stats.norm(0.5, 2.0).logpdf(data[seen].numpy()).sum()
    assert float(tracer.trace.log_prob_sum()) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match=r"plate 's': a plate with dim=-1 is vectorized"):
        list(pt.plate("s", 3, dim=-1))
    assert list(pt.plate("s", 3, subsample=torch.tensor([2, 0, 1]))) == [2, 0, 1]


def test_a_subsampled_plate_built_twice_in_one_traced_run_is_refused():
    def model():
        with pt.plate("data", 100, subsample_size=4):
            pt.sample("a", dist.Normal(0.0, 1.0))
        with pt.plate("data", 100, subsample_size=4):
            pt.sample("b", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"plate 'data' is built twice .* subsample_size=4 of 100"):
        trace(seed(model, rng_seed=0)).get_trace()
    # replaying a run's indices gives both builds the same rows: accepted
    given = {"data": torch.tensor([5, 1, 9, 3])}
    tr = trace(seed(substitute(model, data=given), rng_seed=0)).get_trace()
    assert tr["a"].value.shape == tr["b"].value.shape == (4,)


def test_subsample_cuts_data_to_the_rows_of_the_enclosing_plates():
    x = torch.arange(30.0).reshape(10, 3)
    rows = torch.tensor([4, 0])
    with pt.plate("rows", 10, subsample=rows):
        torch.testing.assert_close(pt.subsample(x, event_dim=1), x[rows])
        with pytest.raises(ValueError, match=r"subsample\(data, \.\.\.\): shape \(7,\) "):
            pt.subsample(torch.zeros(7), event_dim=0)
    with pt.plate("rows", 10, subsample=rows, dim=-2):
        with pt.plate("cols", 3, subsample=torch.tensor([2]), dim=-1):
            torch.testing.assert_close(pt.subsample(x, event_dim=0), x[rows][:, [2]])
    assert pt.subsample(x, event_dim=1) is x  # outside plates


def test_the_store_answers_pyros_param_store_methods():
    store = pt.ParamStore()
    scale = store.get_param("q.scale", torch.tensor([1.0, 2.0]), constraints.positive)
    store.get_param("q.loc", torch.zeros(2))
    store.get_param("other", torch.ones(()))
    torch.testing.assert_close(scale, torch.tensor([1.0, 2.0]))
    assert store.get_param("q.scale") is not None  # an existing param needs no init
    assert store.get_all_param_names() == ["q.scale", "q.loc", "other"]
    assert sorted(store.match("q\\.")) == ["q.loc", "q.scale"]
    torch.testing.assert_close(store.match("q.s")["q.scale"], scale)
    names = dict(store.named_parameters())
    torch.testing.assert_close(names["q.scale"], torch.tensor([1.0, 2.0]).log())
    assert names["q.scale"].requires_grad
    assert len(store.values()) == 3


def test_a_plate_given_indices_refuses_other_indices_from_a_replayed_trace():
    """The model takes its minibatch from its arguments; a guide that draws its own
    subsample would give its local sites other rows than the model's data (in Pyro the
    replayed indices silently override the model's): refused, naming the plate and both
    index tensors. The same indices are accepted; a model plate without indices still
    takes the guide's."""
    idx = torch.tensor([5, 2, 7])

    def model(idx=None):
        with pt.plate("data", 8, subsample=idx):
            return pt.sample("z", dist.Normal(0.0, 1.0))

    def own(k):  # the guide draws its own subsample
        with pt.plate("data", 8, subsample_size=k):
            pt.sample("z", dist.Normal(0.0, 1.0))

    for k in (3, 2):
        guide_tr = trace(seed(own, rng_seed=0)).get_trace(k)
        drawn = guide_tr["data"].value
        assert not torch.equal(drawn, idx)
        with pytest.raises(
            ValueError,
            match=rf"plate 'data': the model gives it subsample indices of shape \(3,\) "
            rf"\(\[5, 2, 7\]\), but .* gives indices of shape \({k},\) .*"
            rf"subsample=idx\) in the guide",
        ):
            trace(replay(model, trace=guide_tr)).get_trace(idx)
        model_tr = trace(replay(model, trace=guide_tr)).get_trace()  # as Pyro (z replayed)
        assert torch.equal(model_tr["data"].value, drawn) and model_tr["z"].value.shape == (k,)
    same = trace(substitute(model, data={"data": idx.clone(), "z": torch.zeros(3)})).get_trace(idx)
    assert same["z"].value.shape == (3,)


def test_given_indices_select_rows_unless_they_are_every_row_in_order():
    assert pt.plate("p", 3, subsample=torch.tensor([2, 0, 1])).selects_rows
    assert pt.plate("p", 3, subsample=torch.tensor([1])).selects_rows
    assert not pt.plate("p", 3, subsample=torch.arange(3)).selects_rows


# -- plate(..., subsample=) as a list, tuple or numpy array, as Pyro takes it -----------
_AS_GIVEN = {
    "list": list,
    "tuple": tuple,
    "numpy_int64": lambda rows: np.array(rows, dtype=np.int64),
    "numpy_int32": lambda rows: np.array(rows, dtype=np.int32),
}


def _rows_model(idx):
    with pt.plate("rows", 10, subsample=idx) as rows:
        z = pt.sample("z", dist.Normal(0.0, 1.0))
        pt.sample("y", dist.Normal(z, 1.0), obs=pt.subsample(torch.arange(10.0), event_dim=0))
        return rows


@pytest.mark.parametrize("kind", list(_AS_GIVEN))
def test_a_plates_indices_given_as_a_list_or_numpy_array_act_as_a_tensors(kind):
    """Pyro converts them with ``torch.as_tensor``; here they become the ``torch.long``
    tensor the plate returns, and every use of the indices matches the tensor's."""
    as_given, rows = _AS_GIVEN[kind], [4, 0, 7]
    x = torch.arange(30.0).reshape(10, 3)
    given = pt.plate("rows", 10, subsample=as_given(rows))
    with given as idx:
        assert idx.dtype == torch.long and torch.equal(idx, torch.tensor(rows))
        torch.testing.assert_close(pt.subsample(x, event_dim=1), x[rows])
    assert given.selects_rows and given.subsample_size == 3
    assert pt.handlers.equal_indices(given.indices, torch.tensor(rows))
    by_tensor = trace(seed(_rows_model, 0)).get_trace(torch.tensor(rows))
    by_given = trace(seed(_rows_model, 0)).get_trace(as_given(rows))
    assert torch.equal(by_given["rows"].value, by_tensor["rows"].value)
    assert by_given["rows"].extra["indices_given"]
    for name in ("z", "y"):
        assert by_given[name].scale == by_tensor[name].scale == pytest.approx(10 / 3)
        assert by_given[name].cond_indep_stack == by_tensor[name].cond_indep_stack
        assert by_given[name].extra["subsample_given"] == ("rows",)
        torch.testing.assert_close(by_given[name].value, by_tensor[name].value)
    torch.testing.assert_close(by_given.log_prob_sum(), by_tensor.log_prob_sum())
    # the given-indices checks compare them as tensors: a guide's tensor indices replayed
    # into a model given the same rows as a list are accepted, other rows refused
    replayed = trace(replay(_rows_model, trace=by_tensor)).get_trace(as_given(rows))
    torch.testing.assert_close(replayed["z"].value, by_tensor["z"].value)
    with pytest.raises(ValueError, match=r"plate 'rows': the model gives it subsample indices "
                       r"of shape \(3,\) \(\[4, 0, 8\]\), but .* \(\[4, 0, 7\]\)"):  # fmt: skip
        trace(replay(_rows_model, trace=by_tensor)).get_trace(as_given([4, 0, 8]))
    assert list(pt.plate("s", 3, subsample=as_given([2, 0, 1]))) == [2, 0, 1]  # iterated
    assert not pt.plate("p", 3, subsample=as_given([0, 1, 2])).selects_rows


def test_indices_given_as_a_list_or_numpy_array_are_refused_as_a_tensors_are():
    must = r"plate 'n': subsample must be a 1-d tensor of integer indices \(not a boolean mask"
    refused = [
        ([0.5, 1.0], must + r".*got list converted to a tensor of shape \(2,\) and dtype "
         r"torch.float32"),
        (np.array([1.0, 2.0]), must + r".*got ndarray converted .* dtype torch.float64"),
        ([True, False], must + r".*got list converted .* dtype torch.bool"),
        (torch.tensor([1, 0], dtype=torch.uint8), must + r".*got a tensor .* dtype torch.uint8"),
        (np.array([True, False]), must + r".*dtype torch.bool"),
        ([[1, 2]], must + r".*got list converted to a tensor of shape \(1, 2\)"),
        ([1, "a"], must + r".*got list$"),
        ([], r"plate 'n': subsample has no indices"),
        (np.array([], dtype=np.int64), r"plate 'n': subsample has no indices"),
        ([0, 40], r"plate 'n': subsample indices must lie in \[0, size=40\), got \[0, 40\]"),
        (np.array([-1, 2]), r"plate 'n': subsample indices must lie in \[0, size=40\)"),
    ]  # fmt: skip
    for indices, message in refused:
        with pytest.raises(ValueError, match=message):
            pt.plate("n", 40, subsample=indices)
    with pytest.raises(ValueError, match="plate 'n': subsample_size=3 but subsample has 2"):
        pt.plate("n", 40, subsample_size=3, subsample=[0, 1])


@pytest.mark.parametrize("compile", [False, True])
def test_svi_with_an_autoguide_takes_a_list_subsample_as_the_tensor(compile):
    """A model and an AutoNormal (``create_plates``) given the minibatch as a list or a
    numpy array: the same losses and params as given the tensor."""
    from probtorch.inference import SVI, Trace_ELBO
    from probtorch.inference.autoguide import AutoNormal

    y = torch.arange(8.0)

    def model(y, idx):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("data", 8, subsample=idx) as rows:
            z = pt.sample("z", dist.Normal(mu, 10.0))
            pt.sample("y", dist.Normal(z, 0.1), obs=y[rows])

    batches = [[5, 2, 7], [0, 6, 1]]
    runs = {}
    kinds = {"tensor": torch.tensor, "list": list, "numpy": np.array}
    for kind, as_given in kinds.items():
        guide = AutoNormal(model, create_plates=lambda y, idx: pt.plate("data", 8, subsample=idx))
        svi = SVI(model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=compile, seed=0)
        losses = [svi.step(y, as_given(batch)) for batch in batches]
        runs[kind] = losses, svi.get_params()
    for kind in set(kinds) - {"tensor"}:
        assert runs[kind][0] == pytest.approx(runs["tensor"][0], rel=1e-12)
        torch.testing.assert_close(runs[kind][1], runs["tensor"][1], rtol=0, atol=0)


def test_a_plate_inside_another_plate_of_the_same_name_is_refused():
    """Two plate objects of one name, one inside the other: one name for two batch dims
    (Pyro refuses it as a duplicate plate); one after the other they are fine."""
    refused = r"plate 'data' is entered while a plate named 'data' \(size 5, dim -1\) is active"
    with pytest.raises(ValueError, match=refused + r" \(another plate;.*another name.*duplicate"):
        with pt.plate("data", 5):
            with pt.plate("data", 5):
                pass
    assert get_stack() == []
    with pt.plate("data", 5):
        pass
    with pt.plate("data", 5) as rows:
        assert rows.shape == (5,)
