"""Tests of the effect handlers and the runtime they sit on.

Every handler is used both as ``handler(model, ...)`` and as ``with handler(...):``. Log
densities are checked against scipy.stats.
"""

import numpy as np
import pytest
import torch
from scipy import stats

import probtorch as pt
import probtorch.distributions as dist
from probtorch.handlers import (
    Trace,
    block,
    condition,
    do,
    mask,
    reparam,
    replay,
    scale,
    seed,
    substitute,
    trace,
)
from probtorch.reparam import LocScaleReparam
from probtorch.runtime import Message, Messenger, apply_stack, get_stack


@pytest.fixture(autouse=True)
def f64():
    torch.set_default_dtype(torch.float64)  # conftest restores the default dtype
    yield
    assert get_stack() == []  # every test leaves the handler stack empty


def two_sites():
    x = pt.sample("x", dist.Normal(0.0, 1.0))
    y = pt.sample("y", dist.Normal(x, 1.0))
    return x, y


# -- runtime --------------------------------------------------------------------------


class _Log(Messenger):
    def __init__(self, tag, log, stop=False):
        super().__init__()
        self.tag, self.log, self.stop = tag, log, stop

    def process_message(self, msg):
        self.log.append(("process", self.tag))
        msg.stop = self.stop

    def postprocess_message(self, msg):
        self.log.append(("post", self.tag))


def test_apply_stack_order_and_stop():
    log = []
    with _Log("outer", log), _Log("middle", log, stop=True), _Log("inner", log):
        msg = apply_stack(Message("sample", "s", value=torch.tensor(1.0)))
    # down innermost first; stopped at "middle"; back up from the outermost that saw it
    assert log == [
        ("process", "inner"),
        ("process", "middle"),
        ("post", "middle"),
        ("post", "inner"),
    ]
    assert msg.done
    log.clear()
    with _Log("outer", log), _Log("inner", log):
        apply_stack(Message("sample", "s", value=torch.tensor(1.0)))
    assert log == [("process", "inner"), ("process", "outer"), ("post", "outer"), ("post", "inner")]


def test_apply_stack_runs_default_only_without_value():
    calls = []

    def default(msg):
        calls.append(msg.name)
        return torch.tensor(3.0)

    assert float(apply_stack(Message("x", "a", default=default)).value) == 3.0
    given = Message("x", "b", value=torch.tensor(1.0), default=default)
    assert float(apply_stack(given).value) == 1.0
    assert calls == ["a"]


def test_messenger_forms_and_errors():
    log = []
    decorated = _Log("d", log)(lambda: pt.sample("s", dist.Normal(0.0, 1.0), obs=0.0))
    assert isinstance(decorated, _Log)
    decorated()
    assert log == [("process", "d"), ("post", "d")]
    with pytest.raises(TypeError, match="trace expected a callable model"):
        trace(3)
    with pytest.raises(TypeError, match="has no function to call"):
        trace()(1, 2)


def test_one_handler_decorating_two_models_runs_each():
    """As in Pyro, ``handler(fn)`` gives a new callable that shares the handler: it set
    ``handler.fn`` and returned the handler, so a second ``handler(m2)`` ran m1 (given m2
    as its argument)."""

    def m1():
        pt.sample("a", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
        return "model1"

    def m2():
        pt.sample("b", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
        return "model2"

    h = scale(scale=2.0)
    f1, f2 = h(m1), h(m2)
    assert f1() == "model1" and f2() == "model2" and f1() == "model1"
    assert isinstance(f2, scale) and f2.fn is m2 and h.fn is None
    tr = trace(f2).get_trace()
    assert list(tr) == ["b"] and tr["b"].scale == 2.0
    with pytest.raises(TypeError, match="has no function to call"):
        h()

    # the callables share the handler: the tracer records the run of either
    tracer = trace()
    g1, g2 = tracer(m1), tracer(m2)
    g1()
    assert list(tracer.trace) == ["a"] and g1.trace is tracer.trace
    assert list(g2.get_trace()) == ["b"] and list(tracer.trace) == ["b"]
    assert g1.trace is tracer.trace

    @seed(rng_seed=0)
    def drawn():
        return pt.sample("x", dist.Normal(0.0, 1.0))

    assert torch.equal(drawn(), seed(lambda: pt.sample("x", dist.Normal(0.0, 1.0)), 0)())


@pytest.mark.parametrize(
    "make",
    [
        lambda: scale(scale=2.0),
        lambda: seed(rng_seed=0),
        lambda: trace(),
        lambda: block(),
        lambda: mask(mask=True),
    ],
    ids=["scale", "seed", "trace", "block", "mask"],
)
def test_a_handler_entered_again_while_active_is_refused(make):
    """As Pyro's ``Messenger.__enter__``: re-entering an active handler raised nothing and
    applied it twice (``with s: with s:`` of ``scale(scale=2.)`` gave scale 4). Entering it
    again after it exits, two models it wraps run one after the other, and two instances
    nested stay fine."""
    h = make()
    name = type(h).__name__
    state = torch.random.get_rng_state()
    with pytest.raises(ValueError, match=rf"the {name} handler is entered again"):
        with h:
            with h:
                pass
    assert get_stack() == [] and torch.equal(torch.random.get_rng_state(), state)
    with h:  # used again after it exited
        pt.sample("a", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
    f1 = h(lambda: pt.sample("a", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0)))
    f2 = h(lambda: f1())  # a model wrapped by h calls another wrapped by h
    f1()
    f1()
    with pytest.raises(ValueError, match=rf"the {name} handler is entered again"):
        f2()
    assert get_stack() == []
    with make(), make():  # two instances nested
        pt.sample("a", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
    s = scale(scale=2.0)
    with trace() as tr, s, scale(scale=3.0):
        pt.sample("a", dist.Normal(0.0, 1.0), obs=torch.tensor(0.0))
    assert tr["a"].scale == 6.0


class _double(Messenger):
    """A user's own handler: doubles every sample site's value."""

    def postprocess_message(self, msg):
        if msg.type == "sample":
            msg.value = 2 * msg.value


def test_a_users_messenger_entered_again_while_active_is_refused():
    """``Messenger`` refuses re-entry for every subclass, as Pyro's ``Messenger.__enter__``
    does: a user's handler entered again while active ran twice (3 doubled to 12), and the
    inner block's exit took it off the stack for the rest of the outer one."""

    def observe():
        return pt.sample("x", dist.Normal(0.0, 1.0), obs=torch.tensor(3.0))

    d = _double()
    refused = r"the _double handler is entered again while it is active .*Build a second _double"
    with pytest.raises(ValueError, match=refused + r"\(\.\.\.\) for the inner block"):
        with d:
            with d:
                pass
    assert get_stack() == []
    with d:  # used again after it exited
        assert float(observe()) == 6.0
        assert float(observe()) == 6.0
    wrapped = d(observe)
    assert float(wrapped()) == 6.0 and float(wrapped()) == 6.0  # one run after the other
    with pytest.raises(ValueError, match="the _double handler is entered again"):
        d(lambda: wrapped())()  # a model wrapped by d calls another wrapped by d
    assert get_stack() == []
    with _double(), _double():  # two instances: each applies once
        assert float(observe()) == 12.0


def test_messenger_exit_cleans_stack_after_exception():
    def model():
        with pt.plate("p", 3):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        trace(seed(model, rng_seed=0))()
    assert get_stack() == []


def test_message_dict_access_and_copy():
    msg = Message("sample", "x", value=torch.tensor(1.0), infer={"a": 1})
    assert msg["name"] == "x" and msg.get("nonexistent", 5) == 5
    msg["is_observed"] = True
    copy = msg.copy()
    copy.infer["a"] = 2
    copy.extra["k"] = 1
    assert msg.infer["a"] == 1 and "k" not in msg.extra
    assert copy.is_observed and copy.value is msg.value
    assert "Message(type='sample', name='x'" in repr(msg)


# -- trace ----------------------------------------------------------------------------

Y = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, -0.3]])
MASK = torch.tensor([[True, False, True], [False, True, True]])


