"""The families probtorch adds (truncated, censored, zero-sum normal, hurdle) against exact
references: scipy densities, closed-form moments, Monte Carlo z-tests (|z| < 4) with fixed
seeds, compiled-vs-eager equality without graph breaks, and the Pyro mixin methods."""

import math
import pickle
import warnings

import arviz as az
import numpy as np
import pytest
import torch
from scipy import integrate, linalg, special, stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.distributions import _tails
from probtorch.inference.compile import compile_fn, count_compiles
from probtorch.validation import torch_validation

Z_MAX = 4.0


def _z_mean(samples, exact_mean, exact_var):
    n = samples.shape[0]
    return (samples.mean(0) - exact_mean) / math.sqrt(exact_var / n)


def _z_var(samples, exact_var, exact_m4):
    """z statistic of the sample variance, from the exact fourth central moment."""
    n = samples.shape[0]
    se = math.sqrt((exact_m4 - exact_var**2) / n)
    return (samples.var(0) - exact_var) / se


# -- truncation -------------------------------------------------------------------------

TRUNCNORM_CASES = [
    (0.0, 1.0, 8.0, 10.0),  # both bounds far in the upper tail
    (0.0, 1.0, -10.0, -8.0),  # lower tail
    (0.5, 2.0, None, 0.5),  # one-sided
    (0.5, 2.0, 1.0, None),
    (0.0, 1.0, 30.0, None),  # 30 sigma: 1 - F(30) is 5e-198
    (-1.0, 0.5, -2.0, 0.0),
]


def _scipy_truncnorm(loc, scale, low, high):
    a = -np.inf if low is None else (low - loc) / scale
    b = np.inf if high is None else (high - loc) / scale
    return stats.truncnorm(a, b, loc=loc, scale=scale)


