import os
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# Compiled kernels are cached across test processes (and runs) in the repo's .cache.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "inductor"))
# NUTS's default executor ("auto") would start a background AOTInductor build for every
# model the suite samples; tests run the quick path unless they ask for another executor.
os.environ.setdefault("PROBTORCH_EXECUTOR", "quick")
# Two pytest workers share the two cores: one Inductor compile thread each. With one compile
# thread probtorch builds a graph's small C++ kernels as one library (combined_kernels.py),
# so the suite runs that path.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

import torch  # noqa: E402

import probtorch  # noqa: E402

# One intra-op thread per test process: pytest-xdist runs two workers on two cores, and eager
# autograd with two threads each slowed calls by 100x on a shared machine.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _clean_state():
    """Every test starts with an empty default param store, validation on (probtorch's and
    torch's: Dynamo's first compile in a process turns torch's off), float32."""
    probtorch.get_param_store().clear()
    probtorch.enable_validation(True)
    torch.distributions.Distribution.set_default_validate_args(True)
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
    probtorch.get_param_store().clear()


@pytest.fixture
def float64():
    """float64 as torch's default dtype for one test (``_clean_state`` restores it)."""
    torch.set_default_dtype(torch.float64)


@pytest.fixture
def shared_dir():
    """../shared (posteriordb, research); tests that need it skip in users' checkouts."""
    if not SHARED.is_dir():
        pytest.skip("../shared is not present in this checkout")
    return SHARED


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler for one test. A process started in the background by a
    non-interactive shell inherits SIGINT as ignored, and Python then installs no handler:
    a test that sends itself SIGINT would never see it."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
