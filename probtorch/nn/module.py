"""Priors on the attributes of an ``nn.Module``: :class:`Module` and :class:`Sample`.

A :class:`Module` is an ``nn.Module`` whose attributes may be :class:`Sample` s. Assigning
``self.weight = Sample(prior)`` removes the parameter ``weight`` (if there was one); from
then on each forward call reads ``self.weight`` as ``pt.sample(f"{prefix}.weight", prior)``.
The site is sampled once per outermost forward call (all reads within one call see the
same value) and again in the next call. Nothing is written into the module: the value is
what the handlers give back (a draw, a guide's value, NUTS's position), so the module is
pure in its random attributes and runs under ``torch.func.vmap`` and ``torch.compile``.

Names are hierarchical, like ``named_parameters``: a root created with ``name="bnn"``
whose attribute ``fc1`` is a :class:`Module` with a ``Sample`` attribute ``weight`` samples
the site ``"bnn.fc1.weight"`` (``"fc1.weight"`` with the default, empty, root name). Plain
``nn.Module`` containers in between (``nn.Sequential``, ``nn.ModuleList``) keep the path. A
child gets its name when it is assigned; a :class:`Module` added to a container afterwards
(``ModuleList.append``) is named only when the container is (re)assigned.

``Module[nn.Linear]`` makes a :class:`Module` out of an existing class (as Pyro's
``PyroModule[nn.Linear]``); its constructor takes the class's arguments plus ``name=``.
"""

from __future__ import annotations

import copyreg
import functools
from collections.abc import Callable

import torch
from torch.distributions import constraints

from ..params import active_store
from ..primitives import deterministic, param, sample
from .priors import fit_prior

__all__ = ["Module", "Param", "Sample"]


class Sample:
    """A prior for an attribute of a :class:`Module`: a distribution, or ``fn(module)``.

    A callable is called with the module at each forward call and returns the distribution,
    so the prior may depend on the module's buffers (which move with ``.to()`` and
    ``.double()``; a fixed distribution does not) or on its other attributes, random ones
    included (hierarchical priors); a callable that returns a tensor makes the attribute a
    deterministic site of that value, as Pyro's ``PyroSample``. When the attribute replaces a
    parameter, a prior with an empty ``event_shape`` is expanded to the parameter's shape
    (``Sample(dist.Normal(0, 1))`` on a ``(3, 2)`` weight is
    ``Normal(0, 1).expand([3, 2]).to_event(2)``).

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> net = pt.nn.Module[torch.nn.Linear](2, 1)
        >>> net.weight = pt.nn.Sample(dist.Normal(0.0, 1.0))
        >>> tr = pt.handlers.trace(pt.handlers.seed(net, rng_seed=0)).get_trace(torch.ones(4, 2))
        >>> tr["weight"].fn.event_shape, [n for n, _ in net.named_parameters()]
        (torch.Size([1, 2]), ['bias'])
    """

    __slots__ = ("prior",)

    def __init__(self, prior):
        if isinstance(prior, type):
            raise TypeError(
                f"Sample got the class {prior.__name__}; give a distribution, e.g. "
                f"{prior.__name__}(...) with its parameters, or a function module -> "
                f"distribution"
            )
        if not (isinstance(prior, torch.distributions.Distribution) or callable(prior)):
            raise TypeError(
                f"Sample needs a distribution or a callable module -> distribution, got "
                f"{type(prior).__name__}"
            )
        self.prior = prior

    def __repr__(self) -> str:
        return f"Sample({self.prior!r})"