def plated_model(y):
    mu = pt.sample("mu", dist.Normal(0.0, 2.0))
    sigma = pt.sample("sigma", dist.HalfNormal(1.0))
    with pt.plate("rows", 2, dim=-2):
        with pt.plate("cols", 3):
            z = pt.sample("z", dist.Normal(mu, 1.0))  # latent, broadcast to (2, 3)
            with mask(mask=MASK), scale(scale=3.0):
                pt.sample("y", dist.Normal(z, sigma), obs=y)
    pt.factor("prior_penalty", -0.5 * mu**2)
    return z


def test_trace_log_densities_broadcast_mask_scale():
    tracer = trace(seed(plated_model, rng_seed=0))
    z = tracer(Y)
    tr = tracer.trace
    assert isinstance(tr, Trace)
    assert list(tr) == ["mu", "sigma", "rows", "cols", "z", "y", "prior_penalty"]
    mu, sigma = float(tr["mu"].value), float(tr["sigma"].value)
    lp = tr.log_densities()
    assert lp["mu"].shape == () and lp["z"].shape == (2, 3) and lp["y"].shape == (2, 3)
    assert lp["mu"].item() == pytest.approx(stats.norm(0, 2).logpdf(mu), abs=1e-12)
    assert lp["sigma"].item() == pytest.approx(stats.halfnorm(0, 1).logpdf(sigma), abs=1e-12)
    np.testing.assert_allclose(lp["z"].numpy(), stats.norm(mu, 1).logpdf(z.numpy()), rtol=1e-12)
    y_ref = stats.norm(z.numpy(), sigma).logpdf(Y.numpy())
    expected_y = np.where(MASK.numpy(), 3.0 * y_ref, 0.0)
    np.testing.assert_allclose(lp["y"].numpy(), expected_y, rtol=1e-12)
    assert tr["y"].scale == 3.0 and torch.equal(tr["y"].mask, MASK)
    assert lp["prior_penalty"].item() == pytest.approx(-0.5 * mu**2, abs=1e-12)

    expected_sum = (
        stats.norm(0, 2).logpdf(mu)
        + stats.halfnorm(0, 1).logpdf(sigma)
        + stats.norm(mu, 1).logpdf(z.numpy()).sum()
        + expected_y.sum()
        - 0.5 * mu**2
    )
    assert float(tr.log_prob_sum()) == pytest.approx(expected_sum, abs=1e-10)


def test_trace_log_likelihood_pointwise_observed_masked_unscaled():
    tracer = trace(seed(plated_model, rng_seed=1))
    z = tracer(Y)
    tr = tracer.trace
    ll = tr.log_likelihood()
    assert set(ll) == {"y"}  # latent sites and the factor are excluded
    sigma = float(tr["sigma"].value)
    y_ref = stats.norm(z.numpy(), sigma).logpdf(Y.numpy())
    np.testing.assert_allclose(ll["y"].numpy(), np.where(MASK.numpy(), y_ref, 0.0), rtol=1e-12)


def test_trace_empty_and_sample_sites_and_context_manager():
    with trace() as tr:
        pass
    assert float(tr.log_prob_sum()) == 0.0
    with trace() as tr:
        pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(1.0))
        pt.deterministic("d", torch.tensor(2.0))
        with seed(rng_seed=0):
            pt.sample("x", dist.Normal(0.0, 1.0))
    assert list(tr.sample_sites()) == ["y", "x"]
    assert list(tr.sample_sites(observed=True)) == ["y"]
    assert list(tr.sample_sites(observed=False)) == ["x"]
    assert tr.nodes is tr


def test_trace_get_trace_gives_a_fresh_trace_each_run():
    tracer = trace(seed(two_sites, rng_seed=0))
    first = tracer.get_trace()
    second = tracer.get_trace()
    assert first is not second
    assert torch.equal(first["x"].value, second["x"].value)


def test_trace_log_density_error_names_the_site():
    """A latent replayed (or substituted) with a value of the wrong shape fails where its
    density is computed: the error names the site and the shapes (it was torch's bare
    broadcast message), as Pyro's does, and keeps torch's error as its cause."""

    def model():
        pt.sample("a", dist.Normal(0.0, 1.0))
        with pt.plate("p", 3):
            return pt.sample("x", dist.Normal(0.0, 1.0))

    def guide():
        pt.sample("x", dist.Normal(torch.zeros(5), 1.0).to_event(1))

    guide_trace = trace(seed(guide, rng_seed=0)).get_trace()
    tr = trace(seed(replay(model, trace=guide_trace), rng_seed=0)).get_trace()
    pattern = (
        r"log density of site 'x' .*Normal.*batch_shape \(3,\), event_shape \(\).*"
        r"value of shape \(5,\)"
    )
    for compute in (tr.log_prob_sum, tr.compute_log_prob, tr.log_densities):
        with pytest.raises(ValueError, match=pattern) as info:
            compute()
        assert isinstance(info.value.__cause__, ValueError)
        assert "broadcastable" in str(info.value)  # torch's message is kept

    observed = trace(substitute(condition(model, data={"x": torch.zeros(2)}), data={"a": 0.0}))
    with pytest.raises(ValueError, match=r"site 'x'.*value of shape \(2,\)"):
        observed.get_trace().log_likelihood()