@pytest.mark.parametrize("loc,scale,low,high", TRUNCNORM_CASES)
def test_truncated_normal_matches_scipy(loc, scale, low, high, float64):
    ref = _scipy_truncnorm(loc, scale, low, high)
    d = dist.TruncatedNormal(loc, scale, low, high)
    x = ref.ppf(np.linspace(0.001, 0.999, 9))
    log_p = d.log_prob(torch.tensor(x)).numpy()
    assert np.all(np.isfinite(log_p))
    np.testing.assert_allclose(log_p, ref.logpdf(x), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(d.cdf(torch.tensor(x)).numpy(), ref.cdf(x), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(float(d.mean), ref.mean(), rtol=1e-8)
    np.testing.assert_allclose(float(d.variance), ref.var(), rtol=1e-6)

    torch.manual_seed(0)
    s = d.sample((20000,))
    assert s.shape == (20000,)
    if low is not None:
        assert bool((s >= low).all())
    if high is not None:
        assert bool((s <= high).all())
    assert abs(float(_z_mean(s, ref.mean(), ref.var()))) < Z_MAX
    m4 = ref.expect(lambda t: (t - ref.mean()) ** 4)
    assert abs(float(_z_var(s, ref.var(), m4))) < Z_MAX


def test_truncated_normal_far_tail_float32():
    d = dist.TruncatedNormal(0.0, 1.0, 8.0, 10.0)
    x = torch.tensor([8.0, 8.5, 9.9])
    ref = stats.truncnorm(8, 10).logpdf(x.double().numpy())
    np.testing.assert_allclose(d.log_prob(x).numpy(), ref, rtol=1e-5)
    s = d.sample((5000,))
    assert bool(((s >= 8) & (s <= 10)).all()) and s.dtype == torch.float32


# (base, scipy frozen reference, low, high): scipy's truncated density computed by hand
GENERIC_CASES = [
    ("exponential", lambda: dist.Exponential(2.0), stats.expon(scale=0.5), 0.5, 3.0),
    ("exponential-tail", lambda: dist.Exponential(1.0), stats.expon(), 40.0, 45.0),
    ("gamma", lambda: dist.Gamma(2.0, 1.5), stats.gamma(2.0, scale=1 / 1.5), 1.0, 4.0),
    ("laplace-upper", lambda: dist.Laplace(1.0, 0.5), stats.laplace(1.0, 0.5), 6.0, 9.0),
    ("cauchy-lower", lambda: dist.Cauchy(0.0, 1.0), stats.cauchy(), -300.0, -20.0),
    ("lognormal", lambda: dist.LogNormal(0.0, 0.5), stats.lognorm(0.5), 3.0, None),
    ("logistic", lambda: dist.Logistic(0.0, 1.0), stats.logistic(), None, -25.0),
    ("gumbel", lambda: dist.Gumbel(1.0, 2.0), stats.gumbel_r(1.0, 2.0), -1.0, 4.0),
    ("weibull", lambda: dist.Weibull(2.0, 1.5), stats.weibull_min(1.5, scale=2.0), 1.0, 8.0),
    ("uniform-fallback", lambda: dist.Uniform(0.0, 4.0), stats.uniform(0, 4), 1.0, 3.0),
]


def _ref_log_mass(ref, low, high):
    a = -np.inf if low is None else low
    b = np.inf if high is None else high
    if a > ref.median():
        lsa, lsb = ref.logsf(a), ref.logsf(b)
        return lsa + np.log1p(-np.exp(lsb - lsa))
    lca, lcb = ref.logcdf(a), ref.logcdf(b)
    return lcb + np.log1p(-np.exp(lca - lcb))


@pytest.mark.parametrize("name,make,ref,low,high", GENERIC_CASES, ids=[c[0] for c in GENERIC_CASES])
def test_truncated_families_match_scipy(name, make, ref, low, high, float64):
    d = dist.TruncatedDistribution(make(), low, high)
    log_z = _ref_log_mass(ref, low, high)
    lo = min(ref.ppf(1e-9), high - 5.0) if low is None else low
    hi = max(ref.isf(1e-9), low + 5.0) if high is None else high
    if name == "exponential-tail":
        x = np.linspace(lo, hi, 7)
    else:
        x = np.linspace(lo, hi, 7)[1:-1]
    log_p = d.log_prob(torch.tensor(x)).numpy()
    np.testing.assert_allclose(log_p, ref.logpdf(x) - log_z, rtol=1e-6, atol=1e-9)
    if not d.has_rsample:  # Gamma: torch has no inverse incomplete gamma
        assert name == "gamma"
        with pytest.raises(NotImplementedError, match="icdf"):
            d.rsample()
        return
    torch.manual_seed(1)
    s = d.sample((20000,))
    if low is not None:
        assert bool((s >= low).all())
    if high is not None:
        assert bool((s <= high).all())
    a = -np.inf if low is None else low
    b = np.inf if high is None else high

    def moment(k, center=0.0):
        f = lambda t: (t - center) ** k * np.exp(ref.logpdf(t) - log_z)  # noqa: E731
        return integrate.quad(f, a, b, limit=200)[0]

    mean = moment(1)
    var = moment(2, mean)
    assert abs(float(_z_mean(s, mean, var))) < Z_MAX, name


@pytest.mark.parametrize(
    "loc0,low0,high0", [(0.3, -0.5, 1.5), (0.0, 8.0, 10.0), (0.0, 38.0, 40.0), (0.2, -40.0, -39.9)]
)
def test_truncated_normal_reparameterized_gradients(loc0, low0, high0, float64):
    """The pathwise gradient of E[x] w.r.t. loc and both bounds vs finite differences of
    the exact mean; per-draw gradients give the Monte Carlo standard error."""
    n = 20000
    loc = torch.full((n,), loc0, requires_grad=True)
    low = torch.full((n,), low0, requires_grad=True)
    high = torch.full((n,), high0, requires_grad=True)
    torch.manual_seed(2)
    x = dist.TruncatedNormal(loc, 1.0, low, high).rsample()
    grads = torch.autograd.grad(x.sum(), [loc, low, high])

    def exact_mean(lc, lo, hi):
        return _scipy_truncnorm(lc, 1.0, lo, hi).mean()

    h = 1e-5
    fd = [
        (exact_mean(loc0 + h, low0, high0) - exact_mean(loc0 - h, low0, high0)) / (2 * h),
        (exact_mean(loc0, low0 + h, high0) - exact_mean(loc0, low0 - h, high0)) / (2 * h),
        (exact_mean(loc0, low0, high0 + h) - exact_mean(loc0, low0, high0 - h)) / (2 * h),
    ]
    for g, ref in zip(grads, fd, strict=True):
        z = (g.mean() - ref) / (g.std() / math.sqrt(n))
        assert abs(float(z)) < Z_MAX, (float(g.mean()), ref)


def test_truncated_batch_shapes_and_support():
    d = dist.TruncatedNormal(torch.zeros(3, 1), 1.0, low=torch.tensor([-1.0, 0.0]), high=2.0)
    assert d.batch_shape == (3, 2) and d.event_shape == ()
    assert d.sample((4,)).shape == (4, 3, 2)
    assert isinstance(d.support, type(dist.constraints.interval(0.0, 1.0)))
    one_sided = dist.TruncatedDistribution(dist.Normal(0.0, 1.0), high=1.0)
    assert one_sided.support.upper_bound == 1.0
    transform = dist.biject_to(one_sided.support)
    assert float(transform(torch.tensor(50.0))) < 1.0
    out = dist.TruncatedNormal(0.0, 1.0, 0.0, 1.0, validate_args=False)
    assert out.log_prob(torch.tensor(2.0)) == -math.inf


# -- censoring --------------------------------------------------------------------------


CENSOR_BASES = [
    ("normal", lambda: dist.Normal(1.0, 2.0), stats.norm(1.0, 2.0), [-80.0, -3.0, 1.0, 4.0, 90.0]),
    ("exponential", lambda: dist.Exponential(0.5), stats.expon(scale=2.0), [0.1, 2.0, 500.0]),
    ("gamma", lambda: dist.Gamma(3.0, 2.0), stats.gamma(3.0, scale=0.5), [0.01, 1.5, 30.0]),
    ("laplace", lambda: dist.Laplace(0.0, 1.0), stats.laplace(), [-600.0, -1.0, 2.0, 600.0]),
    ("lognormal", lambda: dist.LogNormal(0.0, 1.0), stats.lognorm(1.0), [1e-20, 0.5, 3.0, 1e20]),
]


@pytest.mark.parametrize("name,make,ref,xs", CENSOR_BASES, ids=[c[0] for c in CENSOR_BASES])
def test_left_right_censored_match_scipy(name, make, ref, xs, float64):
    x = torch.tensor(xs)
    flags = torch.tensor([i % 2 == 0 for i in range(len(xs))])
    left = dist.LeftCensoredDistribution(make(), flags)
    right = dist.RightCensoredDistribution(make(), flags)
    xn, fn = np.array(xs), flags.numpy()
    exact = ref.logpdf(xn)
    np.testing.assert_allclose(
        left.log_prob(x).numpy(), np.where(fn, ref.logcdf(xn), exact), rtol=1e-6, atol=1e-12
    )
    np.testing.assert_allclose(
        right.log_prob(x).numpy(), np.where(fn, ref.logsf(xn), exact), rtol=1e-6, atol=1e-12
    )
    all_censored = dist.RightCensoredDistribution(make(), True).log_prob(x)
    assert bool(torch.isfinite(all_censored).all())


def test_interval_censored_cases(float64):
    ref = stats.norm(0.5, 1.5)
    d = dist.IntervalCensoredDistribution(
        dist.Normal(0.5, 1.5),
        left_censored=torch.tensor([False, True, False, True, False, False]),
        right_censored=torch.tensor([False, False, True, True, False, False]),
    )
    value = torch.tensor(
        [[-1.0, 2.0], [-math.inf, 1.0], [3.0, math.inf], [-1.0, 2.0], [0.7, 0.7], [20.0, 21.0]]
    )
    expected = [
        np.log(ref.cdf(2.0) - ref.cdf(-1.0)),
        ref.logcdf(1.0),
        ref.logsf(3.0),
        np.log(ref.cdf(-1.0) + ref.sf(2.0)),
        ref.logpdf(0.7),
        ref.logsf(20.0) + np.log1p(-np.exp(ref.logsf(21.0) - ref.logsf(20.0))),
    ]
    np.testing.assert_allclose(d.log_prob(value).numpy(), expected, rtol=1e-6)
    assert d.event_shape == (2,) and d.sample((3,)).shape == (3, 6, 2)


def test_censored_clipping(float64):
    ref = stats.norm(0.0, 1.0)
    d = dist.Censored(dist.Normal(0.0, 1.0), low=-0.5, high=1.0)
    x = torch.tensor([-0.5, 0.2, 1.0])
    expected = [ref.logcdf(-0.5), ref.logpdf(0.2), ref.logsf(1.0)]
    np.testing.assert_allclose(d.log_prob(x).numpy(), expected, rtol=1e-10)
    with pytest.raises(ValueError, match="support"):
        d.log_prob(torch.tensor(7.0))
    unchecked = dist.Censored(dist.Normal(0.0, 1.0), low=-0.5, high=1.0, validate_args=False)
    outside = unchecked.log_prob(torch.tensor([-3.0, 7.0])).numpy()
    np.testing.assert_allclose(outside, [ref.logcdf(-0.5), ref.logsf(1.0)], rtol=1e-10)
    torch.manual_seed(3)
    s = d.sample((20000,))
    assert bool(((s >= -0.5) & (s <= 1.0)).all())
    for frac, p in [((s == -0.5).double(), ref.cdf(-0.5)), ((s == 1.0).double(), ref.sf(1.0))]:
        assert abs(float(_z_mean(frac, p, p * (1 - p)))) < Z_MAX
    assert dist.Censored(dist.Normal(0.0, 1.0), high=0.0).support.check(torch.tensor(0.0))


# -- zero-sum normal --------------------------------------------------------------------


def _helmert_basis(shape):
    """Orthonormal basis (rows) of the zero-sum subspace of tensors of ``shape``."""
    basis = np.ones((1, 1))
    for n in shape:
        basis = np.kron(basis, linalg.helmert(n))  # (n - 1, n), orthonormal rows
    return basis


@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_zero_sum_normal_log_prob_is_subspace_gaussian(shape, float64):
    scale = torch.tensor([0.7, 2.0])
    d = dist.ZeroSumNormal(scale, shape)
    assert d.batch_shape == (2,) and d.event_shape == shape
    torch.manual_seed(4)
    x = d.sample((3,))
    basis = _helmert_basis(shape)
    coords = x.reshape(3, 2, -1).numpy() @ basis.T  # coordinates in the subspace
    dof = basis.shape[0]
    for j, s in enumerate(scale.tolist()):
        ref = stats.multivariate_normal(np.zeros(dof), s**2 * np.eye(dof)).logpdf(coords[:, j])
        np.testing.assert_allclose(d.log_prob(x)[:, j].numpy(), ref, rtol=1e-10)
    # the coordinates are exact: x lies in the subspace
    np.testing.assert_allclose(coords @ basis, x.reshape(3, 2, -1).numpy(), atol=1e-12)


def test_zero_sum_normal_samples_and_covariance(float64):
    n, s, draws = 4, 1.5, 40000
    d = dist.ZeroSumNormal(s, (n,))
    torch.manual_seed(5)
    x = d.rsample((draws,))
    assert float(x.sum(-1).abs().max()) < 1e-12
    assert bool(d.support.check(x).all()) and not bool(d.support.check(x + 0.1).any())
    cov = s**2 * (np.eye(n) - np.ones((n, n)) / n)
    emp = np.cov(x.numpy().T)
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / draws)
    assert np.all(np.abs(emp - cov) < Z_MAX * se)
    np.testing.assert_allclose(d.variance.numpy(), np.diag(cov))


def test_zero_sum_transform(float64):
    for shape in [(5,), (3, 4)]:
        c = dist.ZeroSumNormal(1.0, shape).support
        t = dist.biject_to(c)
        assert isinstance(t, dist.ZeroSumTransform)
        assert dist.biject_to(c) == t
        y_shape = t.inverse_shape(torch.Size((2,) + shape))
        assert y_shape == (2,) + tuple(k - 1 for k in shape)
        assert t.forward_shape(y_shape) == (2,) + shape
        y = torch.randn(y_shape)
        x = t(y)
        assert bool(c.check(x).all())
        torch.testing.assert_close(t.inv(x), y)
        torch.testing.assert_close((x**2).sum(), (y**2).sum())  # an isometry
        assert t.log_abs_det_jacobian(y, x).shape == (2,)
    jac = torch.autograd.functional.jacobian(dist.ZeroSumTransform(1), torch.randn(4))
    torch.testing.assert_close(jac.T @ jac, torch.eye(4))


def _zero_sum_model():
    pt.sample("x", dist.ZeroSumNormal(torch.tensor(1.0), (5,)))


def _mixed_model(y, t, censored, counts):
    effects = pt.sample("effects", dist.ZeroSumNormal(torch.tensor(1.0), (3,)))
    mu = pt.sample("mu", dist.TruncatedNormal(0.0, 2.0, low=-1.0))
    sigma = pt.sample("sigma", dist.TruncatedDistribution(dist.Exponential(1.0), 0.1, 5.0))
    with pt.plate("data", 3):
        pt.sample("y", dist.Censored(dist.Normal(mu + effects, sigma), high=2.0), obs=y)
        survival = dist.RightCensoredDistribution(dist.Exponential(sigma), censored)
        pt.sample("t", survival, obs=t)
        pt.sample("n", dist.HurdlePoisson(mu.exp().expand(3), gate=0.3), obs=counts)


def test_potential_compiles_without_breaks(float64):
    """Latent zero-sum and truncated sites (through their bijections) and censored and
    hurdle likelihoods: the compiled potential equals the eager one, with no graph break."""
    from probtorch.inference.potential import initialize_model

    data = (
        torch.tensor([0.3, 2.0, -0.4]),
        torch.tensor([1.0, 0.5, 2.0]),
        torch.tensor([False, True, True]),
        torch.tensor([0.0, 2.0, 1.0]),
    )
    eager, z0 = initialize_model(_mixed_model, data, {}, num_chains=2, compile=False)
    compiled, _ = initialize_model(_mixed_model, data, {}, num_chains=2, compile=True)
    assert z0.shape == (2, 4)  # 2 zero-sum coordinates, mu, sigma
    with count_compiles() as stats_:
        value, grad = compiled.value_and_grad(z0)
    assert stats_.graph_breaks == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref_value, ref_grad = eager.value_and_grad(z0)
    # every op has a vmap batching rule (no per-chain loop): torch's log_ndtr has none
    assert not [w for w in caught if "batching rule" in str(w.message)]
    assert bool(torch.isfinite(ref_value).all() and torch.isfinite(ref_grad).all())
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad)
    zs_only, z1 = initialize_model(_zero_sum_model, (), {}, num_chains=2, compile=False)
    expected = 0.5 * (z1**2).sum(-1) + 2 * math.log(2 * math.pi)  # 4 dof, log |det J| = 0
    torch.testing.assert_close(zs_only(z1), expected)


