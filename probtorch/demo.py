"""``make demo``: fit eight schools with compiled NUTS and print the posterior summary.

Eight schools (Rubin 1981): the estimated effects of coaching programs in eight schools
and their standard errors; a hierarchical normal model, non-centered by reparameterization.
Four chains run vectorized in one compiled kernel: 1000 warmup and 1000 draws each.
Run with ``python -m probtorch.demo`` (``PROBTORCH_COMPILE=0`` runs it eagerly).
"""

from __future__ import annotations

import time

import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference import MCMC, NUTS
from probtorch.reparam import LocScaleReparam

SIGMA = [15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0]
Y = [28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0]


def eight_schools(sigma, y=None):
    mu = pt.sample("mu", dist.Normal(0.0, 5.0))
    tau = pt.sample("tau", dist.HalfCauchy(5.0))
    with pt.plate("school", len(sigma)):
        theta = pt.sample("theta", dist.Normal(mu, tau))
        pt.sample("y", dist.Normal(theta, sigma), obs=y)


def main(num_warmup: int = 1000, num_samples: int = 1000) -> MCMC:
    torch.set_default_dtype(torch.float64)
    sigma, y = torch.tensor(SIGMA), torch.tensor(Y)
    model = pt.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(0.0)})
    start = time.perf_counter()
    mcmc = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples, num_chains=4, seed=0)
    mcmc.run(sigma, y=y)
    elapsed = time.perf_counter() - start
    print("\nprobtorch demo: eight schools, non-centered, NUTS, 4 vectorized chains")
    mcmc.print_summary()
    print(
        f"done in {elapsed:.1f} s including compilation; compiled={mcmc.kernel.potential.compiled}"
    )
    return mcmc


if __name__ == "__main__":
    main()