# -- seed -----------------------------------------------------------------------------


def test_seed_reproducible_and_matches_torch():
    x1, y1 = seed(two_sites, rng_seed=3)()
    x2, y2 = seed(two_sites, 3)()
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    torch.manual_seed(3)
    ex = torch.randn(())
    ey = ex + torch.randn(())
    assert torch.equal(x1, ex) and torch.allclose(y1, ey, rtol=0, atol=1e-15)
    x3, _ = seed(two_sites, rng_seed=4)()
    assert not torch.equal(x1, x3)
    with seed(rng_seed=3):
        x4, _ = two_sites()
    assert torch.equal(x4, x1)
    with seed(3):
        x5, _ = two_sites()
    assert torch.equal(x5, x1)


def test_seed_restores_global_rng_state():
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    expected = torch.rand(4)
    torch.random.set_rng_state(state)
    seed(two_sites, rng_seed=0)()
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(torch.rand(4), expected)
    # nested seeds: the inner one restores the outer stream
    with seed(rng_seed=1):
        a = torch.randn(())
        with seed(rng_seed=2):
            torch.randn(5)
        b = torch.randn(())
    torch.manual_seed(1)
    assert torch.equal(torch.randn(2), torch.stack([a, b]))
    # also after an exception
    torch.random.set_rng_state(state)
    with pytest.raises(RuntimeError):
        with seed(rng_seed=9):
            torch.rand(3)
            raise RuntimeError
    assert torch.equal(torch.random.get_rng_state(), state)


def test_seed_needs_an_integer():
    with pytest.raises(ValueError, match="rng_seed"):
        seed(two_sites)
    with pytest.raises(ValueError, match="rng_seed"):
        seed()


# -- substitute -----------------------------------------------------------------------


def test_substitute_data():
    def model():
        w = pt.param("w", torch.tensor(1.0))
        x = pt.sample("x", dist.Normal(w, 1.0))
        y = pt.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(0.25))
        return w, x, y

    data = {"w": torch.tensor(-1.0), "x": torch.tensor(2.0), "y": torch.tensor(9.0)}
    tracer = trace(substitute(model, data=data))
    w, x, y = tracer()  # no seed needed: every latent is given
    tr = tracer.trace
    assert float(w) == -1.0 and float(x) == 2.0
    assert float(y) == 0.25  # observed sites are not substituted
    assert not tr["x"].is_observed  # still a latent site
    expected = stats.norm(-1.0, 1.0).logpdf(2.0) + stats.norm(2.0, 1.0).logpdf(0.25)
    assert float(tr.log_prob_sum()) == pytest.approx(expected, abs=1e-12)
    assert "w" not in pt.get_param_store()  # a substituted param never reaches the store

    with trace() as tr2, substitute(data=data):
        model()
    assert float(tr2["x"].value) == 2.0


def test_substitute_fn_and_partial_data():
    seen = []

    def substitute_fn(msg):
        seen.append((msg.type, msg.name))
        return torch.tensor(0.5) if msg.name == "x" else None

    tracer = trace(seed(substitute(two_sites, substitute_fn=substitute_fn), rng_seed=0))
    x, y = tracer()
    assert float(x) == 0.5
    assert float(tracer.trace["y"].fn.loc) == 0.5
    assert seen == [("sample", "x"), ("sample", "y")]
    with seed(rng_seed=0), substitute(data={"y": torch.tensor(1.0)}):
        x, y = two_sites()
    assert float(y) == 1.0  # "x" absent from data: drawn as usual


def test_substitute_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one of data= or substitute_fn="):
        substitute(two_sites)
    with pytest.raises(ValueError, match="exactly one"):
        substitute(two_sites, data={}, substitute_fn=lambda msg: None)


# -- condition ------------------------------------------------------------------------


def test_condition():
    conditioned = condition(two_sites, data={"x": torch.tensor(1.5), "y": 0.5})
    tracer = trace(conditioned)
    x, y = tracer()  # no seed needed
    tr = tracer.trace
    assert tr["x"].is_observed and tr["y"].is_observed
    assert float(x) == 1.5 and float(y) == 0.5 and isinstance(y, torch.Tensor)
    assert float(tr["y"].fn.loc) == 1.5  # downstream sites see the conditioned value
    expected = stats.norm.logpdf(1.5) + stats.norm(1.5, 1.0).logpdf(0.5)
    assert float(tr.log_prob_sum()) == pytest.approx(expected, abs=1e-12)
    assert set(tr.log_likelihood()) == {"x", "y"}

    with trace() as tr2, seed(rng_seed=0), condition(data={"y": torch.tensor(2.0)}):
        two_sites()
    assert not tr2["x"].is_observed and tr2["y"].is_observed


def test_condition_on_a_trace():
    """As in Pyro, ``data`` may be a trace: its sample sites' values are observed (it
    tried to turn the trace's sites themselves into tensors)."""
    recorded = trace(seed(two_sites, rng_seed=3)).get_trace()
    tr = trace(condition(two_sites, data=recorded)).get_trace()  # no seed needed
    for name in ("x", "y"):
        assert tr[name].is_observed and torch.equal(tr[name].value, recorded[name].value)

    def model():
        return pt.sample("y", dist.Normal(0.0, 1.0))

    with trace() as params_only:  # only the trace's sample sites are observed
        pt.param("y", torch.tensor(1.0))
    tr = trace(seed(condition(model, data=params_only), rng_seed=0)).get_trace()
    assert not tr["y"].is_observed


