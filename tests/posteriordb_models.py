"""The 14 posteriors of ``../shared/posteriordb`` as probtorch models.

Each model restates the corresponding section of ``../shared/posteriordb/MODELS.md``
(Stan's parameterisations: Normal and Student-t by scale, Gamma by rate). Usage::

    model, args, kwargs, to_reference = make("eight_schools-eight_schools_noncentered")
    mcmc = MCMC(NUTS(model, **nuts_kwargs(name)), ...)
    mcmc.run(*args, **kwargs)
    to_reference(mcmc.get_samples())  # {"theta[1]": array, ..., "mu": array, "tau": array}

Data are float64 tensors; the models are meant to run with ``torch.float64`` as the default
dtype (as in ``tests/models.py``), so that their parameters and latent sites are float64
too. ``latent_values(name, draws)`` maps reference draws (constrained, posteriordb names)
back to the model's latent sites, for checking log densities at reference draws.

Conventions:

- "flat" priors (no Stan prior statement) are ``dist.ImproperUniform`` on the declared
  support; ``ordered`` / ``positive_ordered`` parameters with normal priors are an
  ``ImproperUniform`` on that support plus a ``pt.factor`` with the (unnormalised) prior.
- Non-centred models keep Stan's sampled parameters (``theta_trans``, ``f_tilde``) as
  latent sites and record the natural quantities the draws hold (``theta``, ``f``) with
  ``pt.deterministic``.
"""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.distributions import constraints

POSTERIORDB = pathlib.Path(__file__).resolve().parents[2] / "shared" / "posteriordb"

__all__ = ["POSTERIORDB", "NAMES", "make", "nuts_kwargs", "latent_values", "posteriordb_module"]


