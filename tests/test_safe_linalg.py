"""A failed factorization inside a potential is a NaN (a divergence in NUTS), not a crash."""

import numpy as np
import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import MCMC, NUTS, init_to_value
from probtorch.inference.compile import count_compiles
from probtorch.inference.potential import Potential
from probtorch.inference.safe_linalg import nan_on_failure

pytestmark = pytest.mark.usefixtures("float64")


def _batch():
    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]])  # indefinite
    singular = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    return good, bad, singular


def test_cholesky_is_nan_only_where_it_fails():
    good, bad, singular = _batch()
    with nan_on_failure():
        factor = torch.linalg.cholesky(torch.stack([good, bad, good]))
        upper = torch.linalg.cholesky(good, upper=True)
    torch.testing.assert_close(factor[0], torch.linalg.cholesky(good), rtol=0, atol=0)
    torch.testing.assert_close(factor[2], torch.linalg.cholesky(good), rtol=0, atol=0)
    assert factor[1].isnan().all()
    torch.testing.assert_close(upper, torch.linalg.cholesky(good, upper=True), rtol=0, atol=0)
    with pytest.raises(torch.linalg.LinAlgError):  # outside the context torch raises as usual
        torch.linalg.cholesky(bad)


def test_inv_and_solve_are_nan_only_where_they_fail():
    good, _, singular = _batch()
    matrices = torch.stack([good, singular])
    with nan_on_failure():
        inverse = torch.linalg.inv(matrices)
        vector = torch.linalg.solve(matrices, torch.ones(2, 2))  # batch of vectors
        matrix = torch.linalg.solve(matrices, torch.ones(2, 2, 3))  # batch of matrices
    torch.testing.assert_close(inverse[0], torch.linalg.inv(good))
    torch.testing.assert_close(vector[0], torch.linalg.solve(good, torch.ones(2)))
    torch.testing.assert_close(matrix[0], torch.linalg.solve(good, torch.ones(2, 3)))
    for result in (inverse, vector, matrix):
        assert result[1].isnan().all()


def correlation_model(y):
    """The covariance is positive definite only for |rho| < 1: proposals outside fail."""
    rho = pt.sample("rho", dist.Uniform(-1.5, 1.5))
    one = torch.ones(())
    cov = torch.stack([torch.stack([one, rho]), torch.stack([rho, one])])
    with pt.plate("n", y.shape[0]):
        pt.sample("y", dist.MultivariateNormal(torch.zeros(2), covariance_matrix=cov), obs=y)


def _data(n=30, rho=0.6, seed=0):
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, rho], [rho, 1.0]])
    return torch.as_tensor(rng.multivariate_normal(np.zeros(2), cov, size=n))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_potential_is_nan_for_a_non_positive_definite_covariance(compiled):
    potential = Potential(correlation_model, (_data(),), compile=compiled)
    # rho = 1.5 * tanh-like map of z: z = 0 is rho = 0 (fine), z = 4 is rho ~ 1.47 (fails)
    z = torch.tensor([[0.0], [4.0], [-0.5]])
    with count_compiles() as stats:
        value, grad = potential.value_and_grad(z)
    assert torch.isfinite(value[[0, 2]]).all() and torch.isfinite(grad[[0, 2]]).all()
    assert value[1].isnan()
    if compiled:
        assert stats.graph_breaks == 0
        eager = Potential(correlation_model, (_data(),), compile=False)
        eager_value, eager_grad = eager.value_and_grad(z)
        torch.testing.assert_close(value, eager_value, equal_nan=True)
        torch.testing.assert_close(grad[[0, 2]], eager_grad[[0, 2]])


def test_eager_evaluations_of_a_model_that_factorizes_stay_guarded():
    """The first eager evaluation runs under nan_on_failure and notes that the model
    factorizes: every later one runs under it, as traced code does, with the values and
    gradients of evaluations guarded from the start."""
    potential = Potential(correlation_model, (_data(),), compile=False)
    guarded = Potential(correlation_model, (_data(),), compile=False)
    guarded._linalg_guard.guarded = True
    for z in (torch.tensor([[0.0], [-0.5]]), torch.tensor([[0.3], [4.0]])):
        value, grad = potential.value_and_grad(z)
        assert potential._linalg_guard.guarded is True
        expected_value, expected_grad = guarded.value_and_grad(z)
        torch.testing.assert_close(value, expected_value, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=0, equal_nan=True)
    assert value[0].isfinite() and value[1].isnan()


def test_a_model_that_catches_a_failed_factorization_keeps_its_chains_apart():
    """A model that catches LinAlgError itself (jitter added): eagerly, unguarded, one
    chain's failure raised for the whole vmapped batch and sent every chain into the
    fallback; guarded, each chain is its own, as compiled (the fallback never runs)."""
    y = torch.tensor([0.5, -0.3, 1.2, 0.1])

    def jittered(y):
        rho = pt.sample("rho", dist.Normal(0.0, 1.0))
        K = torch.eye(4) + rho * (torch.ones(4, 4) - torch.eye(4))
        try:
            L = torch.linalg.cholesky(K)
        except torch.linalg.LinAlgError:
            L = torch.linalg.cholesky(K + 10 * torch.eye(4))
        pt.sample("y", dist.MultivariateNormal(torch.zeros(4), scale_tril=L), obs=y)

    potential = Potential(jittered, (y,), compile=False)
    alone = potential.value_and_grad(torch.tensor([[0.0]]))
    together = potential.value_and_grad(torch.tensor([[0.0], [3.0]]))
    torch.testing.assert_close(together[0][:1], alone[0], rtol=0, atol=0)
    torch.testing.assert_close(together[1][:1], alone[1], rtol=0, atol=0)
    assert together[0][1].isnan()


def test_a_model_that_factorizes_only_later_is_guarded_from_its_first_failure_on():
    """A model that did not factorize at its first evaluation runs unguarded; where a
    factorization raises later (another branch), that evaluation runs again under the
    mode, and every later one."""
    branch = {"factorize": False}

    def model():
        rho = pt.sample("rho", dist.Uniform(-1.5, 1.5))
        if branch["factorize"]:
            one = torch.ones(())
            cov = torch.stack([torch.stack([one, rho]), torch.stack([rho, one])])
            pt.factor("f", torch.linalg.cholesky(cov).diagonal().log().sum())

    potential = Potential(model, compile=False)
    z = torch.tensor([[0.0], [4.0]])
    potential.value_and_grad(z)
    assert potential._linalg_guard.guarded is False
    branch["factorize"] = True
    value, _ = potential.value_and_grad(z)
    assert potential._linalg_guard.guarded is True
    assert value[0].isfinite() and value[1].isnan()


@pytest.mark.slow
def test_nuts_counts_failed_choleskys_as_divergences():
    """The run completes; every draw is inside the positive-definite region."""
    y = _data()
    mcmc = MCMC(
        NUTS(correlation_model, init_strategy=init_to_value(values={"rho": torch.tensor(0.0)})),
        num_warmup=200,
        num_samples=300,
        num_chains=2,
        seed=1,
        progress_bar=False,
    )
    mcmc.run(y)
    rho = mcmc.get_samples()["rho"]
    assert rho.shape == (600,)
    assert (rho.abs() < 1).all()
    # the exact posterior is close to the sample correlation, far from the boundary
    sample_corr = float(np.corrcoef(y.numpy().T)[0, 1])
    assert abs(float(rho.mean()) - sample_corr) < 0.15
