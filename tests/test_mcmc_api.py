"""The MCMC driver and the kernel API: shapes, statistics, export, reproducibility, restarts,
interrupts, argument checks, Stan's warmup schedule and dual averaging."""

import math
import warnings

import arviz as az
import numpy as np
import pytest
import torch
from scipy import integrate, stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import HMC, MCMC, NUTS
from probtorch.inference.mcmc.adaptation import warmup_windows

STATS = (
    "diverging", "energy", "tree_depth", "num_steps", "accept_prob", "step_size",
    "potential_energy",
)  # fmt: skip
ARVIZ_STATS = {"diverging", "energy", "tree_depth", "n_steps", "step_size", "lp", "acceptance_rate"}


pytestmark = pytest.mark.usefixtures("float64")


def vector_model(y):
    """A vector site, a positive scalar site and two deterministic sites."""
    loc = pt.sample("loc", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    scale = pt.sample("scale", dist.HalfNormal(1.0))
    pt.deterministic("loc_sum", loc.sum(-1))
    pt.deterministic("scaled", loc * scale)
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(loc, scale).to_event(1), obs=y)


def normal_model(y):
    """Normal observations with unknown mean and sd (for the scipy log likelihood)."""
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    sigma = pt.sample("sigma", dist.HalfNormal(2.0))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(mu, sigma), obs=y)


NOISE = 0.5


def known_noise_model(y):
    """Conjugate: the exact posterior of mu is normal."""
    mu = pt.sample("mu", dist.Normal(0.0, 2.0))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(mu, NOISE), obs=y)


def _data(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return 1.0 + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)


