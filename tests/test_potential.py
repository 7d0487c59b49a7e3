"""Model -> potential: compiled equals eager, no graph breaks, no recompiles, clear errors."""

import math
import sys
import warnings

import arviz as az
import numpy as np
import pytest
import torch
from models import EIGHT_SIGMA, EIGHT_Y, MODELS, eight_schools, eight_schools_data
from scipy import stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference.compile import compile_enabled, count_compiles
from probtorch.inference.init_strategies import (
    init_to_feasible,
    init_to_mean,
    init_to_median,
    init_to_sample,
    init_to_uniform,
    init_to_value,
)
from probtorch.inference.potential import InitializationError, Potential, initialize_model


def _points(z0, num=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [z0 + 0.5 * torch.randn(z0.shape, generator=g, dtype=z0.dtype) for _ in range(num)]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_equals_eager_without_breaks_or_recompiles(name, float64):
    model, make_data = MODELS[name]
    args, kwargs = make_data()
    eager, z0 = initialize_model(model, args, kwargs, num_chains=3, compile=False)
    compiled, _ = initialize_model(model, args, kwargs, num_chains=3, compile=True)
    assert not eager.compiled and compiled.compiled
    with count_compiles() as warmup:
        compiled.value_and_grad(z0)
    assert warmup.graph_breaks == 0
    assert warmup.graphs == 1
    with count_compiles() as stats, torch.compiler.set_stance("fail_on_recompile"):
        for z in _points(z0):
            value, grad = compiled.value_and_grad(z)
            ref_value, ref_grad = eager.value_and_grad(z)
            assert value.dtype == torch.float64 and value.shape == (3,)
            assert grad.shape == z.shape
            torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-10)
    assert stats.graph_breaks == 0 and stats.graphs == 0


def _eight_schools_log_joint(mu, tau, theta):
    """Centered eight schools by scipy, tau on the log scale (Jacobian included)."""
    y, sigma = np.array(EIGHT_Y), np.array(EIGHT_SIGMA)
    return (
        stats.norm(0, 5).logpdf(mu)
        + stats.halfcauchy(scale=5).logpdf(tau)
        + np.log(tau)
        + stats.norm(mu, tau).logpdf(theta).sum()
        + stats.norm(theta, sigma).logpdf(y).sum()
    )


def test_eight_schools_potential_matches_scipy(float64):
    args, kwargs = eight_schools_data()
    potential, z0 = initialize_model(eight_schools, args, kwargs, num_chains=4, compile=False)
    assert potential.site_names == ["mu", "tau", "theta"]
    values = potential(z0)
    for c in range(4):
        mu, log_tau, theta = z0[c, 0].item(), z0[c, 1].item(), z0[c, 2:].numpy()
        expected = -_eight_schools_log_joint(mu, math.exp(log_tau), theta)
        assert values[c].item() == pytest.approx(expected, rel=1e-12)


def test_gradient_matches_finite_differences(float64):
    model, make_data = MODELS["hierarchical_regression"]
    args, kwargs = make_data()
    potential, z0 = initialize_model(model, args, kwargs, num_chains=2, compile=False)
    _, grad = potential.value_and_grad(z0)
    eps = 1e-6
    for i in range(potential.dim):
        step = torch.zeros_like(z0)
        step[:, i] = eps
        numeric = (potential(z0 + step) - potential(z0 - step)) / (2 * eps)
        torch.testing.assert_close(grad[:, i], numeric, rtol=1e-6, atol=1e-6)


def test_eight_schools_matches_posteriordb_density(shared_dir, float64):
    """Differences of our potential equal differences of posteriordb's reference density."""
    sys.path.insert(0, str(shared_dir / "posteriordb"))
    try:
        import check_models
        import load
    finally:
        sys.path.pop(0)
    data = load.load_data("eight_schools-eight_schools_centered")
    _, to_u, logp = check_models.eight_schools(data, "centered")
    draws = load.load_reference_draws("eight_schools-eight_schools_centered")
    flat = {k: np.asarray(v)[0, :5] for k, v in draws.items()}
    U = to_u(flat)  # theta[1..8], mu, log tau
    potential = Potential(
        eight_schools,
        (torch.tensor(data["sigma"], dtype=torch.float64),),
        {"y": torch.tensor(data["y"], dtype=torch.float64)},
        compile=False,
    )
    z = torch.tensor(np.column_stack([U[:, 8], U[:, 9], U[:, :8]]))
    ours = -potential(z).numpy()
    ref = logp(U)
    np.testing.assert_allclose(ours - ours[0], ref - ref[0], rtol=1e-10, atol=1e-10)


