"""Compiled, chain-vectorized HMC and NUTS with Stan's warmup, and the ``MCMC`` driver."""

from .kernels import HMC, NUTS, SamplerState
from .mcmc import MCMC

__all__ = ["MCMC", "NUTS", "HMC", "SamplerState"]
