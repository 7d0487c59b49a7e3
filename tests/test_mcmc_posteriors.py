"""NUTS and HMC against closed-form (conjugate) posteriors.

Each case runs 4 chains with a fixed seed in float64, compiled as users run them (the
suite's executor, see conftest.py), and checks, per scalar: the posterior mean within 4
Monte Carlo standard errors of the exact mean (MCSE = exact sd / sqrt(bulk ESS)), the sd
within 10% of the exact sd, R-hat < 1.01, enough effective draws for those tolerances to
mean something, and no divergences.
"""

import math
from dataclasses import dataclass

import arviz as az
import numpy as np
import pytest
import torch
from scipy import special, stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import HMC, MCMC, NUTS

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("float64")]

NUM_CHAINS = 4
NUM_WARMUP = 500
NUM_SAMPLES = 1000
# With an ESS for the sd (ArviZ's method="sd") of at least 800, the sd of a Gaussian-like
# posterior has a relative Monte Carlo error of about sqrt(1 / (2 * 800)) = 2.5%, so the 10% sd
# tolerance is 4 standard errors. A bulk-ESS floor keeps a stuck sampler (huge MCSE) from
# passing the mean check. (These runs give ESS of 1200-3700.)
MIN_ESS = 800
MEAN_MCSES = 4.0
SD_RTOL = 0.10
MAX_RHAT = 1.01


@dataclass
class Exact:
    """Exact posterior mean and sd per site (arrays of the site's shape)."""

    mean: dict
    sd: dict


def _check_posterior(mcmc: MCMC, exact: Exact, max_divergences: int = 0) -> None:
    samples = mcmc.get_samples(group_by_chain=True)
    for name in exact.mean:
        draws = samples[name].numpy()
        C, S = draws.shape[:2]
        assert (C, S) == (NUM_CHAINS, NUM_SAMPLES)
        flat = draws.reshape(C, S, -1)
        means = np.asarray(exact.mean[name], dtype=np.float64).reshape(-1)
        sds = np.asarray(exact.sd[name], dtype=np.float64).reshape(-1)
        assert flat.shape[2] == means.size, name
        for i in range(flat.shape[2]):
            chains = flat[:, :, i]
            label = f"{name}[{i}]"
            ess = float(az.ess(chains, method="bulk"))
            rhat = float(az.rhat(chains))
            mcse = sds[i] / math.sqrt(ess)
            assert ess >= MIN_ESS, f"{label}: bulk ESS {ess:.0f}"
            ess_sd = float(az.ess(chains, method="sd"))
            assert ess_sd >= MIN_ESS, f"{label}: ESS for the sd {ess_sd:.0f}"
            assert rhat < MAX_RHAT, f"{label}: R-hat {rhat:.4f}"
            error = abs(chains.mean() - means[i])
            assert error < MEAN_MCSES * mcse, (
                f"{label}: mean {chains.mean():.5f}, exact {means[i]:.5f}, "
                f"error {error / mcse:.2f} MCSE"
            )
            sd = chains.std(ddof=1)
            assert abs(sd - sds[i]) < SD_RTOL * sds[i], f"{label}: sd {sd:.5f}, exact {sds[i]:.5f}"
    diverging = mcmc.get_extra_fields()["diverging"]
    assert diverging.shape == (NUM_CHAINS * NUM_SAMPLES,)
    assert int(diverging.sum()) <= max_divergences


def _run(kernel, *args, seed=0, extra_fields=()):
    mcmc = MCMC(
        kernel,
        num_warmup=NUM_WARMUP,
        num_samples=NUM_SAMPLES,
        num_chains=NUM_CHAINS,
        progress_bar=False,
        seed=seed,
    )
    mcmc.run(*args, extra_fields=extra_fields)
    return mcmc


# -- (a) normal mean, known noise -------------------------------------------------------------
PRIOR_LOC, PRIOR_SCALE, NOISE = 1.0, 2.0, 0.5


def normal_mean(y):
    mu = pt.sample("mu", dist.Normal(PRIOR_LOC, PRIOR_SCALE))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(mu, NOISE), obs=y)


def _normal_mean_case():
    g = torch.Generator().manual_seed(10)
    y = 2.0 + NOISE * torch.randn(12, generator=g)
    precision = PRIOR_SCALE**-2 + y.shape[0] / NOISE**2
    mean = (PRIOR_LOC / PRIOR_SCALE**2 + float(y.sum()) / NOISE**2) / precision
    return (y,), Exact({"mu": mean}, {"mu": precision**-0.5})


