"""The posteriordb models' log densities agree with ``check_models.py`` at reference draws.

``check_models.py`` gives, per posterior, ``logp(U)``: the log posterior density of its own
unconstrained coordinates ``U``, Jacobian included, up to an additive constant. Two exact
comparisons are made at a few reference draws, each up to a constant (differences between
points must agree to rtol 1e-8):

1. the model's constrained log joint (``trace(substitute(model)).log_prob_sum()``) against
   ``logp(U)`` minus check_models' own Jacobian terms (``REFERENCE_LOG_JACOBIAN``);
2. the potential, ``-potential(z) = log joint + log|det d theta/dz|`` at the reference draw
   mapped to our unconstrained ``z``, against ``logp(U)`` itself. Our ``z`` and their ``U``
   are the same coordinates (log for positive, logit for (0, 1), (x1, log(x2 - x1)) for
   ordered, (y/(1 - alpha1)) -> logit for garch's dependent bound, stick-breaking = logit
   for a 2-simplex) except where ``COORDINATE_CHANGE`` says otherwise.

Where our latent sites are not the draws' quantities (non-centred eight schools samples
``theta_trans``, not ``theta``) the model's density differs by that change of variables:
``REPARAMETRIZATION``.

All 14 posteriors are written and checked; none was left out.
"""

import numpy as np
import pytest
import torch
from posteriordb_models import NAMES, latent_values, make, posteriordb_module

from probtorch import handlers
from probtorch.distributions import biject_to
from probtorch.inference.potential import Potential

# (chain, draw) of the reference draws to evaluate at
POINTS = [(0, 0), (1, 137), (3, 500), (6, 733), (9, 999)]


def _check_models_builders(check):
    """check_models.py's (names, to_u, logp) per posterior, as in its ``main``."""
    return {
        "eight_schools-eight_schools_noncentered": lambda d: check.eight_schools(d, "nc"),
        "eight_schools-eight_schools_centered": lambda d: check.eight_schools(d, "c"),
        "dogs-dogs": check.dogs,
        "kidiq-kidscore_interaction": check.kidiq_interaction,
        "arK-arK": check.arK,
        "gp_pois_regr-gp_pois_regr": check.gp_pois_regr,
        "gp_pois_regr-gp_regr": check.gp_regr,
        "diamonds-diamonds": check.diamonds,
        "mesquite-mesquite": check.mesquite,
        "nes2000-nes": check.nes,
        "garch-garch11": check.garch,
        "low_dim_gauss_mix-low_dim_gauss_mix": check.low_dim_gauss_mix,
        "hmm_example-hmm_example": check.hmm_example,
        "kilpisjarvi_mod-kilpisjarvi": check.kilpisjarvi,
    }


def _log_sigma(D):
    return np.log(D["sigma"])


def _garch_log_jacobian(D):
    a0, a1 = D["alpha0"], D["alpha1"]
    s = D["beta1"] / (1 - a1)
    return np.log(a0) + np.log(a1) + 2 * np.log1p(-a1) + np.log(s) + np.log1p(-s)


# The Jacobian terms check_models.py adds to the constrained log density, in its coordinates.
REFERENCE_LOG_JACOBIAN = {
    "eight_schools-eight_schools_noncentered": lambda D: np.log(D["tau"]),
    "eight_schools-eight_schools_centered": lambda D: np.log(D["tau"]),
    "dogs-dogs": lambda D: 0.0 * D["beta[1]"],
    "kidiq-kidscore_interaction": _log_sigma,
    "arK-arK": _log_sigma,
    "gp_pois_regr-gp_pois_regr": lambda D: np.log(D["rho"]) + np.log(D["alpha"]),
    "gp_pois_regr-gp_regr": lambda D: np.log(D["rho"] * D["alpha"] * D["sigma"]),
    "diamonds-diamonds": _log_sigma,
    "mesquite-mesquite": _log_sigma,
    "nes2000-nes": _log_sigma,
    "garch-garch11": _garch_log_jacobian,
    "low_dim_gauss_mix-low_dim_gauss_mix": lambda D: (
        np.log(D["mu[2]"] - D["mu[1]"])
        + np.log(D["sigma[1]"] * D["sigma[2]"])
        + np.log(D["theta"])
        + np.log1p(-D["theta"])
    ),
    "hmm_example-hmm_example": lambda D: (
        np.log(D["theta1[1]"] * D["theta1[2]"] * D["theta2[1]"] * D["theta2[2]"])
        + np.log(D["mu[1]"])
        + np.log(D["mu[2]"] - D["mu[1]"])
    ),
    "kilpisjarvi_mod-kilpisjarvi": _log_sigma,
}