def posteriordb_module(name: str = "load"):
    """Import ``../shared/posteriordb/<name>.py`` (``load`` or ``check_models``)."""
    path = POSTERIORDB / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (../shared is not in this checkout)")
    spec = importlib.util.spec_from_file_location(f"posteriordb_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _f64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64))


# ---------------------------------------------------------------------------------------
# models


def eight_schools_noncentered(sigma, y):
    mu = pt.sample("mu", dist.Normal(0.0, 5.0))
    tau = pt.sample("tau", dist.HalfCauchy(5.0))
    with pt.plate("J", sigma.shape[0]):
        theta_trans = pt.sample("theta_trans", dist.Normal(0.0, 1.0))
        theta = pt.deterministic("theta", mu + tau * theta_trans)
        pt.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_centered(sigma, y):
    mu = pt.sample("mu", dist.Normal(0.0, 5.0))
    tau = pt.sample("tau", dist.HalfCauchy(5.0))
    with pt.plate("J", sigma.shape[0]):
        theta = pt.sample("theta", dist.Normal(mu, tau))
        pt.sample("y", dist.Normal(theta, sigma), obs=y)


def dogs(y):
    """Bernoulli-logit regression on each dog's earlier avoidances and shocks."""
    n_dogs, n_trials = y.shape
    n_shock = y.cumsum(-1) - y  # shocks before trial t
    n_avoid = torch.arange(n_trials, dtype=y.dtype) - n_shock  # avoidances before trial t
    beta = pt.sample("beta", dist.Normal(0.0, 100.0).expand([3]).to_event(1))
    with pt.plate("dogs", n_dogs, dim=-2), pt.plate("trials", n_trials, dim=-1):
        logits = beta[0] + beta[1] * n_avoid + beta[2] * n_shock
        pt.sample("y", dist.Bernoulli(logits=logits), obs=y)


def kidscore_interaction(mom_hs, mom_iq, kid_score):
    beta = pt.sample("beta", dist.ImproperUniform(constraints.real, (), (4,)))
    sigma = pt.sample("sigma", dist.HalfCauchy(2.5))
    with pt.plate("N", kid_score.shape[0]):
        mean = beta[0] + beta[1] * mom_hs + beta[2] * mom_iq + beta[3] * mom_hs * mom_iq
        pt.sample("kid_score", dist.Normal(mean, sigma), obs=kid_score)


def ar_k(y, K):
    """AR(K), conditional on the first K values."""
    T = y.shape[0]
    alpha = pt.sample("alpha", dist.Normal(0.0, 10.0))
    beta = pt.sample("beta", dist.Normal(0.0, 10.0).expand([K]).to_event(1))
    sigma = pt.sample("sigma", dist.HalfCauchy(2.5))
    lags = y.unfold(0, K, 1)[:-1].flip(-1)  # row t - K: y[t-1], ..., y[t-K]
    with pt.plate("time", T - K):
        pt.sample("y", dist.Normal(alpha + lags @ beta, sigma), obs=y[K:])


def _sq_exp_kernel(x, alpha, rho):
    d2 = (x[:, None] - x[None, :]) ** 2
    return alpha**2 * torch.exp(-0.5 * d2 / rho**2)


def _cholesky_or_nan(cov):
    """Cholesky factor, or NaNs where the factorization fails.

    Far out in the tails (e.g. the first leapfrog steps of the step-size search) the
    kernel matrix can be numerically indefinite. ``torch.linalg.cholesky`` would raise and
    stop all chains; NaN makes the potential NaN, which NUTS treats as a divergence.
    """
    L, info = torch.linalg.cholesky_ex(cov)
    return torch.where(info == 0, L, torch.full_like(L, float("nan")))


def gp_pois_regr(x, k):
    """Latent GP (non-centred: f = L f_tilde) with a Poisson likelihood."""
    n = x.shape[0]
    rho = pt.sample("rho", dist.Gamma(25.0, 4.0))
    alpha = pt.sample("alpha", dist.HalfNormal(2.0))
    L = _cholesky_or_nan(_sq_exp_kernel(x, alpha, rho) + 1e-10 * torch.eye(n, dtype=x.dtype))
    with pt.plate("N", n):
        f_tilde = pt.sample("f_tilde", dist.Normal(0.0, 1.0))
        f = pt.deterministic("f", L @ f_tilde)
        pt.sample("k", dist.Poisson(torch.exp(f)), obs=k)


def gp_regr(x, y):
    """GP regression, marginalised. Upstream adds sigma itself (not sigma^2) to the diagonal."""
    n = x.shape[0]
    rho = pt.sample("rho", dist.Gamma(25.0, 4.0))
    alpha = pt.sample("alpha", dist.HalfNormal(2.0))
    sigma = pt.sample("sigma", dist.HalfNormal(1.0))
    L = _cholesky_or_nan(_sq_exp_kernel(x, alpha, rho) + sigma * torch.eye(n, dtype=x.dtype))
    pt.sample("y", dist.MultivariateNormal(torch.zeros(n, dtype=x.dtype), scale_tril=L), obs=y)


def diamonds(X, Y):
    """brms' linear regression with centred predictors (column 1 of X is the intercept)."""
    Xc = X[:, 1:] - X[:, 1:].mean(0)
    b = pt.sample("b", dist.Normal(0.0, 1.0).expand([Xc.shape[1]]).to_event(1))
    intercept = pt.sample("Intercept", dist.StudentT(3.0, 8.0, 10.0))
    sigma = pt.sample("sigma", dist.FoldedDistribution(dist.StudentT(3.0, 0.0, 10.0)))
    with pt.plate("N", Y.shape[0]):
        pt.sample("Y", dist.Normal(intercept + Xc @ b, sigma), obs=Y)


def linear_regression_flat(X, y):
    """y ~ N(X beta, sigma) with flat priors on beta and on sigma > 0 (mesquite, nes)."""
    beta = pt.sample("beta", dist.ImproperUniform(constraints.real, (), (X.shape[1],)))
    sigma = pt.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
    with pt.plate("N", y.shape[0]):
        pt.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def garch11(y, sigma1):
    """GARCH(1,1); flat prior on {alpha0 > 0, alpha1 > 0, beta1 > 0, alpha1 + beta1 < 1}."""
    T = y.shape[0]
    real, positive = constraints.real, constraints.positive
    mu = pt.sample("mu", dist.ImproperUniform(real, (), ()))
    alpha0 = pt.sample("alpha0", dist.ImproperUniform(positive, (), ()))
    alpha1 = pt.sample("alpha1", dist.ImproperUniform(constraints.unit_interval, (), ()))
    # Flat on the triangle, so *not* Uniform(0, 1 - alpha1), whose density 1 / (1 - alpha1)
    # would change the posterior.
    beta1 = pt.sample("beta1", dist.ImproperUniform(constraints.interval(0.0, 1 - alpha1), (), ()))
    # The recursion s_t^2 = alpha0 + alpha1 (y_{t-1} - mu)^2 + beta1 s_{t-1}^2, s_1 = sigma1,
    # unrolled: s_t^2 = beta1^(t-1) sigma1^2 + sum_{j<t} beta1^(t-1-j) (alpha0 + alpha1 e_j^2)
    # with e_j = y_j - mu (1-based t, j). One (T, T-1) matrix of powers instead of T steps.
    t = torch.arange(T, dtype=y.dtype)
    lag = t[:, None] - 1 - t[None, :-1]  # (t-1) - j, 0-based
    log_beta1 = torch.log(beta1)
    powers = torch.where(lag >= 0, torch.exp(lag.clamp(min=0) * log_beta1), torch.zeros_like(lag))
    innovations = alpha0 + alpha1 * (y[:-1] - mu) ** 2
    sigma2 = torch.exp(t * log_beta1) * sigma1**2 + powers @ innovations
    with pt.plate("time", T):
        pt.sample("y", dist.Normal(mu, torch.sqrt(sigma2)), obs=y)


def low_dim_gauss_mix(y):
    """Two-component normal mixture with ordered means."""
    mu = pt.sample("mu", dist.ImproperUniform(constraints.ordered_vector, (), (2,)))
    pt.factor("mu_prior", dist.Normal(0.0, 2.0).log_prob(mu).sum())
    with pt.plate("components", 2):
        sigma = pt.sample("sigma", dist.HalfNormal(2.0))
    theta = pt.sample("theta", dist.Beta(5.0, 5.0))
    mixing = dist.Categorical(probs=torch.stack([theta, 1 - theta], -1))
    with pt.plate("N", y.shape[0]):
        pt.sample("y", dist.MixtureSameFamily(mixing, dist.Normal(mu, sigma)), obs=y)


def _log_matmul_exp(a, b):
    """log(exp(a) @ exp(b)) over the last two dims, stably."""
    return torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], dim=-2)


