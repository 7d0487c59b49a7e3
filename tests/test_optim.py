"""probtorch.optim: the functional updates equal torch.optim's (and Pyro's ClippedAdam) step by
step; factories build torch optimizers; schedules follow torch's schedulers."""

import pytest
import torch
from pyro.optim.clipped_adam import ClippedAdam as PyroClippedAdam
from torch.optim.lr_scheduler import (
    CyclicLR,
    ExponentialLR,
    OneCycleLR,
    ReduceLROnPlateau,
    StepLR,
)

import probtorch as pt
import probtorch.distributions as dist

CASES = [
    (pt.optim.Adam, {"lr": 0.1}),
    (pt.optim.Adam, {"lr": 0.05, "betas": (0.8, 0.99), "weight_decay": 0.1, "amsgrad": True}),
    (pt.optim.Adam, {"lr": 0.05, "maximize": True, "eps": 1e-3}),
    (pt.optim.AdamW, {"lr": 0.05, "weight_decay": 0.3}),
    (pt.optim.SGD, {"lr": 0.1}),
    (pt.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (pt.optim.SGD, {"lr": 0.1, "momentum": 0.5, "dampening": 0.3}),
    (pt.optim.RMSprop, {"lr": 0.01}),
    (pt.optim.RMSprop, {"lr": 0.01, "centered": True, "momentum": 0.7, "weight_decay": 0.1}),
    (pt.optim.Adagrad, {"lr": 0.1}),
    (pt.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.2, "weight_decay": 0.1, "eps": 1e-3}),
    (pt.optim.Adagrad, {"lr": 0.1, "initial_accumulator_value": 0.5, "maximize": True}),
    (pt.optim.Adamax, {"lr": 0.05}),
    (pt.optim.Adamax, {"lr": 0.05, "betas": (0.8, 0.9), "weight_decay": 0.1, "eps": 1e-3}),
    (pt.optim.NAdam, {"lr": 0.05}),
    (pt.optim.NAdam, {"lr": 0.05, "momentum_decay": 0.1, "weight_decay": 0.1, "maximize": True}),
    (pt.optim.NAdam, {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True}),
    (pt.optim.RAdam, {"lr": 0.05}),
    (pt.optim.RAdam, {"lr": 0.05, "betas": (0.5, 0.9), "weight_decay": 0.1, "eps": 1e-3}),
    (pt.optim.RAdam, {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True}),
    (pt.optim.Adadelta, {"lr": 1.0}),
    (pt.optim.Adadelta, {"lr": 0.5, "rho": 0.5, "weight_decay": 0.1, "maximize": True}),
    (pt.optim.ClippedAdam, {"lr": 0.05, "clip_norm": 0.5, "lrd": 0.9, "weight_decay": 0.1}),
    (pt.optim.ClippedAdam, {"lr": 0.05, "centered_variance": True}),
]