def test_zero_sum_normal_nuts(float64):
    from probtorch.inference import MCMC, NUTS

    mcmc = MCMC(
        NUTS(_zero_sum_model),
        num_warmup=200,
        num_samples=300,
        num_chains=1,
        progress_bar=False,
        seed=0,
    )
    mcmc.run()
    x = mcmc.get_samples()["x"]
    assert x.shape == (300, 5)
    assert float(x.sum(-1).abs().max()) < 1e-10
    for i in range(5):
        sq = x[:, i].numpy() ** 2
        mcse = sq.std() / math.sqrt(float(az.ess(sq[None, :])))
        assert abs(sq.mean() - 0.8) < Z_MAX * mcse  # exact variance 1 - 1/5


# -- Wishart latent sites (biject_to(positive_definite)) --------------------------------

_WISHART_X = torch.tensor(
    [[0.8, -0.3], [1.9, 1.1], [-0.5, 0.2], [0.1, -1.4], [1.2, 0.9], [-1.0, -0.7], [0.4, 0.6]]
)


def _wishart_model(x):
    precision = pt.sample("precision", dist.Wishart(4.0, scale_tril=torch.eye(2)))
    with pt.plate("data", x.shape[0]):
        pt.sample("x", dist.MultivariateNormal(torch.zeros(2), precision_matrix=precision), obs=x)


def test_wishart_latent_potential_compiles(float64):
    """A positive-definite latent site: unconstrained through n (n + 1) / 2 coordinates, the
    compiled potential (Wishart built inside compiled code) equals the eager one."""
    from probtorch.inference.potential import initialize_model

    x = _WISHART_X.double()
    eager, z0 = initialize_model(_wishart_model, (x,), {}, num_chains=2, compile=False)
    compiled, _ = initialize_model(_wishart_model, (x,), {}, num_chains=2, compile=True)
    assert z0.shape == (2, 3)
    with count_compiles() as stats_:
        value, grad = compiled.value_and_grad(z0)
    assert stats_.graph_breaks == 0
    ref_value, ref_grad = eager.value_and_grad(z0)
    torch.testing.assert_close(value, ref_value)
    torch.testing.assert_close(grad, ref_grad)


def test_wishart_latent_nuts_matches_conjugate_posterior(float64):
    """Wishart(df, V) prior on a Gaussian precision: the posterior is
    Wishart(df + n, (V^-1 + sum x x^T)^-1); NUTS means of its three free entries are within
    4 Monte Carlo standard errors of the exact ones."""
    from probtorch.inference import MCMC, NUTS

    x = _WISHART_X.double()
    mcmc = MCMC(
        NUTS(_wishart_model),
        num_warmup=300,
        num_samples=600,
        num_chains=1,
        progress_bar=False,
        seed=1,
    )
    mcmc.run(x)
    draws = mcmc.get_samples()["precision"]
    assert draws.shape == (600, 2, 2)
    scale = torch.linalg.inv(torch.eye(2, dtype=x.dtype) + x.T @ x)
    exact_mean = (4.0 + x.shape[0]) * scale
    for i, j in ((0, 0), (1, 0), (1, 1)):
        d = draws[:, i, j].numpy()
        mcse = d.std() / math.sqrt(float(az.ess(d[None, :])))
        assert abs(d.mean() - float(exact_mean[i, j])) < Z_MAX * mcse, (i, j, d.mean(), mcse)


# -- hurdle -----------------------------------------------------------------------------


def test_hurdle_poisson_pmf_and_moments(float64):
    rate, gate = torch.tensor([0.3, 2.5]), torch.tensor([0.6, 0.1])
    d = dist.HurdlePoisson(rate, gate=gate)
    k = torch.arange(80.0).unsqueeze(-1)
    pmf = d.log_prob(k).exp().numpy()
    kn, r, g = k.numpy(), rate.numpy(), gate.numpy()
    expected = np.where(kn == 0, g, (1 - g) * stats.poisson(r).pmf(kn) / stats.poisson(r).sf(0))
    np.testing.assert_allclose(pmf, expected, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(pmf.sum(0), 1.0, rtol=1e-12)
    mean = (kn * pmf).sum(0)
    np.testing.assert_allclose(d.mean.numpy(), mean, rtol=1e-10)
    np.testing.assert_allclose(d.variance.numpy(), ((kn - mean) ** 2 * pmf).sum(0), rtol=1e-10)
    logits = dist.HurdlePoisson(rate, gate_logits=torch.logit(gate))
    torch.testing.assert_close(logits.log_prob(k), d.log_prob(k))

    torch.manual_seed(6)
    s = d.sample((20000,))
    assert s.shape == (20000, 2) and bool((s == s.round()).all() and (s >= 0).all())
    zero = (s == 0).double()
    for j in range(2):
        assert abs(float(_z_mean(zero[:, j], g[j], g[j] * (1 - g[j])))) < Z_MAX
        var = float(d.variance[j])
        assert abs(float(_z_mean(s[:, j], float(d.mean[j]), var))) < Z_MAX


def test_hurdle_negative_binomial_and_generic(float64):
    d = dist.HurdleNegativeBinomial(2.5, probs=torch.tensor(0.7), gate=0.25)
    k = torch.arange(200.0)
    ref = stats.nbinom(2.5, 1 - 0.7)  # torch's probs is scipy's 1 - p
    expected = np.where(k.numpy() == 0, 0.25, 0.75 * ref.pmf(k.numpy()) / ref.sf(0))
    np.testing.assert_allclose(d.log_prob(k).exp().numpy(), expected, rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(float(d.mean), (k.numpy() * expected).sum(), rtol=1e-9)
    torch.manual_seed(7)
    s = d.sample((20000,))
    assert abs(float(_z_mean(s, float(d.mean), float(d.variance)))) < Z_MAX
    assert abs(float(_z_mean((s == 0).double(), 0.25, 0.25 * 0.75))) < Z_MAX

    geo = dist.HurdleDistribution(dist.Geometric(probs=torch.tensor(0.8)), gate=0.5)
    s = geo.sample((20000,))  # rejection: P(0) of the base is 0.8
    assert abs(float(_z_mean(s, float(geo.mean), float(geo.variance)))) < Z_MAX


# -- validation, shapes, Pyro's methods, pickling ------------------------------------------


@pytest.mark.parametrize(
    "make,param",
    [
        (lambda: dist.TruncatedNormal(0.0, -1.0, 0.0, 1.0, validate_args=True), "scale"),
        (lambda: dist.TruncatedNormal(0.0, 1.0, 2.0, 1.0, validate_args=True), "low"),
        (lambda: dist.ZeroSumNormal(torch.tensor(-1.0), (3,), validate_args=True), "scale"),
        (lambda: dist.ZeroSumNormal(1.0, (1,)), "event_shape"),
        (lambda: dist.HurdlePoisson(torch.tensor(-1.0), gate=0.5, validate_args=True), "rate"),
        (lambda: dist.HurdlePoisson(torch.tensor(1.0), gate=1.5, validate_args=True), "gate"),
        (
            lambda: dist.LeftCensoredDistribution(dist.Normal(0.0, 1.0), 2, validate_args=True),
            "censored",
        ),
        (lambda: dist.Censored(dist.Normal(0.0, 1.0), 1.0, 0.0, validate_args=True), "low"),
    ],
)
def test_invalid_parameters_name_the_parameter(make, param):
    with pytest.raises(ValueError, match=param):
        make()


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: dist.TruncatedNormal(0.0, -1.0, low=0.0, validate_args=True), "TruncatedNormal"),
        (lambda: dist.LKJCholesky(3, -1.0, validate_args=True), "LKJCholesky"),
        (lambda: dist.LKJ(3, -1.0, validate_args=True), "LKJ"),
        (lambda: dist.HurdlePoisson(-1.0, gate=0.5, validate_args=True), "HurdlePoisson"),
    ],
)
def test_invalid_parameters_name_the_distribution_built(make, name):
    """The error names the distribution the user built, not an inner one (it named Normal
    and Dirichlet)."""
    with pytest.raises(ValueError, match=rf"^{name}: |distribution {name}\b"):
        make()