def _vector_data(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([0.5, -0.5, 1.0]) + 0.8 * torch.randn(n, 3, generator=g)


def _mcmc(model=vector_model, kernel=NUTS, num_warmup=60, num_samples=40, num_chains=2, **kw):
    mcmc_kw = {k: kw.pop(k) for k in ("thinning", "chain_method", "seed") if k in kw}
    mcmc_kw.setdefault("seed", 0)
    return MCMC(
        kernel(model, compile=False, **kw),
        num_warmup=num_warmup,
        num_samples=num_samples,
        num_chains=num_chains,
        progress_bar=False,
        **mcmc_kw,
    )


@pytest.fixture(scope="module")
def vector_run():
    """One run of ``vector_model`` with every extra field (shared by the read-only tests)."""
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    try:
        y = _vector_data()
        mcmc = _mcmc(num_chains=3, num_samples=50)
        mcmc.run(y, extra_fields=STATS)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
    return mcmc, y


# -- results ----------------------------------------------------------------------------------
def test_get_samples_shapes(vector_run):
    mcmc, _ = vector_run
    flat = mcmc.get_samples()
    grouped = mcmc.get_samples(group_by_chain=True)
    shapes = {"loc": (3,), "scale": (), "loc_sum": (), "scaled": (3,)}
    assert set(flat) == set(grouped) == set(shapes)
    for name, event in shapes.items():
        assert grouped[name].shape == (3, 50) + event
        assert flat[name].shape == (150,) + event
        assert flat[name].dtype == torch.float64
        torch.testing.assert_close(flat[name], grouped[name].reshape((150,) + event))
    assert (flat["scale"] > 0).all()
    # chains really are different chains
    assert not torch.equal(grouped["loc"][0], grouped["loc"][1])


def test_deterministic_sites_recorded(vector_run):
    samples = vector_run[0].get_samples()
    torch.testing.assert_close(samples["loc_sum"], samples["loc"].sum(-1), rtol=0, atol=1e-12)
    expected = samples["loc"] * samples["scale"].unsqueeze(-1)
    torch.testing.assert_close(samples["scaled"], expected, rtol=0, atol=1e-12)


def test_extra_fields(vector_run):
    mcmc, y = vector_run
    fields = mcmc.get_extra_fields()
    grouped = mcmc.get_extra_fields(group_by_chain=True)
    assert set(fields) == set(grouped) == set(STATS)
    for name in STATS:
        assert grouped[name].shape == (3, 50), name
        assert fields[name].shape == (150,), name
    assert fields["diverging"].dtype == torch.bool
    depth, steps = grouped["tree_depth"], grouped["num_steps"]
    assert not depth.is_floating_point() and not steps.is_floating_point()
    # a tree of depth d holds 2**d - 1 leapfrog steps; the subtree that failed adds at most 2**d
    assert ((depth >= 0) & (depth <= mcmc.kernel.max_tree_depth)).all()
    assert ((steps >= 2**depth - 1) & (steps <= 2 ** (depth + 1) - 1) & (steps >= 1)).all()
    accept = fields["accept_prob"]
    assert ((accept >= 0) & (accept <= 1)).all()
    # the adapted step size is fixed during sampling: one value per chain
    step = grouped["step_size"]
    torch.testing.assert_close(step, mcmc.last_state.step_size.unsqueeze(1).expand(3, 50))
    # potential energy at the draws, recomputed from the constrained samples
    potential = mcmc.kernel.potential
    samples = mcmc.get_samples()
    z = potential.pack({"loc": samples["loc"], "scale": samples["scale"]})
    torch.testing.assert_close(fields["potential_energy"], potential(z), rtol=1e-10, atol=1e-10)
    # energy = potential + kinetic, and kinetic energy is positive
    assert (fields["energy"] > fields["potential_energy"]).all()


def test_extra_fields_default_is_diverging_only():
    mcmc = _mcmc(num_warmup=20, num_samples=10)
    mcmc.run(_vector_data())
    assert set(mcmc.get_extra_fields()) == {"diverging"}


def test_thinning_keeps_every_nth_draw_counted_back_from_the_last():
    # NumPyro's draws: of 31 with thinning 3, transitions 3, 6, ..., 30 (0-based): the last
    # is kept (fori_collect starts at num_samples % thinning); it was 2, 5, ..., 29
    y = _vector_data()
    full = _mcmc(num_samples=31, seed=3)
    full.run(y, extra_fields=("accept_prob",))
    thinned = _mcmc(num_samples=31, thinning=3, seed=3)
    thinned.run(y, extra_fields=("accept_prob",))
    a, b = full.get_samples(group_by_chain=True), thinned.get_samples(group_by_chain=True)
    for name in a:
        assert b[name].shape[:2] == (2, 10)
        assert torch.equal(b[name], a[name][:, 3::3])
    accept_full = full.get_extra_fields(group_by_chain=True)["accept_prob"]
    accept_thinned = thinned.get_extra_fields(group_by_chain=True)["accept_prob"]
    assert torch.equal(accept_thinned, accept_full[:, 3::3])


def _exact_known_noise(y):
    precision = 2.0**-2 + y.shape[0] / NOISE**2
    return float(y.sum()) / NOISE**2 / precision, precision**-0.5


def _assert_mean_within_4_mcse(draws: torch.Tensor, mean: float, sd: float):
    """``draws`` (chains, draws); MCSE = exact sd / sqrt(bulk ESS).

    With ESS > 250 the sd of a normal posterior has a relative Monte Carlo error of about
    sqrt(1 / 500) = 4.5%, so 20% is over 4 standard errors.
    """
    ess = float(az.ess(draws.numpy(), method="bulk"))
    assert ess > 250
    mcse = sd / math.sqrt(ess)
    assert abs(float(draws.mean()) - mean) < 4 * mcse
    assert abs(float(draws.std()) - sd) < 0.2 * sd


def test_sequential_chains():
    y = _data(n=10, seed=1)
    mcmc = _mcmc(known_noise_model, num_warmup=150, num_samples=300, num_chains=3,
                 chain_method="sequential")  # fmt: skip
    mcmc.run(y, extra_fields=("step_size",))
    draws = mcmc.get_samples(group_by_chain=True)["mu"]
    assert draws.shape == (3, 300)
    assert mcmc.get_samples()["mu"].shape == (900,)
    assert mcmc.get_extra_fields(group_by_chain=True)["step_size"].shape == (3, 300)
    assert mcmc.last_state.z.shape == (3, 1)
    assert mcmc.post_warmup_state.z.shape == (3, 1)
    # each chain warmed up on its own (its own step size) and sampled its own draws
    assert len(set(mcmc.last_state.step_size.tolist())) == 3
    assert not torch.equal(draws[0], draws[1])
    assert float(az.rhat(draws.numpy())) < 1.05
    _assert_mean_within_4_mcse(draws, *_exact_known_noise(y))


def test_seed_reproducibility():
    y = _vector_data()

    def run(seed):
        mcmc = _mcmc(num_warmup=40, num_samples=20, seed=seed)
        mcmc.run(y, extra_fields=STATS)
        return mcmc.get_samples(), mcmc.get_extra_fields()

    a, a_stats = run(7)
    b, b_stats = run(7)
    c, _ = run(8)
    for name in a:
        assert torch.equal(a[name], b[name]), name
        assert not torch.equal(a[name], c[name]), name
    for name in STATS:
        assert torch.equal(a_stats[name], b_stats[name]), name
    # a seeded run leaves torch's global generator alone
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run(7)
    assert torch.equal(torch.rand(3), expected)


def test_print_summary(vector_run, capsys):
    mcmc = vector_run[0]
    mcmc.print_summary(exclude_deterministic=False)
    out = capsys.readouterr().out
    divergences = int(mcmc.get_extra_fields()["diverging"].sum())
    for text in ("loc[0]", "loc[2]", "scale", "loc_sum", "scaled[1]", "n_eff", "r_hat",
                 "mean", "std", f"Number of divergences: {divergences}"):  # fmt: skip
        assert text in out, text
    mcmc.print_summary()  # NumPyro's default: the latent sites
    out = capsys.readouterr().out
    assert "loc[2]" in out and "scale" in out and "loc_sum" not in out and "scaled" not in out
    mcmc.summary()  # Pyro's: every site
    assert "loc_sum" in capsys.readouterr().out


def test_pyro_summary_and_diagnostics(capsys):
    """Pyro's MCMC.summary() prints print_summary's table; diagnostics() gives ArviZ's
    bulk ESS and R-hat per scalar shaped like the site, and per chain the divergent draws'
    indices and the mean acceptance probability (they raised AttributeError)."""
    mcmc = _mcmc(num_warmup=30, num_samples=40)
    mcmc.run(_vector_data(), extra_fields=("accept_prob",))
    mcmc.summary(prob=0.8)
    summary = capsys.readouterr().out
    mcmc.print_summary(prob=0.8, exclude_deterministic=False)
    assert summary == capsys.readouterr().out and "10%" in summary
    d = mcmc.diagnostics()
    draws = mcmc.get_samples(group_by_chain=True)
    loc = draws["loc"].numpy()
    assert d["loc"]["n_eff"].shape == (3,) and d["scale"]["r_hat"].shape == ()
    for i in range(3):
        assert float(d["loc"]["n_eff"][i]) == pytest.approx(float(az.ess(loc[..., i])), rel=1e-12)
        assert float(d["loc"]["r_hat"][i]) == pytest.approx(float(az.rhat(loc[..., i])), rel=1e-12)
    mcmc._stats["diverging"][1, [3, 7]] = True  # as if draws 3 and 7 of chain 1 had diverged
    stats = mcmc.get_extra_fields(group_by_chain=True)
    d = mcmc.diagnostics()
    assert {3, 7} <= set(d["divergences"]["chain 1"])
    for c in range(2):
        expected = torch.nonzero(stats["diverging"][c]).reshape(-1).tolist()
        assert d["divergences"][f"chain {c}"] == expected
        rate = float(stats["accept_prob"][c].double().mean())
        assert d["acceptance rate"][f"chain {c}"] == pytest.approx(rate, rel=1e-12)


def test_split_rank_rhat_is_arviz_rhat_and_covers_one_chain():
    """The one-chain R-hat is ArviZ's formula on split halves (checked on several chains)."""
    from probtorch.inference.mcmc.diagnostics import split_rank_rhat, summary_table

    rng = np.random.default_rng(0)
    for shape, shift in [((2, 101), 0.0), ((4, 500), 0.0), ((3, 40), 0.7)]:
        draws = rng.standard_t(4, size=shape) + shift * np.arange(shape[0])[:, None]
        assert split_rank_rhat(draws) == pytest.approx(float(az.rhat(draws)), rel=1e-12)
    stuck = np.concatenate([rng.normal(size=200), rng.normal(3.0, 1.0, size=200)])[None]
    mixed = rng.normal(size=(1, 400))
    assert split_rank_rhat(stuck) > 1.5 and split_rank_rhat(mixed) < 1.01
    table = summary_table({"x": torch.from_numpy(mixed), "y": torch.from_numpy(stuck)})
    assert "nan" not in table
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ArviZ warned on constant draws
        fixed = summary_table({"c": torch.ones(2, 50)}).splitlines()[1].split()
    assert fixed[-2:] == ["nan", "nan"]  # no ESS or R-hat for a constant
    rhats = [float(line.split()[-1]) for line in table.splitlines()[1:]]
    assert rhats == pytest.approx([split_rank_rhat(mixed), split_rank_rhat(stuck)], abs=1e-3)


# -- ArviZ export -------------------------------------------------------------------------------
def test_to_inference_data(vector_run):
    mcmc, y = vector_run
    idata = mcmc.to_inference_data()
    assert {"posterior", "sample_stats", "observed_data", "log_likelihood"} <= set(idata.groups())
    posterior = idata.posterior
    assert posterior.sizes["chain"] == 3 and posterior.sizes["draw"] == 50
    assert set(posterior.data_vars) == {"loc", "scale", "loc_sum", "scaled"}
    assert posterior["loc"].shape == (3, 50, 3)
    np.testing.assert_array_equal(
        posterior["loc"].values, mcmc.get_samples(group_by_chain=True)["loc"].numpy()
    )
    sample_stats = idata.sample_stats
    assert ARVIZ_STATS <= set(sample_stats.data_vars)
    for name in ARVIZ_STATS:
        assert sample_stats[name].shape == (3, 50), name
    fields = mcmc.get_extra_fields(group_by_chain=True)
    np.testing.assert_array_equal(sample_stats["lp"].values, -fields["potential_energy"].numpy())
    np.testing.assert_array_equal(sample_stats["n_steps"].values, fields["num_steps"].numpy())
    np.testing.assert_array_equal(
        sample_stats["acceptance_rate"].values, fields["accept_prob"].numpy()
    )
    np.testing.assert_array_equal(sample_stats["diverging"].values, fields["diverging"].numpy())
    np.testing.assert_array_equal(idata.observed_data["y"].values, y.numpy())
    assert idata.log_likelihood["y"].shape == (3, 50, y.shape[0])


def _grouped(group, y=None, counted=None):
    """Varying means in a plate of groups; observations in a data plate, some masked."""
    sd = pt.sample("sd", dist.HalfNormal(1.0))
    with pt.plate("groups", 3):
        means = pt.sample("means", dist.Normal(0.0, 2.0))
    with pt.plate("data", group.shape[0]):
        if counted is None:
            pt.sample("y", dist.Normal(means[group], sd), obs=y)
        else:
            pt.sample("y", dist.Normal(means[group], sd), obs=y, obs_mask=counted)


def test_inference_data_dims_are_named_after_plates_and_masked_observations_left_out():
    from probtorch.inference import Predictive

    group = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    y = torch.tensor([0.3, -0.2, 1.5, 1.1, -1.0, -0.7, 99.0])  # the last one is missing
    counted = torch.tensor([True] * 6 + [False])
    mcmc = _mcmc(_grouped, num_warmup=50, num_samples=30)
    mcmc.run(group, y, counted)
    samples = {k: v for k, v in mcmc.get_samples().items() if k in ("sd", "means")}
    ppc = Predictive(_grouped, samples)(group, seed=0)
    prior = Predictive(_grouped, num_samples=20)(group, seed=0)
    idata = mcmc.to_inference_data(posterior_predictive=ppc, prior=prior)
    assert idata.posterior["means"].dims == ("chain", "draw", "groups")
    assert idata.posterior["y_unobserved"].dims == ("chain", "draw", "data")
    assert idata.posterior["y"].dims == ("chain", "draw", "data")  # deterministic, in the plate
    # the masked observation is in neither the log likelihood nor the observed data
    assert idata.observed_data["y_observed"].dims == ("y_observed_counted",)
    np.testing.assert_array_equal(idata.observed_data["y_observed"].values, y[:6].numpy())
    loglik = idata.log_likelihood["y_observed"]
    assert loglik.dims == ("chain", "draw", "y_observed_counted") and loglik.shape == (2, 30, 6)
    grouped = mcmc.get_samples(group_by_chain=True)
    means, sd = grouped["means"].numpy(), grouped["sd"].numpy()[..., None]
    expected = stats.norm(means[..., group[:6].numpy()], sd).logpdf(y[:6].numpy())
    np.testing.assert_allclose(loglik.values, expected, rtol=1e-10, atol=1e-10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few draws: Pareto k may be high
        assert np.isfinite(float(az.loo(idata, var_name="y_observed").elpd_loo))
    # predictive groups: (chains, draws) from the flat draws; prior latents and observations
    assert idata.posterior_predictive["y"].dims == ("chain", "draw", "data")
    np.testing.assert_array_equal(
        idata.posterior_predictive["y"].values, ppc["y"].reshape(2, 30, 7).numpy()
    )
    assert idata.prior["means"].dims == ("chain", "draw", "groups")
    assert idata.prior["means"].shape == (1, 20, 3)
    assert set(idata.prior.data_vars) == {"sd", "means"}
    assert set(idata.prior_predictive.data_vars) == {"y"}
    assert idata.prior_predictive["y"].dims == ("chain", "draw", "data")
    assert idata.prior_predictive["y"].shape == (1, 20, 7)
    # the masked site's predictive draws are cut to its counted entries, as its observations
    masked_ppc = Predictive(_grouped, samples)(group, y, counted, seed=0)
    assert masked_ppc["y"].shape == (60, 7)
    assert not torch.equal(masked_ppc["y"][:, :6], y[:6].expand(60, 6))  # replicates, not data
    masked = mcmc.to_inference_data(posterior_predictive=masked_ppc)
    draws = masked.posterior_predictive["y_observed"]
    assert draws.dims == ("chain", "draw", "y_observed_counted") and draws.shape == (2, 30, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert az.loo_pit(masked, y="y_observed").shape == (6,)
    # user dims and coords win over the plate names
    named = mcmc.to_inference_data(coords={"school": ["a", "b", "c"]}, dims={"means": ["school"]})
    assert list(named.posterior["means"].coords["school"].values) == ["a", "b", "c"]
    # draws that are not the posterior's are kept as one chain, with a warning (as ArviZ's)
    fewer = Predictive(_grouped, {k: v[:50] for k, v in samples.items()})(group, seed=0)
    with pytest.warns(UserWarning, match=r"posterior_predictive\['y'\] has shape \(50, 7\), "
                      r"which is neither \(60, ...\) nor \(2, 30, ...\)") as caught:  # fmt: skip
        apart = mcmc.to_inference_data(posterior_predictive=fewer)
    assert caught[0].filename == __file__
    assert apart.posterior_predictive["y"].shape == (1, 50, 7)


def test_dims_given_for_a_sites_whole_value_name_its_log_likelihoods_batch_dims():
    """ArviZ's ``dims`` name a site's whole value (from_numpyro takes
    ``{"Y": ["n", "var"]}`` for an (n, 2) MultivariateNormal observation): the pointwise log
    likelihood, which has no event dim, crashed with ArviZ's "different number of dimensions
    on data and dims: 3 vs 4". It takes the batch dims of them; a partly masked site's
    counted entries keep their own dim (the mask shortens them) in place of the given ones."""
    Y = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))

    def model(Y, counted=None):
        mu = pt.sample("mu", dist.Normal(torch.zeros(2), 5.0).to_event(1))
        with pt.plate("n", Y.shape[0]):
            pt.sample("Y", dist.MultivariateNormal(mu, torch.eye(2)), obs=Y, obs_mask=counted)

    coords = {"n": list(range(100, 106)), "var": ["a", "b"]}
    dims = {"mu": ["var"], "Y": ["n", "var"]}
    mcmc = _mcmc(model, num_warmup=20, num_samples=10)
    mcmc.run(Y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ArviZ warned of more dims than the data had
        idata = mcmc.to_inference_data(coords=coords, dims=dims)
    assert idata.posterior["mu"].dims == ("chain", "draw", "var")
    assert idata.observed_data["Y"].dims == ("n", "var")
    assert list(idata.observed_data["Y"].coords["var"].values) == ["a", "b"]
    assert idata.log_likelihood["Y"].dims == ("chain", "draw", "n")
    assert list(idata.log_likelihood["Y"].coords["n"].values) == coords["n"]
    mcmc.run(Y, torch.arange(6) != 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masked = mcmc.to_inference_data(coords=coords, dims={**dims, "Y_observed": ["n", "var"]})
    assert masked.observed_data["Y_observed"].dims == ("Y_observed_counted", "var")
    assert masked.log_likelihood["Y_observed"].dims == ("chain", "draw", "Y_observed_counted")
    assert masked.log_likelihood["Y_observed"].shape == (2, 10, 5)


def test_torch_distributions_export_and_predict():
    """torch's own distributions have no ``event_dim`` (Pyro's): ``to_inference_data``,
    ``Predictive`` and ``obs_mask`` read it, and failed with an AttributeError."""
    import torch.distributions as td

    from probtorch.inference import Predictive

    y = _vector_data()[:, 0]
    mask = torch.arange(8) != 3

    def model(y):
        mu = pt.sample("mu", td.Normal(0.0, 2.0))
        w = pt.sample("w", td.MultivariateNormal(torch.zeros(2), torch.eye(2)))
        with pt.plate("n", 8):
            pt.sample("y", td.Normal(mu + 0.1 * w.sum(), 1.0), obs=y, obs_mask=mask)

    mcmc = _mcmc(model, num_warmup=30, num_samples=20)
    mcmc.run(y)
    idata = mcmc.to_inference_data()
    assert dict(idata.posterior["w"].sizes) == {"chain": 2, "draw": 20, "w_dim_0": 2}
    assert dict(idata.posterior["y_unobserved"].sizes) == {"chain": 2, "draw": 20, "n": 8}
    counted = {"chain": 2, "draw": 20, "y_observed_counted": 7}  # the masked entry left out
    assert dict(idata.log_likelihood["y_observed"].sizes) == counted
    predicted = Predictive(model, mcmc.get_samples())(y)
    assert predicted["y"].shape == (40, 8)


def test_log_likelihood_matches_scipy():
    y = _data(n=6)
    mcmc = _mcmc(normal_model, num_warmup=40, num_samples=25)
    mcmc.run(y)
    idata = mcmc.to_inference_data()
    samples = mcmc.get_samples(group_by_chain=True)
    mu, sigma = samples["mu"].numpy(), samples["sigma"].numpy()
    expected = stats.norm(mu[..., None], sigma[..., None]).logpdf(y.numpy())
    assert expected.shape == (2, 25, 6)
    np.testing.assert_allclose(idata.log_likelihood["y"].values, expected, rtol=1e-10, atol=1e-10)
    assert set(idata.sample_stats.data_vars) >= ARVIZ_STATS  # recorded even if not requested


# -- continuing, initial values, interrupts -------------------------------------------------------
def _segments(monkeypatch, kernel, on_call=None):
    """Wrap ``kernel.run_segment``: record each call's ``(num_transitions,
    adapt_step_size)``, and call ``on_call(calls)`` before each."""
    calls = []
    original = kernel.run_segment

    def run_segment(state, adapt, num_transitions, adapt_step_size=False, **kwargs):
        calls.append((num_transitions, adapt_step_size))
        if on_call is not None:
            on_call(calls)
        return original(state, adapt, num_transitions, adapt_step_size, **kwargs)

    monkeypatch.setattr(kernel, "run_segment", run_segment)
    return calls


@pytest.mark.parametrize("kernel, options", [(NUTS, {}), (HMC, {"num_steps": 4})])
def test_continue_from_last_state_skips_warmup(kernel, options, monkeypatch):
    y = _vector_data()
    mcmc = _mcmc(kernel=kernel, num_warmup=80, num_samples=30, **options)
    mcmc.run(y, extra_fields=("step_size",))
    first = mcmc.last_state
    potential = mcmc.kernel.potential
    adapted_step = first.step_size.clone()
    calls = _segments(monkeypatch, mcmc.kernel)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run(y, extra_fields=("step_size",))
    assert calls == [(30, False)]  # the sampling phase only: no warmup segments
    assert mcmc.kernel.potential is potential  # the kernel was not set up again
    # a new warmup would have re-run the step-size heuristic and dual averaging
    step = mcmc.get_extra_fields(group_by_chain=True)["step_size"]
    torch.testing.assert_close(step, adapted_step.unsqueeze(1).expand(2, 30), rtol=0, atol=0)
    torch.testing.assert_close(mcmc.last_state.step_size, adapted_step, rtol=0, atol=0)
    torch.testing.assert_close(mcmc.last_state.inverse_mass, first.inverse_mass, rtol=0, atol=0)
    assert mcmc.get_samples(group_by_chain=True)["loc"].shape == (2, 30, 3)


def test_a_new_mcmc_continues_a_state_set_on_it(monkeypatch):
    """A state from another MCMC (say, saved and loaded in a new process) set as a new
    MCMC's post_warmup_state: sampled on without warmup (an AttributeError before: the
    new kernel had no potential to compare arguments with)."""
    y = _vector_data()
    first = _mcmc(num_warmup=80, num_samples=10)
    first.run(y)
    second = _mcmc(num_warmup=80, num_samples=30, seed=1)
    second.post_warmup_state = first.last_state
    calls = _segments(monkeypatch, second.kernel)
    second.run(y, extra_fields=("step_size",))
    assert calls == [(30, False)]
    step = second.get_extra_fields(group_by_chain=True)["step_size"]
    torch.testing.assert_close(step, first.last_state.step_size.unsqueeze(1).expand(2, 30))
    wrong = _mcmc(num_chains=3)
    wrong.post_warmup_state = first.last_state
    with pytest.raises(ValueError, match="post_warmup_state has 2 chains but this MCMC runs "
                       "num_chains=3"):  # fmt: skip
        wrong.run(y)


@pytest.mark.parametrize("chain_method", ["vectorized", "sequential"])
def test_warmup_then_run_samples_without_warming_up_again(chain_method, monkeypatch):
    """``warmup`` adapts and keeps no draws; ``run`` then samples from the adapted chains
    (no warmup segments); ``warmup(collect_warmup=True)`` keeps the warmup transitions,
    thinned, with their statistics."""
    y = _vector_data()
    mcmc = _mcmc(num_warmup=60, num_samples=30, chain_method=chain_method, thinning=2)
    mcmc.warmup(y)
    warm = mcmc.post_warmup_state
    assert warm is not None and mcmc.get_samples() == {}
    calls = _segments(monkeypatch, mcmc.kernel)
    mcmc.run(y, extra_fields=("step_size",))
    assert calls == [(30, False)] * (2 if chain_method == "sequential" else 1)
    assert mcmc.get_samples(group_by_chain=True)["loc"].shape == (2, 15, 3)
    step = mcmc.get_extra_fields(group_by_chain=True)["step_size"]
    torch.testing.assert_close(step, warm.step_size.unsqueeze(1).expand(2, 15), rtol=0, atol=0)

    monkeypatch.undo()
    mcmc.warmup(y, collect_warmup=True, extra_fields=("step_size",))
    assert mcmc.get_samples(group_by_chain=True)["loc"].shape == (2, 30, 3)
    warmup_steps = mcmc.get_extra_fields(group_by_chain=True)["step_size"]
    assert warmup_steps.shape == (2, 30) and len(set(warmup_steps[0].tolist())) > 5  # adapting
    torch.testing.assert_close(mcmc.post_warmup_state.z, warm.z, rtol=0, atol=0)  # same seed


def test_continued_run_draws_a_stream_of_its_own():
    """A run continued from ``last_state`` does not restart the seed's random stream: a
    fresh run from the same point, step size and metric with the same seed draws other
    momenta, so other draws. The same state set and continued twice gives the same draws
    (a run continuing the state a run left draws anew: see below)."""
    y = _vector_data()
    options = {"num_warmup": 0, "num_samples": 20, "step_size": 0.1, "adapt_step_size": False}
    first = _mcmc(**options)
    first.run(y)
    last = first.last_state
    fresh = _mcmc(**options)
    fresh.run(y, init_params={k: v[:, -1] for k, v in first.get_samples(True).items()
                              if k in ("loc", "scale")})  # fmt: skip
    runs = []
    for _ in range(2):
        first.post_warmup_state = last
        first.run(y)
        runs.append(first.get_samples())
    assert torch.equal(runs[0]["loc"], runs[1]["loc"])
    assert not torch.allclose(runs[0]["loc"], fresh.get_samples()["loc"])


def test_sampling_problems_are_reported_after_the_run():
    """As Stan does: divergent transitions and trees cut at max_tree_depth, counted over the
    kept draws, in one warning after sampling; a healthy run says nothing."""
    y = _vector_data()
    fixed = {"num_warmup": 0, "num_samples": 20, "adapt_step_size": False}
    with pytest.warns(UserWarning, match=r"\d+ of 40 transitions after warmup diverged.*"
                      r"no warmup adapted the step size") as caught:  # fmt: skip
        _mcmc(step_size=30.0, **fixed).run(y)
    assert {w.filename for w in caught} == {__file__}  # the user's line, not probtorch's
    with pytest.warns(UserWarning, match=r"\d+ of 40 transitions reached max_tree_depth=2"):
        _mcmc(step_size=1e-3, max_tree_depth=2, **fixed).run(y)
    # counted before thinning: every sampling transition, as Stan counts them
    with pytest.warns(UserWarning, match=r"\d+ of 40 transitions after warmup diverged"):
        _mcmc(step_size=30.0, thinning=4, **fixed).run(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _mcmc(num_warmup=100, num_samples=50).run(y)


def test_divergences_after_a_short_warmup_are_put_down_to_it():
    """A standard normal after 20 warmup iterations: Stan's schedule adapts the final step
    size over the last 2, and it ends 4-10x too large (NumPyro's too): the warning says so
    instead of advising a reparameterization."""

    def model():
        pt.sample("a", dist.Normal(0.0, 1.0))

    mcmc = MCMC(NUTS(model, compile=False), num_warmup=20, num_samples=100, seed=0,
                progress_bar=False)  # fmt: skip
    short = r"warmup of 20 iterations is too short: its final step size was adapted over"
    with pytest.warns(UserWarning, match=r"diverged.*" + short + r" its last 2.*>= 150"):
        mcmc.run()


def test_init_params_honored():
    y = _vector_data()
    init = {"loc": torch.tensor([0.5, -1.0, 2.0]), "scale": torch.tensor(1.5)}
    kernel = NUTS(vector_model, compile=False)
    state = kernel.setup((y,), {}, num_chains=3, rng_seed=0, init_params=init)
    values = kernel.potential.unpack(state.z)
    for c in range(3):
        torch.testing.assert_close(values["loc"][c], init["loc"])
        torch.testing.assert_close(values["scale"][c].exp(), init["scale"])  # log scale
    # per-chain values, through the driver: tiny fixed steps keep the one draw at the start
    per_chain = {"loc": torch.tensor([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]),
                 "scale": torch.tensor([0.5, 2.0])}  # fmt: skip
    mcmc = _mcmc(num_warmup=0, num_samples=1, step_size=1e-6, adapt_step_size=False,
                 max_tree_depth=1)  # fmt: skip
    mcmc.run(y, init_params=per_chain)
    samples = mcmc.get_samples(group_by_chain=True)
    torch.testing.assert_close(samples["loc"][:, 0], per_chain["loc"], rtol=0, atol=1e-4)
    torch.testing.assert_close(samples["scale"][:, 0], per_chain["scale"], rtol=0, atol=1e-4)


def _interrupting(model):
    """``model`` that raises KeyboardInterrupt (as Ctrl-C would) on its call number
    ``counter["interrupt_at"]``; ``counter["calls"]`` counts its calls."""
    counter = {"calls": 0, "interrupt_at": None}

    def interrupting(*args, **kwargs):
        counter["calls"] += 1
        if counter["calls"] == counter["interrupt_at"]:
            raise KeyboardInterrupt
        model(*args, **kwargs)

    return interrupting, counter


def _interrupt_in_segment(monkeypatch, mcmc, counter, sampling: bool, at_call: int, nth=1):
    """Ctrl-C at the model's call ``at_call`` counted from the start of the ``nth`` sampling
    (``sampling``) or warmup segment; returns the segments run (:func:`_segments`)."""

    def arm(calls):
        matching = [c for c in calls if c[1] is not sampling]
        if counter["interrupt_at"] is None and calls[-1][1] is not sampling:
            if len(matching) == nth:
                counter["calls"], counter["interrupt_at"] = 0, at_call

    return _segments(monkeypatch, mcmc.kernel, arm)


def test_keyboard_interrupt_during_sampling_keeps_draws(monkeypatch):
    """HMC with 3 fixed steps in blocks of 5 transitions: a block is 15 leapfrog steps (one
    model call each, all chains at once). Ctrl-C at the 7th step of the third block keeps
    the two blocks' 10 draws and the 2 transitions the third finished."""
    model, counter = _interrupting(vector_model)
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, block_size=5, num_warmup=20, num_samples=50)
    _interrupt_in_segment(monkeypatch, mcmc, counter, sampling=True, at_call=2 * 15 + 7)
    with pytest.warns(UserWarning, match="interrupted during sampling.* 12 draws"):
        mcmc.run(_vector_data(), extra_fields=("accept_prob",))
    assert mcmc.interrupted
    samples = mcmc.get_samples(group_by_chain=True)
    assert samples["loc"].shape == (2, 12, 3) and samples["scale"].shape == (2, 12)
    assert mcmc.get_extra_fields(group_by_chain=True)["accept_prob"].shape == (2, 12)
    assert torch.isfinite(samples["loc"]).all()


@pytest.mark.parametrize(
    ("blocks", "shape", "match"),
    [
        (2, (1, 50), "keeping the 1 finished chain\\(s\\) of 50 draws; chain 2's 12 draws were "
         "dropped"),
        (9, (2, 47), "keeping 2 chain\\(s\\) of 47 draws \\(the interrupted chain's\\)"),
    ],
)  # fmt: skip
def test_keyboard_interrupt_ends_sequential_chains(monkeypatch, blocks, shape, match):
    """Ctrl-C in the second of three sequential chains ends the run: the third never starts.
    Kept: the finished chain in full, or both chains cut to the interrupted one's length,
    whichever keeps more draws (blocks of 5 transitions of 3 steps, as above)."""
    model, counter = _interrupting(vector_model)
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, block_size=5, num_warmup=20, num_samples=50,
                 num_chains=3, chain_method="sequential")  # fmt: skip
    calls = _interrupt_in_segment(
        monkeypatch, mcmc, counter, sampling=True, at_call=blocks * 15 + 7, nth=2
    )
    with pytest.warns(UserWarning, match="interrupted during sampling of chain 2 of 3 "
                      "\\(chain_method='sequential'\\): " + match):  # fmt: skip
        mcmc.run(_vector_data())
    assert mcmc.interrupted
    assert [n for n, adapting in calls if not adapting] == [50, 50]  # no third chain
    assert mcmc.get_samples(group_by_chain=True)["loc"].shape == shape + (3,)
    assert mcmc.post_warmup_state is None  # not every chain was warmed up and kept
    assert mcmc.last_state.z.shape == (shape[0], 4)
    mcmc.run(_vector_data())  # an uninterrupted run after it
    assert not mcmc.interrupted and mcmc.get_samples(group_by_chain=True)["loc"].shape[0] == 3


def test_interrupted_sequential_continuation_keeps_its_post_warmup_state(monkeypatch):
    """A continued sequential run cut short keeps the post_warmup_state it was given (still
    valid for every chain); a state with fewer chains than num_chains is an error."""
    model, counter = _interrupting(vector_model)
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, block_size=5, num_warmup=20, num_samples=50,
                 num_chains=3, chain_method="sequential")  # fmt: skip
    y = _vector_data()
    mcmc.run(y)
    warm = mcmc.post_warmup_state
    _interrupt_in_segment(monkeypatch, mcmc, counter, sampling=True, at_call=2 * 15 + 7, nth=2)
    with pytest.warns(UserWarning, match="interrupted during sampling of chain 2 of 3"):
        mcmc.run(y)
    assert mcmc.post_warmup_state is warm
    assert mcmc.last_state.z.shape[0] == 1
    mcmc.post_warmup_state = mcmc.last_state
    with pytest.raises(ValueError, match="post_warmup_state has 1 chains but this MCMC runs "
                       "num_chains=3"):  # fmt: skip
        mcmc.run(y)


def test_interrupted_collected_warmup_keeps_the_stats_dtypes(monkeypatch):
    model, counter = _interrupting(vector_model)
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, block_size=5, num_warmup=20, num_samples=5)
    # the first segment's 3 transitions (9 calls) finish; the second stops in its first
    _interrupt_in_segment(monkeypatch, mcmc, counter, sampling=False, at_call=12)
    with pytest.warns(UserWarning, match=r"interrupted during warmup: the 3 warmup draws"):
        mcmc.warmup(_vector_data(), collect_warmup=True, extra_fields=("num_steps",))
    fields = mcmc.get_extra_fields()
    assert fields["diverging"].dtype == torch.bool and fields["num_steps"].dtype == torch.int64


