"""SVI: exact posterior recovery, the compiled step (no graph breaks, no recompiles, the same
losses as eager), parameter ownership, continuation, interrupts and non-finite losses."""

import functools
import math
import warnings

import numpy as np
import pytest
import torch
from torch.optim.lr_scheduler import ExponentialLR

import probtorch as pt
import probtorch.distributions as dist
from probtorch.distributions import constraints
from probtorch.inference import SVI, Trace_ELBO, TraceGraph_ELBO, TraceMeanField_ELBO
from probtorch.inference.compile import count_compiles
from probtorch.inference.svi import NonFiniteLossError
from probtorch.validation import ObservationOutsideSupportError


@pytest.fixture(autouse=True)
def _float64():
    torch.set_default_dtype(torch.float64)


def normal_model(y):
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Normal(mu, 1.0), obs=y)


def normal_guide(y):
    loc = pt.param("loc", torch.tensor(0.0))
    scale = pt.param("scale", torch.tensor(1.0), constraint=constraints.positive)
    pt.sample("mu", dist.Normal(loc, scale))


def _data(n=20):
    return 1.5 + torch.randn(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def _posterior(y):
    precision = 1 / 10.0**2 + len(y)
    return float(y.sum() / precision), precision**-0.5


@pytest.mark.parametrize(
    "elbo",
    [Trace_ELBO(num_particles=8), TraceMeanField_ELBO(8)],
    ids=["Trace_ELBO", "TraceMeanField_ELBO"],
)
def test_conjugate_normal_recovers_the_exact_posterior(elbo):
    y = _data()
    mean, sd = _posterior(y)
    optim = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.05), gamma=0.01 ** (1 / 2500))
    svi = SVI(normal_model, normal_guide, optim, elbo, compile=False, seed=1)
    result = svi.run(2500, y, progress_bar=False)
    assert abs(float(result.params["loc"]) - mean) < 0.1 * sd
    assert abs(float(result.params["scale"]) / sd - 1) < 0.1
    assert result.losses.shape == (2500,)
    assert bool(torch.isfinite(result.losses).all())


# -- the compiled step ----------------------------------------------------------------------
def regression_model(x, y):
    w = pt.sample("w", dist.Normal(torch.zeros(3), 1.0).to_event(1))
    sigma = pt.sample("sigma", dist.HalfNormal(1.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Normal((x * w).sum(-1), sigma), obs=y)


def regression_guide(x, y):
    loc = pt.param("w_loc", torch.zeros(3))
    scale = pt.param("w_scale", torch.ones(3), constraint=constraints.positive)
    pt.sample("w", dist.Normal(loc, scale).to_event(1))
    s_loc = pt.param("s_loc", torch.tensor(0.0))
    pt.sample("sigma", dist.LogNormal(s_loc, 0.3))


def _regression_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3 * torch.randn(30, generator=g, dtype=torch.float64)
    return x, y


def test_compiled_step_has_no_graph_breaks_no_recompiles_and_eager_losses():
    x, y = _regression_data()

    def make(compile):
        optim = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.05), gamma=0.9)
        return SVI(
            regression_model,
            regression_guide,
            optim,
            Trace_ELBO(num_particles=2),
            compile=compile,
            seed=3,
            steps_per_call=2,
        )

    compiled, eager = make(True), make(False)
    with count_compiles() as first:
        r1 = compiled.run(5, x, y, progress_bar=False)  # 2 + 2 + 1 (masked) steps
    assert first.graph_breaks == 0
    assert first.graphs == 1
    # new data of the same shape and new learning rates: no recompilation
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        r2 = compiled.run(6, x, y + 0.1, progress_bar=False)
    assert later.graphs == 0 and later.graph_breaks == 0
    e1 = eager.run(5, x, y, progress_bar=False)
    e2 = eager.run(6, x, y + 0.1, progress_bar=False)
    torch.testing.assert_close(r1.losses, e1.losses, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(r2.losses, e2.losses, rtol=1e-10, atol=1e-10)
    for name in r2.params:
        torch.testing.assert_close(r2.params[name], e2.params[name], rtol=1e-10, atol=1e-10)
    assert not torch.equal(r1.params["w_loc"], r2.params["w_loc"])


def test_numpy_arrays_as_arguments_of_a_compiled_step_and_run():
    """NumPyro users pass numpy arrays: the compiled step and run take them (as tensors
    sharing their memory; Dynamo's own conversion failed on its guard under the step's
    gradient transform, "Guard failed on the same frame it was created") with eager's
    losses; eager steps pass the arrays to the model as they are."""
    from probtorch.inference.svi import _numpy_as_tensors

    x, y = (t.numpy() for t in _regression_data())
    read_only = y.copy()
    read_only.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns of a read-only array's tensor: copied
        (converted,), _ = _numpy_as_tensors((read_only,), {})
    assert np.array_equal(converted.numpy(), y)
    seen = []

    def model(x, y):
        seen.append(type(x))
        regression_model(torch.as_tensor(x), torch.as_tensor(y))

    def make(compile):
        optim = pt.optim.Adam(lr=0.05)
        return SVI(model, regression_guide, optim, Trace_ELBO(), compile=compile, seed=5)

    compiled, eager = make(True), make(False)
    with count_compiles() as stats:
        losses = [compiled.step(x, y), *compiled.run(3, x, y, progress_bar=False).losses]
    assert stats.graph_breaks == 0
    assert seen[-1] is torch.Tensor  # (set-up traces the model eagerly, with the arrays)
    expected = [eager.step(x, y), *eager.run(3, x, y, progress_bar=False).losses]
    assert seen[-1] is np.ndarray
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-10, atol=0)


