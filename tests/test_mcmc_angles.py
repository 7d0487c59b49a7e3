"""NUTS on angles and directions: von Mises and torus sites as points of the plane, sphere
sites as points of space (probtorch.inference.angles), and a model that torch.compile
cannot capture run eagerly with a warning."""

import math
import warnings

import arviz as az
import pytest
import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import MCMC, NUTS, Potential
from probtorch.inference.angles import AngleFromPlane, UnitVectorFromSpace, unconstraining_transform

pytestmark = pytest.mark.usefixtures("float64")


def test_the_transforms_shapes_values_and_dispatch():
    angle = AngleFromPlane()
    y = torch.randn(5, 2, 2)  # five draws of a pair of angles (a torus site)
    theta = angle(y)
    assert theta.shape == (5, 2)
    assert torch.allclose(angle.inv(theta), y / y.norm(dim=-1, keepdim=True))
    assert torch.allclose(angle.log_abs_det_jacobian(y, theta), -0.5 * (y**2).sum(-1))
    assert angle.inverse_shape((5, 2)) == (5, 2, 2) and angle.forward_shape((5, 2, 2)) == (5, 2)
    sphere = UnitVectorFromSpace()
    v = sphere(torch.randn(4, 3))
    assert torch.allclose(v.norm(dim=-1), torch.ones(4))

    von_mises = dist.VonMises(torch.zeros(3), 1.0)
    for fn in (von_mises, von_mises.to_event(1), von_mises.expand([2, 3]), von_mises.mask(False)):
        assert isinstance(unconstraining_transform(fn), AngleFromPlane)
    torus = dist.SineBivariateVonMises(0.0, 0.0, 1.0, 1.0, 0.5)
    assert isinstance(unconstraining_transform(torus), AngleFromPlane)
    projected = dist.ProjectedNormal(torch.ones(3)).expand([2]).to_event(1)
    assert type(unconstraining_transform(projected)) is UnitVectorFromSpace
    von_mises_fisher = dist.VonMises3D(torch.tensor([0.0, 0.0, 2.0]))
    assert type(unconstraining_transform(von_mises_fisher)) is UnitVectorFromSpace
    # anything else: its support's bijection
    assert unconstraining_transform(dist.HalfNormal(1.0))(torch.tensor(0.0)) == 1.0


def test_a_family_without_a_mean_keeps_its_dtype():
    # VonMises3D has no mean: its float64 site started (and the potential ran) in float32,
    # and NUTS failed with "Index put requires the source and destination dtypes match"
    loc = torch.tensor([0.0, 0.0, 2.0], dtype=torch.float64)

    def model():
        pt.sample("v", dist.VonMises3D(loc))

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        potential = Potential(model, compile=False)
        value, grad = potential.value_and_grad(torch.randn(2, 3, dtype=torch.float64))
    finally:
        torch.set_default_dtype(previous)
    assert potential.dtype == value.dtype == grad.dtype == torch.float64


def test_a_density_computed_in_another_dtype_is_the_latent_values_dtype():
    """Pyro's SineBivariateVonMises builds its normalizer in torch's default dtype (float64
    in this module): the potential of its float32 site was float64, and NUTS failed with
    "Index put requires the source and destination dtypes match"."""
    potential = Potential(lambda: torus(torch.float32), compile=False)
    value, grad = potential.value_and_grad(torch.randn(2, potential.dim, dtype=torch.float32))
    assert potential.dtype == value.dtype == grad.dtype == potential(grad).dtype == torch.float32


CONCENTRATION = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)


def projected_normal():
    pt.sample("u", dist.ProjectedNormal(CONCENTRATION))


@pytest.mark.slow
def test_projected_normal_draws_match_its_own_sampler():
    """Each coordinate's mean within 4 Monte Carlo standard errors (reference sd over the
    bulk ESS) of 400,000 direct draws, its sd within 10%, R-hat < 1.01; unit length."""
    with torch.random.fork_rng():
        torch.manual_seed(1)
        reference = dist.ProjectedNormal(CONCENTRATION).sample((400_000,))
    mcmc = MCMC(NUTS(projected_normal), num_warmup=400, num_samples=1000, num_chains=4,
                progress_bar=False, seed=0)  # fmt: skip
    mcmc.run()
    draws = mcmc.get_samples(group_by_chain=True)["u"]
    assert torch.allclose(draws.norm(dim=-1), torch.ones(4, 1000))
    for i in range(3):
        chains = draws[..., i].numpy()
        ess = float(az.ess(chains, method="bulk"))
        assert ess > 800, f"u[{i}]: bulk ESS {ess:.0f}"
        assert float(az.rhat(chains)) < 1.01
        sd = float(reference[:, i].std())
        error = abs(chains.mean() - float(reference[:, i].mean()))
        assert error < 4 * sd / math.sqrt(ess), f"u[{i}]: {error / (sd / math.sqrt(ess)):.1f}"
        assert abs(chains.std() - sd) < 0.1 * sd
    assert int(mcmc.get_extra_fields()["diverging"].sum()) == 0