def test_hurdle_gate_is_keyword_only_and_base_dist_is_accepted(float64):
    """NumPyro's HurdlePoisson(gate, rate) takes the gate first: a positional second
    argument was read as the gate with no error (0.3, 0.5 gave rate 0.3, gate 0.5)."""
    with pytest.raises(TypeError, match=r"HurdlePoisson\(rate\) takes the gate by keyword"):
        dist.HurdlePoisson(0.3, 0.5)
    with pytest.raises(TypeError, match="HurdleNegativeBinomial.*gate by keyword"):
        dist.HurdleNegativeBinomial(3.0, 0.4, None, 0.2)
    d = dist.HurdlePoisson(gate=0.3, rate=0.5)
    assert (float(d.gate), float(d.rate)) == (0.3, 0.5)
    # NumPyro's keyword for the base, in every wrapper
    geometric = dist.Geometric(probs=torch.tensor(0.5))
    by_name = dist.HurdleDistribution(base_dist=geometric, gate=0.3)
    torch.testing.assert_close(
        by_name.log_prob(torch.tensor(2.0)),
        dist.HurdleDistribution(geometric, gate=0.3).log_prob(torch.tensor(2.0)),
    )
    normal = dist.Normal(0.0, 1.0)
    for cls, kwargs in [
        (dist.TruncatedDistribution, {"low": 0.0}),
        (dist.LeftCensoredDistribution, {}),
        (dist.RightCensoredDistribution, {}),
        (dist.IntervalCensoredDistribution, {}),
        (dist.Censored, {"low": 0.0}),
    ]:
        assert type(cls(base_dist=normal, **kwargs).base_dist) is type(normal), cls
    with pytest.raises(TypeError, match="give the base distribution once"):
        dist.TruncatedDistribution(normal, low=0.0, base_dist=normal)


def test_hurdle_gate_takes_the_base_dtype_and_device():
    """A Python-number gate is in the base's dtype (it stayed float32 beside a float64
    rate: P(0) = 0.30000001); sampling and moments make tensors on the base's device
    (they made CPU tensors: a 'meta' or CUDA base failed)."""
    d = dist.HurdlePoisson(torch.tensor(2.0, dtype=torch.float64), gate=0.3)
    assert d.gate.dtype == torch.float64
    assert float(d.log_prob(torch.tensor(0.0, dtype=torch.float64)).exp()) == 0.3
    meta = dist.HurdlePoisson(
        torch.tensor([2.0], device="meta"),
        gate=torch.tensor([0.3], device="meta"),
        validate_args=False,
    )
    assert meta.mean.device.type == "meta" and meta.variance.device.type == "meta"
    generic = dist.HurdleDistribution(
        dist.Geometric(probs=torch.tensor([0.5], device="meta"), validate_args=False),
        gate=torch.tensor([0.3], device="meta"),
        validate_args=False,
    )
    assert generic.mean.shape == (1,) and generic.mean.device.type == "meta"


@pytest.mark.parametrize(
    "make",
    [
        lambda: dist.TruncatedDistribution(dist.StudentT(3.0), 0.0, 2.0),
        lambda: dist.Censored(dist.Poisson(3.0), low=1.0, high=5.0),
        lambda: dist.LeftCensoredDistribution(dist.Beta(2.0, 2.0)),
        # a transformed distribution through a transform without a sign (AbsTransform)
        lambda: dist.TruncatedDistribution(
            dist.FoldedDistribution(dist.Normal(0.0, 1.0)), 0.0, 1.0
        ),
    ],
)
def test_truncation_and_censoring_need_the_base_cdf(make):
    """A base without a cdf in torch is refused when the wrapper is built, naming it (it
    failed at the first log_prob with an empty NotImplementedError)."""
    with pytest.raises(NotImplementedError, match=r"needs the cdf of its base, and \w+ has none"):
        make()


def test_probtorch_constraints_in_torch_registries(float64):
    """torch's transform_to and biject_to (re-exported, and used by Pyro's inference) know
    probtorch's closed half line and zero-sum constraint; the closed half line prints as
    itself (torch's repr printed 'essThanEq')."""
    upper = dist.TruncatedNormal(0.0, 1.0, high=0.0).support
    zero_sum = dist.ZeroSumNormal(1.0, (3,)).support
    assert repr(upper) == "LessThanEq(upper_bound=0.0)"
    x = torch.tensor([-3.0, 0.0, 2.0])
    for registry in (dist.transform_to, torch.distributions.biject_to, dist.biject_to):
        y = registry(upper)(x)
        assert bool(upper.check(y).all()) and bool((y < 0).all())
        z = registry(zero_sum)(torch.tensor([0.4, -1.2]))
        assert z.shape == (3,) and abs(float(z.sum())) < 1e-12


def _examples():
    return {
        "truncated_normal": (dist.TruncatedNormal(torch.zeros(3), 1.0, -1.0, 2.0), torch.zeros(3)),
        "truncated_exp": (
            dist.TruncatedDistribution(dist.Exponential(torch.ones(3)), low=1.0),
            torch.full((3,), 2.0),
        ),
        "left_censored": (
            dist.LeftCensoredDistribution(dist.Normal(torch.zeros(3), 1.0), torch.tensor(True)),
            torch.zeros(3),
        ),
        "interval_censored": (
            dist.IntervalCensoredDistribution(dist.Normal(torch.zeros(3), 1.0)),
            torch.tensor([[0.0, 1.0]] * 3),
        ),
        "censored": (dist.Censored(dist.Normal(torch.zeros(3), 1.0), low=0.0), torch.zeros(3)),
        "zero_sum": (dist.ZeroSumNormal(torch.ones(3), (4,)), torch.zeros(3, 4)),
        "hurdle": (dist.HurdlePoisson(torch.ones(3), gate=0.3), torch.ones(3)),
    }


@pytest.mark.parametrize("name", sorted(_examples()))
def test_pyro_methods_and_pickling(name):
    d, value = _examples()[name]
    assert d.batch_shape == (3,)
    assert d.log_prob(value).shape == (3,)
    assert d.sample((2,)).shape == (2, 3) + d.event_shape
    e = d.expand((4, 3))
    assert type(e) is type(d) and e.batch_shape == (4, 3)
    assert e.log_prob(value).shape == (4, 3)
    torch.testing.assert_close(e.log_prob(value)[1], d.log_prob(value))
    assert d.expand_by((2,)).batch_shape == (2, 3)
    ind = d.to_event(1)
    assert ind.event_shape == (3,) + d.event_shape and ind.log_prob(value).shape == ()
    masked = d.mask(torch.tensor([True, False, True]))
    assert float(masked.log_prob(value)[1]) == 0.0
    restored = pickle.loads(pickle.dumps(d))
    torch.testing.assert_close(restored.log_prob(value), d.log_prob(value))
    assert d.support.check(d.sample()).all()


# -- compile ----------------------------------------------------------------------------


def _log_probs(loc, scale, low, high, rate, gate, flags, x, counts, zs, interval):
    """Every family's log_prob, constructed without validation (as in compiled models)."""
    v = False
    normal = dist.Normal(loc, scale, validate_args=v)
    return (
        dist.TruncatedNormal(loc, scale, low, high, validate_args=v).log_prob(x),
        dist.TruncatedDistribution(dist.Exponential(rate), low=low, validate_args=v).log_prob(
            x + 1.0
        ),
        dist.TruncatedDistribution(dist.Laplace(loc, scale), high=high, validate_args=v).log_prob(
            x
        ),
        dist.LeftCensoredDistribution(normal, flags, validate_args=v).log_prob(x),
        dist.RightCensoredDistribution(normal, flags, validate_args=v).log_prob(x),
        dist.IntervalCensoredDistribution(normal, flags, ~flags, validate_args=v).log_prob(
            interval
        ),
        dist.Censored(normal, low, high, validate_args=v).log_prob(x),
        dist.ZeroSumNormal(scale, (4,), validate_args=v).log_prob(zs),
        dist.HurdlePoisson(rate, gate=gate, validate_args=v).log_prob(counts),
        dist.HurdleNegativeBinomial(rate, logits=loc, gate_logits=gate, validate_args=v).log_prob(
            counts
        ),
    )


def test_log_prob_compiles_without_graph_breaks(float64):
    g = torch.Generator().manual_seed(8)
    args = (
        torch.randn(3, generator=g),  # loc
        torch.rand(3, generator=g) + 0.5,  # scale
        torch.full((3,), -0.5),  # low
        torch.full((3,), 1.5),  # high
        torch.rand(3, generator=g) + 1.0,  # rate
        torch.rand(3, generator=g) * 0.5,  # gate
        torch.tensor([True, False, True]),
        torch.tensor([-0.2, 0.4, 1.0]),  # x
        torch.tensor([0.0, 1.0, 4.0]),  # counts
        dist.ZeroSumNormal(torch.ones(3), (4,)).sample(),
        torch.tensor([[-1.0, 1.0], [0.0, 0.0], [2.0, 3.0]]),
    )
    compiled = compile_fn(_log_probs)
    # compiled code runs with torch's validation off (as probtorch's kernels do)
    with count_compiles() as stats_, torch_validation(False):
        out = compiled(*args)
    assert stats_.graph_breaks == 0 and stats_.graphs == 1
    for got, ref in zip(out, _log_probs(*args), strict=True):
        assert bool(torch.isfinite(ref).all())
        torch.testing.assert_close(got, ref)


