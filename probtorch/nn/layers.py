"""Ready-made Bayesian layers built with :class:`~probtorch.nn.Module` and ``Sample``."""

from __future__ import annotations

import torch

from .. import distributions as dist
from .module import Module, Sample

__all__ = ["BayesianLinear"]


def _normal_prior(module: BayesianLinear):
    # A module-level function (not a lambda) so that the module can be pickled.
    return dist.Normal(torch.zeros_like(module.prior_scale), module.prior_scale)


class BayesianLinear(Module[torch.nn.Linear]):
    """``nn.Linear`` with independent ``Normal(0, prior_scale)`` priors on weight and bias.

    The sites are ``f"{name}.weight"`` (shape ``(out_features, in_features)``) and
    ``f"{name}.bias"`` (``(out_features,)``), each one event. ``prior_scale`` is a buffer, so
    the prior follows the module in ``.to(device)`` and ``.double()``. Assign another
    :class:`~probtorch.nn.Sample` to ``weight`` or ``bias`` for another prior.

    Example::

        >>> import torch, probtorch as pt
        >>> head = pt.nn.BayesianLinear(4, 2, prior_scale=0.5, name="head").double()
        >>> tr = pt.handlers.trace(pt.handlers.seed(head, rng_seed=0)).get_trace(
        ...     torch.ones(3, 4, dtype=torch.float64))
        >>> tr["head.weight"].value.shape, tr["head.weight"].value.dtype
        (torch.Size([2, 4]), torch.float64)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        prior_scale: float = 1.0,
        *,
        name: str = "",
        device=None,
        dtype=None,
    ):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype, name=name)
        scale = torch.as_tensor(prior_scale, dtype=self.weight.dtype, device=self.weight.device)
        self.register_buffer("prior_scale", scale)
        self.weight = Sample(_normal_prior)
        if bias:
            self.bias = Sample(_normal_prior)
