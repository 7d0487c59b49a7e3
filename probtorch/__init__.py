"""probtorch: Bayesian models as Python functions on PyTorch 2, fit with compiled NUTS and SVI.

Example::

    >>> import torch
    >>> import probtorch as pt
    >>> import probtorch.distributions as dist
    >>> def model(y):
    ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
    ...     with pt.plate("data", len(y)):
    ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
    >>> tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace(torch.zeros(3))
    >>> list(tr)
    ['mu', 'data', 'y']
"""

from . import (
    _torch_compat,  # noqa: F401  (patches torch: see the module)
    distributions,
    handlers,
    optim,
)
from . import nn as nn  # pt.nn; not in __all__, so `import *` does not shadow torch.nn
from .params import ParamStore, clear_param_store, get_param_store, param_scope
from .primitives import (
    RandomnessError,
    deterministic,
    factor,
    markov,
    module,
    param,
    plate,
    sample,
    subsample,
)
from .rng import set_rng_seed
from .runtime import Message, Messenger, apply_stack
from .validation import enable_validation, is_validation_enabled

__version__ = "0.1.0"


def __getattr__(name: str):
    """``pt.inference`` and ``pt.infer`` (Pyro's name for it), imported on first use."""
    if name in ("inference", "infer"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if not name.startswith("_"):
        from .inference import __all__ as inference_names

        if name in inference_names:  # pt.SVI, pt.MCMC: where NumPyro and Pyro users look
            raise AttributeError(
                f"module {__name__!r} has no attribute {name!r}: it is in probtorch.infer "
                f"(pt.infer.{name}, or from probtorch.infer import {name}), as in pyro.infer"
            )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "sample",
    "param",
    "plate",
    "markov",
    "deterministic",
    "factor",
    "module",
    "subsample",
    "handlers",
    "distributions",
    "optim",
    "Messenger",
    "Message",
    "apply_stack",
    "ParamStore",
    "clear_param_store",
    "get_param_store",
    "param_scope",
    "RandomnessError",
    "set_rng_seed",
    "enable_validation",
    "is_validation_enabled",
]
