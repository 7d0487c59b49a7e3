"""Predictive: prior and posterior predictive draws, batched and looped."""

import math

import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference.autoguide import AutoMultivariateNormal, AutoNormal
from probtorch.inference.predictive import Predictive

PRIOR_LOC, PRIOR_SD, NOISE = 1.0, 2.0, 0.5


def model(n, y=None):
    mu = pt.sample("mu", dist.Normal(PRIOR_LOC, PRIOR_SD))
    pt.deterministic("twice", 2 * mu)
    with pt.plate("data", n):
        pt.sample("y", dist.Normal(mu, NOISE), obs=y)


def hierarchical(n_obs, n_groups, y=None):
    """Two plates with automatic dims, and a vector (event) site."""
    mu = pt.sample("mu", dist.Normal(0.0, 1.0))
    w = pt.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    with pt.plate("groups", n_groups):
        theta = pt.sample("theta", dist.Normal(mu, 1.0))
        with pt.plate("obs", n_obs):
            pt.sample("y", dist.Normal(theta + w.sum(-1), NOISE), obs=y)
    with pt.plate("groups", n_groups):
        pt.sample("v", dist.MultivariateNormal(w + mu.unsqueeze(-1), torch.eye(2)))


def regression(X, y=None):
    beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pt.plate("n", X.shape[0]):
        pt.sample("y", dist.Normal(X @ beta, 1.0), obs=y)  # X @ beta: not batchable


def _z(sample_mean, mean, sd, n):
    return (sample_mean - mean) / (sd / math.sqrt(n))


@pytest.mark.parametrize("parallel", [True, False])
def test_prior_predictive_moments(parallel):
    num = 4000 if parallel else 1000
    out = Predictive(model, num_samples=num, parallel=parallel)(3, seed=0)
    assert set(out) == {"mu", "twice", "y"}
    assert out["mu"].shape == (num,) and out["y"].shape == (num, 3)
    torch.testing.assert_close(out["twice"], 2 * out["mu"])
    var = PRIOR_SD**2 + NOISE**2
    y = out["y"].double()
    assert (_z(y.mean(0), PRIOR_LOC, math.sqrt(var), num).abs() < 4).all()
    # sample variance: sd of the estimate is var * sqrt(2 / num)
    assert ((y.var(0) - var).abs() < 4 * var * math.sqrt(2 / num)).all()
    cov = torch.cov(y.T)[0, 1]
    assert abs(cov - PRIOR_SD**2) < 4 * var * math.sqrt(2 / num)


def test_observations_are_resampled():
    samples = {"mu": torch.full((50,), -3.0)}
    y_obs = torch.full((4,), 100.0)
    out = Predictive(model, posterior_samples=samples)(4, y=y_obs, seed=0)
    assert out["y"].shape == (50, 4)
    assert ((out["y"] + 3.0).abs() < 5 * NOISE).all()


@pytest.mark.parametrize("parallel", [True, False])
def test_values_fixed_by_condition_are_kept(parallel):
    """As in Pyro and NumPyro: a latent fixed with pt.handlers.condition keeps its value in
    the prior and posterior predictive (it was drawn from its prior), while the model's own
    observations are still drawn."""
    fixed = pt.handlers.condition(model, data={"mu": torch.tensor(3.0)})
    out = Predictive(fixed, num_samples=2000, parallel=parallel)(5, seed=0)
    assert torch.equal(out["mu"], torch.full((2000,), 3.0))
    assert out["y"].mean().item() == pytest.approx(3.0, abs=4 * NOISE / math.sqrt(2000 * 5))
    assert out["y"].std().item() == pytest.approx(NOISE, rel=0.05)
    y = torch.full((5,), 100.0)
    out = Predictive(fixed, num_samples=50, parallel=parallel)(5, y, seed=0)
    assert (out["y"] - 3.0).abs().max() < 6 * NOISE  # y drawn, not the data


@pytest.mark.parametrize("parallel", [None, False])
def test_the_models_return_value_is_returned_as_pyros_RETURN(parallel):
    x = torch.tensor([1.0, 2.0, -1.0])

    def line(x, y=None):
        slope = pt.sample("slope", dist.Normal(0.0, 1.0))
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(slope * x, NOISE), obs=y)
        return slope * x

    slopes = torch.tensor([0.5, -2.0, 3.0])
    predictive = Predictive(line, {"slope": slopes}, return_sites=["_RETURN", "y"],
                            parallel=parallel)  # fmt: skip
    out = predictive(x, seed=0)
    torch.testing.assert_close(out["_RETURN"], slopes[:, None] * x)
    assert out["y"].shape == (3, 3)
    with pytest.raises(TypeError, match=r"'_RETURN'.*returned a NoneType"):
        Predictive(model, {"mu": slopes}, return_sites=["_RETURN"], parallel=parallel)(3)