def test_dependent_support_and_deterministic_sites(float64):
    model, make_data = MODELS["hierarchical_regression"]
    args, kwargs = make_data()
    potential, z0 = initialize_model(model, args, kwargs, num_chains=5, compile=False)
    values = potential.constrain(z0 + 3 * torch.randn_like(z0))
    assert bool(torch.all(values["sigma_y"] > 0))
    assert bool(torch.all(values["sigma_y"] < values["upper"] + 1.0))
    assert values["mean"].shape == (5, args[1].shape[0])
    assert values["a"].shape == (5, args[2])


def test_pack_inverts_constrain(float64):
    model, make_data = MODELS["constrained_sites"]
    args, kwargs = make_data()
    potential, z0 = initialize_model(model, args, kwargs, num_chains=3, compile=False)
    values = potential.constrain(z0)
    assert torch.allclose(values["weights"].sum(-1), torch.ones(3, dtype=torch.float64))
    assert bool(torch.all(values["scales"][:, 1:] > values["scales"][:, :-1]))
    corr = values["corr"] @ values["corr"].transpose(-1, -2)
    assert torch.allclose(
        torch.diagonal(corr, dim1=-2, dim2=-1), torch.ones(3, 3, dtype=torch.float64)
    )
    torch.testing.assert_close(potential.pack(values), z0, rtol=1e-9, atol=1e-9)
    unpacked = potential.unpack(z0)
    assert unpacked["corr"].shape == (3, 3) and unpacked["weights"].shape == (3, 2)


def test_float32_follows_the_data():
    args, kwargs = eight_schools_data(dtype=torch.float32)
    eager, z0 = initialize_model(eight_schools, args, kwargs, num_chains=2, compile=False)
    compiled, _ = initialize_model(eight_schools, args, kwargs, num_chains=2, compile=True)
    assert z0.dtype == torch.float32 and eager.dtype == torch.float32
    value, grad = compiled.value_and_grad(z0)
    ref_value, ref_grad = eager.value_and_grad(z0)
    assert value.dtype == torch.float32 and grad.dtype == torch.float32
    torch.testing.assert_close(value, ref_value, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-4)


def test_environment_switch_runs_eagerly(monkeypatch, float64):
    monkeypatch.setenv("PROBTORCH_COMPILE", "0")
    assert compile_enabled(None) is False
    assert compile_enabled(True) is True
    args, kwargs = eight_schools_data()
    potential = Potential(eight_schools, args, kwargs)
    assert potential.compiled is False
    monkeypatch.setenv("PROBTORCH_COMPILE", "1")
    assert Potential(eight_schools, args, kwargs).compiled is True


def test_compiled_potential_value_has_no_breaks(float64):
    args, kwargs = eight_schools_data()
    compiled, z0 = initialize_model(eight_schools, args, kwargs, num_chains=2, compile=True)
    with count_compiles() as stats:
        value = compiled(z0)
        again = compiled(z0 + 1)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    torch.testing.assert_close(value, compiled.value_and_grad(z0)[0], rtol=1e-12, atol=1e-12)
    assert not torch.equal(value, again)


def test_many_potentials_each_compile_their_own_graph(float64):
    """Dynamo's per-code recompile limit (8) must not push the 9th potential to eager."""
    args, _ = eight_schools_data()
    with count_compiles() as stats:
        for i in range(10):
            y = torch.tensor(EIGHT_Y, dtype=torch.float64) + i
            compiled, z0 = initialize_model(eight_schools, args, {"y": y}, compile=True)
            eager = Potential(eight_schools, args, {"y": y}, compile=False)
            torch.testing.assert_close(compiled(z0), eager(z0), rtol=1e-12, atol=1e-12)
    assert stats.graphs == 10 and stats.graph_breaks == 0


