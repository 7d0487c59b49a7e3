"""Tests of the reparameterizers.

The key property: the reparameterized model's log density at the auxiliary values equals
the original model's log density at the values they map to, plus the log-Jacobian of that
map. Checked exactly, in float64.
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import reparam, seed, substitute, trace
from probtorch.reparam import LocScaleReparam, TransformReparam
from probtorch.runtime import CondIndepStackFrame

pytestmark = pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")

TOL = 1e-10

EIGHT_Y = torch.tensor([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], dtype=torch.float64)
EIGHT_SIGMA = torch.tensor([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], dtype=torch.float64)


@pytest.fixture(autouse=True)
def f64():
    torch.set_default_dtype(torch.float64)  # conftest restores the default dtype


def eight_schools(sigma, y):
    mu = pt.sample("mu", dist.Normal(0.0, 5.0))
    tau = pt.sample("tau", dist.HalfCauchy(5.0))
    with pt.plate("J", len(sigma)):
        theta = pt.sample("theta", dist.Normal(mu, tau))
        pt.sample("y", dist.Normal(theta, sigma), obs=y)


DATA = (EIGHT_SIGMA, EIGHT_Y)


def log_density(model, values, *args):
    """The log joint of ``model`` with latent sites set to ``values``, and its trace."""
    tr = trace(substitute(model, data=values)).get_trace(*args)
    return float(tr.log_prob_sum()), tr


MU = torch.tensor(1.7, dtype=torch.float64)
TAU = torch.tensor(3.2, dtype=torch.float64)
Z = torch.tensor([0.3, -1.1, 0.8, 2.0, -0.4, 0.05, -1.7, 1.2], dtype=torch.float64)


def test_eight_schools_noncentered():
    model = reparam(eight_schools, config={"theta": LocScaleReparam(centered=0.0)})
    aux = {"mu": MU, "tau": TAU, "theta_decentered": Z}
    lp_reparam, tr = log_density(model, aux, EIGHT_SIGMA, EIGHT_Y)
    assert list(tr) == ["mu", "tau", "J", "theta_decentered", "theta", "y"]
    theta = MU + TAU * Z
    assert tr["theta"].type == "deterministic"
    assert torch.allclose(tr["theta"].value, theta, rtol=0, atol=1e-14)
    # the auxiliary site is a standard normal broadcast over the plate
    fn = tr["theta_decentered"].fn
    assert torch.equal(fn.loc, torch.zeros(8)) and torch.equal(fn.scale, torch.ones(8))
    assert tr["theta_decentered"].cond_indep_stack == (CondIndepStackFrame("J", -1, 8, 8),)
    assert torch.allclose(tr["y"].fn.loc, theta, rtol=0, atol=1e-14)

    lp_orig, _ = log_density(eight_schools, {"mu": MU, "tau": TAU, "theta": theta}, *DATA)
    log_jacobian = 8 * math.log(TAU)  # theta = mu + tau * z, elementwise
    assert lp_reparam == pytest.approx(lp_orig + log_jacobian, abs=TOL)

    # and independently of probtorch: scipy on the auxiliary parameterization
    expected = (
        stats.norm(0, 5).logpdf(MU.item())
        + stats.halfcauchy(0, 5).logpdf(TAU.item())
        + stats.norm.logpdf(Z.numpy()).sum()
        + stats.norm(theta.numpy(), EIGHT_SIGMA.numpy()).logpdf(EIGHT_Y.numpy()).sum()
    )
    assert lp_reparam == pytest.approx(expected, abs=TOL)


@pytest.mark.parametrize("centered", [0.3, 0.75])
def test_eight_schools_partially_centered(centered):
    model = reparam(eight_schools, config={"theta": LocScaleReparam(centered=centered)})
    aux = {"mu": MU, "tau": TAU, "theta_decentered": Z}
    lp_reparam, tr = log_density(model, aux, EIGHT_SIGMA, EIGHT_Y)
    fn = tr["theta_decentered"].fn
    assert torch.allclose(fn.loc, torch.full((8,), centered * MU.item()), rtol=0, atol=1e-14)
    assert torch.allclose(fn.scale, torch.full((8,), TAU.item() ** centered), rtol=0, atol=1e-14)
    # theta = mu + tau^(1-c) * (z - c * mu)
    theta = MU + TAU ** (1 - centered) * (Z - centered * MU)
    assert torch.allclose(tr["theta"].value, theta, rtol=0, atol=1e-14)
    lp_orig, _ = log_density(eight_schools, {"mu": MU, "tau": TAU, "theta": theta}, *DATA)
    log_jacobian = 8 * (1 - centered) * math.log(TAU)
    assert lp_reparam == pytest.approx(lp_orig + log_jacobian, abs=TOL)


def test_learned_centering_param():
    model = reparam(eight_schools, config={"theta": LocScaleReparam(centered=None)})
    aux = {"mu": MU, "tau": TAU, "theta_decentered": Z}
    lp_reparam, tr = log_density(model, aux, EIGHT_SIGMA, EIGHT_Y)
    assert tr["theta_centered"].type == "param"
    centered = pt.get_param_store()["theta_centered"].detach()
    assert torch.allclose(centered, torch.full((), 0.5))
    theta = MU + TAU**0.5 * (Z - 0.5 * MU)
    lp_orig, _ = log_density(eight_schools, {"mu": MU, "tau": TAU, "theta": theta}, *DATA)
    assert lp_reparam == pytest.approx(lp_orig + 8 * 0.5 * math.log(TAU), abs=TOL)


def test_fully_centered_is_unchanged():
    model = reparam(eight_schools, config={"theta": LocScaleReparam(centered=1.0)})
    tr = trace(seed(model, rng_seed=0)).get_trace(EIGHT_SIGMA, EIGHT_Y)
    assert list(tr) == ["mu", "tau", "J", "theta", "y"]
    assert tr["theta"].type == "sample"


def test_studentt_with_shape_params():
    df, loc, scale = torch.tensor(3.5), torch.tensor([0.5, -1.0, 2.0]), torch.tensor(2.5)

    def model():
        with pt.plate("data", 3):
            return pt.sample("x", dist.StudentT(df, loc, scale))

    z = torch.tensor([0.2, -0.9, 1.4])
    config = {"x": LocScaleReparam(centered=0.0, shape_params=("df",))}
    lp_reparam, tr = log_density(reparam(model, config=config), {"x_decentered": z})
    fn = tr["x_decentered"].fn
    assert isinstance(fn, dist.StudentT)
    assert torch.equal(fn.df, torch.full((3,), 3.5))
    x = loc + scale * z
    assert torch.allclose(tr["x"].value, x, rtol=0, atol=1e-14)
    lp_orig, _ = log_density(model, {"x": x})
    assert lp_reparam == pytest.approx(lp_orig + 3 * math.log(scale), abs=TOL)
    assert lp_reparam == pytest.approx(stats.t(3.5).logpdf(z.numpy()).sum(), abs=TOL)


def test_studentt_default_carries_the_other_parameters():
    """As in Pyro, ``shape_params`` defaults to every parameter of the family other than
    loc and scale (``df`` of StudentT): the default failed with torch's TypeError."""
    df, loc, scale = torch.tensor(3.5), torch.tensor([0.5, -1.0, 2.0]), torch.tensor(2.5)

    def model():
        with pt.plate("data", 3):
            pt.sample("n", dist.Normal(loc, scale))
            return pt.sample("x", dist.StudentT(df, loc, scale))

    z = torch.tensor([0.2, -0.9, 1.4])
    noncentered = LocScaleReparam(centered=0.0)  # one reparameterizer for both families
    config = {"x": noncentered, "n": noncentered}
    lp_reparam, tr = log_density(
        reparam(model, config=config), {"x_decentered": z, "n_decentered": z}
    )
    assert isinstance(tr["x_decentered"].fn, dist.StudentT)
    assert torch.equal(tr["x_decentered"].fn.df, torch.full((3,), 3.5))
    assert isinstance(tr["n_decentered"].fn, dist.Normal)
    assert torch.allclose(tr["x"].value, loc + scale * z, rtol=0, atol=1e-14)
    expected = stats.t(3.5).logpdf(z.numpy()).sum() + stats.norm.logpdf(z.numpy()).sum()
    assert lp_reparam == pytest.approx(expected, abs=TOL)