def test_condition_inside_plate():
    def model():
        loc = pt.sample("loc", dist.Normal(0.0, 1.0))
        with pt.plate("data", 3):
            return pt.sample("obs", dist.Normal(loc, 1.0))

    data = torch.tensor([0.1, 0.2, 0.3])
    tracer = trace(seed(condition(model, data={"obs": data}), rng_seed=0))
    assert torch.equal(tracer(), data)
    loc = float(tracer.trace["loc"].value)
    np.testing.assert_allclose(
        tracer.trace.log_likelihood()["obs"].numpy(), stats.norm(loc, 1).logpdf(data.numpy())
    )


# -- block ----------------------------------------------------------------------------


def block_model():
    w = pt.param("w", torch.tensor(1.0))
    a = pt.sample("a", dist.Normal(w, 1.0))
    b = pt.sample("b", dist.Normal(a, 1.0))
    pt.deterministic("c", a + b)
    return a, b


@pytest.mark.parametrize(
    "kwargs, visible",
    [
        ({}, []),
        ({"hide": ["a"]}, ["w", "b", "c"]),
        ({"expose": ["a", "c"]}, ["a", "c"]),
        ({"hide_types": ["param"]}, ["a", "b", "c"]),
        ({"hide_types": ["sample", "deterministic"]}, ["w"]),
        ({"expose_types": ["sample"]}, ["a", "b"]),
        ({"hide_fn": lambda msg: msg.name.startswith("b")}, ["w", "a", "c"]),
    ],
)
def test_block(kwargs, visible):
    tracer = trace(block(seed(block_model, rng_seed=0), **kwargs))
    a, b = tracer()
    assert list(tracer.trace) == visible
    assert torch.equal(seed(block_model, rng_seed=0)()[1], b)  # hidden sites still run
    with trace() as tr, block(**kwargs), seed(rng_seed=0):
        block_model()
    assert list(tr) == visible


def observed_block_model():
    w = pt.param("w", torch.tensor(1.0))
    a = pt.sample("a", dist.Normal(w, 1.0))
    pt.sample("y", dist.Normal(a, 1.0), obs=torch.tensor(0.5))
    pt.deterministic("c", 2 * a)


@pytest.mark.parametrize(
    "kwargs, visible",
    [
        # as in Pyro, an observed sample site has the type "observe" for block
        ({"hide_types": ["observe"]}, ["w", "a", "c"]),
        ({"expose_types": ["observe"]}, ["y"]),
        ({"expose_types": ["sample"]}, ["a"]),
        ({"expose_types": ["sample", "observe"]}, ["a", "y"]),
        ({"hide_types": ["sample"]}, ["w", "y", "c"]),
        # every argument counts (only the first given did)
        ({"hide": ["a"], "hide_types": ["observe"]}, ["w", "c"]),
        ({"hide": ["a"], "expose_types": ["sample"]}, []),
        # (hide wins; hide_all is set by hide, expose, hide_types, expose_types in turn)
        ({"hide_types": ["sample"], "expose": ["a"]}, ["w", "y", "c"]),
        ({"expose": ["w"], "expose_types": ["observe"]}, ["w", "y"]),
        ({"hide": ["a"], "expose": ["w"]}, ["w"]),
        ({"hide_all": False}, ["w", "a", "y", "c"]),
        ({"hide_all": False, "expose_all": True}, ["w", "a", "y", "c"]),
        ({"expose_all": True}, ["w", "a", "y", "c"]),  # (Pyro asks for hide_all=False too)
        ({"expose_fn": lambda msg: msg.type == "param"}, ["w"]),
    ],
)
def test_block_observe_type_and_combined_arguments(kwargs, visible):
    tr = trace(block(seed(observed_block_model, rng_seed=0), **kwargs)).get_trace()
    assert list(tr) == visible


def test_block_argument_errors():
    with pytest.raises(ValueError, match="only one of hide_fn or expose_fn"):
        block(two_sites, hide_fn=lambda msg: True, expose_fn=lambda msg: True)
    with pytest.raises(ValueError, match=r"cannot hide and expose.*\['a'\]"):
        block(two_sites, hide=["a", "b"], expose=["a"])
    with pytest.raises(ValueError, match="cannot hide and expose a site type"):
        block(two_sites, hide_types=["sample"], expose_types=["sample"])
    with pytest.raises(ValueError, match="hide_all and expose_all"):
        block(two_sites, hide_all=True, expose_all=True)


def test_block_hides_sites_from_outer_handlers():
    # condition sits outside block, so it never sees "x": x is drawn, not conditioned
    model = condition(block(seed(two_sites, rng_seed=0), hide=["x"]), data={"x": 5.0})
    x, y = model()
    assert float(x) != 5.0


def test_a_site_hidden_by_block_still_draws_from_an_outer_seed():
    """As in Pyro (whose seed is torch's global generator): an autoguide built on
    ``block(model, hide=["z"])`` traces the model under its own seed (it raised
    RandomnessError: the seed outside the block never saw the site)."""
    x, y = seed(block(two_sites, hide=["x"]), rng_seed=0)()
    x2, y2 = seed(block(two_sites, hide=["x"]), rng_seed=0)()
    assert torch.equal(x, x2) and torch.equal(y, y2)
    tr = trace(seed(block(two_sites, hide=["x"]), rng_seed=0)).get_trace()
    assert list(tr) == ["y"]
    with pytest.raises(pt.primitives.RandomnessError, match="'x'"):
        block(two_sites, hide=["x"])()  # no seed anywhere: still refused


# -- replay ---------------------------------------------------------------------------


def test_replay():
    def model(obs):
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        z = pt.sample("z", dist.Normal(0.0, 1.0))
        y = pt.sample("y", dist.Normal(x, 1.0), obs=obs)
        return x, z, y

    def guide(obs):
        pt.sample("x", dist.Normal(3.0, 0.1))
        pt.sample("y", dist.Normal(-3.0, 0.1))

    guide_trace = trace(seed(guide, rng_seed=0)).get_trace(None)
    tracer = trace(seed(replay(model, trace=guide_trace), rng_seed=1))
    x, z, y = tracer(torch.tensor(0.7))
    assert torch.equal(x, guide_trace["x"].value)
    assert float(y) == 0.7  # observed: not replayed
    torch.manual_seed(1)
    assert torch.equal(z, torch.randn(()))  # not in the guide trace: drawn as usual
    expected = (
        stats.norm.logpdf(float(x))
        + stats.norm.logpdf(float(z))
        + stats.norm(float(x), 1.0).logpdf(0.7)
    )
    assert float(tracer.trace.log_prob_sum()) == pytest.approx(expected, abs=1e-12)
    with trace() as tr, replay(trace=guide_trace):
        pt.sample("x", dist.Normal(0.0, 1.0))
    assert torch.equal(tr["x"].value, guide_trace["x"].value)


