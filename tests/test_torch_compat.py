"""probtorch/_torch_compat.py: the patch of ``Distribution._get_checked_instance`` that lets
torch 2.11's Dynamo trace ``expand`` makes the instance torch's own does, and is applied
only before torch 2.13; torch's messages about its own code are kept from users; event
dimensions of empty batches are summed and checked without torch's reshape."""

import os
import subprocess
import sys

import pytest
import torch
from torch.distributions import Distribution, Normal

from probtorch import _torch_compat
from probtorch.inference.compile import count_compiles


def test_the_patch_is_applied_only_before_torch_2_13():
    assert _torch_compat.needs_expand_patch("2.11.0+cu130")
    assert _torch_compat.needs_expand_patch("2.12.1")
    assert not _torch_compat.needs_expand_patch("2.13.0+cpu")
    assert not _torch_compat.needs_expand_patch("3.0.0")
    patched = Distribution._get_checked_instance is _torch_compat._get_checked_instance
    assert patched == _torch_compat.needs_expand_patch()


def test_patched_expand_makes_the_instance_torch_makes(monkeypatch):
    monkeypatch.setattr(Distribution, "_get_checked_instance", _torch_compat._get_checked_instance)
    d = Normal(torch.tensor([0.5]), torch.tensor([2.0])).expand([3])
    assert type(d) is Normal and d.batch_shape == (3,)
    torch.testing.assert_close(
        d.log_prob(torch.zeros(3)), Normal(0.5, 2.0).log_prob(torch.zeros(3))
    )
    given = Normal.__new__(Normal)
    assert _torch_compat._get_checked_instance(d, Normal, given) is given

    class Custom(Normal):
        def __init__(self, loc):
            super().__init__(loc, 1.0)

    with pytest.raises(NotImplementedError, match="Custom of Normal.*custom .expand"):
        Custom(torch.zeros(1)).expand([2])
    # and Dynamo traces it without a graph break (without validation, as probtorch's
    # potentials run: torch 2.11's Dynamo does not trace the constraint checks either)
    compiled = torch.compile(
        lambda x: Normal(x, 1.0, validate_args=False).expand([2, 3]).log_prob(x).sum(),
        fullgraph=True,
    )
    with count_compiles() as stats:
        torch.testing.assert_close(
            compiled(torch.zeros(3)), Normal(0.0, 1.0).log_prob(torch.zeros(2, 3)).sum()
        )
    assert stats.graph_breaks == 0