def test_loc_scale_failure_names_the_site():
    def model():
        pt.sample("x", dist.StudentT(3.5, 0.5, 2.0))

    with pytest.raises(TypeError, match=r"site 'x'.*StudentT.*shape_params=\(\).*df") as info:
        seed(reparam(model, config={"x": LocScaleReparam(0.0, shape_params=())}), 0)()
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(AttributeError, match=r"site 'x'.*StudentT.*'nu'"):
        seed(reparam(model, config={"x": LocScaleReparam(0.0, shape_params=("nu",))}), 0)()


def test_loc_scale_on_to_event_distribution():
    loc, scale = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, 1.5, 4.0])

    def model():
        with pt.plate("data", 2):
            return pt.sample("x", dist.Normal(loc, scale).to_event(1))

    z = torch.tensor([[0.1, -0.2, 0.3], [1.0, 0.0, -1.0]])
    config = {"x": LocScaleReparam(centered=0.0)}
    lp_reparam, tr = log_density(reparam(model, config=config), {"x_decentered": z})
    fn = tr["x_decentered"].fn
    assert fn.batch_shape == (2,) and fn.event_shape == (3,)
    x = loc + scale * z
    assert torch.allclose(tr["x"].value, x, rtol=0, atol=1e-14)
    lp_orig, _ = log_density(model, {"x": x})
    assert lp_reparam == pytest.approx(lp_orig + 2 * scale.log().sum().item(), abs=TOL)


def test_transform_lognormal():
    loc, scale = torch.tensor(0.3), torch.tensor(0.8)

    def model():
        with pt.plate("data", 4):
            return pt.sample("x", dist.LogNormal(loc, scale))

    base = torch.tensor([-0.5, 0.0, 0.7, 1.9])
    model_r = reparam(model, config={"x": TransformReparam()})
    lp_reparam, tr = log_density(model_r, {"x_base": base})
    assert list(tr) == ["data", "x_base", "x"]
    assert tr["x"].type == "deterministic"
    assert isinstance(tr["x_base"].fn, dist.Normal) and tr["x_base"].fn.batch_shape == (4,)
    x = base.exp()
    assert torch.allclose(tr["x"].value, x, rtol=1e-15)
    lp_orig, _ = log_density(model, {"x": x})
    # x = exp(base): log |dx/dbase| = base
    assert lp_reparam == pytest.approx(lp_orig + base.sum().item(), abs=TOL)
    expected_orig = stats.lognorm(s=0.8, scale=math.exp(0.3)).logpdf(x.numpy()).sum()
    assert lp_orig == pytest.approx(expected_orig, abs=TOL)


def test_transform_to_event_lognormal():
    loc, scale = torch.tensor([0.0, 1.0, -1.0]), torch.tensor([1.0, 0.5, 2.0])

    def model():
        return pt.sample("x", dist.LogNormal(loc, scale).to_event(1))

    base = torch.tensor([0.4, -0.3, 1.1])
    model_r = reparam(model, config={"x": TransformReparam()})
    lp_reparam, tr = log_density(model_r, {"x_base": base})
    fn = tr["x_base"].fn
    assert fn.batch_shape == () and fn.event_shape == (3,)
    assert tr.log_densities()["x_base"].shape == ()
    lp_orig, _ = log_density(model, {"x": base.exp()})
    assert lp_reparam == pytest.approx(lp_orig + base.sum().item(), abs=TOL)
    assert lp_reparam == pytest.approx(
        stats.norm(loc.numpy(), scale.numpy()).logpdf(base.numpy()).sum(), abs=TOL
    )