def test_keyboard_interrupt_during_warmup(monkeypatch):
    model, counter = _interrupting(vector_model)
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, num_warmup=20, num_samples=50)
    _interrupt_in_segment(monkeypatch, mcmc, counter, sampling=False, at_call=5)
    with pytest.warns(UserWarning, match="interrupted during warmup"):
        mcmc.run(_vector_data())
    assert counter["calls"] == 5
    assert mcmc.interrupted
    assert mcmc.get_samples() == {}
    assert mcmc.post_warmup_state is None


def test_keyboard_interrupt_inside_nuts_keeps_the_draws_made_so_far():
    """Ctrl-C inside the model's evaluation (anywhere in a NUTS trajectory): the draws already
    made are kept, and they are the draws an uninterrupted run makes."""
    model, counter = _interrupting(vector_model)

    y = _vector_data()
    mcmc = _mcmc(model, num_warmup=60, num_samples=96, block_size=16, seed=2)
    mcmc.run(y)
    warm = mcmc.last_state
    mcmc.post_warmup_state = warm
    counter["calls"] = 0
    mcmc.run(y)  # uninterrupted continuation, for reference
    reference = mcmc.get_samples(group_by_chain=True)
    mcmc.post_warmup_state = warm
    counter["interrupt_at"], counter["calls"] = int(0.7 * counter["calls"]), 0
    with pytest.warns(UserWarning, match="interrupted during sampling"):
        mcmc.run(y, extra_fields=("num_steps",))
    assert mcmc.interrupted
    samples = mcmc.get_samples(group_by_chain=True)
    assert set(samples) == set(reference)
    kept = samples["loc"].shape[1]
    assert 0 < kept < 96
    assert mcmc.get_extra_fields(group_by_chain=True)["num_steps"].shape == (2, kept)
    for name in reference:
        assert torch.equal(samples[name], reference[name][:, :kept]), name


def test_keyboard_interrupt_inside_an_hmc_trajectory_keeps_the_draws_made_so_far():
    """Ctrl-C inside an HMC trajectory ends the run: the transition it interrupted is not
    made (its partial trajectory is no proposal), the draws before it are kept, and they
    are an uninterrupted run's."""
    model, counter = _interrupting(vector_model)

    y = _vector_data()
    mcmc = _mcmc(model, kernel=HMC, num_steps=3, num_warmup=30, num_samples=40, seed=2)
    mcmc.run(y)
    warm = mcmc.last_state
    mcmc.post_warmup_state = warm
    counter["calls"] = 0
    mcmc.run(y)
    reference = mcmc.get_samples(group_by_chain=True)
    mcmc.post_warmup_state = warm
    counter["interrupt_at"], counter["calls"] = int(0.5 * counter["calls"]) + 1, 0
    with pytest.warns(UserWarning, match="interrupted during sampling"):
        mcmc.run(y)
    assert mcmc.interrupted
    samples = mcmc.get_samples(group_by_chain=True)
    kept = samples["loc"].shape[1]
    assert 0 < kept < 40
    for name in reference:
        assert torch.equal(samples[name], reference[name][:, :kept]), name