def test_replay_plate_indices():
    data = torch.arange(10.0)

    def model():
        with pt.plate("data", 10, subsample_size=3) as idx:
            pt.sample("y", dist.Normal(0.0, 1.0), obs=data[idx])
        return idx

    guide_trace = trace(seed(model, rng_seed=0)).get_trace()
    for rng_seed in (1, 2, 3):
        tracer = trace(seed(replay(model, trace=guide_trace), rng_seed=rng_seed))
        idx = tracer()
        assert torch.equal(idx, guide_trace["data"].value)
        assert torch.equal(tracer.trace["y"].value, data[idx])


def test_replay_errors():
    with pytest.raises(ValueError, match="replay needs a trace"):
        replay(two_sites)

    bad = Trace()
    bad["x"] = Message("plate", "x", value=torch.arange(2))
    with pytest.raises(ValueError, match="'x' is a sample site in the model but a plate"):
        seed(replay(two_sites, trace=bad), rng_seed=0)()


def test_replay_refuses_a_site_observed_in_the_trace():
    """As in Pyro ("site ... must be sampled in trace"): the model's latent took the
    observed value of the guide's site without a word."""

    def guide():
        pt.sample("x", dist.Normal(5.0, 0.1), obs=torch.tensor(1.0))

    guide_trace = trace(guide).get_trace()
    with pytest.raises(ValueError, match="site 'x' must be sampled in trace.*observed"):
        seed(replay(two_sites, trace=guide_trace), rng_seed=0)()

    def observed_model():  # a site observed in the model too is left alone
        return pt.sample("x", dist.Normal(0.0, 1.0), obs=torch.tensor(2.0))

    assert float(replay(observed_model, trace=guide_trace)()) == 2.0


def test_replay_copies_the_infer_dict_of_the_trace():
    """As in Pyro, a replayed site takes the ``infer`` dict of the trace's site."""

    def guide():
        pt.sample("x", dist.Normal(0.0, 1.0), infer={"foo": 1})

    def model():
        pt.sample("x", dist.Normal(0.0, 1.0), infer={"bar": 2})
        pt.sample("y", dist.Normal(0.0, 1.0), infer={"bar": 3})

    guide_trace = trace(seed(guide, rng_seed=0)).get_trace()
    tr = trace(seed(replay(model, trace=guide_trace), rng_seed=1)).get_trace()
    assert tr["x"].infer == {"foo": 1} and tr["y"].infer == {"bar": 3}
    tr["x"].infer["baz"] = 4
    assert guide_trace["x"].infer == {"foo": 1}  # a copy


# -- scale, mask ----------------------------------------------------------------------


def obs_model():
    with pt.plate("data", 3):
        pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor([0.0, 1.0, 2.0]))


OBS_REF = stats.norm.logpdf([0.0, 1.0, 2.0])


def test_scale():
    tr = trace(scale(obs_model, scale=2.5)).get_trace()
    np.testing.assert_allclose(tr.log_densities()["y"].numpy(), 2.5 * OBS_REF, rtol=1e-12)
    assert float(tr.log_prob_sum()) == pytest.approx(2.5 * OBS_REF.sum(), abs=1e-12)
    np.testing.assert_allclose(tr.log_likelihood()["y"].numpy(), OBS_REF, rtol=1e-12)
    with trace() as tr, scale(scale=2.0), scale(scale=torch.tensor([1.0, 2.0, 3.0])):
        obs_model()
    np.testing.assert_allclose(
        tr.log_densities()["y"].numpy(), 2.0 * np.array([1.0, 2.0, 3.0]) * OBS_REF, rtol=1e-12
    )


def test_scale_combines_with_subsampling():
    def model():
        with pt.plate("data", 12, subsample_size=3):
            pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(3))

    tr = trace(seed(scale(model, scale=0.5), rng_seed=0)).get_trace()
    assert float(tr.log_prob_sum()) == pytest.approx(0.5 * 4 * 3 * stats.norm.logpdf(0))


@pytest.mark.parametrize("bad", [0.0, -1.0, torch.tensor([1.0, -1.0])])
def test_scale_must_be_positive(bad):
    with pytest.raises(ValueError, match="scale must be positive"):
        scale(obs_model, scale=bad)