def test_transform_affine_event_transform_in_plate():
    loc, scale = torch.tensor([0.0, 1.0, -1.0]), torch.tensor([1.0, 0.5, 2.0])
    shift, mult = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, -0.5, 3.0])

    def model():
        with pt.plate("data", 2):
            base = dist.Normal(loc, scale).to_event(1)
            transform = dist.transforms.AffineTransform(shift, mult, event_dim=1)
            return pt.sample("x", dist.TransformedDistribution(base, [transform]))

    base = torch.tensor([[0.4, -0.3, 1.1], [-2.0, 0.5, 0.0]])
    model_r = reparam(model, config={"x": TransformReparam()})
    lp_reparam, tr = log_density(model_r, {"x_base": base})
    fn = tr["x_base"].fn
    assert fn.batch_shape == (2,) and fn.event_shape == (3,)
    x = shift + mult * base
    assert torch.allclose(tr["x"].value, x, rtol=0, atol=1e-14)
    lp_orig, _ = log_density(model, {"x": x})
    log_jacobian = 2 * mult.abs().log().sum().item()
    assert lp_reparam == pytest.approx(lp_orig + log_jacobian, abs=TOL)
    np.testing.assert_allclose(
        tr.log_densities()["x_base"].numpy(),
        stats.norm(loc.numpy(), scale.numpy()).logpdf(base.numpy()).sum(-1),
        rtol=1e-12,
    )


def test_transform_stick_breaking_changes_event_shape():
    base_dist = dist.Normal(torch.zeros(3), 1.0).to_event(1)
    transform = dist.transforms.StickBreakingTransform()

    def model():
        return pt.sample("p", dist.TransformedDistribution(base_dist, [transform]))

    base = torch.tensor([0.2, -0.4, 1.0])
    model_r = reparam(model, config={"p": TransformReparam()})
    lp_reparam, tr = log_density(model_r, {"p_base": base})
    assert tr["p_base"].fn.event_shape == (3,)
    p = transform(base)
    assert tr["p"].value.shape == (4,)
    assert torch.allclose(tr["p"].value, p, rtol=0, atol=1e-15)
    lp_orig, _ = log_density(model, {"p": p})
    log_jacobian = transform.log_abs_det_jacobian(base, p).item()
    assert lp_reparam == pytest.approx(lp_orig + log_jacobian, abs=TOL)


def test_transform_that_adds_an_event_dim():
    loc = torch.linspace(-1.0, 1.0, 6)
    transform = dist.transforms.ReshapeTransform((6,), (2, 3))

    def model():
        with pt.plate("data", 2):
            base = dist.Normal(loc, 2.0).to_event(1)
            return pt.sample("m", dist.TransformedDistribution(base, [transform]))

    base = torch.arange(12.0).reshape(2, 6) / 10
    model_r = reparam(model, config={"m": TransformReparam()})
    lp_reparam, tr = log_density(model_r, {"m_base": base})
    fn = tr["m_base"].fn
    assert fn.batch_shape == (2,) and fn.event_shape == (6,)
    assert tr["m"].value.shape == (2, 2, 3)
    assert torch.equal(tr["m"].value, base.reshape(2, 2, 3))
    lp_orig, _ = log_density(model, {"m": base.reshape(2, 2, 3)})
    assert lp_reparam == pytest.approx(lp_orig, abs=TOL)  # a reshape has unit Jacobian
    assert lp_reparam == pytest.approx(
        stats.norm(loc.numpy(), 2.0).logpdf(base.numpy()).sum(), abs=TOL
    )


def test_reparam_draws_and_gradients():
    model = reparam(eight_schools, config={"theta": LocScaleReparam(centered=0.0)})
    tr = trace(seed(model, rng_seed=0)).get_trace(EIGHT_SIGMA, EIGHT_Y)
    mu, tau, z = (tr[k].value for k in ("mu", "tau", "theta_decentered"))
    assert torch.allclose(tr["theta"].value, mu + tau * z, rtol=0, atol=1e-13)
    # the reparameterized log density is differentiable in the auxiliary values
    z = Z.clone().requires_grad_(True)
    tr = trace(substitute(model, data={"mu": MU, "tau": TAU, "theta_decentered": z}))
    tr.get_trace(EIGHT_SIGMA, EIGHT_Y).log_prob_sum().backward()
    theta = MU + TAU * Z
    expected = -Z + TAU * (EIGHT_Y - theta) / EIGHT_SIGMA**2
    assert torch.allclose(z.grad, expected, rtol=1e-12)


def test_reparam_errors():
    with pytest.raises(ValueError, match=r"centered must lie in \[0, 1\], got 1.5"):
        LocScaleReparam(centered=1.5)

    def observed():
        pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(1.0))

    with pytest.raises(ValueError, match="LocScaleReparam cannot reparameterize the observed"):
        reparam(observed, config={"y": LocScaleReparam(0.0)})()
    with pytest.raises(ValueError, match="TransformReparam cannot reparameterize the observed"):
        reparam(observed, config={"y": TransformReparam()})()

    def gamma():
        pt.sample("g", dist.Gamma(2.0, 1.0))

    with pytest.raises(ValueError, match="'g'.*Gamma.*not a location-scale family"):
        seed(reparam(gamma, config={"g": LocScaleReparam(0.0)}), rng_seed=0)()
    with pytest.raises(ValueError, match="'g'.*Gamma, not a TransformedDistribution"):
        seed(reparam(gamma, config={"g": TransformReparam()}), rng_seed=0)()