# Our log joint minus the draws' log density where our latent sites are other quantities:
# theta = mu + tau * theta_trans, so p(theta_trans) = p(theta) * tau^8.
REPARAMETRIZATION = {
    "eight_schools-eight_schools_noncentered": lambda D: 8 * np.log(D["tau"]),
}

# Our log|det d theta/dz| minus check_models' where the unconstrained coordinates differ.
# hmm_example's mu (positive_ordered): ours is exp of an ordered vector,
# z = (log mu1, log(log mu2 - log mu1)), |J| = mu1 mu2 (log mu2 - log mu1); check_models'
# is U = (log mu1, log(mu2 - mu1)), |J| = mu1 (mu2 - mu1).
COORDINATE_CHANGE = {
    "hmm_example-hmm_example": lambda D: (
        np.log(D["mu[2]"] * (np.log(D["mu[2]"]) - np.log(D["mu[1]"])))
        - np.log(D["mu[2]"] - D["mu[1]"])
    ),
}


@pytest.fixture
def posteriordb(shared_dir):
    return posteriordb_module("load"), posteriordb_module("check_models")


def _reference_points(load, name):
    draws = load.load_reference_draws(name)
    chains, draw = zip(*POINTS)
    return {k: v[list(chains), list(draw)] for k, v in draws.items()}


def _single(values, i):
    return {k: v[i] for k, v in values.items()}


def _trace(model, args, kwargs, values):
    return handlers.trace(handlers.substitute(model, data=values)).get_trace(*args, **kwargs)


def _unconstrained(potential, trace):
    """z at a trace's latent values, each through the bijection of its support *there*.

    ``Potential.pack`` takes the bijections from its prototype trace, which is wrong for a
    support that depends on another latent (garch's beta1 < 1 - alpha1).
    """
    parts = {name: biject_to(trace[name].fn.support).inv(trace[name].value)
             for name in potential.site_names}  # fmt: skip
    return potential.pack(parts, constrained=False)


def _assert_equal_up_to_constant(ours, ref):
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert np.all(np.isfinite(ours)) and np.all(np.isfinite(ref))
    np.testing.assert_allclose(ours - ours[0], ref - ref[0], rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_log_density_matches_check_models(name, posteriordb, float64):
    load, check = posteriordb
    model, args, kwargs, to_reference = make(name)
    _, to_u, logp = _check_models_builders(check)[name](load.load_data(name))
    D = _reference_points(load, name)
    ref_logp = logp(to_u(D))
    values = latent_values(name, D)

    potential = Potential(model, args, kwargs, compile=False)
    assert sorted(potential.site_names) == sorted(values)
    traces = [_trace(model, args, kwargs, _single(values, i)) for i in range(len(POINTS))]

    # 1. constrained log joint vs check_models' density without its Jacobian
    joint = np.array([float(tr.log_prob_sum()) for tr in traces])
    ref_joint = ref_logp - REFERENCE_LOG_JACOBIAN[name](D)
    ref_joint = ref_joint + REPARAMETRIZATION.get(name, lambda D: 0.0)(D)
    _assert_equal_up_to_constant(joint, ref_joint)

    # 2. the potential at the same points, in (nearly) check_models' coordinates
    z = torch.stack([_unconstrained(potential, tr) for tr in traces])
    ours = -potential(z).numpy()
    ref = ref_logp + REPARAMETRIZATION.get(name, lambda D: 0.0)(D)
    ref = ref + COORDINATE_CHANGE.get(name, lambda D: 0.0)(D)
    _assert_equal_up_to_constant(ours, ref)

    # the draws come back out: constrain(z) and to_reference invert latent_values
    back = to_reference(potential.constrain(z))
    for draw_name, column in D.items():
        np.testing.assert_allclose(back[draw_name], column, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_pack_matches_bijections_unless_support_depends_on_latents(name, posteriordb, float64):
    load, _ = posteriordb
    model, args, kwargs, _ = make(name)
    values = latent_values(name, _reference_points(load, name))
    potential = Potential(model, args, kwargs, compile=False)
    packed = potential.pack(values)
    by_trace = torch.stack(
        [_unconstrained(potential, _trace(model, args, kwargs, _single(values, i)))
         for i in range(len(POINTS))]
    )  # fmt: skip
    if name == "garch-garch11":  # beta1's bound 1 - alpha1 is taken from the prototype trace
        assert not torch.allclose(packed, by_trace)
    else:
        torch.testing.assert_close(packed, by_trace, rtol=1e-12, atol=1e-12)