def test_mask():
    tr = trace(mask(obs_model, mask=False)).get_trace()
    assert tr.log_densities()["y"].tolist() == [0.0, 0.0, 0.0]
    assert float(tr.log_prob_sum()) == 0.0
    tr = trace(mask(obs_model, mask=True)).get_trace()
    np.testing.assert_allclose(tr.log_densities()["y"].numpy(), OBS_REF, rtol=1e-12)
    m1, m2 = torch.tensor([True, True, False]), torch.tensor([False, True, True])
    with trace() as tr, mask(mask=m1), mask(mask=m2):
        obs_model()
    expected = np.array([0.0, OBS_REF[1], 0.0])
    np.testing.assert_allclose(tr.log_densities()["y"].numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(tr.log_likelihood()["y"].numpy(), expected, rtol=1e-12)
    assert float(tr.log_prob_sum()) == pytest.approx(OBS_REF[1], abs=1e-12)
    with trace() as tr, mask(mask=True), mask(mask=False):
        obs_model()
    assert tr["y"].mask is False


def test_mask_must_be_bool():
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        mask(obs_model, mask=torch.tensor([1.0, 0.0, 1.0]))


# -- do -------------------------------------------------------------------------------


def test_do_trace_outside():
    intervened = do(two_sites, data={"x": torch.tensor(10.0)})
    tracer = trace(seed(intervened, rng_seed=0))
    x, y = tracer()
    tr = tracer.trace
    assert float(x) == 10.0  # the model sees the intervention
    assert float(tr["y"].fn.loc) == 10.0
    # the site "x" itself is still drawn from its prior, with its own density
    torch.manual_seed(0)
    assert torch.equal(tr["x"].value, torch.randn(()))
    assert not tr["x"].is_observed
    # as in Pyro, the intervened site is not seen by handlers outside ``do``
    assert list(tr) == ["x", "y"]
    expected = stats.norm.logpdf(float(tr["x"].value)) + stats.norm(10.0, 1.0).logpdf(float(y))
    assert float(tr.log_prob_sum()) == pytest.approx(expected, abs=1e-12)


def test_do_cf_site_and_context_manager():
    tracer = trace(two_sites)
    with seed(rng_seed=0), do(data={"x": 10.0}):
        x, y = tracer()
    tr = tracer.trace
    assert list(tr) == ["x__CF", "y"]
    assert tr["x__CF"].is_observed and float(tr["x__CF"].value) == 10.0
    assert float(x) == 10.0 and float(tr["y"].fn.loc) == 10.0


def test_do_inside_plate():
    def model():
        with pt.plate("data", 3):
            x = pt.sample("x", dist.Normal(0.0, 1.0))
            return pt.sample("y", dist.Normal(x, 1.0))

    value = torch.tensor([1.0, 2.0, 3.0])
    tr = trace(seed(do(model, data={"x": value}), rng_seed=0)).get_trace()
    assert torch.equal(tr["y"].fn.loc, value)
    assert tr["x"].value.shape == (3,) and tr["x"].cond_indep_stack[0].name == "data"


# -- reparam --------------------------------------------------------------------------


def test_reparam_config_dict_and_callable():
    def model():
        a = pt.sample("a", dist.Normal(1.0, 2.0))
        b = pt.sample("b", dist.Normal(a, 3.0))
        return a, b

    by_dict = trace(seed(reparam(model, config={"b": LocScaleReparam(0.0)}), 0)).get_trace()
    assert list(by_dict) == ["a", "b_decentered", "b"]
    assert by_dict["a"].type == "sample" and by_dict["b"].type == "deterministic"
    a, z = by_dict["a"].value, by_dict["b_decentered"].value
    assert torch.allclose(by_dict["b"].value, a + 3.0 * z, rtol=0, atol=1e-14)

    def config(msg):
        return LocScaleReparam(0.0) if msg.name in ("a", "b") else None

    with trace() as tr, seed(rng_seed=0), reparam(config=config):
        model()
    assert list(tr) == ["a_decentered", "a", "b_decentered", "b"]
    with pytest.raises(ValueError, match="reparam needs a config"):
        reparam(model)


# -- composition ----------------------------------------------------------------------

DATA = torch.tensor([2.0, 3.5, 1.0])


def composed_model(data):
    a = pt.sample("a", dist.Normal(0.0, 1.0))
    b = pt.sample("b", dist.Normal(a, 2.0))
    c = pt.sample("c", dist.HalfNormal(1.0))
    d = pt.sample("d", dist.Normal(b, 1.0))
    with pt.plate("N", 3):
        pt.sample("obs", dist.Normal(b + d, c), obs=data)
    return a, b, c, d


def composed_guide():
    pt.sample("b", dist.Normal(3.0, 0.1))
    pt.sample("c", dist.HalfNormal(1.0))
    pt.sample("d", dist.Normal(-1.0, 0.1))


def _check_composed(tr, guide_trace, returned):
    b, d = float(guide_trace["b"].value), float(guide_trace["d"].value)
    assert list(tr) == ["a", "b", "c", "N", "obs"]  # "d" is blocked
    assert tr["a"].is_observed and float(tr["a"].value) == 0.5  # condition
    assert not tr["b"].is_observed and float(tr["b"].value) == b  # replay
    assert not tr["c"].is_observed and float(tr["c"].value) == 1.5  # substitute, inside replay
    assert float(returned[3]) == d  # "d" is hidden but replayed and used downstream
    assert torch.allclose(tr["obs"].fn.loc, torch.tensor(b + d))
    expected = (
        stats.norm(0, 1).logpdf(0.5)
        + stats.norm(0.5, 2).logpdf(b)
        + stats.halfnorm(0, 1).logpdf(1.5)
        + stats.norm(b + d, 1.5).logpdf(DATA.numpy()).sum()
    )
    assert float(tr.log_prob_sum()) == pytest.approx(expected, abs=1e-10)


def test_condition_substitute_replay_block_together():
    guide_trace = trace(seed(composed_guide, rng_seed=0)).get_trace()
    # replay sits outside substitute, but "c" of the guide is hidden from it by a block
    guide_trace = Trace((k, v) for k, v in guide_trace.items() if k != "c")
    model = condition(composed_model, data={"a": torch.tensor(0.5)})
    model = substitute(model, data={"c": torch.tensor(1.5)})
    model = replay(model, trace=guide_trace)
    model = block(model, hide=["d"])
    tracer = trace(model)
    returned = tracer(DATA)  # every latent is given: no seed needed
    _check_composed(tracer.trace, guide_trace, returned)

    with trace() as tr:
        with block(hide=["d"]):
            with replay(trace=guide_trace):
                with substitute(data={"c": torch.tensor(1.5)}):
                    with condition(data={"a": torch.tensor(0.5)}):
                        returned = composed_model(DATA)
    _check_composed(tr, guide_trace, returned)


def test_outermost_value_setting_handler_wins():
    guide_trace = trace(seed(composed_guide, rng_seed=0)).get_trace()
    with trace() as tr, seed(rng_seed=0):
        with replay(trace=guide_trace), substitute(data={"c": torch.tensor(1.5)}):
            composed_model(DATA)
    assert torch.equal(tr["c"].value, guide_trace["c"].value)
    with trace() as tr, seed(rng_seed=0):
        with substitute(data={"c": torch.tensor(1.5)}), replay(trace=guide_trace):
            composed_model(DATA)
    assert float(tr["c"].value) == 1.5


def test_scale_error_shows_where_a_tensor_is_not_positive():
    weights = torch.ones(200)
    weights[3], weights[17] = 0.0, -0.5
    with pytest.raises(ValueError, match=r"shape \(200,\) has 2 entries.*3: 0, 17: -0.5$"):
        scale(obs_model, scale=weights)


def test_mask_refuses_what_is_not_a_bool_by_name():
    with pytest.raises(TypeError, match=r"mask must be True, False or a bool tensor .* int 0"):
        pt.handlers.mask(mask=0)


def test_set_rng_seed_seeds_torch_numpy_and_python_as_pyros():
    """``pt.set_rng_seed`` (Pyro's ``pyro.set_rng_seed``): the same seed, the same draws of
    torch, NumPy's global generator and Python's ``random``."""
    import random

    def draws():
        return torch.rand(3), np.random.rand(3), random.random()

    pt.set_rng_seed(7)
    first = draws()
    pt.set_rng_seed(7)
    again = draws()
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]
    pt.set_rng_seed(np.int64(8))
    assert not torch.equal(torch.rand(3), first[0])
    with pytest.raises(TypeError, match="set_rng_seed takes an integer seed, got 1.5"):
        pt.set_rng_seed(1.5)