def test_a_reparameterizer_returning_a_distribution_and_a_value_makes_an_observed_factor(
    float64,
):
    """A user's Reparam returning ``(Delta(v, log_density=...), v)`` (how Pyro's and
    NumPyro's reparameterizers write a Jacobian term): the site is an observed factor, as
    there (it stayed latent, and the potential refused a latent Delta). x = |u| with
    u ~ N(0, 2) is HalfNormal(2): the potential of u is -log N(u; 0, 2)."""
    from probtorch.inference import Potential
    from probtorch.reparam import Reparam

    class Folded(Reparam):
        def __call__(self, name, fn, obs):
            u = pt.sample(f"{name}_u", dist.Normal(0.0, fn.scale))
            return dist.Delta(u.abs(), log_density=torch.zeros(())), u.abs()

    model = reparam(lambda: pt.sample("x", dist.HalfNormal(2.0)), config={"x": Folded()})
    tr = trace(seed(model, rng_seed=0)).get_trace()
    assert tr["x"].is_observed and float(tr["x"].value) == abs(float(tr["x_u"].value))
    potential = Potential(model, compile=False)
    u = torch.tensor([[-1.5], [0.7]])
    expected = -stats.norm(0.0, 2.0).logpdf(u.numpy()[:, 0])
    np.testing.assert_allclose(potential(u).detach().numpy(), expected, rtol=1e-10)


def test_reparam_refuses_a_site_with_a_sample_shape():
    """A reparameterizer draws its auxiliary site without the site's sample_shape (in
    Pyro and NumPyro too): x of shape (3,) silently became a scalar; refused by name."""

    def model():
        s = pt.sample("s", dist.HalfNormal(1.0))
        pt.sample("x", dist.Normal(0.0, s), sample_shape=(3,))

    reparameterized = reparam(model, config={"x": LocScaleReparam(0.0)})
    with pytest.raises(ValueError, match=r"site 'x' has sample_shape \(3,\)"):
        trace(seed(reparameterized, rng_seed=0)).get_trace()


# -- NeuTraReparam ------------------------------------------------------------------------------
def _neutra_model(y):
    """A positive global site, a plated site and a simplex site."""
    s = pt.sample("s", dist.LogNormal(0.0, 1.0))
    with pt.plate("J", 3):
        theta = pt.sample("theta", dist.Normal(0.0, s))
    probs = pt.sample("probs", dist.Dirichlet(torch.ones(3)))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal((theta * probs).sum(), 1.0), obs=y)


NEUTRA_Y = torch.tensor([0.4, -0.3, 1.1, 0.2], dtype=torch.float64)


def _set_up(guide_type, **kwargs):
    """A guide of ``_neutra_model`` set up, with params moved off their initial values."""
    from probtorch.inference.autoguide import AutoIAFNormal

    torch.manual_seed(0)
    if guide_type is AutoIAFNormal:
        kwargs = {"hidden_dims": [6], "num_transforms": 2, **kwargs}
    guide = guide_type(_neutra_model, **kwargs)
    store = pt.ParamStore()
    with pt.param_scope(store), seed(rng_seed=0):
        guide(NEUTRA_Y)
    generator = torch.Generator().manual_seed(1)
    params = {}
    for name, value in store.items():
        noise = torch.randn(value.shape, generator=generator, dtype=value.dtype)
        params[name] = (
            value + 0.3 * noise if "scale" not in name else value * (1 + 0.3 * noise.abs())
        )
    return guide, params


def _guide_types():
    from probtorch.inference.autoguide import (
        AutoDiagonalNormal,
        AutoIAFNormal,
        AutoLowRankMultivariateNormal,
        AutoMultivariateNormal,
    )

    return [
        AutoDiagonalNormal,
        AutoMultivariateNormal,
        AutoLowRankMultivariateNormal,
        AutoIAFNormal,
    ]


