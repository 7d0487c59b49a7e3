"""Errors a user hits when a model is wrong: each names the site and says what is wrong."""

import warnings

import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import seed, trace
from probtorch.inference.potential import Potential
from probtorch.validation import torch_validation


def run_traced(model, *args):
    """The eager checks a user meets first: one seeded, traced run with validation on."""
    return trace(seed(model, rng_seed=0)).get_trace(*args)


# -- site names -----------------------------------------------------------------------


def test_two_sample_sites_with_one_name():
    def model():
        pt.sample("x", dist.Normal(0.0, 1.0))
        pt.sample("x", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"two sites are named 'x' \(sample and sample\)"):
        run_traced(model)


def test_sample_and_deterministic_with_one_name():
    def model():
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        pt.deterministic("x", 2 * x)

    with pytest.raises(ValueError, match=r"two sites are named 'x' \(sample and deterministic\)"):
        run_traced(model)


def test_sample_and_param_with_one_name():
    def model():
        pt.param("w", torch.tensor(1.0))
        pt.sample("w", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"two sites are named 'w' \(param and sample\)"):
        run_traced(model)


def test_plate_and_sample_with_one_name():
    def model():
        with pt.plate("data", 3):
            pt.sample("data", dist.Normal(0.0, 1.0))

    with pytest.raises(ValueError, match=r"two sites are named 'data' \(plate and sample\)"):
        run_traced(model)


# -- randomness -----------------------------------------------------------------------


def test_latent_without_seed():
    def model():
        pt.sample("mu", dist.Normal(0.0, 1.0))

    with pytest.raises(pt.RandomnessError, match=r"sample site 'mu'.*no seed handler.*seed\("):
        trace(model).get_trace()
    with pytest.raises(pt.RandomnessError, match="'mu'.*seed"):
        model()


def test_subsample_without_seed():
    def model():
        with pt.plate("batch", 100, subsample_size=10):
            pass

    with pytest.raises(pt.RandomnessError, match="plate 'batch'.*seed"):
        trace(model).get_trace()


def test_randomness_error_is_a_runtime_error():
    assert issubclass(pt.RandomnessError, RuntimeError)


# -- plate and shapes -----------------------------------------------------------------


def test_plate_size_disagrees_with_batch_shape():
    def model():
        with pt.plate("schools", 8):
            pt.sample("theta", dist.Normal(torch.zeros(7), 1.0))

    with pytest.raises(
        ValueError,
        match=r"sample site 'theta'.*batch_shape \(7,\).*size 7.*plate 'schools' at dim -1 has "
        r"size 8",
    ):
        run_traced(model)


def test_plate_size_disagrees_at_inner_dim():
    def model():
        with pt.plate("rows", 3, dim=-2):
            pt.sample("x", dist.Normal(torch.zeros(4, 5), 1.0))

    with pytest.raises(
        ValueError, match=r"'x'.*batch_shape \(4, 5\).*dim -2 has size 4.*plate 'rows'.*size 3"
    ):
        run_traced(model)


def test_subsampled_plate_disagrees_with_batch_shape():
    def model():
        with pt.plate("data", 100, subsample_size=10):
            pt.sample("y", dist.Normal(torch.zeros(100), 1.0), obs=torch.zeros(100))

    with pytest.raises(
        ValueError, match=r"'y'.*batch_shape \(100,\).*'data'.*size 10 \(subsampled from 100\)"
    ):
        run_traced(model)


def test_observed_value_that_would_broadcast():
    def model(y):
        with pt.plate("data", 8):
            pt.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(
        ValueError,
        match=r"sample site 'y': observed value of shape \(8, 1\) does not fit Normal with "
        r"batch_shape \(8,\).*would be broadcast to torch.Size\(\[8, 8\]\)",
    ):
        run_traced(model, torch.zeros(8, 1))


def test_observed_value_that_does_not_broadcast():
    def model(y):
        with pt.plate("data", 8):
            pt.sample("y", dist.Normal(0.0, 1.0), obs=y)

    with pytest.raises(
        ValueError,
        match=r"'y': observed value of shape \(5,\).*batch_shape \(8,\).*do not broadcast",
    ):
        run_traced(model, torch.zeros(5))


def test_observed_value_with_wrong_event_shape():
    def model(y):
        pt.sample("y", dist.MultivariateNormal(torch.zeros(3), torch.eye(3)), obs=y)

    with pytest.raises(
        ValueError, match=r"'y': observed value of shape \(4, 2\).*event_shape \(3,\)"
    ):
        run_traced(model, torch.zeros(4, 2))