def test_nonfinite_values_inside_compiled_code_do_not_raise(float64):
    args, kwargs = eight_schools_data()
    compiled, z0 = initialize_model(eight_schools, args, kwargs, num_chains=2, compile=True)
    z = z0.clone()
    z[0, 1] = float("inf")  # tau = inf
    value, grad = compiled.value_and_grad(z)
    assert not bool(torch.isfinite(value[0]) and torch.isfinite(grad[0]).all())
    assert bool(torch.isfinite(value[1]))


@pytest.mark.parametrize(
    "strategy",
    [init_to_uniform, init_to_uniform(radius=0.5), init_to_median, init_to_sample],
    ids=["uniform", "uniform_r05", "median", "sample"],
)
def test_init_strategies_give_finite_starts(strategy, float64):
    model, make_data = MODELS["constrained_sites"]
    args, kwargs = make_data()
    potential, z0 = initialize_model(
        model, args, kwargs, num_chains=4, init_strategy=strategy, compile=False
    )
    assert z0.shape == (4, potential.dim)
    value, grad = potential.value_and_grad(z0)
    assert bool(torch.isfinite(value).all() and torch.isfinite(grad).all())
    assert len({tuple(row.tolist()) for row in z0}) == 4  # chains start apart


def test_init_to_feasible_and_init_to_mean_start_every_chain_at_their_point(float64):
    model, make_data = MODELS["constrained_sites"]
    args, kwargs = make_data()
    potential, z0 = initialize_model(
        model, args, kwargs, num_chains=3, init_strategy=init_to_feasible, compile=False
    )
    torch.testing.assert_close(z0, torch.zeros_like(z0), rtol=0, atol=1e-12)  # zeros, round trip
    potential, z0 = initialize_model(
        model, args, kwargs, num_chains=3, init_strategy=init_to_mean, compile=False
    )
    value, grad = potential.value_and_grad(z0)
    assert bool(torch.isfinite(value).all() and torch.isfinite(grad).all())
    weights = potential.constrain(z0)["weights"]  # Dirichlet(1, 1, 1)'s mean
    torch.testing.assert_close(weights, torch.full((3, 3), 1 / 3, dtype=torch.float64))
    # no mean (LKJ) or no sampler (the improper scales): the median's, then uniform starts
    assert len({tuple(row.tolist()) for row in z0}) == 3


def test_init_to_feasible_and_init_to_mean_on_angles_directions_and_heavy_tails(float64):
    def model():
        pt.sample("a", dist.VonMises(2.0, 1.0))
        pt.sample("u", dist.ProjectedNormal(torch.tensor([0.0, 3.0, 0.0])))
        pt.sample("c", dist.HalfCauchy(1.0))
        pt.sample("g", dist.Gamma(3.0, 2.0))

    potential, z0 = initialize_model(model, init_strategy=init_to_feasible, compile=False)
    start = potential.constrain(z0)
    assert float(start["a"]) == 0.0 and start["u"].tolist() == [[1.0, 0.0, 0.0]]
    assert float(start["c"]) == 1.0 and float(start["g"]) == 1.0
    potential, z0 = initialize_model(model, init_strategy=init_to_mean, compile=False)
    start = potential.constrain(z0)
    assert float(start["a"]) == pytest.approx(2.0) and float(start["g"]) == pytest.approx(1.5)
    # no mean (a half-Cauchy's) or none on the sphere: the median of prior draws
    assert 0.0 < float(start["c"]) < 20.0
    torch.testing.assert_close(start["u"].norm(dim=-1), torch.ones(1, dtype=torch.float64))


def test_init_radius_bounds_unconstrained_values(float64):
    args, kwargs = eight_schools_data()
    _, z0 = initialize_model(
        eight_schools,
        args,
        kwargs,
        num_chains=8,
        init_strategy=init_to_uniform(radius=0.5),
        compile=False,
    )
    assert float(z0.abs().max()) <= 0.5


def test_init_to_value_and_init_params(float64):
    args, kwargs = eight_schools_data()
    strategy = init_to_value(values={"mu": 1.5, "tau": 2.0})
    potential, z0 = initialize_model(
        eight_schools, args, kwargs, num_chains=3, init_strategy=strategy, compile=False
    )
    torch.testing.assert_close(z0[:, 0], torch.full((3,), 1.5, dtype=torch.float64))
    torch.testing.assert_close(z0[:, 1], torch.full((3,), math.log(2.0), dtype=torch.float64))
    init = {"mu": torch.tensor(0.5), "tau": torch.tensor(3.0), "theta": torch.zeros(8)}
    _, z1 = initialize_model(
        eight_schools, args, kwargs, num_chains=2, init_params=init, compile=False
    )
    assert z1.shape == (2, 10)
    torch.testing.assert_close(
        potential.constrain(z1)["tau"], torch.full((2,), 3.0, dtype=torch.float64)
    )


