"""Subclasses that fix Pyro and torch families, exported under the same names.

Compilation. Pyro's ``Categorical.log_prob`` checks whether ``value`` is its own enumerated
support by comparing ``id(self)`` with a tag on the tensor (a speed-up for enumeration).
Dynamo cannot compare the id of an object created inside a compiled region, so a model
that observes a ``Categorical`` (or an ``OrderedLogistic``, which derives from it) could
not be compiled.
The subclasses here take torch's ``log_prob`` while compiling and Pyro's otherwise; the
results are the same.

Sampling. torch's ``LKJCholesky`` (and Pyro's ``LKJ``, which samples through it) draws row
``i`` of the onion method from ``Beta(i - 1/2, ...)`` where the method needs
``Beta(i/2, ...)`` (NumPyro has ``0.5 * offset + 0.5``): prior draws of correlations were
too dispersed for ``dim >= 3`` (log densities were right). Pyro's ``LKJ.expand`` raised
``NotImplementedError``, so ``LKJ`` could not sit in a plate. Both are fixed here.

Batching. torch's ``Multinomial.log_prob`` zeroes the ``-inf`` logits of zero counts by
boolean-mask assignment, which ``torch.func.vmap`` cannot batch (NUTS evaluates the model
under ``vmap`` over chains), so a model observing a ``Multinomial`` could not be sampled.
The ``Multinomial`` here selects with ``torch.where``; the values are the same.

Messages. ``Beta``, ``BetaBinomial``, ``FisherSnedecor`` and ``Pareto`` build an inner
distribution before validating their own parameters, so torch's error for an invalid
``concentration1`` named the inner ``Dirichlet``'s ``concentration``; ``ContinuousBernoulli``
said only "The parameter probs has invalid values". These subclasses check
their own parameters first (when validation is on), so the message names the parameter
the user passed and its constraint.

Gradients. torch's ``Dirichlet.rsample`` (and so ``Beta.rsample``) differentiates through
an ``autograd.Function`` written in the old style, which ``torch.func.grad`` refuses ("it
must override the setup_context staticmethod"), so a Beta or Dirichlet guide could not be
fitted by SVI, whose step takes its gradient with ``torch.func``. The ``Dirichlet`` and
``Beta`` here draw with the same sampler and the same gradient formula
(``torch._dirichlet_grad``) through a function that ``torch.func`` accepts: the same draws
and gradients.

Pyro's ``DiscreteHMM`` takes a log through ``safe_log``, an ``autograd.Function`` in the
old style, which ``torch.func`` refuses, so a model observing it could not be sampled by
NUTS; the ``DiscreteHMM`` here computes the same values and gradients with torch
operations.

Speed. torch's ``Bernoulli.log_prob`` is ``-binary_cross_entropy_with_logits``, which
torch computes as ``(1 - y) x + m + log(exp(-m) + exp(-x - m))`` with ``m = max(-x, 0)``:
two exponentials and a logarithm per element, and its gradient a division more. The
``Bernoulli`` here computes the same log density as ``y x - softplus(x)`` with
``softplus(x) = max(x, 0) + log(1 + exp(-|x|))`` (as NumPyro does, with ``log1p``): one
exponential and one logarithm, the gradient reusing the exponential. A logistic-regression
SVI step (N=5000, compiled, one core) is about 5 us shorter; the values agree with
torch's to rounding.

Example::

    >>> import torch
    >>> d = Categorical(probs=torch.tensor([0.25, 0.75]))
    >>> round(float(d.log_prob(torch.tensor(1)).exp()), 2)
    0.75
"""

from __future__ import annotations

import math

import pyro.distributions as pyro_dist
import torch
from pyro.distributions.transforms import CorrMatrixCholeskyTransform
from torch.distributions import Beta as TorchBeta
from torch.distributions.multivariate_normal import _precision_to_scale_tril

__all__ = [
    "Bernoulli",
    "Categorical",
    "OrderedLogistic",
    "LKJCholesky",
    "LKJ",
    "Beta",
    "Dirichlet",
    "BetaBinomial",
    "ContinuousBernoulli",
    "FisherSnedecor",
    "Pareto",
    "Wishart",
    "Multinomial",
]


