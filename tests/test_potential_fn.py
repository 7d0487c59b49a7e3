"""Kernels from a potential function (``NUTS(potential_fn=...)``), and init_params' checks."""

import arviz as az
import pytest
import torch
from torch.distributions import constraints

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import HMC, MCMC, NUTS
from probtorch.inference.compile import count_compiles

# a correlated 2-d Gaussian (float64) beside an independent scalar: N(1, 0.5^2)
PRECISION = torch.tensor([[2.0, 0.9], [0.9, 1.0]], dtype=torch.float64)
COVARIANCE = torch.linalg.inv(PRECISION)


def energy(values):
    x, s = values["x"], values["s"]
    return 0.5 * x @ PRECISION @ x + 2.0 * (s - 1.0) ** 2


def same_model():
    """The model ``energy`` describes, written with improper flat sites and a factor."""
    x = pt.sample("x", dist.ImproperUniform(constraints.real, (), (2,)))
    s = pt.sample("s", dist.ImproperUniform(constraints.real, (), ()))
    pt.factor("potential_fn", -energy({"x": x, "s": s}))


def _init(num_chains):
    g = torch.Generator().manual_seed(1)
    return {
        "x": torch.randn(num_chains, 2, generator=g, dtype=torch.float64),
        "s": torch.randn(num_chains, generator=g, dtype=torch.float64),
    }


def _mcmc(kernel, **kwargs):
    kwargs = {"num_warmup": 300, "num_samples": 600, "num_chains": 4, "seed": 0} | kwargs
    return MCMC(kernel, progress_bar=False, **kwargs)


def test_potential_fn_posterior_matches_closed_form():
    """Means within 4 MCSE, sds within 10%, the correlation, R-hat, no divergences; the
    draws keep init_params' dtype (float64) under torch's float32 default."""
    mcmc = _mcmc(NUTS(potential_fn=energy, dense_mass=True, compile=False),
                 num_warmup=400, num_samples=800)  # fmt: skip
    mcmc.run(init_params=_init(4))
    samples = mcmc.get_samples()
    assert samples["x"].dtype == torch.float64 and samples["x"].shape == (3200, 2)
    assert samples["s"].shape == (3200,)
    idata = mcmc.to_inference_data()
    mcse = az.mcse(idata)
    rhat = az.rhat(idata)
    exact = {"x": (torch.zeros(2), COVARIANCE.diagonal().sqrt()), "s": (torch.ones(()), 0.5)}
    for name, (mean, sd) in exact.items():
        got = samples[name]
        assert ((got.mean(0) - mean).abs() < 4 * torch.as_tensor(mcse[name].values)).all()
        assert ((got.std(0) / sd - 1).abs() < 0.10).all()
        assert float(rhat[name].max()) < 1.01
    correlation = torch.corrcoef(samples["x"].T)[0, 1]
    exact_correlation = COVARIANCE[0, 1] / COVARIANCE.diagonal().prod().sqrt()
    assert abs(float(correlation - exact_correlation)) < 0.05
    assert int(mcmc.get_extra_fields()["diverging"].sum()) == 0
    assert "observed_data" not in idata.groups()  # the factor is no observation


@pytest.mark.parametrize("kernel", [NUTS, HMC])
def test_potential_fn_draws_what_the_same_model_draws(kernel, float64):
    """The same seed and starts give the same draws as the model it stands for."""
    options = {"num_steps": 3} if kernel is HMC else {}
    runs = []
    for how in ({"potential_fn": energy}, {"model": same_model}):
        mcmc = _mcmc(kernel(compile=False, **how, **options), num_warmup=50, num_samples=50,
                     num_chains=2)  # fmt: skip
        mcmc.run(init_params=_init(2))
        runs.append(mcmc.get_samples())
    for name in ("x", "s"):
        torch.testing.assert_close(runs[0][name], runs[1][name], rtol=0, atol=0)