def test_the_many_graphs_warning_tells_new_shapes_from_new_values():
    """Past _MANY_SHAPES compiled graphs SVI warns once: for new tensor shapes it advises
    padding; for new values of non-tensor arguments (a list of minibatch indices, which the
    compiled step holds as constants), passing them as tensors."""
    from probtorch.inference.svi import _many_graphs_note, _shape_key

    def keys(*calls):
        out = []
        for args in calls:
            leaves, spec = torch.utils._pytree.tree_flatten(args)
            out.append((spec, tuple(_shape_key(x) for x in leaves)))
        return out

    x = torch.zeros(4)
    values = _many_graphs_note(keys((x, [0, 1]), (x, [2, 3]), (x, [4, 5, 6]), (x, 0.5)))
    assert "different values of its non-tensor arguments" in values
    assert "minibatch indices as torch.tensor(idx)" in values
    shapes = _many_graphs_note(keys((torch.zeros(4), [0]), (torch.zeros(5), [0])))
    assert "different argument shapes" in shapes and "pad the data" in shapes


def test_compiled_step_is_cached_by_inductor():
    # The step is compiled with a decomposition table of probtorch's own; a table that does
    # not pickle made Inductor bypass its FX graph cache, so every process compiled again.
    from torch._dynamo.utils import counters
    from torch._inductor.codecache import FxGraphCachePickler

    from probtorch.inference.svi import _compile_options

    table = _compile_options()["backend"].keywords["decompositions"]
    key = FxGraphCachePickler(torch.fx.GraphModule({}, torch.fx.Graph())).dumps(table)
    assert isinstance(key, bytes) and len(key) < 1000  # the table's name, not its contents
    assert torch.ops.aten.mv.default not in table and len(table) > 100
    before = dict(counters["inductor"])
    svi = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), seed=4)
    svi.run(2, _data(), progress_bar=False)
    after = counters["inductor"]
    assert after["fxgraph_cache_bypass"] == before.get("fxgraph_cache_bypass", 0)
    looked_up = [after[k] - before.get(k, 0) for k in ("fxgraph_cache_hit", "fxgraph_cache_miss")]
    assert sum(looked_up) == 1


def mixture_model(x):
    mu = pt.sample("mu", dist.Normal(0.0, 1.0))
    with pt.plate("n", len(x)):
        z = pt.sample("z", dist.Bernoulli(0.3))
        pt.sample("x", dist.Normal(mu + 2 * z, 1.0), obs=x)


def test_compiled_tracegraph_with_module_and_discrete_draws_matches_eager():
    x = torch.linspace(-1.0, 3.0, 6)
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 1)
    initial = {k: v.detach().clone() for k, v in net.state_dict().items()}

    def guide(x):
        pt.module("net", net)
        logits = net(x.unsqueeze(-1))[..., 0]
        pt.sample("mu", dist.Normal(pt.param("m", torch.tensor(0.0)), 1.0))
        with pt.plate("n", len(x)):
            pt.sample(
                "z",
                dist.Bernoulli(logits=logits),
                infer={"baseline": {"use_decaying_avg_baseline": True}},
            )

    results = {}
    for compile in (False, True):
        net.load_state_dict(initial)
        svi = SVI(
            mixture_model,
            guide,
            pt.optim.Adam(lr=0.02),
            TraceGraph_ELBO(num_particles=3),
            compile=compile,
            seed=5,
            steps_per_call=1,
        )
        with count_compiles() as stats:
            results[compile] = svi.run(8, x, progress_bar=False)
        assert stats.graph_breaks == 0
        # the module's own parameters were trained in place
        assert not torch.equal(net.weight.detach(), initial["weight"])
        torch.testing.assert_close(net.weight.detach(), results[compile].params["net$$$weight"])
    torch.testing.assert_close(results[True].losses, results[False].losses, rtol=1e-10, atol=1e-10)


def annealed_model(y, annealing_factor=1.0):
    with pt.handlers.scale(scale=annealing_factor):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Normal(mu, 1.0), obs=y)


def annealed_guide(y, annealing_factor=1.0):
    with pt.handlers.scale(scale=annealing_factor):
        normal_guide(y)


def test_new_floats_and_batch_sizes_do_not_recompile_the_step_each_time():
    # A Python float argument was a constant of the compiled step: every new annealing
    # factor compiled it again, and the ninth failed on Dynamo's recompile limit.
    y = _data(20)

    def make(compile):
        return SVI(
            annealed_model,
            annealed_guide,
            pt.optim.Adam(lr=0.05),
            Trace_ELBO(),
            compile=compile,
            seed=2,
        )

    compiled, eager = make(True), make(False)
    with count_compiles() as stats:
        for k in range(10):
            factor = 0.1 + 0.09 * k
            loss = compiled.step(y, annealing_factor=factor)
            assert loss == pytest.approx(eager.step(y, annealing_factor=factor), rel=1e-12)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    # each batch size is a graph of its own, past Dynamo's recompile limit (here 1)
    with torch._dynamo.config.patch(recompile_limit=1), count_compiles() as stats:
        for n in (3, 5, 3, 7):
            loss = compiled.step(y[:n], annealing_factor=0.5)
            assert loss == pytest.approx(eager.step(y[:n], annealing_factor=0.5), rel=1e-12)
    assert stats.graph_breaks == 0 and stats.graphs == 3
    with count_compiles() as stats:
        for factor in (0.2, 0.7):  # run(): one in-place graph for any factor
            ran = compiled.run(3, y, annealing_factor=factor, progress_bar=False)
            expected = eager.run(3, y, annealing_factor=factor, progress_bar=False)
            torch.testing.assert_close(ran.losses, expected.losses, rtol=1e-12, atol=1e-12)
    assert stats.graphs == 1


def test_dropout_in_the_guide_with_a_last_smaller_batch():
    # a graph with symbolic sizes (Dynamo's answer to a new batch size) failed on dropout
    # under the step's gradient transform: "Cannot call numel() on tensor with symbolic
    # sizes"; each batch size now has a static graph
    torch.manual_seed(0)
    encoder = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.Dropout(0.2), torch.nn.Linear(4, 1)
    )

    def model(x):
        with pt.plate("n", x.shape[0]):
            pt.sample("z", dist.Normal(0.0, 1.0))

    def guide(x):
        pt.module("encoder", encoder)
        with pt.plate("n", x.shape[0]):
            pt.sample("z", dist.Normal(encoder(x).squeeze(-1), 1.0))

    x = torch.randn(17, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    initial = {k: v.clone() for k, v in encoder.state_dict().items()}
    losses = {}
    for compile in (True, False):
        encoder.load_state_dict(initial)
        svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(), compile=compile, seed=4)
        losses[compile] = [svi.step(batch) for batch in (x[:8], x[8:16], x[16:])]
    assert losses[True] == pytest.approx(losses[False], rel=1e-12)