class Bernoulli(pyro_dist.Bernoulli):
    """Pyro's ``Bernoulli(probs=None, logits=None)``, whose ``log_prob`` takes one
    exponential and one logarithm per element (see the module docstring).

    Example::

        >>> d = Bernoulli(logits=torch.tensor([-30.0, 0.0, 2.0]))
        >>> d.log_prob(torch.tensor([1.0, 0.0, 1.0]))
        tensor([-30.0000,  -0.6931,  -0.1269])
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = torch.distributions.utils.broadcast_all(self.logits, value)
        # max(x, 0) as (x + |x|) / 2: its derivative at 0 is 1/2 (clamp's would be 1),
        # so the gradient at x = 0 is sigmoid(0) - y as it should be
        # log(1 + e) rather than log1p(e), e = exp(-|x|) <= 1: the same absolute error (a
        # rounding of 1 + e, as in torch's log(exp(-m) + exp(-x - m))) at a third of
        # log1p's cost in Inductor's vectorized code
        magnitude = logits.abs()
        softplus = 0.5 * (logits + magnitude) + torch.log(1.0 + torch.exp(-magnitude))
        out = value * logits - softplus
        # infinite logits (probs 0 or 1): the limit, 0 or -inf, not inf - inf
        certain = torch.where(value == (logits > 0).to(value.dtype), 0.0, -math.inf)
        return torch.where(magnitude == math.inf, certain, out)


class Categorical(pyro_dist.Categorical):
    """Pyro's ``Categorical`` (same signature), compilable with ``fullgraph=True``."""

    def log_prob(self, value):
        if torch.compiler.is_compiling():
            return torch.distributions.Categorical.log_prob(self, value)
        return super().log_prob(value)


class Multinomial(pyro_dist.Multinomial):
    """Pyro's ``Multinomial(total_count=1, probs=None, logits=None)``, whose ``log_prob``
    batches under ``torch.func.vmap`` (see the module docstring).

    Example::

        >>> d = Multinomial(3, probs=torch.tensor([0.0, 0.5, 0.5]))
        >>> round(float(d.log_prob(torch.tensor([0.0, 1.0, 2.0])).exp()), 3)
        0.375
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        logits, value = torch.distributions.utils.broadcast_all(self.logits, value)
        log_factorial_n = torch.lgamma(value.sum(-1) + 1)
        log_factorial_xs = torch.lgamma(value + 1).sum(-1)
        # a category of probability 0 counted 0 times contributes 0 (not 0 * -inf = nan)
        logits = torch.where((value == 0) & (logits == -torch.inf), 0.0, logits)
        return log_factorial_n - log_factorial_xs + (logits * value).sum(-1)


class OrderedLogistic(pyro_dist.OrderedLogistic):
    """Pyro's ``OrderedLogistic(predictor, cutpoints)``, compilable with ``fullgraph=True``
    and batched by ``torch.func.vmap`` (NUTS evaluates models under ``vmap``): Pyro's
    constructor fills category probabilities into a new tensor in place, which ``vmap``
    cannot batch; this one concatenates them (the same values).

    Example::

        >>> d = OrderedLogistic(torch.tensor(0.0), torch.tensor([-1.0, 1.0]))
        >>> d.probs
        tensor([0.2689, 0.4621, 0.2689])
    """

    def __init__(self, predictor, cutpoints, validate_args=None):
        predictor, cutpoints = torch.as_tensor(predictor), torch.as_tensor(cutpoints)
        q = torch.sigmoid(cutpoints - predictor.unsqueeze(-1))
        self.predictor = predictor.expand(q.shape[:-1])
        self.cutpoints = cutpoints.expand(q.shape)
        p = torch.cat([q[..., :1], q[..., 1:] - q[..., :-1], 1 - q[..., -1:]], dim=-1)
        pyro_dist.Categorical.__init__(self, p, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = _instance if _instance is not None else type(self).__new__(type(self))
        new.predictor = self.predictor.expand(batch_shape)
        new.cutpoints = self.cutpoints.expand(batch_shape + (self.cutpoints.shape[-1],))
        return pyro_dist.Categorical.expand(self, batch_shape, new)

    def log_prob(self, value):
        if torch.compiler.is_compiling():
            return torch.distributions.Categorical.log_prob(self, value)
        return super().log_prob(value)


class LKJCholesky(pyro_dist.LKJCholesky):
    """LKJ distribution over Cholesky factors of correlation matrices, with a correct sampler.

    Example::

        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> L = LKJCholesky(3, 2.0).sample((20000,))
        >>> corr = L @ L.transpose(-1, -2)
        >>> [round(float(corr[:, i, j].var()), 2) for i, j in ((1, 0), (2, 0), (2, 1))]
        [0.17, 0.17, 0.17]
    """

    def __init__(self, dim: int, concentration=1.0, validate_args=None):
        _check_own(LKJCholesky, validate_args, concentration=concentration)
        super().__init__(dim, concentration, validate_args=validate_args)
        offset = self._beta.concentration1 - 0.5  # torch's (0, 0, 1, ..., dim - 2)
        self._beta = TorchBeta(0.5 * offset + 0.5, self._beta.concentration0)

    def expand(self, batch_shape, _instance=None):
        new = _instance if _instance is not None else type(self).__new__(type(self))
        return super().expand(batch_shape, _instance=new)


class LKJ(pyro_dist.LKJ):
    """LKJ distribution over correlation matrices (Pyro's), with a correct sampler and
    ``expand`` (so it can be used inside a plate)."""

    def __init__(self, dim: int, concentration=1.0, validate_args=None):
        _check_own(LKJ, validate_args, concentration=concentration)
        base_dist = LKJCholesky(dim, concentration)
        self.dim, self.concentration = base_dist.dim, base_dist.concentration
        super(pyro_dist.LKJ, self).__init__(
            base_dist, CorrMatrixCholeskyTransform().inv, validate_args=validate_args
        )

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        new = _instance if _instance is not None else type(self).__new__(type(self))
        base_dist = self.base_dist.expand(batch_shape)
        new.dim, new.concentration = self.dim, self.concentration.expand(batch_shape)
        super(pyro_dist.LKJ, new).__init__(base_dist, self.transforms, validate_args=False)
        new._validate_args = self._validate_args
        return new


def _validation_on(validate_args) -> bool:
    if validate_args is not None:
        return bool(validate_args)
    return torch.distributions.Distribution._validate_args


def _check_own(dist_cls, validate_args, **params) -> None:
    """torch's parameter check, done before an inner distribution checks its own names."""
    if not _validation_on(validate_args):
        return
    for name, value in params.items():
        if not isinstance(value, torch.Tensor | float | int):
            continue
        value = torch.as_tensor(value)
        constraint = dist_cls.arg_constraints[name]
        if not bool(constraint.check(value).all()):
            raise ValueError(
                f"Expected parameter {name} (Tensor of shape {tuple(value.shape)}) of "
                f"distribution {dist_cls.__name__} to satisfy the constraint {constraint!r}, "
                f"but found invalid values:\n{value}"
            )


def _expand_subclass(self, base_cls, batch_shape, _instance):
    new = _instance if _instance is not None else type(self).__new__(type(self))
    return base_cls.expand(self, batch_shape, _instance=new)


class _DirichletSample(torch.autograd.Function):
    """A Dirichlet draw with torch's implicit reparameterization gradient, in the form
    ``torch.func`` transforms accept (``forward`` without ``ctx``, and ``setup_context``)."""

    @staticmethod
    def forward(concentration):
        return torch._sample_dirichlet(concentration)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[0])

    @staticmethod
    def backward(ctx, grad_output):
        x, concentration = ctx.saved_tensors
        total = concentration.sum(-1, True).expand_as(concentration)
        grad = torch._dirichlet_grad(x, concentration, total)
        return grad * (grad_output - (x * grad_output).sum(-1, True))