class Param:
    """A learnable attribute of a :class:`Module` (Pyro's ``PyroParam``): each read is
    ``pt.param(f"{prefix}.{name}", init_value, constraint, event_dim)``, so SVI trains it in
    its store under the constraint. ``init_value`` may be a tensor, a function giving one,
    or ``None`` to start from the parameter it replaces.

    A tensor assigned to the attribute sets its value (as in Pyro): its initial value, and
    its value in the active param store where that holds it. Unlike Pyro's, its value lives
    in a param store, not in the module: it is not among
    ``named_parameters()`` or in ``state_dict()`` and does not move with ``.to()``. After
    SVI, read or save it from the SVI's store (``svi.get_params()[name]``,
    ``svi.param_store.save(path)``), or run the module in ``pt.param_scope(svi.param_store)``;
    ``Predictive`` reads it there by itself.

    Example::

        >>> import torch, probtorch as pt
        >>> from torch.distributions import constraints
        >>> net = pt.nn.Module[torch.nn.Linear](2, 1, name="net")
        >>> net.bias = pt.nn.Param(torch.ones(1), constraint=constraints.positive)
        >>> store = pt.ParamStore()
        >>> with pt.param_scope(store):
        ...     _ = net(torch.zeros(3, 2))
        >>> float(store["net.bias"].detach()), [n for n, _ in net.named_parameters()]
        (1.0, ['weight'])
    """

    __slots__ = ("init_value", "constraint", "event_dim")

    def __init__(self, init_value=None, constraint=constraints.real, event_dim=None):
        if not (init_value is None or isinstance(init_value, torch.Tensor) or callable(init_value)):
            init_value = torch.as_tensor(init_value, dtype=torch.get_default_dtype())
        self.init_value = init_value
        self.constraint = constraint
        self.event_dim = event_dim

    def __repr__(self) -> str:
        return f"Param(constraint={self.constraint})"


class _Context:
    """Shared by a tree of modules: depth of nested forward calls and the values sampled."""

    __slots__ = ("depth", "values", "describing")

    def __init__(self):
        self.depth = 0
        self.values: dict[str, torch.Tensor] = {}
        self.describing = 0  # inside __repr__: random attributes read as their Sample


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _adopt(module: torch.nn.Module, prefix: str, context: _Context) -> None:
    """Name every :class:`Module` in ``module``'s tree under ``prefix``; share ``context``."""
    for path, sub in module.named_modules():
        if isinstance(sub, Module):
            sub.__dict__["_pt_name"] = _join(prefix, path)
            sub.__dict__["_pt_context"] = context


def _setup(module: Module, name: str) -> None:
    module.__dict__["_pt_priors"] = {}  # attribute -> (prior, shape of replaced param or None)
    _adopt(module, name, _Context())


class _ModuleMeta(type):
    """``Module[cls]``: the :class:`Module` version of an ``nn.Module`` class (memoized)."""

    _made: dict[type, type] = {}

    def __getitem__(cls, base: type) -> type:
        if not (isinstance(base, type) and issubclass(base, torch.nn.Module)):
            raise TypeError(f"Module[...] needs an nn.Module subclass, got {base!r}")
        if issubclass(base, Module):
            return base
        if base not in _ModuleMeta._made:

            def __init__(self, *args, name: str = "", **kwargs):
                # base.__init__ runs nn.Module.__init__ (next in the MRO after ``base``).
                base.__init__(self, *args, **kwargs)
                _setup(self, name)

            made = _ModuleMeta(
                base.__name__,
                (Module, base),
                {
                    "__init__": __init__,
                    "__module__": base.__module__,
                    "__qualname__": f"Module[{base.__qualname__}]",
                    "_pt_base": base,
                },
            )
            _ModuleMeta._made[base] = made
        return _ModuleMeta._made[base]


def _module_class(base: type) -> type:
    return Module[base]


def _reduce_class(cls: type):
    """Pickle ``Module[base]`` as "make it again from ``base``"; other classes by name."""
    if cls.__dict__.get("_pt_base") is not None:
        return _module_class, (cls._pt_base,)
    return cls.__qualname__


# Instances of Module[nn.Linear] can then be saved with torch.save / pickle.
copyreg.pickle(_ModuleMeta, _reduce_class)