# -- Pyro's behaviour a ported model relies on (a differential review against pyro.poutine)


def _two_site_model():
    a = pt.sample("a", dist.Normal(0.0, 1.0))
    return pt.sample("y", dist.Normal(a, 1.0))


def test_a_value_none_leaves_its_site_latent_under_condition_and_do():
    """Pyro's prior predictive idiom: condition(model, {"y": y}) with y = None."""
    for handler in (condition, do):
        tr = trace(seed(handler(_two_site_model, data={"a": None, "y": None}), 0)).get_trace()
        assert list(tr) == ["a", "y"]
        assert not tr["a"].is_observed and not tr["y"].is_observed
        plain = trace(seed(_two_site_model, 0)).get_trace()
        assert torch.equal(tr["y"].value, plain["y"].value)


def test_a_value_that_is_no_number_is_an_error_naming_the_site():
    with pytest.raises(TypeError, match="condition: the value for site 'a' must be a tensor.*str"):
        condition(_two_site_model, data={"a": "abc"})()
    with pytest.raises(TypeError, match="do: the value for site 'a' must be a tensor"):
        seed(do(_two_site_model, data={"a": "abc"}), 0)()


@pytest.mark.parametrize(
    "fn, match",
    [
        (3.0, "sample site 'x': the second argument must be a distribution .*got float 3.0"),
        (dist.Normal, r"sample site 'x': got the class Normal, not a distribution"),
    ],
)
def test_a_sample_site_without_a_distribution_is_named(fn, match):
    with pytest.raises(TypeError, match=match):
        seed(lambda: pt.sample("x", fn), 0)()


@pytest.mark.parametrize("guide_plate", [(4, None), (10, 3)])
def test_a_replayed_plate_of_another_size_is_refused_naming_it(guide_plate):
    """A guide whose plate has another size than the model's gives rows the model's plate
    does not have (Pyro takes them silently: sites scaled by 3/4, data of 3 rows)."""

    def guide():
        with pt.plate("N", guide_plate[0], subsample_size=guide_plate[1]):
            pt.sample("z", dist.Normal(0.0, 1.0))

    def model():
        with pt.plate("N", 3):
            pt.sample("z", dist.Normal(0.0, 1.0))

    guide_trace = trace(seed(guide, 0)).get_trace()
    with pytest.raises(ValueError, match="plate 'N' has size 3, but a handler .* gave it"):
        replay(seed(model, 1), trace=guide_trace)()


def test_block_by_sample_type_keeps_a_plates_rows_for_the_model():
    """Pyro's subsample site is a "sample" site: a guide blocked to expose its sample sites
    still hands its rows to the model, and hiding sample sites hides them."""

    def guide():
        with pt.plate("data", 100, subsample_size=5):
            pt.sample("z", dist.Normal(0.0, 1.0))

    def model():
        with pt.plate("data", 100, subsample_size=5) as rows:
            pt.sample("z", dist.Normal(0.0, 1.0))
        return rows

    guide_trace = trace(seed(block(guide, expose_types=["sample"]), 0)).get_trace()
    assert list(guide_trace) == ["data", "z"]
    rows = replay(seed(model, 1), trace=guide_trace)()
    assert torch.equal(rows, guide_trace["data"].value)
    assert list(trace(seed(block(guide, hide_types=["sample"]), 0)).get_trace()) == []
    assert list(trace(seed(block(guide, expose_types=["plate"]), 0)).get_trace()) == ["data"]


def test_plate_takes_pyros_argument_order_and_refuses_sizes_that_are_no_counts():
    rows = torch.tensor([1, 4])
    with pt.plate("N", 10, 2, rows) as idx:  # Pyro: (name, size, subsample_size, subsample)
        assert torch.equal(idx, rows)
    with pytest.raises(TypeError, match=r"plate 'N': size must be an integer, got 3.5"):
        pt.plate("N", 7 / 2)
    with pytest.raises(ValueError, match=r"plate 'N': subsample_size must lie in \[1, size=5\]"):
        pt.plate("N", 5, subsample_size=0)
    with pytest.raises(TypeError, match="plate 'N': dim must be a negative integer"):
        pt.plate("N", 5, dim=torch.tensor([1, 2]))
    with pt.plate("N", 3.0, device="cpu") as idx:  # a whole float, and Pyro's device
        assert idx.tolist() == [0, 1, 2]
    with pt.plate("empty", 0) as idx:  # no data: a plate of no rows
        assert idx.numel() == 0


def test_infer_config_updates_observed_sites_and_params_as_pyros():
    def model():
        pt.param("s", torch.tensor(1.0))
        a = pt.sample("a", dist.Bernoulli(0.5))
        pt.sample("y", dist.Bernoulli(0.5), obs=a)

    tagged = pt.handlers.infer_config(model, lambda msg: {"tag": msg.name})
    with pt.param_scope(pt.ParamStore()):
        tr = trace(seed(tagged, 0)).get_trace()
    assert {name: site.infer for name, site in tr.items()} == {
        "s": {"tag": "s"},
        "a": {"tag": "a"},
        "y": {"tag": "y"},
    }
    enumerated = trace(seed(pt.handlers.config_enumerate(model), 0))
    with pt.param_scope(pt.ParamStore()):
        tr = enumerated.get_trace()
    assert tr["a"].infer == {"enumerate": "parallel"} and tr["y"].infer == {}


def test_seed_seeds_and_restores_numpys_and_pythons_generators_as_pyros():
    import random

    def model():
        return np.random.randint(100, size=3).tolist(), random.random()

    np.random.seed(7)
    random.seed(7)
    before = (np.random.get_state()[1].copy(), random.getstate())
    first, second = seed(model, 3)(), seed(model, 3)()
    assert first == second
    assert np.array_equal(np.random.get_state()[1], before[0]) and random.getstate() == before[1]