@pytest.mark.parametrize("guide_type", _guide_types(), ids=lambda t: t.__name__)
def test_get_transform_pushes_the_base_forward_to_the_posterior(guide_type):
    """``get_transform(params)`` is the map of ``get_base_dist()`` onto
    ``get_posterior(params)``: the change of variables holds at every point, and its
    parameters are detached."""
    guide, params = _set_up(guide_type)
    for value in params.values():
        value.requires_grad_(True)
    transform, base = guide.get_transform(params), guide.get_base_dist()
    posterior = guide.get_posterior(params)
    z = torch.randn(5, guide.latent_dim, generator=torch.Generator().manual_seed(2))
    x = transform(z)
    assert not x.requires_grad
    expected = base.log_prob(z) - transform.log_abs_det_jacobian(z, x)
    torch.testing.assert_close(posterior.log_prob(x).detach(), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("guide_type", _guide_types(), ids=lambda t: t.__name__)
def test_neutra_density_is_the_models_times_the_jacobians(guide_type):
    """The potential of the shared latent ``z`` is minus the model's log joint at
    ``x = biject(T(z))`` plus the log Jacobians of ``T`` and of each site's bijection,
    each counted once (the plated site's terms are elementwise, in its plate)."""
    from probtorch.inference import Potential
    from probtorch.reparam import NeuTraReparam

    guide, params = _set_up(guide_type)
    neutra = NeuTraReparam(guide, params)
    potential = Potential(neutra.reparam(_neutra_model), (NEUTRA_Y,), compile=False)
    assert [site.name for site in potential.sites] == ["auto_shared_latent"]
    z = torch.randn(3, guide.latent_dim, generator=torch.Generator().manual_seed(4))
    transform = guide.get_transform(params)
    for row in z:
        u = transform(row)
        log_s, theta, stick = u[0], u[1:4], u[4:]
        probs = torch.distributions.biject_to(torch.distributions.constraints.simplex)
        p = probs(stick)
        values = {"s": log_s.exp(), "theta": theta, "probs": p}
        log_joint, _ = log_density(_neutra_model, values, NEUTRA_Y)
        expected = (
            log_joint
            + float(transform.log_abs_det_jacobian(row, u))
            + float(log_s)  # d exp(u) / du
            + float(probs.log_abs_det_jacobian(stick, p))
        )
        assert float(potential(row[None])) == pytest.approx(-expected, abs=1e-10)


def test_neutra_samples_summaries_and_predictions():
    """A NeuTra run records the model's sites (deterministic) beside the shared latent;
    ``to_inference_data``'s log likelihood is the observed site's alone (the NeuTra
    factors are prior terms); ``Predictive`` replays the run; ``transform_sample`` maps
    the latent draws onto the recorded sites."""
    from probtorch.inference import MCMC, NUTS, Predictive
    from probtorch.inference.autoguide import AutoMultivariateNormal
    from probtorch.reparam import NeuTraReparam

    guide, params = _set_up(AutoMultivariateNormal)
    neutra = NeuTraReparam(guide, params)
    mcmc = MCMC(NUTS(neutra.reparam(_neutra_model), compile=False), num_warmup=30,
                num_samples=20, num_chains=2, progress_bar=False, seed=0)  # fmt: skip
    mcmc.run(NEUTRA_Y)
    samples = mcmc.get_samples()
    assert sorted(samples) == ["auto_shared_latent", "probs", "s", "theta"]
    assert samples["theta"].shape == (40, 3) and samples["probs"].shape == (40, 3)
    mapped = neutra.transform_sample(samples["auto_shared_latent"])
    for name, value in mapped.items():
        torch.testing.assert_close(value, samples[name], rtol=1e-12, atol=1e-12)
    idata = mcmc.to_inference_data()
    assert list(idata.log_likelihood.data_vars) == ["y"]
    assert dict(idata.posterior["theta"].sizes) == {"chain": 2, "draw": 20, "J": 3}
    predictive = Predictive(neutra.reparam(_neutra_model), samples)(NEUTRA_Y, seed=0)
    assert predictive["y"].shape == (40, 4)


def test_neutra_compiled_draws_what_eager_draws_without_recompiles():
    """The NeuTra model through the compiled sampler: the eager run's draws, no graph
    breaks, and a continued run compiles nothing."""
    from probtorch.inference import MCMC, NUTS
    from probtorch.inference.autoguide import AutoIAFNormal
    from probtorch.inference.compile import count_compiles
    from probtorch.reparam import NeuTraReparam

    guide, params = _set_up(AutoIAFNormal)
    model = NeuTraReparam(guide, params).reparam(_neutra_model)
    runs = {}
    for compiled in (False, True):
        mcmc = MCMC(NUTS(model, compile=compiled, step_size=0.3, adapt_step_size=False,
                         adapt_mass_matrix=False), num_warmup=0, num_samples=10,
                    num_chains=2, progress_bar=False, seed=3)  # fmt: skip
        with count_compiles() as first:
            mcmc.run(NEUTRA_Y)
        runs[compiled] = mcmc
    assert first.graph_breaks == 0
    for name, value in runs[False].get_samples().items():
        torch.testing.assert_close(runs[True].get_samples()[name], value, rtol=0, atol=1e-9)
    compiled = runs[True]
    compiled.post_warmup_state = compiled.last_state
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        compiled.run(NEUTRA_Y)
    assert later.graph_breaks == 0 and later.graphs == 0


def test_neutra_errors_name_what_is_wrong():
    from probtorch.inference.autoguide import (
        AutoLaplaceApproximation,
        AutoMultivariateNormal,
        AutoNormal,
    )
    from probtorch.reparam import NeuTraReparam

    with pytest.raises(TypeError, match="AutoContinuous guide.*got AutoNormal"):
        NeuTraReparam(AutoNormal(_neutra_model))
    with pytest.raises(RuntimeError, match="NeuTraReparam: the guide has not been set up"):
        NeuTraReparam(AutoMultivariateNormal(_neutra_model))
    laplace, params = _set_up(AutoLaplaceApproximation)
    with pytest.raises(ValueError, match="laplace_approximation"):
        NeuTraReparam(laplace, params)

    guide, params = _set_up(AutoMultivariateNormal)
    neutra = NeuTraReparam(guide, params)

    def fewer_groups(y):
        s = pt.sample("s", dist.LogNormal(0.0, 1.0))
        with pt.plate("J", 2):
            pt.sample("theta", dist.Normal(0.0, s))

    with pytest.raises(ValueError, match=r"site 'theta' has shape \(2,\).*but \(3,\)"):
        trace(seed(neutra.reparam(fewer_groups), rng_seed=0)).get_trace(NEUTRA_Y)

    def no_probs(y):
        pt.sample("s", dist.LogNormal(0.0, 1.0))
        with pt.plate("J", 3):
            pt.sample("theta", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"latent sites \['probs'\] did not occur"):
        trace(seed(neutra.reparam(no_probs), rng_seed=0)).get_trace(NEUTRA_Y)

    def observed_s(y):
        pt.sample("s", dist.LogNormal(0.0, 1.0), obs=torch.tensor(1.0))
        with pt.plate("J", 3):
            pt.sample("theta", dist.Normal(0.0, 1.0))
        pt.sample("probs", dist.Dirichlet(torch.ones(3)))

    with pytest.raises(ValueError, match=r"site 's' is observed in this run, but the guide"):
        trace(seed(neutra.reparam(observed_s), rng_seed=0)).get_trace(NEUTRA_Y)
    with pytest.raises(TypeError, match=r"neutra.reparam\(model\)"):
        trace(seed(reparam(_neutra_model, config={"s": neutra}), rng_seed=0)).get_trace(NEUTRA_Y)


# -- StudentT, circular, projected normal, Gumbel-softmax; strategies ---------------------------
def test_studentt_reparam_density_and_marginal():
    """``x ~ StudentT(df, loc, scale)`` becomes a Gamma precision and a conditional Normal
    (scipy's densities), in a plate and for an observed site; marginally the draws of
    ``x`` are StudentT (KS test against scipy, fixed seed)."""
    from probtorch.reparam import StudentTReparam

    def model(y=None):
        with pt.plate("n", 20000):
            return pt.sample("x", dist.StudentT(3.0, 1.0, 2.0), obs=y)

    m = reparam(model, config={"x": StudentTReparam()})
    tr = trace(seed(m, rng_seed=0)).get_trace()
    assert list(tr) == ["n", "x_gamma", "x"] and not tr["x"].is_observed
    g, x = tr["x_gamma"].value, tr["x"].value
    expected = (
        stats.gamma(1.5, scale=1 / 1.5).logpdf(g.numpy()).sum()
        + stats.norm(1.0, 2.0 / np.sqrt(g.numpy())).logpdf(x.numpy()).sum()
    )
    assert float(tr.log_prob_sum()) == pytest.approx(expected, rel=1e-10)
    assert stats.kstest(x.numpy(), stats.t(3.0, 1.0, 2.0).cdf).pvalue > 1e-3
    y = torch.zeros(20000)
    observed = trace(seed(m, rng_seed=0)).get_trace(y)
    assert observed["x"].is_observed and torch.equal(observed["x"].value, y)
    with pytest.raises(ValueError, match="StudentTReparam: site 'x' has distribution Normal"):
        seed(
            reparam(lambda: pt.sample("x", dist.Normal(0.0, 1.0)), config={"x": StudentTReparam()}),
            0,
        )()  # noqa: E501


def test_circular_reparam_wraps_and_keeps_the_density():
    """The unwrapped angle carries no density; ``x`` is it wrapped into [-pi, pi) and its
    von Mises density is the factor ``x_factor``; prior draws are von Mises draws."""
    from probtorch.reparam import CircularReparam

    def model():
        with pt.plate("n", 3):
            return pt.sample("x", dist.VonMises(2.5, 1.5))

    m = reparam(model, config={"x": CircularReparam()})
    u = torch.tensor([2.0, 2.0 + 2 * math.pi, -9.0])
    tr = trace(substitute(m, data={"x_unwrapped": u})).get_trace()
    wrapped = np.mod(u.numpy() + np.pi, 2 * np.pi) - np.pi
    np.testing.assert_allclose(tr["x"].value.numpy(), wrapped, rtol=0, atol=1e-12)
    assert tr["x"].type == "deterministic" and tr["x_factor"].is_observed
    expected = stats.vonmises(1.5, loc=2.5).logpdf(wrapped).sum()
    # (torch's von Mises normalizer is a polynomial approximation, to about 1e-8)
    assert float(tr.log_prob_sum()) == pytest.approx(expected, rel=1e-7)
    draws = trace(seed(m, rng_seed=0)).get_trace()["x"].value
    assert draws.shape == (3,) and bool((draws.abs() <= math.pi).all())
    with pytest.raises(
        ValueError, match="'x' has distribution Normal, not a distribution of angles"
    ):  # noqa: E501
        seed(
            reparam(lambda: pt.sample("x", dist.Normal(0.0, 1.0)), config={"x": CircularReparam()}),
            0,
        )()  # noqa: E501


def test_projected_normal_reparam_is_the_normalized_shifted_noise():
    """``x = normalize(concentration + x_normal)``: the construction of ProjectedNormal's
    own sampler, so the same noise gives the same direction; the noise is a standard
    Normal over the plate and the event."""
    from probtorch.reparam import ProjectedNormalReparam

    concentration = torch.tensor([[2.0, 0.0, 1.0], [0.0, -1.0, 0.5]])

    def model():
        with pt.plate("n", 2):
            return pt.sample("x", dist.ProjectedNormal(concentration))

    m = reparam(model, config={"x": ProjectedNormalReparam()})
    noise = torch.tensor([[0.3, -0.2, 0.1], [1.0, 0.4, -2.0]])
    tr = trace(substitute(m, data={"x_normal": noise})).get_trace()
    y = (concentration + noise).numpy()
    np.testing.assert_allclose(
        tr["x"].value.numpy(), y / np.linalg.norm(y, axis=-1, keepdims=True), atol=1e-12
    )
    assert float(tr.log_prob_sum()) == pytest.approx(stats.norm.logpdf(noise.numpy()).sum())
    assert tr["x_normal"].fn.event_shape == (3,) and tr["x_normal"].fn.batch_shape == (2,)


def test_gumbel_softmax_reparam_matches_torchs_relaxed_sampler():
    """The value from the uniform noise is torch's RelaxedOneHotCategorical draw from the
    same uniforms (torch draws them the same way), and the noise is Uniform(0, 1)."""
    from probtorch.reparam import GumbelSoftmaxReparam

    logits, temperature = torch.tensor([0.5, -1.0, 2.0]), torch.tensor(0.7)

    def model():
        return pt.sample("x", dist.RelaxedOneHotCategorical(temperature, logits=logits))

    m = reparam(model, config={"x": GumbelSoftmaxReparam()})
    u = torch.tensor([0.2, 0.9, 0.5])
    tr = trace(substitute(m, data={"x_uniform": u})).get_trace()
    gumbel = -np.log(-np.log(u.numpy()))
    scores = (logits.numpy() + gumbel) / 0.7
    expected = np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()
    np.testing.assert_allclose(tr["x"].value.numpy(), expected, rtol=1e-12)
    assert float(tr.log_prob_sum()) == 0.0  # three uniforms on (0, 1)


def test_auto_reparam_decenters_loc_scale_sites_and_unwraps_transforms():
    """``AutoReparam`` (Pyro's strategy): a location-scale site on the real line gets a
    LocScaleReparam, a TransformedDistribution a TransformReparam (HalfCauchy and
    LogNormal are torch's transformed Cauchy and Normal, whose bases are then decentered),
    observed sites are left; the choice is kept in ``config`` after the first run. With
    ``centered=0.0`` eight schools' log density is the fully non-centered one (scipy);
    with ``centered=None`` the centering is a param."""
    from probtorch.reparam import AutoReparam

    strategy = AutoReparam(centered=0.0)
    model = strategy(eight_schools)
    mu_d, tau_d = MU / 5.0, -TAU / 5.0  # (tau = |5 tau_base_decentered|: HalfCauchy is |Cauchy|)
    aux = {"mu_decentered": mu_d, "tau_base_decentered": tau_d, "theta_decentered": Z}
    lp_auto, tr = log_density(model, aux, EIGHT_SIGMA, EIGHT_Y)
    assert [n for n in tr if tr[n].type == "sample"] == [
        "mu_decentered", "tau_base_decentered", "theta_decentered", "y"
    ]  # fmt: skip
    assert float(tr["tau"].value) == pytest.approx(float(TAU))
    assert strategy.config["y"] is None
    assert type(strategy.config["tau"]).__name__ == "TransformReparam"
    theta = (MU + TAU * Z).numpy()
    expected = (
        stats.norm.logpdf(mu_d.item())
        + stats.cauchy.logpdf(tau_d.item())
        + stats.norm.logpdf(Z.numpy()).sum()
        + stats.norm(theta, EIGHT_SIGMA.numpy()).logpdf(EIGHT_Y.numpy()).sum()
    )
    assert lp_auto == pytest.approx(expected, abs=TOL)

    learned = AutoReparam()
    store = pt.ParamStore()
    with pt.param_scope(store):
        trace(seed(learned(lambda: pt.sample("x", dist.LogNormal(0.0, 1.0))), 0)).get_trace()
    assert list(store.keys()) == ["x_base_centered"]
    assert [type(r).__name__ for r in learned.config.values() if r is not None] == [
        "TransformReparam", "LocScaleReparam"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="centered must be None or in"):
        AutoReparam(centered=2.0)


def test_minimal_reparam_only_where_needed():
    """``MinimalReparam`` reparameterizes ProjectedNormal latents and leaves the rest; a
    Stable site (no density, no Stable reparameterizer here) is refused by name."""
    from probtorch.reparam import MinimalReparam

    @MinimalReparam()
    def model():
        pt.sample("s", dist.Normal(0.0, 1.0))
        pt.sample("d", dist.ProjectedNormal(torch.ones(3)))

    tr = trace(seed(model, rng_seed=0)).get_trace()
    assert [n for n in tr if tr[n].type == "sample"] == ["s", "d_normal"]
    assert tr["d"].type == "deterministic"

    @MinimalReparam()
    def stable():
        pt.sample("z", dist.Stable(1.5, 0.0))

    with pytest.raises(NotImplementedError, match="site 'z' is a Stable distribution"):
        trace(seed(stable, rng_seed=0)).get_trace()


def test_noise_reparameterizers_in_a_plate():
    """ProjectedNormal and Gumbel-softmax sites in a plate: the noise has the plate's batch
    shape and the site's event shape."""
    from probtorch.reparam import GumbelSoftmaxReparam, ProjectedNormalReparam

    def model():
        with pt.plate("n", 4):
            pt.sample("d", dist.ProjectedNormal(torch.ones(3)))
            pt.sample("g", dist.RelaxedOneHotCategorical(torch.tensor(0.5), logits=torch.zeros(2)))  # noqa: E501

    config = {"d": ProjectedNormalReparam(), "g": GumbelSoftmaxReparam()}
    tr = trace(seed(reparam(model, config=config), rng_seed=0)).get_trace()
    for name, event in (("d_normal", 3), ("g_uniform", 2)):
        assert tr[name].fn.batch_shape == (4,) and tr[name].fn.event_shape == (event,)
    assert tr["d"].value.shape == (4, 3) and tr["g"].value.shape == (4, 2)
    torch.testing.assert_close(tr["d"].value.norm(dim=-1), torch.ones(4))


def _tempered(y):
    """A prior tempered by ``scale``, a masked latent, a support that depends on a latent."""
    with pt.handlers.scale(scale=0.5):
        s = pt.sample("s", dist.LogNormal(0.0, 1.0))
    with pt.handlers.mask(mask=False):
        pt.sample("w", dist.Gamma(2.0, 1.0))
    a = pt.sample("a", dist.Normal(0.0, 1.0))
    with pt.plate("J", 3):
        b = pt.sample("b", dist.Uniform(a, a + 3.0))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(b.sum() * s, 1.0), obs=y)


