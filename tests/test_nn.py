"""probtorch.nn and nn.Modules in models: pt.module with SVI (dtype moves, result.params,
state_dict), Bayesian modules (attribute API and random_module: names, exact log densities,
exact posteriors with NUTS and SVI, a compiled Bayesian neural network), an amortized guide
with a subsampled plate, and a Bayesian head on a Transformer encoder."""

import math
import pickle

import arviz as az
import pytest
import torch
from torch.optim.lr_scheduler import ExponentialLR

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import seed, substitute, trace
from probtorch.inference import MCMC, NUTS, SVI, Potential, Predictive, Trace_ELBO
from probtorch.inference.autoguide import AutoNormal
from probtorch.inference.compile import count_compiles


@pytest.fixture(autouse=True)
def _float64():
    torch.set_default_dtype(torch.float64)


def _trace(fn, *args, rng_seed=0, data=None, **kwargs):
    if data is not None:
        fn = substitute(fn, data=data)
    return trace(seed(fn, rng_seed=rng_seed)).get_trace(*args, **kwargs)


def _gen(s):
    return torch.Generator().manual_seed(s)


# -- pt.module: point-estimated networks --------------------------------------------------------
def test_module_moves_with_double_and_trains_in_place_with_svi():
    torch.set_default_dtype(torch.float32)
    net = torch.nn.Linear(2, 1).to("cpu", torch.float64)  # moves the parameters
    assert net.weight.dtype == torch.float64
    x = torch.randn(50, 2, generator=_gen(0), dtype=torch.float64)
    y = x @ torch.tensor([1.5, -2.0], dtype=torch.float64) + 0.5

    def model(x, y):
        f = pt.module("net", net)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(f(x).squeeze(-1), 1.0), obs=y)

    def guide(x, y):
        pass

    svi = SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    result = svi.run(1500, x, y, progress_bar=False)
    assert sorted(result.params) == ["net$$$bias", "net$$$weight"]
    assert result.params["net$$$weight"].dtype == torch.float64
    torch.testing.assert_close(
        result.params["net$$$weight"],
        torch.tensor([[1.5, -2.0]], dtype=torch.float64),
        atol=1e-3,
        rtol=0,
    )
    # The module itself holds the trained values: its state_dict is the fit.
    state = net.state_dict()
    torch.testing.assert_close(state["weight"], result.params["net$$$weight"], atol=0, rtol=0)
    torch.testing.assert_close(state["bias"], result.params["net$$$bias"], atol=0, rtol=0)
    assert abs(float(state["bias"]) - 0.5) < 1e-3


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_batchnorm_in_training_mode_trains_as_plain_autograd_does(compiled):
    # BatchNorm updates its running statistics in place, which the step's gradient
    # transform refused ("mutate a captured Tensor"): both modes failed
    import copy

    x = torch.randn(32, 3, generator=_gen(1), dtype=torch.float64)
    y = torch.randn(32, generator=_gen(2), dtype=torch.float64)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 1)
    )
    net[0].register_buffer("offset", torch.zeros(8))  # only read: stays a constant
    net[0].register_forward_hook(lambda module, args, out: out + module.offset)
    reference = copy.deepcopy(net)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    for _ in range(4):
        optimizer.zero_grad()
        loss = -torch.distributions.Normal(reference(x)[:, 0], 1.0).log_prob(y).sum()
        loss.backward()
        optimizer.step()

    def model(x, y):
        pt.module("net", net)
        with pt.plate("n", len(y)):
            pt.sample("y", dist.Normal(net(x)[:, 0], 1.0), obs=y)

    svi = SVI(model, lambda x, y: None, pt.optim.SGD(lr=0.01), Trace_ELBO(), compile=compiled)
    svi.step(x, y)
    svi.step(x, y)
    svi.run(2, x, y, progress_bar=False)
    expected = reference.state_dict()
    for name, value in net.state_dict().items():  # parameters, running mean and variance
        torch.testing.assert_close(value, expected[name], rtol=1e-12, atol=1e-14)
    assert int(net[1].num_batches_tracked) == 4
    # the step's state holds BatchNorm's three buffers, which it writes, not the offset
    assert sorted(attr for _, attr, _ in svi._module_buffers.values()) == [
        "num_batches_tracked",
        "running_mean",
        "running_var",
    ]