def test_sites_read_as_pyros_dicts():
    def model():
        with pt.plate("n", 2):
            pt.sample("y", dist.Normal(0.0, 1.0), obs=torch.zeros(2))

    site = trace(model).get_trace()["y"]
    assert "log_prob" not in site and site.get("log_prob_sum") is None
    trace_ = trace(model).get_trace()
    trace_.compute_log_prob()
    site = trace_["y"]
    assert "log_prob" in site and "value" in site
    expected = 2 * stats.norm.logpdf(0.0)
    assert abs(float(site["log_prob_sum"]) - expected) < 1e-5
    assert site["scale"] == 1.0 and site.scale is None  # Pyro's default scale
    site["my_note"] = "kept"
    assert site["my_note"] == "kept" and "my_note" in site.keys()
    with pytest.raises(KeyError, match="site 'y' has no entry 'unknown'"):
        site["unknown"]


def test_trace_answers_pyros_trace_api():
    def model():
        pt.param("p", torch.tensor(0.5))
        x = pt.sample("x", dist.Normal(0.0, 1.0))
        pt.sample("y", dist.Normal(x, 1.0), obs=torch.tensor(1.0))

    with pt.param_scope(pt.ParamStore()), trace() as tr, seed(rng_seed=0):
        model()
    assert tr.trace is tr  # Pyro's `with poutine.trace() as tr: ...; tr.trace`
    assert (tr.stochastic_nodes, tr.observation_nodes, tr.param_nodes) == (["x"], ["y"], ["p"])
    only_y = tr.log_prob_sum(lambda name, site: name == "y")
    x = float(tr["x"].value)
    assert abs(float(only_y) - stats.norm.logpdf(1.0, loc=x)) < 1e-5


def test_pyros_keywords_of_deterministic_and_module_are_taken():
    with trace() as tr:
        pt.deterministic("d", torch.zeros(3, 2), event_dim=1)
    assert tr["d"].value.shape == (3, 2)
    net = torch.nn.Linear(2, 1)
    store = pt.ParamStore()
    with pt.param_scope(store):
        assert pt.module("net", net, update_module_params=True) is net
    assert store["net$$$weight"] is net.weight


def test_format_shapes_lays_out_each_sites_batch_and_event_dims_as_pyros():
    def model():
        scale = pt.param("s", torch.ones(3))
        with pt.plate("a", 5, dim=-2), pt.plate("b", 3):
            x = pt.sample("x", dist.Normal(0.0, scale))
            y = torch.zeros(5, 3, 2)
            pt.sample("y", dist.MultivariateNormal(torch.zeros(2), torch.eye(2)), obs=y)
        pt.deterministic("d", x.sum())

    with pt.param_scope(pt.ParamStore()):
        tr = trace(seed(model, 0)).get_trace()
    expected = """\
Trace Shapes:
 Param Sites:
            s   3
Sample Sites:
      a plate   5 |
      b plate   3 |
       x dist 5 3 |
        value 5 3 |
     log_prob 5 3 |
       y dist 5 3 | 2
        value 5 3 | 2
     log_prob 5 3 |
      d value     |"""
    assert tr.format_shapes(compute_log_prob=True) == expected
    cut = [line.split() for line in tr.format_shapes(last_site="b").splitlines()]
    assert cut == [line.split() for line in expected.splitlines()[:6]]


def test_uncondition_draws_the_observed_sites_as_pyros():
    def model(y):
        mu = pt.sample("mu", dist.Normal(0.0, 1.0))
        with pt.plate("n", 3):
            pt.sample("y", dist.Normal(mu, 1.0), obs=y)
        pt.factor("penalty", -(mu**2))

    y = torch.full((3,), 5.0)
    tr = trace(seed(pt.handlers.uncondition(model), 0)).get_trace(y)
    assert not tr["y"].is_observed and tr["y"].infer == {"obs": y, "was_observed": True}
    assert tr["penalty"].is_observed  # a factor draws nothing
    # the drawn y is the model's own draw given mu: the same as a run with obs=None
    free = trace(seed(model, 0)).get_trace(None)
    assert torch.equal(tr["y"].value, free["y"].value)
    outer = trace(seed(condition(pt.handlers.uncondition(model), {"y": y}), 0)).get_trace(None)
    assert outer["y"].is_observed  # a condition outside observes again, as in Pyro


def test_lift_turns_params_into_sample_sites(float64):
    """Pyro's poutine.lift: the params named in the prior become latent sample sites (a
    second read of one is the same draw, recorded once); the others stay params. The
    lifted model's potential is -(log prior + log likelihood) at the point; a prior that
    is not a distribution is refused naming the param."""
    from probtorch.inference import Potential

    y = torch.tensor([0.5, 1.5, 2.0])

    def model(y):
        w = pt.param("w", torch.tensor(0.0))
        s = pt.param("s", torch.tensor(0.7), constraint=dist.constraints.positive)
        with pt.plate("n", 3):
            pt.sample("y", dist.Normal(pt.param("w") + 0.0 * w, s), obs=y)
        return w

    prior = dist.Normal(1.0, 2.0)
    lifted = pt.handlers.lift(model, prior={"w": prior})
    tr = trace(seed(lifted, rng_seed=0)).get_trace(y)
    assert [(name, site.type) for name, site in tr.items()] == [
        ("w", "sample"),
        ("s", "param"),
        ("n", "plate"),
        ("y", "sample"),
    ]
    assert not tr["w"].is_observed and float(tr["w"].value) != 0.0
    torch.testing.assert_close(tr["y"].fn.loc, tr["w"].value.expand(3))
    with pt.param_scope(pt.ParamStore()):
        potential = Potential(lifted, (y,), compile=False)
        assert potential.site_names == ["w"]
        w = torch.tensor([[0.3], [1.9]], dtype=torch.float64)
        expected = -(
            stats.norm(1.0, 2.0).logpdf(w.numpy()[:, 0])
            + stats.norm(w.numpy(), 0.7).logpdf(y.numpy()).sum(-1)
        )
        np.testing.assert_allclose(potential(w).detach().numpy(), expected, rtol=1e-6)
    every = trace(seed(pt.handlers.lift(model, prior=dist.HalfNormal(1.0)), 0)).get_trace(y)
    assert every["w"].type == "sample" and every["s"].type == "sample"
    with pytest.raises(TypeError, match=r"lift: prior must be a distribution.*'w': 'float'"):
        pt.handlers.lift(model, prior={"w": 1.0})