def test_init_to_value_refuses_names_that_are_no_site(float64):
    # a mistyped name left its site at init_to_uniform's random point without a word;
    # observed and deterministic sites may be given (a whole draw of the model)
    args, kwargs = eight_schools_data()
    with pytest.raises(ValueError, match=r"values has \['tua'\], which are not sites.*"
                       r"latent sites are \['mu', 'tau', 'theta'\]"):  # fmt: skip
        initialize_model(eight_schools, args, kwargs,
                         init_strategy=init_to_value(values={"mu": 1.0, "tua": 2.0}),
                         compile=False)  # fmt: skip
    draw = {"mu": 1.5, "y": torch.zeros(8)}  # the observed site is a site: taken
    _, z0 = initialize_model(eight_schools, args, kwargs, init_strategy=init_to_value(values=draw),
                             compile=False)  # fmt: skip
    assert float(z0[0, 0]) == 1.5


def test_init_to_median_is_near_the_prior_median(float64):
    def model():
        pt.sample("x", dist.LogNormal(2.0, 0.01))

    _, z0 = initialize_model(model, num_chains=2, init_strategy=init_to_median, compile=False)
    assert torch.allclose(z0, torch.full((2, 1), 2.0, dtype=torch.float64), atol=0.02)


def test_initialization_error_names_the_site_with_infinite_density(float64):
    def model():
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        pt.factor("impossible", torch.where(x > 100.0, 0.0, -math.inf))

    with pytest.raises(InitializationError, match=r"after 7 tries.*'impossible'"):
        initialize_model(model, max_tries=7, compile=False)


def test_initialization_error_names_the_site_with_infinite_gradient(float64):
    def model():
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        pt.factor("kink", -x.abs().sqrt())

    with pytest.raises(InitializationError, match=r"'x'"):
        initialize_model(
            model, init_strategy=init_to_value(values={"x": 0.0}), max_tries=3, compile=False
        )