def _enumerated(y):
    """A continuous latent whose distribution depends on an enumerated discrete site."""
    c = pt.sample("c", dist.Bernoulli(0.3))
    x = pt.sample("x", dist.Normal(torch.where(c > 0, 2.0, -2.0), 1.0))
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.Normal(x, 1.0), obs=y)


@pytest.mark.parametrize("model", [_tempered, _enumerated], ids=lambda m: m.__name__)
def test_neutra_potential_is_the_models_at_the_warped_point(model):
    """HMC's potential of the NeuTra model at ``z`` is the model's own potential at the
    unconstrained point ``T(z)`` minus ``log |det T'(z)|``: with a scaled (tempered) and a
    masked latent (their log densities scaled and masked, their Jacobians not, as the
    model's potential has them), a support depending on a latent (each draw's own
    bounds), and a discrete site summed out of both."""
    from probtorch.inference import Potential
    from probtorch.inference.autoguide import AutoIAFNormal
    from probtorch.reparam import NeuTraReparam

    torch.manual_seed(0)
    visible = pt.handlers.block(model, hide=["c"])  # (the guide leaves the discrete site)
    guide = AutoIAFNormal(visible, hidden_dims=[6], num_transforms=2)
    with pt.param_scope(pt.ParamStore()), seed(rng_seed=0):
        guide(NEUTRA_Y)
        neutra = NeuTraReparam(guide, dict(pt.get_param_store().items()) or None)
    transform = neutra.transform
    warped = Potential(neutra.reparam(model), (NEUTRA_Y,), compile=False)
    plain = Potential(model, (NEUTRA_Y,), compile=False)
    assert plain.dim == guide.latent_dim
    z = torch.randn(4, guide.latent_dim, generator=torch.Generator().manual_seed(4))
    u = transform(z)
    expected = plain(u) - transform.log_abs_det_jacobian(z, u)
    torch.testing.assert_close(warped(z), expected, rtol=1e-10, atol=1e-10)