def test_observed_value_of_right_shape_passes():
    def model(y):
        with pt.plate("data", 8):
            pt.sample("y", dist.Normal(0.0, 1.0), obs=y)

    run_traced(model, torch.zeros(8))
    pt.enable_validation(False)
    run_traced(model, torch.zeros(8, 1))  # unchecked with validation off


# -- distribution parameters ----------------------------------------------------------


def negative_scale_model():
    mu = pt.sample("mu", dist.Normal(0.0, 1.0))
    pt.sample("sigma_bad", dist.Normal(mu, -1.0))


PARAM_MESSAGE = (
    r"sample site 'sigma_bad': parameter 'scale' of Normal must satisfy the constraint "
    r"GreaterThan\(lower_bound=0\.0\), but got tensor of shape \(\), invalid values \[-1\.0\]"
)


def test_invalid_parameter_through_potential():
    # the first eager trace turns torch's validation off so that probtorch's check names the site
    with pytest.raises(ValueError, match=PARAM_MESSAGE):
        Potential(negative_scale_model, (), compile=False)


def test_invalid_parameter_through_trace_without_torch_validation():
    with torch_validation(False):
        with pytest.raises(ValueError, match=PARAM_MESSAGE):
            run_traced(negative_scale_model)


def test_invalid_parameter_in_a_vector_and_under_a_wrapper():
    def model():
        with pt.plate("data", 4):
            probs = torch.tensor([0.2, 1.5, 0.3, -0.1])
            pt.sample("flip", dist.Bernoulli(probs=probs), obs=torch.zeros(4))

    with torch_validation(False):
        with pytest.raises(
            ValueError,
            match=r"'flip': parameter 'probs' of Bernoulli.*Interval.*shape \(4,\), invalid "
            r"values \[1\.5, -0\.1\d*\]",
        ):
            run_traced(model)

    def wrapped():
        pt.sample("v", dist.Gamma(torch.tensor([1.0, -2.0]), 1.0).to_event(1))

    with torch_validation(False):
        with pytest.raises(ValueError, match=r"'v': parameter 'concentration' of Gamma"):
            run_traced(wrapped)


def test_invalid_parameter_unchecked_when_validation_off():
    pt.enable_validation(False)
    with torch_validation(False):
        run_traced(negative_scale_model)
    assert not pt.is_validation_enabled()


# -- support --------------------------------------------------------------------------


def test_observed_value_outside_support():
    def model(counts):
        rate = pt.sample("rate", dist.Gamma(2.0, 1.0))
        with pt.plate("data", 3):
            pt.sample("counts", dist.Poisson(rate), obs=counts)

    message = (
        r"sample site 'counts': observed value lies outside the support "
        r"IntegerGreaterThan\(lower_bound=0\) of Poisson: tensor of shape \(3,\), invalid "
        r"values \[-1\.0\]"
    )
    counts = torch.tensor([1.0, -1.0, 4.0])
    with pytest.raises(ValueError, match=message):
        run_traced(model, counts)
    with pytest.raises(ValueError, match=message) as raised:
        Potential(model, (counts,), compile=False)
    # the support did not move between two random points: the data are at fault, at once
    assert "the same at two random initial points" in "\n".join(raised.value.__notes__)
    with pytest.raises(ValueError, match=r"'counts'.*outside the support.*\[2\.5\]"):
        run_traced(model, torch.tensor([1.0, 2.5, 4.0]))
    # missing data as NaN, masked or not: the way to pass it is named
    nan = torch.tensor([1.0, float("nan"), 4.0])
    with pytest.raises(ValueError, match=r"1 NaN entries: for missing data pass obs_mask=~torch"):
        run_traced(pt.handlers.mask(model, mask=~torch.isnan(nan)), nan)

    def pairs(y):  # one mask entry per event: the suggested mask is over the batch
        with pt.plate("data", 3):
            pt.sample("y", dist.MultivariateNormal(torch.zeros(2), torch.eye(2)), obs=y)

    with pytest.raises(ValueError, match=r"obs_mask=~torch\.isnan\(y\)\.any\(-1\) to pt"):
        run_traced(pairs, torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [1.0, 1.0]]))


def _bounded_by_a_latent(y):
    theta = pt.sample("theta", dist.Pareto(1.0, 2.0))  # init_to_uniform: theta in (1.1, 8.4)
    with pt.plate("data", y.shape[0]):
        pt.sample("y", dist.Uniform(0.0, theta), obs=y)