def _rsamples(loc, scale, low, high, rate):
    v = False
    return (
        dist.TruncatedNormal(loc, scale, low, high, validate_args=v).rsample((5,)),
        dist.TruncatedDistribution(dist.Exponential(rate), low=low, validate_args=v).rsample(),
        dist.ZeroSumNormal(scale, (4,), validate_args=v).rsample((2,)),
    )


def test_rsample_compiles_without_graph_breaks(float64):
    args = (torch.zeros(3), torch.ones(3), torch.full((3,), 8.0), torch.full((3,), 10.0))
    args = args + (torch.ones(3),)
    compiled = compile_fn(_rsamples)
    patch = torch._inductor.config.patch(fallback_random=True)
    with patch, count_compiles() as stats_, torch_validation(False):
        torch.manual_seed(9)
        out = compiled(*args)
    assert stats_.graph_breaks == 0 and stats_.graphs == 1
    torch.manual_seed(9)
    for got, ref in zip(out, _rsamples(*args), strict=True):
        torch.testing.assert_close(got, ref)
    assert bool(((out[0] >= 8) & (out[0] <= 10)).all())


def test_tails_helpers_accurate(float64):
    t = torch.tensor([-1e-20, -0.1, -0.69, -0.7, -5.0, -800.0])
    np.testing.assert_allclose(_tails.log1mexp(t).numpy(), np.log(-np.expm1(t.numpy())), rtol=1e-12)
    z = torch.tensor([-1e3, -40.0, -1.5, -1.0, -0.3, 0.0, 2.0, 9.0, 30.0])
    np.testing.assert_allclose(
        _tails.log_ndtr(z).numpy(), special.log_ndtr(z.numpy()), rtol=1e-12, atol=1e-300
    )
    d = dist.Normal(0.0, 1.0)
    q = torch.tensor([1e-300, 1e-20, 0.3])
    isf = _tails.isf_log(d, q.log()).numpy()
    np.testing.assert_allclose(isf, stats.norm.isf(q.numpy()), rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bernoulli_log_prob_and_gradient_match_the_exact_values(dtype):
    """probtorch's Bernoulli computes y x - softplus(x) with one exponential and one
    logarithm (torch's takes two exponentials and a logarithm): values within roundings
    of the exact log density (numpy's logaddexp) for logits from -1e4 to 1e4, and gradients
    y - sigmoid(x), y - 1/2 at x = 0 exactly."""
    gen = torch.Generator().manual_seed(2)
    special_logits = [0.0, -0.0, 1e-30, -1e-30, 17.0, -17.0, 40.0, -40.0, 1e4, -1e4]
    logits = torch.cat([torch.tensor(special_logits), 8 * torch.randn(500, generator=gen)])
    logits = logits.to(dtype)
    eps = torch.finfo(dtype).eps
    for value in (torch.zeros_like(logits), torch.ones_like(logits)):
        x = logits.clone().requires_grad_()
        d = dist.Bernoulli(logits=x)
        assert isinstance(d, torch.distributions.Bernoulli)
        log_prob = d.log_prob(value)
        (grad,) = torch.autograd.grad(log_prob.sum(), x)
        x64, y64 = logits.double().numpy(), value.double().numpy()
        exact = y64 * x64 - np.logaddexp(0.0, x64)
        scale = np.maximum(1.0, np.abs(x64))  # a rounding of x + log(1 + exp(-|x|))
        assert np.all(np.abs(log_prob.detach().double().numpy() - exact) <= 4 * eps * scale)
        exact_grad = torch.from_numpy(y64 - special.expit(x64)).to(dtype)
        torch.testing.assert_close(grad, exact_grad, rtol=0, atol=4 * eps)
        assert float(grad[0]) == float(value[0]) - 0.5
        reference = torch.distributions.Bernoulli(logits=logits).log_prob(value)
        difference = (log_prob.detach() - reference).double().abs().numpy()
        assert np.all(difference <= 8 * eps * scale)  # both within roundings of the exact
    # infinite logits (probs 0 and 1): the limits, where torch's formula gives nan
    infinite = torch.tensor([math.inf, math.inf, -math.inf, -math.inf], dtype=dtype)
    values = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=dtype)
    assert dist.Bernoulli(logits=infinite).log_prob(values).tolist() == [
        0.0,
        -math.inf,
        0.0,
        -math.inf,
    ]
    expanded = dist.Bernoulli(logits=torch.zeros(3)).expand([2, 3])
    assert type(expanded) is dist.Bernoulli and expanded.batch_shape == (2, 3)
    by_probs = dist.Bernoulli(probs=torch.tensor([0.2, 0.9]))
    torch.testing.assert_close(
        by_probs.log_prob(torch.tensor([1.0, 0.0])), torch.tensor([0.2, 0.1]).log()
    )


def test_multinomial_log_prob_batches_under_vmap():
    """torch's Multinomial.log_prob assigns through a boolean mask, which vmap cannot batch
    (NUTS evaluates models under vmap); probtorch's gives torch's values and batches."""
    probs = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.3, 0.5], [0.6, 0.0, 0.4]], dtype=torch.float64)
    value = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [2.0, 0.0, 1.0]], dtype=torch.float64)
    expected = torch.distributions.Multinomial(3, probs).log_prob(value)
    batched = torch.func.vmap(lambda p, v: dist.Multinomial(3, p).log_prob(v))(probs, value)
    torch.testing.assert_close(batched, expected, rtol=1e-14, atol=0)
    ref = [stats.multinomial(3, p.numpy()).logpmf(v.numpy()) for p, v in zip(probs, value)]
    np.testing.assert_allclose(batched.numpy(), ref, rtol=1e-12)
    # a logit of -inf with a count of 0 contributes 0 (the masked case), not nan
    logits = torch.tensor([-math.inf, 0.0, 0.0], dtype=torch.float64)
    for count in ([0.0, 1.0, 2.0], [1.0, 1.0, 1.0]):
        count = torch.tensor(count, dtype=torch.float64)
        torch.testing.assert_close(
            dist.Multinomial(3, logits=logits).log_prob(count),
            torch.distributions.Multinomial(3, logits=logits).log_prob(count),
        )
    assert dist.Multinomial(3, logits=logits).log_prob(value[0]).item() == math.log(0.375)


@pytest.mark.parametrize("family", ["Dirichlet", "Beta"])
def test_dirichlet_and_beta_rsample_differentiate_under_torch_func(family):
    """torch's Dirichlet.rsample (and Beta's) is an old-style autograd.Function that
    torch.func.grad refuses; probtorch's draws the same values with the same gradients."""
    c = torch.tensor([[0.7, 2.0, 3.5], [5.0, 0.3, 1.0]], dtype=torch.float64)

    def draw(module, c):
        if family == "Dirichlet":
            return getattr(module, family)(c).rsample((4,))
        return getattr(module, family)(c[..., 0], c[..., 1]).rsample((4,))

    weights = torch.linspace(-1.0, 1.0, 24, dtype=torch.float64)

    def objective(module, c):
        x = draw(module, c)
        return (x * weights[: x.numel()].reshape(x.shape)).sum()

    torch.manual_seed(3)
    leaf = c.clone().requires_grad_()
    expected_value = objective(torch.distributions, leaf)
    (expected_grad,) = torch.autograd.grad(expected_value, leaf)
    torch.manual_seed(3)
    grad, value = torch.func.grad_and_value(lambda c: objective(dist, c))(c)
    assert value == expected_value.detach()
    torch.testing.assert_close(grad, expected_grad, rtol=1e-14, atol=0)
    sample = draw(dist, c)
    assert type(
        getattr(dist, family)(c).expand((3, 2))
        if family == "Dirichlet"
        else dist.Beta(c[:, 0], c[:, 1]).expand((3, 2))
    ) is getattr(dist, family)
    assert sample.shape == ((4, 2, 3) if family == "Dirichlet" else (4, 2))


def test_beta_guide_fits_the_beta_binomial_posterior_eagerly():
    """A Beta guide under SVI with compile=False (torch.func.grad of Beta.rsample) reaches
    the conjugate posterior Beta(2 + 7, 2 + 3)."""
    from torch.optim.lr_scheduler import ExponentialLR

    from probtorch.inference import SVI, Trace_ELBO

    def model(k):
        p = pt.sample("p", dist.Beta(2.0, 2.0))
        pt.sample("k", dist.Binomial(10, p), obs=k)

    def guide(k):
        a = pt.param("a", torch.tensor(1.0), constraint=dist.constraints.positive)
        b = pt.param("b", torch.tensor(1.0), constraint=dist.constraints.positive)
        pt.sample("p", dist.Beta(a, b))

    optim = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.1), gamma=0.02 ** (1 / 1500))
    svi = SVI(model, guide, optim, Trace_ELBO(num_particles=8), compile=False, seed=0)
    params = svi.run(1500, torch.tensor(7.0, dtype=torch.float64), progress_bar=False).params
    a, b = float(params["a"]), float(params["b"])
    assert abs(a / (a + b) - 9 / 14) < 0.01
    assert abs(a + b - 14) < 0.1 * 14


