"""``random_module``: sample an ``nn.Module``'s parameters and run it functionally."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..primitives import sample
from .priors import fit_prior

__all__ = ["random_module", "RandomModule"]


class RandomModule:
    """What :func:`random_module` returns: calling it samples the parameters and runs the module.

    Attributes:
        name: the prefix of the site names.
        module: the wrapped ``nn.Module`` (never modified).
        priors: ``{parameter name: distribution or callable}`` of the sampled parameters.
    """

    def __init__(self, name: str, module: torch.nn.Module, prior):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"random_module needs an nn.Module, got {type(module).__name__}")
        names = [n for n, _ in module.named_parameters()]
        if isinstance(prior, Mapping):
            unknown = sorted(set(prior) - set(names))
            if unknown:
                raise ValueError(
                    f"random_module {name!r}: the prior names {unknown}, which are not "
                    f"parameters of the module (its parameters: {names})"
                )
            priors = dict(prior)
        elif isinstance(prior, torch.distributions.Distribution) or callable(prior):
            priors = dict.fromkeys(names, prior)
        else:
            raise TypeError(
                f"random_module {name!r}: prior must be a distribution, a callable "
                f"(name, parameter) -> distribution, or a dict of those, got "
                f"{type(prior).__name__}"
            )
        for key, value in priors.items():
            if not (isinstance(value, torch.distributions.Distribution) or callable(value)):
                raise TypeError(
                    f"random_module {name!r}: the prior of {key!r} must be a distribution or "
                    f"a callable, got {type(value).__name__}"
                )
        self.name = name
        self.module = module
        self.priors = priors

    def sample_params(self) -> dict[str, torch.Tensor]:
        """Sample the parameters: ``{parameter name: value}`` (sites ``f"{name}.{param}"``)."""
        values = {}
        for param_name, prior in self.priors.items():
            current = self.module.get_parameter(param_name)
            site = f"{self.name}.{param_name}" if self.name else param_name
            if not isinstance(prior, torch.distributions.Distribution):
                prior = prior(param_name, current)
            value = sample(site, fit_prior(prior, current.shape, site))
            if value.dtype != current.dtype:
                raise TypeError(
                    f"site {site!r}: its value has dtype {value.dtype} but the module's "
                    f"parameter has dtype {current.dtype}; give the prior in the module's "
                    f"dtype (or a callable prior built from the parameter: "
                    f"lambda name, p: dist.Normal(torch.zeros_like(p), 1.0))"
                )
            values[param_name] = value
        return values

    def __call__(self, *args, **kwargs):
        return torch.func.functional_call(self.module, self.sample_params(), args, kwargs)

    def __repr__(self) -> str:
        return f"RandomModule({self.name!r}, {type(self.module).__name__}, {sorted(self.priors)})"


def random_module(
    name: str,
    module: torch.nn.Module,
    prior: torch.distributions.Distribution | Callable | Mapping,
) -> RandomModule:
    """A callable that samples ``module``'s parameters from ``prior`` and then runs it.

    Each call samples the sites ``f"{name}.{param}"`` (``param`` as in
    ``module.named_parameters()``) and runs the module with those values through
    ``torch.func.functional_call``: the module is never modified, so the call is pure and
    works under ``torch.func.vmap`` and ``torch.compile`` (NUTS) as well as in SVI.

    Args:
        name: prefix of the site names.
        module: the ``nn.Module``.
        prior: for every parameter, a distribution or a callable
            ``(param_name, parameter) -> distribution``; or a dict ``param_name -> either``
            that samples only the parameters it names (the others keep the module's values;
            register the module with ``pt.module`` to train them with SVI). A prior with an
            empty ``event_shape`` is expanded to the parameter's shape; each parameter is
            one site whose event is the whole parameter.

    Call it outside data plates: a site inside ``pt.plate("data", n)`` would get one
    parameter draw per data point. Call it at most once per model run (each call samples
    the sites again); to apply the same sampled network to several inputs, use
    ``params = fn.sample_params()`` once and ``torch.func.functional_call(fn.module,
    params, x)``.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> net = torch.nn.Linear(3, 1)
        >>> def model(x, y=None):
        ...     f = pt.nn.random_module("net", net, dist.Normal(0.0, 1.0))
        ...     mean = f(x).squeeze(-1)            # outside the data plate
        ...     with pt.plate("data", x.shape[0]):
        ...         pt.sample("y", dist.Normal(mean, 0.5), obs=y)
        >>> tr = pt.handlers.trace(pt.handlers.seed(model, rng_seed=0)).get_trace(torch.ones(4, 3))
        >>> [(n, tuple(s.value.shape)) for n, s in tr.items() if n.startswith("net")]
        [('net.weight', (1, 3)), ('net.bias', (1,))]
    """
    return RandomModule(name, module, prior)