def test_obs_broadcast_without_plate_keeps_data_shape():
    def m(y=None):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        pt.sample("y", dist.Normal(mu, 1.0), obs=y)  # y of shape (5,), no plate

    out = Predictive(m, num_samples=7)(y=torch.zeros(5), seed=0)
    assert out["y"].shape == (7, 5)


@pytest.mark.parametrize("parallel", [True, False])
def test_posterior_predictive_from_samples(parallel):
    # Deterministic construction: y - mu is N(0, NOISE) for every sample; the deterministic
    # site equals its formula on the given draws exactly.
    g = torch.Generator().manual_seed(0)
    mu = 3 * torch.randn(2000, generator=g)
    out = Predictive(model, posterior_samples={"mu": mu}, parallel=parallel)(6, seed=1)
    assert set(out) == {"twice", "y"}
    torch.testing.assert_close(out["twice"], 2 * mu)
    resid = ((out["y"] - mu[:, None]) / NOISE).double()
    assert abs(float(resid.mean())) < 4 / math.sqrt(resid.numel())
    assert abs(float(resid.std()) - 1) < 0.05
    # the draws of one sample are independent of the others: correlation with mu ~ 0
    corr = torch.corrcoef(torch.stack([resid[:, 0], mu.double()]))[0, 1]
    assert abs(float(corr)) < 4 / math.sqrt(2000)


def test_parallel_and_loop_agree_on_nested_plates():
    g = torch.Generator().manual_seed(2)
    S, n_obs, n_groups = 3000, 4, 3
    samples = {
        "mu": torch.randn(S, generator=g),
        "w": torch.randn(S, 2, generator=g),
        "theta": torch.randn(S, n_groups, generator=g),
    }
    outs = [
        Predictive(hierarchical, posterior_samples=samples, parallel=p)(n_obs, n_groups, seed=3)
        for p in (True, False)
    ]
    for out in outs:
        assert set(out) == {"y", "v"}
        assert out["y"].shape == (S, n_obs, n_groups)
        assert out["v"].shape == (S, n_groups, 2)
        # residuals given the substituted latents are exactly distributed as the noise
        mean_y = samples["theta"][:, None, :] + samples["w"].sum(-1)[:, None, None]
        r = ((out["y"] - mean_y) / NOISE).double()
        assert abs(float(r.mean())) < 4 / math.sqrt(r.numel())
        assert abs(float(r.std()) - 1) < 0.03
        rv = (out["v"] - samples["w"][:, None, :] - samples["mu"][:, None, None]).double()
        assert abs(float(rv.std()) - 1) < 0.03
        assert abs(float(torch.corrcoef(rv.reshape(-1, 2).T)[0, 1])) < 0.05


def test_parallel_equals_loop_for_deterministic_model():
    # With the noise at (almost) zero, batched and looped runs give the same values.
    def m(x):
        a = pt.sample("a", dist.Normal(0.0, 1.0))
        with pt.plate("n", len(x)):
            pt.sample("y", dist.Normal(a * x, 1e-6))
        return a

    samples = {"a": torch.linspace(-2, 2, 9)}
    x = torch.arange(4.0)
    batched = Predictive(m, posterior_samples=samples)(x, seed=0)
    looped = Predictive(m, posterior_samples=samples, parallel=False)(x, seed=0)
    torch.testing.assert_close(batched["y"], looped["y"], atol=1e-4, rtol=0)
    torch.testing.assert_close(batched["y"], samples["a"][:, None] * x, atol=1e-4, rtol=0)


