"""Generic tests run on every row of tests/distribution_table.py (one row per family).

Each test is parametrized over the table with the family name as id. A row's known gaps
are in the table with their reasons: ``sampler_reason`` (the sampler does not compile: the
compile test then asserts that it fails) and ``xfail`` (strict: the test must fail until the
upstream bug is fixed). Nothing is skipped.

Monte Carlo checks use a fixed seed and |z| < 4.5, where z is computed with the standard
error estimated from the same draws.
"""

from __future__ import annotations

import math
import pickle
import types

import numpy as np
import pytest
import torch
from distribution_table import TABLE, Family

import probtorch as pt
import probtorch.distributions as dist
from probtorch.validation import torch_validation

# torch's Wishart.rsample takes every valid draw for a singular one (it tests
# `support.check(sample)` where it means its negation), redraws it and warns; the redrawn
# draws are still exact (independent) draws.
pytestmark = pytest.mark.filterwarnings("ignore:Singular sample detected:UserWarning")

F64 = torch.float64
N_DRAWS = 20000
Z_MAX = 4.5


def _params(rows, test=None, where=lambda row: True):
    out = []
    for row in rows:
        if not where(row):
            continue
        marks = []
        if test is not None and test in row.xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=row.xfail[test]))
        out.append(pytest.param(row, id=row.name, marks=marks))
    return out


def _is_discrete(row: Family) -> bool:
    return row.dist().support.is_discrete


def _has_rsample(row: Family) -> bool:
    return row.dist().has_rsample


def _points(row: Family) -> torch.Tensor:
    return torch.as_tensor(np.stack([np.asarray(p, dtype=np.float64) for p in row.points]))


def _stat(row: Family, x: torch.Tensor, event_dims: int) -> torch.Tensor:
    """The row's statistic of draws ``x``, shape ``(..., m)``."""
    x = x.to(F64)
    if row.stat is not None:
        return row.stat(x)
    if event_dims == 0:
        return x.unsqueeze(-1)
    return x.reshape(x.shape[: x.dim() - event_dims] + (-1,))


def _batched(row: Family, batch: tuple[int, ...], requires_grad: bool = False) -> dict:
    """The row's parameters with ``batch`` prepended to every tensor (a real batch_shape)."""
    out = {}
    for name, value in row.params.items():
        if isinstance(value, torch.Tensor):
            value = value.expand(batch + value.shape).clone()
            if requires_grad and name in row.differentiable:
                value.requires_grad_(True)
        out[name] = value
    return out


def _assert_z(estimate, exact, se, what):
    estimate, exact, se = (torch.as_tensor(v, dtype=F64).detach() for v in (estimate, exact, se))
    exact = exact.expand_as(estimate)
    zero_se = se == 0
    if zero_se.any():  # the estimator is constant: it must equal the exact value
        torch.testing.assert_close(estimate[zero_se], exact[zero_se], rtol=1e-8, atol=1e-10)
    # a floor for rounding, where the estimator is (nearly) constant across draws
    floor = 1e-9 * (1 + exact.abs())
    z = ((estimate - exact).abs() - floor).clamp(min=0)[~zero_se] / se[~zero_se]
    assert torch.all(z < Z_MAX), (
        f"{what}: estimate {estimate.tolist()}, exact {exact.tolist()}, z {z.tolist()}"
    )


def _fresh(fn):
    """A copy of ``fn`` with its own code object, so Dynamo's cache (and its recompile limit,
    8 per code object) is per test, not shared by every family."""
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _compile(fn):
    return torch.compile(_fresh(fn), fullgraph=True, dynamic=False)


# --------------------------------------------------------------------------------------
# density
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", _params(TABLE))
def test_log_prob_matches_reference(row):
    d = row.dist(validate_args=True)
    x = _points(row)
    actual = d.log_prob(x)
    assert actual.dtype == F64
    expected = torch.tensor(
        [row.ref_log_prob(np.asarray(p, dtype=np.float64)) for p in row.points], dtype=F64
    )
    assert torch.isfinite(expected).all(), "reference points must lie in the support"
    # relative 1e-6; the absolute floor only matters where the log density is ~0
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-10)