def test_potential_fn_one_chain_takes_unbatched_starts(float64):
    kernel = NUTS(potential_fn=energy, compile=False, step_size=1e-7, adapt_step_size=False,
                  max_tree_depth=1)  # fmt: skip
    mcmc = _mcmc(kernel, num_warmup=0, num_samples=1, num_chains=1)
    start = {"x": torch.tensor([0.5, -0.5]), "s": torch.tensor(2.0)}
    mcmc.run(init_params=start)
    samples = mcmc.get_samples()
    torch.testing.assert_close(samples["x"][0], start["x"], rtol=0, atol=1e-5)
    torch.testing.assert_close(samples["s"][0], start["s"], rtol=0, atol=1e-5)


def test_potential_fn_of_one_tensor_as_in_numpyro(float64):
    """init_params as one tensor: potential_fn takes one tensor, draws come as "params",
    the same as the dict form's."""

    def flat_energy(z):
        return energy({"x": z[:2], "s": z[2]})

    init = _init(2)
    runs = []
    for fn, start in (
        (flat_energy, torch.cat([init["x"], init["s"][:, None]], dim=1)),
        (energy, init),
    ):
        mcmc = _mcmc(NUTS(potential_fn=fn, compile=False), num_warmup=50, num_samples=50,
                     num_chains=2)  # fmt: skip
        mcmc.run(init_params=start)
        runs.append(mcmc.get_samples())
    assert list(runs[0]) == ["params"] and runs[0]["params"].shape == (100, 3)
    flat = torch.cat([runs[1]["x"], runs[1]["s"][:, None]], dim=1)
    torch.testing.assert_close(runs[0]["params"], flat, rtol=0, atol=0)


def test_compiled_potential_fn_draws_what_eager_draws_without_recompiles(float64):
    """Compiled (the NUTS block graph over the potential function) against eager with a
    fixed step size; no graph breaks, and a continued run compiles nothing."""
    runs = {}
    for compiled in (False, True):
        kernel = NUTS(potential_fn=energy, step_size=0.3, adapt_step_size=False,
                      adapt_mass_matrix=False, compile=compiled, executor="quick")  # fmt: skip
        mcmc = _mcmc(kernel, num_warmup=0, num_samples=20, num_chains=2)
        with count_compiles() as first:
            mcmc.run(init_params=_init(2))
        runs[compiled] = mcmc
    assert first.graph_breaks == 0
    for name, value in runs[False].get_samples().items():
        torch.testing.assert_close(runs[True].get_samples()[name], value, rtol=0, atol=1e-10)
    compiled = runs[True]
    compiled.post_warmup_state = compiled.last_state
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        compiled.run()
    assert later.graph_breaks == 0 and later.graphs == 0


# -- errors ----------------------------------------------------------------------------------
def _run(kernel, init_params=None, num_chains=2, *args, **kwargs):
    _mcmc(kernel, num_warmup=2, num_samples=2, num_chains=num_chains).run(
        *args, init_params=init_params, **kwargs
    )


def test_kernel_needs_exactly_one_of_model_and_potential_fn():
    with pytest.raises(TypeError, match="needs a model function or a potential_fn"):
        NUTS()
    with pytest.raises(TypeError, match="not both"):
        HMC(same_model, potential_fn=energy)
    with pytest.raises(TypeError, match="potential_fn must be callable, got 3"):
        NUTS(potential_fn=3)
    with pytest.raises(TypeError, match="model must be callable"):
        HMC("model")