# -- the attribute API ------------------------------------------------------------------------
def _scaled_normal(module):  # a module-level function, not a lambda: the module pickles
    return dist.Normal(0.0, module.scale)


class _Nested(pt.nn.Module):
    def __init__(self, name=""):
        super().__init__(name)
        self.body = torch.nn.Sequential(pt.nn.BayesianLinear(2, 3), torch.nn.Tanh())
        self.head = pt.nn.BayesianLinear(3, 1, bias=False)
        self.head.scale = pt.nn.Sample(dist.HalfNormal(1.0))
        self.head.weight = pt.nn.Sample(_scaled_normal)  # hierarchical

    def forward(self, x):
        # head.scale is read here and in the prior of head.weight: one site, one value.
        return self.head(self.body(x)) * (self.head.scale > 0)


def test_attribute_api_names_sites_hierarchically_and_samples_once_per_call():
    net = _Nested(name="bnn")
    x = torch.ones(4, 2)
    tr = _trace(net, x)
    sites = [n for n, s in tr.items() if s.type == "sample"]
    assert sites == ["bnn.body.0.weight", "bnn.body.0.bias", "bnn.head.scale", "bnn.head.weight"]
    assert tr["bnn.head.weight"].fn.event_shape == (1, 3)
    prior_scale = tr["bnn.head.weight"].fn.base_dist.scale
    assert torch.equal(prior_scale, tr["bnn.head.scale"].value.expand(1, 3))
    assert set(net.random_attributes()) == set(sites)
    # Sampled parameters are no parameters any more: no state_dict entry, nothing to train.
    assert [n for n, _ in net.named_parameters()] == []
    assert sorted(net.state_dict()) == ["body.0.prior_scale", "head.prior_scale"]
    # A new call is a new draw.
    w1 = _trace(net, x, rng_seed=1)["bnn.head.weight"].value
    w2 = _trace(net, x, rng_seed=2)["bnn.head.weight"].value
    assert not torch.equal(w1, w2)
    # Outside any forward call, each read is a fresh site (here: under one trace, an error).
    with pytest.raises(ValueError, match="two sites"):
        with pt.handlers.seed(rng_seed=0), trace():
            net.head.scale, net.head.scale  # noqa: B018


def test_attribute_api_moves_with_double_and_keeps_plain_parameters():
    torch.set_default_dtype(torch.float32)
    net = pt.nn.Module[torch.nn.Linear](3, 2, name="lin")
    net.weight = pt.nn.Sample(lambda m: dist.Normal(torch.zeros_like(m.loc), 1.0))
    net.register_buffer("loc", torch.zeros(()))
    net = net.double()
    assert net.bias.dtype == torch.float64 and net.loc.dtype == torch.float64
    tr = _trace(net, torch.ones(5, 3, dtype=torch.float64))
    assert tr["lin.weight"].value.dtype == torch.float64
    assert tr["lin.weight"].value.shape == (2, 3)
    assert [n for n, _ in net.named_parameters()] == ["bias"]
    # Re-assigning a parameter removes the prior.
    net.weight = torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.float64))
    assert "lin.weight" not in _trace(net, torch.ones(5, 3, dtype=torch.float64))