def _log_matrix_product(m):
    """log(exp(m[0]) @ exp(m[1]) @ ... @ exp(m[-1])) for m of shape (T, K, K).

    Multiplies neighbouring pairs in parallel, about log2(T) rounds; the loop is over static
    shapes, so it traces the same way for every value.
    """
    while m.shape[0] > 1:
        even = m.shape[0] // 2 * 2
        pairs = _log_matmul_exp(m[0:even:2], m[1:even:2])
        m = torch.cat([pairs, m[even:]]) if even < m.shape[0] else pairs
    return m[0]


def hmm_example(y):
    """Two-state HMM with N(mu_k, 1) emissions, the states marginalised.

    Stan's forward algorithm starts from gamma_1(k) = log N(y_1 | mu_k, 1) (no initial
    distribution) and applies gamma_t(k) = logsumexp_j(gamma_{t-1}(j) + log Theta[j, k])
    + log N(y_t | mu_k, 1). That is a product of the (K, K) matrices
    Theta[j, k] N(y_t | mu_k, 1), computed here in log space as a parallel product.
    (``DiscreteHMM`` would do the same, but it puts its initial distribution on the state
    before the first observation.)
    """
    theta1 = pt.sample("theta1", dist.Dirichlet(torch.ones(2, dtype=y.dtype)))
    theta2 = pt.sample("theta2", dist.Dirichlet(torch.ones(2, dtype=y.dtype)))
    mu = pt.sample("mu", dist.ImproperUniform(constraints.positive_ordered_vector, (), (2,)))
    prior_loc = torch.tensor([3.0, 10.0], dtype=y.dtype)
    pt.factor("mu_prior", dist.Normal(prior_loc, 1.0).log_prob(mu).sum())
    log_emission = dist.Normal(mu, 1.0).log_prob(y[:, None])  # (N, K)
    log_transition = torch.log(torch.stack([theta1, theta2], -2))  # [j, k] = P(k | j)
    steps = log_transition + log_emission[1:, None, :]  # (N - 1, K, K)
    log_forward = log_emission[0, :, None] + _log_matrix_product(steps)
    pt.factor("y", torch.logsumexp(log_forward.flatten(), 0))