# -- review fixes -----------------------------------------------------------------------


def test_interval_censored_unflagged_infinite_ends(float64):
    """An unflagged row with an infinite end is a one-sided interval: ``[-inf, u]`` scores
    ``log F(u)`` and ``[l, inf]`` ``log S(l)`` (NumPyro: ``log F(1) = -0.5130`` for ``Normal(0.5,
    2)``), not the mass of the stand-in interval ``(0, 1]``."""
    ref = stats.norm(0.5, 1.5)
    loc = torch.tensor(0.5, requires_grad=True)
    d = dist.IntervalCensoredDistribution(dist.Normal(loc, 1.5), False, False).expand((4,))
    value = torch.tensor([[-math.inf, 1.0], [0.0, math.inf], [-math.inf, math.inf], [-1.0, 2.0]])
    lp = d.log_prob(value)
    expected = [ref.logcdf(1.0), ref.logsf(0.0), 0.0, np.log(ref.cdf(2.0) - ref.cdf(-1.0))]
    np.testing.assert_allclose(lp.detach().numpy(), expected, rtol=1e-12, atol=1e-14)
    (grad,) = torch.autograd.grad(lp.sum(), loc)
    assert bool(torch.isfinite(grad))
    numpyro_case = dist.IntervalCensoredDistribution(dist.Normal(0.5, 2.0))
    got = float(numpyro_case.log_prob(torch.tensor([-math.inf, 1.0])))
    assert got == pytest.approx(-0.5130, abs=5e-5)


def test_interval_censored_nan_in_the_unused_end(float64):
    """The docstring's promise: the end a one-sided row does not use may be ``nan``, also
    with validation on; a ``nan`` in an end that is used is still rejected."""
    ref = stats.norm(0.0, 1.0)
    d = dist.IntervalCensoredDistribution(
        dist.Normal(0.0, 1.0),
        torch.tensor([True, False]),
        torch.tensor([False, True]),
        validate_args=True,
    )
    lp = d.log_prob(torch.tensor([[math.nan, 1.0], [0.5, math.nan]]))
    np.testing.assert_allclose(lp.numpy(), [ref.logcdf(1.0), ref.logsf(0.5)], rtol=1e-12)
    with pytest.raises(ValueError, match="support"):
        d.log_prob(torch.tensor([[0.0, math.nan], [0.5, 1.0]]))
    both = dist.IntervalCensoredDistribution(dist.Normal(0.0, 1.0), validate_args=True)
    with pytest.raises(ValueError, match="support"):
        both.log_prob(torch.tensor([math.nan, 1.0]))


def test_upper_only_truncation_support_is_closed(float64):
    """``log_prob`` and ``rsample`` include ``high``, so the support must too (validation
    rejected ``log_prob(high)`` and, rarely, the distribution's own samples)."""
    d = dist.TruncatedNormal(0.0, 1.0, high=1.0, validate_args=True)
    expected = stats.truncnorm(-np.inf, 1.0).logpdf(1.0)
    np.testing.assert_allclose(float(d.log_prob(torch.tensor(1.0))), expected, rtol=1e-12)
    assert d.support.check(torch.tensor(1.0)) and not d.support.check(torch.tensor(1.0 + 1e-12))
    # float32 Exponential(1) below 1e-3: rounding can put draws exactly at the bound
    rate = torch.tensor(1.0, dtype=torch.float32)
    e = dist.TruncatedDistribution(dist.Exponential(rate), high=1e-3, validate_args=True)
    torch.manual_seed(0)
    x = torch.cat([e.sample((10**5,)), e.high.reshape(1)])
    assert bool(torch.isfinite(e.log_prob(x)).all())
    # biject_to of the closed half line: into the support, round trip, log-Jacobian
    t = dist.biject_to(d.support)
    y = torch.tensor([-5.0, 0.0, 3.0])
    fy = t(y)
    assert bool((fy < 1.0).all()) and bool(d.support.check(fy).all())
    torch.testing.assert_close(t.inv(fy), y)
    np.testing.assert_allclose(t.log_abs_det_jacobian(y, fy).numpy(), y.numpy(), rtol=1e-12)
    c = dist.Censored(dist.Normal(0.0, 1.0), high=0.0)
    assert dist.biject_to(c.support) is not None


FAR_TAIL_CASES = [
    (torch.float64, 38.0, 40.0),
    (torch.float64, -40.0, -38.0),
    (torch.float64, None, -40.0),
    (torch.float64, 40.0, None),
    (torch.float64, 300.0, 301.0),
    (torch.float32, 13.5, 15.0),
    (torch.float32, 20.0, 22.0),
    (torch.float32, -22.0, -20.0),
    (torch.float32, None, -20.0),
    (torch.float32, 20.0, None),
]


@pytest.mark.parametrize("dtype,low,high", FAR_TAIL_CASES)
def test_truncated_normal_far_tail_samples_match_scipy(dtype, low, high):
    """Beyond ``exp(log F) >= tiny`` (37.5 sd in float64, 13 in float32) the inverse cdf is
    taken in log space: the draws follow scipy's truncnorm (KS test, fixed seed; before,
    every draw was one bound)."""
    d = dist.TruncatedNormal(
        torch.tensor(0.0, dtype=dtype), torch.tensor(1.0, dtype=dtype), low, high
    )
    torch.manual_seed(4)
    x = d.sample((20000,))
    assert x.dtype == dtype and bool(torch.isfinite(x).all())
    if low is not None:
        assert bool((x >= low).all())
    if high is not None:
        assert bool((x <= high).all())
    ref = _scipy_truncnorm(0.0, 1.0, low, high)
    assert stats.kstest(x.double().numpy(), ref.cdf).pvalue > 1e-3


def test_truncated_exponential_far_tail_float32():
    """``S(120) = exp(-120)`` underflows float32: the upper side samples in log space too."""
    d = dist.TruncatedDistribution(dist.Exponential(torch.tensor(1.0)), low=120.0, high=121.0)
    torch.manual_seed(5)
    x = d.sample((20000,)).double().numpy()
    assert np.all((x >= 120.0) & (x <= 121.0))
    cdf = lambda t: -np.expm1(-(t - 120.0)) / -np.expm1(-1.0)  # noqa: E731
    assert stats.kstest(x, cdf).pvalue > 1e-3


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-11), (torch.float32, 1e-6)])
def test_ndtri_log_matches_scipy(dtype, rtol):
    """``Phi^{-1}(exp(log p))`` and its gradient ``Phi(z) / phi(z)`` against scipy's
    ``ndtri_exp``, from far below float underflow to ``p`` near 1."""
    lp = np.array([-1e5, -1e4, -800.0, -100.0, -30.0, -20.5, -20.0, -19.5, -5.0, -1.0, -0.5])
    lp = np.concatenate([lp, [-1e-3, -1e-6]]) if dtype == torch.float64 else lp
    log_p = torch.tensor(lp, dtype=dtype, requires_grad=True)
    z = _tails.ndtri_log(log_p)
    (grad,) = torch.autograd.grad(z.sum(), log_p)
    ref = special.ndtri_exp(lp)
    np.testing.assert_allclose(z.detach().double().numpy(), ref, rtol=rtol)
    ref_grad = np.exp(special.log_ndtr(ref) + 0.5 * ref**2 + 0.5 * np.log(2 * np.pi))
    np.testing.assert_allclose(grad.double().numpy(), ref_grad, rtol=100 * rtol)
    ends = _tails.ndtri_log(torch.tensor([-math.inf, 0.0], dtype=dtype))
    assert ends.tolist() == [-math.inf, math.inf]


BELOW_SUPPORT_CASES = [
    ("lognormal", lambda: dist.LogNormal(0.0, 1.0), stats.lognorm(1.0), -1.0, 2.0),
    ("weibull", lambda: dist.Weibull(1.0, 1.5), stats.weibull_min(1.5), -1.0, 2.0),
    ("halfnormal", lambda: dist.HalfNormal(1.0), stats.halfnorm(), -1.0, 2.0),
    ("exponential", lambda: dist.Exponential(1.0), stats.expon(), -1.0, 2.0),
    ("gamma", lambda: dist.Gamma(2.0, 1.0), stats.gamma(2.0), -1.0, 2.0),
    ("pareto", lambda: dist.Pareto(1.0, 2.0), stats.pareto(2.0), -1.0, 2.0),
    ("pareto-one-sided", lambda: dist.Pareto(1.0, 2.0), stats.pareto(2.0), 0.5, None),
    ("pareto-below-scale", lambda: dist.Pareto(1.0, 2.0), stats.pareto(2.0), 0.5, 3.0),
]


