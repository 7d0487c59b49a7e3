"""``probtorch.infer``: Pyro's name for :mod:`probtorch.inference`, the same objects.

Pyro code reads ``pyro.infer.SVI``, ``from pyro.infer import MCMC, NUTS, Trace_ELBO,
Predictive`` and ``pyro.infer.autoguide.AutoNormal``; with ``pt`` for ``pyro`` each works
here. ``probtorch.infer.autoguide`` and ``probtorch.infer.mcmc`` are the modules
``probtorch.inference.autoguide`` and ``probtorch.inference.mcmc`` themselves (so
``from probtorch.infer.autoguide import AutoNormal`` works too, and so does
``from probtorch.infer.autoguide import init_to_median``). ``probtorch.infer.reparam`` is
:mod:`probtorch.reparam` (Pyro's ``pyro.infer.reparam``), and ``probtorch.infer.ELBO`` the
ELBOs' base class.

Example::

    >>> import probtorch.infer
    >>> from probtorch.infer.autoguide import AutoNormal
    >>> import probtorch.inference.autoguide as autoguide
    >>> probtorch.infer.SVI is probtorch.inference.SVI, AutoNormal is autoguide.AutoNormal
    (True, True)
"""

import sys

from . import inference as _inference
from . import reparam
from .inference import *  # noqa: F403
from .inference import __all__ as _inference_all
from .inference import autoguide, mcmc
from .inference.elbo import ELBO  # noqa: F401 (Pyro's pyro.infer.ELBO)

__all__ = [*_inference_all, *(["ELBO"] if "ELBO" not in _inference_all else [])]

# the submodules under this name too, for ``import probtorch.infer.autoguide`` and
# ``from probtorch.infer.autoguide import ...``
sys.modules[f"{__name__}.autoguide"] = autoguide
sys.modules[f"{__name__}.mcmc"] = mcmc
sys.modules[f"{__name__}.reparam"] = reparam


def __getattr__(name: str):
    """The rest of :mod:`probtorch.inference` (its modules and names outside ``__all__``)."""
    try:
        return getattr(_inference, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
