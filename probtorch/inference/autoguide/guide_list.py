"""Pyro's ``AutoGuideList``: one guide made of autoguides, each over some of the sites."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ...handlers import block, seed, trace
from ...params import ParamStore, param_scope
from ...validation import torch_validation
from ..init_strategies import check_value_names, deferred_value_checks
from .base import AutoGuide

__all__ = ["AutoGuideList"]


class AutoGuideList(AutoGuide):
    """A guide whose parts are autoguides, each built on the model with the sites of the
    others hidden (``pt.handlers.block``), as Pyro's ``AutoGuideList``: ``AutoDelta`` for
    some sites and ``AutoNormal`` for the rest, say. Its draws, ``median``, ``quantiles``
    and ``sample_posterior`` are the parts' together, and the parts share one plate per
    name in each run (one subsample). A part left with the default prefix ``"auto"`` is
    renamed ``f"{prefix}.{i}"`` (its position), so two parts' params never share a name.

    Args:
        model: the model (for the parts' plates: ``create_plates``, as in Pyro).
        prefix: prefix of the parts' default names.
        create_plates: as :class:`~.base.AutoGuide`'s, for every part.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference.autoguide import AutoDelta, AutoNormal
        >>> def model():
        ...     scale = pt.sample("scale", dist.HalfNormal(1.0))
        ...     pt.sample("loc", dist.Normal(0.0, scale))
        >>> guide = AutoGuideList(model)
        >>> guide.append(AutoDelta(pt.handlers.block(model, expose=["scale"])))
        >>> guide.append(AutoNormal(pt.handlers.block(model, hide=["scale"])))
        >>> with pt.param_scope(pt.ParamStore()), pt.handlers.seed(rng_seed=0):
        ...     sorted(guide())
        ['loc', 'scale']
        >>> guide.param_names
        ['auto.0.loc.scale', 'auto.1.loc.loc', 'auto.1.scale.loc']
    """

    def __init__(self, model: Callable, *, prefix: str = "auto", create_plates=None):
        self.parts: list[AutoGuide] = []
        super().__init__(model, prefix=prefix, create_plates=create_plates)

    def append(self, part: AutoGuide) -> None:
        """Add an autoguide built on the model with the other parts' sites hidden."""
        if not isinstance(part, AutoGuide):
            raise TypeError(
                f"AutoGuideList takes autoguides (AutoNormal, AutoDelta, ...), got "
                f"{type(part).__name__}; for a hand-written part write the guide as a "
                f"function that calls each part"
            )
        if part.prototype_trace is None and part.prefix == "auto":
            part.prefix = f"{self.prefix}.{len(self.parts)}"
        part.fitted_store, part.fitting = self.fitted_store, self.fitting
        self.parts.append(part)
        self.prototype_trace = None  # set up again with this part on the next call

    add = append  # (Pyro's older name)

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, index: int) -> AutoGuide:
        return self.parts[index]

    # -- what SVI sets on a guide it fits reaches every part ------------------------------
    @property
    def fitted_store(self) -> ParamStore | None:
        return self.__dict__.get("_fitted_store")

    @fitted_store.setter
    def fitted_store(self, store: ParamStore | None) -> None:
        self.__dict__["_fitted_store"] = store
        for part in self.parts:
            part.fitted_store = store

    @property
    def fitting(self) -> bool:
        return self.__dict__.get("_fitting", False)

    @fitting.setter
    def fitting(self, value: bool) -> None:
        self.__dict__["_fitting"] = value
        for part in self.parts:
            part.fitting = value

    # -- the prototype ---------------------------------------------------------------------
    def _setup_prototype(self, *args, **kwargs) -> None:
        if not self.parts:
            raise ValueError("AutoGuideList has no parts: append autoguides to it first")
        latents, owners, names = {}, {}, {}
        with deferred_value_checks() as init_values:
            for part in self.parts:
                part._ensure_prototype(args, kwargs)
        if init_values:
            self._check_init_values(init_values, args, kwargs)
        for i, part in enumerate(self.parts):
            for site, latent in part.latents.items():
                if site in owners:
                    raise ValueError(
                        f"AutoGuideList: site {site!r} is drawn by part {owners[site]} "
                        f"({type(self.parts[owners[site]]).__name__}) and part {i} "
                        f"({type(part).__name__}); hide it from one of them with "
                        f"pt.handlers.block(model, hide=[...])"
                    )
                owners[site] = i
                latents[site] = latent
            for name in part.param_names:
                if name in names:
                    raise ValueError(
                        f"AutoGuideList: parts {names[name]} and {i} both have a param "
                        f"{name!r}; give them different prefixes"
                    )
                names[name] = i
        self.latents = latents
        self.prototype_trace = self.parts[0].prototype_trace

    def _check_init_values(self, strategies: list, args: tuple, kwargs: dict) -> None:
        """Check the names of the parts' ``init_to_value`` strategies on one run of the
        whole model: one strategy may give values for the sites of several parts (each
        part takes its own), but a name that is no site of the model is refused."""
        tracer = trace(seed(self.model, 0))  # (names only; the global stream is left alone)
        with block(), param_scope(ParamStore()), torch_validation(False):
            tracer(*args, **kwargs)
        for strategy in strategies:
            check_value_names(strategy, tracer.trace)

    @property
    def param_names(self) -> list[str]:
        self._require_prototype("param_names")
        return [name for part in self.parts for name in part.param_names]

    # -- draws and summaries ---------------------------------------------------------------
    def __call__(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self._ensure_prototype(args, kwargs)
        # (inside an outer list: its plates too)
        shared = self._given_plates(args, kwargs, self._shared_plates)
        result = {}
        try:
            for part in self.parts:
                part._shared_plates = shared
                result.update(part(*args, **kwargs))
        finally:
            for part in self.parts:
                part._shared_plates = None
        if self._shared_plates is not None:
            self._shared_plates.update(shared)
        return result

    def median(self, params: dict | None = None) -> dict[str, torch.Tensor]:
        self._require_prototype("median")
        return {k: v for part in self.parts for k, v in part.median(params).items()}

    def quantiles(
        self, qs: Sequence[float] | torch.Tensor, params: dict | None = None
    ) -> dict[str, torch.Tensor]:
        self._require_prototype("quantiles")
        return {k: v for part in self.parts for k, v in part.quantiles(qs, params).items()}

    def _sample_posterior(self, num_samples: int, params: dict | None) -> dict[str, torch.Tensor]:
        return {
            k: v
            for part in self.parts
            for k, v in part._sample_posterior(num_samples, params).items()
        }
