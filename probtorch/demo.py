"""``make demo``: fit a real model end to end and print a posterior summary.

The data: the 23 Space Shuttle launches before Challenger, launch temperature and whether
an O-ring showed damage (Dalal, Fowlkes and Hoadley, 1989). The model: Bayesian logistic
regression on temperature, with the probability of damage at 31 F (the Challenger launch)
as a deterministic site.

Until the NUTS engine lands, the fit is a Laplace approximation: the posterior mode of the
compiled potential in unconstrained space (L-BFGS on the compiled gradient), a Gaussian
with the inverse Hessian there as covariance, and 4000 draws pushed back through the
model. Run with ``python -m probtorch.demo``.
"""

from __future__ import annotations

import time

import torch

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference.potential import initialize_model

TEMPERATURE_F = [
    66,
    70,
    69,
    68,
    67,
    72,
    73,
    70,
    57,
    63,
    70,
    78,
    67,
    53,
    67,
    75,
    70,
    81,
    76,
    79,
    75,
    76,
    58,
]
DAMAGE = [0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1]


def challenger(temperature, damage=None):
    """Logistic regression of O-ring damage on (standardized) launch temperature."""
    alpha = pt.sample("alpha", dist.Normal(0.0, 5.0))
    beta = pt.sample("beta", dist.Normal(0.0, 5.0))
    x = (temperature - 70.0) / 7.0
    with pt.plate("launch", len(temperature)):
        pt.sample("damage", dist.Bernoulli(logits=alpha + beta * x), obs=damage)
    pt.deterministic("p_damage_31F", torch.sigmoid(alpha + beta * (31.0 - 70.0) / 7.0))


def laplace_fit(potential, z0, steps=200):
    """Posterior mode (L-BFGS on the compiled potential) and the Hessian there."""
    z = z0[:1].clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([z], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        value, grad = potential.value_and_grad(z.detach())
        z.grad = grad
        return value.sum()

    optimizer.step(closure)
    mode = z.detach()[0]
    hessian = torch.func.hessian(lambda v: potential._single_potential(v))(mode)
    return mode, hessian


def summarize(draws: dict[str, torch.Tensor]) -> str:
    lines = [f"{'':>14} {'mean':>8} {'sd':>8} {'5%':>8} {'50%':>8} {'95%':>8}"]
    for name, values in draws.items():
        flat = values.reshape(values.shape[0], -1)
        for i in range(flat.shape[1]):
            label = name if flat.shape[1] == 1 else f"{name}[{i}]"
            column = flat[:, i]
            q = torch.quantile(column, torch.tensor([0.05, 0.5, 0.95], dtype=column.dtype))
            lines.append(
                f"{label:>14} {column.mean():8.2f} {column.std():8.2f} "
                f"{q[0]:8.2f} {q[1]:8.2f} {q[2]:8.2f}"
            )
    return "\n".join(lines)


def main() -> None:
    torch.set_default_dtype(torch.float64)
    temperature = torch.tensor(TEMPERATURE_F, dtype=torch.float64)
    damage = torch.tensor(DAMAGE, dtype=torch.float64)
    start = time.perf_counter()
    potential, z0 = initialize_model(challenger, (temperature,), {"damage": damage}, rng_seed=0)
    mode, hessian = laplace_fit(potential, z0)
    covariance = torch.linalg.inv(hessian)
    gaussian = dist.MultivariateNormal(mode, covariance_matrix=covariance)
    z = pt.handlers.seed(lambda: gaussian.sample((4000,)), rng_seed=1)()
    draws = potential.constrain(z)
    elapsed = time.perf_counter() - start
    print("probtorch demo: O-ring damage vs launch temperature (23 Shuttle launches),")
    print("Bayesian logistic regression, Laplace approximation at the compiled posterior mode")
    print(
        f"latent sites {potential.site_names}, {potential.dim} unconstrained dims, "
        f"compiled={potential.compiled}"
    )
    print(f"mode of the potential: U = {potential(mode[None]).item():.3f}")
    print(summarize(draws))
    print(f"done in {elapsed:.1f} s (including compilation)")


if __name__ == "__main__":
    main()
