"""A sampler's model written as a potential function: ``NUTS(potential_fn=...)``.

As in NumPyro and Pyro, a kernel can take ``potential_fn(values) -> energy`` instead of a
model: the potential energy (negative log density, up to a constant) of one point, given as
a dict of unconstrained tensors by name, with ``init_params`` of the same names and shapes
to start from. probtorch writes it as a model with one flat (improper, real-valued) site
per name and a factor of ``-potential_fn(values)``, so it runs on the same potential,
compiled executors, adaptation and outputs as any model: the draws come back by name from
``get_samples``, and the same seed gives the same draws as the equivalent model.

As in NumPyro, ``init_params`` may also be one tensor, and ``potential_fn`` then takes one
tensor: the draws come back under the name ``"params"`` (:data:`TENSOR_NAME`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from pyro.distributions import ImproperUniform
from torch.distributions import constraints

from ..primitives import factor, sample

__all__ = ["FACTOR_NAME", "TENSOR_NAME", "model_from_potential_fn", "named_potential_fn"]

FACTOR_NAME = "potential_fn"  # the factor site that carries -potential_fn(values)
TENSOR_NAME = "params"  # the site of a potential_fn that takes one tensor


def named_potential_fn(potential_fn: Callable, init_params) -> tuple[Callable, dict | None]:
    """``(potential_fn, init_params)`` in the dict form: a tensor ``init_params`` (NumPyro's
    array form, ``potential_fn(tensor)``) becomes ``{"params": tensor}``, and the function
    one that reads it. Other ``init_params`` are returned as they are.

    >>> fn, init = named_potential_fn(lambda x: (x**2).sum(), torch.ones(3))
    >>> list(init), float(fn({"params": torch.ones(3)}))
    (['params'], 3.0)
    """
    if isinstance(init_params, torch.Tensor):

        def on_one_tensor(values):
            return potential_fn(values[TENSOR_NAME])

        return on_one_tensor, {TENSOR_NAME: init_params}
    return potential_fn, init_params


class _Flat(ImproperUniform):
    """An improper flat density over real tensors shaped and typed like ``example``.

    Its mean is undefined (nan, as torch's Cauchy reports it); the initialization strategies
    read their dtype from it.
    """

    def __init__(self, example: torch.Tensor):
        super().__init__(constraints.real, batch_shape=torch.Size(), event_shape=example.shape)
        self._example = example

    @property
    def mean(self) -> torch.Tensor:
        return torch.full_like(self._example, math.nan)


def model_from_potential_fn(
    potential_fn: Callable,
    init_params: dict,
    num_chains: int,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
) -> Callable:
    """The model whose log density is ``-potential_fn(values)`` over ``init_params``' names.

    ``init_params`` are the starting values: each has the shape ``potential_fn`` sees, with a
    leading dimension of ``num_chains`` (one start per chain) when ``num_chains > 1``, as in
    NumPyro.

    Example::

        >>> import torch
        >>> from probtorch.inference import Potential
        >>> def energy(v):
        ...     return 0.5 * (v["x"] ** 2).sum()
        >>> model = model_from_potential_fn(energy, {"x": torch.zeros(3)}, num_chains=1)
        >>> float(Potential(model, compile=False)(torch.ones(2, 3))[0])
        1.5
    """
    if not callable(potential_fn):
        raise TypeError(f"potential_fn must be callable, got {potential_fn!r}")
    if model_args or model_kwargs:
        raise TypeError(
            f"a kernel built from potential_fn takes no model arguments (potential_fn closes "
            f"over its data); this run got {len(model_args)} positional and "
            f"{sorted(model_kwargs or {})} keyword arguments"
        )
    if init_params is None:
        raise ValueError(
            "a kernel built from potential_fn needs init_params: a dict of initial values by "
            "name, the same names and shapes potential_fn takes (with a leading chain "
            "dimension when num_chains > 1), e.g. mcmc.run(init_params={'x': torch.zeros(3)})"
        )
    if not isinstance(init_params, dict) or not init_params:
        raise TypeError(
            f"init_params for potential_fn must be a tensor or a non-empty dict of tensors by "
            f"name, got "
            f"{init_params!r:.80}"
        )
    if FACTOR_NAME in init_params:
        raise ValueError(f"{FACTOR_NAME!r} names the potential's own factor site; rename it")
    examples = {}
    for name, value in init_params.items():
        value = torch.as_tensor(value)
        if not value.is_floating_point():
            value = value.to(torch.get_default_dtype())
        if num_chains > 1:
            if value.dim() == 0 or value.shape[0] != num_chains:
                raise ValueError(
                    f"with num_chains={num_chains}, init_params[{name!r}] needs a leading "
                    f"chain dimension of {num_chains} (one start per chain), as potential_fn "
                    f"sees one point; it has shape {tuple(value.shape)}"
                )
            value = value[0]
        examples[name] = value.detach()

    def potential_fn_model():
        values = {name: sample(name, _Flat(example)) for name, example in examples.items()}
        energy = potential_fn(values)
        if not isinstance(energy, torch.Tensor) or energy.shape != ():
            shape = tuple(energy.shape) if isinstance(energy, torch.Tensor) else type(energy)
            raise ValueError(
                f"potential_fn must return a scalar tensor for one point (values shaped as "
                f"{ {k: tuple(v.shape) for k, v in examples.items()} }), got {shape}"
            )
        factor(FACTOR_NAME, -energy)

    return potential_fn_model
