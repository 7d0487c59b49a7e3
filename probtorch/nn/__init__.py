"""Neural components: Bayesian modules (priors on an ``nn.Module``'s parameters).

Two ways to put priors on a network's parameters; both give the same sites and log density
and both work with SVI (autoguides such as ``AutoNormal``) and with NUTS (vectorized over
chains and compiled):

- :class:`Module` with :class:`Sample` attributes (as Pyro's ``PyroModule``/``PyroSample``):
  ``self.weight = pt.nn.Sample(prior)``; the ready-made :class:`BayesianLinear`. A
  :class:`Param` attribute (Pyro's ``PyroParam``) is a learnable param under a constraint.
- :func:`random_module`: sample all (or some) parameters of a plain ``nn.Module`` and run it
  with ``torch.func.functional_call``.

For point-estimated networks (encoders of amortized guides, feature extractors), register a
plain ``nn.Module`` with :func:`probtorch.module`; SVI trains its parameters in place (its
``state_dict`` is the fit) and reports them in ``result.params`` as ``f"{name}$$${param}"``.
This package is ``probtorch.nn`` (``pt.nn``); it does not replace ``torch.nn``.

Things to know:

- Call Bayesian modules outside data plates: inside ``pt.plate("data", n)`` every
  parameter site would get one draw per data point.
- A parameter draw is one site whose event is the whole parameter, without batch
  dimensions: nn layers (``F.linear`` is a matrix product) cannot broadcast over a batch of
  draws. Use one particle or ``Trace_ELBO(num_particles=k, vectorize_particles=False)``,
  and ``Predictive(..., parallel=False)``. NUTS is unaffected (it vectorizes chains with
  ``torch.func.vmap``).
- Priors given as fixed distributions do not move with ``.to(device)``/``.double()``; build
  them from buffers with a callable (``Sample(lambda m: dist.Normal(0, m.prior_scale))``),
  as :class:`BayesianLinear` does. Use module-level functions rather than lambdas if the
  module is to be pickled.
- ``nn.TransformerEncoder``: build it with ``enable_nested_tensor=False`` and
  ``dropout=0.0`` (dropout would make a NUTS potential random); it then runs under SVI's
  compiled step and under ``torch.func``. SVI cannot yet train one registered with
  ``pt.module``: ``nn.MultiheadAttention`` reads ``out_proj.weight`` without calling
  ``out_proj``, and SVI finds the owners of module parameters by their forward calls.
  Freeze it (``requires_grad_(False)``, not registered) or train it beforehand.

Example::

    >>> import torch, probtorch as pt, probtorch.distributions as dist
    >>> head = pt.nn.BayesianLinear(2, 1, name="head")
    >>> f = pt.nn.random_module("head", torch.nn.Linear(2, 1), dist.Normal(0.0, 1.0))
    >>> x = torch.ones(3, 2)
    >>> t1 = pt.handlers.trace(pt.handlers.seed(head, rng_seed=0)).get_trace(x)
    >>> t2 = pt.handlers.trace(pt.handlers.seed(f, rng_seed=0)).get_trace(x)
    >>> list(t1) == list(t2) == ["head.weight", "head.bias"]
    True
"""

from .layers import BayesianLinear
from .module import Module, Param, Sample, pyro_method
from .random_module import RandomModule, random_module

__all__ = [
    "Module",
    "Param",
    "Sample",
    "pyro_method",
    "BayesianLinear",
    "random_module",
    "RandomModule",
]