def _dirichlet_rsample(dirichlet, sample_shape) -> torch.Tensor:
    shape = dirichlet._extended_shape(sample_shape)
    return _DirichletSample.apply(dirichlet.concentration.expand(shape))


class Dirichlet(pyro_dist.Dirichlet):
    """Pyro's ``Dirichlet(concentration)``, whose ``rsample`` can be differentiated by
    ``torch.func`` (see the module docstring).

    Example::

        >>> c = torch.tensor([1.0, 2.0, 3.0])
        >>> g = torch.func.grad(lambda c: Dirichlet(c).rsample()[0])(c)
        >>> g.shape
        torch.Size([3])
    """

    def rsample(self, sample_shape=()):
        return _dirichlet_rsample(self, sample_shape)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.Dirichlet, batch_shape, _instance)


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    """``log(x)`` for ``x >= 0`` whose gradient is 0, not nan, where ``x = 0`` (``-inf``,
    whose own gradient is 0 downstream): log of 1 there, then replaced ("double where").
    ``pyro.ops.special.safe_log`` does this with an ``autograd.Function`` in the old style,
    which ``torch.func`` transforms refuse."""
    positive = x > 0
    logged = torch.where(positive, x, torch.ones_like(x)).log()
    return torch.where(positive, logged, torch.full_like(x, -torch.inf))