def test_a_model_that_needs_its_float_as_a_number_still_compiles():
    # branching on a float, or math.sqrt of it, cannot take a tensor: the step keeps the
    # float as a number (compiled per value), without a warning
    def model(y, tau=1.0):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0 * (math.sqrt(tau) if tau > 0.5 else 1.0)))
        with pt.plate("n", len(y)):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)

    def guide(y, tau=1.0):
        normal_guide(y)

    y = _data(10)
    compiled, eager = (
        SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=c, seed=1)
        for c in (True, False)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tau in (0.3, 2.0):
            ran = compiled.run(3, y, tau=tau, progress_bar=False)
            expected = eager.run(3, y, tau=tau, progress_bar=False)
            torch.testing.assert_close(ran.losses, expected.losses, rtol=1e-12, atol=1e-12)


# -- parameters and state -------------------------------------------------------------------
def test_svi_objects_own_their_params_and_random_stream():
    y = _data(5)
    pt.param("loc", torch.tensor(7.0))  # the default store, outside inference
    a = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    b = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    ra = a.run(20, y, progress_bar=False)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's stream untouched
    assert float(b.get_params().get("loc", torch.tensor(0.0))) == 0.0  # b not initialized
    rb = b.run(20, y, progress_bar=False)
    torch.testing.assert_close(ra.losses, rb.losses)  # same seed, same stream
    assert float(pt.get_param_store()["loc"].detach()) == 7.0
    assert list(pt.get_param_store().keys()) == ["loc"]
    assert sorted(a.param_store.keys()) == ["loc", "scale"]
    torch.testing.assert_close(a.param_store["loc"], ra.params["loc"])


def test_the_default_store_points_a_pyro_user_to_the_fitted_params(tmp_path):
    # Pyro keeps one global store, so a porting user reads or saves fitted params there:
    # probtorch's default store gave a bare KeyError and saved nothing without a word
    pt.clear_param_store()
    svi = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    svi.run(3, _data(5), progress_bar=False)
    store = pt.get_param_store()
    with pytest.raises(KeyError, match=r"'scale' is not in the default store.*"
                       r"svi\.param_store\['scale'\]"):  # fmt: skip
        store["scale"]
    with pytest.raises(KeyError, match=r"^'unknown'$"):  # no SVI has it: the plain error
        store["unknown"]
    with pytest.warns(UserWarning, match=r"lacks \d+ param\(s\) an SVI fitted.*"
                      r"svi\.param_store\.save\(path\)"):  # fmt: skip
        store.save(tmp_path / "default.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the right store: no warning
        svi.param_store.save(tmp_path / "fitted.pt")
    loaded = pt.ParamStore()
    loaded.load(tmp_path / "fitted.pt")
    torch.testing.assert_close(loaded["scale"], svi.param_store["scale"])


def test_run_continues_and_restarts_from_init_params():
    y = _data(5)

    def make():
        return SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)

    whole = make().run(30, y, progress_bar=False)
    split = make()
    first = split.run(10, y, progress_bar=False)
    second = split.run(20, y, progress_bar=False)
    torch.testing.assert_close(torch.cat([first.losses, second.losses]), whole.losses)
    torch.testing.assert_close(second.params["loc"], whole.params["loc"])
    fresh = make()
    restarted = fresh.run(1, y, progress_bar=False, init_params=whole.params)
    assert abs(float(restarted.params["loc"]) - float(whole.params["loc"])) <= 0.1 + 1e-9
    with pytest.raises(ValueError, match="init_params has \\['nope'\\]"):
        fresh.run(1, y, progress_bar=False, init_params={"nope": torch.tensor(1.0)})


def test_edits_of_the_param_store_are_what_the_next_step_starts_from(tmp_path):
    # svi.param_store was a copy the steps wrote into: edits to it (and a module's
    # load_state_dict) were overwritten by the next step
    y = _data(5)
    net = torch.nn.Linear(1, 1)

    def guide(y):
        pt.module("net", net)
        scale = pt.param("scale", torch.tensor(1.0), constraint=constraints.positive)
        pt.sample("mu", dist.Normal(net(torch.ones(1))[0], scale))

    svi = SVI(normal_model, guide, pt.optim.SGD(lr=0.0), Trace_ELBO(), compile=False)
    svi.run(2, y, progress_bar=False)
    svi.param_store["scale"] = torch.tensor(0.25)
    net.load_state_dict({"weight": torch.tensor([[2.0]]), "bias": torch.tensor([0.5])})
    params = svi.run(1, y, progress_bar=False).params  # lr=0: the edited values stay
    assert float(params["scale"]) == pytest.approx(0.25, rel=1e-12)
    assert float(params["net$$$weight"]) == 2.0 and float(params["net$$$bias"]) == 0.5
    # save and load: a module's parameter is written in place, so the module sees it
    path = tmp_path / "params.pt"
    svi.param_store.save(path)
    svi.param_store["scale"] = torch.tensor(3.0)
    svi.param_store["net$$$bias"] = torch.tensor([-1.0])
    assert float(net.bias.detach()) == -1.0
    svi.param_store.load(path)
    assert float(net.bias.detach()) == 0.5
    assert svi.param_store.constraint("scale") is constraints.positive
    svi.step(y)
    assert float(svi.get_params()["scale"]) == pytest.approx(0.25, rel=1e-12)
    # an emptied store: the params are made again from their initial values
    svi.param_store.clear()
    svi.step(y)
    assert float(svi.get_params()["scale"]) == 1.0 and float(net.bias.detach()) == 0.5
    pt.param("x", torch.zeros(1))
    pt.clear_param_store()
    assert len(pt.get_param_store()) == 0 and len(svi.param_store) == 3