@pytest.mark.parametrize("kernel", [NUTS, HMC])
def test_keyboard_interrupt_inside_one_transition_reaches_the_caller(kernel):
    """``kernel.sample(state)`` (one transition, outside MCMC) raises KeyboardInterrupt on
    Ctrl-C inside its trajectory instead of returning a transition cut short."""
    model, counter = _interrupting(vector_model)

    k = kernel(model, compile=False, step_size=0.05)
    state = k.setup((_vector_data(),), {}, num_chains=2, rng_seed=0)
    counter["interrupt_at"], counter["calls"] = 1, 0  # the trajectory's first leapfrog step
    with pytest.raises(KeyboardInterrupt):
        k.sample(state)


def test_compiled_hmc_draws_what_eager_hmc_draws_without_recompiles():
    """Compiled HMC runs its trajectory as an in-place graph (``InPlaceLoop``, as NUTS's
    blocks): the same draws as ``compile=False`` (with a fixed step size: under adaptation
    roundings grow from transition to transition, 1e-13 after ten), no graph breaks, and a
    continued run compiles nothing."""
    from probtorch.inference.compile import count_compiles
    from probtorch.inference.mcmc.executor import InPlaceLoop

    y = _vector_data()
    runs = {}
    for compiled in (False, True):
        kernel = HMC(vector_model, num_steps=4, step_size=0.2, adapt_step_size=False,
                     adapt_mass_matrix=False, compile=compiled)  # fmt: skip
        mcmc = MCMC(kernel, num_warmup=0, num_samples=30, num_chains=3, seed=4,
                    progress_bar=False)  # fmt: skip
        with count_compiles() as first:
            mcmc.run(y)
        runs[compiled] = mcmc
    assert isinstance(runs[True].kernel._loop, InPlaceLoop)
    assert first.graph_breaks == 0
    for name, value in runs[False].get_samples().items():
        torch.testing.assert_close(runs[True].get_samples()[name], value, rtol=0, atol=1e-10)
    compiled = runs[True]
    compiled.post_warmup_state = compiled.last_state
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        compiled.run(y)
    assert later.graph_breaks == 0 and later.graphs == 0


@pytest.mark.parametrize("dense", [False, True])
def test_hmc_block_draws_what_one_transition_at_a_time_draws(float64, dense):
    """A block of HMC transitions (one state machine over leapfrog steps, chains with
    different step counts not waiting for each other, dual averaging in the graph) against
    the plain reference: one transition at a time (``HMC.sample``'s trajectory, Metropolis
    decision and the host's dual-averaging update), given the block's momenta and
    uniforms."""
    from probtorch.inference.mcmc.adaptation import dual_averaging_init, dual_averaging_update
    from probtorch.inference.mcmc.hmc import hmc_init, metropolis
    from probtorch.inference.mcmc.hmc_block import draw_hmc_block_randomness, init_hmc_block

    C, T = 3, 10
    kernel = HMC(vector_model, trajectory_length=1.3, max_steps=40, dense_mass=dense,
                 compile=False)  # fmt: skip
    state = kernel.setup((_vector_data(),), {}, num_chains=C, rng_seed=0)
    state = state._replace(step_size=torch.tensor([0.1, 0.25, 0.4]))
    torch.manual_seed(5)
    rand = draw_hmc_block_randomness(C, T, state.mass_sqrt, state.inverse_mass)
    da = dual_averaging_init(state.step_size)
    t_limit = torch.tensor([T, T, 7])
    block = init_hmc_block(state.z, state.potential_energy, state.grad, state.step_size, da,
                           t_limit, T)  # fmt: skip
    block = kernel._block_loop(block, rand, state.inverse_mass, t_limit, torch.tensor(True))
    assert block.t.tolist() == [T, T, 7]

    z, pe, grad, step = state.z, state.potential_energy, state.grad, state.step_size
    identity = torch.ones_like(z)  # the momenta are given: noise = momentum, M^(1/2) = 1
    for t in range(T):
        steps = torch.ceil(1.3 / step).to(torch.int64).clamp(1, 40)
        traj = hmc_init(z, pe, grad, rand.momentum[:, t], identity, state.inverse_mass, steps)
        traj = kernel._loop(traj, step, state.inverse_mass)
        result = metropolis(traj, state.inverse_mass, rand.accept_u[:, t])
        live = t < t_limit
        for name in ("z", "potential_energy", "accept_prob", "num_steps", "energy"):
            got = getattr(block.out, name)[live, t]
            torch.testing.assert_close(got, getattr(result, name)[live], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(block.out.step_size[live, t], step[live], rtol=0, atol=0)
        new_da = dual_averaging_update(da, result.accept_prob, kernel.target_accept_prob)
        keep = live.unsqueeze(-1)
        z, grad = torch.where(keep, result.z, z), torch.where(keep, result.grad, grad)
        pe = torch.where(live, result.potential_energy, pe)
        da = type(da)(*(torch.where(live, n, o) for n, o in zip(new_da, da)))
        step = torch.where(live, torch.exp(new_da.log_step_size), step)
    assert len(set(block.out.num_steps[:, :7].flatten().tolist())) > 2  # chains differ
    torch.testing.assert_close(block.z, z, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(block.step_size, step, rtol=1e-12, atol=1e-12)


# -- argument checks --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_samples=0),
        dict(num_warmup=-1),
        dict(num_chains=0),
        dict(thinning=0),
        dict(chain_method="bad"),
    ],
)
def test_invalid_mcmc_arguments(kwargs):
    args = dict(num_warmup=10, num_samples=10) | kwargs
    with pytest.raises(ValueError):
        MCMC(NUTS(vector_model, compile=False), progress_bar=False, **args)


def test_arguments_a_numpyro_or_pyro_user_might_pass():
    kernel = NUTS(vector_model, compile=False)
    with pytest.raises(ValueError, match="thinning=5 keeps one of each 5 of num_samples=3 draws"):
        MCMC(kernel, num_warmup=10, num_samples=3, thinning=5)
    with pytest.raises(TypeError, match="takes a kernel, e.g. MCMC.NUTS.model.*'vector_model'"):
        MCMC(vector_model, num_warmup=10, num_samples=10)
    with pytest.raises(ValueError, match="got 'parallel' .NumPyro's 'parallel' maps chains"):
        MCMC(kernel, num_warmup=10, num_samples=10, chain_method="parallel")
    with pytest.raises(TypeError, match="seed must be an integer, got 1.5"):
        MCMC(kernel, num_warmup=10, num_samples=10, seed=1.5)
    with pytest.raises(TypeError, match="NumPyro's .warmup, sampling. pair is not supported"):
        NUTS(vector_model, max_tree_depth=(8, 10))
    numpy_seeded = MCMC(kernel, num_warmup=10, num_samples=10, seed=np.int64(3), progress_bar=False)
    numpy_seeded.run(_vector_data())
    assert numpy_seeded.seed == 3 and type(numpy_seeded.seed) is int


def test_draws_handed_out_are_copies():
    vector_run = _mcmc(num_warmup=10, num_samples=10)
    vector_run.run(_vector_data(), extra_fields=("step_size",))
    for grouped in (False, True):
        samples = vector_run.get_samples(group_by_chain=grouped)
        fields = vector_run.get_extra_fields(group_by_chain=grouped)
        kept = {k: v.clone() for k, v in samples.items()}
        for v in samples.values():
            v.add_(100)  # as `s["mu"] -= m` does
        for v in fields.values():
            v.logical_not_() if v.dtype == torch.bool else v.add_(100)
        again = vector_run.get_samples(group_by_chain=grouped)
        assert all(torch.equal(again[k], kept[k]) for k in kept)
        assert not bool(vector_run.get_extra_fields()["diverging"].all())
        assert float(vector_run.get_extra_fields()["step_size"].max()) < 100


@pytest.mark.parametrize(
    "kernel, option, hint",
    [
        (NUTS, "max_treedepth", "did you mean 'max_tree_depth'"),
        (HMC, "num_step", "did you mean 'num_steps'"),
        (NUTS, "step", "Its options: .*max_tree_depth"),
        (HMC, "warmup", "Its options"),
    ],
)
def test_unknown_kernel_option_is_named_with_the_closest_one(kernel, option, hint):
    with pytest.raises(TypeError, match=f"{kernel.__name__} got an unexpected option {option!r}"):
        kernel(vector_model, **{option: 1})
    with pytest.raises(TypeError, match=hint):
        kernel(vector_model, **{option: 1})


@pytest.mark.parametrize(
    "kernel, option, advice",
    [
        (NUTS, "full_mass", "Pyro's option 'full_mass': it is dense_mass here"),
        (HMC, "jit_compile", "Pyro's option 'jit_compile': .*compile=False runs it eagerly"),
        (NUTS, "max_plate_nesting", "Pyro's option 'max_plate_nesting': the plates are found"),
        (NUTS, "regularize_mass_matrix", "NumPyro's option .*regularized as Stan's"),
        (NUTS, "num_steps", "HMC's option 'num_steps': NUTS chooses each trajectory's length"),
        (NUTS, "trajectory_length", "HMC's option 'trajectory_length': .*HMC\\(model, "),
    ],
)
def test_another_librarys_kernel_option_says_what_to_write_here(kernel, option, advice):
    with pytest.raises(TypeError, match=f"{kernel.__name__} got {advice}"):
        kernel(vector_model, **{option: True})


@pytest.mark.parametrize(
    "args, options, advice",
    [
        (
            (),
            {"num_samples": 100, "warmup_steps": 50},
            "Pyro's option 'warmup_steps': it is num_warmup",
        ),
        ((5, 5), {"initial_params": {}}, "given to run.*init_params="),
        ((5, 5), {"disable_progbar": True}, "write progress_bar=False"),
        ((5, 5), {"mp_context": "spawn"}, "chain_method='vectorized'"),
        ((5, 5), {"jit_model_args": True}, "NumPyro's option 'jit_model_args'"),
        (
            (100,),
            {},
            "MCMC needs num_samples: .*Pyro's MCMC\\(kernel, num_samples, warmup_steps\\)",
        ),
        ((), {}, "MCMC needs num_warmup and num_samples"),
        ((5, 5), {"num_chain": 2}, "unexpected option 'num_chain'; did you mean 'num_chains'"),
    ],
)
def test_pyros_driver_options_and_a_missing_count_say_what_to_write(args, options, advice):
    with pytest.raises(TypeError, match=advice):
        MCMC(NUTS(vector_model, compile=False), *args, **options)


def test_unknown_extra_field():
    mcmc = _mcmc(num_warmup=5, num_samples=5)
    mcmc.run(_vector_data(), extra_fields=("step_size",))
    with pytest.raises(ValueError, match="bogus"):
        mcmc.run(_vector_data(), extra_fields=("accept_prob", "bogus"))
    # refused before anything changed: the last run's results are all still there
    assert set(mcmc.get_extra_fields()) == {"diverging", "step_size"}
    assert mcmc.get_samples()["loc"].shape == (10, 3)


def _weighted(y, weights):
    mu = pt.sample("mu", dist.Normal(0.0, 1.0))
    with pt.plate("data", y.shape[0]), pt.handlers.scale(scale=weights):
        pt.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize("executor", ["quick", "split"])
