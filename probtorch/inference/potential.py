"""From a model and its arguments to a potential energy over one flat unconstrained vector.

The model is traced once, eagerly, with validation on: that trace fixes the latent sites,
their shapes and their bijections to unconstrained space (``biject_to(support)``; a von
Mises angle is a point of the plane, see :mod:`probtorch.inference.angles`). From it
comes a pure function of ``z`` with shape ``(chains, dim)``::

    potential_energy(z) = -(log p(x, theta(z)) + log |det d theta / d z|)

batched over chains with ``torch.func.vmap``, and its gradient from
``torch.func.grad_and_value``. Both run under ``torch.compile(fullgraph=True)`` unless
compilation is switched off (``compile=False`` or ``PROBTORCH_COMPILE=0``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import pyro.distributions as pyro_dist
import torch
from torch.distributions import constraints

from .._caller import warn_at_caller
from .._errors import with_message
from ..handlers import Trace, seed, site_log_prob, substitute, trace
from ..params import param_scope, store_to_read
from ..runtime import Message, Messenger
from ..validation import (
    InvalidParameterError,
    ObservationOutsideSupportError,
    innermost,
    torch_validation,
)
from .angles import unconstraining_transform
from .compile import compile_enabled, compile_fn
from .data_layout import DataLayout
from .enumeration import (
    CollectFactors,
    EnumerateSites,
    Factor,
    draw_eliminated,
    enumerable,
    plate_nesting,
    pointwise_log_likelihood,
    sum_out,
)
from .init_strategies import check_value_names, init_to_uniform, on_latent_sites
from .safe_linalg import FactorizationGuard, nan_on_failure, traced
from .uncompilable import eager_fallback_note, raised_at

__all__ = ["LatentSite", "Potential", "initialize_model", "pack_init_params", "InitializationError"]


class InitializationError(RuntimeError):
    """No finite potential and gradient was found for the initial parameters."""


@dataclass(frozen=True)
class LatentSite:
    """A continuous latent site: where it sits in the flat vector and its shapes."""

    name: str
    shape: torch.Size  # constrained value
    unconstrained_shape: torch.Size
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.unconstrained_shape)


def _is_latent(site: Message) -> bool:
    return site.type == "sample" and not site.is_observed and not site.infer.get("is_auxiliary")


class _Unconstrain(Messenger):
    """Set latent sites from unconstrained values and accumulate the log |det J| terms.

    The bijection is looked up when the site is reached, so a support that depends on
    other latents (``Uniform(0, x)``) is handled.
    """

    def __init__(
        self,
        values: dict[str, torch.Tensor],
        sites: dict[str, LatentSite],
        enumerated: frozenset[str] = frozenset(),
        plate_nesting: int = 0,
    ):
        super().__init__()
        self.values = values
        self.sites = sites
        self.enumerated = enumerated  # discrete sites summed out (set by EnumerateSites)
        self.plate_nesting = plate_nesting
        self.log_det = None

    def process_message(self, msg: Message) -> None:
        if not _is_latent(msg) or msg.name in self.enumerated:
            return
        if msg.name not in self.values:
            raise ValueError(
                f"latent site {msg.name!r} did not appear when the model was first traced; "
                f"the latent sites of a model must not depend on the values of other sites"
            )
        shape = (
            torch.Size(msg.kwargs.get("sample_shape", ())) + msg.fn.batch_shape + msg.fn.event_shape
        )
        expected = self.sites[msg.name].shape
        if shape != expected and not (
            self.enumerated and _equal_but_enumerated(shape, expected, msg, self.plate_nesting)
        ):
            raise ValueError(
                f"latent site {msg.name!r} has shape {tuple(shape)} now but had shape "
                f"{tuple(expected)} when the model was first traced; latent shapes must not "
                f"depend on the values of other sites"
            )
        unconstrained = self.values[msg.name]
        transform = unconstraining_transform(msg.fn)
        value = transform(unconstrained)
        if self.enumerated and value.shape != expected:
            raise ValueError(
                f"the support of latent site {msg.name!r} depends on a discrete site that is "
                f"summed out ({sorted(self.enumerated)}): its values would take shape "
                f"{tuple(value.shape)} instead of {tuple(expected)}. HMC/NUTS need a "
                f"support that does not depend on enumerated sites"
            )
        log_det = transform.log_abs_det_jacobian(unconstrained, value).sum()
        self.log_det = log_det if self.log_det is None else self.log_det + log_det
        msg.value = value


def _equal_but_enumerated(
    shape: torch.Size, expected: torch.Size, msg: Message, plate_nesting: int
) -> bool:
    """Whether a latent site's shape equals its traced one but for dimensions of enumerated
    discrete sites (left of the plates) that its distribution's parameters carry."""
    event = len(msg.fn.event_shape)
    if shape[len(shape) - event :] != expected[len(expected) - event :]:
        return False
    batch = tuple(shape[: len(shape) - event])[-plate_nesting:] if plate_nesting else ()
    traced = tuple(expected[: len(expected) - event])
    while batch and batch[0] == 1:
        batch = batch[1:]
    while traced and traced[0] == 1:
        traced = traced[1:]
    return batch == traced


class _LogJoint(Messenger):
    """Sum the (masked, scaled) log densities of all sample sites."""

    def __init__(self):
        super().__init__()
        self.total = None

    def postprocess_message(self, msg: Message) -> None:
        if msg.type == "sample":
            term = site_log_prob(msg).sum()
            self.total = term if self.total is None else self.total + term


class _Record(Messenger):
    """Keep the values of latent and deterministic sites, but those in ``skip`` (summed-out
    sites and the deterministic ones that depend on them)."""

    def __init__(self, skip: frozenset[str] = frozenset()):
        super().__init__()
        self.skip = skip
        self.values: dict[str, torch.Tensor] = {}

    def postprocess_message(self, msg: Message) -> None:
        if msg.name in self.skip:
            return
        if _is_latent(msg) or msg.type == "deterministic":
            self.values[msg.name] = msg.value


class _Collect(Messenger):
    """Keep the sample sites of a run, without checks (for diagnosis at bad points).

    ``densities``: also evaluate each site's log density as it is reached, so a failure
    there is caught at its site (``in_density`` is that site while it is evaluated).
    """

    def __init__(self, densities: bool = False):
        super().__init__()
        self.sites: list[Message] = []
        self.densities = densities
        self.in_density: Message | None = None

    def postprocess_message(self, msg: Message) -> None:
        if msg.type == "sample":
            self.sites.append(msg)
            if self.densities:
                self.in_density = msg
                site_log_prob(msg)
                self.in_density = None