def test_normal_mean_known_noise():
    args, exact = _normal_mean_case()
    _check_posterior(_run(NUTS(normal_mean), *args), exact)


def test_hmc_fixed_steps_normal_mean():
    args, exact = _normal_mean_case()
    mcmc = _run(HMC(normal_mean, num_steps=5), *args, extra_fields=("num_steps",))
    _check_posterior(mcmc, exact)
    assert (mcmc.get_extra_fields()["num_steps"] == 5).all()


# -- (b) beta-binomial -----------------------------------------------------------------------
def beta_binomial(total, k):
    p = pt.sample("p", dist.Beta(2.0, 3.0))
    pt.sample("k", dist.Binomial(total, p), obs=k)


def test_beta_binomial():
    total, k = torch.tensor(40.0), torch.tensor(13.0)
    post = stats.beta(2.0 + 13.0, 3.0 + 40.0 - 13.0)
    exact = Exact({"p": post.mean()}, {"p": post.std()})
    _check_posterior(_run(NUTS(beta_binomial), total, k), exact)


# -- (c) gamma-Poisson -----------------------------------------------------------------------
def gamma_poisson(y):
    rate = pt.sample("rate", dist.Gamma(3.0, 0.5))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Poisson(rate), obs=y)


def test_gamma_poisson():
    y = torch.tensor([4.0, 7.0, 2.0, 5.0, 6.0, 3.0, 8.0, 4.0])
    post = stats.gamma(3.0 + float(y.sum()), scale=1.0 / (0.5 + y.shape[0]))
    exact = Exact({"rate": post.mean()}, {"rate": post.std()})
    _check_posterior(_run(NUTS(gamma_poisson), y), exact)


# -- (c') von Mises location, known concentration ---------------------------------------------
VM_PRIOR_LOC, VM_PRIOR_CONC, VM_CONC = -2.5, 0.5, 0.8


def von_mises_location(x):
    mu = pt.sample("mu", dist.VonMises(VM_PRIOR_LOC, VM_PRIOR_CONC))
    pt.deterministic("cos_mu", torch.cos(mu))
    pt.deterministic("sin_mu", torch.sin(mu))
    with pt.plate("n", x.shape[0]):
        pt.sample("x", dist.VonMises(mu, VM_CONC), obs=x)


@pytest.mark.parametrize("circular_reparam", [False, True], ids=["angle", "CircularReparam"])
def test_von_mises_location_across_the_branch_cut(circular_reparam):
    """The posterior is VonMises(atan2(S, C), sqrt(C^2 + S^2)) with C, S the prior's and the
    data's weighted cosines and sines; it is centred near pi, so it straddles the cut at
    +-pi. Checked through cos and sin of the draws (whose exact moments are Bessel ratios),
    and the draws are angles in [-pi, pi]. With ``CircularReparam`` (NumPyro's), NUTS
    samples the unwrapped angle on the real line instead of a point of the plane."""
    from probtorch.reparam import CircularReparam

    model = von_mises_location
    if circular_reparam:
        model = pt.handlers.reparam(model, config={"mu": CircularReparam()})
    x = torch.tensor([2.9, -3.0, 2.6, 3.1, -2.7, 2.2])
    c = VM_PRIOR_CONC * math.cos(VM_PRIOR_LOC) + VM_CONC * float(torch.cos(x).sum())
    s = VM_PRIOR_CONC * math.sin(VM_PRIOR_LOC) + VM_CONC * float(torch.sin(x).sum())
    loc, conc = math.atan2(s, c), math.hypot(c, s)
    a1 = special.ive(1, conc) / special.ive(0, conc)
    a2 = special.ive(2, conc) / special.ive(0, conc)
    mean = {"cos_mu": a1 * math.cos(loc), "sin_mu": a1 * math.sin(loc)}
    second = {
        "cos_mu": (1 + a2 * math.cos(2 * loc)) / 2,
        "sin_mu": (1 - a2 * math.cos(2 * loc)) / 2,
    }
    exact = Exact(mean, {k: math.sqrt(second[k] - mean[k] ** 2) for k in mean})
    # target_accept_prob 0.95: as with Stan's unit_vector, a trajectory near the plane's
    # origin now and then diverges (1-4 per run at 0.8, 0-1 at 0.95 over eight seeds)
    mcmc = _run(NUTS(model, target_accept_prob=0.95), x)
    _check_posterior(mcmc, exact, max_divergences=2)
    mu = mcmc.get_samples()["mu"]
    assert float(mu.abs().max()) <= math.pi
    # both sides of the cut are visited (exact: 46% of the mass above 2.5, 34% below -2.5)
    assert float((mu > 2.5).double().mean()) > 0.3
    assert float((mu < -2.5).double().mean()) > 0.2


