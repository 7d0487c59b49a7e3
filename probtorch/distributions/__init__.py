"""``probtorch.distributions``: the one namespace for distributions.

Every family of ``torch.distributions`` and ``pyro.distributions`` under Pyro's names and
signatures (with ``.to_event``, ``.mask``, ``.expand``, ``.expand_by``), plus constraints,
transforms and ``biject_to``. Added here, for what neither torch nor Pyro has:
``TruncatedDistribution``/``TruncatedNormal``, the censoring wrappers (``Censored``,
``LeftCensoredDistribution``, ``RightCensoredDistribution``,
``IntervalCensoredDistribution``), ``ZeroSumNormal`` (with its constraint ``zero_sum`` and
``ZeroSumTransform``) and the hurdle count models (``HurdleDistribution``,
``HurdlePoisson``, ``HurdleNegativeBinomial``).

Example::

    >>> import probtorch.distributions as dist
    >>> float(dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.0)))  # doctest: +ELLIPSIS
    -0.918938...
"""

import pyro.distributions as _pyro_dist
import torch  # noqa: F401  (for the docstring example)
from pyro.distributions import *  # noqa: F403
from pyro.distributions import constraints, transforms  # noqa: F401
from torch.distributions import transform_to  # noqa: F401

from .censored import (  # noqa: F401
    Censored,
    IntervalCensoredDistribution,
    LeftCensoredDistribution,
    RightCensoredDistribution,
)
from .constraint_registry import biject_to  # noqa: F401
from .fixes import (  # noqa: F401  (fixed versions of Pyro's, same names)
    LKJ,
    Bernoulli,
    Beta,
    BetaBinomial,
    Categorical,
    ContinuousBernoulli,
    Dirichlet,
    DiscreteHMM,
    FisherSnedecor,
    LKJCholesky,
    Multinomial,
    OrderedLogistic,
    Pareto,
    Wishart,
)
from .hurdle import HurdleDistribution, HurdleNegativeBinomial, HurdlePoisson  # noqa: F401
from .truncated import TruncatedDistribution, TruncatedNormal  # noqa: F401
from .zero_sum import ZeroSumConstraint, ZeroSumNormal, ZeroSumTransform, zero_sum  # noqa: F401

_PROBTORCH_FAMILIES = [
    "TruncatedDistribution",
    "TruncatedNormal",
    "Censored",
    "LeftCensoredDistribution",
    "RightCensoredDistribution",
    "IntervalCensoredDistribution",
    "ZeroSumNormal",
    "ZeroSumConstraint",
    "ZeroSumTransform",
    "zero_sum",
    "HurdleDistribution",
    "HurdlePoisson",
    "HurdleNegativeBinomial",
]

__all__ = (
    list(_pyro_dist.__all__)
    + ["constraints", "transforms", "biject_to", "transform_to"]
    + _PROBTORCH_FAMILIES
)