def test_a_store_loaded_before_the_first_step_reaches_the_module(tmp_path):
    # a loaded value stayed a tensor of the store that the module never read: the module
    # kept its own values and did not train
    y = _data(5)

    def make():
        net = torch.nn.Linear(1, 1)

        def guide(y):
            pt.module("net", net)
            pt.sample("mu", dist.Normal(net(torch.ones(1))[0], 0.5))

        return net, SVI(normal_model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)

    net, svi = make()
    svi.run(5, y, progress_bar=False)
    svi.param_store.save(tmp_path / "params.pt")
    resumed_net, resumed = make()
    resumed.param_store.load(tmp_path / "params.pt")
    resumed.step(y)
    assert resumed.param_store.unconstrained("net$$$weight") is resumed_net.weight
    assert not torch.equal(resumed_net.weight.detach(), net.weight.detach())  # trained on
    assert float((resumed_net.weight - net.weight).abs().detach()) < 0.2


def test_set_state_with_tensor_bounded_constraints_keeps_the_optimizer_state():
    y = _data(5)
    bound = constraints.interval(torch.zeros(1), torch.full((1,), 5.0))

    def guide(y):
        scale = pt.param("scale", torch.full((1,), 1.0), constraint=bound)
        pt.sample("mu", dist.Normal(pt.param("loc", torch.tensor(0.0)), scale[0]))

    import pickle

    svi = SVI(normal_model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    svi.run(3, y, progress_bar=False)
    state = pickle.loads(pickle.dumps(svi.param_store.get_state()))  # new constraint objects
    moments = [m.clone() for m in svi._opt_state]
    svi.param_store.set_state(state)
    svi._adopt_store_edits((y,), {})
    for kept, before in zip(svi._opt_state, moments):  # not set up again
        assert torch.equal(kept, before)


def test_buffers_reset_between_steps_and_a_module_switched_to_training():
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    norm = torch.nn.BatchNorm1d(2).eval()

    def model(x):
        pt.module("norm", norm)
        pt.sample("x", dist.Normal(norm(x), 1.0).to_event(2), obs=x)

    svi = SVI(model, lambda x: None, pt.optim.SGD(lr=0.01), Trace_ELBO(), compile=False)
    svi.step(x)  # in eval mode: no buffer is written
    norm.train()
    svi.step(x)
    svi.step(x)
    assert int(norm.num_batches_tracked) == 2
    norm.reset_running_stats()
    svi.step(x)
    assert int(norm.num_batches_tracked) == 1
    torch.testing.assert_close(norm.running_mean, 0.1 * x.mean(0))


def test_step_and_evaluate_loss():
    y = _data(5)
    svi = SVI(normal_model, normal_guide, pt.optim.SGD(lr=0.01), Trace_ELBO(), compile=False)
    params = svi.init(y)
    assert float(params["scale"]) == pytest.approx(1.0)
    loss = svi.evaluate_loss(y)
    assert svi.get_params() == params
    assert isinstance(loss, float)
    assert svi.evaluate_loss(y) == loss  # a copy of the random stream: the same draws
    other = SVI(normal_model, normal_guide, pt.optim.SGD(lr=0.01), Trace_ELBO(), compile=False)
    other.init(y)
    assert svi.step(y) == other.step(y)  # the steps are those without evaluate_loss
    assert float(svi.get_params()["loc"]) > 0  # moved toward the data (mean 1.5)
    assert float(svi.param_store["loc"].detach()) == float(svi.get_params()["loc"])


def test_module_guide_is_trained_in_place():
    y = _data(8)
    net = torch.nn.Linear(1, 2)

    def guide(y):
        pt.module("net", net)
        out = net(torch.ones(1))
        pt.sample("mu", dist.Normal(out[0], torch.nn.functional.softplus(out[1])))

    svi = SVI(normal_model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(4), compile=False)
    result = svi.run(400, y, progress_bar=False)
    mean, _ = _posterior(y)
    loc = float(net(torch.ones(1))[0].detach())
    assert abs(loc - mean) < 0.2
    torch.testing.assert_close(result.params["net$$$bias"], net.bias.detach())


def test_frozen_module_parameters_are_left_alone():
    # as in Pyro, pt.module registers only parameters with requires_grad=True
    y = _data(8)
    net = torch.nn.Linear(1, 2)
    net.bias.requires_grad_(False)
    frozen = net.bias.detach().clone()

    def guide(y):
        pt.module("net", net)
        out = net(torch.ones(1))
        pt.sample("mu", dist.Normal(out[0], torch.nn.functional.softplus(out[1])))

    svi = SVI(normal_model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    result = svi.run(20, y, progress_bar=False)
    assert sorted(result.params) == ["net$$$weight"]
    assert torch.equal(net.bias, frozen) and not net.bias.requires_grad
    with pytest.raises(
        TypeError,
        match="pt.module\\('net', ...\\) takes a torch.nn.Module instance, got the class Linear",
    ):
        pt.module("net", torch.nn.Linear)
    # frozen and unfrozen after set-up, as in Pyro: the fitted params change from the next
    # step (the weight kept training before)
    weight = net.weight.detach().clone()
    net.weight.requires_grad_(False)
    net.bias.requires_grad_(True)
    assert sorted(svi.run(5, y, progress_bar=False).params) == ["net$$$bias"]
    assert torch.equal(net.weight, weight)
    assert not torch.equal(net.bias.detach(), frozen)


def test_subsampled_run():
    y = _data(40)

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("n", len(y), subsample_size=10) as idx:
            pt.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    optim = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.05), gamma=0.01 ** (1 / 1500))
    svi = SVI(model, normal_guide, optim, TraceMeanField_ELBO(), compile=False)
    result = svi.run(1500, y, progress_bar=False)
    mean, sd = _posterior(y)
    assert abs(float(result.params["loc"]) - mean) < 0.5 * sd  # minibatch noise
    assert bool(torch.isfinite(result.losses).all())