# -- (d) Dirichlet-categorical ---------------------------------------------------------------
ALPHA = [1.0, 2.0, 0.5, 3.0]


def dirichlet_categorical(y):
    probs = pt.sample("probs", dist.Dirichlet(torch.tensor(ALPHA)))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Categorical(probs), obs=y)


def dirichlet_multinomial(total, counts):
    probs = pt.sample("probs", dist.Dirichlet(torch.tensor(ALPHA)))
    with pt.plate("rows", counts.shape[0]):
        pt.sample("counts", dist.Multinomial(total, probs), obs=counts)


@pytest.mark.parametrize("likelihood", ["categorical", "multinomial"])
def test_dirichlet_categorical(likelihood):
    y = torch.tensor([0] * 3 + [1] * 7 + [2] * 1 + [3] * 9)
    counts = torch.bincount(y, minlength=4).double()
    post = stats.dirichlet(np.array(ALPHA) + counts.numpy())
    exact = Exact({"probs": post.mean()}, {"probs": np.sqrt(post.var())})
    if likelihood == "categorical":
        mcmc = _run(NUTS(dirichlet_categorical), y)
    else:  # the same counts in four rows of five draws: the same posterior
        rows = torch.nn.functional.one_hot(
            y[torch.randperm(20, generator=torch.Generator().manual_seed(1))], 4
        )
        mcmc = _run(NUTS(dirichlet_multinomial), 5, rows.reshape(4, 5, 4).sum(1).double())
    assert mcmc.get_samples()["probs"].sum(-1).sub(1).abs().max() < 1e-12
    _check_posterior(mcmc, exact)


# -- (e) linear regression with a strongly correlated design, dense mass --------------------
REG_PRIOR_SCALE, REG_NOISE = 3.0, 0.7


def linear_regression(X, y):
    beta = pt.sample("beta", dist.Normal(0.0, REG_PRIOR_SCALE).expand([X.shape[1]]).to_event(1))
    with pt.plate("n", X.shape[0]):
        pt.sample("y", dist.Normal(X @ beta, REG_NOISE), obs=y)


def test_linear_regression_correlated_design_dense_mass():
    g = torch.Generator().manual_seed(11)
    n, rho = 50, 0.99
    x1 = torch.randn(n, generator=g)
    x2 = rho * x1 + math.sqrt(1 - rho**2) * torch.randn(n, generator=g)
    X = torch.stack([torch.ones(n), x1, x2], dim=-1)
    y = X @ torch.tensor([0.5, 1.0, -2.0]) + REG_NOISE * torch.randn(n, generator=g)
    precision = X.T @ X / REG_NOISE**2 + torch.eye(3) / REG_PRIOR_SCALE**2
    cov = torch.linalg.inv(precision)
    mean = cov @ X.T @ y / REG_NOISE**2
    # the design really makes the posterior hard for a diagonal metric
    corr = cov[1, 2] / (cov[1, 1] * cov[2, 2]).sqrt()
    assert corr < -0.95
    exact = Exact({"beta": mean.numpy()}, {"beta": cov.diagonal().sqrt().numpy()})
    mcmc = _run(NUTS(linear_regression, dense_mass=True), X, y)
    _check_posterior(mcmc, exact)
    # the adapted metric is dense and close to the posterior covariance (unconstrained = beta)
    inverse_mass = mcmc.last_state.inverse_mass
    assert inverse_mass.shape == (NUM_CHAINS, 3, 3)
    adapted_corr = inverse_mass[:, 1, 2] / (inverse_mass[:, 1, 1] * inverse_mass[:, 2, 2]).sqrt()
    assert (adapted_corr < -0.9).all()


# -- (f) ordinal regression (OrderedLogistic), posterior by quadrature -----------------------
ORD_CUTPOINTS = torch.tensor([-0.5, 0.5], dtype=torch.float64)


def ordinal(x, y):
    slope = pt.sample("slope", dist.Normal(0.0, 5.0))
    with pt.plate("n", x.shape[0]):
        pt.sample("y", dist.OrderedLogistic(slope * x, ORD_CUTPOINTS), obs=y)


