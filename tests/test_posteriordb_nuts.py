"""NUTS on posteriordb posteriors, checked against the reference draws (slow).

Each covered posterior runs ``MCMC(NUTS(model, **options), num_warmup=500,
num_samples=500, num_chains=4, seed=0)`` with the reference's Stan controls
(``adapt_delta`` -> ``target_accept_prob``, ``max_treedepth`` -> ``max_tree_depth``; see
``posteriordb_models.nuts_kwargs``). For every parameter (posteriordb draw name):

- mean: ``|z| < 5`` with ``z = (our mean - reference mean) / (reference sd / sqrt(ESS))``,
  ESS our bulk ESS (ArviZ). The reference's own MCSE (about sd / 100) is small next to ours.
- sd: within 15% of the reference sd.

Covered: 13 of the 14 posteriors in tests/posteriordb_models.py (all 14 have their log
densities checked against posteriordb in tests/test_posteriordb_models.py). Left out here:
LEFT_OUT below says why for each.

Runtimes measured 2026-11-30 (seconds, compile included; 4 chains, 500 + 500; the 2-core
machine under load, one torch thread): arK 42, mesquite 32, hmm_example 29, kidiq 28,
dogs 20, eight_schools_centered 21, garch11 19, eight_schools_noncentered 18, nes 18,
gp_regr 13, low_dim_gauss_mix 12; about 250 s in all. Added 2026-12-04 (they took 219 and
1333 s on the sampler of 2026-11-30): gp_pois_regr 22, kilpisjarvi 23.
"""

import numpy as np
import pytest
from posteriordb_models import make, nuts_kwargs, posteriordb_module

from probtorch.inference import MCMC, NUTS

NUM_WARMUP = NUM_SAMPLES = 500
NUM_CHAINS = 4
Z_MAX = 5.0
SD_RTOL = 0.15

# posterior -> NUTS options beyond the reference's controls
CASES = {
    "arK-arK": {},
    "dogs-dogs": {},
    "eight_schools-eight_schools_centered": {},  # divergences expected (the funnel), as in Stan
    "eight_schools-eight_schools_noncentered": {},
    "garch-garch11": {},
    "gp_pois_regr-gp_pois_regr": {},
    "gp_pois_regr-gp_regr": {},
    "hmm_example-hmm_example": {},
    "kidiq-kidscore_interaction": {},
    "kilpisjarvi_mod-kilpisjarvi": {},
    "low_dim_gauss_mix-low_dim_gauss_mix": {},
    "mesquite-mesquite": {},
    "nes2000-nes": {},
}


# Left out of CI, checked by hand with the same settings (2026-12-04, /tmp script running
# this module's comparison; one core shared with other work):
LEFT_OUT = {
    "diamonds-diamonds": "passes (every parameter's mean and sd, 0 divergences) but took "
    "468 s: 26 strongly correlated regression coefficients under a diagonal metric make "
    "trees of 2179 leapfrog steps on average (the reference's max_treedepth allows them)",
}


def test_every_posterior_is_covered_or_listed():
    from posteriordb_models import NAMES

    assert set(CASES) | set(LEFT_OUT) == set(NAMES)
    assert not set(CASES) & set(LEFT_OUT)


def _compare(draws: dict, reference: dict) -> list[str]:
    """Failures of the mean and sd checks, one line per parameter."""
    import arviz as az

    failures = []
    for param, (ref_mean, ref_sd) in reference.items():
        x = np.asarray(draws[param])  # (chains, draws)
        ess = float(az.ess(x, method="bulk"))
        z = (x.mean() - ref_mean) / (ref_sd / np.sqrt(ess))
        sd_ratio = x.std(ddof=1) / ref_sd
        if not (abs(z) < Z_MAX and abs(sd_ratio - 1) < SD_RTOL):
            failures.append(
                f"{param}: mean {x.mean():.5g} vs {ref_mean:.5g} (z = {z:.2f}, ESS {ess:.0f}), "
                f"sd {x.std(ddof=1):.5g} vs {ref_sd:.5g} (ratio {sd_ratio:.3f})"
            )
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_nuts_matches_reference_draws(name, shared_dir, float64):
    model, args, kwargs, to_reference = make(name)
    kernel = NUTS(model, **nuts_kwargs(name), **CASES[name])
    mcmc = MCMC(
        kernel,
        num_warmup=NUM_WARMUP,
        num_samples=NUM_SAMPLES,
        num_chains=NUM_CHAINS,
        seed=0,
        progress_bar=False,
    )
    mcmc.run(*args, **kwargs)
    draws = to_reference(mcmc.get_samples(group_by_chain=True))
    reference = posteriordb_module("load").summary(name)
    assert set(draws) == set(reference)
    failures = _compare(draws, reference)
    assert not failures, f"{name}:\n" + "\n".join(failures)
