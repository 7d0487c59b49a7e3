"""``probtorch.infer``: Pyro's name for :mod:`probtorch.inference`, the same objects.

Pyro code reads ``pyro.infer.SVI``, ``from pyro.infer import MCMC, NUTS, Trace_ELBO,
Predictive`` and ``pyro.infer.autoguide.AutoNormal``; with ``pt`` for ``pyro`` each works
here. ``probtorch.infer.autoguide`` and ``probtorch.infer.mcmc`` are the modules
``probtorch.inference.autoguide`` and ``probtorch.inference.mcmc`` themselves (so
``from probtorch.infer.autoguide import AutoNormal`` works too).

Example::

    >>> import probtorch.infer
    >>> from probtorch.infer.autoguide import AutoNormal
    >>> import probtorch.inference.autoguide as autoguide
    >>> probtorch.infer.SVI is probtorch.inference.SVI, AutoNormal is autoguide.AutoNormal
    (True, True)
"""

import sys

from . import inference as _inference
from .inference import *  # noqa: F403
from .inference import __all__, autoguide, mcmc  # noqa: F401

# the submodules under this name too, for ``import probtorch.infer.autoguide`` and
# ``from probtorch.infer.autoguide import ...``
sys.modules[f"{__name__}.autoguide"] = autoguide
sys.modules[f"{__name__}.mcmc"] = mcmc


def __getattr__(name: str):
    """The rest of :mod:`probtorch.inference` (its modules and names outside ``__all__``)."""
    try:
        return getattr(_inference, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