def test_first_compile_shows_no_deprecation_warning_from_torch():
    """Inductor's first compile imports torch.utils.mkldnn (torch.jit.script_method,
    deprecated in 2.13); probtorch imports it quietly, so a user's run shows no warning."""
    code = (
        "import torch, probtorch\n"
        "f = torch.compile(lambda x: torch.sin(x) + 1, backend='inductor')\n"
        "print(float(f(torch.zeros(2)).sum()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2.0"


def test_diagonal_and_linear_algebra_compile_without_torch_messages(tmp_path):
    """Inductor's lowering of torch.diagonal warns of torch's own deprecated
    ``_prims_common.check``, AOTInductor logs a "missing a c-shim" line per Cholesky or
    triangular solve in a package, and standalone_compile logs that it cannot save the
    artifacts of an SVI step with a low-rank guide: none reaches a probtorch user. A fresh
    Inductor cache, so the lowering runs; any other warning from the compile would fail here
    too."""
    code = (
        "import torch, probtorch, os\n"
        "torch.set_default_dtype(torch.float64)\n"
        "def f(a, b):\n"
        "    L = torch.linalg.cholesky(a @ a.mT + torch.eye(3))\n"
        "    x = torch.linalg.solve_triangular(L, b, upper=False)\n"
        "    return torch.diagonal(L, dim1=-2, dim2=-1).log().sum() + x.sum()\n"
        "torch.manual_seed(0)\n"
        "a, b = torch.rand(3, 3), torch.rand(3, 2)\n"
        "print(abs(float(torch.compile(f)(a, b) - f(a, b))) < 1e-9)\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, a, b):\n"
        "        return f(a, b)\n"
        "exported = torch.export.export(M(), (a, b), strict=False)\n"
        "path = os.path.join(os.environ['OUT_DIR'], 'f.pt2')\n"
        "from probtorch.inference.mcmc.lean import _compile_exported\n"
        "_compile_exported(exported, path)  # the lean executor's AOTInductor build\n"
        "g = torch._inductor.aoti_load_package(path)\n"
        "print(abs(float(g(a, b) - f(a, b))) < 1e-9)\n"
        "import probtorch.distributions as dist\n"
        "from probtorch.inference import SVI, Trace_ELBO\n"
        "from probtorch.inference.autoguide import AutoLowRankMultivariateNormal\n"
        "def model(y):\n"
        "    mu = probtorch.sample('mu', dist.Normal(torch.zeros(3), 1.0).to_event(1))\n"
        "    with probtorch.plate('n', len(y)):\n"
        "        probtorch.sample('y', dist.Normal(mu, 1.0).to_event(1), obs=y)\n"
        "guide = AutoLowRankMultivariateNormal(model)  # its step's artifacts do not serialize\n"
        "svi = SVI(model, guide, probtorch.optim.Adam(lr=0.01), Trace_ELBO())\n"
        "svi.run(2, torch.rand(5, 3), progress_bar=False)\n"
    )
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
        "OUT_DIR": str(tmp_path),
        "PYTHONWARNINGS": "default",
    }
    done = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-W", "error::DeprecationWarning"]
        + ["-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]
    assert "c-shim" not in done.stderr, done.stderr[-2000:]
    assert "artifact generation failed" not in done.stderr, done.stderr[-2000:]
    assert "Warning" not in done.stderr, done.stderr[-2000:]


def test_event_shaped_densities_and_constraints_take_empty_batches():
    import pyro.distributions as pyro_dist
    from torch.distributions import Dirichlet, Independent, constraints

    empty = torch.zeros(0, 3)
    assert Independent(Normal(empty, 1.0), 1).log_prob(empty).shape == (0,)
    assert Dirichlet(torch.ones(0, 3), validate_args=True).batch_shape == (0,)
    assert constraints.independent(constraints.real, 2).check(torch.zeros(4, 0, 2)).shape == (4,)
    assert pyro_dist.Delta(empty, event_dim=1).log_prob(empty).shape == (0,)
    assert pyro_dist.util.sum_rightmost(torch.zeros(2, 0, 5), -1).shape == (2,)
    # tensors with elements take torch's and Pyro's own code, and too few dims their error
    x = torch.randn(4, 3)
    assert torch.equal(
        Independent(Normal(x, 1.0), 1).log_prob(x), Normal(x, 1.0).log_prob(x).sum(-1)
    )
    assert pyro_dist.util.sum_rightmost(x, 1).shape == (4,)
    with pytest.raises(ValueError, match="Expected value.dim"):
        constraints.independent(constraints.real, 2).check(torch.zeros(0))


@pytest.mark.parametrize("guide_name", ["AutoNormal", "AutoMultivariateNormal", "AutoDelta"])
def test_autoguides_fit_a_model_with_an_empty_plate_of_event_shaped_sites(guide_name):
    """A plate of size 0 around a simplex, a vector and an angle site failed in torch's
    reshape of 0 elements (validation, the guide's density) before any step."""
    import probtorch as pt
    import probtorch.distributions as dist
    from probtorch.inference import SVI, Trace_ELBO, autoguide
    from probtorch.optim import Adam

    def model(n):
        with pt.plate("p", n):
            pt.sample("s", dist.Dirichlet(torch.ones(3)))
            pt.sample("v", dist.Normal(torch.zeros(2), 1.0).to_event(1))
            pt.sample("a", dist.VonMises(0.0, 1.0))
        pt.sample("z", dist.Normal(0.0, 1.0))

    guide = getattr(autoguide, guide_name)(model)
    svi = SVI(model, guide, Adam(lr=0.01), Trace_ELBO())
    losses = [svi.step(0) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    draws = pt.handlers.trace(pt.handlers.seed(guide, rng_seed=0)).get_trace(0)
    assert draws["s"].value.shape == (0, 3) and draws["v"].value.shape == (0, 2)