def _written_in_place(y, form="slice"):
    theta = pt.sample("theta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    x = torch.zeros(4, dtype=y.dtype)
    # a latent written into a tensor the model made: vmap cannot batch it
    if form == "slice":
        x[1:] = theta
    elif form == "index":
        x[torch.tensor([1, 2, 3])] = theta
    else:  # an in-place add: torch's error names no vmap, only the shapes
        tail = torch.zeros(3, dtype=y.dtype)
        tail += theta
        x = torch.cat([x[:1], tail])
    pt.deterministic("x", x)
    pt.sample("y", dist.Normal(x, 0.5).to_event(1), obs=y)


def _concatenated(y):
    theta = pt.sample("theta", dist.Normal(0.0, 1.0).expand([3]).to_event(1))
    x = torch.cat([torch.zeros(1, dtype=y.dtype), theta])
    pt.deterministic("x", x)
    pt.sample("y", dist.Normal(x, 0.5).to_event(1), obs=y)


@pytest.mark.parametrize("form", ["slice", "index", "add"])
def test_a_model_that_writes_latents_in_place_is_evaluated_chain_by_chain(form, float64):
    """vmap cannot write batched values into a tensor the model created; the potential
    evaluates the chains one after another instead, with a warning that says how to
    vectorize the model. Values, gradients and constrained values equal the vectorized
    model's."""
    y = torch.tensor([0.0, 0.3, 1.0, -0.5])
    looped = Potential(_written_in_place, (y, form), compile=False)
    vectorized = Potential(_concatenated, (y,), compile=False)
    z = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"writes latent values in place.*torch\.cat"):
        value, grad = looped.value_and_grad(z)
    assert looped.chains_looped and not vectorized.chains_looped
    expected = vectorized.value_and_grad(z)
    torch.testing.assert_close(value, expected[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected[1], rtol=0, atol=1e-12)
    torch.testing.assert_close(looped.constrain(z)["x"], vectorized.constrain(z)["x"])
    draws = {"theta": z}
    torch.testing.assert_close(
        looped.log_likelihood(draws)["y"], vectorized.log_likelihood(draws)["y"]
    )
    fresh = Potential(_written_in_place, (y, form), compile=False)  # nothing evaluated yet
    torch.testing.assert_close(fresh.log_likelihood(draws)["y"], looped.log_likelihood(draws)["y"])


def test_nuts_samples_a_model_that_writes_latents_in_place_compiled_as_eager(float64):
    """The posterior is Normal(y / 1.25, sqrt(0.2)) per coordinate; compiled draws follow
    the eager ones (the same chain-by-chain potential) and the vectorized model's."""
    from probtorch.inference import MCMC, NUTS

    y = torch.tensor([0.0, 0.3, 1.0, -0.5])
    draws = {}
    for name, model, compile in [
        ("looped", _written_in_place, False),
        ("compiled", _written_in_place, True),
        ("vectorized", _concatenated, False),
    ]:
        mcmc = MCMC(
            NUTS(model, compile=compile),
            num_warmup=200,
            num_samples=200,
            num_chains=2,
            progress_bar=False,
            seed=0,
        )
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="the model writes latent values")
            mcmc.run(y)
        draws[name] = mcmc.get_samples(group_by_chain=True)
    torch.testing.assert_close(draws["looped"]["theta"], draws["vectorized"]["theta"])
    torch.testing.assert_close(draws["compiled"]["theta"][:, :20], draws["looped"]["theta"][:, :20])
    theta = draws["compiled"]["theta"]
    ess = torch.tensor(az.ess(az.convert_to_dataset({"theta": theta.numpy()}))["theta"].values)
    mcse = math.sqrt(0.2) / ess.sqrt()
    assert bool(((theta.mean((0, 1)) - y[1:] / 1.25).abs() < 4 * mcse).all())
    torch.testing.assert_close(draws["compiled"]["x"][..., 1:], theta)


def _branching(y, form="branch"):
    mu = pt.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    # each form reads latent values in Python (or selects entries by them): vmap refuses
    if form == "branch":
        scale = 1.0 if mu[0] > 0 else 2.0
    elif form == "tolist":
        a, b = mu.tolist()
        scale = 1.0 if a > 0 else 2.0
    else:  # a boolean mask: a shape that depends on the values
        scale = 1.0 + (mu[mu > 0].numel() > 1)
    loc = mu[mu > 0].sum() if form == "mask" else mu.sum()
    pt.sample("y", dist.Normal(loc, scale), obs=y)