def test_random_and_point_estimated_parameters_in_one_module_with_svi():
    net = pt.nn.Module[torch.nn.Linear](2, 1, name="lin")
    net.weight = pt.nn.Sample(dist.Normal(0.0, 1.0))  # random; the bias stays a parameter
    x = torch.randn(40, 2, generator=_gen(2))
    y = x @ torch.tensor([0.5, -1.0]) + 2.0 + 0.1 * torch.randn(40, generator=_gen(3))

    def model(x, y=None):
        f = pt.module("lin", net)  # registers (and so trains) the bias only
        mean = f(x).squeeze(-1)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(mean, 0.1), obs=y)

    svi = SVI(model, AutoNormal(model), pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    result = svi.run(800, x, y, progress_bar=False)
    assert sorted(result.params) == ["auto.loc.lin.weight", "auto.scale.lin.weight", "lin$$$bias"]
    assert abs(float(result.params["lin$$$bias"]) - 2.0) < 0.1
    assert torch.equal(net.bias.detach(), result.params["lin$$$bias"])
    loc = result.params["auto.loc.lin.weight"]
    torch.testing.assert_close(loc, torch.tensor([[0.5, -1.0]]), atol=0.1, rtol=0)


def test_modules_with_priors_pickle():
    net = pt.nn.Module[torch.nn.Linear](2, 3, name="a")
    net.weight = pt.nn.Sample(dist.Normal(0.0, 1.0))
    for module in (net, pt.nn.BayesianLinear(2, 2, name="b"), _Nested()):
        copy = pickle.loads(pickle.dumps(module))
        assert type(copy) is type(module)
        assert list(copy.random_attributes()) == list(module.random_attributes())
        assert repr(copy) == repr(module)
    tr = _trace(copy, torch.ones(1, 2))
    assert "body.0.weight" in tr


def test_priors_of_the_wrong_shape_are_errors():
    net = pt.nn.Module[torch.nn.Linear](3, 2)
    net.weight = pt.nn.Sample(dist.Normal(torch.zeros(4), 1.0))
    with pytest.raises(ValueError, match="weight"):
        _trace(net, torch.ones(1, 3))
    with pytest.raises(ValueError, match="not parameters"):
        pt.nn.random_module("f", torch.nn.Linear(3, 2), {"kernel": dist.Normal(0.0, 1.0)})
    f = pt.nn.random_module("f", torch.nn.Linear(3, 2), dist.Normal(0.0, 1.0).to_event(0))
    f32 = pt.nn.random_module(
        "f", torch.nn.Linear(3, 2), dist.Normal(torch.tensor(0.0, dtype=torch.float32), 1.0)
    )
    _trace(f, torch.ones(1, 3))
    with pytest.raises(TypeError, match="dtype"):
        _trace(f32, torch.ones(1, 3))
    with pytest.raises(TypeError):
        pt.nn.Sample(3.0)


def test_random_module_samples_selected_parameters_and_leaves_the_module_alone():
    net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    f = pt.nn.random_module(
        "net",
        net,
        {"2.weight": dist.Normal(0.0, 1.0), "2.bias": lambda name, p: dist.Normal(p, 0.1)},
    )
    tr = _trace(f, torch.ones(3, 2))
    assert [n for n in tr if tr[n].type == "sample"] == ["net.2.weight", "net.2.bias"]
    values = {"net.2.weight": torch.ones(1, 4), "net.2.bias": torch.zeros(1)}
    expected = torch.tanh(net[0](torch.ones(3, 2))).sum(-1, keepdim=True)
    out = substitute(seed(f, rng_seed=0), data=values)(torch.ones(3, 2))
    torch.testing.assert_close(out, expected)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])


# -- exact log densities: attribute API, random_module and hand-written -----------------------
S0, NOISE, D = 1.0, 0.5, 3


class AttrRegression(pt.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = pt.nn.BayesianLinear(D, 1, prior_scale=S0)

    def forward(self, x, y=None):
        mean = self.lin(x).squeeze(-1)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(mean, NOISE), obs=y)


def make_random_module_regression():
    lin = torch.nn.Linear(D, 1)

    def model(x, y=None):
        f = pt.nn.random_module("lin", lin, dist.Normal(0.0, S0))
        mean = f(x).squeeze(-1)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(mean, NOISE), obs=y)

    return model


def hand_regression(x, y=None):
    w = pt.sample("lin.weight", dist.Normal(0.0, S0).expand([1, D]).to_event(2))
    b = pt.sample("lin.bias", dist.Normal(0.0, S0).expand([1]).to_event(1))
    mean = (x @ w.T + b).squeeze(-1)
    with pt.plate("data", x.shape[0]):
        pt.sample("y", dist.Normal(mean, NOISE), obs=y)


