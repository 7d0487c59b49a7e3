"""Seeding every random generator a model may draw from, as Pyro's ``pyro.set_rng_seed``."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["set_rng_seed"]


def set_rng_seed(rng_seed: int) -> None:
    """Seed torch's generators (CPU and CUDA), Python's ``random`` and NumPy's global one.

    Inference takes its own seeds (``MCMC(..., seed=)``, ``SVI(..., seed=)``,
    ``Predictive(...)(seed=)``) and leaves these generators as they were; this seeds what a
    script draws around them (data, ``pt.handlers.seed``-less model runs).

    Example::

        >>> import torch, probtorch as pt
        >>> pt.set_rng_seed(0)
        >>> a = torch.rand(2)
        >>> pt.set_rng_seed(0)
        >>> torch.equal(a, torch.rand(2))
        True
    """
    if isinstance(rng_seed, bool) or not isinstance(rng_seed, (int, np.integer)):
        raise TypeError(f"set_rng_seed takes an integer seed, got {rng_seed!r}")
    rng_seed = int(rng_seed)
    torch.manual_seed(rng_seed)  # every CUDA device's too
    random.seed(rng_seed)
    np.random.seed(rng_seed % 2**32)