def torus(dtype=torch.float32):
    """Pyro's SineBivariateVonMises computes its normalizer with a number of series terms
    read from its concentrations (``.int()``): torch.compile cannot capture it."""
    pt.sample(
        "angles",
        dist.SineBivariateVonMises(*torch.tensor([3.0, -3.0, 2.0, 2.0, 0.5], dtype=dtype).unbind()),
    )


def _torus_run(compile, dtype=torch.float32):
    mcmc = MCMC(NUTS(torus, compile=compile), num_warmup=20, num_samples=20, num_chains=2,
                progress_bar=False, seed=3)  # fmt: skip
    mcmc.run(dtype)
    return mcmc.get_samples()["angles"]


def test_a_model_compile_cannot_capture_runs_eagerly_with_a_warning_and_the_same_draws():
    with pytest.warns(UserWarning) as caught:
        draws = _torus_run(True)
    said = [str(w.message) for w in caught]
    eager_notes = [m for m in said if "cannot capture the model" in m]
    assert len(eager_notes) == 1, said
    assert "sine_bivariate_von_mises.py:" in eager_notes[0]
    assert "test_mcmc_angles.py" in eager_notes[0]  # the model's line
    assert "compile=False" in eager_notes[0]
    assert not [m for m in said if "in-place NUTS chunk" in m]  # the eager note says it all
    assert [w.filename for w in caught if "cannot capture" in str(w.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eager = _torus_run(False)
    assert torch.equal(draws, eager)
    assert draws.shape == (40, 2) and float(draws.abs().max()) <= math.pi


def _fixed_step_torus_run(**kernel_options):
    kernel = NUTS(torus, step_size=0.3, adapt_step_size=False, adapt_mass_matrix=False,
                  **kernel_options)  # fmt: skip
    mcmc = MCMC(kernel, num_warmup=0, num_samples=30, num_chains=2, progress_bar=False, seed=3)
    mcmc.run(torch.float64)
    return mcmc.get_samples()["angles"]


def test_the_split_executor_runs_an_uncompilable_gradient_eagerly_inside_its_sampler(
    tmp_path, monkeypatch
):
    """make_fx cannot trace the torus's gradient either: the split executor says why and
    where, and runs it eagerly inside the compiled sampler (it crashed before)."""
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning) as caught:
        draws = _fixed_step_torus_run(executor="split")
    said = [str(w.message) for w in caught]
    notes = [m for m in said if "gradient could not be compiled" in m]
    assert len(notes) == 1, said
    assert "sine_bivariate_von_mises.py:" in notes[0] and "test_mcmc_angles.py" in notes[0]
    assert "a Python value read from a tensor" in notes[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eager = _fixed_step_torus_run(compile=False)
    # the same draws up to rounding, with a fixed step size (under adaptation roundings
    # grow from transition to transition: 1e-6 after 40 warmup iterations here)
    torch.testing.assert_close(draws, eager, rtol=0, atol=1e-10)


def test_a_potential_compile_cannot_capture_evaluates_eagerly_with_a_warning():
    compiled, eager = Potential(torus, compile=True), Potential(torus, compile=False)
    z = torch.randn(3, compiled.dim, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="evaluating the potential eagerly") as caught:
        value, grad = compiled.value_and_grad(z)
    assert len(caught) == 1 and caught[0].filename == __file__
    assert "sine_bivariate_von_mises.py:" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert torch.equal(compiled(z), eager(z))
    want_value, want_grad = eager.value_and_grad(z)
    assert torch.equal(value, want_value) and torch.equal(grad, want_grad)


def test_the_lean_executor_names_what_it_could_not_trace(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTORCH_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning) as caught:
        draws = _fixed_step_torus_run(executor="lean")
    notes = [str(w.message) for w in caught if "lean executor could not be built" in str(w.message)]
    assert len(notes) == 1, [str(w.message) for w in caught]
    assert "a Python value read from a tensor" in notes[0]  # not make_fx's paragraph
    assert "sine_bivariate_von_mises.py:" in notes[0] and "test_mcmc_angles.py" in notes[0]
    assert draws.shape == (60, 2)