def regression_data(n=30):
    g = _gen(1)
    x = torch.randn(n, D, generator=g)
    y = x @ torch.tensor([1.0, -0.5, 0.25]) + 0.3 + NOISE * torch.randn(n, generator=g)
    return x, y


def exact_posterior(x, y):
    """Mean and covariance of (weight, bias): conjugate Gaussian, known noise."""
    a = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    precision = a.T @ a / NOISE**2 + torch.eye(D + 1) / S0**2
    cov = torch.linalg.inv(precision)
    mean = cov @ a.T @ y / NOISE**2
    return mean, cov


MODELS = {"attribute": AttrRegression, "random_module": make_random_module_regression}


@pytest.mark.parametrize("kind", list(MODELS))
def test_log_density_equals_the_hand_written_model(kind):
    model = MODELS[kind]()
    x, y = regression_data()
    for s in range(3):
        g = _gen(10 + s)
        values = {
            "lin.weight": torch.randn(1, D, generator=g),
            "lin.bias": torch.randn(1, generator=g),
        }
        ours = _trace(model, x, y, data=values)
        ref = _trace(hand_regression, x, y, data=values)
        assert list(ours) == list(ref)
        assert torch.equal(ours.log_prob_sum(), ref.log_prob_sum())
        for name, lp in ref.log_densities().items():
            assert torch.equal(ours.log_densities()[name], lp), name


@pytest.mark.slow  # ~35 s with a cold compile cache, ~5 s warm
def test_nuts_through_random_module_recovers_the_exact_posterior():
    x, y = regression_data()
    mean, cov = exact_posterior(x, y)
    sd = cov.diagonal().sqrt()
    model = make_random_module_regression()
    mcmc = MCMC(
        NUTS(model), num_warmup=300, num_samples=500, num_chains=2, progress_bar=False, seed=0
    )
    with count_compiles() as stats:
        mcmc.run(x, y)
    assert stats.graph_breaks == 0
    samples = mcmc.get_samples(group_by_chain=True)
    draws = torch.cat(
        [samples["lin.weight"].reshape(2, 500, D), samples["lin.bias"].reshape(2, 500, 1)], dim=-1
    ).numpy()
    for i in range(D + 1):
        chains = draws[:, :, i]
        mcse = float(sd[i]) / math.sqrt(float(az.ess(chains, method="bulk")))
        assert abs(chains.mean() - float(mean[i])) < 4 * mcse, i
        assert abs(chains.std(ddof=1) / float(sd[i]) - 1) < 0.15, i


@pytest.mark.parametrize("kind, compiled", [("attribute", True), ("random_module", False)])
def test_svi_with_autonormal_recovers_the_exact_posterior_mean(kind, compiled):
    x, y = regression_data()
    mean, cov = exact_posterior(x, y)
    sd = cov.diagonal().sqrt()
    model = MODELS[kind]()
    guide = AutoNormal(model)
    steps, lr = 2500, 0.05
    optim = pt.optim.scheduler(
        ExponentialLR, pt.optim.Adam(lr=lr), gamma=(1e-3 / lr) ** (1 / steps)
    )
    # One particle: vectorized particles add a batch dimension that nn.Linear cannot take.
    svi = SVI(model, guide, optim, Trace_ELBO(), compile=compiled, seed=0)
    with count_compiles() as stats:
        result = svi.run(steps, x, y, progress_bar=False)
    assert stats.graph_breaks == 0 and stats.graphs == int(compiled)
    fit = torch.cat(
        [result.params["auto.loc.lin.weight"].reshape(-1), result.params["auto.loc.lin.bias"]]
    )
    assert ((fit - mean).abs() / sd).max() < 0.1