@pytest.mark.parametrize(
    "name,make,ref,low,high", BELOW_SUPPORT_CASES, ids=[c[0] for c in BELOW_SUPPORT_CASES]
)
def test_truncation_bound_below_the_base_support(name, make, ref, low, high, float64):
    """A bound outside the base's support truncates nothing there: it is clamped into the
    support (before: ``nan``, or for ``Pareto(1, 2)`` above 0.5 a wrong normalizer)."""
    d = dist.TruncatedDistribution(make(), low, high)
    x = np.array([1.2, 1.5, 1.9])
    log_z = 0.0 if high is None else ref.logcdf(high)
    np.testing.assert_allclose(
        d.log_prob(torch.tensor(x)).numpy(), ref.logpdf(x) - log_z, rtol=1e-10
    )
    if not d.has_rsample:
        return
    torch.manual_seed(6)
    s = d.sample((20000,)).numpy()
    assert np.all(np.isfinite(s)) and np.all(s >= ref.support()[0])
    cdf = (
        ref.cdf
        if high is None
        else (lambda t: np.minimum(ref.cdf(t), ref.cdf(high)) / ref.cdf(high))
    )
    assert stats.kstest(s, cdf).pvalue > 1e-3


def test_truncation_at_the_support_end_has_finite_gradients(float64):
    """``LogNormal`` truncated to ``[0, 2]`` (or ``[-1, 2]``): ``F(0) = 0`` exactly, and the
    gradients of ``log_prob`` and of ``rsample`` are finite (before: ``nan`` from ``log 0``);
    ``d/dloc log_prob(x) = log x - loc + phi(b) / Phi(b)``, ``b = log 2 - loc``."""
    for low in (0.0, -1.0):
        loc = torch.tensor(0.1, requires_grad=True)
        d = dist.TruncatedDistribution(dist.LogNormal(loc, 1.0), low, 2.0)
        (grad,) = torch.autograd.grad(d.log_prob(torch.tensor(1.5)), loc)
        b = math.log(2.0) - 0.1
        exact = math.log(1.5) - 0.1 + stats.norm.pdf(b) / stats.norm.cdf(b)
        assert float(grad) == pytest.approx(exact, rel=1e-10)
        (grad,) = torch.autograd.grad(d.rsample((100,)).sum(), loc)
        assert bool(torch.isfinite(grad))


@pytest.mark.parametrize("rate", [1e-3, 1e-5, 1e-8])
def test_hurdle_poisson_moments_small_rate_float32(rate):
    """``E[K | K > 0] = rate / (1 - e^-rate)``: the denominator from ``-expm1(log p0)``
    (before: ``1 - exp(-rate)`` rounded to 0 in float32 at rate 1e-8, mean ``inf``)."""
    gate = 0.4
    d = dist.HurdlePoisson(torch.tensor(rate), gate=torch.tensor(gate))
    mean = (1 - gate) * rate / -math.expm1(-rate)
    var = (1 - gate) * (rate + rate**2) / -math.expm1(-rate) - mean**2
    assert d.mean.dtype == torch.float32
    # float32: a few ulps of each operation
    assert float(d.mean) == pytest.approx(mean, rel=1e-6)
    assert float(d.variance) == pytest.approx(var, rel=1e-5)


@pytest.mark.parametrize("gate", [0.4, 0.9])
def test_hurdle_poisson_log_prob_float32_small_and_large_rates(gate):
    """``log P(k)`` for ``k > 0`` in float32 against float64 (scipy) at rates 1e-8..1e2.
    It is a sum of five terms (``log(1 - gate)``, ``(k - 1) log r``, ``-log k!``, ``-r``,
    ``-log((1 - e^-r) / r)``), each rounded once, and four additions, each rounding by at
    most eps/2 of its partial sum: the error is at most about ``eps * sum |terms|`` (2x
    margin below). Before, ``log r`` entered twice and cancelled: at rate 1e-5 the error
    was ``eps * |log r|``, 13 eps relative (1.6e-6) at k = 1."""
    eps = torch.finfo(torch.float32).eps
    rates = torch.logspace(-8, 2, 21, dtype=torch.float32)
    k = torch.tensor([1.0, 2.0, 3.0, 10.0]).unsqueeze(-1)
    gate32 = torch.tensor(gate, dtype=torch.float32)
    log_prob = dist.HurdlePoisson(rates, gate=gate32).log_prob(k)
    assert log_prob.dtype == torch.float32
    r, kn, g = rates.double().numpy(), k.double().numpy(), float(gate32)
    log_h = np.log(-np.expm1(-r) / r)
    exact = np.log1p(-g) + stats.poisson(r).logpmf(kn) - np.log(-np.expm1(-r))
    terms = abs(np.log1p(-g)) + np.abs((kn - 1) * np.log(r)) + special.gammaln(kn + 1)
    terms = terms + r + np.abs(log_h)
    error = np.abs(log_prob.double().numpy() - exact)
    assert np.all(error <= 2 * eps * terms), (error / (eps * terms)).max()
    by_logits = dist.HurdlePoisson(rates, gate_logits=torch.logit(gate32)).log_prob(k)
    torch.testing.assert_close(by_logits, log_prob)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hurdle_poisson_gradient_and_limits_at_tiny_and_zero_rates(dtype):
    """``d/dr log P(k) = (k - 1)/r - 1 - d/dr log((1 - e^-r)/r)`` against mpmath at rates
    1e-20..1e2: within a few eps of the sum of its terms' sizes. Before, the autograd
    gradient of ``log(-expm1(-r)/r)`` cancelled (k = 1: -1.0 instead of -0.5 at 1e-8 in
    float32, the wrong sign at 1e-16 in float64), rate 0 gave NaN (the limits are
    ``log(1 - gate)`` at k = 1 and -inf for k >= 2), and value 0 at a subnormal rate a NaN
    gradient."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    eps, gate = torch.finfo(dtype).eps, 0.3
    rates = torch.logspace(-20, 2, 45, dtype=torch.float64).to(dtype)
    for k in (1, 2, 3, 10):
        r = rates.clone().requires_grad_(True)
        log_prob = dist.HurdlePoisson(r, gate=torch.tensor(gate, dtype=dtype)).log_prob(
            torch.tensor(float(k), dtype=dtype)
        )
        (grad,) = torch.autograd.grad(log_prob.sum(), r)
        for i, rate in enumerate(rates.tolist()):
            x = mpmath.mpf(rate)  # the rate as rounded to dtype
            h = mpmath.log(-mpmath.expm1(-x) / x)
            dh = 1 / mpmath.expm1(x) - 1 / x
            value = mpmath.log(1 - mpmath.mpf(float(torch.tensor(gate, dtype=dtype))))
            value += (k - 1) * mpmath.log(x) - mpmath.loggamma(k + 1) - x - h
            terms = abs((k - 1) * mpmath.log(x)) + mpmath.loggamma(k + 1) + x + abs(h) + 1
            assert abs(float(log_prob.detach()[i]) - value) <= 4 * eps * terms, (k, rate)
            exact = (k - 1) / x - 1 - dh
            size = (k - 1) / x + 1 + abs(dh)
            assert abs(float(grad[i]) - exact) <= 4 * eps * size, (k, rate, float(grad[i]))
    # rate 0: the limits, finite gradients; value 0 at subnormal rates: finite gradients
    tiny = torch.finfo(dtype).tiny * eps
    r = torch.tensor([0.0, tiny, 1e-3], dtype=dtype, requires_grad=True)
    d = dist.HurdlePoisson(r, gate=torch.tensor(gate, dtype=dtype), validate_args=False)
    at_one = d.log_prob(torch.tensor(1.0, dtype=dtype))
    assert float(at_one.detach()[0]) == pytest.approx(math.log(1 - gate), rel=4 * eps)
    assert float(d.log_prob(torch.tensor(2.0, dtype=dtype)).detach()[0]) == -math.inf
    (grad,) = torch.autograd.grad(at_one.sum() + d.log_prob(torch.zeros((), dtype=dtype)).sum(), r)
    assert bool(torch.isfinite(grad).all()), grad
    assert float(grad[0]) == pytest.approx(-0.5, rel=4 * eps)


def test_biject_to_independent_uses_probtorch_transforms(float64):
    """``biject_to(independent(c, n))`` wraps probtorch's transform for ``c`` (before: torch's
    registry, which has none for zero_sum/lower_cholesky/positive_definite and gives its
    non-compiling ``CorrCholeskyTransform`` for corr_cholesky)."""
    IndependentTransform = torch.distributions.transforms.IndependentTransform
    site = dist.ZeroSumNormal(torch.tensor(1.0), (3,)).expand((2,)).to_event(1)
    t = dist.biject_to(site.support)
    assert isinstance(t, IndependentTransform) and isinstance(
        t.base_transform, dist.ZeroSumTransform
    )
    y = torch.randn(4, 2, 2)
    x = t(y)
    assert x.shape == (4, 2, 3) and bool(site.support.check(x).all())
    torch.testing.assert_close(t.inv(x), y)
    assert t.log_abs_det_jacobian(y, x).shape == (4,)
    assert torch.isfinite(site.log_prob(x)).all()
    cases = [
        (dist.constraints.lower_cholesky, dist.constraint_registry.LowerCholeskyVectorTransform),
        (
            dist.constraints.positive_definite,
            dist.constraint_registry.PositiveDefiniteVectorTransform,
        ),
        (dist.constraints.corr_cholesky, dist.constraint_registry.CompilableCorrCholeskyTransform),
    ]
    for base, cls in cases:
        t = dist.biject_to(dist.constraints.independent(base, 1))
        assert type(t.base_transform) is cls and t.reinterpreted_batch_ndims == 1
        y = torch.randn(2, 3)
        x = t(y)
        assert bool(dist.constraints.independent(base, 1).check(x))
        torch.testing.assert_close(t.inv(x), y)
    lkj = dist.LKJCholesky(3, torch.ones(2)).to_event(1)
    assert type(dist.biject_to(lkj.support).base_transform) is cls
    positive = dist.biject_to(dist.constraints.independent(dist.constraints.positive, 1))
    assert positive.base_transform == torch.distributions.biject_to(dist.constraints.positive)


def _mpmath_truncnorm_var(a, b):
    """Variance of the standard normal truncated to ``[a, b]`` by 40-digit quadrature (of
    ``X - a``, so that nothing cancels); scipy's loses 3 digits at ``a = 38``."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(40):
        a = -mp.inf if a is None else mp.mpf(a)
        b = mp.inf if b is None else mp.mpf(b)
        if a == -mp.inf and b == mp.inf:
            return 1.0
        if a == -mp.inf:  # reflect: the finite end first
            a, b = -b, mp.inf
        f = lambda x: mp.exp(-(x - a) * (x + a) / 2)  # noqa: E731
        z = mp.quad(f, [a, b])
        m = mp.quad(lambda x: (x - a) * f(x), [a, b]) / z
        return float(mp.quad(lambda x: (x - a - m) ** 2 * f(x), [a, b]) / z)