@pytest.mark.parametrize("factory,kwargs", CASES, ids=lambda c: str(c))
def test_functional_update_equals_torch_optimizer(factory, kwargs):
    """Two tensors through the torch optimizer vs. their concatenation through ``update``."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(3, 2, generator=generator, dtype=torch.float64)
    b = torch.randn(4, generator=generator, dtype=torch.float64)
    leaves = [a.clone().requires_grad_(True), b.clone().requires_grad_(True)]
    opt = factory(**kwargs)
    torch_opt = opt(leaves)
    expected_class = PyroClippedAdam if factory is pt.optim.ClippedAdam else factory.torch_class
    assert type(torch_opt) is expected_class
    flat = torch.cat([a.reshape(-1), b])
    state = opt.init(flat)
    lr = torch.tensor(kwargs["lr"], dtype=torch.float64)
    for _ in range(6):
        grads = [torch.randn(x.shape, generator=generator, dtype=torch.float64) for x in leaves]
        for leaf, grad in zip(leaves, grads):
            leaf.grad = grad.clone()
        torch_opt.step()
        flat, state = opt.update(flat, torch.cat([g.reshape(-1) for g in grads]), state, lr)
        expected = torch.cat([leaf.detach().reshape(-1) for leaf in leaves])
        torch.testing.assert_close(flat, expected, rtol=1e-12, atol=1e-12)


def test_unknown_argument_is_rejected():
    with pytest.raises(TypeError, match="unexpected keyword.*betaz"):
        pt.optim.Adam(lr=0.1, betaz=(0.9, 0.9))
    with pytest.raises(ValueError, match="lr must be >= 0"):
        pt.optim.SGD(lr=-1.0)
    with pytest.raises(ValueError, match="clip_norm"):
        pt.optim.ClippedAdam(clip_norm=0.0)


def test_pyros_dict_of_arguments_is_taken():
    adam = pt.optim.Adam({"lr": 0.02, "betas": (0.8, 0.9)})
    assert adam.lr == 0.02 and adam.hyper["betas"] == (0.8, 0.9)
    assert repr(adam) == repr(pt.optim.Adam(lr=0.02, betas=(0.8, 0.9)))
    assert pt.optim.ClippedAdam({"lr": 0.1}, clip_norm=5.0).hyper["clip_norm"] == 5.0
    assert pt.optim.Adam(optim_args={"lr": 0.03}).lr == 0.03  # Pyro's keyword
    with pytest.raises(TypeError, match="per-parameter arguments .Pyro's callable optim_args."):
        pt.optim.Adam(lambda module_name, param_name: {"lr": 0.1})
    with pytest.raises(TypeError, match=r"as keywords \(Adam\(lr=0.01\)\).*not float"):
        pt.optim.Adam(0.01)
    with pytest.raises(TypeError, match=r"\['lr'\] given both"):
        pt.optim.Adam({"lr": 0.1}, lr=0.2)
    with pytest.raises(TypeError, match="unexpected keyword.*betaz"):
        pt.optim.Adam({"lr": 0.1, "betaz": (0.9, 0.9)})


def test_implementation_arguments_pass_through_to_torch():
    opt = pt.optim.Adam(lr=0.1, foreach=False)
    torch_opt = opt([torch.zeros(2, requires_grad=True)])
    assert torch_opt.defaults["foreach"] is False


def test_scheduler_learning_rates_follow_torch():
    opt = pt.optim.scheduler(ExponentialLR, pt.optim.Adam(lr=0.5), gamma=0.9)
    lrs = opt.learning_rates(3) + opt.learning_rates(2)
    assert lrs == pytest.approx([0.5 * 0.9**k for k in range(5)])
    # the factory builds a torch scheduler over a torch optimizer
    torch_sched = opt([torch.zeros(1, requires_grad=True)])
    assert isinstance(torch_sched, ExponentialLR)
    assert isinstance(torch_sched.optimizer, torch.optim.Adam)


def test_step_lr_and_plateau():
    step = pt.optim.scheduler(StepLR, pt.optim.SGD(lr=1.0), step_size=2, gamma=0.1)
    assert step.learning_rates(5) == pytest.approx([1.0, 1.0, 0.1, 0.1, 0.01])
    plateau = pt.optim.scheduler(ReduceLROnPlateau, pt.optim.Adam(lr=1.0), patience=1, factor=0.5)
    assert plateau.learning_rates(2) == [1.0, 1.0]
    plateau.observe([3.0, 3.0, 3.0])  # no improvement: reduced once patience is exceeded
    assert plateau.lr == 0.5


def test_scheduler_needs_a_probtorch_optimizer():
    with pytest.raises(TypeError, match="probtorch optimizer"):
        pt.optim.scheduler(StepLR, torch.optim.Adam, step_size=1)


def test_plateau_schedule_follows_the_losses_of_a_loop_of_steps_as_of_a_run():
    """ReduceLROnPlateau heard the losses of ``svi.run`` only: under Pyro's loop of
    ``svi.step`` its learning rate never changed (0.1 after 50 steps on a flat loss)."""
    from probtorch.inference import SVI, Trace_ELBO

    def model():
        pt.sample("z", dist.Normal(0.0, 1.0))

    def guide():  # the loss is flat in m, up to its noise: a plateau
        pt.sample("z", dist.Normal(pt.param("m", torch.tensor(0.0)), 1.0))

    lrs, losses = {}, {}
    for how in ("run", "step"):
        opt = pt.optim.scheduler(ReduceLROnPlateau, pt.optim.Adam(lr=0.1), patience=2, factor=0.5)
        svi = SVI(model, guide, opt, Trace_ELBO(), compile=False, seed=0)
        if how == "run":
            losses[how] = svi.run(50, progress_bar=False).losses.tolist()
        else:
            losses[how] = [svi.step() for _ in range(50)]
        lrs[how] = opt.lr
    assert losses["step"] == pytest.approx(losses["run"], rel=1e-12)
    assert lrs["step"] == lrs["run"] < 0.01


@pytest.mark.parametrize(
    ("scheduler_class", "kwargs"),
    [
        (OneCycleLR, {"max_lr": 0.1, "total_steps": 10}),
        (CyclicLR, {"base_lr": 0.01, "max_lr": 0.1}),
    ],
)
def test_a_schedule_that_cycles_momentum_is_refused(scheduler_class, kwargs):
    """OneCycleLR and CyclicLR cycle the momentum by default; SVI's update took only the
    learning rate, so the momentum silently stayed fixed (parameters 0.5 to 1.4 off
    torch's after a few steps). With cycle_momentum=False they follow torch."""
    optimizer = pt.optim.SGD(lr=0.1, momentum=0.9)
    name = scheduler_class.__name__
    with pytest.raises(ValueError, match=rf"scheduler {name} cycles the optimizer's momentum"
                       r".*SGD's update.*Pass cycle_momentum=False"):  # fmt: skip
        pt.optim.scheduler(scheduler_class, optimizer, **kwargs)
    fixed = pt.optim.scheduler(scheduler_class, optimizer, cycle_momentum=False, **kwargs)
    torch_optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
    torch_scheduler = scheduler_class(torch_optimizer, cycle_momentum=False, **kwargs)
    expected = []
    for _ in range(6):
        expected.append(torch_optimizer.param_groups[0]["lr"])
        torch_optimizer.step()
        torch_scheduler.step()
    assert fixed.learning_rates(6) == pytest.approx(expected, rel=1e-12)


def test_pyro_scheduler_wrappers_step_when_the_user_steps_them():
    """Pyro's ``pyro.optim.ExponentialLR({'optimizer': torch.optim.SGD, 'optim_args':
    ..., 'gamma': ...})`` and its loop: ``svi.step`` per minibatch, ``scheduler.step()``
    per epoch. The learning rate moves only at ``step()`` (a Delta guide's loc under SGD:
    ``loc <- loc (1 - lr)``); ``pt.optim.scheduler``'s, which SVI advances, refuses
    ``step()``; a dict without an optimizer is refused naming Pyro's form."""
    from probtorch.inference import SVI, Trace_ELBO

    def model():
        pt.sample("z", dist.Normal(0.0, 1.0))

    def guide():
        pt.sample("z", dist.Delta(pt.param("loc", torch.tensor(1.0))))

    sched = pt.optim.ExponentialLR(
        {"optimizer": torch.optim.SGD, "optim_args": {"lr": 0.1}, "gamma": 0.5}
    )
    svi = SVI(model, guide, sched, Trace_ELBO(), compile=False)
    for _ in range(2):
        svi.step()
    assert sched.lr == pytest.approx(0.1)
    sched.step()
    svi.step()
    assert float(svi.get_params()["loc"]) == pytest.approx(0.9 * 0.9 * 0.95, rel=1e-6)
    with pytest.raises(RuntimeError, match="advanced by SVI"):
        pt.optim.scheduler(
            torch.optim.lr_scheduler.StepLR, pt.optim.SGD(lr=0.1), step_size=2
        ).step()
    with pytest.raises(TypeError, match=r"pt.optim.StepLR takes Pyro's one dict"):
        pt.optim.StepLR({"lr": 0.1})