# -- a Bayesian neural network with NUTS, compiled ------------------------------------------------
class BNN(pt.nn.Module):
    """1-16-1 tanh network, known noise."""

    def __init__(self):
        super().__init__()
        self.fc1 = pt.nn.BayesianLinear(1, 16)
        self.fc2 = pt.nn.BayesianLinear(16, 1, prior_scale=0.5)

    def forward(self, x, y=None):
        mean = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        pt.deterministic("mean", mean)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Normal(mean, 0.1), obs=y)


def bnn_data(n=40):
    x = torch.linspace(-2, 2, n).unsqueeze(-1)
    truth = torch.sin(1.5 * x).squeeze(-1)
    return x, truth, truth + 0.1 * torch.randn(n, generator=_gen(3))


@pytest.mark.slow
def test_bnn_with_compiled_nuts_has_no_graph_breaks_and_fits():
    x, truth, y = bnn_data()
    bnn = BNN()
    potential = Potential(bnn, (x, y), compile=True)
    z = torch.randn(2, potential.dim, generator=_gen(0))
    with count_compiles() as stats:
        potential.value_and_grad(z)
        value, grad = potential.value_and_grad(z + 0.1)
    assert (stats.graph_breaks, stats.graphs) == (0, 1)
    eager = Potential(bnn, (x, y), compile=False).value_and_grad(z + 0.1)
    torch.testing.assert_close(value, eager[0])
    torch.testing.assert_close(grad, eager[1])

    mcmc = MCMC(
        NUTS(bnn, max_tree_depth=6),
        num_warmup=300,
        num_samples=300,
        num_chains=2,
        progress_bar=False,
        seed=0,
    )
    with count_compiles() as stats:
        mcmc.run(x, y)
    assert stats.graph_breaks == 0
    fitted = mcmc.get_samples()["mean"].mean(0)
    assert float((fitted - truth).pow(2).mean().sqrt()) < 0.08  # noise sd 0.1; here ~0.03


# -- an amortized guide with a subsampled plate ---------------------------------------------------
def test_amortized_guide_with_subsampling_trains_compiled_without_graph_breaks():
    N, B = 200, 32
    g = _gen(5)
    z_true = torch.randn(N, 1, generator=g)
    data = torch.tanh(z_true @ torch.tensor([[1.0, -1.0, 0.5, 2.0]])) + 0.1 * torch.randn(
        N, 4, generator=g
    )
    decoder = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    encoder = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def model(data):
        dec = pt.module("decoder", decoder)
        with pt.plate("data", N, subsample_size=B) as idx:
            z = pt.sample("z", dist.Normal(0.0, 1.0).expand([1]).to_event(1))
            pt.sample("x", dist.Normal(dec(z), 0.1).to_event(1), obs=data[idx])

    def guide(data):
        enc = pt.module("encoder", encoder)
        with pt.plate("data", N, subsample_size=B) as idx:
            out = enc(data[idx])
            scale = torch.nn.functional.softplus(out[:, 1:]) + 1e-3
            pt.sample("z", dist.Normal(out[:, :1], scale).to_event(1))

    svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(), seed=0)
    with count_compiles() as stats:
        result = svi.run(400, data, progress_bar=False)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    losses = result.losses
    assert torch.isfinite(losses).all()
    assert float(losses[-50:].mean()) < 0.5 * float(losses[:50].mean())
    assert any(name.startswith("encoder$$$") for name in result.params)
    # The encoder is trained in place.
    torch.testing.assert_close(
        encoder.state_dict()["2.weight"], result.params["encoder$$$2.weight"], atol=0, rtol=0
    )


# -- a Bayesian head on a Transformer encoder ---------------------------------------------------
def sequence_data(n, g):
    """Sequences of 8 steps with 4 features; the class is whether feature 0 sums above 0."""
    x = torch.randn(n, 8, 4, generator=g)
    return x, (x[..., 0].sum(-1) > 0).long()