def test_tensor_scale_given_as_data_is_an_input_of_the_compiled_sampler(executor):
    """Observation weights as a tensor argument: its positivity is checked on the eager run
    and not inside the traced sampler (where reading it was a data-dependent error)."""
    y, weights = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 2.0, 0.5])
    mcmc = MCMC(
        NUTS(_weighted, executor=executor),
        num_warmup=200,
        num_samples=500,
        num_chains=2,
        progress_bar=False,
        seed=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback from the compiled chunk
        mcmc.run(y, weights)
    draws = mcmc.get_samples(group_by_chain=True)["mu"].numpy()
    precision = 1.0 + float(weights.sum())
    mean, sd = float((weights * y).sum()) / precision, precision**-0.5
    mcse = sd / math.sqrt(float(az.ess(draws, method="bulk")))
    assert abs(draws.mean() - mean) < 4 * mcse
    assert abs(draws.std() / sd - 1) < 0.15
    with pytest.raises(ValueError, match="scale must be positive"):
        mcmc.run(y, torch.tensor([1.0, -2.0, 0.5]))


_GLOBAL = {"y": torch.full((20,), 3.0), "noise": 1.0}


def _reads_globals():
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    with pt.plate("n", 20):
        pt.sample("y", dist.Normal(mu, _GLOBAL["noise"]), obs=_GLOBAL["y"])


@pytest.mark.parametrize("compiled", [False, True])
def test_a_run_after_a_global_the_model_reads_changed_warms_up_anew(compiled, monkeypatch):
    """Arguments are compared by identity; a model reading a global that changed (rebound,
    changed in place, a number) gives another potential at the kept state: the next run
    warms up anew (with a warning) instead of continuing under the old model (whose compiled
    sampler held the old values, and whose eager run diverged everywhere)."""
    monkeypatch.setitem(_GLOBAL, "y", torch.full((20,), 3.0))
    monkeypatch.setitem(_GLOBAL, "noise", 1.0)
    kernel = NUTS(_reads_globals, compile=compiled, executor="quick")
    mcmc = MCMC(kernel, num_warmup=150, num_samples=150, num_chains=2, progress_bar=False,
                seed=0)  # fmt: skip
    mcmc.run()
    assert abs(float(mcmc.get_samples()["mu"].mean()) - 3.0) < 0.2
    for change, expected in [
        (lambda: _GLOBAL.__setitem__("y", torch.full((20,), -5.0)), -5.0),
        (lambda: _GLOBAL["y"].fill_(10.0), 10.0),
        (lambda: _GLOBAL.__setitem__("noise", 0.01), 10.0),
    ]:
        change()
        with pytest.warns(UserWarning, match="differs from the last run's.*warming up anew"):
            mcmc.run()
        mu = mcmc.get_samples()["mu"]
        assert abs(float(mu.mean()) - expected) < 0.2
        assert int(mcmc.get_extra_fields()["diverging"].sum()) == 0
    assert float(mu.std()) < 0.01  # noise 0.01: sd of the mean 0.01 / sqrt(20)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        mcmc.run()  # nothing changed: continues without a warning


def test_runs_continued_from_one_state_draw_anew_and_reproducibly():
    """run() after warmup(), again and again: each run starts at the same post-warmup state
    and draws a stream of its own (they were identical); the same sequence of calls on a
    new MCMC with the same seed gives the same draws."""

    def draws():
        mcmc, y = _mcmc(normal_model, num_warmup=40, num_samples=20), _data()
        mcmc.warmup(y)
        out = []
        for _ in range(3):
            mcmc.run(y)
            out.append(mcmc.get_samples()["mu"])
        return out

    first, again = draws(), draws()
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_a_model_that_branches_on_a_latent_value_runs_eagerly_chain_by_chain():
    """`if mu > 0:` can be neither vectorized nor compiled: the kernel (compile on) runs it
    eagerly, chain by chain, as Pyro would, with one warning; its draws are the torch.where
    model's and its posterior mean the exact one (by quadrature) within 4 MCSE."""

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        scale = 1.0 if mu > 0 else 2.0  # reads a latent value in Python
        pt.sample("y", dist.Normal(mu, scale), obs=y)

    def vectorized(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        pt.sample("y", dist.Normal(mu, torch.where(mu > 0, 1.0, 2.0)), obs=y)

    y = torch.tensor(1.5)
    draws = {}
    for name, fn, compile in [("branching", model, True), ("vectorized", vectorized, False)]:
        mcmc = MCMC(NUTS(fn, compile=compile), num_warmup=150, num_samples=300, num_chains=2,
                    progress_bar=False, seed=0)  # fmt: skip
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            mcmc.run(y)
        draws[name] = mcmc.get_samples(group_by_chain=True)["mu"]
        if name == "branching":
            assert [str(w.message)[:39] for w in seen] == [
                "the model reads latent values in Python"
            ]
            assert not mcmc.kernel.potential.compiled
    torch.testing.assert_close(draws["branching"], draws["vectorized"], rtol=0, atol=1e-10)

    def density(mu):
        return stats.norm.pdf(mu) * stats.norm.pdf(1.5, mu, 1.0 if mu > 0 else 2.0)

    mass = integrate.quad(density, -10, 0)[0] + integrate.quad(density, 0, 10)[0]
    mean = (integrate.quad(lambda m: m * density(m), -10, 0)[0]
            + integrate.quad(lambda m: m * density(m), 0, 10)[0]) / mass  # fmt: skip
    mu = draws["branching"].numpy()
    mcse = float(az.mcse(az.convert_to_dataset({"mu": mu}))["mu"])
    assert abs(mu.mean() - mean) < 4 * mcse


def test_a_log_density_that_branches_on_values_runs_chain_by_chain_named_at_its_site():
    # Pyro's Stable.log_prob interpolates near zero under `if idx.any():`, which vmap cannot
    # batch (its own error named neither the site nor the distribution): the chains run one
    # after another, and the warning names the site and the library's line
    def model():
        pt.sample("loc", dist.Normal(0.0, 1.0))
        pt.sample("s", dist.Stable(1.5, 0.0))

    mcmc = MCMC(NUTS(model), num_warmup=5, num_samples=5, num_chains=2, progress_bar=False)
    expected = (
        r"reads latent values in Python \(in the log density of site 's' \(Stable\.log_prob\), "
        r"at .*stable_log_prob\.py:\d+ .*reached from .*test_mcmc_api\.py:\d+ \(model\)\)"
        r".*a library's"
    )
    with pytest.warns(UserWarning, match=expected) as seen:
        mcmc.run()
    assert len(seen) == 1  # the kernel (compile on) tried no compile
    assert torch.isfinite(mcmc.get_samples()["s"]).all()


def test_dropout_in_training_mode_is_named_with_advice():
    # vmap's "called random operation while in randomness error mode" said nothing of why
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Dropout(0.5))

    def model(x):
        s = pt.sample("s", dist.HalfNormal(1.0))
        pt.sample("y", dist.Normal(net(x).sum(), s), obs=torch.tensor(0.5))

    mcmc = _mcmc(model, num_warmup=5, num_samples=5)
    with pytest.raises(ValueError, match=r"failed after site 's'.*random.*Dropout; call net\.eval"):
        mcmc.run(torch.ones(2))
    net.eval()
    mcmc.run(torch.ones(2))


def test_a_discrete_latent_site_that_cannot_be_summed_out_is_named():
    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        count = pt.sample("count", dist.Poisson(3.0))
        with pt.plate("n", y.shape[0]):
            pt.sample("y", dist.Normal(mu + count, 1.0), obs=y)

    mcmc = _mcmc(model, num_warmup=5, num_samples=5)
    with pytest.raises(ValueError, match="'count'.*discrete.*Poisson.*cannot list its values"):
        mcmc.run(_data())


def test_an_enumerate_annotation_changes_nothing():
    """Discrete sites with a finite support are summed out, annotated (Pyro's
    ``infer={"enumerate": "parallel"}``, NumPyro's ``config_enumerate``) or not, as
    Pyro's HMC enumerates them all (tests/test_enumeration.py checks the sums)."""

    def model(y, annotate):
        p = pt.sample("p", dist.Beta(1.0, 1.0))
        with pt.plate("n", y.shape[0]):
            infer = {"enumerate": "parallel"} if annotate else None
            z = pt.sample("z", dist.Bernoulli(p), infer=infer)
            pt.sample("y", dist.Normal(z, 1.0), obs=y)

    runs = []
    for annotate in (True, False):
        mcmc = _mcmc(model, num_warmup=5, num_samples=5)
        mcmc.run(_data(), annotate)
        runs.append(mcmc.get_samples()["p"])
    assert torch.equal(runs[0], runs[1])


def test_a_model_wrapped_in_trace_samples_as_the_model_does(float64):
    """The user's trace handler checks each site's parameters; inside the potential they
    are batched over chains (Uniform's low < high with a latent high), where the check
    read them in Python and the run failed as "the model reads latent values"."""

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 2.0))
        s = pt.sample("s", dist.HalfNormal(1.0))
        pt.sample("u", dist.Uniform(0.0, s + 3.0))
        with pt.plate("n", y.shape[0]):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)
        pt.sample("w", dist.Uniform(0.0, s + 10.0), obs=torch.tensor(2.0))

    runs = []
    for fn in (model, pt.handlers.trace(model)):
        mcmc = _mcmc(fn, num_warmup=30, num_samples=20)
        mcmc.run(_data())
        runs.append(mcmc.get_samples())
    for name in ("mu", "s", "u"):
        torch.testing.assert_close(runs[1][name], runs[0][name], rtol=0, atol=1e-12)


# -- Stan's windowed adaptation schedule --------------------------------------------------------
def stan_windows(num_warmup, init_buffer=75, term_buffer=50, base_window=25):
    """Stan's slow windows, ``[start, end)``, by stepping its ``windowed_adaptation`` counter.

    A transliteration of ``stan/mcmc/windowed_adaptation.hpp``: the first window is
    ``base_window`` long; at the end of each window the next one doubles, and it is stretched to
    the end of the slow phase when the window after it would reach past that end.
    """
    if num_warmup < 20:
        return []
    if init_buffer + base_window + term_buffer > num_warmup:
        init_buffer = int(0.15 * num_warmup)
        term_buffer = int(0.1 * num_warmup)
        base_window = num_warmup - (init_buffer + term_buffer)
    last = num_warmup - term_buffer - 1  # last iteration of the slow phase
    size, next_end = base_window, init_buffer + base_window - 1  # inclusive, as in Stan
    windows, start = [], init_buffer
    for counter in range(num_warmup):
        if counter != next_end:
            continue
        windows.append((start, counter + 1))
        start = counter + 1
        if next_end == last:
            break
        size *= 2
        next_end = counter + size
        if next_end != last and next_end + 2 * size >= last + 1:
            next_end = last
    return windows


def test_stan_windows_reference():
    """The transliteration reproduces CmdStan's documented default and short schedules."""
    assert stan_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert stan_windows(100) == [(15, 90)]


def test_warmup_windows_stan_defaults():
    assert warmup_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    # too short for 75 + 25 + 50: buffers scaled to 15% / 75% / 10%
    assert warmup_windows(100) == [(15, 90)]
    assert warmup_windows(60) == [(9, 54)]
    assert warmup_windows(19) == []


# Stan never stretches the first window, and stretches a window only when the one after it
# would run past the end of the slow phase.
@pytest.mark.parametrize(
    "num_warmup",
    [0, 19, 20, 37, 60, 100, 149, 150, 201, 250, 301, 350, 400, 450, 501, 700, 1000, 1234, 2000]
    + [151, 170, 199, 200, 300, 500, 900, 1700],
)
def test_warmup_windows_match_stan(num_warmup):
    assert warmup_windows(num_warmup) == stan_windows(num_warmup)


# -- dual averaging -----------------------------------------------------------------------------
def standard_normal(dim):
    def model():
        pt.sample("x", dist.Normal(torch.zeros(dim), 1.0).to_event(1))

    return model


@pytest.mark.parametrize("kernel", [NUTS, HMC])
def test_without_warmup_the_chains_run_at_the_given_step_size(kernel):
    # the step-size heuristic ran at set-up even without warmup, and its step size (4.0 on
    # a standard normal) was kept for the whole run: hundreds of divergences
    mcmc = MCMC(
        kernel(standard_normal(2), step_size=0.5, compile=False),
        num_warmup=0,
        num_samples=20,
        num_chains=2,
        progress_bar=False,
        seed=0,
    )
    mcmc.run(extra_fields=("step_size",))
    assert torch.equal(mcmc.get_extra_fields()["step_size"], torch.full((40,), 0.5))
    assert torch.equal(mcmc.last_state.step_size, torch.full((2,), 0.5))


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["nuts", "hmc"])
def test_dual_averaging_hits_target_accept_prob(kernel):
    """With a fixed (correct) metric, dual averaging runs through the whole warmup. Eager:
    each target is a compiled graph of its own (the compiled adaptation is the eager one,
    draw for draw: test_hmc_block_draws_what_one_transition_at_a_time_draws and
    tests/test_nuts_reference.py)."""
    model = standard_normal(10)
    step_sizes = {}
    for target in (0.65, 0.95):
        if kernel == "nuts":
            k = NUTS(model, target_accept_prob=target, adapt_mass_matrix=False, compile=False)
        else:
            # a trajectory of about a quarter period: no resonance on the standard normal
            k = HMC(model, trajectory_length=1.5, target_accept_prob=target,
                    adapt_mass_matrix=False, compile=False)  # fmt: skip
        mcmc = MCMC(k, num_warmup=300, num_samples=200, num_chains=4, progress_bar=False, seed=0)
        mcmc.run(extra_fields=("accept_prob",))
        accept = mcmc.get_extra_fields()["accept_prob"]
        assert abs(float(accept.mean()) - target) < 0.1, target
        step_sizes[target] = mcmc.last_state.step_size
    # a higher target needs smaller steps (leapfrog's energy error grows with the step size)
    assert (step_sizes[0.65] > 1.5 * step_sizes[0.95]).all()


@pytest.mark.slow
def test_windowed_adaptation_hits_target_accept_prob():
    """Full warmup (step size and windowed diagonal metric), NUTS's default target 0.8."""
    k = NUTS(standard_normal(50))
    mcmc = MCMC(k, num_warmup=300, num_samples=200, num_chains=4, progress_bar=False, seed=0)
    mcmc.run(extra_fields=("accept_prob",))
    accept = mcmc.get_extra_fields()["accept_prob"]
    assert abs(float(accept.mean()) - 0.8) < 0.1
    # the adapted diagonal metric estimates the unit variances
    inverse_mass = mcmc.last_state.inverse_mass
    assert inverse_mass.shape == (4, 50)
    assert abs(float(inverse_mass.mean()) - 1) < 0.1