def test_neutra_transform_sample_maps_each_draw_with_its_own_bounds():
    """``transform_sample`` runs the model: ``b ~ Uniform(a, a + 3)`` with a latent ``a``
    is mapped into each draw's own interval (the guide's recorded map used the bounds of
    the set-up run: 9 of 50 draws fell outside), equal to what the run records."""
    from probtorch.inference.autoguide import AutoMultivariateNormal
    from probtorch.reparam import NeuTraReparam

    torch.manual_seed(0)
    guide = AutoMultivariateNormal(_tempered)
    with pt.param_scope(pt.ParamStore()), seed(rng_seed=0):
        guide(NEUTRA_Y)
        neutra = NeuTraReparam(guide)
    z = 2 * torch.randn(50, guide.latent_dim, generator=torch.Generator().manual_seed(5))
    mapped = neutra.transform_sample(z)
    a, b = mapped["a"], mapped["b"]
    assert b.shape == (50, 3) and bool(((b > a[:, None]) & (b < a[:, None] + 3)).all())
    tr = trace(substitute(neutra.reparam(_tempered), data={neutra.latent_name: z[7]}))
    recorded = tr.get_trace(NEUTRA_Y)
    for name in ("s", "w", "a", "b"):
        torch.testing.assert_close(mapped[name][7], recorded[name].value, rtol=1e-12, atol=1e-12)