def _run_traced(model, args, kwargs, rng_seed, substitute_fn=None) -> Trace:
    """Run the model eagerly under seed and trace, with probtorch's site checks on.

    torch's own construction-time validation is off here so that an invalid parameter is
    reported by the site check, which can name the site.
    """
    fn = seed(model, rng_seed=rng_seed)
    if substitute_fn is not None:
        fn = substitute(fn, substitute_fn=on_latent_sites(substitute_fn))
    tracer = trace(fn)
    with torch_validation(False), nan_on_failure():
        try:
            tracer(*args, **kwargs)
        except Exception as error:
            if tracer.trace and hasattr(error, "add_note"):
                last = next(reversed(tracer.trace))
                error.add_note(f"(raised while running the model, after site {last!r})")
            raise
    return tracer.trace


def _unbatchable(text: str) -> str | None:
    """Why ``vmap`` could not batch a model over chains, from its error's text: ``"write"``
    for an in-place write of batched values into a tensor that is not batched
    (``x[1:] = theta``, ``x[idx] = theta``, ``x += theta``: vmap's own message, or, for an
    in-place add, the shapes'; the model has run unbatched at the prototype, so a shape
    error under vmap is the batching's); ``"python"`` for a latent value read in Python
    (``.item()``, ``int(x)``, ``if x > 0:``, ``.tolist()``); ``"shape"`` for entries
    selected by latent values (``x[x > 0]``, ``nonzero``, ``unique``: shapes that depend
    on values); else None.

    >>> _unbatchable("vmap: It looks like you're calling .item() on a Tensor")
    'python'
    """
    if "vmap" in text and "is not possible because there exists a Tensor" in text:
        return "write"
    if "doesn't match the broadcast shape" in text:
        return "write"
    if "vmap" in text and ("item()" in text or "data-dependent" in text):
        return "python"
    if "Cannot access data pointer of Tensor that doesn't have storage" in text:
        return "python"  # .tolist() or .numpy() of a batched tensor
    if "vmap" in text and "dynamic shape" in text:
        return "shape"
    return None


def _loop_over_chains(fn: Callable) -> Callable:
    """``fn`` of one chain's values for a batch of chains, by a loop over the leading
    dimension (outputs stacked): ``vmap``'s stand-in for models it cannot batch.

    >>> _loop_over_chains(lambda z: (z.sum(), {"x": 2 * z}))(torch.ones(3, 2))[1]["x"].shape
    torch.Size([3, 2])
    """

    def looped(batch):
        first = next(iter(torch.utils._pytree.tree_leaves(batch)))
        outputs = [
            fn(torch.utils._pytree.tree_map(lambda t, i=i: t[i], batch))
            for i in range(first.shape[0])
        ]
        return torch.utils._pytree.tree_map(lambda *parts: torch.stack(parts), *outputs)

    return looped


def _grad_of_sum(batched_value: Callable) -> Callable:
    """``(grad, value)`` of a function batched over chains by one reverse-mode pass of
    torch's autograd through the sum of its values: the chains are independent, so each
    row of the gradient is its chain's own. Eagerly about a quarter faster than
    ``vmap(grad_and_value(...))`` (one functorch layer less on every operation), with the
    same values; not for tracing (Dynamo cannot capture ``torch.autograd.grad``).

    >>> _grad_of_sum(lambda z: (z**2).sum(-1))(torch.ones(2, 3))
    (tensor([[2., 2., 2.],
            [2., 2., 2.]]), tensor([3., 3.]))
    """

    def grad_and_value(z):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            value = batched_value(z)
            grad = None
            if value.requires_grad:
                (grad,) = torch.autograd.grad(value.sum(), z, allow_unused=True)
        return (torch.zeros_like(z) if grad is None else grad), value.detach()

    return grad_and_value


def _traced_or_eager(traced_fn: Callable, eager_fn: Callable) -> Callable:
    """``traced_fn`` where ``torch.compile`` or ``make_fx`` captures the call, else
    ``eager_fn`` (the same function, faster run eagerly)."""

    def either(*args):
        return traced_fn(*args) if traced() else eager_fn(*args)

    return either


def _outside_autograd(fn: Callable) -> Callable:
    """``fn`` run with torch's autograd off (``torch.func.grad`` inside still takes its
    gradient): the model's tensors that require grad (a ``pt.param``, a module's weights)
    are constants to the sampler, and the outputs carry no graph, which would otherwise
    grow with every leapfrog step.

    >>> w = torch.ones(2, requires_grad=True)
    >>> grad, value = _outside_autograd(torch.func.grad_and_value(lambda z: (w * z).sum()))(
    ...     torch.ones(2))
    >>> grad, value.requires_grad
    (tensor([1., 1.]), False)
    """

    def outside(*args):
        if not torch.is_grad_enabled():
            return fn(*args)
        with torch.no_grad():
            return fn(*args)

    return outside


def _in_fitted_store(model: Callable) -> Callable:
    """``model``, run in the param store of the SVI that fitted it where one did and the
    caller chose no store (the store is looked up now, when the potential is built)."""
    store = store_to_read(model)
    if store is None:
        return model

    @functools.wraps(model)
    def in_store(*args, **kwargs):
        with param_scope(store):
            return model(*args, **kwargs)

    return in_store


def _seeds(rng_seed: int, count: int) -> list[int]:
    """``rng_seed`` followed by ``count - 1`` seeds derived from it."""
    generator = torch.Generator().manual_seed(rng_seed)
    # on the CPU generator's device whatever torch's default device is (a GPU, say)
    draws = torch.randint(0, 2**62, (count - 1,), generator=generator, device="cpu")
    return [rng_seed] + draws.tolist()


# Errors that reject one random initial point: another may pass.
_REJECTED_POINT = (InvalidParameterError, ObservationOutsideSupportError)


def _data_error(error: Exception, previous: Exception | None) -> bool:
    """Whether ``error`` is an observation outside a support that did not move between two
    random points: then the data are at fault, and more points will not help."""
    return (
        isinstance(error, ObservationOutsideSupportError)
        and previous is not None
        and str(error) == str(previous)
    )


def _initial_point_note(error: Exception, tries: int) -> None:
    if not hasattr(error, "add_note"):
        return
    if isinstance(error, ObservationOutsideSupportError) and tries > 2:
        error.add_note(
            f"(at each of the {tries} random initial points tried: the support depends on "
            f"latent values that these points never set to cover the data; start those "
            f"sites where it does, with init_params or init_strategy=init_to_value(...))"
        )
    elif isinstance(error, ObservationOutsideSupportError):
        error.add_note("(the same at two random initial points: the data do not fit)")
    else:
        error.add_note(f"(at each of the {tries} random initial points tried)")