@pytest.mark.parametrize("dense", [False, True], ids=["diag", "dense"])
def test_welford_batch_update_equals_one_at_a_time(dense):
    """The host-side batched update (Chan's combination) equals sequential Welford."""
    from probtorch.inference.mcmc.adaptation import (
        welford_final,
        welford_init,
        welford_update,
        welford_update_batch,
    )

    torch.manual_seed(0)
    draws = torch.randn(3, 40, 4) * torch.tensor([1.0, 2.0, 0.5, 3.0]) + 5.0
    sequential = welford_init(3, 4, dense, torch.float64)
    for i in range(40):
        sequential = welford_update(sequential, draws[:, i])
    batched = welford_init(3, 4, dense, torch.float64)
    for chunk in draws.split([7, 0, 20, 13], dim=1):
        batched = welford_update_batch(batched, chunk)
    for s, b in zip(sequential, batched):
        torch.testing.assert_close(b, s, rtol=1e-12, atol=1e-12)
    expected = torch.stack([torch.cov(d.T) for d in draws])
    if not dense:
        expected = expected.diagonal(dim1=-2, dim2=-1)
    n = 40
    regularized = n / (n + 5) * expected + 1e-3 * 5 / (n + 5) * (torch.eye(4) if dense else 1)
    torch.testing.assert_close(welford_final(batched), regularized, rtol=1e-12, atol=1e-12)


def test_inference_runs_with_one_intra_op_thread(monkeypatch):
    """MCMC.run uses PROBTORCH_NUM_THREADS threads (default 1) and restores torch's."""
    seen = []
    original = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), original(n)))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    seen.clear()
    y = torch.tensor([0.3, -0.1, 0.5])
    mcmc = MCMC(
        NUTS(known_noise_model, compile=False),
        num_warmup=5,
        num_samples=5,
        seed=0,
        progress_bar=False,
    )
    try:
        mcmc.run(y)
        assert seen == [1, 3] and torch.get_num_threads() == 3
    finally:
        original(before)


def _recording_progress(monkeypatch):
    """Replace the driver's progress bar by one that records what it is told: ``(phase,
    "compiling")`` for a compile notice, ``(phase, description)`` for each report."""
    from probtorch.inference.mcmc import mcmc as driver

    events = []

    class Recorder(driver._progress):
        def compiling(self):
            events.append((self.phase, "compiling"))
            super().compiling()

        def __call__(self, n, step_size, divergences):
            events.append((self.phase, self.bar.desc.removesuffix(": ")))  # tqdm's colon
            super().__call__(n, step_size, divergences)

    monkeypatch.setattr(driver, "_progress", Recorder)
    return events


@pytest.mark.parametrize("make_kernel", [NUTS, lambda model: HMC(model, num_steps=4)],
                         ids=["nuts", "hmc"])  # fmt: skip
def test_progress_bar_says_when_the_sampler_compiles(monkeypatch, make_kernel):
    """A compiled sampler's first transitions compile it (10-25 s on a machine's first run):
    the warmup bar says so until the first transitions are reported. A continued run of the
    same kernel compiles nothing and says nothing of it."""
    events = _recording_progress(monkeypatch)
    mcmc = MCMC(make_kernel(standard_normal(50)), num_warmup=20, num_samples=20, num_chains=4,
                seed=0)  # fmt: skip
    mcmc.run()
    assert events[0] == ("warmup", "compiling")
    assert events[1] == ("warmup", "warmup (compiling)")  # the first report, then reset
    assert set(events[2:]) <= {("warmup", "warmup"), ("sample", "sample")}
    assert ("sample", "sample") in events
    events.clear()
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.run()
    assert events and set(events) == {("sample", "sample")}
    events.clear()  # without warmup, the sampling bar says it (a new kernel: its own compile)
    MCMC(make_kernel(standard_normal(50)), num_warmup=0, num_samples=5, num_chains=4).run()
    assert events[:2] == [("sample", "compiling"), ("sample", "sample (compiling)")]


@pytest.mark.parametrize("kernel", [NUTS, HMC])
def test_progress_bar_says_nothing_of_compiling_without_compile(monkeypatch, kernel):
    events = _recording_progress(monkeypatch)
    mcmc = MCMC(kernel(standard_normal(3), compile=False), num_warmup=10, num_samples=10,
                seed=0)  # fmt: skip
    mcmc.run()
    assert events and set(events) == {("warmup", "warmup"), ("sample", "sample")}


def test_progress_bar_shows_step_size_and_divergences():
    from probtorch.inference.mcmc.mcmc import _progress

    with _progress("warmup", 10, True) as bar:
        bar.compiling()
        assert bar.bar.desc.removesuffix(": ") == "warmup (compiling)"
        bar(3, torch.tensor([0.5, 0.25]), 2)
        assert bar.bar.desc.removesuffix(": ") == "warmup" and bar.bar.n == 3
        assert bar.bar.postfix == "divergences=2, step_size=5.00e-01, 2.50e-01"
        bar(4, torch.tensor([0.5, 0.25]), 1)  # the next block (of this or the next window)
        assert bar.bar.n == 7 and bar.bar.postfix.startswith("divergences=3,")


def test_the_progress_bar_counts_the_phases_divergences_over_its_windows(monkeypatch):
    """The warmup's adaptation windows are segments of their own: the bar's count went
    back to the window's own at each one (the README says: the divergences so far)."""
    from probtorch.inference.mcmc import mcmc as mcmc_module

    shown = []
    call = mcmc_module._progress.__call__

    def spy(self, n, step_size, divergences):
        call(self, n, step_size, divergences)
        shown.append((self.phase, self.divergences))

    monkeypatch.setattr(mcmc_module._progress, "__call__", spy)

    def walled():  # a steep wall: trajectories that hit it diverge, in every window
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        pt.factor("wall", -1e4 * torch.relu(x - 1.0) ** 2)

    mcmc = MCMC(NUTS(walled, compile=False, max_tree_depth=4), num_warmup=150,
                num_samples=10, num_chains=2, progress_bar=False, seed=0)  # fmt: skip
    mcmc.warmup(collect_warmup=True)
    warmup = [count for phase, count in shown if phase == "warmup"]
    assert warmup == sorted(warmup)  # never goes back
    assert warmup[-1] == int(mcmc.get_extra_fields()["diverging"].sum()) > 0


# -- structured dense mass --------------------------------------------------------------------
COV_A = torch.tensor([[1.0, 1.8], [1.8, 4.0]], dtype=torch.float64)  # correlation 0.9
SCALE_B = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)


def _blocks_energy(v):
    """a ~ N(0, COV_A), b ~ N(0, SCALE_B^2) elementwise, c ~ N(0, 3^2)."""
    a, b, c = v["a"], v["b"], v["c"]
    return 0.5 * (a @ torch.linalg.inv(COV_A) @ a + ((b / SCALE_B) ** 2).sum() + (c / 3.0) ** 2)


BLOCKS_INIT = {"a": torch.zeros(4, 2, dtype=torch.float64),
               "b": torch.zeros(4, 3, dtype=torch.float64),
               "c": torch.zeros(4, dtype=torch.float64)}  # fmt: skip


def _blocks_model():
    pt.sample("a", dist.MultivariateNormal(torch.zeros(2, dtype=torch.float64), COV_A))
    pt.sample("b", dist.Normal(torch.zeros(3, dtype=torch.float64), SCALE_B).to_event(1))
    pt.sample("c", dist.Normal(torch.tensor(0.0, dtype=torch.float64), 3.0))


@pytest.mark.slow
def test_dense_mass_blocks_adapt_a_block_diagonal_metric():
    """``dense_mass=[("a",)]`` (NumPyro's form): a's 2x2 covariance is adapted jointly, the
    other coordinates on the diagonal, zeros between; the posterior is right."""
    kernel = NUTS(potential_fn=_blocks_energy, dense_mass=[("a",)], compile=False)
    mcmc = MCMC(kernel, num_warmup=250, num_samples=300, num_chains=4, seed=1,
                progress_bar=False)  # fmt: skip
    mcmc.run(init_params=BLOCKS_INIT)
    inverse_mass = mcmc.post_warmup_state.inverse_mass
    assert inverse_mass.shape == (4, 6, 6)
    outside = torch.ones(6, 6, dtype=torch.bool)
    outside[:2, :2] = False
    outside[range(6), range(6)] = False
    assert (inverse_mass[:, outside] == 0).all()
    # 35% of the exact (co)variances; the unadapted metric (identity) is 75% or more off
    # in the entries 1.8, 4 (a) and 4, 0.25 (b)
    mean_metric = inverse_mass.mean(0)
    torch.testing.assert_close(mean_metric[:2, :2], COV_A, rtol=0.35, atol=0.0)
    torch.testing.assert_close(mean_metric.diagonal()[2:5], SCALE_B**2, rtol=0.35, atol=0.0)
    samples = mcmc.get_samples(group_by_chain=True)
    exact = {"a": COV_A.diagonal().sqrt(), "b": SCALE_B, "c": torch.tensor(3.0)}
    for name, sd in exact.items():
        draws = samples[name].reshape(4, 300, -1)
        for j in range(draws.shape[-1]):
            column = draws[..., j]
            assert abs(float(column.mean())) < 4 * float(az.mcse(column.numpy())), (name, j)
        assert ((draws.std((0, 1)) / sd - 1).abs() < 0.10).all(), name
    assert float(az.rhat(samples["a"].numpy()[..., 0])) < 1.01


@pytest.mark.parametrize(
    ("dense_mass", "error", "match"),
    [
        ([("a", "z")], ValueError, r"dense_mass names \['z'\], which are not latent sites.*"
         r"\['a', 'b', 'c'\]"),
        ([("a",), ("b", "a")], ValueError, r"puts site\(s\) \['a'\] in more than one block"),
        ("a", TypeError, "list of tuples of latent site names"),
        ([("a",), ()], TypeError, "list of tuples of latent site names"),
        ([("a", "b", "a")], ValueError, r"puts site\(s\) \['a'\] in more than one block"),
    ],
)  # fmt: skip
def test_dense_mass_blocks_errors(dense_mass, error, match):
    with pytest.raises(error, match=match):
        MCMC(NUTS(_blocks_model, dense_mass=dense_mass, compile=False), num_warmup=1,
             num_samples=1, progress_bar=False).run()  # fmt: skip


def _regression(x, y):
    w = pt.sample("w", dist.Normal(0.0, 5.0))
    with pt.plate("n", x.shape[0]):
        pt.sample("y", dist.Normal(w * x, 0.3), obs=y)