def _branching_vectorized(y, form="branch"):
    mu = pt.sample("mu", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
    if form == "mask":
        scale = 1.0 + ((mu > 0).sum() > 1)
        loc = torch.where(mu > 0, mu, 0.0).sum()
    else:
        scale, loc = torch.where(mu[0] > 0, 1.0, 2.0), mu.sum()
    pt.sample("y", dist.Normal(loc, scale), obs=y)


@pytest.mark.parametrize(
    "form, what",
    [
        ("branch", "reads latent values in Python"),
        ("tolist", "reads latent values in Python"),
        ("mask", r"selects entries by latent values .*that depend on values\)"),
    ],
)
def test_a_model_that_reads_latents_in_python_is_evaluated_chain_by_chain_eagerly(
    form, what, float64
):
    """vmap cannot batch `if mu > 0:`, `.tolist()` or `mu[mu > 0]`, nor torch.compile
    capture them: the potential evaluates the chains one after another, eagerly, with a
    warning naming the site and the model's line; values, gradients, constrained values
    and log likelihoods equal the vectorized model's."""
    y = torch.tensor(0.3)
    looped = Potential(_branching, (y, form), compile=True)
    vectorized = Potential(_branching_vectorized, (y, form), compile=False)
    z = torch.tensor([[-0.7, 0.2], [0.4, 0.9], [1.5, -2.0]])
    message = rf"{what} \(after site 'mu', at .*test_potential\.py:\d+ \(_branching\)\)"
    with pytest.warns(UserWarning, match=message + r".*eagerly.*torch\.where") as seen:
        value, grad = looped.value_and_grad(z)
    assert len(seen) == 1  # torch.compile failed first: its fallback warning is left out
    assert looped.chains_looped and not looped.compiled
    expected = vectorized.value_and_grad(z)
    torch.testing.assert_close(value, expected[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, expected[1], rtol=0, atol=1e-12)
    draws = {"mu": z}
    fresh = Potential(_branching, (y, form), compile=False)  # nothing evaluated yet
    torch.testing.assert_close(
        fresh.log_likelihood(draws)["y"], vectorized.log_likelihood(draws)["y"]
    )
    fresh = Potential(_branching, (y, form), compile=False)
    with pytest.warns(UserWarning, match=message):
        torch.testing.assert_close(fresh.constrain(z)["mu"], z)


def test_a_failure_of_a_model_evaluated_chain_by_chain_is_named_so(float64):
    def model():
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        if mu > 2.5:  # a Python read, and a failure at some values only
            torch.ones(2) + torch.ones(3)
        pt.sample("y", dist.Normal(mu, 1.0), obs=torch.tensor(0.0))

    potential = Potential(model, compile=False)
    with pytest.warns(UserWarning, match="reads latent values in Python"):
        potential(torch.zeros(2, 1))
    with pytest.raises(ValueError, match=r"failed after site 'mu' .*when evaluated chain by "
                       r"chain \(RuntimeError: The size of tensor a"):  # fmt: skip
        potential(torch.tensor([[0.0], [3.0]]))


def test_discrete_latent_site_is_rejected_by_name():
    def model():
        pt.sample("k", dist.Poisson(3.0))

    with pytest.raises(ValueError, match=r"latent site 'k'.*discrete.*Poisson"):
        Potential(model, compile=False)


def test_point_mass_latent_site_is_rejected_by_name():
    # it failed at initialization: "non-finite at site(s) ['v']" after 100 tries
    def model():
        z = pt.sample("z", dist.Normal(0.0, 1.0))
        pt.sample("v", dist.Delta(2 * z).expand([3]).to_event(1))

    with pytest.raises(ValueError, match=r"latent site 'v'.*Delta.*pt.deterministic\('v'"):
        Potential(model, compile=False)


@pytest.mark.parametrize("first_with_w", [True, False])
def test_a_latent_site_that_comes_and_goes_is_named(first_with_w):
    # as `if z > 0: pt.sample("w", ...)` does between initial points, here by call count: a
    # site present at the first trace and missing at the next was a bare KeyError: 'w'
    calls = []

    def model():
        calls.append(1)
        pt.sample("z", dist.Normal(0.0, 1.0))
        if (len(calls) == 1) == first_with_w:
            pt.sample("w", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"latent site 'w' .*must not depend on the values"):
        initialize_model(model, num_chains=2, compile=False)


def test_subsampled_plate_is_rejected_by_name():
    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("data", len(y), subsample_size=2) as idx:
            pt.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    with pytest.raises(ValueError, match=r"plate 'data' subsamples 2 of 5"):
        Potential(model, (torch.zeros(5),), compile=False)


def test_a_given_partial_subsample_is_rejected_by_name():
    """A plate given some of its rows (``subsample=idx``) would scale the potential by
    size / len(idx): a posterior of other data (before: sampled silently). All rows, in
    order or permuted, are accepted."""

    def model(y, idx):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("data", len(y), subsample=idx) as rows:
            pt.sample("y", dist.Normal(mu, 1.0), obs=y[rows])

    y = torch.arange(5.0)
    with pytest.raises(ValueError, match=r"plate 'data' is given 2 of its 5 rows.*MCMC needs all"):
        Potential(model, (y, torch.tensor([3, 1])), compile=False)
    for idx in (torch.arange(5), torch.tensor([4, 0, 3, 1, 2])):
        assert Potential(model, (y, idx), compile=False).sites[0].name == "mu"


def test_model_without_latents_is_rejected():
    def model():
        pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))

    with pytest.raises(ValueError, match="no latent sample sites"):
        Potential(model, compile=False)


def _value_dependent_shape_model():
    n = pt.sample("n_float", dist.Uniform(1.0, 3.0))
    pt.sample("x", dist.Normal(0.0, 1.0).expand([int(n.item())]).to_event(1))


def test_latent_shape_depending_on_values_is_rejected(float64):
    with pytest.raises(ValueError, match=r"latent site 'x' has shape \(\d,\) in this run"):
        initialize_model(_value_dependent_shape_model, num_chains=4, compile=False)