# --------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", _params(TABLE, "moments"))
def test_sample_moments(row):
    d = row.dist()
    mean, var = (v.detach() for v in row.moments(row.params))
    mean, var = mean.reshape(-1), var.reshape(-1)

    # the table's exact moments agree with scipy's and with the distribution's own
    if row.stat is None and row.scipy_ref is not None and not d.event_shape:
        ref = row.scipy_ref(row.numpy_params())
        torch.testing.assert_close(mean, torch.tensor([float(ref.mean())], dtype=F64))
        torch.testing.assert_close(var, torch.tensor([float(ref.var())], dtype=F64))
    if row.stat is None:
        try:
            own = d.mean.reshape(-1), d.variance.reshape(-1)
        except NotImplementedError:
            own = None
        # (torch's Categorical has mean and variance nan: its categories are unordered)
        if own is not None and all(bool(torch.isfinite(v).all()) for v in own):
            torch.testing.assert_close(own[0].to(F64), mean)
            torch.testing.assert_close(own[1].to(F64), var)

    torch.manual_seed(0)
    s = _stat(row, d.sample((N_DRAWS,)), len(d.event_shape))
    n = s.shape[0]
    sample_mean = s.mean(0)
    centered = s - sample_mean
    m2 = (centered**2).mean(0)
    m4 = (centered**4).mean(0)
    _assert_z(sample_mean, mean, (m2 / n).sqrt(), "mean")
    sample_var = m2 * n / (n - 1)
    _assert_z(sample_var, var, ((m4 - m2**2) / n).sqrt(), "variance")


@pytest.mark.parametrize("row", _params(TABLE))
def test_shapes(row):
    batch = (4,)
    d = row.build(_batched(row, batch), validate_args=True)
    event = row.dist().event_shape
    assert d.batch_shape == batch
    assert d.event_shape == event
    torch.manual_seed(0)
    x = d.sample((3, 2))
    assert x.shape == (3, 2) + batch + event
    assert d.log_prob(x).shape == (3, 2) + batch
    assert torch.isfinite(d.log_prob(x)).all()
    if d.has_rsample:
        assert d.rsample((5,)).shape == (5,) + batch + event
    # broadcasting one value against the batch
    assert d.log_prob(x[0, 0, 0]).shape == batch


@pytest.mark.parametrize("row", _params(TABLE, where=_has_rsample))
def test_rsample_gradient(row):
    """Pathwise gradients of E[sum stat] and E[sum stat^2] against the exact ones.

    Every draw gets its own copy of the parameters (a batch of N_DRAWS), so one backward
    pass gives the per-draw gradients, whose spread is the estimator's standard error.
    """
    names = row.differentiable
    assert names, "an rsample row must have a differentiable parameter"
    params = _batched(row, (N_DRAWS,), requires_grad=True)
    torch.manual_seed(0)
    x = row.build(params).rsample()
    s = _stat(row, x, len(row.dist().event_shape))

    exact_params = {
        k: (v.detach().clone().requires_grad_(True) if k in names else v)
        for k, v in row.params.items()
    }
    mean, var = row.moments(exact_params)
    exact_f = {"x": mean.sum(), "x^2": (var + mean**2).sum()}
    sample_f = {"x": s.sum(-1), "x^2": (s**2).sum(-1)}
    for key in ("x", "x^2"):
        per_draw = torch.autograd.grad(
            sample_f[key].sum(), [params[k] for k in names], retain_graph=True
        )
        exact = torch.autograd.grad(
            exact_f[key], [exact_params[k] for k in names], retain_graph=True, allow_unused=True
        )
        for name, g, e in zip(names, per_draw, exact, strict=True):
            e = torch.zeros_like(g[0]) if e is None else e  # E[f] does not depend on it
            se = g.std(0) / math.sqrt(N_DRAWS)
            _assert_z(g.mean(0), e, se, f"d E[{key}] / d {name}")


# --------------------------------------------------------------------------------------
# support and transforms
# --------------------------------------------------------------------------------------