def _call_drawing_once(module: Module, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a forward call, or a :func:`pyro_method`) with each random
    attribute of ``module``'s tree one site, drawn at its first read. (A try/finally, not a
    context manager: compiled code traces it.)"""
    context = module._pt_context
    context.depth += 1
    try:
        return fn(*args, **kwargs)
    finally:
        context.depth -= 1
        if context.depth == 0:
            context.values.clear()


def pyro_method(fn: Callable) -> Callable:
    """Make a method of a :class:`Module` other than ``forward`` read each random attribute
    as one site, drawn at its first read, as ``forward`` does (Pyro's ``pyro_method``):
    without it each read outside a forward call is a site of its own, and a second read
    of one attribute in a run is "two sites are named ...".

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> class Scale(pt.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.s = pt.nn.Sample(dist.HalfNormal(1.0))
        ...     @pt.nn.pyro_method
        ...     def twice(self):
        ...         return self.s + self.s
        >>> tr = pt.handlers.trace(pt.handlers.seed(Scale().twice, rng_seed=0)).get_trace()
        >>> bool(tr["s"].value * 2 == tr["s"].value + tr["s"].value), list(tr)
        (True, ['s'])
    """

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        return _call_drawing_once(self, fn, self, *args, **kwargs)

    return method


class Module(torch.nn.Module, metaclass=_ModuleMeta):
    """An ``nn.Module`` whose attributes may be random: assign :class:`Sample` priors.

    Args:
        name: prefix of the site names of this module's tree (default: none, so the sites
            are named like ``named_parameters``: ``"fc1.weight"``).

    Use it as a base class, or as ``Module[nn.Linear](in, out, name=...)`` to add priors to
    an existing layer. Parameters that are not given a prior stay ordinary parameters: to
    train them with SVI, register the module with ``pt.module(name, net)`` in the model or
    the guide.

    Example (a Bayesian 1-16-1 network)::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> class BNN(pt.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fc1 = pt.nn.Module[torch.nn.Linear](1, 16)
        ...         self.fc1.weight = pt.nn.Sample(dist.Normal(0.0, 1.0))
        ...         self.fc1.bias = pt.nn.Sample(dist.Normal(0.0, 1.0))
        ...         self.fc2 = pt.nn.BayesianLinear(16, 1, prior_scale=0.25)
        ...     def forward(self, x, y=None):
        ...         mean = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        ...         with pt.plate("data", x.shape[0]):
        ...             return pt.sample("y", dist.Normal(mean, 0.1), obs=y)
        >>> bnn = BNN()
        >>> tr = pt.handlers.trace(pt.handlers.seed(bnn, rng_seed=0)).get_trace(torch.zeros(5, 1))
        >>> [name for name, site in tr.items() if site.type == "sample"]
        ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias', 'y']
    """

    def __init__(self, name: str = ""):
        super().__init__()
        _setup(self, name)

    def __setattr__(self, name: str, value) -> None:
        priors = self.__dict__.get("_pt_priors")
        if isinstance(value, Param):
            if priors is None:
                raise AttributeError(
                    f"cannot assign Param {name!r} before Module.__init__() is called"
                )
            if value.init_value is None:
                replaced = self._parameters.get(name)
                if replaced is None:
                    raise ValueError(
                        f"Param {name!r}: init_value=None takes the value of the parameter "
                        f"it replaces, but the module has no parameter {name!r}"
                    )
                value = Param(replaced.detach().clone(), value.constraint, value.event_dim)
            for store in (self._parameters, self._buffers, self._modules, self.__dict__):
                store.pop(name, None)
            priors[name] = (value, None)
            return
        if isinstance(value, Sample):
            if priors is None:
                raise AttributeError(
                    f"cannot assign Sample {name!r} before Module.__init__() is called"
                )
            shape = None
            replaced = self._parameters.get(name)
            if replaced is None:
                replaced = self._buffers.get(name)
            if replaced is not None:
                shape = replaced.shape
            elif name in priors:
                shape = priors[name][1]  # a new prior for the same replaced parameter
            for store in (self._parameters, self._buffers, self._modules, self.__dict__):
                store.pop(name, None)
            priors[name] = (value.prior, shape)
            return
        if (
            priors is not None
            and isinstance(priors.get(name, (None,))[0], Param)
            and isinstance(value, torch.Tensor)
            and not isinstance(value, torch.nn.Parameter)
        ):
            self._set_param_value(name, priors[name][0], value)
            return
        if priors is not None:
            priors.pop(name, None)
        super().__setattr__(name, value)
        if priors is not None and isinstance(value, torch.nn.Module):
            _adopt(value, _join(self._pt_name, name), self._pt_context)

    def add_module(self, name: str, module: torch.nn.Module | None) -> None:
        """``nn.Module.add_module`` (also ``register_module``, and a ``Module[nn.ModuleList]``'s
        ``append``): the child's random attributes are named under this module, as when it
        is assigned as an attribute."""
        super().add_module(name, module)
        priors = self.__dict__.get("_pt_priors")
        if priors is not None:
            priors.pop(name, None)
            if module is not None:
                _adopt(module, _join(self._pt_name, name), self._pt_context)

    def _set_param_value(self, name: str, param_attr: Param, value: torch.Tensor) -> None:
        """A tensor assigned to a :class:`Param` attribute is its value, as in Pyro: its new
        initial value, and its value in the active param store if the store holds it (an
        ``nn.Parameter`` assigned replaces the attribute by a plain parameter instead)."""
        value = value.detach().clone()
        priors = self.__dict__["_pt_priors"]
        priors[name] = (Param(value, param_attr.constraint, param_attr.event_dim), None)
        store, site = active_store(), _join(self._pt_name, name)
        if site in store:
            store[site] = value

    def __getattr__(self, name: str):
        priors = self.__dict__.get("_pt_priors")
        if priors is not None and name in priors:
            prior = priors[name][0]
            if self._pt_context.describing:
                return prior if isinstance(prior, Param) else Sample(prior)
            if isinstance(prior, Param):
                site = _join(self._pt_name, name)
                return param(site, prior.init_value, prior.constraint, prior.event_dim)
            return self._pt_sample(name, *priors[name])
        return super().__getattr__(name)

    def __delattr__(self, name: str) -> None:
        priors = self.__dict__.get("_pt_priors")
        if priors is not None and name in priors:
            del priors[name]
            return
        super().__delattr__(name)

    def _pt_sample(self, name: str, prior, shape) -> torch.Tensor:
        context = self._pt_context
        site = _join(self._pt_name, name)
        if context.depth > 0 and site in context.values:
            return context.values[site]
        if not isinstance(prior, torch.distributions.Distribution):
            prior = prior(self)
        if isinstance(prior, torch.Tensor):  # as Pyro's: a deterministic site of the module
            value = deterministic(site, prior)
        else:
            if shape is not None:
                prior = fit_prior(prior, shape, site)
            value = sample(site, prior)
        if context.depth > 0:
            context.values[site] = value
        return value

    def __call__(self, *args, **kwargs):
        return _call_drawing_once(self, super().__call__, *args, **kwargs)

    def __repr__(self) -> str:
        # ``extra_repr`` of layers reads attributes (nn.Linear: ``self.bias is not None``);
        # describing a module must not sample.
        context = self._pt_context
        context.describing += 1
        try:
            return super().__repr__()
        finally:
            context.describing -= 1

    def random_attributes(self) -> dict[str, Callable | torch.distributions.Distribution]:
        """``{site name: prior}`` of every :class:`Sample` attribute in this module's tree.

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> net = pt.nn.BayesianLinear(3, 2, name="head")
            >>> list(net.random_attributes())
            ['head.weight', 'head.bias']
        """
        out = {}
        for sub in self.modules():
            if isinstance(sub, Module):
                for attr, (prior, _) in sub._pt_priors.items():
                    if not isinstance(prior, Param):
                        out[_join(sub._pt_name, attr)] = prior
        return out