def _run_traced_retrying(model, args, kwargs, seeds, substitute_fn) -> Trace:
    """:func:`_run_traced` at random initial points until no point is rejected.

    A random point can put a latent-dependent parameter outside its constraint (a
    correlation beyond 1 makes a covariance indefinite), or a latent-dependent support
    short of the data (``y ~ Uniform(0, theta)``); such a point is rejected, as Stan
    rejects an initial point, and the next seed is tried. If every point fails, the first
    error is raised; an observation outside a support that is the same at two points is a
    data error, raised at once.
    """
    first_error = previous = None
    tries = 0
    for rng_seed in seeds:
        tries += 1
        try:
            return _run_traced(model, args, kwargs, rng_seed, substitute_fn=substitute_fn)
        except _REJECTED_POINT as error:
            first_error = first_error or error
            if _data_error(error, previous):
                break
            previous = error
    _initial_point_note(first_error, tries)
    raise first_error


class Potential:
    """The potential energy of a model over a flat unconstrained vector, batched over chains.

    Args:
        model: the model function.
        model_args, model_kwargs: arguments for every call of the model.
        compile: compile the potential and its gradient (default: ``PROBTORCH_COMPILE``).
        rng_seed: seed for the one eager trace that discovers the latent sites.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model(y):
        ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        ...     sigma = pt.sample("sigma", dist.HalfNormal(1.0))
        ...     with pt.plate("n", len(y)):
        ...         pt.sample("y", dist.Normal(mu, sigma), obs=y)
        >>> pot = Potential(model, (torch.randn(20),), compile=False)
        >>> pot.dim
        2
        >>> value, grad = pot.value_and_grad(torch.zeros(4, pot.dim))
        >>> value.shape, grad.shape
        (torch.Size([4]), torch.Size([4, 2]))
    """

    def __init__(
        self,
        model: Callable,
        model_args: tuple = (),
        model_kwargs: dict | None = None,
        *,
        compile: bool | None = None,
        rng_seed: int = 0,
    ):
        # a model whose pt.param sites an SVI fitted reads them there (as MCMC does; Pyro's
        # one store holds them), unless the caller chose a store
        self.model = model = _in_fitted_store(model)
        self.model_args = tuple(model_args)
        self.model_kwargs = {} if model_kwargs is None else dict(model_kwargs)
        self.compiled = compile_enabled(compile)
        # failed factorizations are NaN (a divergence), not errors; eager evaluations of a
        # model that does not factorize run without the guard's per-operation cost
        self._linalg_guard = FactorizationGuard()
        # Latent values come from init_to_uniform, which (unlike a prior draw) also works for
        # improper priors such as ImproperUniform.
        self.prototype_trace = _run_traced_retrying(
            model, self.model_args, self.model_kwargs, _seeds(rng_seed, 100), init_to_uniform
        )
        self.sites = self._latent_sites(self.prototype_trace)
        # Discrete latent sites with a finite support are summed out (as Pyro's and
        # NumPyro's HMC do), each along a dimension of its own left of the plates.
        self.enumerated = frozenset(
            name
            for name, site in self.prototype_trace.items()
            if _is_latent(site) and enumerable(site)
        )
        self.plate_nesting = plate_nesting(self.prototype_trace.sample_sites().values())
        if self.enumerated:
            _check_plated(self.prototype_trace, self.plate_nesting, self.enumerated)
        self.site_names = [s.name for s in self.sites]
        self.dim = sum(s.size for s in self.sites)
        values = [self.prototype_trace[s.name].value for s in self.sites]
        # (a model whose latent sites are all summed out has no values: its discrete
        # sites can still be drawn, sample_discrete)
        self.dtype = values[0].dtype if values else torch.get_default_dtype()
        for v in values[1:]:
            self.dtype = torch.promote_types(self.dtype, v.dtype)
        self.device = values[0].device if values else _device_of(self.prototype_trace)
        self._sites_by_name = {s.name: s for s in self.sites}

        self.chains_looped = False  # set where the model cannot be vectorized over chains
        self.reads_latents_in_python = False  # which also keeps it from compiling
        self._batch_over_chains(torch.func.vmap)
        # What the model is called with: the arguments, with data matrices that it only
        # multiplies by narrow factors laid out for those products (the user's own stay in
        # model_args, which a continued run compares by identity).
        self._args, self._kwargs = (
            self._laid_out_arguments() if self.sites else (self.model_args, self.model_kwargs)
        )
        self._versions = _versions(self.model_args, self.model_kwargs)
        # deterministic sites that depend on a summed-out site: no value per draw
        self.enumerated_deterministic = (
            self._enumerated_deterministic() if self.enumerated else frozenset()
        )

    def _enumerated_deterministic(self) -> frozenset[str]:
        """Names of the deterministic sites whose values take the enumerated sites' dims
        (left out of the draws; the samplers warn), found from one eager run at the
        prototype; a model that reads an enumerated value in Python fails here, explained."""
        record = _Record(self.enumerated)
        z = _pack_trace(self, self.prototype_trace)
        try:
            with torch_validation(False), nan_on_failure(), record, self._unconstrain(z):
                self._run_model()
        except (RuntimeError, ValueError, TypeError) as error:
            if _reads_value(str(error)):
                raise self._enumerated_read_error(error) from error
            return frozenset()  # the potential's own evaluation reports it
        return frozenset(
            name
            for name, value in record.values.items()
            if self.prototype_trace[name].type == "deterministic"
            and value.shape != self.prototype_trace[name].value.shape
        )

    def _enumerated_read_error(self, error: Exception) -> ValueError:
        first = str(error).splitlines()[0]
        return ValueError(
            f"the model reads the value of a discrete site that is summed out "
            f"({sorted(self.enumerated)}) in Python ({type(error).__name__}: {first}). Such a "
            f"site takes all its values at once, along a dim of its own left of the plates, "
            f"so the model must use it as a tensor that broadcasts (locs[z], "
            f"torch.where(z > 0, a, b), z * x), not read it (if z:, int(z), z.item())"
        )

    def _batch_over_chains(self, batch: Callable) -> None:
        """The batched functions, from the single-chain ones by ``batch`` (``vmap``, or
        :func:`_loop_over_chains`)."""
        self._batched_value = batch(self._single_potential)
        self._batched_value_and_grad = _outside_autograd(
            _traced_or_eager(
                batch(torch.func.grad_and_value(self._single_potential)),
                _grad_of_sum(self._batched_value),
            )
        )
        self._value = compile_fn(self._batched_value, self.compiled)
        self._value_and_grad = compile_fn(self._batched_value_and_grad, self.compiled)
        # output only, not in a hot loop
        self._constrain = _outside_autograd(batch(self._single_constrain))
        self._batch = batch

    def _loop_chains(self, error: RuntimeError, why: str, z: torch.Tensor) -> None:
        """Evaluate the chains one after another from now on, with a warning: the model
        writes latent values in place into a tensor (``x[1:] = theta``; ``why="write"``),
        which ``vmap`` cannot batch, or reads them in Python (``if x > 0:``;
        ``why="python"``) or selects entries by them (``x[x > 0]``; ``why="shape"``), which
        neither ``vmap`` nor ``torch.compile`` can capture: such a model's chains also run
        eagerly, as Pyro runs every model."""
        first = str(error).split(". ")[0]
        if why in ("python", "shape"):
            site = self._failing_site(z)[0]
            where, users = raised_at(error)
            where = ", ".join(part for part in (site, where) if part)
            fix = (
                "Use torch operations such as torch.where, torch.clamp or masks instead to "
                "vectorize and compile it."
                if users
                else "That code is a library's (a distribution's, say): another distribution "
                "or a reparameterization of the site may vectorize and compile."
            )
            what = (
                "reads latent values in Python"
                if why == "python"
                else "selects entries by latent values (a boolean mask, nonzero or unique: "
                "shapes that depend on values)"
            )
            warn_at_caller(
                f"the model {what}{f' ({where})' if where else ''}, which can be neither "
                f"vectorized over chains nor compiled ({error.__class__.__name__}: {first}). "
                f"probtorch evaluates the chains one after another, eagerly: much slower. "
                f"Where a number read in Python (.item(), float(), int()) enters the density, "
                f"it carries no gradient, and the sampler moves less well (its target stays "
                f"the posterior). {fix}"
            )
            self.compiled = False
            self.reads_latents_in_python = True
        else:
            warn_at_caller(
                f"the model writes latent values in place into a tensor (such as "
                f"`x[1:] = theta` into `x = torch.zeros(5)`), which cannot be vectorized "
                f"over chains ({error.__class__.__name__}: {first}). probtorch evaluates "
                f"the chains one after another instead: slower, and a compiled sampler's "
                f"graph grows with num_chains. Build the tensor with torch.cat, "
                f"torch.stack or torch.where to vectorize it."
            )
        self.chains_looped = True
        self._batch_over_chains(_loop_over_chains)

    def arguments_unchanged(self) -> bool:
        """Whether no tensor argument was changed in place since the potential was made
        (the laid-out copies would then hold old values)."""
        return _versions(self.model_args, self.model_kwargs) == self._versions

    def _laid_out_arguments(self) -> tuple[tuple, dict]:
        """The model's arguments with the tensors that the potential's gradient uses only
        as matrices of narrow products (a regression's design matrix times one column of
        coefficients per chain) copied with their longer dimension contiguous
        (:class:`~.data_layout.DataLayout`, found from one eager gradient of two chains at
        the prototype's values)."""

        def gradient(*args, **kwargs):
            self._args, self._kwargs = args, kwargs
            z = _pack_trace(self, self.prototype_trace).expand(2, self.dim)
            with torch_validation(False):
                self._batched_value_and_grad(z)

        self._args, self._kwargs = self.model_args, self.model_kwargs
        layout = DataLayout.find(gradient, self.model_args, self.model_kwargs)
        return layout.apply(self.model_args, self.model_kwargs)

    @property
    def largest_numel(self) -> int:
        """Elements in the model's largest tensor for one chain: a site's value or log
        density terms, an argument, or the unconstrained vector. Samplers choose code
        generation by it (vector instructions pay off only on long loops)."""
        sizes = [self.dim]
        for site in self.prototype_trace.values():
            if isinstance(site.value, torch.Tensor):
                sizes.append(site.value.numel())
            shape = getattr(site.fn, "batch_shape", None)
            if shape is not None:
                sizes.append(torch.Size(shape).numel())
        for x in torch.utils._pytree.tree_leaves((self.model_args, self.model_kwargs)):
            if isinstance(x, torch.Tensor):
                sizes.append(x.numel())
        return max(sizes)

    # -- set-up -----------------------------------------------------------------------
    def _latent_sites(self, tr: Trace) -> list[LatentSite]:
        sites, offset = [], 0
        for name, site in tr.items():
            if site.type == "plate" and site.args[1] < site.args[0]:
                if site.extra.get("indices_given"):
                    raise ValueError(
                        f"plate {name!r} is given {site.args[1]} of its {site.args[0]} rows "
                        f"(subsample=...); MCMC needs all rows of the data (its potential "
                        f"would be scaled by size/subsample_size, a posterior of other "
                        f"data): pass all rows, or no subsample"
                    )
                raise ValueError(
                    f"plate {name!r} subsamples {site.args[1]} of {site.args[0]} elements; "
                    f"a potential for MCMC needs the full data (remove subsample_size)"
                )
            if not _is_latent(site):
                continue
            support = site.fn.support
            if support.is_discrete:
                if enumerable(site):
                    _check_enumerable(site)
                    continue  # summed out of the potential (self.enumerated)
                enumerate_ = site.infer.get("enumerate", "parallel")
                why = (
                    f"its infer={{'enumerate': {enumerate_!r}}} asks for an enumeration that "
                    f"HMC/NUTS do not do (they sum discrete sites out in parallel: remove "
                    f"the annotation or make it 'parallel')"
                    if enumerate_ != "parallel"
                    else _not_enumerable(site)
                )
                raise ValueError(
                    f"latent site {name!r} has the discrete distribution "
                    f"{type(site.fn).__name__} (support {support}), and {why}. HMC/NUTS "
                    f"move continuous latent sites only: marginalize it out in the model "
                    f"(e.g. a mixture distribution, or torch.logsumexp in pt.factor), or "
                    f"observe it"
                )
            if isinstance(innermost(site.fn), pyro_dist.Delta):
                raise ValueError(
                    f"latent site {name!r} has the distribution Delta, a point mass: HMC/NUTS "
                    f"cannot move it (its log density is -inf off the point); record a value "
                    f"computed from other sites with pt.deterministic({name!r}, value), or "
                    f"observe it"
                )
            transform = unconstraining_transform(site.fn)
            shape = site.value.shape
            unconstrained_shape = torch.Size(transform.inverse_shape(shape))
            sites.append(LatentSite(name, shape, unconstrained_shape, offset))
            offset += math.prod(unconstrained_shape)
        if not sites and not any(_is_latent(site) and enumerable(site) for site in tr.values()):
            raise ValueError("the model has no latent sample sites: there is nothing to infer")
        return sites

    # -- packing ----------------------------------------------------------------------
    def unpack(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split ``z`` of shape ``(..., dim)`` into unconstrained values per site."""
        batch = z.shape[:-1]
        return {
            s.name: z[..., s.offset : s.offset + s.size].reshape(batch + s.unconstrained_shape)
            for s in self.sites
        }

    def pack(self, values: dict[str, torch.Tensor], constrained: bool = True) -> torch.Tensor:
        """Flatten per-site values (constrained by default) into ``z`` of shape ``(..., dim)``.

        Bijections are taken from the prototype trace, so this is for sites whose support
        does not depend on other latents.
        """
        parts = []
        for s in self.sites:
            if s.name not in values:
                raise KeyError(f"pack: no value for latent site {s.name!r}")
            value = torch.as_tensor(values[s.name], dtype=self.dtype, device=self.device)
            if constrained:
                value = unconstraining_transform(self.prototype_trace[s.name].fn).inv(value)
            batch = value.shape[: value.dim() - len(s.unconstrained_shape)]
            parts.append(value.reshape(batch + (s.size,)))
        return torch.cat(parts, dim=-1)

    # -- single-chain functions (vmapped, compiled) -------------------------------------
    def _unconstrain(self, z: torch.Tensor) -> _Unconstrain:
        sites, nesting = self._sites_by_name, self.plate_nesting
        return _Unconstrain(self.unpack(z), sites, self.enumerated, nesting)

    def _enumerate(self) -> EnumerateSites:
        """Sets the discrete sites to their supports; to be entered after the others."""
        return EnumerateSites(self.enumerated, -self.plate_nesting - 1)

    def _run_model(self) -> None:
        """Run the model on the potential's arguments, with its discrete sites set to all
        their values (summed out by whoever collects the densities) where it has any."""
        if self.enumerated:
            with self._enumerate():
                self.model(*self._args, **self._kwargs)
        else:
            self.model(*self._args, **self._kwargs)

    def _single_potential(self, z: torch.Tensor) -> torch.Tensor:
        total = self._linalg_guard(lambda: self._log_density(z))
        # in the latent values' dtype: a density computed in another (Pyro's
        # SineBivariateVonMises builds its normalizer in torch's default dtype) would make
        # the sampler's energies another dtype than its positions
        return (-total).to(z.dtype)

    def _log_density(self, z: torch.Tensor) -> torch.Tensor:
        """``log p(x, theta(z)) + log |det d theta / d z|`` of one chain, discrete sites
        summed out; factorizations that fail raise (see :attr:`_linalg_guard`)."""
        unconstrain = self._unconstrain(z)
        if self.enumerated:
            factors, enumerate_ = CollectFactors(), self._enumerate()
            with factors, unconstrain, enumerate_:
                self.model(*self._args, **self._kwargs)
            return sum_out(factors.factors, self.plate_nesting) + unconstrain.log_det
        log_joint = _LogJoint()
        with log_joint, unconstrain:
            self.model(*self._args, **self._kwargs)
        return log_joint.total + unconstrain.log_det

    def _single_constrain(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        def run():
            record = _Record(self.enumerated | self.enumerated_deterministic)
            with record, self._unconstrain(z):
                self._run_model()
            return record.values

        return self._linalg_guard(run)

    def raw_value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(value, grad)`` batched over chains, uncompiled and unchecked.

        For use inside compiled kernels (which trace it) with distribution validation off.
        """
        grad, value = self._batched_value_and_grad(z)
        return value, grad

    # -- public, batched over chains ---------------------------------------------------
    def _check_z(self, z: torch.Tensor) -> None:
        if z.dim() != 2 or z.shape[-1] != self.dim:
            raise ValueError(
                f"z must have shape (chains, {self.dim}) for latent sites {self.site_names}, "
                f"got {tuple(z.shape)}"
            )

    def _explained(self, name: str, z: torch.Tensor):
        """``self.<name>(z)`` with ``z`` checked and validation off; a failure of the model
        is explained (:meth:`_explain_failure`). Where torch.compile cannot capture the
        model, the potential runs eagerly from then on, with a warning saying why and where
        (as the samplers do); where vmap cannot batch it, chain by chain
        (:meth:`_loop_chains`)."""
        self._check_z(z)
        with torch_validation(False):
            try:
                return getattr(self, name)(z)
            except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.TorchRuntimeError) as error:
                # Dynamo's error on tracing (a mask under vmap, or a failure of the model
                # itself): the eager run that follows raises the model's own error, if any
                if not self.compiled:
                    raise
                self.compiled = False
                self._value = self._batched_value
                self._value_and_grad = self._batched_value_and_grad
                result = self._explained(name, z)
                if not self.reads_latents_in_python:  # which its own warning explains
                    warn_at_caller(eager_fallback_note("evaluating the potential eagerly", error))
                return result
            except ValueError as error:
                if self.enumerated and _reads_value(str(error)):
                    raise self._enumerated_read_error(error) from error
                raise
            except RuntimeError as error:
                if self.enumerated and _reads_value(str(error)):
                    raise self._enumerated_read_error(error) from error
                why = None if self.chains_looped else _unbatchable(str(error))
                if why is not None:
                    self._loop_chains(error, why, z)
                    return self._explained(name, z)
                self._explain_failure(z, error)
                raise

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        """Potential energy, shape ``(chains,)``."""
        return self._explained("_value", z)

    potential_energy = __call__

    def value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Potential energy ``(chains,)`` and its gradient ``(chains, dim)``."""
        grad, value = self._explained("_value_and_grad", z)
        return value, grad

    def eager_value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`value_and_grad` evaluated eagerly (no compile), for a few calls at set-up;
        a failure of the model is explained as there."""
        return self._explained("raw_value_and_grad", z)

    def _explain_failure(self, z: torch.Tensor, error: RuntimeError) -> None:
        """Re-run eagerly, batched as before, to find the site after which the model
        failed."""
        where, detail, batched_error = self._failing_site(z)
        if batched_error is None:
            return
        text = str(batched_error)
        advice = ""
        if "random operation" in text:
            advice = (
                " A potential is a deterministic function of the latent values, but the "
                "model draws random numbers outside pt.sample: a module in training mode "
                "(Dropout; call net.eval()) or a torch sampler such as torch.randn. Make "
                "such randomness a pt.sample site, or remove it."
            )
        batched = "chain by chain" if self.chains_looped else "for all chains at once"
        raise ValueError(
            f"the model failed {where}{detail} when evaluated {batched} "
            f"({type(batched_error).__name__}: {text.splitlines()[0]}).{advice}"
        ) from error

    def _failing_site(self, z: torch.Tensor) -> tuple[str, str, RuntimeError | None]:
        """Where the model fails for the chains at ``z`` (batched as the potential is): in
        the log density of a site, after a site or before the first; what that means, for
        an error message ("" or a parenthesis); and the error (None where it did not fail
        again)."""
        collect = _Collect(densities=True)

        def run(z_chain):
            with nan_on_failure(), collect, self._unconstrain(z_chain):
                self._run_model()
            return z_chain.sum()

        try:
            self._batch(run)(z.detach())
        except RuntimeError as error:
            failed, detail = collect.in_density, ""
            if failed is not None:
                where = (
                    f"in the log density of site {failed.name!r} "
                    f"({type(failed.fn).__name__}.log_prob)"
                )
            elif collect.sites:
                where = f"after site {collect.sites[-1].name!r}"
                detail = (
                    " (in the code that follows it, up to the next site, e.g. building that "
                    "site's distribution)"
                )
            else:
                where = "before its first site"
            return where, detail, error
        return "", "", None

    def constrain(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        """Constrained values of the latent and deterministic sites, batched like ``z``."""
        return self._explained("_constrain", z)

    def log_likelihood(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Pointwise log likelihood of each observed site, for a batch of latent values.

        ``values`` are constrained draws per latent site with one leading batch dimension;
        returns ``{site: (N, *site_batch_shape)}`` (masked, not scaled; ``N = 1`` for a
        model without continuous latent sites). ``pt.factor`` sites count, as in NumPyro
        (a likelihood written ``pt.factor("ll", logp)`` in a plate is pointwise).
        """

        def single(latent):
            with torch_validation(False), nan_on_failure():
                if self.enumerated:
                    return self._enumerated_log_likelihood(latent)
                tr = trace(substitute(self.model, data=latent)).get_trace(
                    *self._args, **self._kwargs
                )
            return tr.log_likelihood(factors=True)

        latent = {name: values[name] for name in self.site_names}
        from ..validation import enable_validation, is_validation_enabled

        was = is_validation_enabled()
        enable_validation(False)  # per-draw values need no re-checking
        try:
            if not latent:  # every latent site summed out: one value, whatever the draws
                return {name: value.unsqueeze(0) for name, value in single({}).items()}
            return self._per_draw(single, latent)
        finally:
            enable_validation(was)

    def _per_draw(self, fn: Callable, latent: dict):
        """``fn`` of one draw's latent values, for a batch of draws: by ``vmap``, or a loop
        over the draws for a model ``vmap`` cannot batch (outputs stacked)."""
        if not self.chains_looped:
            try:
                return torch.func.vmap(fn)(latent)
            except RuntimeError as error:
                if _unbatchable(str(error)) is None:
                    raise
        return _loop_over_chains(fn)(latent)

    def _enumerated_log_likelihood(self, latent: dict) -> dict[str, torch.Tensor]:
        """:meth:`log_likelihood` for one draw of a model with enumerated sites: each
        observed site's ``log p(y_i | theta)`` with the discrete sites summed out."""
        factors, enumerate_ = CollectFactors(apply_scale=False), self._enumerate()
        tracer = trace()
        with factors, tracer, enumerate_:
            substitute(self.model, data=latent)(*self._args, **self._kwargs)
        observed = [  # factors included, but not a prior's (NeuTraReparam's)
            name
            for name, site in tracer.trace.sample_sites(observed=True).items()
            if not site.infer.get("prior_term", False)
        ]
        return pointwise_log_likelihood(factors.factors, observed, self.plate_nesting)

    def sample_discrete(
        self,
        values: dict[str, torch.Tensor],
        seed: int | None = None,
        num_draws: int = 1,
        temperature: float = 1,
    ) -> dict[str, torch.Tensor]:
        """Draws of the summed-out discrete sites from their distribution given each draw of
        the continuous ones and the data (NumPyro's ``infer_discrete``, Pyro's
        ``infer_discrete``): a mixture model's component assignments, say.

        ``values`` are constrained draws per continuous latent site with one leading batch
        dimension (``MCMC.get_samples()``); returns ``{site: (N, *site shape)}``
        (``N = num_draws`` for a model without continuous latent sites). The model runs
        once per draw with the sites summed out as for the log density, keeping each site's
        joint term before its sum; the sites are then drawn in the reverse order, each
        given the draws so far (:func:`~probtorch.inference.enumeration.draw_eliminated`),
        so that together they are a draw from their joint conditional distribution, at a
        cost linear in their number (a ``pt.markov`` chain's states, say).
        ``temperature=0`` (as Pyro's ``infer_discrete``) gives instead their most probable
        joint value given each draw (max-product in place of the sums).

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> def model(y):
            ...     loc = pt.sample("loc", dist.Normal(0.0, 5.0))
            ...     with pt.plate("data", len(y)):
            ...         z = pt.sample("z", dist.Bernoulli(0.5))
            ...         pt.sample("y", dist.Normal(torch.where(z > 0, loc, -loc), 0.1), obs=y)
            >>> potential = Potential(model, (torch.tensor([-3.0, 3.0, 3.1]),), compile=False)
            >>> potential.sample_discrete({"loc": torch.full((2,), 3.0)}, seed=0)["z"]
            tensor([[0., 1., 1.],
                    [0., 1., 1.]])
        """
        if temperature not in (0, 1):
            raise ValueError(f"temperature must be 0 or 1, got {temperature!r}")
        if not self.enumerated:
            return {}
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(torch.randint(0, 2**62, ()).item()) if seed is None else seed)
        latent = {name: values[name] for name in self.site_names}
        maximize = temperature == 0
        steps: list = []  # (variable, dims) of each site summed out, the same for every draw
        supports: dict[str, torch.Tensor] = {}

        def joints(latent: dict) -> list[torch.Tensor]:
            factors, enumerate_ = CollectFactors(), self._enumerate()
            with nan_on_failure(), factors, enumerate_:
                substitute(self.model, data=latent)(*self._args, **self._kwargs)
            tape: list = []
            sum_out(factors.factors, self.plate_nesting, maximize=maximize, tape=tape)
            steps[:] = [(variable, dims) for variable, dims, _ in tape]
            supports.update(enumerate_.supports)
            return [joint for _, _, joint in tape]

        with torch_validation(False):
            if latent:
                tensors = self._per_draw(joints, latent)
            else:  # nothing varies from draw to draw
                tensors = [t.expand((num_draws,) + t.shape) for t in joints(latent)]
        shapes = {}
        for name in self.enumerated:
            batch = tuple(self.prototype_trace[name].fn.batch_shape)
            shapes[name] = (1,) * (self.plate_nesting - len(batch)) + batch
        indices = draw_eliminated(
            steps, tensors, self.plate_nesting, shapes, generator, maximize=maximize
        )
        drawn = {}
        for name, index in indices.items():
            site = self.prototype_trace[name]
            batch, event = tuple(site.fn.batch_shape), tuple(site.fn.event_shape)
            value = supports[name][index.reshape(-1)]
            drawn[name] = value.reshape(index.shape[:1] + batch + event)
        return {name: drawn[name] for name in self.prototype_trace if name in drawn}

    # -- diagnosis -------------------------------------------------------------------
    def nonfinite_sites(self, z: torch.Tensor) -> list[str]:
        """Names of the sites whose log density, Jacobian or gradient is not finite at ``z``.

        ``z`` has shape ``(dim,)``; evaluated eagerly, site by site.
        """
        z = z.detach().requires_grad_(True)
        unconstrain = self._unconstrain(z)
        collect = _Collect()
        with torch_validation(False):
            with nan_on_failure(), collect, unconstrain:
                self._run_model()
            log_probs = {site.name: site_log_prob(site) for site in collect.sites}
            bad = [name for name, lp in log_probs.items() if not bool(torch.isfinite(lp).all())]
            if self.enumerated:
                factors = [Factor.of_site(site, log_probs[site.name]) for site in collect.sites]
                log_joint = sum_out(factors, self.plate_nesting)
            else:
                log_joint = sum(lp.sum() for lp in log_probs.values())
            total = -(log_joint + unconstrain.log_det)
            if z.grad is None and total.requires_grad:
                (grad,) = torch.autograd.grad(total, z, allow_unused=True)
            else:
                grad = None
        if grad is not None:
            for s in self.sites:
                block = grad[s.offset : s.offset + s.size]
                if not bool(torch.isfinite(block).all()) and s.name not in bad:
                    bad.append(s.name)
        return bad


def initialize_model(
    model: Callable,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    *,
    num_chains: int = 1,
    init_strategy: Callable = init_to_uniform,
    init_params: dict | None = None,
    rng_seed: int = 0,
    compile: bool | None = None,
    max_tries: int = 100,
) -> tuple[Potential, torch.Tensor]:
    """Build the :class:`Potential` of a model and find finite initial points for each chain.

    Returns ``(potential, z0)`` with ``z0`` of shape ``(num_chains, potential.dim)``; at
    each row the potential and its gradient are finite. ``init_params`` (constrained
    values per site, each with or without a leading chain dimension) take precedence over
    ``init_strategy``.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("scale", dist.HalfCauchy(1.0))
        >>> potential, z0 = initialize_model(model, num_chains=3, compile=False)
        >>> z0.shape
        torch.Size([3, 1])
    """
    potential = Potential(model, model_args, model_kwargs, compile=compile, rng_seed=rng_seed)
    if not potential.sites:
        raise ValueError(
            f"the model has no continuous latent sample sites (its discrete ones, "
            f"{sorted(potential.enumerated)}, are summed out): there is nothing for "
            f"HMC/NUTS to sample"
        )
    if potential.enumerated_deterministic:
        warn_at_caller(
            f"the deterministic sites {sorted(potential.enumerated_deterministic)} depend on "
            f"discrete sites that are summed out ({sorted(potential.enumerated)}), which take "
            f"all their values at once, so they have no value per draw and are left out of "
            f"the samples. Predictive(model, samples, infer_discrete=True) draws the discrete "
            f"sites given each draw and computes them from those"
        )
    check_value_names(init_strategy, potential.prototype_trace)
    if init_params is not None:
        z0 = pack_init_params(potential, init_params, num_chains)
        _check_finite(potential, z0, "init_params")
        return potential, z0

    generator = torch.Generator().manual_seed(rng_seed)
    seeds = torch.randint(
        0, 2**62, (num_chains, max_tries), generator=generator, device="cpu"
    ).tolist()
    rows = []
    for chain in range(num_chains):
        z = previous = None
        for attempt in range(max_tries):
            try:
                tr = _run_traced(
                    potential.model,  # (in the fitted SVI's store, where one applies)
                    potential.model_args,
                    potential.model_kwargs,
                    seeds[chain][attempt],
                    substitute_fn=init_strategy,
                )
            except _REJECTED_POINT as error:
                if attempt == max_tries - 1 or _data_error(error, previous):
                    raise InitializationError(
                        f"no valid initial parameters after {attempt + 1} tries (chain "
                        f"{chain}): {error}"
                    ) from error
                previous = error
                continue
            z = _pack_trace(potential, tr)
            with torch_validation(False):
                grad, value = torch.func.grad_and_value(potential._single_potential)(z)
            if bool(torch.isfinite(value)) and bool(torch.isfinite(grad).all()):
                break
        else:
            bad = potential.nonfinite_sites(z)
            raise InitializationError(
                f"could not find initial parameters with a finite potential and gradient "
                f"after {max_tries} tries (chain {chain}, strategy "
                f"{getattr(init_strategy, '__name__', init_strategy)}); non-finite at "
                f"site(s) {bad}. Check their priors and data, or pass init_params."
            )
        rows.append(z)
    return potential, torch.stack(rows)


def pack_init_params(potential: Potential, init_params: dict, num_chains: int) -> torch.Tensor:
    """Initial points ``(num_chains, dim)`` from constrained values per latent site.

    Each value has the site's shape (every chain starts there) or one more leading
    dimension of ``num_chains`` (one start per chain). Every latent site needs a value;
    a name that is no latent site, a shape that fits neither form or a value outside the
    site's support is an error naming the site.

    Example::

        >>> import probtorch as pt, probtorch.distributions as dist
        >>> def model():
        ...     pt.sample("scale", dist.HalfNormal(1.0))
        >>> potential = Potential(model, compile=False)
        >>> pack_init_params(potential, {"scale": torch.tensor([1.0, 2.0])}, 2).exp()
        tensor([[1.],
                [2.]])
    """
    if not isinstance(init_params, dict):
        raise TypeError(
            f"init_params must be a dict of constrained values by site name, got "
            f"{type(init_params).__name__}"
        )
    unknown = sorted(set(init_params) - set(potential.site_names))
    summed_out = [name for name in unknown if name in potential.enumerated]
    if summed_out:
        raise ValueError(
            f"init_params has {summed_out}, discrete site(s) that HMC/NUTS sum out (enumerate): "
            f"they have no position in the chain and take no initial value; the chain's latent "
            f"sites are {potential.site_names} (draw the discrete ones afterwards with "
            f"Predictive(..., infer_discrete=True))"
        )
    if unknown:
        raise ValueError(
            f"init_params has {unknown}, which are not latent sites of this model; its latent "
            f"sites are {potential.site_names}"
        )
    missing = [name for name in potential.site_names if name not in init_params]
    if missing:
        raise ValueError(
            f"init_params has no value for latent site(s) {missing}: give every latent site, "
            f"or start some with init_strategy=init_to_value(values=...) on the kernel"
        )
    values = {}
    for s in potential.sites:
        value = torch.as_tensor(init_params[s.name], dtype=potential.dtype, device=potential.device)
        if value.shape == s.shape:
            value = value.expand((num_chains,) + s.shape)
        elif value.shape != (num_chains,) + s.shape:
            raise ValueError(
                f"init_params[{s.name!r}] has shape {tuple(value.shape)}; site {s.name!r} has "
                f"shape {tuple(s.shape)}, so give {tuple(s.shape)} (every chain) or "
                f"{(num_chains,) + tuple(s.shape)} (one per chain, num_chains={num_chains})"
            )
        values[s.name] = value.detach()
    rows = []
    for chain in range(num_chains):
        # the model runs at the given values, so a support that depends on other latents
        # (x ~ Uniform(0, a)) is the one at this chain's a
        start = {name: v[chain] for name, v in values.items()}

        def checked(site, start=start, chain=chain):
            # checked as each site is reached: a start outside its support would otherwise
            # fail a later site that uses it (a negative scale), which the error would name
            value = start.get(site.name)
            if value is None:
                return None
            where = f"init_params[{site.name!r}] (chain {chain})"
            family = f"{type(site.fn).__name__}, support {site.fn.support}"
            if bool(torch.isnan(value).any()):
                raise ValueError(f"{where} is NaN (site {site.name!r}: {family})")
            if bool(torch.isinf(value).any()):
                raise ValueError(f"{where} is infinite (site {site.name!r}: {family})")
            if not bool(site.fn.support.check(value).all()):
                raise ValueError(
                    f"{where} lies outside the support of site {site.name!r} ({family})"
                )
            # on the support's boundary (0 for a nonnegative site): no unconstrained value
            # (torch's sigmoid inverse clamps, so a Beta site at 1 maps to 36.04: the bounds
            # of a closed interval are looked for by value)
            unconstrained = unconstraining_transform(site.fn).inv(value)
            if _on_closed_bound(site.fn.support, value) or not bool(
                torch.isfinite(unconstrained).all()
            ):
                raise ValueError(
                    f"{where} lies on the boundary of the support of site {site.name!r} "
                    f"({family}), where its unconstrained value is infinite: start inside it"
                )
            return value

        try:
            tr = _run_traced(
                potential.model, potential.model_args, potential.model_kwargs, 0,
                substitute_fn=checked,
            )  # fmt: skip
        except _REJECTED_POINT as error:  # a support or constraint that depends on them
            raise with_message(
                error,
                f"at init_params (chain {chain}): {error}; choose init_params where the "
                f"model's observations and parameters are valid",
            ) from error
        rows.append(_pack_trace(potential, tr))
    return torch.stack(rows).detach()


def _on_closed_bound(support, value: torch.Tensor) -> bool:
    """Whether ``value`` lies on a bound that a closed interval support includes
    (``unit_interval``'s 0 and 1, ``nonnegative``'s 0), which no unconstrained value reaches.

    >>> from torch.distributions import constraints
    >>> _on_closed_bound(constraints.unit_interval, torch.tensor([0.5, 1.0]))
    True
    """
    while isinstance(support, constraints._IndependentConstraint):
        support = support.base_constraint
    bounds = []
    if isinstance(support, (constraints._Interval, constraints._HalfOpenInterval)):
        bounds.append(support.lower_bound)
    if isinstance(support, constraints._Interval):
        bounds.append(support.upper_bound)
    if isinstance(support, constraints._GreaterThanEq):
        bounds.append(support.lower_bound)
    return any(bool((value == bound).any()) for bound in bounds)


def _not_enumerable(site: Message) -> str:
    """Why a discrete site cannot be summed out: its distribution cannot list its values."""
    if isinstance(site.fn, torch.distributions.Independent):
        return (
            "its values cannot be listed one site element at a time (.to_event() makes "
            "its elements one joint value): put the site in a pt.plate over those dims "
            "instead, and each element is summed out on its own"
        )
    return (
        f"{type(site.fn).__name__} cannot list its values (has_enumerate_support is False: "
        f"an infinite support, as Poisson's, or a joint one, as Multinomial's), so it "
        f"cannot be summed out (HMC/NUTS sum out discrete sites such as Bernoulli, "
        f"Categorical or Binomial)"
    )


def _check_enumerable(site: Message) -> None:
    """Refuse, naming the site, a distribution whose values cannot be listed for its
    parameters (a Binomial whose total_count varies across its batch)."""
    try:
        site.fn.enumerate_support(expand=False)
    except (NotImplementedError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"latent site {site.name!r} ({type(site.fn).__name__}) is discrete and would "
            f"be summed out, but its values cannot be listed for these parameters "
            f"({type(error).__name__}: {error}). Split it into sites whose values can be "
            f"(e.g. one per total_count), or marginalize it out in the model"
        ) from error


def _check_plated(tr: Trace, nesting: int, enumerated: frozenset[str]) -> None:
    """With discrete sites summed out along dimensions left of the plates, every batch
    dimension of every site must be one of its plates' (as Pyro checks site shapes)."""
    for name, site in tr.sample_sites().items():
        batch = tuple(site_log_prob(site).shape)
        plates = {frame.dim: frame for frame in site.cond_indep_stack}
        for dim in range(-len(batch), 0):
            if batch[dim] != 1 and dim not in plates:
                declared = ", ".join(f"{f.name!r} at dim {f.dim}" for f in plates.values())
                raise ValueError(
                    f"site {name!r} has batch shape {batch}, whose dim {dim} (size "
                    f"{batch[dim]}) is none of its plates' ({declared or 'none'}). "
                    f"The model's discrete sites {sorted(enumerated)} are summed out along "
                    f"dimensions left of its {nesting} plate dims, so every batch dimension "
                    f"must be declared: put the site in a pt.plate over that dim, or move it "
                    f"into the event with .to_event()"
                )


def _reads_value(text: str) -> bool:
    """Whether an error says that a tensor of several values was read as one (``if z:``,
    ``int(z)``): what a model does when it reads an enumerated site's value in Python."""
    return any(
        part in text
        for part in (
            "Boolean value of Tensor with more than one value",
            "only one element tensors can be converted",
            "cannot be converted to Scalar",
        )
    )


def _device_of(tr: Trace) -> torch.device:
    for site in tr.values():
        if isinstance(site.value, torch.Tensor):
            return site.value.device
    return torch.device("cpu")


def _versions(args: tuple, kwargs: dict) -> list:
    """The version counters of the tensors among ``args`` and ``kwargs`` (None for a tensor
    made in inference mode, which has none)."""
    versions = []
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor):
            versions.append(None if x.is_inference() else x._version)
    return versions