def _free_coordinates(support, y: torch.Tensor) -> torch.Tensor:
    """The coordinates that determine a point of the support (the others follow from them).

    A simplex point is determined by all but its last coordinate, a correlation matrix and a
    correlation Cholesky factor by their strictly lower triangles, a positive-definite matrix
    and a Cholesky factor by their lower triangles.
    """
    if support is dist.constraints.simplex:
        return y[..., :-1]
    if support in (dist.constraints.corr_cholesky, dist.constraints.corr_matrix):
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n, offset=-1)
        return y[..., rows, cols]
    if support in (dist.constraints.positive_definite, dist.constraints.lower_cholesky):
        n = y.shape[-1]
        rows, cols = torch.tril_indices(n, n)
        return y[..., rows, cols]
    return y


@pytest.mark.parametrize("row", _params(TABLE, "transform", where=lambda r: not _is_discrete(r)))
def test_biject_to_support(row):
    d = row.dist()
    support = d.support
    tr = dist.biject_to(support)
    event = d.event_shape
    torch.manual_seed(0)

    # random unconstrained points map into the support and back
    unconstrained_shape = tr.inverse_shape((7,) + event)
    x = torch.randn(unconstrained_shape, dtype=F64) * 2
    y = tr(x)
    assert support.check(y).all()
    torch.testing.assert_close(tr.inv(y), x, rtol=1e-7, atol=1e-8)
    # draws map to unconstrained space and back
    draws = d.sample((7,))
    torch.testing.assert_close(tr(tr.inv(draws)), draws, rtol=1e-7, atol=1e-8)

    # log|det J| against autograd's Jacobian, for one point: the map goes from the flat
    # unconstrained vector to the free coordinates of the constrained value (for scalar
    # events, 3 independent elements: J is diagonal).
    x1 = x[0] if event else x[:3]
    log_det = tr.log_abs_det_jacobian(x1, tr(x1)).sum()

    def forward(flat):
        return _free_coordinates(support, tr(flat.reshape(x1.shape))).reshape(-1)

    jac = torch.autograd.functional.jacobian(forward, x1.reshape(-1))
    assert jac.shape[0] == jac.shape[1], f"Jacobian is {tuple(jac.shape)}, not square"
    torch.testing.assert_close(log_det, torch.linalg.slogdet(jac).logabsdet, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("row", _params(TABLE, where=_is_discrete))
def test_discrete_support(row):
    """Discrete families have no bijection to unconstrained space (HMC cannot sample them);
    their draws and reference points lie in the support and have finite log_prob."""
    d = row.dist()
    with pytest.raises(NotImplementedError):
        dist.biject_to(d.support)
    torch.manual_seed(0)
    draws = d.sample((200,))
    assert d.support.check(draws).all()
    assert torch.isfinite(d.log_prob(draws)).all()
    assert d.support.check(_points(row)).all()


# --------------------------------------------------------------------------------------
# expand, to_event, mask, pickling
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", _params(TABLE, "expand"))
def test_expand_to_event_mask(row):
    d = row.dist()
    torch.manual_seed(0)
    x = d.sample((2, 3))
    lp = d.log_prob(x)

    expanded = d.expand((2, 3))
    assert expanded.batch_shape == (2, 3)
    torch.testing.assert_close(expanded.log_prob(x), lp)
    assert expanded.sample().shape == (2, 3) + d.event_shape

    independent = expanded.to_event(1)
    assert independent.batch_shape == (2,)
    assert independent.event_shape == (3,) + d.event_shape
    torch.testing.assert_close(independent.log_prob(x), lp.sum(-1))

    mask = torch.tensor([[True, False, True], [False, True, True]])
    masked = expanded.mask(mask)
    masked_lp = masked.log_prob(x)
    assert (masked_lp[~mask] == 0).all()
    torch.testing.assert_close(masked_lp[mask], lp[mask])


@pytest.mark.parametrize("row", _params(TABLE))
def test_pickle(row):
    d = row.dist(validate_args=True)
    copy = pickle.loads(pickle.dumps(d))
    assert type(copy) is type(d)
    x = _points(row)
    torch.testing.assert_close(copy.log_prob(x), d.log_prob(x), rtol=0, atol=0)


# --------------------------------------------------------------------------------------
# invalid parameters
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("row", _params(TABLE, "invalid"))
def test_invalid_parameters(row):
    """With validation on, construction raises a ValueError naming parameter and constraint.

    ``validate_args=True`` is passed explicitly: torch's process-wide default is switched
    off by the first ``torch.compile`` call in the process (see docs/distributions.md).
    """
    assert row.invalid, "every row lists at least one invalid parameter set"
    for bad in row.invalid:
        with pytest.raises(ValueError) as info:
            row.build(bad.params, validate_args=True)
        message = str(info.value)
        assert bad.param in message, message
        assert bad.constraint in message, message


@pytest.mark.parametrize("row", _params(TABLE, "site_check"))
def test_invalid_parameters_site_check(row):
    """probtorch's eager site check (torch validation off, as when probtorch traces a model
    for inference) names the site, the parameter and the constraint, for every row."""
    for bad in row.invalid:
        if bad.site_check_reason is not None:
            # documented gap: building the distribution itself fails before any check
            with torch_validation(False), pytest.raises((RuntimeError, ValueError)):
                row.build(bad.params, validate_args=False)
            continue

        def model(bad=bad):
            value = row.dist().sample()
            pt.sample("x", row.build(bad.params, validate_args=False), obs=value)

        with torch_validation(False), pytest.raises(ValueError) as info:
            pt.handlers.trace(model).get_trace()
        message = str(info.value)
        assert "'x'" in message and bad.param in message, message
        assert bad.constraint in message, message


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("row", _params(TABLE, "compile_log_prob"))
def test_compile_log_prob(row):
    """log_prob compiles with fullgraph=True (no graph break) and equals eager.

    The distribution is built inside the compiled function from tensor parameters with
    validate_args=False, under torch's validation default off (as probtorch's compiled
    potentials run): some Pyro families build inner torch distributions without passing
    validate_args on.
    """
    x = _points(row)

    def log_prob(params, value):
        return row.build(params, validate_args=False).log_prob(value)

    compiled = _compile(log_prob)
    breaks = _graph_breaks()
    with torch_validation(False):
        actual = compiled(row.params, x)
        expected = log_prob(row.params, x)
    assert _graph_breaks() == breaks
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


def _sample_fn(row, n=16):
    method = "rsample" if _has_rsample(row) else "sample"

    def draw(params):
        return getattr(row.build(params, validate_args=False), method)((n,))

    return draw


@pytest.mark.slow
@pytest.mark.parametrize("row", _params(TABLE, where=lambda r: r.sampler_reason is None))
def test_compile_sample(row):
    """rsample (sample where there is none) compiles with fullgraph=True and, with Inductor's
    fallback_random (torch's own RNG kernels), gives the same draws as eager for a seed.

    Where the random streams still differ (``compiled_rng_reason``), the compiled draws'
    mean and variance are z-tested against the exact ones instead.
    """
    same_stream = row.compiled_rng_reason is None
    draw = _sample_fn(row, 16 if same_stream else N_DRAWS)
    compiled = _compile(draw)
    breaks = _graph_breaks()
    with torch._inductor.config.patch(fallback_random=True), torch_validation(False):
        torch.manual_seed(1)
        actual = compiled(row.params)
        torch.manual_seed(1)
        expected = draw(row.params)
    assert _graph_breaks() == breaks
    assert actual.shape == expected.shape
    if same_stream:
        torch.testing.assert_close(actual.to(F64), expected.to(F64), rtol=1e-10, atol=1e-12)
        return
    assert not torch.equal(actual, expected), "same stream now: clear compiled_rng_reason"
    s = _stat(row, actual, len(row.dist().event_shape))
    mean, var = (v.detach().reshape(-1) for v in row.moments(row.params))
    centered = s - s.mean(0)
    m2, m4 = (centered**2).mean(0), (centered**4).mean(0)
    _assert_z(s.mean(0), mean, (m2 / N_DRAWS).sqrt(), "compiled draws' mean")
    _assert_z(s.var(0), var, ((m4 - m2**2) / N_DRAWS).sqrt(), "compiled draws' variance")


@pytest.mark.slow
@pytest.mark.parametrize("row", _params(TABLE, where=lambda r: r.sampler_reason is not None))
def test_compile_sample_fails_as_documented(row):
    """The table says this sampler does not compile: check that it still does not (if it
    now does, move the row to test_compile_sample by clearing ``sampler_reason``)."""
    compiled = _compile(_sample_fn(row))
    with torch_validation(False), pytest.raises(torch._dynamo.exc.TorchDynamoException):
        compiled(row.params)
