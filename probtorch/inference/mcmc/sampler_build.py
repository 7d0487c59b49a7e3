"""The split executor's sampler graph built in a background process (``executor="auto"``).

``NUTS(executor="auto")`` runs a model on the split path (:class:`~.executor.SplitLoop`)
when the sampler graph for its settings is kept on disk (:mod:`.sampler_cache`): only the
model's gradient is then compiled. Where it is not, the run takes the quick path and
:func:`start` builds the graph in another process (niced, one thread), so that later
models, in this process or another, take the split path. The graph does not depend on
the model: the background process runs one block of the sampler on the run's first block
state with a standard normal's gradient in the model's place, which traces, compiles and
keeps the graph as an ``executor="split"`` run would (the same settings, Inductor options,
input structure, hence the same entry).

A build that fails leaves a marker beside the entry (``<entry>.failed``, holding the
error): later runs do not try again, and warn once per process; deleting the marker retries.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import warnings

import torch

from ..._caller import warn_at_caller
from .lean import background_builds_allowed, spawn_build
from .sampler_cache import is_kept

__all__ = ["SamplerBuild", "start"]

_started: dict[str, SamplerBuild] = {}  # entry path -> the build this process started
_warned: set[str] = set()


class SamplerBuild:
    """A background build of the sampler graph kept at ``path`` (see :func:`start`)."""

    def __init__(self, path: str, process: subprocess.Popen):
        self.path = path
        self.process = process

    @property
    def pending(self) -> bool:
        """The build is running."""
        return self.process.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the build (tests, scripts); its exit status."""
        return self.process.wait(timeout)


def failure_marker(path: str) -> str:
    """The file beside the entry ``path`` that holds why its build failed."""
    return path.rstrip(os.sep) + ".failed"


def start(settings: dict, options: dict, block, block_args, path: str) -> SamplerBuild | None:
    """Build the sampler graph for ``settings`` (:func:`~.kernels.split_block_loop`'s
    keyword arguments) and Inductor ``options`` in a background process, from the first
    block ``(block, block_args)`` of a run; it is kept at ``path``. None where nothing is
    started: the entry is there, a build of it is running (in this process or another),
    an earlier one failed (warned once) or background builds are not allowed
    (:func:`~.lean.background_builds_allowed`: fewer than two CPUs, or
    ``PROBTORCH_LEAN_BACKGROUND=0``)."""
    if is_kept(path) or not background_builds_allowed():
        return None
    marker = failure_marker(path)
    if os.path.exists(marker):
        if marker not in _warned:
            _warned.add(marker)
            with open(marker) as f:
                reason = f.read().strip() or "an earlier build failed"
            warn_at_caller(
                f"the split sampler graph could not be built ({reason}); executor='auto' "
                f"keeps the quick path; delete {marker} to try again",
            )
        return None
    running = _started.get(path)
    if running is not None and running.pending:
        return running
    if _running_elsewhere(path):
        return None
    job = f"{path}.job{os.getpid()}"
    spec = {"settings": settings, "options": options, "block": block, "block_args": block_args,
            "path": path, "dtype": torch.get_default_dtype()}  # fmt: skip
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(spec, job)
        process = spawn_build("probtorch.inference.mcmc.sampler_build", job)
    except OSError as error:  # a cache directory this process cannot write
        if path not in _warned:
            _warned.add(path)
            warn_at_caller(
                f"the split sampler graph cannot be built in the background ({error}); "
                "executor='auto' keeps the quick path (PROBTORCH_CACHE_DIR sets the "
                "directory)",
            )
        return None
    _started[path] = SamplerBuild(path, process)
    return _started[path]


def _running_elsewhere(path: str) -> bool:
    """Another live process is building the entry (its job file names its pid)."""
    for job in glob.glob(glob.escape(path) + ".job*"):
        pid = job.rsplit(".job", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            continue
        except PermissionError:  # alive, another user's
            pass
        return True
    return False


def _standard_normal(z: torch.Tensor):
    """A stand-in model's potential and gradient (the graph does not depend on them)."""
    return 0.5 * (z * z).sum(-1), z.clone()


def _main(job: str) -> int:
    """Build the job's sampler graph (the background process's work)."""
    spec = torch.load(job, weights_only=False)
    torch.set_default_dtype(spec["dtype"])  # as in the sampler's process
    path = spec["path"]
    try:
        from .kernels import split_block_loop

        loop = split_block_loop(value_and_grad=_standard_normal, options=spec["options"],
                                **spec["settings"])  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loop(spec["block"], *spec["block_args"])
        if loop._fallback is not None:  # it warned and ran eagerly: nothing was compiled
            said = [str(w.message) for w in caught if "could not be compiled" in str(w.message)]
            raise RuntimeError(said[0] if said else "the sampler graph could not be compiled")
        if not is_kept(path):
            raise RuntimeError(f"the compiled sampler graph was not kept at {path}")
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        with open(failure_marker(path), "w") as f:
            f.write(f"{type(error).__name__}: {first}")
        raise
    finally:
        os.remove(job)
    os.remove(job + ".log")
    return 0


if __name__ == "__main__":
    try:
        os.nice(10)  # the sampler's process comes first
    except OSError:  # pragma: no cover
        pass
    torch.set_num_threads(1)
    sys.exit(_main(sys.argv[1]))
