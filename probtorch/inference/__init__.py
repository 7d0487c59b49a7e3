"""Inference: model -> potential, MCMC (NUTS/HMC), SVI (ELBOs, autoguides), Predictive."""

from ..handlers import config_enumerate
from . import autoguide
from .discrete import infer_discrete
from .elbo import (
    JitTrace_ELBO,
    JitTraceEnum_ELBO,
    JitTraceGraph_ELBO,
    JitTraceMeanField_ELBO,
    RenyiELBO,
    Trace_ELBO,
    TraceEnum_ELBO,
    TraceGraph_ELBO,
    TraceMeanField_ELBO,
)
from .init_strategies import (
    init_to_feasible,
    init_to_mean,
    init_to_median,
    init_to_sample,
    init_to_uniform,
    init_to_value,
)
from .mcmc import HMC, MCMC, NUTS
from .potential import Potential, initialize_model
from .predictive import Predictive, log_likelihood
from .svi import SVI, SVIRunResult

__all__ = [
    "MCMC",
    "NUTS",
    "HMC",
    "Potential",
    "initialize_model",
    "init_to_uniform",
    "init_to_feasible",
    "init_to_mean",
    "init_to_median",
    "init_to_sample",
    "init_to_value",
    "SVI",
    "SVIRunResult",
    "Trace_ELBO",
    "TraceEnum_ELBO",
    "TraceMeanField_ELBO",
    "TraceGraph_ELBO",
    "RenyiELBO",
    "JitTrace_ELBO",
    "JitTraceEnum_ELBO",
    "JitTraceGraph_ELBO",
    "JitTraceMeanField_ELBO",
    "Predictive",
    "log_likelihood",
    "config_enumerate",
    "infer_discrete",
    "autoguide",
]