def kilpisjarvi(x, y, pmualpha, psalpha, pmubeta, psbeta):
    alpha = pt.sample("alpha", dist.Normal(pmualpha, psalpha))
    beta = pt.sample("beta", dist.Normal(pmubeta, psbeta))
    sigma = pt.sample("sigma", dist.ImproperUniform(constraints.positive, (), ()))
    with pt.plate("N", y.shape[0]):
        pt.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


# ---------------------------------------------------------------------------------------
# data


def _eight_schools_data(d):
    return (_f64(d["sigma"]), _f64(d["y"])), {}


def _mesquite_data(d):
    cols = ["diam1", "diam2", "canopy_height", "total_height", "density", "group"]
    X = np.column_stack([np.ones(d["N"])] + [d[c] for c in cols])
    return (_f64(X), _f64(d["weight"])), {}


def _nes_data(d):
    age = d["age_discrete"]
    X = np.column_stack(
        [np.ones(d["N"]), d["real_ideo"], d["race_adj"], age == 2, age == 3, age == 4]
        + [d["educ1"], d["gender"], d["income"]]
    )
    return (_f64(X), _f64(d["partyid7"])), {}


def _kilpisjarvi_data(d):
    keys = ["pmualpha", "psalpha", "pmubeta", "psbeta"]
    return (_f64(d["x"]), _f64(d["y"])) + tuple(_f64(d[k]) for k in keys), {}


@dataclass(frozen=True)
class _Posterior:
    model: Callable
    data: Callable  # load.load_data(name) -> (args, kwargs)
    # sites holding the draws, in the draws' order: (site, length of a vector site or None)
    draws: tuple


_DRAWS_8 = (("theta", 8), ("mu", None), ("tau", None))
_GP = (("rho", None), ("alpha", None))

POSTERIORS = {
    "eight_schools-eight_schools_noncentered": _Posterior(
        eight_schools_noncentered, _eight_schools_data, _DRAWS_8
    ),
    "eight_schools-eight_schools_centered": _Posterior(
        eight_schools_centered, _eight_schools_data, _DRAWS_8
    ),
    "dogs-dogs": _Posterior(dogs, lambda d: ((_f64(d["y"]),), {}), (("beta", 3),)),
    "kidiq-kidscore_interaction": _Posterior(
        kidscore_interaction,
        lambda d: ((_f64(d["mom_hs"]), _f64(d["mom_iq"]), _f64(d["kid_score"])), {}),
        (("beta", 4), ("sigma", None)),
    ),
    "arK-arK": _Posterior(
        ar_k,
        lambda d: ((_f64(d["y"]),), {"K": int(d["K"])}),
        (("alpha", None), ("beta", 5), ("sigma", None)),
    ),
    "gp_pois_regr-gp_pois_regr": _Posterior(
        gp_pois_regr, lambda d: ((_f64(d["x"]), _f64(d["k"])), {}), _GP + (("f", 11),)
    ),
    "gp_pois_regr-gp_regr": _Posterior(
        gp_regr, lambda d: ((_f64(d["x"]), _f64(d["y"])), {}), _GP + (("sigma", None),)
    ),
    "diamonds-diamonds": _Posterior(
        diamonds,
        lambda d: ((_f64(d["X"]), _f64(d["Y"])), {}),
        (("b", 24), ("Intercept", None), ("sigma", None)),
    ),
    "mesquite-mesquite": _Posterior(
        linear_regression_flat, _mesquite_data, (("beta", 7), ("sigma", None))
    ),
    "nes2000-nes": _Posterior(linear_regression_flat, _nes_data, (("beta", 9), ("sigma", None))),
    "garch-garch11": _Posterior(
        garch11,
        lambda d: ((_f64(d["y"]), _f64(d["sigma1"])), {}),
        (("mu", None), ("alpha0", None), ("alpha1", None), ("beta1", None)),
    ),
    "low_dim_gauss_mix-low_dim_gauss_mix": _Posterior(
        low_dim_gauss_mix,
        lambda d: ((_f64(d["y"]),), {}),
        (("mu", 2), ("sigma", 2), ("theta", None)),
    ),
    "hmm_example-hmm_example": _Posterior(
        hmm_example, lambda d: ((_f64(d["y"]),), {}), (("theta1", 2), ("theta2", 2), ("mu", 2))
    ),
    "kilpisjarvi_mod-kilpisjarvi": _Posterior(
        kilpisjarvi, _kilpisjarvi_data, (("alpha", None), ("beta", None), ("sigma", None))
    ),
}