@pytest.mark.parametrize("api", ["BayesianLinear", "random_module"])
def test_bayesian_head_on_a_transformer_encoder_learns(api):
    """A frozen encoder: SVI cannot yet train one registered with pt.module, because
    MultiheadAttention reads ``out_proj.weight`` without calling ``out_proj`` (SVI finds the
    modules owning registered parameters by their forward calls)."""
    torch.manual_seed(0)
    embed = torch.nn.Linear(4, 16)
    layer = torch.nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    if api == "BayesianLinear":
        head = pt.nn.BayesianLinear(16, 2, name="head")
    else:
        head = pt.nn.random_module("head", torch.nn.Linear(16, 2), dist.Normal(0.0, 1.0))

    encoder.requires_grad_(False)  # frozen (see the docstring)

    def model(x, y=None):
        emb = pt.module("embed", embed)  # a trained point estimate
        features = encoder(emb(x)).mean(1)  # (n, 16)
        logits = head(features)  # Bayesian: sites head.weight, head.bias
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Categorical(logits=logits), obs=y)

    g = _gen(7)
    x, y = sequence_data(256, g)
    x_test, y_test = sequence_data(256, g)
    guide = AutoNormal(model)  # the head's sites are the only latents
    svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(), compile=False, seed=0)
    result = svi.run(300, x, y, progress_bar=False)
    assert float(result.losses[-20:].mean()) < 0.5 * float(result.losses[:20].mean())
    assert "auto.loc.head.weight" in result.params and "embed$$$weight" in result.params
    # parallel=False: a batch of parameter draws is not something nn.Linear can broadcast.
    pred = Predictive(
        model, guide=guide, params=result.params, num_samples=50, return_sites=["y"], parallel=False
    )(x_test)
    accuracy = float((pred["y"].float().mean(0).round() == y_test).float().mean())
    assert accuracy > 0.8


def test_svi_trains_a_transformer_encoder_registered_with_module():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        16, 2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
    embed = torch.nn.Linear(4, 16)
    head = pt.nn.BayesianLinear(16, 2, name="head")

    def model(x, y=None):
        features = pt.module("encoder", encoder)(pt.module("embed", embed)(x)).mean(1)
        logits = head(features)
        with pt.plate("data", x.shape[0]):
            pt.sample("y", dist.Categorical(logits=logits), obs=y)

    x, y = sequence_data(256, _gen(7))
    svi = SVI(model, AutoNormal(model), pt.optim.Adam(lr=0.01), Trace_ELBO(), compile=False)
    result = svi.run(300, x, y, progress_bar=False)
    assert float(result.losses[-20:].mean()) < 0.5 * float(result.losses[:20].mean())
    assert "encoder$$$layers.0.self_attn.out_proj.weight" in result.params


def test_a_param_attribute_is_a_constrained_param_that_svi_fits():
    from probtorch.distributions import constraints
    from probtorch.inference import SVI, Trace_ELBO

    class Noise(pt.nn.Module):
        def __init__(self):
            super().__init__(name="noise")
            self.scale = pt.nn.Param(torch.tensor(1.0), constraint=constraints.positive)

        def forward(self, y):
            with pt.plate("data", y.shape[0]):
                pt.sample("y", dist.Normal(0.0, self.scale), obs=y)

    noise = Noise()
    y = torch.tensor([0.5, -1.5, 2.0, -0.5])
    svi = SVI(noise, lambda y: None, pt.optim.Adam(lr=0.05), Trace_ELBO(), seed=0)
    svi.run(600, y, progress_bar=False)
    # maximum likelihood: the root mean square of y
    fitted = svi.get_params()["noise.scale"]
    torch.testing.assert_close(fitted, y.pow(2).mean().sqrt(), atol=1e-3, rtol=0)
    assert isinstance(Noise().__dict__["_pt_priors"]["scale"][0], pt.nn.Param)

    layer = pt.nn.Module[torch.nn.Linear](2, 1, name="layer")
    start = layer.bias.detach().clone()
    layer.bias = pt.nn.Param(constraint=constraints.real)  # from the parameter it replaces
    store = pt.ParamStore()
    with pt.param_scope(store):
        layer(torch.zeros(3, 2))
    torch.testing.assert_close(store["layer.bias"], start)
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    assert "layer.bias" not in layer.random_attributes()