def test_support_that_depends_on_a_latent_rejects_initial_points_not_the_data():
    """y ~ Uniform(0, theta): a random theta below max(y) is a rejected initial point (as in
    Stan), not an error blaming the data."""
    from probtorch.inference import MCMC, NUTS

    y = torch.tensor([0.5, 2.5, 1.0])
    for rng_seed in range(5):  # several prototype points have theta < 2.5
        potential = Potential(_bounded_by_a_latent, (y,), compile=False, rng_seed=rng_seed)
        assert float(potential.prototype_trace["theta"].value) > 2.5
    mcmc = MCMC(
        NUTS(_bounded_by_a_latent, compile=False),
        num_warmup=100,
        num_samples=100,
        num_chains=2,
        progress_bar=False,
        seed=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # divergences at the hard boundary
        mcmc.run(y)
    assert float(mcmc.get_samples()["theta"].min()) >= 2.5
    # a bound that no random initial point covers: the advice says how to start
    with pytest.raises(ValueError, match="'y'.*outside the support") as raised:
        Potential(_bounded_by_a_latent, (torch.tensor([0.5, 100.0]),), compile=False)
    assert "init_params" in "\n".join(raised.value.__notes__)


def test_observed_value_outside_positive_support():
    def model():
        pt.sample("s", dist.HalfNormal(1.0), obs=torch.tensor(-0.5))

    with pytest.raises(ValueError, match=r"'s'.*outside the support.*HalfNormal.*\[-0\.5\]"):
        run_traced(model)


def test_infinite_observation_is_a_data_error_naming_the_site():
    # torch's real support admits inf: the potential was infinite at every initial point
    # and the error blamed the latent site 'mu'
    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("n", len(y)):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)

    y = torch.tensor([1.0, 2.0, float("inf"), 0.5, -float("inf")])
    message = (
        r"sample site 'y': observed value of shape \(5,\) has 2 infinite entries \(index: "
        r"value\) \(2,\): inf, \(4,\): -inf, where Normal has no density"
    )
    with pytest.raises(ValueError, match=message):
        run_traced(model, y)
    with pytest.raises(ValueError, match=message) as raised:
        Potential(model, (y,), compile=False)
    assert "the same at two random initial points" in "\n".join(raised.value.__notes__)
    inf = torch.tensor(float("inf"))
    with pytest.raises(ValueError, match="'u'.*1 infinite entries.*where Uniform"):
        run_traced(lambda: pt.sample("u", dist.Uniform(0.0, 2.0), obs=inf))  # dependent support
    with pytest.raises(ValueError, match="'t'.*1 infinite entries.*where Exponential"):
        run_traced(lambda: pt.sample("t", dist.Exponential(1.0), obs=inf))
    # where the log density at inf is finite (a point mass there), inf is a fine observation
    trace = run_traced(lambda: pt.sample("d", dist.Delta(inf), obs=inf))
    assert float(trace["d"].fn.log_prob(inf)) == 0.0


def test_handler_argument_errors():
    with pytest.raises(TypeError, match="seed expected a callable model"):
        seed("model", rng_seed=0)
    with pytest.raises(ValueError, match="'x': obs_mask was given without obs"):
        with trace():
            pt.sample("x", dist.Normal(0.0, 1.0), obs_mask=torch.tensor([True]))


def test_torch_validation_sets_and_restores_the_default_and_nests():
    Distribution = torch.distributions.Distribution
    before = Distribution._validate_args
    try:
        Distribution.set_default_validate_args(True)
        with torch_validation(False):
            assert Distribution._validate_args is False
            with torch_validation(False):  # already off: left alone
                assert Distribution._validate_args is False
            assert Distribution._validate_args is False
            with pytest.raises(RuntimeError), torch_validation(True):
                assert Distribution._validate_args is True
                raise RuntimeError
            assert Distribution._validate_args is False
        assert Distribution._validate_args is True
    finally:
        Distribution.set_default_validate_args(before)


def test_integer_param_is_named():
    # torch's "only Tensors of floating point dtype can require gradients" named no param
    from probtorch.params import ParamStore, param_scope

    with param_scope(ParamStore()):
        with pytest.raises(ValueError, match="param 'n': init_value has dtype torch.int64"):
            pt.param("n", torch.tensor(3))
        assert float(pt.param("m", 3).detach()) == 3.0  # a Python int is a float param


def test_inference_names_on_the_top_module_point_to_infer():
    """``pt.SVI``, ``pt.MCMC`` (where NumPyro's and Pyro's users look first) say where they
    are; other missing names stay plain AttributeErrors (hasattr works)."""
    for name in ("SVI", "MCMC", "NUTS", "Predictive", "Trace_ELBO"):
        with pytest.raises(AttributeError, match=rf"pt\.infer\.{name}\b"):
            getattr(pt, name)
    assert not hasattr(pt, "SVI") and not hasattr(pt, "no_such_name")