def _regression_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, generator=g, dtype=torch.float64)
    return x, 2.0 * x + 0.3 * torch.randn(30, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("in_place", [False, True])
def test_a_second_run_on_other_data_warms_up_anew(in_place):
    """The state a run leaves is continued only with the same arguments: on new data (a
    new tensor, or the same one changed in place) the next run warms up anew, as a fresh
    MCMC does (before, it sampled from the old data's chains and energies: every
    transition diverged and the chains stayed at the old posterior)."""
    x, y = _regression_data()
    mcmc = _mcmc(_regression, num_warmup=100, num_samples=100)
    mcmc.run(x, y.clone() if in_place else y)
    other = -y
    if in_place:
        other = mcmc.kernel.potential.model_args[1]
        other.mul_(-1)
    mcmc.run(x, other)
    fresh = _mcmc(_regression, num_warmup=100, num_samples=100)
    fresh.run(x, -y)
    assert torch.equal(mcmc.get_samples()["w"], fresh.get_samples()["w"])
    assert not mcmc.get_extra_fields()["diverging"].any()
    assert float(mcmc.get_samples()["w"].mean()) == pytest.approx(-2.0, abs=0.1)


def test_a_state_set_by_the_user_continues_on_other_data_at_its_new_energy():
    """``post_warmup_state`` set by hand (or by ``warmup``) is continued on other data of
    the same shapes: no warmup, the adapted step size, and the potential energy and
    gradient at its positions computed under the new data."""
    x, y = _regression_data()
    mcmc = _mcmc(_regression, num_warmup=100, num_samples=200)
    mcmc.warmup(x, y)
    step = mcmc.post_warmup_state.step_size.clone()
    mcmc.run(x, -y, extra_fields=("step_size",))
    start = mcmc.post_warmup_state
    energy, grad = mcmc.kernel.potential.raw_value_and_grad(start.z)
    torch.testing.assert_close(start.potential_energy, energy, rtol=0, atol=0)
    torch.testing.assert_close(start.grad, grad, rtol=0, atol=0)
    torch.testing.assert_close(mcmc.get_extra_fields(group_by_chain=True)["step_size"][:, 0], step)
    assert not mcmc.get_extra_fields()["diverging"].any()
    assert float(mcmc.get_samples(True)["w"][:, 100:].mean()) == pytest.approx(-2.0, abs=0.1)

    # where the new data give the chains' positions no finite energy, a clear error
    bounded = _mcmc(_bounded_regression, num_warmup=100, num_samples=20)
    bounded.warmup(x, y, torch.tensor(100.0))
    with pytest.raises(ValueError, match=r"post_warmup_state: under this run's arguments.*"
                       r"not finite.*chain\(s\) \[0, 1\].*\['w'\]"):  # fmt: skip
        bounded.run(x, y, torch.tensor(1.0))  # the chains are near w = 2


def _bounded_regression(x, y, upper):
    w = pt.sample("w", dist.Normal(0.0, 5.0))
    pt.factor("below", torch.where(w < upper, 0.0, -math.inf))
    with pt.plate("n", x.shape[0]):
        pt.sample("y", dist.Normal(w * x, 0.3), obs=y)


def test_a_module_with_trainable_parameters_is_a_constant_of_the_compiled_sampler():
    """``pt.module`` with parameters that require grad (as Pyro, MCMC holds them fixed):
    the compiled quick path takes them as constants, without falling back, and draws
    what the eager sampler draws (before, the folded constants kept autograd history and
    the compile failed, then the fallback failed too)."""
    feature = torch.nn.Linear(1, 1)
    with torch.no_grad():
        feature.weight.fill_(2.0)
        feature.bias.fill_(0.5)
    x = torch.linspace(-1.0, 1.0, 10).unsqueeze(-1)
    y = 0.7 * (2.0 * x[:, 0] + 0.5) + 0.1 * torch.linspace(-1.0, 1.0, 10).sin()

    def model(x, y):
        w = pt.sample("w", dist.Normal(0.0, 1.0))
        h = pt.module("feature", feature)(x)[:, 0]
        with pt.plate("n", 10):
            pt.sample("y", dist.Normal(w * h, 0.1), obs=y)

    draws = []
    for compile in (True, False):
        mcmc = MCMC(NUTS(model, compile=compile, executor="quick"), num_warmup=50,
                    num_samples=50, num_chains=2, progress_bar=False, seed=0)  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mcmc.run(x, y)
        assert not [str(w.message) for w in caught if "could not" in str(w.message)]
        draws.append(mcmc.get_samples()["w"])
    torch.testing.assert_close(draws[0], draws[1], rtol=1e-10, atol=1e-10)
    assert feature.weight.requires_grad and float(feature.weight.detach()) == 2.0


def test_hmc_reports_no_tree_depth():
    """HMC builds no trees: its tree_depth was 0 in every draw's statistics."""
    mcmc = _mcmc(kernel=HMC, num_warmup=10, num_samples=10, num_steps=3)
    with pytest.raises(ValueError, match="tree_depth is NUTS's; HMC builds no trees"):
        mcmc.run(_vector_data(), extra_fields=("tree_depth",))
    mcmc.run(_vector_data(), extra_fields=("num_steps", "accept_prob"))
    stats = mcmc.to_inference_data().sample_stats
    assert "tree_depth" not in stats and {"n_steps", "acceptance_rate"} <= set(stats)


# -- kernel options a NumPyro or Stan user passes -----------------------------------------------
def test_inverse_mass_matrix_as_numpyro_blocks_equals_the_flat_array():
    """NumPyro's dict of blocks by site names gives the run its flat array does."""
    y = _vector_data()
    runs = []
    for given, dense in [
        ({("scale",): torch.tensor([2.0]), ("loc",): torch.tensor([1.0, 0.5, 3.0])}, False),
        (torch.tensor([1.0, 0.5, 3.0, 2.0]), False),
        ({("loc", "scale"): torch.diag(torch.tensor([1.0, 0.5, 3.0, 2.0]))}, True),
    ]:
        mcmc = _mcmc(
            vector_model,
            num_warmup=0,
            num_samples=10,
            inverse_mass_matrix=given,
            dense_mass=dense,
            adapt_mass_matrix=False,
            step_size=0.3,
        )
        mcmc.run(y)
        runs.append(mcmc)
    expected = torch.tensor([1.0, 0.5, 3.0, 2.0])
    assert torch.equal(runs[0].last_state.inverse_mass, expected.expand(2, 4))
    torch.testing.assert_close(runs[0].get_samples()["loc"], runs[1].get_samples()["loc"])
    assert torch.equal(runs[2].last_state.inverse_mass[0], torch.diag(expected))
    # NumPyro's form under structured dense_mass: a matrix per dense block, a vector else
    block = torch.tensor([[1.0, 0.2, 0.0], [0.2, 0.5, 0.1], [0.0, 0.1, 3.0]])
    mcmc = _mcmc(
        vector_model,
        num_warmup=0,
        num_samples=5,
        dense_mass=[("loc",)],
        inverse_mass_matrix={("loc",): block, ("scale",): torch.tensor([2.0])},
        adapt_mass_matrix=False,
    )
    mcmc.run(y)
    assert torch.equal(mcmc.last_state.inverse_mass[0], torch.block_diag(block, torch.eye(1) * 2))


def test_inverse_mass_matrix_one_per_chain():
    """One diagonal per chain (a run's last_state.inverse_mass), also when num_chains
    equals the dims; (1, D) is every chain's."""
    y = _vector_data()
    per_chain = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0],
                              [1.0, 1.0, 2.0, 2.0], [2.0, 2.0, 1.0, 1.0]])  # fmt: skip
    for given, chains in [(per_chain, 4), (per_chain[:3], 3), (per_chain[:1], 2)]:
        mcmc = _mcmc(
            vector_model,
            num_chains=chains,
            num_warmup=0,
            num_samples=3,
            inverse_mass_matrix=given,
            adapt_mass_matrix=False,
        )
        mcmc.run(y)
        assert torch.equal(mcmc.last_state.inverse_mass, given.expand(chains, 4))


@pytest.mark.parametrize(
    "given, dense, match",
    [
        ({("nope",): torch.ones(1)}, False, r"names \['nope'\], which are not latent sites"),
        ({("loc",): torch.ones(2)}, False, r"\('loc',\)\] must have shape \(3,\)"),
        ({("loc",): torch.ones(2)}, True, r"\('loc',\)\] must have shape \(3,\) or \(3, 3\)"),
        ({("loc",): torch.ones(3), ("loc", "scale"): torch.ones(4)}, False, "more than one"),
        (torch.eye(4) + 0.5, False, r"got \(4, 4\).*pass dense_mass=True"),
        (torch.tensor([1.0, -1.0, 1.0, 1.0]), False, r"must be positive, got entries \[-1.0\]"),
        (torch.tensor([1.0, float("nan"), 1.0, 1.0]), False, "not finite"),
        (torch.diag(torch.tensor([1.0, 1.0, 1.0, -2.0])), True, "positive definite"),
    ],
    ids=["unknown-site", "block-shape", "dense-block-shape", "site-twice",
         "matrix-for-diagonal", "negative", "nan", "not-positive-definite"],
)  # fmt: skip
def test_an_inverse_mass_matrix_the_sampler_cannot_use_is_refused(given, dense, match):
    # each of these ran: a negative or NaN entry froze every chain (all transitions
    # divergent), a matrix for a diagonal metric became one diagonal per chain
    mcmc = _mcmc(
        vector_model,
        num_chains=4,
        num_warmup=0,
        num_samples=5,
        inverse_mass_matrix=given,
        dense_mass=dense,
        adapt_mass_matrix=False,
    )
    with pytest.raises(ValueError, match=match):
        mcmc.run(_vector_data())


def test_find_heuristic_step_size_false_keeps_the_step_size_through_the_windows():
    def heuristic_runs(**options):
        kernel = NUTS(vector_model, step_size=0.05, compile=False, **options)
        calls, reset = [], kernel.reset_step_size
        kernel.reset_step_size = lambda state: calls.append(1) or reset(state)
        mcmc = MCMC(kernel, num_warmup=150, num_samples=5, num_chains=2, progress_bar=False)
        mcmc.run(_vector_data())
        return len(calls)

    # Stan's heuristic runs at set-up and at the end of the one slow window of 150 warmup
    # draws; NumPyro's flag turns it off everywhere (it ran at the window's end)
    assert heuristic_runs() == 2
    assert heuristic_runs(find_heuristic_step_size=False) == 0


@pytest.mark.parametrize(
    "kernel, options, error, match",
    [
        (HMC, {"max_steps": 0}, ValueError, "max_steps must be >= 1"),  # it hung
        (NUTS, {"max_delta_energy": float("nan")}, ValueError, "max_delta_energy"),
        (NUTS, {"max_delta_energy": -1.0}, ValueError, "max_delta_energy"),
        (NUTS, {"max_delta_energy": 0.0}, ValueError, "max_delta_energy"),
        (NUTS, {"step_size": float("inf")}, ValueError, "positive and finite"),
        (HMC, {"num_steps": 2.5}, TypeError, "num_steps must be an integer"),
        (NUTS, {"max_tree_depth": 3.5}, TypeError, "max_tree_depth must be an integer"),
        (NUTS, {"max_tree_depth": "3"}, TypeError, "max_tree_depth must be an integer"),
    ],
)
def test_kernel_options_out_of_their_domain_are_refused(kernel, options, error, match):
    with pytest.raises(error, match=match):
        kernel(vector_model, **options)


def test_integer_options_take_numpy_integers_and_extra_fields_one_name():
    assert NUTS(vector_model, max_tree_depth=np.int64(4)).max_tree_depth == 4
    assert NUTS(vector_model, max_tree_depth=6.0).max_tree_depth == 6
    assert HMC(vector_model, num_steps=np.int32(3)).num_steps == 3
    assert NUTS(vector_model, max_delta_energy=float("inf")).max_delta_energy == float("inf")
    mcmc = _mcmc(vector_model, num_warmup=5, num_samples=5)
    mcmc.run(_vector_data(), extra_fields="accept_prob")  # its letters were names before
    assert mcmc.get_extra_fields()["accept_prob"].shape == (10,)


# -- trainable tensors, shared kernels, factors, reruns ---------------------------------------
@pytest.mark.parametrize("kernel, options", [(NUTS, {}), (HMC, {"num_steps": 4})])
def test_eager_samplers_hold_the_models_trainable_tensors_constant(kernel, options):
    """A ``pt.param`` and an ``nn.Linear`` in a closure require grad: the eager samplers
    take them as constants (before, autograd chained every leapfrog step into one graph
    that grew with the run, and the draws, statistics and states required grad)."""
    net = torch.nn.Linear(3, 1)
    x, y = torch.randn(6, 3), torch.randn(6)

    def model(x, y):
        s = pt.param("s", torch.tensor(2.0), constraint=dist.constraints.positive)
        b = pt.sample("b", dist.Normal(0.0, s))
        pt.deterministic("bs", b * s)
        with pt.plate("n", 6):
            pt.sample("y", dist.Normal(net(x).squeeze(-1) * b, 1.0), obs=y)

    mcmc = MCMC(kernel(model, compile=False, **options), num_warmup=10, num_samples=10,
                num_chains=2, progress_bar=False, seed=0)  # fmt: skip
    mcmc.run(x, y, extra_fields=("potential_energy", "energy", "step_size"))
    outputs = {**mcmc.get_samples(), **mcmc.get_extra_fields()}
    outputs.update({f"last_state.{k}": v for k, v in mcmc.last_state._asdict().items()})
    outputs.update({f"post_warmup_state.{k}": v
                    for k, v in mcmc.post_warmup_state._asdict().items()})  # fmt: skip
    carrying = [k for k, v in outputs.items() if v.requires_grad or v.grad_fn is not None]
    assert carrying == []
    mcmc.get_samples()["bs"].numpy()  # no detach needed
    assert mcmc.to_inference_data().log_likelihood["y"].shape == (2, 10, 6)


def test_mcmc_reads_the_params_an_svi_fitted_in_the_model():
    """Fit a model's ``pt.param`` by SVI, then sample its latent sites by NUTS (type-II
    maximum likelihood, then MCMC): the run, its deterministic sites and its log likelihood
    read the fitted value, as Pyro's one param store gives it (they read the initial
    value, 1, from the default store: a posterior sd of 1/sqrt(n) for s/sqrt(n)). Inside
    ``pt.param_scope(store)`` the chosen store is read instead."""
    from probtorch.inference import SVI, Trace_ELBO

    gen = torch.Generator().manual_seed(0)
    y = 3.0 + 2.0 * torch.randn(50, generator=gen)

    def model(y):
        s = pt.param("s", torch.tensor(1.0), constraint=dist.constraints.positive)
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        pt.deterministic("mu_over_s", mu / s)
        with pt.plate("data", y.shape[0]):
            pt.sample("y", dist.Normal(mu, s), obs=y)

    def guide(y):
        pt.sample("mu", dist.Delta(pt.param("loc", torch.tensor(0.0))))

    svi = SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO())
    for _ in range(400):
        svi.step(y)
    s = float(svi.get_params()["s"])
    assert abs(s - float(y.std())) < 0.1  # the maximum-likelihood scale, about 2
    mcmc = MCMC(NUTS(model, compile=False), num_warmup=200, num_samples=1000, num_chains=2,
                progress_bar=False, seed=0)  # fmt: skip
    mcmc.run(y)
    draws = mcmc.get_samples()
    exact_sd = 1.0 / math.sqrt(50 / s**2 + 1 / 100)
    ess = float(az.ess(mcmc.get_samples(group_by_chain=True)["mu"].numpy()))
    # the sd's relative standard error is about 1 / sqrt(2 ESS)
    assert abs(float(draws["mu"].std()) / exact_sd - 1) < 4 / math.sqrt(2 * ess)
    torch.testing.assert_close(draws["mu_over_s"], draws["mu"] / s)
    log_lik = mcmc.to_inference_data().log_likelihood["y"].values  # (chain, draw, 50)
    mu = mcmc.get_samples(group_by_chain=True)["mu"].numpy()[..., None]
    expected = stats.norm(mu, s).logpdf(y.numpy())
    np.testing.assert_allclose(log_lik, expected, rtol=1e-4)
    # a potential built by the user reads them too (helper-60: it read the initial value)
    from probtorch.inference import initialize_model

    potential, _ = initialize_model(model, (y,), compile=False)
    mu = torch.tensor([[2.5]])
    expected = -(stats.norm(0.0, 10.0).logpdf(2.5) + stats.norm(2.5, s).logpdf(y.numpy()).sum())
    np.testing.assert_allclose(float(potential(mu).detach()), expected, rtol=1e-5)
    assert "s" not in pt.get_param_store()
    store = pt.ParamStore()
    with pt.param_scope(store):
        chosen = MCMC(NUTS(model, compile=False), num_warmup=100, num_samples=100,
                      progress_bar=False, seed=0)  # fmt: skip
        chosen.run(y)
    assert float(store["s"].detach()) == 1.0  # created there at its initial value and read there