VARIANCE_CASES = [
    (0.3, 0.3001),  # narrow: w^2 / 12
    (5.0, 5.001),
    (-8.0, -7.99),
    (0.3, 0.6),
    (-2.0, 2.0),
    (2.0, 4.0),
    (1.9, 6.2),
    (8.0, 10.0),
    (38.0, 40.0),
    (40.0, None),
    (None, -40.0),
    (1e3, None),
    (-1.0, None),
    (None, None),
]


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_truncated_normal_variance_is_stable(dtype, rtol):
    """``Var`` from ``1 + a r_a - b r_b - (r_a - r_b)^2`` cancels to nothing in the tails and
    for narrow intervals (negative in float32); against 40-digit quadrature. float32: a
    few ulps times the condition of the moment sums (``rtol = 2e-5``)."""
    for low, high in VARIANCE_CASES:
        loc, scale = 0.7, 1.3
        lo = None if low is None else loc + scale * low
        hi = None if high is None else loc + scale * high
        if low is None and high is None:
            lo, hi = -math.inf, math.inf  # infinite bounds: the normal itself
        d = dist.TruncatedNormal(
            torch.tensor(loc, dtype=dtype), torch.tensor(scale, dtype=dtype), lo, hi
        )
        # the reference for the parameters as stored (float32-rounded bounds move a narrow
        # interval's width by more than the tolerance)
        loc_, scale_ = float(d.loc), float(d.scale)
        a = None if low is None else (float(d.low) - loc_) / scale_
        b = None if high is None else (float(d.high) - loc_) / scale_
        exact = scale_**2 * _mpmath_truncnorm_var(a, b)
        got = float(d.variance)
        assert got == pytest.approx(exact, rel=rtol), (low, high, got, exact)


def _mpmath_truncnorm_mean(a, b):
    """Mean of the standard normal truncated to ``[a, b]`` (not both None), 40-digit
    quadrature of ``X - a`` (of the unshifted ``X`` it is off by 1e-6 at ``a = 40``)."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(40):
        if a is None:  # reflect: the finite end first
            return -_mpmath_truncnorm_mean(-b, None)
        a, b = mp.mpf(a), mp.inf if b is None else mp.mpf(b)
        f = lambda x: mp.exp(-(x - a) * (x + a) / 2)  # noqa: E731
        return float(a + mp.quad(lambda x: (x - a) * f(x), [a, b]) / mp.quad(f, [a, b]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_truncated_normal_mean_is_stable(dtype):
    """``loc + scale (r_low - r_high)`` cancels in narrow intervals and far tails (in
    float32 it put the mean of ``[5, 5.0001]`` at 5.0059, outside the support); against
    40-digit quadrature, to a few ulps of the mean plus 1e-3 of its sd."""
    eps = torch.finfo(dtype).eps
    for low, high in VARIANCE_CASES[:-1]:
        loc, scale = 0.7, 1.3
        lo = None if low is None else loc + scale * low
        hi = None if high is None else loc + scale * high
        d = dist.TruncatedNormal(
            torch.tensor(loc, dtype=dtype), torch.tensor(scale, dtype=dtype), lo, hi
        )
        loc_, scale_ = float(d.loc), float(d.scale)
        a = None if low is None else (float(d.low) - loc_) / scale_
        b = None if high is None else (float(d.high) - loc_) / scale_
        exact = loc_ + scale_ * _mpmath_truncnorm_mean(a, b)
        sd = scale_ * math.sqrt(_mpmath_truncnorm_var(a, b))
        got = float(d.mean)
        assert abs(got - exact) <= 4 * eps * abs(exact) + 1e-3 * sd, (low, high, got, exact)
        assert bool(d.support.check(d.mean)), (low, high, got)


@pytest.mark.parametrize("low,high", [(0.3, 0.31), (38.0, 40.0), (None, -40.0), (1.9, 6.2)])
def test_truncated_normal_variance_gradient(low, high, float64):
    """The variance's gradient (through the quadrature) against central differences; the
    difference error is ``h^2 f''' ~ 1e-12`` plus rounding ``eps var / h ~ 1e-10 var``."""
    loc = torch.tensor(0.1, requires_grad=True)
    scale = torch.tensor(1.2, requires_grad=True)
    var = dist.TruncatedNormal(loc, scale, low, high).variance
    grads = torch.autograd.grad(var, [loc, scale])
    h = 1e-6

    def v(lc, sc):
        return float(dist.TruncatedNormal(lc, sc, low, high).variance)

    fd = [
        (v(0.1 + h, 1.2) - v(0.1 - h, 1.2)) / (2 * h),
        (v(0.1, 1.2 + h) - v(0.1, 1.2 - h)) / (2 * h),
    ]
    for g, ref in zip(grads, fd, strict=True):
        assert float(g) == pytest.approx(ref, rel=1e-6, abs=1e-9 * float(var.detach()))


def _closed_and_independent_model():
    pt.sample("x", dist.TruncatedNormal(0.0, 1.0, high=-1.0))  # support less_than_eq(-1)
    pt.sample("z", dist.ZeroSumNormal(torch.tensor(1.0), (3,)).expand((2,)).to_event(1))


def test_nuts_on_upper_truncated_and_independent_zero_sum_sites(float64):
    """NUTS through ``biject_to(less_than_eq)`` and ``biject_to(independent(zero_sum, 1))``:
    the truncated site's mean (scipy) and the zero-sum site's ``E z^2 = 1 - 1/3`` within
    ``Z_MAX`` Monte Carlo standard errors (from the effective sample size). Eager (the
    bijections are what is tested; a compile of its own would cost about 40 s)."""
    from probtorch.inference import MCMC, NUTS

    mcmc = MCMC(
        NUTS(_closed_and_independent_model, compile=False),
        num_warmup=100,
        num_samples=150,
        num_chains=1,
        progress_bar=False,
        seed=0,
    )
    mcmc.run()
    samples = mcmc.get_samples()
    x, z = samples["x"].numpy(), samples["z"].numpy()
    assert x.shape == (150,) and z.shape == (150, 2, 3)
    assert np.all(x <= -1.0) and np.abs(z.sum(-1)).max() < 1e-10
    checks = [(x, stats.truncnorm(-np.inf, -1.0).mean())]
    checks += [(z[:, i, j] ** 2, 2.0 / 3.0) for i in range(2) for j in range(3)]
    for draws, exact in checks:
        mcse = draws.std() / math.sqrt(float(az.ess(draws[None, :])))
        assert abs(draws.mean() - exact) < Z_MAX * mcse, (draws.mean(), exact, mcse)


def test_interval_censored_refuses_a_row_whose_ends_are_swapped():
    d = dist.IntervalCensoredDistribution(
        dist.Normal(0.0, 1.0),
        left_censored=torch.tensor([False, True]),
        right_censored=torch.tensor([False, False]),
    )
    # the left-censored row's lower end is unused: any order is fine there
    assert torch.isfinite(d.log_prob(torch.tensor([[0.0, 1.0], [3.0, 1.0]]))).all()
    with pytest.raises(ValueError, match="IntervalCensoredSupport"):
        d.log_prob(torch.tensor([[1.0, 0.0], [3.0, 1.0]]))


def test_a_hurdle_familys_parameter_error_names_it():
    with pytest.raises(ValueError, match=r"HurdlePoisson: Expected parameter rate"):
        dist.HurdlePoisson(rate=torch.tensor(-2.0), gate=torch.tensor(0.3), validate_args=True)
    with pytest.raises(ValueError, match=r"HurdleNegativeBinomial: Expected parameter probs"):
        dist.HurdleNegativeBinomial(3.0, probs=torch.tensor(1.5), gate=0.2, validate_args=True)