@pytest.mark.parametrize(
    ("init_params", "args", "error", "match"),
    [
        (None, (), ValueError, "needs init_params"),
        ({"x": torch.zeros(3), "s": torch.zeros(2)}, (), ValueError,
         r"num_chains=2, init_params\['x'\] needs a leading chain dimension of 2.*shape \(3,\)"),
        ({"x": torch.zeros(2, 2), "s": torch.zeros(())}, (), ValueError,
         r"init_params\['s'\] needs a leading chain dimension.*shape \(\)"),
        ("x", (), TypeError, "must be a tensor or a non-empty dict"),
        (torch.zeros(3), (), ValueError, r"init_params\['params'\] needs a leading chain"),
        ({"x": torch.zeros(2, 2), "s": torch.zeros(2)}, (torch.ones(3),), TypeError,
         "takes no model arguments.*1 positional"),
    ],
)  # fmt: skip
def test_potential_fn_run_errors(init_params, args, error, match):
    with pytest.raises(error, match=match):
        _run(NUTS(potential_fn=energy, compile=False), init_params, 2, *args)


def test_potential_fn_must_return_a_scalar():
    with pytest.raises(ValueError, match=r"must return a scalar tensor.*got \(2,\)"):
        _run(NUTS(potential_fn=lambda v: v["x"] ** 2, compile=False), {"x": torch.zeros(2, 2)})


@pytest.mark.parametrize(
    ("init_params", "match"),
    [
        ({"loc": torch.zeros(4), "scale": torch.tensor(1.0)},
         r"init_params\['loc'\] has shape \(4,\); site 'loc' has shape \(3,\), so give \(3,\) "
         r"\(every chain\) or \(2, 3\)"),
        ({"loc": torch.zeros(3)}, r"no value for latent site\(s\) \['scale'\]"),
        ({"loc": torch.zeros(3), "scale": 1.0, "scael": 1.0},
         r"init_params has \['scael'\], which are not latent sites.*\['loc', 'scale'\]"),
        ({"loc": torch.zeros(3), "scale": torch.tensor([1.0, -1.0])},
         r"init_params\['scale'\] \(chain 1\) lies outside the support of site 'scale' "
         r"\(HalfNormal"),
    ],
)  # fmt: skip
def test_model_init_params_errors_name_the_site(init_params, match):
    def model():
        pt.sample("loc", dist.Normal(torch.zeros(3), 1.0).to_event(1))
        pt.sample("scale", dist.HalfNormal(1.0))

    with pytest.raises(ValueError, match=match):
        _run(NUTS(model, compile=False), init_params)


def _regression(X, y):
    beta = pt.sample("beta", dist.Normal(torch.zeros(X.shape[1]), 5.0).to_event(1))
    s = pt.sample("s", dist.HalfNormal(1.0))
    with pt.plate("n", X.shape[0]):
        pt.sample("y", dist.Normal(X @ beta, s), obs=y)