def _log_matmul_exp(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``log(exp(x) @ exp(y))``, stably (shifted by the row and column maxima)."""
    lowest = torch.finfo(x.dtype).min  # (an all -inf row: -inf - -inf would be nan)
    x_shift = x.detach().amax(-1, keepdim=True).clamp(min=lowest)
    y_shift = y.detach().amax(-2, keepdim=True).clamp(min=lowest)
    product = torch.matmul((x - x_shift).exp(), (y - y_shift).exp())
    return _safe_log(product) + x_shift + y_shift


def _log_matrix_chain(logits: torch.Tensor) -> torch.Tensor:
    """``logits[..., 0, :, :] @ ... @ logits[..., T - 1, :, :]`` in log space, as a tree
    of pairwise products (log(T) levels)."""
    while logits.size(-3) > 1:
        time = logits.size(-3)
        even = time // 2 * 2
        part = logits[..., :even, :, :]
        pairs = part.reshape(part.shape[:-3] + (even // 2, 2) + part.shape[-2:])
        product = _log_matmul_exp(pairs[..., 0, :, :], pairs[..., 1, :, :])
        logits = torch.cat([product, logits[..., even:, :, :]], -3) if time > even else product
    return logits.squeeze(-3)


class DiscreteHMM(pyro_dist.DiscreteHMM):
    """Pyro's ``DiscreteHMM(initial_logits, transition_logits, observation_dist)``: a hidden
    Markov chain's states summed out in one site, whose ``log_prob`` runs under
    ``torch.func`` and ``torch.compile`` (NUTS evaluates models under ``vmap`` over chains).
    Pyro's takes the log with an ``autograd.Function`` in the old style, which ``vmap``
    refuses ("it must override the setup_context staticmethod"); this one computes the
    same values and gradients. As in Pyro, ``initial_logits`` are the state before the
    first observation.

    Example::

        >>> initial = torch.tensor([0.0, float("-inf")])  # starts in state 0
        >>> transition = torch.tensor([[0.9, 0.1], [0.2, 0.8]]).log()
        >>> emission = pyro_dist.Normal(torch.tensor([0.0, 3.0]), 1.0)
        >>> hmm = DiscreteHMM(initial, transition, emission)
        >>> chains = torch.tensor([[0.1, 2.9, 3.2], [0.0, 0.2, -0.1]])
        >>> torch.func.vmap(hmm.log_prob)(chains).shape
        torch.Size([2])
    """

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        value = value.unsqueeze(-1 - self.observation_dist.event_dim)
        observed = self.observation_dist.log_prob(value)  # (..., T, state)
        logits = self.transition_logits + observed.unsqueeze(-2)  # [i, j]: from i, to j, y
        logits = _log_matrix_chain(logits)
        return (self.initial_logits + logits.logsumexp(-1)).logsumexp(-1)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.DiscreteHMM, batch_shape, _instance)


class Beta(pyro_dist.Beta):
    """Pyro's ``Beta(concentration1, concentration0)``; invalid parameters are named.

    Example::

        >>> Beta(-1.0, 1.0, validate_args=True)  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ValueError: Expected parameter concentration1 ... GreaterThan(lower_bound=0.0) ...
    """

    def __init__(self, concentration1, concentration0, validate_args=None):
        _check_own(
            Beta, validate_args, concentration1=concentration1, concentration0=concentration0
        )
        super().__init__(concentration1, concentration0, validate_args=validate_args)

    def rsample(self, sample_shape=()):
        return _dirichlet_rsample(self._dirichlet, sample_shape).select(-1, 0)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.Beta, batch_shape, _instance)


class BetaBinomial(pyro_dist.BetaBinomial):
    """Pyro's ``BetaBinomial(concentration1, concentration0, total_count)``; invalid
    parameters are named."""

    def __init__(self, concentration1, concentration0, total_count=1, validate_args=None):
        _check_own(
            BetaBinomial,
            validate_args,
            concentration1=concentration1,
            concentration0=concentration0,
        )
        super().__init__(concentration1, concentration0, total_count, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.BetaBinomial, batch_shape, _instance)


class FisherSnedecor(pyro_dist.FisherSnedecor):
    """Pyro's ``FisherSnedecor(df1, df2)``; invalid parameters are named."""

    def __init__(self, df1, df2, validate_args=None):
        _check_own(FisherSnedecor, validate_args, df1=df1, df2=df2)
        super().__init__(df1, df2, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.FisherSnedecor, batch_shape, _instance)


class Pareto(pyro_dist.Pareto):
    """Pyro's ``Pareto(scale, alpha)``; invalid parameters are named."""

    def __init__(self, scale, alpha, validate_args=None):
        _check_own(Pareto, validate_args, scale=scale, alpha=alpha)
        super().__init__(scale, alpha, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.Pareto, batch_shape, _instance)


class ContinuousBernoulli(pyro_dist.ContinuousBernoulli):
    """Pyro's ``ContinuousBernoulli(probs=None, logits=None, lims=(0.499, 0.501))``; an
    invalid ``probs`` is reported with its constraint, and with ``validate_args=False`` it
    can be built inside compiled code."""

    def __init__(self, probs=None, logits=None, lims=(0.499, 0.501), validate_args=None):
        if probs is not None:
            _check_own(ContinuousBernoulli, validate_args, probs=probs)
        # torch checks `probs` in __init__ whenever validate_args is not None, even False:
        # a data-dependent branch that made the distribution impossible to build in
        # compiled code. Its check is done above; pass None and set the flag afterwards.
        super().__init__(probs, logits, lims, validate_args=validate_args or None)
        if validate_args is False:
            self._validate_args = False
        if probs is not None:
            # torch clamps `probs` into (0, 1) for stability; probtorch's site check reads
            # the value the user gave (validation.check_parameters looks here first).
            self._unclamped = {"probs": torch.as_tensor(probs).expand(self.batch_shape)}

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.ContinuousBernoulli, batch_shape, _instance)