def test_each_mcmc_exports_its_own_run_with_a_shared_kernel():
    """Two MCMCs on one kernel: the first's export keeps its own data and log likelihood
    after the second ran (before, both read the kernel's latest potential)."""
    y1, y2 = _data(6, seed=1), _data(9, seed=2) - 3.0
    kernel = NUTS(known_noise_model, compile=False)
    first = MCMC(kernel, num_warmup=30, num_samples=20, num_chains=2, progress_bar=False, seed=0)
    first.run(y1)
    before = first.to_inference_data()
    second = MCMC(kernel, num_warmup=30, num_samples=20, num_chains=2, progress_bar=False, seed=0)
    second.run(y2)
    after = first.to_inference_data()
    np.testing.assert_array_equal(after.observed_data["y"].values, y1.numpy())
    ll_before, ll_after = before.log_likelihood["y"].values, after.log_likelihood["y"].values
    np.testing.assert_array_equal(ll_after, ll_before)
    assert second.to_inference_data().observed_data["y"].shape == (9,)


def test_factor_sites_are_in_the_log_likelihood_as_in_numpyro():
    """A likelihood written ``pt.factor("ll", logp)`` in a plate counts pointwise in the
    exported log likelihood (NumPyro's factor is an observed site), so ``az.loo`` runs; it
    observes nothing, so it stays out of observed_data."""
    y = _data(6)

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 2.0))
        with pt.plate("n", 6):
            pt.factor("ll", dist.Normal(mu, NOISE).log_prob(y))

    mcmc = MCMC(NUTS(model, compile=False), num_warmup=30, num_samples=20, num_chains=2,
                progress_bar=False, seed=0)  # fmt: skip
    mcmc.run(y)
    idata = mcmc.to_inference_data()
    assert "observed_data" not in idata.groups()
    ll = idata.log_likelihood["ll"]
    assert ll.dims == ("chain", "draw", "n")
    mu = mcmc.get_samples(group_by_chain=True)["mu"]
    np.testing.assert_allclose(ll.values, dist.Normal(mu[..., None], NOISE).log_prob(y).numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert np.isfinite(az.loo(idata).elpd_loo)
    # a potential_fn's own factor site is the whole density, no likelihood
    kernel = NUTS(potential_fn=lambda v: 0.5 * (v["x"] ** 2).sum(), compile=False)
    mcmc = MCMC(kernel, num_warmup=10, num_samples=10, progress_bar=False, seed=0)
    mcmc.run(init_params={"x": torch.zeros(2)})
    assert "log_likelihood" not in mcmc.to_inference_data().groups()


def test_a_kept_state_of_other_num_chains_warms_up_anew(monkeypatch):
    """``num_chains`` changed after a run: the state the run kept has the old count, so the
    next run warms up anew with a warning (before, an error about interrupted sequential
    chains); a state the user set still has to fit."""
    y = _vector_data()
    mcmc = _mcmc(num_warmup=20, num_samples=10)
    mcmc.run(y)
    mcmc.num_chains = 3
    calls = _segments(monkeypatch, mcmc.kernel)
    with pytest.warns(UserWarning, match=r"num_chains=3, but the post_warmup_state kept from "
                      r"the previous run has 2 chains: warming up anew"):  # fmt: skip
        mcmc.run(y)
    assert calls[-1] == (10, False) and len(calls) > 1  # warmup segments, then sampling
    assert mcmc.get_samples(group_by_chain=True)["loc"].shape == (3, 10, 3)
    mcmc.post_warmup_state = mcmc.last_state
    mcmc.num_chains = 2
    with pytest.raises(ValueError, match="post_warmup_state has 3 chains but this MCMC runs "
                       "num_chains=2"):  # fmt: skip
        mcmc.run(y)


def test_a_continued_run_says_where_warmup_settings_changed_since_the_adaptation():
    """A rerun with the same arguments continues the adapted state without warmup; where
    ``num_warmup`` or a kernel's adaptation option changed since, it says so (before, the
    new settings were silently unused); a state the user set continues silently."""
    y = _vector_data()
    mcmc = _mcmc(num_warmup=20, num_samples=10)
    mcmc.run(y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(y)  # nothing changed
    mcmc.num_warmup = 200
    mcmc.kernel.target_accept_prob = 0.95
    with pytest.warns(UserWarning, match=r"num_warmup=200, target_accept_prob=0.95 changed "
                      r"since post_warmup_state was adapted.*continues from it without warmup"
                      r".*mcmc.post_warmup_state = None"):  # fmt: skip
        mcmc.run(y)
    mcmc.post_warmup_state = mcmc.post_warmup_state
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcmc.run(y)


@pytest.mark.parametrize("prob", [-0.2, 0.0, 1.0, 1.5, float("nan")])
def test_print_summary_refuses_a_prob_outside_0_1(vector_run, prob):
    mcmc, _ = vector_run
    with pytest.raises(ValueError, match=r"prob .*must lie in \(0, 1\), got"):
        mcmc.print_summary(prob=prob)


def test_numpyro_extra_field_names():
    """NumPyro's ``adapt_state.step_size`` is the step size each draw used, under its name;
    its ``mean_accept_prob`` is the running mean of ``accept_prob`` over the phase's
    transitions (thinned ones included), in the sample stats where it was asked for, as
    ArviZ's from_numpyro keeps it."""
    mcmc = _mcmc(num_warmup=20, num_samples=10)
    mcmc.run(_vector_data(), extra_fields=("adapt_state.step_size", "step_size"))
    fields = mcmc.get_extra_fields()
    assert set(fields) == {"diverging", "adapt_state.step_size", "step_size"}
    assert torch.equal(fields["adapt_state.step_size"], fields["step_size"])
    assert "mean_accept_prob" not in mcmc.to_inference_data().sample_stats
    asked = ("accept_prob", "mean_accept_prob")
    mcmc = _mcmc(num_warmup=20, num_samples=10, seed=4)
    mcmc.run(_vector_data(), extra_fields=asked)
    fields = mcmc.get_extra_fields(group_by_chain=True)
    accept = fields["accept_prob"]
    running = accept.cumsum(1) / torch.arange(1, 11, dtype=accept.dtype)
    torch.testing.assert_close(fields["mean_accept_prob"], running, rtol=1e-12, atol=0)
    stats = mcmc.to_inference_data().sample_stats
    np.testing.assert_allclose(stats["mean_accept_prob"].values, running.numpy(), rtol=1e-12)
    thinned = _mcmc(num_warmup=20, num_samples=10, seed=4, thinning=3)
    thinned.run(_vector_data(), extra_fields=asked)
    torch.testing.assert_close(
        thinned.get_extra_fields(group_by_chain=True)["mean_accept_prob"],
        running[:, 3::3], rtol=0, atol=0)  # fmt: skip
    warm = _mcmc(num_warmup=20, num_samples=10, seed=4)
    warm.warmup(_vector_data(), collect_warmup=True, extra_fields=asked)
    warm_fields = warm.get_extra_fields(group_by_chain=True)
    warm_accept = warm_fields["accept_prob"]
    warm_running = warm_accept.cumsum(1) / torch.arange(1, 21, dtype=warm_accept.dtype)
    torch.testing.assert_close(warm_fields["mean_accept_prob"], warm_running, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match=r"unknown extra_fields \['mean_accpt_prob'\]; "
                       r"available: .*'mean_accept_prob'"):  # fmt: skip
        mcmc.run(_vector_data(), extra_fields=("mean_accpt_prob",))


def test_divergences_without_warmup_advise_a_warmup_or_a_smaller_step_size():
    fixed = {"num_warmup": 0, "num_samples": 10, "step_size": 30.0}
    with pytest.warns(UserWarning, match=r"diverged.*no warmup adapted the step size: the "
                      r"chains ran at step_size=30; warm up \(num_warmup > 0\) or pass a "
                      r"smaller step_size"):  # fmt: skip
        _mcmc(**fixed).run(_vector_data())


def test_a_numpyro_rng_key_as_the_first_argument_of_run_is_explained():
    mcmc = _mcmc(normal_model, num_warmup=5, num_samples=5)
    with pytest.raises(TypeError, match=r"takes 1 positional argument but 2 were given \(the "
                       r"first argument, 0, looks like NumPyro's rng key.*MCMC\(\.\.\., "
                       r"seed=\.\.\.\)"):  # fmt: skip
        mcmc.run(0, _data())
    with pytest.raises(TypeError, match="positional argument") as caught:
        mcmc.run(_data(), _data())  # no key: the model's own error
    assert "rng key" not in str(caught.value)


def test_init_params_where_an_observation_leaves_its_support_are_named():
    """The support of ``y`` depends on ``mu``: at ``mu = 5`` the data lie outside it, and
    the error says that init_params put it there."""

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("n", 2):
            pt.sample("y", dist.Uniform(mu - 1.0, mu + 1.0), obs=y)

    mcmc = _mcmc(model, num_warmup=5, num_samples=5)
    with pytest.raises(ValueError, match=r"at init_params \(chain 0\): .*site 'y'.*outside "
                       r"the support"):  # fmt: skip
        mcmc.run(torch.tensor([0.0, 0.5]), init_params={"mu": torch.tensor(5.0)})


def test_to_inference_data_groups_dims_and_coords_as_from_numpyro():
    """(review helper-58) coords reach sample_stats (its chains were 0..C-1 beside the
    posterior's labels: an xarray where() across groups dropped every chain); a
    deterministic site's plate dim is named, by its event_dim or by the plates' sizes
    (a (J, 2) value in plate J had no J); constant_data, predictions,
    predictions_constant_data, pred_dims and log_likelihood=False as from_numpyro's; dims
    and coords that do not fit are refused naming the site; a run with no draws is
    refused by the summaries instead of giving empty ones."""

    def model(y):
        mu = pt.sample("mu", dist.Normal(torch.zeros(2), 5.0).to_event(1))
        with pt.plate("J", len(y)):
            th = pt.sample("th", dist.Normal(0.0, 1.0))
            pt.deterministic("pair", torch.stack([th + mu[0], th + mu[1]], -1))
            pt.deterministic("pair1", torch.stack([th, th], -1)[..., :1], event_dim=1)
            pt.sample("y", dist.Normal(th, 1.0), obs=y)

    mcmc = MCMC(NUTS(model, compile=False), num_warmup=30, num_samples=20, num_chains=2,
                seed=0, progress_bar=False)  # fmt: skip
    mcmc.run(torch.arange(6.0))
    idata = mcmc.to_inference_data(coords={"chain": ["a", "b"]})
    assert idata.sample_stats.chain.values.tolist() == ["a", "b"]
    kept = idata.posterior.th.where(idata.sample_stats.diverging == False)  # noqa: E712
    assert dict(kept.sizes) == {"chain": 2, "draw": 20, "J": 6}
    assert idata.posterior.pair.dims == ("chain", "draw", "J", "pair_dim_1")
    assert idata.posterior.pair1.dims == ("chain", "draw", "J", "pair1_dim_1")
    full = mcmc.to_inference_data(
        dims={"x": ["J"]},
        constant_data={"x": torch.arange(6.0)},
        predictions={"y": torch.zeros(40, 3)},
        predictions_constant_data={"x_new": [1.0, 2.0, 3.0]},
        pred_dims={"y": ["new"], "x_new": ["new"]},
        log_likelihood=False,
    )
    assert "log_likelihood" not in full.groups()
    assert full.constant_data.x.dims == ("J",)
    assert full.predictions.y.dims == ("chain", "draw", "new")
    assert full.predictions_constant_data.x_new.dims == ("new",)
    refused = [
        ({"dims": {"th": ["j", "extra"]}}, r"dims for 'th' in posterior name 2 dims.*has 1"),
        ({"coords": {"J": [0, 1, 2]}}, r"coords\['J'\] has 3 values.*'th' in posterior has size 6"),
        ({"dims": {"nosuch": ["a"]}}, r"dims names \['nosuch'\], which no group holds"),
        ({"coords": {"chain": [1, 2, 3]}}, r"coords\['chain'\] has 3 values for the run's 2"),
    ]
    for options, message in refused:
        with pytest.raises(ValueError, match=message):
            mcmc.to_inference_data(**options)
    only_warmup = MCMC(NUTS(model, compile=False), num_warmup=10, num_samples=10,
                       progress_bar=False, seed=0)  # fmt: skip
    only_warmup.warmup(torch.arange(6.0))
    for summary in (only_warmup.print_summary, only_warmup.to_inference_data,
                    only_warmup.diagnostics):  # fmt: skip
        with pytest.raises(RuntimeError, match="kept no draws"):
            summary()


def test_a_deterministic_broadcast_along_a_plate_keeps_its_plate_dims():
    """A (4, 1) deterministic inside plates groups (4, dim -2) and items (3, dim -1) is
    broadcast along items: its first dim is named groups, as a sample site of that shape
    (it was read as two event dims: no plate name)."""
    from probtorch.inference.mcmc.diagnostics import site_dims

    def model():
        with pt.plate("groups", 4, dim=-2):
            g = pt.sample("g", dist.Normal(0.0, 1.0))
            with pt.plate("items", 3, dim=-1):
                pt.deterministic("d", g * 2.0)
                pt.sample("y", dist.Normal(g, 1.0), obs=torch.zeros(4, 3))

    tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace()
    assert site_dims(tr["g"]) == ["groups", "g_dim_1"]
    assert site_dims(tr["d"]) == ["groups", "d_dim_1"]
