"""``AutoIAFNormal``: a normalizing-flow guide of inverse autoregressive flows (IAF).

Each flow layer is an affine autoregressive map ``y_i = mu_i(x_<i) + sigma_i(x_<i) x_i``
with ``(mu, log sigma)`` from a MADE network (Germain et al. 2015; IAF: Kingma et al. 2016),
as Pyro's ``affine_autoregressive`` with ``stable=False``. The network is written here
over plain tensors so that its weights are ordinary ``probtorch.param`` sites: SVI trains
them in its store, and ``params`` dicts (SVI's ``result.params``) work as for every guide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints
from torch.distributions.transforms import Transform

from .continuous import AutoContinuous

__all__ = ["AutoIAFNormal", "AffineAutoregressiveTransform", "made_masks"]

# Bounds of log sigma, as Pyro's AffineAutoregressive (log_scale_min_clip, ...max_clip).
_LOG_SCALE_MIN, _LOG_SCALE_MAX = -5.0, 3.0


def made_masks(input_dim: int, hidden_dims: Sequence[int]) -> list[torch.Tensor]:
    """Masks ``(out, in)`` of the MADE layers for the natural order ``1..input_dim``.

    Hidden units get degrees in ``1..input_dim-1`` (cyclically); output ``i`` only sees
    inputs of degree ``< i``. The last mask is for one output head of ``input_dim`` units.

    Example::

        >>> masks = made_masks(3, [4])
        >>> (masks[1].float() @ masks[0].float()).tolist()  # input -> output connections
        [[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [4.0, 2.0, 0.0]]
    """
    degrees_in = torch.arange(1, input_dim + 1)
    masks, previous = [], degrees_in
    for width in hidden_dims:
        degrees = torch.arange(width) % max(input_dim - 1, 1) + 1
        masks.append(degrees[:, None] >= previous[None, :])
        previous = degrees
    masks.append(degrees_in[:, None] > previous[None, :])
    return masks


class AffineAutoregressiveTransform(Transform):
    """The IAF map of one layer, from explicit weights (``weights[k]``, ``biases[k]``).

    The last layer's weight has ``2 * dim`` rows: ``mu`` then ``log sigma``. ``permutation``
    (optional) reorders the input first, so stacked layers condition in different orders.

    Example::

        >>> _ = torch.manual_seed(0)
        >>> masks = made_masks(3, [8])
        >>> weights = [0.5 * torch.randn(8, 3), 0.5 * torch.randn(6, 8)]
        >>> t = AffineAutoregressiveTransform(weights, [torch.zeros(8), torch.zeros(6)], masks)
        >>> x = torch.randn(4, 3)
        >>> torch.allclose(t.inv(t(x)), x, atol=1e-5)
        True
    """

    domain = constraints.real_vector
    codomain = constraints.real_vector
    bijective = True

    def __init__(self, weights, biases, masks, permutation=None, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.weights, self.biases, self.masks = weights, biases, masks
        self.permutation = permutation

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return AffineAutoregressiveTransform(
            self.weights, self.biases, self.masks, self.permutation, cache_size
        )

    def _mu_log_scale(self, x):
        h = x
        last = len(self.weights) - 1
        for k, (w, b) in enumerate(zip(self.weights, self.biases)):
            mask = self.masks[k] if k < last else torch.cat([self.masks[k], self.masks[k]])
            h = torch.nn.functional.linear(h, w * mask.to(w.dtype), b)
            if k < last:
                h = torch.relu(h)
        mu, log_scale = h.chunk(2, dim=-1)
        return mu, log_scale.clamp(_LOG_SCALE_MIN, _LOG_SCALE_MAX)

    def _permute(self, x):
        return x if self.permutation is None else x[..., self.permutation]

    def _call(self, x):
        x = self._permute(x)
        mu, log_scale = self._mu_log_scale(x)
        return mu + log_scale.exp() * x

    def _inverse(self, y):
        # Output i depends on inputs < i only: dim passes recover x one coordinate at a time.
        x = torch.zeros_like(y)
        for _ in range(y.shape[-1]):
            mu, log_scale = self._mu_log_scale(x)
            x = (y - mu) * torch.exp(-log_scale)
        if self.permutation is None:
            return x
        return x[..., torch.argsort(self.permutation)]

    def log_abs_det_jacobian(self, x, y):
        _, log_scale = self._mu_log_scale(self._permute(x))
        return log_scale.sum(-1)


class AutoIAFNormal(AutoContinuous):
    """A standard Normal pushed through ``num_transforms`` IAF layers, then shifted by ``loc``.

    Args:
        model: the model.
        hidden_dims: widths of the MADE hidden layers (default ``[3 * latent_dim + 10]``).
        num_transforms: number of IAF layers; layers after the first reverse the order.
        prefix, init_loc_fn, init_scale: as for every autoguide. The flow starts close to
            ``Normal(init_loc, init_scale)``.

    Params: ``f"{prefix}.loc"`` and, for layer ``k`` and MADE layer ``j``,
    ``f"{prefix}.iaf.{k}.weight.{j}"`` and ``f"{prefix}.iaf.{k}.bias.{j}"``. The initial
    weights are random (from torch's generator, drawn once when the guide is set up).

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("w", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        >>> guide = AutoIAFNormal(model, hidden_dims=[8])
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store), pt.handlers.seed(rng_seed=0):
        ...     _ = guide()
        >>> tuple(store["auto.iaf.0.weight.1"].shape)  # loc and log-scale heads
        (4, 8)
        >>> guide.sample_posterior(10, dict(store.items()), seed=0)["w"].shape
        torch.Size([10, 2])
    """

    def __init__(
        self,
        model,
        *,
        hidden_dims: Sequence[int] | None = None,
        num_transforms: int = 1,
        hidden_dim: int | Sequence[int] | None = None,
        **kwargs,
    ):
        if hidden_dim is not None:  # Pyro's name: one width, or a list of them
            if hidden_dims is not None:
                raise TypeError("AutoIAFNormal: give hidden_dims or Pyro's hidden_dim, not both")
            hidden_dims = [hidden_dim] if isinstance(hidden_dim, int) else hidden_dim
        super().__init__(model, **kwargs)
        if int(num_transforms) < 1:
            raise ValueError(f"num_transforms must be >= 1, got {num_transforms}")
        self.hidden_dims = None if hidden_dims is None else [int(h) for h in hidden_dims]
        self.num_transforms = int(num_transforms)

    def _check_prototype(self) -> None:
        super()._check_prototype()
        dim = self.latent_dim
        if self.hidden_dims is None:
            self.hidden_dims = [3 * dim + 10]
        self._masks = made_masks(dim, self.hidden_dims)
        init = self._init_loc
        specs = {"loc": (init, constraints.real)}
        widths = [dim] + list(self.hidden_dims) + [2 * dim]
        for k in range(self.num_transforms):
            for j in range(len(widths) - 1):
                fan_in, fan_out = widths[j], widths[j + 1]
                if j < len(widths) - 2:
                    bound = 1.0 / math.sqrt(fan_in)
                    weight = (torch.rand(fan_out, fan_in, dtype=init.dtype) * 2 - 1) * bound
                    bias = torch.zeros(fan_out, dtype=init.dtype)
                else:
                    # Small output weights: the flow starts near the affine map
                    # x -> init_scale * x (first layer) / identity (later layers).
                    weight = torch.randn(fan_out, fan_in, dtype=init.dtype) * 0.01
                    log_scale = math.log(self.init_scale) if k == 0 else 0.0
                    bias = torch.cat(
                        [torch.zeros(dim, dtype=init.dtype), torch.full((dim,), log_scale)]
                    ).to(init.dtype)
                specs[f"iaf.{k}.weight.{j}"] = (weight.to(init.device), constraints.real)
                specs[f"iaf.{k}.bias.{j}"] = (bias.to(init.device), constraints.real)
        self._specs = specs
        self._reverse = torch.arange(dim - 1, -1, -1, device=init.device)

    def _param_specs(self):
        return self._specs

    def _transforms(self, values):
        transforms = []
        num_layers = len(self.hidden_dims) + 1
        for k in range(self.num_transforms):
            weights = [values[f"iaf.{k}.weight.{j}"] for j in range(num_layers)]
            biases = [values[f"iaf.{k}.bias.{j}"] for j in range(num_layers)]
            permutation = None if k == 0 else self._reverse
            transforms.append(
                AffineAutoregressiveTransform(weights, biases, self._masks, permutation, 1)
            )
        loc = values["loc"]
        shift = torch.distributions.AffineTransform(loc, torch.ones_like(loc), event_dim=1)
        return transforms + [shift]

    def _posterior(self, values):
        loc = values["loc"]
        base = pyro_dist.Normal(torch.zeros_like(loc), torch.ones_like(loc)).to_event(1)
        return pyro_dist.TransformedDistribution(base, self._transforms(values))

    def _draws(self, params, num_samples: int = 1000) -> torch.Tensor:
        return self.get_posterior(params).sample((num_samples,))

    def median(self, params: dict | None = None, num_samples: int = 1000) -> dict:
        """Elementwise median of ``num_samples`` draws in unconstrained space, mapped.

        A flow has no closed-form marginals, so this is a Monte Carlo estimate (from
        torch's generator).
        """
        self._require_prototype("median")
        with torch.no_grad():
            return self._constrain(self.unpack(self._draws(params, num_samples).median(0).values))

    def quantiles(self, qs, params: dict | None = None, num_samples: int = 1000) -> dict:
        """Monte Carlo marginal quantiles from ``num_samples`` draws (see ``median``)."""
        self._require_prototype("quantiles")
        with torch.no_grad():
            z = self._draws(params, num_samples)
            q = torch.as_tensor(qs, dtype=z.dtype)
            return self._constrain(self.unpack(torch.quantile(z, q, dim=0)))