class Wishart(pyro_dist.Wishart):
    """Pyro's ``Wishart(df, covariance_matrix=None, precision_matrix=None, scale_tril=None)``;
    a ``df`` at or below ``dim - 1`` is reported with the constraint it violates."""

    def __init__(
        self, df, covariance_matrix=None, precision_matrix=None, scale_tril=None,
        validate_args=None,
    ):  # fmt: skip
        matrix = next(
            (m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None), None
        )
        if matrix is not None and _validation_on(validate_args):
            dim = torch.as_tensor(matrix).shape[-1]
            value = torch.as_tensor(df)
            constraint = torch.distributions.constraints.greater_than(dim - 1)
            if not bool(constraint.check(value).all()):
                raise ValueError(
                    f"Expected parameter df (Tensor of shape {tuple(value.shape)}) of "
                    f"distribution Wishart to satisfy the constraint {constraint!r} "
                    f"(df > dim - 1 for {dim} x {dim} matrices), but found invalid "
                    f"values:\n{value}"
                )
        if torch.compiler.is_compiling():
            _init_wishart_without_checks(
                self, df, covariance_matrix, precision_matrix, scale_tril, validate_args
            )
        else:
            super().__init__(df, covariance_matrix, precision_matrix, scale_tril, validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_subclass(self, pyro_dist.Wishart, batch_shape, _instance)


def _init_wishart_without_checks(
    self, df, covariance_matrix, precision_matrix, scale_tril, validate_args
):  # fmt: skip
    """torch's ``Wishart.__init__`` without its two data-dependent branches (``df <= dim - 1``
    raises, ``df < dim`` warns), which Dynamo cannot trace: under compilation the check is
    the eager site check's job (probtorch validates at a model's first, eager trace)."""
    given = [m for m in (covariance_matrix, precision_matrix, scale_tril) if m is not None]
    if len(given) != 1:
        raise ValueError(
            "Wishart: exactly one of covariance_matrix, precision_matrix or scale_tril "
            "may be specified"
        )
    param = given[0]
    if isinstance(df, int | float):
        batch_shape = param.shape[:-2]
        df = torch.tensor(df, dtype=param.dtype, device=param.device)
    else:
        batch_shape = torch.broadcast_shapes(param.shape[:-2], df.shape)
    self.df = df.expand(batch_shape)
    event_shape = param.shape[-2:]
    if scale_tril is not None:
        self.scale_tril = param.expand(batch_shape + (-1, -1))
        self._unbroadcasted_scale_tril = scale_tril
    elif covariance_matrix is not None:
        self.covariance_matrix = param.expand(batch_shape + (-1, -1))
        self._unbroadcasted_scale_tril = torch.linalg.cholesky(covariance_matrix)
    else:
        self.precision_matrix = param.expand(batch_shape + (-1, -1))
        self._unbroadcasted_scale_tril = _precision_to_scale_tril(precision_matrix)
    torch.distributions.Distribution.__init__(
        self, batch_shape, event_shape, validate_args=validate_args
    )
    self._batch_dims = [-(x + 1) for x in range(len(self._batch_shape))]
    steps = torch.arange(event_shape[-1], dtype=param.dtype, device=param.device)
    self._dist_chi2 = torch.distributions.Chi2(
        df=(self.df.unsqueeze(-1) - steps).expand(batch_shape + (-1,))
    )