def test_neutra_reads_the_params_the_svi_fitted_in_the_model():
    """The model's own ``pt.param`` under NeuTra is the fitted one, as for the model
    itself (it had read the initial value, 5.0, and written it into the default store)."""
    from probtorch.inference import SVI, Potential, Trace_ELBO
    from probtorch.inference.autoguide import AutoMultivariateNormal
    from probtorch.reparam import NeuTraReparam

    def model(y):
        sigma = pt.param("sigma", torch.tensor(5.0), constraint=dist.constraints.positive)
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("n", y.shape[0]):
            pt.sample("y", dist.Normal(mu, sigma), obs=y)

    y = 3.0 + 0.5 * torch.randn(50, generator=torch.Generator().manual_seed(0))
    guide = AutoMultivariateNormal(model)
    svi = SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False, seed=0)
    result = svi.run(300, y, progress_bar=False)
    fitted = float(result.params["sigma"])
    assert abs(fitted - 0.5) < 0.15
    neutra_model = NeuTraReparam(guide, result.params).reparam(model)
    tr = trace(seed(neutra_model, rng_seed=0)).get_trace(y)
    assert float(tr["sigma"].value) == pytest.approx(fitted)
    assert "sigma" not in pt.get_param_store()
    z = torch.zeros(1, 1)
    plain = Potential(model, (y,), compile=False)
    transform = guide.get_transform(result.params)
    u = transform(z)
    expected = plain(u) - transform.log_abs_det_jacobian(z, u)
    torch.testing.assert_close(Potential(neutra_model, (y,), compile=False)(z), expected)


def test_neutra_in_batched_predictions_and_log_likelihoods():
    """``Predictive(parallel=True)`` batches the draws of a NeuTra model with a plated
    site as those of one run each (the shared latent's batch dims are aligned with the
    plates); ``log_likelihood`` leaves NeuTra's prior factors out, as
    ``to_inference_data`` does."""
    from probtorch.inference import Predictive, log_likelihood
    from probtorch.inference.autoguide import AutoMultivariateNormal
    from probtorch.reparam import NeuTraReparam

    def plated(y):
        s = pt.sample("s", dist.LogNormal(0.0, 1.0))
        with pt.plate("J", 3):
            theta = pt.sample("theta", dist.Normal(0.0, s))
            pt.sample("y", dist.Normal(theta, 1.0), obs=y)

    y = NEUTRA_Y[:3]
    torch.manual_seed(0)
    guide = AutoMultivariateNormal(plated)
    with pt.param_scope(pt.ParamStore()), seed(rng_seed=0):
        guide(y)
        neutra = NeuTraReparam(guide)
    model = neutra.reparam(plated)
    z = torch.randn(7, guide.latent_dim, generator=torch.Generator().manual_seed(6))
    runs = {
        parallel: Predictive(model, {neutra.latent_name: z}, parallel=parallel,
                             return_sites=["s", "theta", "y"])(y, seed=0)
        for parallel in (True, False)
    }  # fmt: skip
    for name in ("s", "theta"):
        torch.testing.assert_close(runs[True][name], runs[False][name], rtol=1e-12, atol=1e-12)
    assert runs[True]["theta"].shape == (7, 3) and runs[True]["y"].shape == (7, 3)
    assert list(log_likelihood(model, {neutra.latent_name: z}, y)) == ["y"]