def test_bad_starts_are_blamed_on_their_own_site():
    """A start outside its support is named at its site, not at a later site that uses it
    (it was "site 'y': parameter 'scale' of Normal"); init_to_value's values are checked
    for shape and support."""
    from probtorch.inference import init_to_value

    X, y = torch.randn(10, 3), torch.randn(10)
    with pytest.raises(ValueError, match=r"init_params\['s'\] \(chain 0\) lies outside the "
                       r"support of site 's' \(HalfNormal"):  # fmt: skip
        _run(NUTS(_regression, compile=False), {"beta": torch.zeros(3), "s": -1.0}, 2, X, y)
    # on its support's boundary (HalfNormal's is [0, inf)) or NaN: said so, at the site
    # (the boundary was blamed on site 'y', NaN was "outside the support")
    for start, match in [
        ({"beta": torch.zeros(3), "s": 0.0}, r"init_params\['s'\] \(chain 0\) lies on the "
         r"boundary of the support of site 's' \(HalfNormal.*start inside it"),
        ({"beta": torch.tensor([0.0, float("nan"), 0.0]), "s": 1.0},
         r"init_params\['beta'\] \(chain 0\) is NaN \(site 'beta'"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            _run(NUTS(_regression, compile=False), start, 2, X, y)
    # a closed interval's bounds too: torch's sigmoid inverse clamps, so a Beta site at 1
    # started at unconstrained 36.04 (at 0, -708.4) without a word
    def beta_model():
        p = pt.sample("p", dist.Beta(2.0, 3.0))
        pt.sample("k", dist.Binomial(20, p), obs=torch.tensor(7.0))

    for p0 in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"init_params\['p'\] \(chain 1\) lies on the "
                           r"boundary of the support of site 'p' \(Beta"):  # fmt: skip
            _run(NUTS(beta_model, compile=False), {"p": torch.tensor([0.5, p0])}, 2)
    for values, match in [
        ({"beta": torch.ones(2)}, r"values\['beta'\] has shape \(2,\); site 'beta' .*\(3,\)"),
        ({"s": torch.tensor(-1.0)}, r"values\['s'\] lies outside the support .* site 's'"),
    ]:
        kernel = NUTS(_regression, compile=False, init_strategy=init_to_value(values=values))
        with pytest.raises(ValueError, match=match):
            _run(kernel, None, 2, X, y)


def test_init_params_where_a_support_depends_on_another_site():
    """x ~ Uniform(0, a): each chain's x is mapped to unconstrained space under its own a
    (the model runs at the given values), and checked against that support."""

    def model():
        a = pt.sample("a", dist.HalfNormal(1.0))
        pt.sample("x", dist.Uniform(0.0, a))

    kernel = NUTS(model, compile=False, step_size=1e-7, adapt_step_size=False, max_tree_depth=1)
    start = {"a": torch.tensor([5.0, 2.0]), "x": torch.tensor([3.0, 1.0])}
    mcmc = _mcmc(kernel, num_warmup=0, num_samples=1, num_chains=2)
    mcmc.run(init_params=start)
    for name, value in mcmc.get_samples(group_by_chain=True).items():
        torch.testing.assert_close(value[:, 0], start[name], rtol=1e-5, atol=0)
    mcmc.post_warmup_state = None
    with pytest.raises(ValueError, match=r"init_params\['x'\] \(chain 0\) lies outside the "
                       r"support of site 'x' \(Uniform, support Interval\(lower_bound=0.0, "
                       r"upper_bound=5.0\)\)"):  # fmt: skip
        mcmc.run(init_params={"a": 5.0, "x": 6.0})


def test_init_params_while_continuing_is_an_error():
    mcmc = _mcmc(NUTS(potential_fn=energy, compile=False), num_warmup=5, num_samples=5)
    mcmc.run(init_params=_init(4))
    with pytest.raises(ValueError, match="init_params would be ignored.*post_warmup_state = None"):
        mcmc.run(init_params=_init(4))
    mcmc.post_warmup_state = None
    mcmc.run(init_params=_init(4))


def test_a_failing_potential_fn_is_told_what_it_was_called_with():
    """A dict-reading function given one tensor (NumPyro's form), or per-chain starts read
    as chains of smaller values: the function's own error now says what it was called with."""

    def reads_a_dict(values):
        return sum((values[k] ** 2).sum() for k in values.keys())

    with pytest.raises(AttributeError, match="keys") as caught:
        _run(NUTS(potential_fn=reads_a_dict, compile=False), torch.zeros(3), 1)
    assert any("init_params was one tensor" in note for note in caught.value.__notes__)

    def quadratic_form(values):
        return values["x"] @ torch.eye(2) @ values["x"]

    infinite = {"x": torch.full((2,), float("inf"))}
    with pytest.raises(ValueError, match=r"init_params\['x'\] \(chain 0\) is infinite") as refused:
        _run(NUTS(potential_fn=quadratic_form, compile=False), infinite, 1)
    assert not getattr(refused.value, "__notes__", None)  # the function was not called

    with pytest.raises(RuntimeError) as caught:
        _run(NUTS(potential_fn=quadratic_form, compile=False), {"x": torch.zeros(2)}, 2)
    assert any(
        "with num_chains=2, each init_params value has a leading chain dimension (given: "
        "{'x': (2,)})" in note
        for note in caught.value.__notes__
    )
