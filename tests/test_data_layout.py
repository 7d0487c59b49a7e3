"""Data matrices used only in matrix-vector or narrow matrix products are passed with the long
side contiguous."""

import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import SVI, Trace_ELBO
from probtorch.inference.autoguide import AutoNormal
from probtorch.inference.compile import count_compiles
from probtorch.inference.data_layout import DataLayout


@pytest.fixture(autouse=True)
def _float64():
    torch.set_default_dtype(torch.float64)


def _tall(n=300, d=6, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize(
    "fn, chosen",
    [
        (lambda X, b: X @ b, True),
        (lambda X, b: (X @ b) + (X.t() @ torch.ones(X.shape[0], dtype=X.dtype)).sum(), True),
        (lambda X, b: X[torch.arange(5)] @ b, False),  # a minibatch gathered from its rows
        (lambda X, b: (X @ b).sum() + X.sum(), False),  # also read elementwise
        (lambda X, b: X[:, :3] @ b[:3], False),  # a part of it
        (lambda X, b: X @ torch.stack([b, b], -1), True),  # one vector per chain
        (lambda X, b: torch.stack([b, b]) @ X.t(), True),  # the same, transposed
        (lambda X, b: X @ b.unsqueeze(-1).expand(6, 17), False),  # a wide product
        (lambda X, b: b.expand(17, 6) @ X.t(), False),
        (lambda X, b: b * 2, False),  # not read at all
    ],
)
def test_find_chooses_matrices_used_only_in_matrix_vector_and_narrow_products(fn, chosen):
    X, b = _tall(), torch.ones(6, dtype=torch.float64)
    layout = DataLayout.find(fn, (X, b), {})
    assert layout.keys == ((("arg", 0),) if chosen else ())


def test_find_leaves_fast_square_and_small_matrices_alone():
    b = torch.ones(6, dtype=torch.float64)
    column_major = _tall().t().contiguous().t()
    wide = _tall(6, 300)
    assert DataLayout.find(lambda X, b: X @ b, (column_major, b), {}).keys == ()
    assert DataLayout.find(lambda X, b: X @ b[:1].expand(300), (wide, b), {}).keys == ()
    assert DataLayout.find(lambda X, b: X @ b, (_tall(6, 6), b), {}).keys == ()
    assert DataLayout.find(lambda X, b: X @ b[:1], (_tall(300, 1), b), {}).keys == ()
    assert DataLayout.find(lambda b, X: X @ b, (b,), {"X": _tall()}).keys == (("kwarg", "X"),)


def test_find_keeps_the_random_stream_and_survives_errors():
    X, b = _tall(), torch.ones(6, dtype=torch.float64)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    DataLayout.find(lambda X, b: X @ (b + torch.rand(6, dtype=X.dtype)), (X, b), {})
    assert torch.equal(torch.rand(3), expected)

    def broken(X, b):
        raise RuntimeError("model error")

    assert DataLayout.find(broken, (X, b), {}).keys == ()


def test_apply_copies_once_and_again_after_an_in_place_change():
    X, b = _tall(), torch.ones(6, dtype=torch.float64)
    layout = DataLayout.find(lambda X, b: X @ b, (X, b), {})
    (Xc, b2), _ = layout.apply((X, b), {})
    assert b2 is b and Xc is not X and torch.equal(Xc, X) and Xc.stride() == (1, 300)
    assert layout.apply((X, b), {})[0][0] is Xc  # reused
    X[0, 0] = 5.0
    Xd = layout.apply((X, b), {})[0][0]
    assert Xd is not Xc and torch.equal(Xd, X)
    Y = _tall(seed=1)
    assert torch.equal(layout.apply((Y, b), {})[0][0], Y)


def _logreg_data(n=400, d=5):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    beta = torch.randn(d, generator=g, dtype=torch.float64)
    y = torch.bernoulli(torch.sigmoid(X @ beta), generator=g)
    return X, y


def logreg(X, y):
    beta = pt.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with pt.plate("n", X.shape[0]):
        pt.sample("y", dist.Bernoulli(logits=X @ beta), obs=y)


def _svi(compile, layout=True):
    svi = SVI(logreg, AutoNormal(logreg), pt.optim.Adam(lr=0.05), Trace_ELBO(), seed=2,
              compile=compile, steps_per_call=3)  # fmt: skip
    if not layout:
        svi._data_layout = DataLayout()
    return svi


def test_svi_passes_a_regression_design_column_major_with_the_same_results():
    X, y = _logreg_data()
    compiled, eager, plain = _svi(True), _svi(False), _svi(False, layout=False)
    with count_compiles() as stats:
        r1 = compiled.run(9, X, y, progress_bar=False)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    assert compiled._data_layout.keys == (("arg", 0),)
    assert X.stride() == (5, 1)  # the caller's tensor is left as it was
    r2 = eager.run(9, X, y, progress_bar=False)
    r3 = plain.run(9, X, y, progress_bar=False)
    torch.testing.assert_close(r1.losses, r2.losses, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(r1.losses, r3.losses, rtol=1e-10, atol=1e-10)
    with count_compiles() as later, torch.compiler.set_stance("fail_on_recompile"):
        compiled.run(6, X + 0.0, y, progress_bar=False)  # new data, same layout: no recompile
    assert later.graphs == 0


def test_potential_lays_out_a_regression_design_for_its_chains_with_the_same_gradient():
    from probtorch.inference.potential import Potential

    X, y = _logreg_data()
    potential = Potential(logreg, (X, y), compile=False)
    assert potential.model_args[0] is X and X.stride() == (5, 1)  # the caller's, unchanged
    assert potential._args[0].stride() == (1, 400) and torch.equal(potential._args[0], X)
    z = torch.randn(3, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    value, grad = potential.value_and_grad(z)
    logits = z @ X.T  # by hand: Normal(0, 1) prior, Bernoulli likelihood
    expected = -(
        torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1)
        + torch.distributions.Bernoulli(logits=logits).log_prob(y).sum(-1)
    )
    expected_grad = z - (y - torch.sigmoid(logits)) @ X
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-10)


def test_nuts_on_a_laid_out_design_compiled_equals_eager_and_continues_without_compiling():
    from probtorch.inference import MCMC, NUTS

    X, y = _logreg_data()

    def fit(compile):
        mcmc = MCMC(NUTS(logreg, compile=compile), num_warmup=30, num_samples=20,
                    num_chains=2, progress_bar=False, seed=5)  # fmt: skip
        mcmc.run(X, y)
        return mcmc

    compiled, eager = fit(True), fit(False)
    assert compiled.kernel.potential._args[0].stride() == (1, 400)
    torch.testing.assert_close(
        compiled.get_samples()["beta"], eager.get_samples()["beta"], rtol=1e-8, atol=1e-8
    )
    with count_compiles() as later:
        compiled.run(X, y)  # the same arguments: continued, nothing new to compile
    assert later.graphs == 0 and compiled.get_samples()["beta"].shape == (40, 5)


def test_a_tensor_passed_twice_gets_one_copy():
    X, b = _tall(), torch.ones(6, dtype=torch.float64)
    layout = DataLayout.find(lambda A, B, b: A @ b + B @ b, (X, X, b), {})
    assert layout.keys == (("arg", 0), ("arg", 1))
    (first, second, _), _ = layout.apply((X, X, b), {})
    assert first is second and first.stride() == (1, 300)


def test_nuts_draws_with_and_without_the_layout_agree(monkeypatch):
    from probtorch.inference import MCMC, NUTS

    X, y = _logreg_data()

    def fit():
        mcmc = MCMC(NUTS(logreg, compile=False), num_warmup=30, num_samples=20,
                    num_chains=2, progress_bar=False, seed=5)  # fmt: skip
        mcmc.run(X, y)
        return mcmc

    laid_out = fit()
    monkeypatch.setattr(DataLayout, "find", classmethod(lambda cls, *a: cls()))
    plain = fit()
    assert plain.kernel.potential._args[0] is X
    torch.testing.assert_close(
        laid_out.get_samples()["beta"], plain.get_samples()["beta"], rtol=1e-8, atol=1e-8
    )


def test_data_changed_in_place_is_not_continued_from_the_old_copy():
    from probtorch.inference import MCMC, NUTS

    X, y = _logreg_data()
    mcmc = MCMC(NUTS(logreg, compile=False), num_warmup=20, num_samples=10,
                num_chains=2, progress_bar=False, seed=1)  # fmt: skip
    mcmc.run(X, y)
    first = mcmc.kernel.potential
    assert first.arguments_unchanged()
    mcmc.run(X, y)  # the same data: continued with the same potential
    assert mcmc.kernel.potential is first
    X.mul_(0.0)  # the design changed in place: the copy is stale
    assert not first.arguments_unchanged()
    mcmc.run(X, y)
    assert mcmc.kernel.potential is not first
    assert torch.equal(mcmc.kernel.potential._args[0], torch.zeros_like(X))