def _pack_trace(potential: Potential, tr: Trace) -> torch.Tensor:
    parts = [torch.zeros(0, dtype=potential.dtype, device=potential.device)]
    for s in potential.sites:
        if s.name not in tr:
            raise ValueError(
                f"latent site {s.name!r} appeared when the model was first traced but not in "
                f"this run of it (at a new initial point); the latent sites of a model must "
                f"not depend on the values of other sites"
            )
        site = tr[s.name]
        if site.value.shape != s.shape:
            raise ValueError(
                f"latent site {s.name!r} has shape {tuple(site.value.shape)} in this run but had "
                f"shape {tuple(s.shape)} when the model was first traced; latent shapes must "
                f"not depend on the values of other sites"
            )
        unconstrained = unconstraining_transform(site.fn).inv(site.value)
        parts.append(unconstrained.reshape(s.size).to(potential.dtype))
    return torch.cat(parts).detach()


def _check_finite(potential: Potential, z0: torch.Tensor, what: str) -> None:
    for chain in range(z0.shape[0]):
        with torch_validation(False):
            grad, value = torch.func.grad_and_value(potential._single_potential)(z0[chain])
        if not (bool(torch.isfinite(value)) and bool(torch.isfinite(grad).all())):
            bad = potential.nonfinite_sites(z0[chain])
            raise InitializationError(
                f"{what}: the potential or its gradient is not finite for chain {chain}; "
                f"non-finite at site(s) {bad}"
            )