NAMES = sorted(POSTERIORS)


def _draw_names(site: str, size: int | None) -> list[str]:
    return [site] if size is None else [f"{site}[{i}]" for i in range(1, size + 1)]


def _to_reference(sites):
    def to_reference(samples: dict) -> dict[str, np.ndarray]:
        """``get_samples()``-style draws (leading batch dims) -> {posteriordb name: array}."""
        out = {}
        for site, size in sites:
            value = torch.as_tensor(samples[site]).detach().cpu().numpy()
            if size is None:
                out[site] = value
            else:
                for i, draw_name in enumerate(_draw_names(site, size)):
                    out[draw_name] = value[..., i]
        return out

    return to_reference


def make(name: str):
    """``(model, args, kwargs, to_reference)`` for posterior ``name``.

    ``args``/``kwargs`` hold the data as float64 tensors (``arK``'s lag count ``K`` is an
    int); ``to_reference(samples)`` maps a ``{site: draws}`` dict with any leading batch
    dimensions (``mcmc.get_samples()`` or ``get_samples(group_by_chain=True)``) to
    ``{draw name: numpy array}`` in the reference draws' order.
    """
    posterior = POSTERIORS[name]
    args, kwargs = posterior.data(posteriordb_module("load").load_data(name))
    return posterior.model, args, kwargs, _to_reference(posterior.draws)


def nuts_kwargs(name: str) -> dict:
    """NUTS options matching the reference's Stan controls (adapt_delta, max_treedepth)."""
    info = posteriordb_module("load").reference_info(name)
    control = info["inference"]["method_arguments"].get("control") or {}
    kwargs = {}
    if "adapt_delta" in control:
        kwargs["target_accept_prob"] = float(control["adapt_delta"])
    if "max_treedepth" in control:
        kwargs["max_tree_depth"] = int(control["max_treedepth"])
    return kwargs


def latent_values(name: str, draws: dict) -> dict[str, torch.Tensor]:
    """Constrained values of the model's latent sites at reference draws.

    ``draws`` maps posteriordb names to arrays of shape ``(n,)``; the result maps latent
    site names to float64 tensors with a leading dimension ``n``.
    """
    posterior = POSTERIORS[name]
    values = {}
    for site, size in posterior.draws:
        columns = [_f64(draws[n]) for n in _draw_names(site, size)]
        values[site] = columns[0] if size is None else torch.stack(columns, -1)
    if name == "eight_schools-eight_schools_noncentered":
        theta = values.pop("theta")
        values["theta_trans"] = (theta - values["mu"][:, None]) / values["tau"][:, None]
    elif name == "gp_pois_regr-gp_pois_regr":
        x = _f64(posteriordb_module("load").load_data(name)["x"])
        rho, alpha, f = values["rho"], values["alpha"], values.pop("f")
        cov = torch.func.vmap(_sq_exp_kernel, (None, 0, 0))(x, alpha, rho)
        L = torch.linalg.cholesky(cov + 1e-10 * torch.eye(x.shape[0], dtype=x.dtype))
        values["f_tilde"] = torch.linalg.solve_triangular(L, f[..., None], upper=False)[..., 0]
    return values