def test_minibatches_given_by_a_data_loader():
    # plate(..., subsample=indices), as Pyro's: the log likelihood is scaled by
    # size / len(indices), and new indices of the same length do not recompile the step
    y = _data(40)

    def model(y, idx):
        mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        with pt.plate("n", len(y), subsample=idx):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y[idx])

    def guide(y, idx):
        normal_guide(y)

    idx = torch.tensor([3, 1, 4, 1, 5])
    tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace(y, idx)
    mu = tr["mu"].value
    expected = dist.Normal(mu, 1.0).log_prob(y[idx]).sum() * 40 / 5
    torch.testing.assert_close(tr["y"].fn.log_prob(tr["y"].value).sum() * tr["y"].scale, expected)
    batches = torch.randperm(40, generator=torch.Generator().manual_seed(0)).reshape(8, 5)
    compiled, eager = (
        SVI(model, guide, pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=c, seed=1)
        for c in (True, False)
    )
    with count_compiles() as stats:
        for batch in batches:
            assert compiled.step(y, batch) == pytest.approx(eager.step(y, batch), rel=1e-12)
    assert stats.graphs == 1 and stats.graph_breaks == 0
    with pytest.raises(ValueError, match="plate 'n': subsample must be a 1-d tensor of integer"):
        pt.plate("n", 40, subsample=torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"'n': subsample indices must lie in \[0, size=40\)"):
        pt.plate("n", 40, subsample=torch.tensor([0, 40]))
    with pytest.raises(ValueError, match="subsample_size=3 but subsample has 2 indices"):
        pt.plate("n", 40, subsample_size=3, subsample=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer indices \\(not a boolean mask\\)"):
        pt.plate("n", 3, subsample=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match="plate 'n': subsample has no indices"):
        pt.plate("n", 3, subsample=torch.tensor([], dtype=torch.long))


# -- interrupts and non-finite losses ------------------------------------------------------------
def _exploding(loc_limit):
    def model():
        z = pt.sample("z", dist.Normal(5.0, 1.0))
        nan, zero = torch.tensor(float("nan")), torch.tensor(0.0)
        pt.factor("cliff", torch.where(z > loc_limit, nan, zero))

    def guide():
        pt.sample("z", dist.Normal(pt.param("loc", torch.tensor(0.0)), 1e-3))

    return model, guide


def test_nonfinite_loss_stops_the_run_with_the_last_finite_params():
    model, guide = _exploding(1.0)
    # SGD: loc 0 -> 1.5 after one step, where the model's factor is NaN.
    svi = SVI(model, guide, pt.optim.SGD(lr=0.3), Trace_ELBO(), compile=False)
    with pytest.warns(
        RuntimeWarning,
        match=r"loss is not finite \(nan\) at step 1 .*kept from "
        r"step 0.*site 'cliff' of the model",
    ) as caught:
        result = svi.run(10, progress_bar=False)
    assert {w.filename for w in caught} == {__file__}  # the user's line, not probtorch's
    assert result.losses.shape == (1,)
    assert float(result.params["loc"]) == 0.0
    assert math.isfinite(svi.step())  # from loc=0 again
    with pytest.raises(NonFiniteLossError, match="at step 2 .*kept from step 1"):
        svi.step()
    assert float(svi.get_params()["loc"]) == 0.0  # where step 1 evaluated its loss


def _exponential_model(y):
    rate = pt.sample("rate", dist.Gamma(2.0, 2.0))
    with pt.plate("n", len(y)):
        pt.sample("y", dist.Exponential(rate), obs=y)


def _gamma_guide(y):
    shape = pt.param("shape", torch.tensor(2.0), constraint=constraints.positive)
    pt.sample("rate", dist.Gamma(shape, 2.0))


@pytest.mark.parametrize("compiled", [True, False])
def test_each_call_checks_its_data_not_only_the_first(compiled):
    # SVI.init checks the first call's data eagerly; the steps run with validation off
    # (compiled), so later data were not checked: Exponential's log density is finite at -1,
    # and a minibatch of negative values gave a finite loss and moved the params.
    svi = SVI(
        _exponential_model,
        _gamma_guide,
        pt.optim.Adam(lr=0.05),
        Trace_ELBO(),
        compile=compiled,
        seed=0,
    )
    good, bad = torch.ones(4), torch.tensor([1.0, -1.0, 2.0, -3.0])
    with count_compiles() as stats:
        svi.step(good)
    assert stats.graph_breaks == 0 and stats.graphs == int(compiled)  # the check compiles
    before = svi.get_params()["shape"]
    with pytest.raises(
        ObservationOutsideSupportError,
        match=r"at step 1 .*site 'y'.*support GreaterThanEq\(lower_bound=0.0\) "
        r"of Exponential.*invalid values \[-1.0, -3.0\].*not applied",
    ):
        svi.step(bad)
    assert torch.equal(svi.get_params()["shape"], before)
    with pytest.raises(ObservationOutsideSupportError, match="evaluate_loss: .*site 'y'"):
        svi.evaluate_loss(bad)
    with pytest.raises(ObservationOutsideSupportError, match="at step 1 .*site 'y'"):
        svi.run(5, bad, progress_bar=False)  # its first step: nothing of the run is lost
    assert torch.equal(svi.get_params()["shape"], before)
    assert math.isfinite(svi.step(good))  # the step after the refused one: step 1 again
    assert svi.run(3, good, progress_bar=False).losses.shape == (3,)


def test_data_leaving_a_support_that_the_params_move_stops_the_run_keeping_its_losses():
    # y ~ Uniform(0, b): the likelihood -N log b pulls b below max(y) = 0.9, where y is outside
    # the support (torch's Uniform gives -inf there; Pyro's validation raises)
    y = torch.tensor([0.5, 0.9])

    def model(y):
        b = pt.param("b", torch.tensor(1.5), constraint=constraints.positive)
        with pt.plate("n", 2):
            pt.sample("y", dist.Uniform(0.0, b), obs=y)

    def guide(y):
        pass

    svi = SVI(model, guide, pt.optim.SGD(lr=0.1), Trace_ELBO(), compile=False)
    with pytest.warns(
        RuntimeWarning,
        match=r"at step (\d+) .*site 'y'.*Interval\(lower_bound="
        r"0.0, upper_bound=0.8.*invalid values \[0.9\].*kept "
        r"from step",
    ):
        result = svi.run(50, y, progress_bar=False)
    steps = len(result.losses)
    assert 0 < steps < 50 and torch.isfinite(result.losses).all()
    b = float(result.params["b"])  # kept from the last step whose data lay in the support
    # SGD on log b, whose gradient is N = 2: the next step, b * exp(-0.2), crossed 0.9
    assert 0.9 < b and b * math.exp(-0.2) < 0.9


def test_keyboard_interrupt_returns_the_result_so_far():
    calls = []

    def guide(y):
        calls.append(1)
        if len(calls) == 13:  # 2 runs in init, 10 steps, then Ctrl-C
            raise KeyboardInterrupt
        normal_guide(y)

    svi = SVI(normal_model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    with pytest.warns(RuntimeWarning, match="interrupted after 10 of 50 steps"):
        result = svi.run(50, _data(5), progress_bar=False)
    assert result.losses.shape == (10,)
    assert set(result.params) == {"loc", "scale"}


def test_errors_name_the_site_at_init():
    def guide(y):
        pt.sample("mu", dist.Bernoulli(0.5))

    svi = SVI(normal_model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    with pytest.raises(ValueError, match="site 'mu'"):
        svi.run(3, _data(5), progress_bar=False)


def test_progress_bar(capsys):
    svi = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    svi.run(7, _data(5))
    err = capsys.readouterr().err
    assert "loss=" in err and "7/7" in err  # the steps fed between refreshes are all shown
    assert "compiling" not in err


def test_progress_bar_says_when_the_step_compiles(capsys):
    """The first block compiles the step (seconds): the bar says so until it has run; a
    second run of the same SVI object compiles nothing and says nothing of it."""
    svi = SVI(normal_model, normal_guide, pt.optim.Adam(lr=0.1), Trace_ELBO())
    svi.run(7, _data(5))
    err = capsys.readouterr().err
    assert "SVI (compiling)" in err
    assert err.rstrip().split("\r")[-1].startswith("SVI: 100%")  # the final state, reset
    svi.run(7, _data(5))
    err = capsys.readouterr().err
    assert "7/7" in err and "compiling" not in err


def test_bar_feed_refreshes_with_the_mean_loss_since_the_last_refresh():
    from probtorch.inference.svi import _BarFeed

    class Bar:
        n, postfix = 0, None

        def update(self, k):
            self.n += k

        def set_postfix_str(self, text, refresh):
            self.postfix = text

    bar = Bar()
    feed = _BarFeed(bar, interval=math.inf)
    feed.add([1.0])  # the first call refreshes (nothing shown yet)
    assert (bar.n, bar.postfix) == (1, "loss=1")
    feed.add([2.0, 4.0])
    feed.add([6.0])
    assert bar.n == 1  # held back until the interval has passed
    feed.flush()
    assert (bar.n, bar.postfix) == (4, "loss=4")
    feed.flush()  # nothing new: unchanged
    assert (bar.n, bar.postfix) == (4, "loss=4")


def test_autonormal_guide():
    autoguide = pytest.importorskip("probtorch.inference.autoguide")
    y = _data()
    guide = autoguide.AutoNormal(normal_model)
    optim = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.05), gamma=0.01 ** (1 / 2000))
    svi = SVI(normal_model, guide, optim, Trace_ELBO(4), compile=False)
    result = svi.run(2000, y, progress_bar=False)
    mean, sd = _posterior(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        locs = [v for k, v in result.params.items() if "loc" in k]
    assert len(locs) == 1
    assert abs(float(locs[0]) - mean) < 0.15 * sd


def test_a_model_whose_sites_change_after_the_first_step_is_refused_by_name():
    # a loop over the data's length, called with longer data: the ELBO's plan of the sites
    # is fixed on the first call, and the loss silently left the new observation out
    def looped(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        for t in range(len(y)):
            pt.sample(f"y{t}", dist.Normal(mu, 1.0), obs=y[t])

    def point(y):
        pt.sample("mu", dist.Delta(pt.param("loc", torch.tensor(0.0))))

    for compile in (False, True):
        svi = SVI(looped, point, pt.optim.SGD(lr=0.0), Trace_ELBO(), compile=compile)
        # (five observations and the prior, each -log N(0 | 0, 1))
        assert svi.step(torch.zeros(5)) == pytest.approx(6 * 0.5 * math.log(2 * math.pi))
        with pytest.raises(ValueError, match=r"model ran other sample sites.*new: \['y5'\]"):
            svi.step(torch.zeros(6))
        with pytest.raises(ValueError, match=r"missing: \['y4'\].*new SVI"):
            svi.step(torch.zeros(4))


def test_a_prior_built_with_validation_on_is_compiled_and_keeps_its_setting():
    """A distribution built once outside the model (Pyro's ``PyroSample(prior)``) keeps
    torch's ``validate_args=True``; its check of values branched on data, so SVI and NUTS
    ran eagerly. Inference now evaluates it without the check, and leaves it as it was."""
    from probtorch.inference import MCMC, NUTS
    from probtorch.inference.autoguide import AutoNormal

    prior = dist.Normal(0.0, 1.0, validate_args=True).expand([3]).to_event(1)
    mixture = torch.distributions.MixtureSameFamily(  # its parts validate on their own
        torch.distributions.Categorical(torch.tensor([0.3, 0.7]), validate_args=True),
        torch.distributions.Normal(torch.tensor([-1.0, 1.0]), 0.5, validate_args=True),
        validate_args=True,
    )
    x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = x @ torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64) + 0.1

    def model(x, y):
        w = pt.sample("w", prior)
        shift = pt.sample("shift", mixture)
        with pt.plate("n", x.shape[0]):
            pt.sample("y", dist.Normal(x @ w + shift, 0.5), obs=y)

    def fit(compile):
        svi = SVI(model, AutoNormal(model), pt.optim.Adam(lr=0.05), Trace_ELBO(), seed=1,
                  compile=compile)  # fmt: skip
        return svi.run(5, x, y, progress_bar=False).losses

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with count_compiles() as stats:
            compiled = fit(True)
        assert stats.graph_breaks == 0 and stats.graphs == 1
        mcmc = MCMC(NUTS(model), num_warmup=20, num_samples=10, seed=0, progress_bar=False)
        mcmc.run(x, y)
    assert not [w for w in caught if "eagerly" in str(w.message)]
    torch.testing.assert_close(compiled, fit(False), rtol=1e-10, atol=1e-10)
    assert prior._validate_args and prior.base_dist._validate_args
    assert mixture._validate_args and mixture.component_distribution._validate_args
    with pytest.raises(ValueError, match="support"):  # still checked outside inference
        prior.log_prob(torch.tensor([0.0, float("nan"), 0.0]))


def _rows_model(y, idx):
    """A data loader's minibatch ``idx``: each z_i is pinned near y_i."""
    with pt.plate("data", 8, subsample=idx) as rows:
        z = pt.sample("z", dist.Normal(0.0, 10.0))
        pt.sample("y", dist.Normal(z, 0.1), obs=y[rows])


def _rows_guide(y, idx, own=False):
    """``own``: the guide draws its own subsample instead of taking the model's."""
    loc = pt.param("loc", torch.zeros(8))
    plate = (
        pt.plate("data", 8, subsample_size=len(idx)) if own else pt.plate("data", 8, subsample=idx)
    )
    with plate as rows:
        pt.sample("z", dist.Normal(loc[rows], 0.05))


def test_a_guide_that_draws_other_rows_than_the_models_given_subsample_is_refused():
    from probtorch.inference import Predictive

    y, idx = torch.arange(8.0), torch.tensor([5, 2, 7])
    own = functools.partial(_rows_guide, own=True)
    refusal = r"plate 'data': the model gives it subsample indices of shape \(3,\) \(\[5, 2, 7\]\)"
    with pytest.raises(ValueError, match=refusal + r".*subsample=idx\) in the guide's plate"):
        SVI(_rows_model, own, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False).step(y, idx)
    with pytest.raises(ValueError, match=refusal):
        Predictive(_rows_model, guide=own, num_samples=2)(y, idx, seed=0)
    # the same indices in the guide: each row's loc meets its own datum
    svi = SVI(_rows_model, _rows_guide, pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=False)
    batches = torch.Generator().manual_seed(0)
    for _ in range(300):
        svi.step(y, torch.randperm(8, generator=batches)[:3])
    torch.testing.assert_close(svi.get_params()["loc"], y, atol=0.5, rtol=0)


_OFFSETS = torch.tensor([-3.0, -1.0, 0.0, 0.5, 2.0, 4.0])


def _offset_rows(loop):
    """Rows alike but for a known offset: row i's z_i - offset_i has one posterior."""
    mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    if loop:
        for i in pt.plate("data", 6, subsample_size=2):
            z = pt.sample(f"z_{i}", dist.Normal(mu + _OFFSETS[i], 1.0))
            pt.sample(f"y_{i}", dist.Normal(z, 0.5), obs=1.5 + _OFFSETS[i])
    else:
        with pt.plate("data", 6):
            z = pt.sample("z", dist.Normal(mu + _OFFSETS, 1.0))
            pt.sample("y", dist.Normal(z, 0.5), obs=1.5 + _OFFSETS)


def _offset_rows_map(loop, per_row_params=False):
    pt.sample("mu", dist.Delta(pt.param("m", torch.tensor(0.0))))
    locs = pt.param("locs", torch.zeros(6))
    if loop:
        for i in pt.plate("data", 6, subsample_size=2):
            loc = pt.param(f"loc_{i}", torch.tensor(0.0)) if per_row_params else locs[i]
            pt.sample(f"z_{i}", dist.Delta(loc))
    else:
        with pt.plate("data", 6):
            pt.sample("z", dist.Delta(locs))


def test_a_loop_over_a_subsampled_plates_rows_fits_with_eager_steps():
    """Its sites (z_i, y_i of the rows drawn) change every step: eager steps plan each
    step's sites anew. With point masses the loss has no Monte Carlo noise, and at the MAP
    every subsample's gradient vanishes (each row's own terms do, and the rows' terms in
    mu are alike, scaled by 6 / 2), so SGD converges to the full data's MAP without noise:
    the vectorized fit's params to float precision. A missing scale would move mu by 0.006."""

    def svi(guide=_offset_rows_map, compile=False):
        optim = pt.optim.SGD(lr=0.05)
        return SVI(_offset_rows, guide, optim, Trace_ELBO(), compile=compile, seed=1)

    fits = {loop: svi().run(100, loop, progress_bar=False).params for loop in (True, False)}
    for name in ("m", "locs"):
        torch.testing.assert_close(fits[True][name], fits[False][name], atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match=r"plate 'data' in a loop .* SVI\(\.\.\., compile=False\)"):
        compiled = svi(compile=True)
        for _ in range(20):  # (refused on the first step whose rows are not the plan's)
            compiled.step(True)
    per_row = functools.partial(_offset_rows_map, per_row_params=True)
    with pytest.raises(ValueError, match=r"param 'loc_\d'.*subsampled plate 'data'.*index it"):
        svi(per_row).run(5, True, progress_bar=False)


def test_a_model_that_draws_its_own_subsample_takes_the_guides_given_rows():
    """The guide's ``plate(..., subsample=idx)`` is recorded (flagged
    ``extra["indices_given"]``) and replayed into the model, whose plate draws its own
    subsample otherwise, as in Pyro (before: the model drew other rows, silently)."""
    from probtorch.inference import Predictive

    y, idx = torch.arange(8.0), torch.tensor([5, 2, 7])
    seen = {}

    def model(y, idx):
        with pt.plate("data", 8, subsample_size=3) as rows:
            seen["model"] = rows.tolist()
            z = pt.sample("z", dist.Normal(0.0, 10.0))
            pt.sample("y", dist.Normal(z, 0.1), obs=y[rows])

    def given_model(y, idx):  # the same model, given the guide's indices
        with pt.plate("data", 8, subsample=idx) as rows:
            z = pt.sample("z", dist.Normal(0.0, 10.0))
            pt.sample("y", dist.Normal(z, 0.1), obs=y[rows])

    def guide(y, idx):
        loc = pt.param("loc", torch.zeros(8))
        pt.plate("data", 8, subsample=idx.clone())  # built twice with the same indices
        with pt.plate("data", 8, subsample=idx) as rows:
            pt.sample("z", dist.Normal(loc[rows], 0.05))

    pt.get_param_store().clear()
    guide_trace = pt.handlers.trace(pt.handlers.seed(guide, rng_seed=0)).get_trace(y, idx)
    assert guide_trace["data"].extra["indices_given"]
    model_trace = pt.handlers.trace(pt.handlers.replay(model, trace=guide_trace)).get_trace(y, idx)
    assert model_trace["data"].value.tolist() == [5, 2, 7] == seen["model"]
    for seed in range(3):
        with pt.handlers.seed(rng_seed=seed):
            loss = Trace_ELBO().loss(model, guide, y, idx)
        assert seen["model"] == [5, 2, 7]
        with pt.handlers.seed(rng_seed=seed):
            assert loss == Trace_ELBO().loss(given_model, guide, y, idx)
    svi = SVI(model, guide, pt.optim.Adam(lr=0.1), Trace_ELBO())
    svi.step(y, idx)
    assert seen["model"] == [5, 2, 7]
    out = Predictive(model, guide=guide, num_samples=2, return_sites=["y"])(y, idx, seed=0)
    assert out["y"].shape == (2, 3) and seen["model"] == [5, 2, 7]
    # other indices given to the model than to the guide are refused, as a guide's own draw
    with pytest.raises(ValueError, match=r"plate 'data': the model gives it subsample"):
        with pt.handlers.seed(rng_seed=0):
            Trace_ELBO().loss(lambda y, idx: given_model(y, idx.flip(0)), guide, y, idx)


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_data_of_another_shape_at_a_later_step_is_an_error_naming_the_site(compile):
    """The first call's checks see the first data only: a later step or run with an
    observation of another shape failed with torch's bare ``size of tensor a (7) must match
    the size of tensor b (5)`` (eager) or Dynamo's fake-tensor error (compiled), naming no
    site (Pyro: "Error while computing log_prob at site 'y'"). The params are kept."""

    def model(y):
        w = pt.sample("w", dist.Normal(torch.zeros(5), 1.0).to_event(1))
        pt.sample("y", dist.Normal(w, 1.0).to_event(1), obs=y)

    from probtorch.inference.autoguide import AutoNormal

    svi = SVI(model, AutoNormal(model), pt.optim.Adam(lr=0.1), Trace_ELBO(), compile=compile)
    svi.step(torch.randn(5))
    before = svi.get_params()
    named = (
        r"computing the log density of site 'y' \(observed; Independent with batch_shape "
        r"\(\), event_shape \(5,\); value of shape \(7,\); plates \[\]\) failed"
    )
    with pytest.raises(ValueError, match=named):
        svi.step(torch.randn(7))
    with pytest.raises(ValueError, match=named):
        svi.run(3, torch.randn(7), progress_bar=False)
    for name, value in svi.get_params().items():
        assert torch.equal(value, before[name]), name
    svi.step(torch.randn(5))  # the first shape still steps


def test_run_continues_from_its_params_with_simplex_and_cholesky_params():
    """``svi.run(..., init_params=result.params)`` for params whose constrained shape is
    not their unconstrained one (AutoDelta on a Dirichlet site, a lower-Cholesky param):
    it was refused, comparing (3,) with the unconstrained (2,)."""
    from probtorch.inference.autoguide import AutoDelta

    y = torch.tensor([0, 1, 2, 2, 1, 0, 2, 2])

    def model(y):
        w = pt.sample("w", dist.Dirichlet(torch.ones(3)))
        pt.param("L", torch.eye(2), constraint=constraints.lower_cholesky)
        with pt.plate("n", len(y)):
            pt.sample("y", dist.Categorical(w), obs=y)

    svi = SVI(model, AutoDelta(model), pt.optim.Adam(lr=0.05), Trace_ELBO(), compile=False)
    first = svi.run(10, y, progress_bar=False)
    again = svi.run(0, y, progress_bar=False, init_params=first.params)
    for name, value in first.params.items():
        torch.testing.assert_close(again.params[name], value)
    with pytest.raises(ValueError, match=r"init_params\['L'\] has shape \(3,\), but the param "):
        svi.run(1, y, progress_bar=False, init_params={"L": torch.ones(3)})


def test_numpyro_style_run_calls_are_explained():
    """NumPyro's ``svi.run(rng_key, num_steps, *args)``: an integer key ran 0 steps and
    called the model with (num_steps, *args) ('takes 1 positional argument but 2 were
    given'), an array key failed in int(); both now point to SVI(seed=).
    ``get_params(svi_state)`` takes NumPyro's state argument."""
    y = torch.randn(10, generator=torch.Generator().manual_seed(0))

    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("n", 10):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)

    def guide(y):
        pt.sample("mu", dist.Normal(pt.param("loc", torch.tensor(0.0)), 1.0))

    svi = SVI(model, guide, pt.optim.Adam(lr=0.01), Trace_ELBO(), compile=False)
    with pytest.raises(TypeError, match=r"looks like NumPyro's rng key.*SVI\(seed=\)"):
        svi.run(0, 100, y, progress_bar=False)
    with pytest.raises(TypeError, match=r"num_steps must be an integer, got ndarray.*seed="):
        svi.run(np.array([0, 1], dtype=np.uint32), 100, y, progress_bar=False)
    with pytest.raises(TypeError, match=r"looks like NumPyro's rng key: probtorch's SVI.init"):
        svi.init(0, y)
    result = svi.run(torch.tensor(3), y, progress_bar=False)
    assert result.losses.shape == (3,)
    assert svi.get_params(object()).keys() == result.params.keys()