def test_a_latent_shape_read_from_another_latent_in_python_is_named(float64):
    # the chains run one after another (the model reads n in Python); at n_float < 2 site
    # x has one element, not the prototype's two
    potential = Potential(_value_dependent_shape_model, compile=False, rng_seed=0)
    assert potential.dim == 3
    z = torch.full((2, potential.dim), -3.0, dtype=torch.float64)
    with pytest.warns(UserWarning, match="reads latent values in Python"):
        with pytest.raises(ValueError, match=r"latent site 'x' has shape \(1,\) now but had "
                           r"shape \(2,\)"):  # fmt: skip
            potential(z)


def test_wrong_z_shape_is_rejected(float64):
    args, kwargs = eight_schools_data()
    potential = Potential(eight_schools, args, kwargs, compile=False)
    with pytest.raises(ValueError, match=r"z must have shape \(chains, 10\).*got \(10,\)"):
        potential(torch.zeros(10))


def test_invalid_parameter_is_reported_with_the_site(float64):
    def model():
        pt.sample("s", dist.Normal(0.0, -1.0))

    with pytest.raises(ValueError, match=r"site 's'.*'scale'.*Normal"):
        Potential(model, compile=False)


def test_models_wrapped_in_handlers_compile_without_breaks(float64):
    """Handlers created outside the compiled region (reparam, condition, ...) still compile."""
    from probtorch.reparam import LocScaleReparam

    args, kwargs = eight_schools_data()
    noncentered = pt.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(0.0)})
    conditioned = pt.handlers.condition(noncentered, data={"y": kwargs["y"]})
    eager, z0 = initialize_model(conditioned, args, num_chains=2, compile=False)
    compiled, _ = initialize_model(conditioned, args, num_chains=2, compile=True)
    assert compiled.site_names == ["mu", "tau", "theta_decentered"]
    with count_compiles() as stats:
        value, grad = compiled.value_and_grad(z0)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    ref_value, ref_grad = eager.value_and_grad(z0)
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-10)
    assert compiled.constrain(z0)["theta"].shape == (2, 8)


def test_compiling_keeps_torch_validation_default():
    """Dynamo's first compile turns torch.distributions validation off process-wide;
    probtorch restores the user's default, so bad parameters still raise afterwards.
    In a fresh process, so that this is the process's first compile."""
    import subprocess

    script = (
        "import torch, probtorch as pt, probtorch.distributions as dist\n"
        "from probtorch.inference.potential import Potential\n"
        "def model():\n"
        "    pt.sample('x', dist.Normal(0.0, 1.0))\n"
        "p = Potential(model, compile=True)\n"
        "p.value_and_grad(torch.zeros(2, 1))\n"
        "assert torch.distributions.Distribution._validate_args is True\n"
        "try:\n"
        "    dist.Normal(0.0, -1.0)\n"
        "except ValueError as e:\n"
        "    assert 'scale' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no ValueError for a negative scale')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_value_and_grad_hold_the_models_trainable_tensors_constant(float64):
    """The gradient is the potential's in z alone: a ``pt.param`` or a module's weights
    (which require grad) leave no autograd graph on the value, gradient or constrained
    values (eager and batched, as the samplers call them)."""
    net = torch.nn.Linear(2, 1).double()

    def model():
        s = pt.param("s", torch.tensor(2.0), constraint=dist.constraints.positive)
        b = pt.sample("b", dist.Normal(0.0, 1.0))
        pt.deterministic("bs", b * s)
        pt.sample("y", dist.Normal(net(torch.ones(2)).squeeze(-1) * b, s), obs=torch.tensor(0.5))

    potential = Potential(model, compile=False)
    z = torch.tensor([[0.3], [-1.0]])
    outputs = [*potential.value_and_grad(z), *potential.eager_value_and_grad(z),
               *potential.raw_value_and_grad(z), *potential.constrain(z).values()]  # fmt: skip
    assert [o for o in outputs if o.requires_grad or o.grad_fn is not None] == []
    s, w = 2.0, float(net(torch.ones(2)).squeeze().detach())
    torch.testing.assert_close(potential.value_and_grad(z)[1], z + (w * z - 0.5) * w / s**2)
