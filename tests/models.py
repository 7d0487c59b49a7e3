"""Small models shared by the tests, each with a function making its data.

Data follow torch's default dtype (tests switch it to float64 where they need to).
"""

import torch

import probtorch as pt
import probtorch.distributions as dist

EIGHT_Y = [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]
EIGHT_SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]


def eight_schools(sigma, y=None):
    mu = pt.sample("mu", dist.Normal(0.0, 5.0))
    tau = pt.sample("tau", dist.HalfCauchy(5.0))
    with pt.plate("J", len(sigma)):
        theta = pt.sample("theta", dist.Normal(mu, tau))
        pt.sample("y", dist.Normal(theta, sigma), obs=y)


def eight_schools_data(dtype=None):
    dtype = dtype or torch.get_default_dtype()
    return (torch.tensor(EIGHT_SIGMA, dtype=dtype),), {"y": torch.tensor(EIGHT_Y, dtype=dtype)}


def logistic_regression(X, y=None):
    beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    intercept = pt.sample("intercept", dist.Normal(0.0, 2.0))
    with pt.plate("N", X.shape[0]):
        pt.sample("y", dist.Bernoulli(logits=intercept + X @ beta), obs=y)


def logistic_regression_data(n=200, d=5, seed=0, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=dtype)
    w = torch.randn(d, generator=g, dtype=dtype)
    y = torch.bernoulli(torch.sigmoid(X @ w), generator=g)
    return (X,), {"y": y}


def constrained_sites(y):
    """Simplex, positive-ordered and correlation-Cholesky latent sites."""
    weights = pt.sample("weights", dist.Dirichlet(torch.ones(3, dtype=y.dtype)))
    scales = pt.sample(
        "scales",
        dist.ImproperUniform(dist.constraints.positive_ordered_vector, (), (3,)),
    )
    pt.factor("scales_prior", dist.HalfNormal(torch.ones(3, dtype=y.dtype)).log_prob(scales).sum())
    corr = pt.sample("corr", dist.LKJCholesky(3, torch.tensor(2.0, dtype=y.dtype)))
    scale_tril = (scales * weights.sqrt())[..., None] * corr
    with pt.plate("n", y.shape[0]):
        pt.sample(
            "y",
            dist.MultivariateNormal(torch.zeros(3, dtype=y.dtype), scale_tril=scale_tril),
            obs=y,
        )


def constrained_sites_data(n=30, seed=1, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, 3, generator=g, dtype=dtype)
        @ torch.tensor([[1.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.2, 0.3, 2.0]], dtype=dtype),
    ), {}


def hierarchical_regression(group, x, num_groups, y=None):
    """Varying intercepts with nested plates, a mask and a bounded (dependent-support) scale."""
    mu_a = pt.sample("mu_a", dist.Normal(0.0, 5.0))
    sigma_a = pt.sample("sigma_a", dist.HalfNormal(2.0))
    slope = pt.sample("slope", dist.Normal(0.0, 1.0))
    upper = pt.sample("upper", dist.Gamma(2.0, 1.0))
    sigma_y = pt.sample("sigma_y", dist.Uniform(0.0, upper + 1.0))  # support depends on upper
    with pt.plate("groups", num_groups):
        a = pt.sample("a", dist.Normal(mu_a, sigma_a))
    with pt.plate("obs", x.shape[0]):
        mean = a[group] + slope * x
        pt.deterministic("mean", mean)
        with pt.handlers.mask(mask=x > -2.5):
            pt.sample("y", dist.Normal(mean, sigma_y), obs=y)


def hierarchical_regression_data(n=60, num_groups=5, seed=2, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(seed)
    group = torch.randint(0, num_groups, (n,), generator=g)
    x = torch.randn(n, generator=g, dtype=dtype)
    y = 1.0 + 0.5 * torch.randn(num_groups, generator=g, dtype=dtype)[group] + 0.7 * x
    y = y + 0.3 * torch.randn(n, generator=g, dtype=dtype)
    return (group, x, num_groups), {"y": y}


def missing_data(y, observed):
    """obs_mask imputation, a 2-d plate layout and a Student-t likelihood."""
    loc = pt.sample("loc", dist.Normal(0.0, 3.0))
    df = pt.sample("df", dist.Gamma(5.0, 0.5))
    with pt.plate("rows", y.shape[0], dim=-2), pt.plate("cols", y.shape[1], dim=-1):
        row_shift = pt.sample("shift", dist.Normal(0.0, 1.0))
        pt.sample("y", dist.StudentT(df, loc + row_shift, 1.0), obs=y, obs_mask=observed)


def missing_data_data(seed=3, dtype=None):
    dtype = dtype or torch.get_default_dtype()
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(4, 3, generator=g, dtype=dtype) + 1.0
    observed = torch.rand(4, 3, generator=g) > 0.25
    return (y, observed), {}


MODELS = {
    "eight_schools": (eight_schools, eight_schools_data),
    "logistic_regression": (logistic_regression, logistic_regression_data),
    "constrained_sites": (constrained_sites, constrained_sites_data),
    "hierarchical_regression": (hierarchical_regression, hierarchical_regression_data),
    "missing_data": (missing_data, missing_data_data),
}