def test_ordered_logistic_regression_against_quadrature():
    """OrderedLogistic under NUTS (its probabilities built without in-place writes, which
    vmap over chains cannot batch); the one-dimensional posterior by quadrature."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(40, generator=g, dtype=torch.float64)
    y = (x > -0.3).long() + (x > 0.8).long()
    grid = torch.linspace(-5.0, 15.0, 40001, dtype=torch.float64)
    below = torch.sigmoid(ORD_CUTPOINTS - grid[:, None, None] * x[None, :, None])  # P(y <= k)
    zero, one = torch.zeros_like(below[..., :1]), torch.ones_like(below[..., :1])
    probs = torch.diff(torch.cat([zero, below, one], dim=-1), dim=-1)  # P(y = k)
    log_lik = probs.gather(-1, y.expand(grid.shape[0], -1)[..., None]).log().sum((-2, -1))
    log_post = dist.Normal(0.0, 5.0).log_prob(grid) + log_lik
    weights = torch.softmax(log_post, 0)
    mean = float((weights * grid).sum())
    sd = float((weights * (grid - mean) ** 2).sum().sqrt())
    _check_posterior(_run(NUTS(ordinal), x, y), Exact({"slope": mean}, {"slope": sd}))


# -- NeuTra: NUTS on the noise of a fitted IAF guide -----------------------------------------
def _neutra_case():
    """A normal mean with known noise, gamma-Poisson rates in a plate and Dirichlet
    probabilities: a latent vector of 1 + 3 + 3 unconstrained coordinates with a
    positive, a plated and a simplex site, each posterior in closed form."""
    generator = torch.Generator().manual_seed(3)
    y = 1.5 + torch.randn(6, generator=generator, dtype=torch.float64)
    counts = torch.poisson(torch.full((5, 3), 2.0, dtype=torch.float64), generator=generator)
    cats = torch.tensor([0] * 3 + [1] * 7 + [2] * 1 + [3] * 9)

    def model(y, counts, cats):
        mu = pt.sample("mu", dist.Normal(0.0, 2.0))
        with pt.plate("n", y.shape[0]):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)
        with pt.plate("groups", 3):
            rate = pt.sample("rate", dist.Gamma(2.0, 1.0))
            with pt.plate("draws", counts.shape[0], dim=-2):
                pt.sample("counts", dist.Poisson(rate), obs=counts)
        probs = pt.sample("probs", dist.Dirichlet(torch.tensor(ALPHA)))
        with pt.plate("m", cats.shape[0]):
            pt.sample("cats", dist.Categorical(probs), obs=cats)

    precision = 1 / 4 + y.numel()
    rate_post = stats.gamma(2.0 + counts.sum(0).numpy(), scale=1 / (1.0 + counts.shape[0]))
    probs_post = stats.dirichlet(np.array(ALPHA) + torch.bincount(cats, minlength=4).numpy())
    exact = Exact(
        {"mu": float(y.sum()) / precision, "rate": rate_post.mean(), "probs": probs_post.mean()},
        {"mu": precision**-0.5, "rate": rate_post.std(), "probs": np.sqrt(probs_post.var())},
    )
    return model, (y, counts, cats), exact


def test_neutra_on_a_fitted_iaf_guide():
    """``NeuTraReparam``: NUTS samples the shared latent of an IAF guide fitted by SVI; the
    model's sites, recorded as deterministic sites, have the exact posterior (the
    reparameterized density is the model's times the flow's and the bijections' Jacobians,
    with a plated site's terms counted once per element)."""
    from probtorch.inference import SVI, Trace_ELBO
    from probtorch.inference.autoguide import AutoIAFNormal
    from probtorch.reparam import NeuTraReparam

    model, data, exact = _neutra_case()
    torch.manual_seed(0)  # (the MADE weights' initial values)
    guide = AutoIAFNormal(model, hidden_dims=[16])
    svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(num_particles=4), seed=0)
    result = svi.run(1500, *data, progress_bar=False)
    assert result.losses[-100:].mean() < result.losses[:100].mean()
    neutra = NeuTraReparam(guide, result.params)
    mcmc = _run(NUTS(neutra.reparam(model)), *data)
    _check_posterior(mcmc, exact)
    samples = mcmc.get_samples()
    assert samples["auto_shared_latent"].shape == (NUM_CHAINS * NUM_SAMPLES, 7)
    mapped = neutra.transform_sample(samples["auto_shared_latent"])
    for name in ("mu", "rate", "probs"):
        torch.testing.assert_close(mapped[name], samples[name], rtol=1e-10, atol=1e-12)