def test_seed_reproducible_and_global_rng_untouched():
    p = Predictive(model, num_samples=20)
    state = torch.random.get_rng_state()
    a, b = p(3, seed=5), p(3, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(a["y"], b["y"])
    assert not torch.equal(a["y"], p(3, seed=6)["y"])
    torch.manual_seed(0)
    c = p(3)
    torch.manual_seed(0)
    assert torch.equal(c["y"], p(3)["y"])  # without seed=: torch's global generator


def test_return_sites():
    samples = {"mu": torch.zeros(5)}
    out = Predictive(model, posterior_samples=samples, return_sites=["mu", "y"])(2, seed=0)
    assert set(out) == {"mu", "y"}
    assert torch.equal(out["mu"], samples["mu"])  # latent sites return the given draws
    out = Predictive(model, num_samples=5, return_sites=["twice"])(2, seed=0)
    assert set(out) == {"twice"}
    with pytest.raises(ValueError, match=r"return_sites \['nope'\] are not sample or"):
        Predictive(model, num_samples=5, return_sites=["nope"])(2)


def test_guide_predictive_shapes():
    y = torch.randn(6, 3)
    guide = AutoNormal(hierarchical)
    store = pt.ParamStore()
    with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        guide(6, 3, y=y)
    params = dict(store.items())
    for parallel in (True, False):
        pred = Predictive(
            hierarchical, guide=guide, params=params, num_samples=40, parallel=parallel
        )
        out = pred(6, 3, seed=0)
        assert set(out) == {"y"}  # all latent sites come from the guide
        assert out["y"].shape == (40, 6, 3)
        out = Predictive(
            hierarchical, guide=guide, params=params, num_samples=40, return_sites=["theta", "v"]
        )(6, 3, seed=0)
        assert out["theta"].shape == (40, 3) and out["v"].shape == (40, 3, 2)
    # the guide's draws: theta is close to the guide's location (scale 0.1)
    loc = params["auto.loc.theta"]
    assert ((out["theta"].mean(0) - loc).abs() < 0.1).all()


def test_guide_predictive_unfitted_guide_is_set_up():
    guide = AutoMultivariateNormal(model)
    with pytest.raises(KeyError, match="fit the guide first"):
        Predictive(model, guide=guide, num_samples=3)(2)
    assert guide.prototype_trace is not None  # Predictive traced the model for the guide


def test_custom_guide_predictive():
    def guide(n, y=None):
        loc = pt.param("loc", torch.tensor(10.0))
        pt.sample("mu", dist.Normal(loc, 0.01))

    params = {"loc": torch.tensor(-4.0)}
    for parallel in (True, False):
        pred = Predictive(model, guide=guide, params=params, num_samples=30, parallel=parallel)
        out = pred(5, seed=0)
        assert out["y"].shape == (30, 5)
        torch.testing.assert_close(out["twice"], torch.full((30,), -8.0), atol=0.2, rtol=0)


def test_errors():
    with pytest.raises(ValueError, match="needs num_samples"):
        Predictive(model)
    with pytest.raises(ValueError, match="needs num_samples"):
        Predictive(model, guide=lambda n: None)
    bad = {"mu": torch.zeros(10), "tau": torch.zeros(8)}
    with pytest.raises(ValueError, match="'mu': 10, 'tau': 8"):
        Predictive(model, posterior_samples=bad)
    with pytest.raises(ValueError, match="not both"):
        Predictive(model, posterior_samples={"mu": torch.zeros(3)}, guide=lambda n: None)
    with pytest.raises(ValueError, match="'mu'.*leading sample"):
        Predictive(model, posterior_samples={"mu": torch.tensor(0.0)})
    with pytest.raises(ValueError, match=r"'mu'.*2 leading sample dimensions.*shape \(3,\)"):
        Predictive(model, posterior_samples={"mu": torch.zeros(3)}, batch_ndims=2)
    with pytest.raises(ValueError, match=r"'mu': \(2, 3\), 'tau': \(3, 3\)"):
        Predictive(
            model,
            posterior_samples={"mu": torch.zeros(2, 3), "tau": torch.zeros(3, 3)},
            batch_ndims=2,
        )
    with pytest.raises(ValueError, match="batch_ndims must be an integer >= 1"):
        Predictive(model, posterior_samples={"mu": torch.zeros(3)}, batch_ndims=0)
    with pytest.raises(ValueError, match="batch_ndims=2 applies to posterior_samples"):
        Predictive(model, num_samples=3, batch_ndims=2)
    with pytest.raises(TypeError, match="parallel must be True, False or None"):
        Predictive(model, num_samples=3, parallel="yes")


def test_draws_grouped_by_chain_without_batch_ndims_are_named():
    """(chains, draws) samples read as chains draws of shape (draws,): the model failed
    with a bare broadcasting error (or, where the sizes happened to broadcast, ran)."""
    grouped = {"mu": torch.zeros(3, 30)}
    said = r"\['mu'\]: each of the 3 draws has shape \(30,\), but site 'mu' \(Normal\) has "
    with pytest.raises(ValueError, match=said + r"shape \(\).*batch_ndims=2"):
        Predictive(model, grouped)(30)  # 30 data points: would have broadcast
    with pytest.raises(ValueError, match=r"'w'.*shape \(3,\), but site 'w' .*has shape \(2,\)"):
        Predictive(hierarchical, {"w": torch.zeros(5, 3)})(4, 2)
    out = Predictive(model, grouped, batch_ndims=2)(4, seed=0)
    assert out["y"].shape == (3, 30, 4)

    def drawn_with_sample_shape(y=None):  # the site's shape includes its sample_shape
        w = pt.sample("w", dist.Normal(0.0, 1.0), sample_shape=(3,))
        pt.sample("y", dist.Normal(w.sum(), 1.0), obs=y)

    assert Predictive(drawn_with_sample_shape, {"w": torch.zeros(10, 3)})()["y"].shape == (10,)


def test_num_samples_other_than_the_draws_warns_and_uses_the_draws():
    """As in Pyro and NumPyro: the draws decide, with a warning."""
    with pytest.warns(UserWarning, match="num_samples=5 but posterior_samples hold 3 draws"):
        pred = Predictive(model, posterior_samples={"mu": torch.zeros(3)}, num_samples=5)
    assert pred(2, seed=0)["y"].shape == (3, 2)


def test_unbatchable_model_error_and_loop_fallback():
    X = torch.randn(5, 3)
    samples = {"beta": torch.randn(4, 3)}
    with pytest.raises(RuntimeError, match="parallel=False"):
        Predictive(regression, posterior_samples=samples, parallel=True)(X, seed=0)
    out = Predictive(regression, posterior_samples=samples, parallel=False)(X, seed=0)
    assert out["y"].shape == (4, 5)


def test_batched_runs_that_compute_something_else_are_caught():
    """A reduction without a dim runs over the samples too, and a stack of scalars puts the
    sample dim second: both run batched without an error. The check against single-sample
    runs catches them: parallel=True raises, the default loops and gets it right."""

    def model(y=None):
        with pt.plate("groups", 4):
            theta = pt.sample("theta", dist.Normal(0.0, 1.0))
        b = pt.sample("b", dist.Normal(0.0, 1.0))
        pt.deterministic("coefs", torch.stack([b, 2 * b]))
        pt.deterministic("total", theta.sum())
        centered = theta - theta.mean()
        with pt.plate("groups", 4):
            pt.sample("y", dist.Normal(centered, 1e-6), obs=y)

    theta, b = torch.randn(6, 4), torch.randn(6)
    samples = {"theta": theta, "b": b}
    with pytest.raises(RuntimeError, match="differs from the model's"):
        Predictive(model, posterior_samples=samples, parallel=True)(seed=0)
    out = Predictive(model, posterior_samples=samples)(seed=0)
    torch.testing.assert_close(out["coefs"], torch.stack([b, 2 * b], dim=-1))
    torch.testing.assert_close(out["total"], theta.sum(-1))
    centered = theta - theta.mean(-1, keepdim=True)
    torch.testing.assert_close(out["y"], centered, atol=1e-4, rtol=0)

    def guide(y=None):  # a custom guide with the same mistake
        with pt.plate("groups", 4):
            z = pt.sample("theta", dist.Normal(0.0, 1.0))
        pt.sample("b", dist.Normal(z.sum(), 1e-6))

    draws = Predictive(model, guide=guide, num_samples=5, return_sites=["theta", "b"])(seed=0)
    torch.testing.assert_close(draws["b"], draws["theta"].sum(-1), atol=1e-4, rtol=0)


def test_matrix_times_vector_latent_runs_by_default():
    """`X @ w` does not batch (X is (N, D), w gets (S, D)): the default loops instead of failing."""

    def model(X, y=None):
        w = pt.sample("w", dist.Normal(torch.zeros(X.shape[1]), 1.0).to_event(1))
        b = pt.sample("b", dist.Normal(0.0, 1.0))
        with pt.plate("data", X.shape[0]):
            pt.deterministic("mean", X @ w + b)
            pt.sample("y", dist.Normal(X @ w + b, 1e-6), obs=y)

    X = torch.randn(20, 3)
    samples = {"w": torch.randn(7, 3), "b": torch.randn(7)}
    with pytest.raises(RuntimeError, match="parallel=True"):
        Predictive(model, posterior_samples=samples, parallel=True)(X, seed=0)
    out = Predictive(model, posterior_samples=samples)(X, seed=0)
    expected = samples["w"] @ X.T + samples["b"][:, None]
    torch.testing.assert_close(out["mean"], expected)
    torch.testing.assert_close(out["y"], expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("parallel", [None, False])
def test_draws_grouped_by_chain_keep_their_chain_dim(parallel):
    """batch_ndims=2 takes (chains, draws, ...) samples, as NumPyro's Predictive does."""
    mu = torch.arange(6.0).reshape(2, 3)
    pred = Predictive(model, posterior_samples={"mu": mu}, batch_ndims=2, parallel=parallel)
    out = pred(4, seed=0)
    assert out["y"].shape == (2, 3, 4) and out["twice"].shape == (2, 3)
    torch.testing.assert_close(out["twice"], 2 * mu)
    flat = Predictive(model, posterior_samples={"mu": mu.reshape(6)}, parallel=parallel)(4, seed=0)
    torch.testing.assert_close(out["y"].reshape(6, 4), flat["y"])


def test_posterior_predictive_from_mcmc():
    from probtorch.inference import MCMC, NUTS

    y = torch.tensor([1.0, 1.2, 0.8])
    mcmc = MCMC(
        NUTS(model, compile=False),
        num_warmup=200,
        num_samples=250,
        num_chains=2,
        progress_bar=False,
        seed=0,
    )
    mcmc.run(3, y=y)
    samples = mcmc.get_samples()
    out = Predictive(model, posterior_samples=samples)(3, seed=0)
    assert set(out) == {"twice", "y"} and out["y"].shape == (500, 3)
    torch.testing.assert_close(out["twice"], 2 * samples["mu"])
    # exact posterior predictive: N(m, 1/prec + NOISE^2) with prec = 1/PRIOR_SD^2 + n/NOISE^2
    prec = 1 / PRIOR_SD**2 + 3 / NOISE**2
    m = (PRIOR_LOC / PRIOR_SD**2 + float(y.sum()) / NOISE**2) / prec
    sd = math.sqrt(1 / prec + NOISE**2)
    assert abs(float(out["y"].mean()) - m) < 0.15
    assert abs(float(out["y"].std()) / sd - 1) < 0.15


def test_vector_latent_times_matrix_batches_with_pyro_layout():
    """`w @ X.T` with an event-shaped latent w works batched (Pyro's layout, tried second)."""

    def model(X, y=None):
        w = pt.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
        with pt.plate("data", X.shape[0]):
            pt.sample("y", dist.Normal(w @ X.T, 1e-6), obs=y)

    X = torch.randn(50, 4)
    samples = {"w": torch.randn(7, 4)}
    batched = Predictive(model, posterior_samples=samples, parallel=True)(X, seed=0)
    looped = Predictive(model, posterior_samples=samples, parallel=False)(X, seed=0)
    assert batched["y"].shape == (7, 50)
    torch.testing.assert_close(batched["y"], samples["w"] @ X.T, atol=1e-4, rtol=0)
    torch.testing.assert_close(looped["y"], batched["y"], atol=1e-4, rtol=0)


# -- log_likelihood (NumPyro's numpyro.infer.util.log_likelihood) ---------------------------
def test_log_likelihood_of_posterior_draws_by_hand_and_as_mcmc_exports_it():
    from probtorch.inference import MCMC, NUTS, log_likelihood

    y = torch.tensor([0.3, 1.2, -0.4, 2.0])
    mcmc = MCMC(NUTS(model, compile=False), num_warmup=20, num_samples=15, num_chains=2,
                seed=0, progress_bar=False)  # fmt: skip
    mcmc.run(4, y)
    draws = mcmc.get_samples(group_by_chain=True)  # "twice", deterministic, is ignored
    ll = log_likelihood(model, draws, 4, y, batch_ndims=2)
    assert set(ll) == {"y"} and ll["y"].shape == (2, 15, 4)
    by_hand = dist.Normal(draws["mu"][..., None], NOISE).log_prob(y)
    torch.testing.assert_close(ll["y"], by_hand)
    exported = torch.as_tensor(mcmc.to_inference_data().log_likelihood["y"].values)
    torch.testing.assert_close(ll["y"], exported.to(ll["y"].dtype))
    flat = log_likelihood(model, mcmc.get_samples(), 4, y)  # batch_ndims=1: (draws,)
    torch.testing.assert_close(flat["y"], by_hand.reshape(30, 4))


def test_log_likelihood_sums_out_discrete_sites_and_names_bad_draws():
    from probtorch.inference import log_likelihood

    def mixture(y):
        loc = pt.sample("loc", dist.Normal(0.0, 5.0))
        with pt.plate("n", len(y)):
            z = pt.sample("z", dist.Bernoulli(0.3))
            pt.sample("y", dist.Normal(loc * z, 1.0), obs=y)

    y = torch.tensor([0.1, 2.5, 3.0])
    loc = torch.tensor([2.0, -1.0])
    ll = log_likelihood(mixture, {"loc": loc}, y)["y"]
    terms = torch.stack([math.log(0.7) + dist.Normal(0.0, 1.0).log_prob(y).expand(2, 3),
                         math.log(0.3) + dist.Normal(loc[:, None], 1.0).log_prob(y)])  # fmt: skip
    torch.testing.assert_close(ll, torch.logsumexp(terms, 0))
    with pytest.raises(ValueError, match=r"posterior_samples lack the latent sites \['loc'\]"):
        log_likelihood(mixture, {"mu": loc}, y)
    with pytest.raises(ValueError, match=r"posterior_samples\['loc'\] has shape \(2, 3\); with "
                       r"batch_ndims=1 .* needs \(2,\)"):  # fmt: skip
        log_likelihood(mixture, {"loc": torch.zeros(2, 3)}, y)


def _rows_model(y, subsample_size=None, idx=None):
    """z_i is pinned near y_i = 10 i; the plate subsamples by size or by given indices."""
    with pt.plate("data", 8, subsample_size=subsample_size, subsample=idx) as rows:
        pt.deterministic("rows", rows.to(torch.get_default_dtype()))
        z = pt.sample("z", dist.Normal(0.0, 100.0))
        pt.sample("y", dist.Normal(z, 0.01), obs=y[rows])


def _rows_guide(y, subsample_size=None, idx=None):
    with pt.plate("data", 8, subsample_size=subsample_size, subsample=idx) as rows:
        pt.sample("z", dist.Normal(y[rows], 0.01))


def _assert_rows_met(out, size):
    """Each predicted y sits at 10 x the row the model's plate used for it."""
    assert out["y"].shape == (20, size)
    torch.testing.assert_close(out["y"] / 10, out["rows"], atol=0.01, rtol=0)


@pytest.mark.parametrize("parallel", [None, False])
@pytest.mark.parametrize("guide_kind", ["auto", "hand"])
def test_a_guides_draws_take_the_rows_of_the_calls_subsample(guide_kind, parallel):
    y = 10 * torch.arange(8.0)
    if guide_kind == "auto":
        guide = AutoNormal(_rows_model)
        params = {"auto.loc.z": y, "auto.scale.z": torch.full((8,), 0.01)}
    else:
        guide, params = _rows_guide, None
    predictive = Predictive(
        _rows_model, guide=guide, params=params, num_samples=20, parallel=parallel
    )
    if guide_kind == "auto":  # set up on a subsampled call, as SVI on minibatches would be
        predictive(y, subsample_size=3, seed=0)
    _assert_rows_met(predictive(y, seed=1), 8)
    out = predictive(y, subsample_size=3, seed=2)
    _assert_rows_met(out, 3)
    assert (out["rows"] == out["rows"][:1]).all()  # one subsample for every draw
    out = predictive(y, idx=torch.tensor([6, 1]), seed=3)
    _assert_rows_met(out, 2)
    assert (out["rows"] == torch.tensor([6.0, 1.0])).all()
    out = predictive(y, idx=torch.arange(8).flip(0), seed=4)  # all rows, in another order
    _assert_rows_met(out, 8)
    assert (out["rows"] == torch.arange(7.0, -1.0, -1.0)).all()


def test_log_likelihood_counts_factor_sites_as_numpyro_does():
    """``pt.factor("ll", logp)`` in a plate is a likelihood: pointwise in log_likelihood
    (NumPyro's factor is an observed site), with the discrete sites summed out too."""
    from probtorch.inference import log_likelihood

    y = torch.tensor([0.3, -1.2, 2.0])

    def factored(y):
        mu = pt.sample("mu", dist.Normal(0.0, 5.0))
        with pt.plate("n", 3):
            pt.factor("ll", dist.Normal(mu, NOISE).log_prob(y))

    mu = torch.tensor([0.5, -1.0])
    ll = log_likelihood(factored, {"mu": mu}, y)
    assert set(ll) == {"ll"}
    torch.testing.assert_close(ll["ll"], dist.Normal(mu[:, None], NOISE).log_prob(y))

    def mixture(y):
        mu = pt.sample("mu", dist.Normal(0.0, 5.0))
        z = pt.sample("z", dist.Bernoulli(0.3))
        with pt.plate("n", 3):
            pt.factor("ll", dist.Normal(mu + z, 1.0).log_prob(y))

    loc = mu[:, None]
    terms = torch.stack([math.log(0.7) + dist.Normal(loc, 1.0).log_prob(y),
                         math.log(0.3) + dist.Normal(loc + 1, 1.0).log_prob(y)])  # fmt: skip
    ll = log_likelihood(mixture, {"mu": mu}, y)["ll"]
    torch.testing.assert_close(ll, torch.logsumexp(terms, 0))


def test_log_likelihood_carries_no_autograd_history_of_the_models_params():
    """A model's ``pt.param`` (and ``pt.module``'s weights) require grad; the pointwise log
    likelihood is data for ArviZ (``.numpy()``), as ``MCMC.to_inference_data`` exports it."""
    from probtorch.inference import log_likelihood

    y = torch.tensor([0.3, -1.2, 2.0])
    torch.manual_seed(0)
    linear = torch.nn.Linear(1, 1)

    def with_param(y):
        mu = pt.sample("mu", dist.Normal(0.0, 5.0))
        shift = pt.param("shift", torch.tensor(0.5))
        net = pt.module("net", linear)
        with pt.plate("n", 3):
            pt.sample("y", dist.Normal(mu + shift + net(torch.ones(1)), NOISE), obs=y)

    mu = torch.tensor([0.5, -1.0])
    ll = log_likelihood(with_param, {"mu": mu}, y)["y"]
    assert not ll.requires_grad and ll.grad_fn is None
    net_out = (linear.weight + linear.bias).detach().squeeze()
    loc = (mu + 0.5 + net_out)[:, None]
    torch.testing.assert_close(ll, dist.Normal(loc, NOISE).log_prob(y))
    assert ll.numpy().shape == (2, 3)
    fixed = {"shift": torch.tensor(1.5, requires_grad=True)}  # params= substituted
    ll = log_likelihood(with_param, {"mu": mu}, y, params=fixed)["y"]
    assert not ll.requires_grad
    loc = (mu + 1.5 + net_out)[:, None]
    torch.testing.assert_close(ll, dist.Normal(loc, NOISE).log_prob(y))

    def summed_out(y):  # no continuous latent site: one evaluation serves every draw
        weight = pt.param("weight", torch.tensor(0.3), constraint=dist.constraints.unit_interval)
        with pt.plate("n", 3):
            z = pt.sample("z", dist.Bernoulli(weight))
            pt.sample("y", dist.Normal(2.0 * z, 1.0), obs=y)

    ll = log_likelihood(summed_out, {"mu": mu}, y)["y"]
    assert not ll.requires_grad and ll.shape == (2, 3)
    terms = torch.stack([math.log(0.7) + dist.Normal(0.0, 1.0).log_prob(y),
                         math.log(0.3) + dist.Normal(2.0, 1.0).log_prob(y)])  # fmt: skip
    torch.testing.assert_close(ll, torch.logsumexp(terms, 0).expand(2, 3))


def _sigma_model(x, y=None):
    """A model with a param of its own (Pyro's point-estimated noise scale)."""
    sigma = pt.param("sigma", torch.tensor(1.0), constraint=dist.constraints.positive)
    w = pt.sample("w", dist.Normal(0.0, 10.0))
    with pt.plate("n", x.shape[0]):
        pt.sample("y", dist.Normal(w * x, sigma), obs=y)


def _hand_guide(x, y=None):
    loc = pt.param("loc", torch.tensor(0.0))
    scale = pt.param("scale", torch.tensor(1.0), constraint=dist.constraints.positive)
    pt.sample("w", dist.Normal(loc, scale))


def test_predictive_after_svi_steps_reads_what_the_svi_fitted():
    """Pyro's workflow: a loop of ``svi.step``, then ``Predictive(model, guide=guide)``
    with no params. Predictive read the default store, where a hand-written guide's and a
    model's ``pt.param`` were created at their initial values: the predictions silently
    used loc 0 and sigma 1 (fitted: about 2 and 5). It reads the params of the SVI that
    fitted the guide or the model, as ``params=svi.get_params()`` gives them; inside
    ``pt.param_scope(store)`` the caller's store."""
    from probtorch.inference import SVI, Trace_ELBO

    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, generator=g)
    y = 2.0 * x + 5.0 * torch.randn(100, generator=g)
    svi = SVI(_sigma_model, _hand_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    for _ in range(300):
        svi.step(x, y)
    fitted = svi.get_params()
    assert abs(float(fitted["loc"]) - 2.0) < 1.5 and float(fitted["sigma"]) > 3.0

    def predict(**kwargs):
        return Predictive(_sigma_model, num_samples=50, return_sites=["w", "y"], **kwargs)(
            x, seed=1
        )

    by_hand = predict(guide=_hand_guide, params=fitted)
    for name, value in predict(guide=_hand_guide).items():
        assert torch.equal(value, by_hand[name]), name
    draws = {"w": by_hand["w"]}
    given = predict(posterior_samples=draws, params=fitted)["y"]
    assert torch.equal(predict(posterior_samples=draws)["y"], given)  # the model's sigma
    other = pt.ParamStore()
    other.setdefault("loc", torch.tensor(-7.0))
    with pt.param_scope(other):
        assert abs(float(predict(guide=_hand_guide)["w"].mean()) + 7.0) < 1.0
    assert "loc" in other and "loc" not in pt.get_param_store()


def _param_model(y):
    sigma = pt.param(
        "sigma", torch.tensor(1.0), constraint=torch.distributions.constraints.positive
    )
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Normal(mu, sigma), obs=y)


def test_log_likelihood_and_laplace_after_svi_steps_read_what_the_svi_fitted():
    """As Predictive: without params, ``log_likelihood`` and ``laplace_approximation`` read
    the model's params (and the guide's) of the SVI that fitted them. They read the
    default store, where the model's sigma sat at its initial 1.0 (fitted: 0.52): the
    log likelihood and the Laplace variance (3.7 times the right one) were silently wrong."""
    from probtorch.inference import SVI, Trace_ELBO, log_likelihood
    from probtorch.inference.autoguide import AutoLaplaceApproximation

    g = torch.Generator().manual_seed(0)
    y = 0.5 * torch.randn(20, generator=g) + 3.0
    guide = AutoLaplaceApproximation(_param_model)
    svi = SVI(_param_model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    for _ in range(300):
        svi.step(y)
    fitted = svi.get_params()
    sigma = float(fitted["sigma"])
    assert 0.4 < sigma < 0.7
    draws = {"mu": fitted["auto.loc"].expand(3)}
    given = log_likelihood(_param_model, draws, y, params=fitted)["y"]
    assert torch.equal(log_likelihood(_param_model, draws, y)["y"], given)
    expected = torch.distributions.Normal(fitted["auto.loc"], sigma).log_prob(y)
    torch.testing.assert_close(given[0], expected)
    variance = float(guide.laplace_approximation(y).get_posterior().covariance_matrix)
    exact = 1 / (len(y) / sigma**2 + 1 / 100)  # the posterior of mu at the fitted sigma
    assert math.isclose(variance, exact, rel_tol=1e-4)
    assert "sigma" not in pt.get_param_store()


def test_a_numpyro_rng_key_as_the_first_argument_of_a_call_is_explained():
    """NumPyro's ``Predictive(model, samples)(rng_key, *args)``: the key became the model's
    first argument and the model's bare TypeError followed; ``MCMC.run`` explained it."""

    def one_arg(n):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("data", n):
            pt.sample("y", dist.Normal(mu, 1.0))

    predictive = Predictive(one_arg, {"mu": torch.zeros(4)})
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given \(the "
                       r"first argument, 0, looks like NumPyro's rng key: probtorch's "
                       r"Predictive\(\.\.\.\)\(\*args, \*\*kwargs\) takes the model's "
                       r"arguments only, and the seed goes to its seed= argument\)"):  # fmt: skip
        predictive(0, 3)
    with pytest.raises(TypeError, match="positional argument") as caught:
        predictive(3.0, 3)  # no key-like first argument: the model's own error
    assert "rng key" not in str(caught.value)
    assert predictive(3, seed=0)["y"].shape == (4, 3)
