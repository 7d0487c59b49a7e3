"""Automatic guides: variational families built from a model, for ``SVI``.

Each guide traces the model once (its *prototype*) and then draws every continuous latent
site with the model's name, shape and support: mean-field :class:`AutoNormal`, point-mass
:class:`AutoDelta` (MAP), and guides over one flat unconstrained vector
(:class:`AutoDiagonalNormal`, :class:`AutoMultivariateNormal`,
:class:`AutoLowRankMultivariateNormal`, :class:`AutoLaplaceApproximation`,
:class:`AutoIAFNormal`); :class:`AutoGuideList` makes one guide of several, each over
some of the sites.

Example::

    >>> import torch, probtorch as pt, probtorch.distributions as dist
    >>> from probtorch.inference.autoguide import AutoNormal
    >>> def model():
    ...     pt.sample("p", dist.Beta(2.0, 2.0))
    >>> guide = AutoNormal(model)
    >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
    ...     draw = guide()
    >>> bool(0 < draw["p"] < 1)
    True
"""

# the init strategies here too, as Pyro's pyro.infer.autoguide exports them
from ..init_strategies import (
    init_to_feasible,
    init_to_mean,
    init_to_median,
    init_to_sample,
    init_to_uniform,
    init_to_value,
)
from .base import AutoGuide, LatentSite
from .continuous import (
    AutoContinuous,
    AutoDiagonalNormal,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoMultivariateNormal,
)
from .flows import AutoIAFNormal
from .guide_list import AutoGuideList
from .normal import AutoDelta, AutoNormal

__all__ = [
    "AutoGuide",
    "LatentSite",
    "AutoNormal",
    "AutoDelta",
    "AutoContinuous",
    "AutoDiagonalNormal",
    "AutoMultivariateNormal",
    "AutoLowRankMultivariateNormal",
    "AutoLaplaceApproximation",
    "AutoIAFNormal",
    "AutoGuideList",
    "init_to_feasible",
    "init_to_mean",
    "init_to_median",
    "init_to_sample",
    "init_to_uniform",
    "init_to_value",
]