def test_children_added_with_add_module_are_named_under_their_parent_as_pyros():
    """``add_module`` (``register_module``, a ``Module[nn.ModuleList]``'s ``append``) went
    around ``__setattr__``: the children's sites were named ``weight``, ``bias``, and two
    layers collided ("two sites are named 'weight'")."""

    class Net(pt.nn.Module):
        def __init__(self):
            super().__init__(name="bnn")
            for i in range(2):
                self.add_module(f"layer{i}", pt.nn.BayesianLinear(2, 2))
            self.register_module("head", pt.nn.BayesianLinear(2, 1))
            self.stack = pt.nn.Module[torch.nn.ModuleList]()
            self.stack.append(pt.nn.BayesianLinear(1, 1))

        def forward(self, x):
            hidden = self.layer1(torch.tanh(self.layer0(x)))
            return self.stack[0](self.head(hidden))

    tr = _trace(Net(), torch.ones(4, 2))
    names = [name for name, site in tr.items() if site.type == "sample"]
    assert names == [
        f"bnn.{layer}.{p}"
        for layer in ("layer0", "layer1", "head", "stack.0")
        for p in ("weight", "bias")
    ]


def test_a_prior_function_returning_a_tensor_is_a_deterministic_site_as_pyros():
    class Net(pt.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = pt.nn.Sample(dist.Normal(0.0, 1.0))
            self.b = pt.nn.Sample(lambda module: 2.0 * module.a)

        def forward(self):
            return self.b

    tr = _trace(Net())
    assert tr["b"].type == "deterministic"
    assert torch.equal(tr["b"].value, 2.0 * tr["a"].value)


def test_a_distribution_class_as_a_prior_is_refused_where_it_is_given():
    with pytest.raises(TypeError, match=r"Sample got the class Normal; give a distribution"):
        pt.nn.Sample(dist.Normal)


def test_pyro_method_reads_each_random_attribute_once_as_forward_does():
    """A BoTorch-style ``posterior()`` method reading a random attribute twice: each read
    outside forward was a site of its own ("two sites are named 'loc'")."""

    class Model(pt.nn.Module):
        def __init__(self):
            super().__init__(name="m")
            self.loc = pt.nn.Sample(dist.Normal(0.0, 1.0))

        def plain(self):
            return self.loc + self.loc

        @pt.nn.pyro_method
        def posterior(self):
            return self.loc + self.loc

    model = Model()
    with trace() as tr, seed(rng_seed=0):
        out = model.posterior()
    assert list(tr) == ["m.loc"] and torch.equal(out, 2 * tr["m.loc"].value)
    with pytest.raises(ValueError, match="two sites are named 'm.loc'"):
        _trace(model.plain)
    assert model.posterior.__name__ == "posterior"


def test_a_tensor_assigned_to_a_param_attribute_sets_its_value_as_pyros():
    """It silently replaced the learnable param by a constant (its site vanished)."""
    from torch.distributions import constraints

    net = pt.nn.Module[torch.nn.Linear](2, 1, name="net")
    net.bias = pt.nn.Param(torch.ones(1), constraint=constraints.positive)
    store = pt.ParamStore()
    with pt.param_scope(store):
        net(torch.zeros(3, 2))
        net.bias = torch.tensor([3.0])  # the store holds it: its value there
    assert float(store["net.bias"].detach()) == pytest.approx(3.0, rel=1e-12)  # via exp(log)
    net.bias = torch.tensor([4.0])  # the default store does not: the initial value
    fresh = pt.ParamStore()
    with pt.param_scope(fresh):
        tr = _trace(net, torch.zeros(3, 2))
    assert tr["net.bias"].type == "param"
    assert float(fresh["net.bias"].detach()) == pytest.approx(4.0, rel=1e-12)
    with pytest.raises(ValueError, match="net.bias"):  # outside its constraint
        with pt.param_scope(fresh):
            net.bias = torch.tensor([-1.0])
