"""Inference: model -> potential, MCMC (NUTS/HMC)."""

from .init_strategies import init_to_median, init_to_sample, init_to_uniform, init_to_value
from .mcmc import HMC, MCMC, NUTS
from .potential import Potential, initialize_model

__all__ = [
    "MCMC",
    "NUTS",
    "HMC",
    "Potential",
    "initialize_model",
    "init_to_uniform",
    "init_to_median",
    "init_to_sample",
    "init_to_value",
]
