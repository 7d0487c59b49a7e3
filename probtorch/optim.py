"""Optimizers for SVI: thin factories over ``torch.optim``, with a functional update.

``pt.optim.Adam(lr=1e-2)`` takes ``torch.optim.Adam``'s keyword arguments (or, as Pyro's,
one dict of them: ``Adam({"lr": 1e-2})``) and is two things:

* a factory: ``Adam(lr=1e-2)(params)`` builds the ``torch.optim.Adam`` for a list of
  tensors (for hand-written training loops);
* a pure, elementwise update ``update(params, grad, state, lr) -> (params, state)`` over one
  flat tensor, with exactly ``torch.optim``'s arithmetic. ``SVI`` uses this one: its whole
  step (ELBO, gradient, update) is one compiled function over flat tensors, and the learning
  rate is a tensor argument, so a scheduler changes it without recompiling.

Learning-rate schedules wrap an optimizer: ``pt.optim.scheduler(StepLR, Adam(lr=0.1),
step_size=100)`` runs the torch scheduler on the host, one ``scheduler.step()`` per SVI step,
and feeds the resulting learning rates to the compiled update.

Example::

    >>> import torch, probtorch as pt
    >>> adam = pt.optim.Adam(lr=0.1)
    >>> x = torch.tensor([1.0, -2.0])
    >>> state = adam.init(x)
    >>> x, state = adam.update(x, 2 * x, state, torch.tensor(0.1))  # gradient of |x|^2
    >>> x
    tensor([ 0.9000, -1.9000])
    >>> type(adam([torch.zeros(2, requires_grad=True)])).__name__
    'Adam'
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

__all__ = [
    "Optimizer",
    "Adam",
    "AdamW",
    "SGD",
    "RMSprop",
    "Adagrad",
    "Adamax",
    "NAdam",
    "RAdam",
    "Adadelta",
    "ClippedAdam",
    "Scheduler",
    "scheduler",
]

# torch.optim arguments that choose an implementation, not the arithmetic: passed on to the
# torch optimizer, ignored by the functional update.
_IMPLEMENTATION_ARGS = {"foreach", "capturable", "differentiable", "fused"}


class Optimizer:
    """Base class: keyword arguments of ``torch_class`` plus a functional update.

    Subclasses set ``torch_class`` and implement ``init`` and ``update``. The learning rate
    passed to ``update`` is a 0-d tensor; the other hyper-parameters are Python numbers.
    """

    torch_class: type = torch.optim.Optimizer

    def __init__(self, optim_args: dict | None = None, **kwargs):
        if optim_args is not None:  # Pyro's form: Adam({"lr": 0.01})
            name = type(self).__name__
            if callable(optim_args):
                raise TypeError(
                    f"{name}: per-parameter arguments (Pyro's callable optim_args) are not "
                    f"supported, since SVI updates all parameters as one flat tensor"
                )
            if not isinstance(optim_args, dict):
                raise TypeError(
                    f"{name} takes its arguments as keywords ({name}(lr=0.01)) or as one "
                    f"dict (Pyro's {name}({{'lr': 0.01}})), not {type(optim_args).__name__}"
                )
            both = sorted(set(optim_args) & set(kwargs))
            if both:
                raise TypeError(f"{name}: {both} given both in the dict and as keywords")
            kwargs = {**optim_args, **kwargs}
        allowed = self._allowed_kwargs()
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s) {unknown}; "
                f"allowed: {sorted(allowed)}"
            )
        self.kwargs = dict(kwargs)
        defaults = self._defaults()
        self.hyper = {k: kwargs.get(k, v) for k, v in defaults.items()}
        lr = self.hyper.get("lr")
        if lr is None or float(lr) < 0:
            raise ValueError(f"{type(self).__name__}: lr must be >= 0, got {lr}")
        self._check()

    @classmethod
    def _defaults(cls) -> dict:
        signature = inspect.signature(cls.torch_class.__init__)
        return {
            name: p.default
            for name, p in signature.parameters.items()
            if name not in ("self", "params")
            and name not in _IMPLEMENTATION_ARGS
            and p.default is not inspect.Parameter.empty
        }

    @classmethod
    def _allowed_kwargs(cls) -> set:
        return set(cls._defaults()) | _IMPLEMENTATION_ARGS

    def _check(self) -> None:
        """Reject arguments the functional update does not implement."""

    def _descent_grad(self, params: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The gradient a step descends, as torch's optimizers form it: negated for
        ``maximize``, plus the coupled (L2) ``weight_decay * params``."""
        if self.hyper["maximize"]:
            grad = -grad
        wd = float(self.hyper["weight_decay"])
        return grad + wd * params if wd != 0 else grad

    _decoupled = False  # AdamW's weight decay, whatever ``decoupled_weight_decay`` says

    def _decayed(self, params, grad, lr) -> tuple[torch.Tensor, torch.Tensor]:
        """``(params, grad)`` after weight decay: decoupled (AdamW's, or with
        ``decoupled_weight_decay=True``: the parameters shrink by ``1 - lr * weight_decay``)
        or coupled (:meth:`_descent_grad`)."""
        if not (self._decoupled or self.hyper.get("decoupled_weight_decay", False)):
            return params, self._descent_grad(params, grad)
        wd = float(self.hyper["weight_decay"])
        grad = -grad if self.hyper["maximize"] else grad
        return (params * (1 - lr * wd) if wd != 0 else params), grad

    @property
    def lr(self) -> float:
        """The base learning rate."""
        return float(self.hyper["lr"])

    def __call__(self, params) -> torch.optim.Optimizer:
        """The ``torch.optim`` optimizer for ``params`` (an iterable of tensors or groups)."""
        return self.torch_class(params, **self.kwargs)

    def init(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The optimizer state for ``params`` (a tuple of tensors; the first is the step count)."""
        raise NotImplementedError

    def update(
        self,
        params: torch.Tensor,
        grad: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        lr: torch.Tensor,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """One step: ``(new_params, new_state)``; pure, so it can run in compiled code."""
        raise NotImplementedError

    # -- learning-rate schedule (constant here; see Scheduler) ---------------------------
    def learning_rates(self, num_steps: int) -> list[float]:
        """The learning rates of the next ``num_steps`` steps (advances a schedule)."""
        return [self.lr] * num_steps

    def observe(self, losses) -> None:
        """Losses of the steps just taken (for schedules that react to the loss)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{type(self).__name__}({args})"


def _zeros(params: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(params)


def _moments(grad, exp_avg, exp_avg_sq, beta1: float, beta2: float):
    """Adam's running means of the gradient and of its square after one more gradient."""
    return torch.lerp(exp_avg, grad, 1 - beta1), exp_avg_sq * beta2 + (1 - beta2) * grad * grad


def _step(params: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=params.dtype, device=params.device)


class Adam(Optimizer):
    """``torch.optim.Adam`` (``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ...).

    Example::

        >>> import probtorch as pt
        >>> pt.optim.Adam(lr=1e-2, betas=(0.9, 0.99)).hyper["betas"]
        (0.9, 0.99)
    """

    torch_class = torch.optim.Adam

    def init(self, params):
        state = (_step(params), _zeros(params), _zeros(params))
        if self.hyper["amsgrad"]:
            state = state + (_zeros(params),)
        return state

    def update(self, params, grad, state, lr):
        h = self.hyper
        beta1, beta2 = (float(b) for b in h["betas"])
        eps = float(h["eps"])
        step, exp_avg, exp_avg_sq = state[0] + 1, state[1], state[2]
        params, grad = self._decayed(params, grad, lr)
        exp_avg, exp_avg_sq = _moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step).sqrt()
        step_size = lr / bias_correction1
        new_state = (step, exp_avg, exp_avg_sq)
        second = exp_avg_sq
        if h["amsgrad"]:
            second = torch.maximum(state[3], exp_avg_sq)
            new_state = new_state + (second,)
        denom = second.sqrt() / bias_correction2_sqrt + eps
        return params - step_size * exp_avg / denom, new_state


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay (default ``weight_decay=1e-2``).

    Example::

        >>> import probtorch as pt
        >>> pt.optim.AdamW(lr=1e-3).hyper["weight_decay"]
        0.01
    """

    torch_class = torch.optim.AdamW
    _decoupled = True


class SGD(Optimizer):
    """``torch.optim.SGD`` (``lr``, ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``).

    Example::

        >>> import torch, probtorch as pt
        >>> sgd = pt.optim.SGD(lr=0.5)
        >>> sgd.update(torch.ones(1), torch.ones(1), sgd.init(torch.ones(1)), torch.tensor(0.5))[0]
        tensor([0.5000])
    """

    torch_class = torch.optim.SGD

    def init(self, params):
        return (_step(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        momentum, dampening = float(h["momentum"]), float(h["dampening"])
        step, buf = state
        grad = self._descent_grad(params, grad)
        if momentum != 0:
            # torch starts the momentum buffer at the first gradient, undampened.
            buf = torch.where(step == 0, grad, buf * momentum + (1 - dampening) * grad)
            grad = grad + momentum * buf if h["nesterov"] else buf
        return params - lr * grad, (step + 1, buf)


class RMSprop(Optimizer):
    """``torch.optim.RMSprop`` (``lr``, ``alpha``, ``eps``, ``weight_decay``, ``momentum``,
    ``centered``).

    Example::

        >>> import probtorch as pt
        >>> pt.optim.RMSprop(lr=1e-2, centered=True).hyper["alpha"]
        0.99
    """

    torch_class = torch.optim.RMSprop

    def init(self, params):
        return (_step(params), _zeros(params), _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        alpha, eps = float(h["alpha"]), float(h["eps"])
        momentum = float(h["momentum"])
        step, square_avg, grad_avg, buf = state
        grad = self._descent_grad(params, grad)
        square_avg = square_avg * alpha + (1 - alpha) * grad * grad
        if h["centered"]:
            grad_avg = torch.lerp(grad_avg, grad, 1 - alpha)
            avg = (square_avg - grad_avg * grad_avg).sqrt() + eps
        else:
            avg = square_avg.sqrt() + eps
        if momentum > 0:
            buf = buf * momentum + grad / avg
            params = params - lr * buf
        else:
            params = params - lr * grad / avg
        return params, (step + 1, square_avg, grad_avg, buf)


class Adagrad(Optimizer):
    """``torch.optim.Adagrad`` (``lr``, ``lr_decay``, ``weight_decay``,
    ``initial_accumulator_value``, ``eps``, ``maximize``), as Pyro's ``pyro.optim.Adagrad``.

    Example::

        >>> import probtorch as pt
        >>> pt.optim.Adagrad(lr=0.1).hyper["eps"]
        1e-10
    """

    torch_class = torch.optim.Adagrad

    def init(self, params):
        initial = float(self.hyper["initial_accumulator_value"])
        return (_step(params), torch.full_like(params, initial))

    def update(self, params, grad, state, lr):
        h = self.hyper
        eps, lr_decay = float(h["eps"]), float(h["lr_decay"])
        step, state_sum = state[0] + 1, state[1]
        grad = self._descent_grad(params, grad)
        clr = lr / (1 + (step - 1) * lr_decay)
        state_sum = state_sum + grad * grad
        return params - clr * grad / (state_sum.sqrt() + eps), (step, state_sum)


class Adamax(Optimizer):
    """``torch.optim.Adamax`` (``lr``, ``betas``, ``eps``, ``weight_decay``, ``maximize``),
    as Pyro's ``pyro.optim.Adamax``.

    Example::

        >>> import probtorch as pt
        >>> pt.optim.Adamax(lr=0.01).hyper["betas"]
        (0.9, 0.999)
    """

    torch_class = torch.optim.Adamax

    def init(self, params):
        return (_step(params), _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        beta1, beta2 = (float(b) for b in h["betas"])
        eps = float(h["eps"])
        step, exp_avg, exp_inf = state[0] + 1, state[1], state[2]
        grad = self._descent_grad(params, grad)
        exp_avg = torch.lerp(exp_avg, grad, 1 - beta1)
        exp_inf = torch.maximum(exp_inf * beta2, grad.abs() + eps)
        clr = lr / (1 - beta1**step)
        return params - clr * exp_avg / exp_inf, (step, exp_avg, exp_inf)


class NAdam(Optimizer):
    """``torch.optim.NAdam``: Adam with Nesterov momentum (``lr``, ``betas``, ``eps``,
    ``weight_decay``, ``momentum_decay``, ``decoupled_weight_decay``, ``maximize``), as
    Pyro's ``pyro.optim.NAdam``.

    Example::

        >>> import probtorch as pt
        >>> pt.optim.NAdam(lr=0.01).hyper["momentum_decay"]
        0.004
    """

    torch_class = torch.optim.NAdam

    def init(self, params):
        # step, the product of the momentum coefficients so far (in torch's scalar dtype,
        # float32 unless float64 is the default, as torch keeps it), the two moments
        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        mu_product = torch.ones((), dtype=scalar, device=params.device)
        return (_step(params), mu_product, _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        beta1, beta2 = (float(b) for b in h["betas"])
        eps, momentum_decay = float(h["eps"]), float(h["momentum_decay"])
        step, mu_product, exp_avg, exp_avg_sq = state[0] + 1, state[1], state[2], state[3]
        params, grad = self._decayed(params, grad, lr)
        mu = beta1 * (1 - 0.5 * 0.96 ** (step * momentum_decay))
        mu_next = beta1 * (1 - 0.5 * 0.96 ** ((step + 1) * momentum_decay))
        mu_product = mu_product * mu.to(mu_product.dtype)
        product = mu_product.to(params.dtype)
        exp_avg, exp_avg_sq = _moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
        denom = (exp_avg_sq / (1 - beta2**step)).sqrt() + eps
        params = params - lr * (1 - mu) / (1 - product) * grad / denom
        params = params - lr * mu_next / (1 - product * mu_next) * exp_avg / denom
        return params, (step, mu_product, exp_avg, exp_avg_sq)


class RAdam(Optimizer):
    """``torch.optim.RAdam``: Adam with its second moment's variance rectified (``lr``,
    ``betas``, ``eps``, ``weight_decay``, ``decoupled_weight_decay``, ``maximize``), as
    Pyro's ``pyro.optim.RAdam``. Steps while the rectification is undefined (the first
    few) take plain momentum steps, as torch's.

    Example::

        >>> import probtorch as pt
        >>> pt.optim.RAdam(lr=0.01).hyper["betas"]
        (0.9, 0.999)
    """

    torch_class = torch.optim.RAdam

    def init(self, params):
        return (_step(params), _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        beta1, beta2 = (float(b) for b in h["betas"])
        eps = float(h["eps"])
        step, exp_avg, exp_avg_sq = state[0] + 1, state[1], state[2]
        params, grad = self._decayed(params, grad, lr)
        exp_avg, exp_avg_sq = _moments(grad, exp_avg, exp_avg_sq, beta1, beta2)
        bias_correction2 = 1 - beta2**step
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
        rectified = rho_t > 5.0
        rho = torch.where(rectified, rho_t, rho_inf)  # keeps the unused branch finite
        rect = ((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho)).sqrt()
        adaptive = rect * bias_correction2.sqrt() / (exp_avg_sq.sqrt() + eps)
        scale = torch.where(rectified, adaptive, torch.ones_like(adaptive))
        params = params - exp_avg / (1 - beta1**step) * lr * scale
        return params, (step, exp_avg, exp_avg_sq)


class Adadelta(Optimizer):
    """``torch.optim.Adadelta`` (``lr``, ``rho``, ``eps``, ``weight_decay``, ``maximize``), as
    Pyro's ``pyro.optim.Adadelta``.

    Example::

        >>> import probtorch as pt
        >>> pt.optim.Adadelta().hyper["rho"]
        0.9
    """

    torch_class = torch.optim.Adadelta

    def init(self, params):
        return (_step(params), _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        rho, eps = float(self.hyper["rho"]), float(self.hyper["eps"])
        step, square_avg, acc_delta = state[0] + 1, state[1], state[2]
        grad = self._descent_grad(params, grad)
        square_avg = square_avg * rho + (1 - rho) * grad * grad
        delta = (acc_delta + eps).sqrt() / (square_avg + eps).sqrt() * grad
        acc_delta = acc_delta * rho + (1 - rho) * delta * delta
        return params - lr * delta, (step, square_avg, acc_delta)


def _clipped_adam_class():
    from pyro.optim.clipped_adam import ClippedAdam as PyroClippedAdam

    return PyroClippedAdam


class ClippedAdam(Optimizer):
    """Pyro's ClippedAdam: Adam with each gradient element clipped to ``[-clip_norm,
    clip_norm]`` and the learning rate multiplied by ``lrd`` at every step.

    Arguments: ``lr=1e-3``, ``betas=(0.9, 0.999)``, ``eps=1e-8``, ``weight_decay=0``,
    ``clip_norm=10.0``, ``lrd=1.0``, ``centered_variance=False``. ``ClippedAdam(...)(params)``
    builds ``pyro.optim.clipped_adam.ClippedAdam``.

    Example::

        >>> import probtorch as pt
        >>> opt = pt.optim.ClippedAdam(lr=1e-2, clip_norm=5.0, lrd=0.999)
        >>> opt.hyper["clip_norm"], opt.hyper["lrd"]
        (5.0, 0.999)
    """

    torch_class = None  # pyro.optim.clipped_adam.ClippedAdam, imported lazily

    @classmethod
    def _defaults(cls) -> dict:
        return {
            "lr": 1e-3,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 0,
            "clip_norm": 10.0,
            "lrd": 1.0,
            "centered_variance": False,
        }

    @classmethod
    def _allowed_kwargs(cls) -> set:
        return set(cls._defaults())

    def _check(self) -> None:
        if float(self.hyper["clip_norm"]) <= 0:
            raise ValueError(f"ClippedAdam: clip_norm must be > 0, got {self.hyper['clip_norm']}")

    def __call__(self, params) -> torch.optim.Optimizer:
        return _clipped_adam_class()(params, **self.kwargs)

    def init(self, params):
        return (_step(params), _zeros(params), _zeros(params))

    def update(self, params, grad, state, lr):
        h = self.hyper
        beta1, beta2 = (float(b) for b in h["betas"])
        clip, lrd = float(h["clip_norm"]), float(h["lrd"])
        wd, eps = float(h["weight_decay"]), float(h["eps"])
        step, exp_avg, exp_avg_sq = state[0] + 1, state[1], state[2]
        grad = grad.clamp(-clip, clip)
        if wd != 0:
            grad = grad + wd * params
        exp_avg = exp_avg * beta1 + (1 - beta1) * grad
        grad_var = grad - exp_avg if h["centered_variance"] else grad
        exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad_var * grad_var
        denom = exp_avg_sq.sqrt() + eps
        # Pyro decays the group's lr before every step: lr_t = lr * lrd ** t.
        lr = lr * lrd**step
        step_size = lr * (1 - beta2**step).sqrt() / (1 - beta1**step)
        return params - step_size * exp_avg / denom, (step, exp_avg, exp_avg_sq)


class Scheduler(Optimizer):
    """An optimizer whose learning rate follows a ``torch.optim.lr_scheduler`` schedule.

    Made by :func:`scheduler`. The torch scheduler runs on the host over a one-element dummy
    optimizer: SVI asks for the learning rates of the next steps before running them (one
    ``scheduler.step()`` per SVI step) and passes them to the compiled update as a tensor.
    ``ReduceLROnPlateau`` gets ``step(loss)`` after each step with that step's loss; within
    a block of compiled steps its learning rate is constant, so it reacts up to
    ``steps_per_call - 1`` steps late.
    """

    def __init__(
        self,
        scheduler_class: type,
        optimizer: Optimizer,
        *,
        stepped_by_user: bool = False,
        **scheduler_kwargs,
    ):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(
                f"scheduler needs a probtorch optimizer such as pt.optim.Adam(lr=...), "
                f"got {type(optimizer).__name__}"
            )
        self.scheduler_class = scheduler_class
        self.optimizer = optimizer
        self.scheduler_kwargs = dict(scheduler_kwargs)
        self.kwargs = optimizer.kwargs
        self.hyper = optimizer.hyper
        self._dummy_param = torch.zeros(1, requires_grad=True)
        self._torch_optimizer = optimizer([self._dummy_param])
        self._torch_scheduler = scheduler_class(self._torch_optimizer, **scheduler_kwargs)
        if getattr(self._torch_scheduler, "cycle_momentum", False):
            raise ValueError(
                f"scheduler {scheduler_class.__name__} cycles the optimizer's momentum "
                f"(cycle_momentum=True, its default), but SVI passes only the schedule's "
                f"learning rate to {type(optimizer).__name__}'s update: its momentum (betas "
                f"or momentum) would stay fixed, unlike torch's. Pass cycle_momentum=False"
            )
        self._plateau = isinstance(
            self._torch_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau
        )
        # Pyro's wrappers (pt.optim.StepLR({...})): the schedule moves when the user calls
        # step(), once per epoch say, not once per SVI step
        self.stepped_by_user = stepped_by_user

    def step(self, *args, **kwargs) -> None:
        """Advance the schedule (Pyro's ``scheduler.step()``, ``step(loss)`` for
        ``ReduceLROnPlateau``): for the schedules made by Pyro's names
        (``pt.optim.ExponentialLR({...})``), which SVI does not advance by itself."""
        if not self.stepped_by_user:
            raise RuntimeError(
                f"{self!r} is advanced by SVI, once per step; Pyro's form "
                f"pt.optim.{self.scheduler_class.__name__}({{'optimizer': ..., "
                f"'optim_args': ...}}) makes one that step() advances"
            )
        self._torch_optimizer.step()
        self._torch_scheduler.step(*args, **kwargs)

    def __call__(self, params):
        """A torch scheduler (``scheduler_class``) over a new torch optimizer for ``params``;
        the optimizer is its ``.optimizer``."""
        return self.scheduler_class(self.optimizer(params), **self.scheduler_kwargs)

    @property
    def lr(self) -> float:
        """The current learning rate of the schedule."""
        return float(self._torch_optimizer.param_groups[0]["lr"])

    def init(self, params):
        return self.optimizer.init(params)

    def update(self, params, grad, state, lr):
        return self.optimizer.update(params, grad, state, lr)

    def learning_rates(self, num_steps: int) -> list[float]:
        if self._plateau or self.stepped_by_user:
            return [self.lr] * num_steps
        lrs = []
        for _ in range(num_steps):
            lrs.append(self.lr)
            # The dummy optimizer has no gradient: step() is a no-op that tells the scheduler
            # an optimizer step happened (avoiding torch's call-order warning).
            self._torch_optimizer.step()
            self._torch_scheduler.step()
        return lrs

    def observe(self, losses) -> None:
        if self._plateau and not self.stepped_by_user:
            for loss in losses:
                self._torch_optimizer.step()
                self._torch_scheduler.step(float(loss))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.scheduler_kwargs.items())
        return f"scheduler({self.scheduler_class.__name__}, {self.optimizer!r}, {args})"


def scheduler(scheduler_class: type, optimizer: Optimizer, **scheduler_kwargs) -> Scheduler:
    """Run ``optimizer`` with the learning-rate schedule ``scheduler_class(**scheduler_kwargs)``.

    ``scheduler_class`` is any ``torch.optim.lr_scheduler`` class; SVI advances it once per
    step.

    Example::

        >>> import torch, probtorch as pt
        >>> from torch.optim.lr_scheduler import StepLR
        >>> opt = pt.optim.scheduler(StepLR, pt.optim.Adam(lr=1.0), step_size=2, gamma=0.5)
        >>> opt.learning_rates(5)
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """
    return Scheduler(scheduler_class, optimizer, **scheduler_kwargs)


def _pyro_scheduler(scheduler_class: type) -> Callable:
    """Pyro's ``pyro.optim.<Scheduler>(dict)`` for one ``torch.optim.lr_scheduler`` class."""
    name = scheduler_class.__name__

    def make(args: dict, clip_args: dict | None = None) -> Scheduler:
        if not isinstance(args, dict) or "optimizer" not in args:
            raise TypeError(
                f"pt.optim.{name} takes Pyro's one dict: {{'optimizer': torch.optim.Adam, "
                f"'optim_args': {{'lr': 0.01}}, <{name}'s arguments>}}; got {args!r}"
            )
        if clip_args:
            raise ValueError(f"pt.optim.{name}: clip_args are not supported")
        args = dict(args)
        optimizer, optim_args = args.pop("optimizer"), args.pop("optim_args", {})
        ours = globals().get(getattr(optimizer, "__name__", ""))
        if isinstance(optimizer, Optimizer):
            base = optimizer
        elif isinstance(ours, type) and issubclass(ours, Optimizer):
            base = ours(**optim_args)
        else:
            known = sorted(
                n
                for n, c in globals().items()
                if isinstance(c, type) and issubclass(c, Optimizer) and c.__module__ == __name__
                and c not in (Optimizer, Scheduler)
            )  # fmt: skip
            raise ValueError(
                f"pt.optim.{name}: optimizer {optimizer!r} has no probtorch counterpart; "
                f"give one of torch.optim's {known}"
            )
        return Scheduler(scheduler_class, base, stepped_by_user=True, **args)

    make.__name__ = make.__qualname__ = name
    make.__doc__ = (
        f"Pyro's ``pyro.optim.{name}``: ``{name}({{'optimizer': torch.optim.SGD, "
        f"'optim_args': {{'lr': 0.01}}, ...}})`` runs that optimizer with torch's ``{name}``; "
        f"its ``step()`` advances the schedule (once per epoch in Pyro's examples), SVI does "
        f"not. :func:`scheduler` makes one that SVI advances once per step."
    )
    return make


# every torch schedule built from an optimizer alone (not the ones that chain schedules)
_SCHEDULER_NAMES = sorted(
    n
    for n, c in vars(torch.optim.lr_scheduler).items()
    if isinstance(c, type)
    and issubclass(
        c, torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau
    )
    and not n.startswith("_")
    and n not in ("LRScheduler", "SequentialLR", "ChainedScheduler")
)
for _name in _SCHEDULER_NAMES:
    globals()[_name] = _pyro_scheduler(getattr(torch.optim.lr_scheduler, _name))
__all__ += _SCHEDULER_NAMES
