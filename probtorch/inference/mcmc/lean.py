"""The lean executor: an AOTInductor-compiled chunk driven by a small C++ loop.

``torch.compile`` costs tens of microseconds per call on the host (Dynamo guards over some
seventy state tensors, the AOTAutograd wrapper, and a heap allocation for every
intermediate buffer), which on small models is most of the time per leapfrog step. This
executor removes that host work:

1. the chunk (``chunk_size`` unrolled iterations) is captured once with ``make_fx``, and made
   to update its state *in place* (``copy_`` into the input buffers) and to write the
   all-done flag into a one-element buffer;
2. it is exported and compiled by AOTInductor with stack allocation of intermediates, and
   the package is cached on disk (keyed by the graph and the shapes; it loads in
   milliseconds next time);
3. a ~30-line C++ extension calls the compiled model until the flag is set, without
   returning to Python.

Building costs 15-25 s on one core of a small CPU (plus ~20 s for the C++ extension, once
per machine), so this pays off for long runs and for models sampled repeatedly.
:class:`TieredBuild` hides the build: it loads a cached package, or builds one in a
background process while the sampler runs the quick path (``NUTS(executor="auto")``, the
default). Draws are the same as the quick path's (the same graph, the same pre-drawn random
numbers). Where no C++ toolchain is available, :func:`build_lean_loop` warns and returns
None and the quick path is used.
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils import _pytree as pytree

from ..._caller import warn_at_caller
from ..compile import inductor_base_options
from ..uncompilable import untraceable_reason
from .executor import TracedChunk, in_place_inputs, trace_in_place, with_strides

__all__ = [
    "LeanLoop",
    "TieredBuild",
    "background_builds_allowed",
    "build_lean_loop",
    "lean_cache_dir",
]

# Built with cpp_extension.load from a file rather than load_inline, which puts
# <torch/extension.h> (all of libtorch's C++ API) in front of the source: these two headers
# are what the driver needs, and compiling them takes 20 s here against 47 s.
_DRIVER_NAME = "probtorch_lean_driver_v2"
_DRIVER_SOURCE = r"""
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <memory>

struct LeanRunner {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  explicit LeanRunner(const std::string& path)
      : loader(std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, "model", true)) {}
  // Run the in-place chunk until `flag` (one of the inputs) is set; returns the calls made.
  int64_t run_until(const std::vector<at::Tensor>& inputs, const at::Tensor& flag,
                    int64_t max_calls) {
    const bool* done = flag.data_ptr<bool>();
    int64_t calls = 0;
    do {
      std::vector<at::Tensor> args(inputs);
      loader->boxed_run(std::move(args));
      ++calls;
    } while (!*done && calls < max_calls);
    return calls;
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<LeanRunner>(m, "LeanRunner")
      .def(pybind11::init<const std::string&>())
      .def("run_until", &LeanRunner::run_until,
           pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""

_driver = None


def lean_cache_dir() -> str:
    """Where compiled packages are kept: ``$PROBTORCH_CACHE_DIR`` or ``~/.cache/probtorch``."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "probtorch")
    return os.environ.get("PROBTORCH_CACHE_DIR", default)


def _load_driver():
    """The C++ driver, built once per machine in torch's extension directory (the
    compiled module is then loaded in milliseconds)."""
    global _driver
    if _driver is None:
        from torch.utils.cpp_extension import get_default_build_root, load

        root = os.environ.get("TORCH_EXTENSIONS_DIR", get_default_build_root())
        source = os.path.join(root, f"{_DRIVER_NAME}.cpp")
        if not os.path.isfile(source) or Path(source).read_text() != _DRIVER_SOURCE:
            os.makedirs(root, exist_ok=True)
            tmp = f"{source}.tmp{os.getpid()}"
            Path(tmp).write_text(_DRIVER_SOURCE)
            os.replace(tmp, source)  # atomic: another process never compiles half a file
        _driver = load(_DRIVER_NAME, sources=[source], extra_cflags=["-O2"])
    return _driver


def _fingerprint(gm: torch.fx.GraphModule, inputs: list, key: str) -> str:
    """A hash of the graph, its constants' values (the model's data), shapes and versions."""
    h = hashlib.sha256()
    h.update((gm.code + key + torch.__version__).encode())
    for x in inputs:
        h.update(f"{tuple(x.shape)}:{x.dtype}".encode())
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                h.update(node.target.encode())
                # copied into a new buffer: contiguous() keeps a stretched size-1 dimension's
                # stride 0, which the byte view refuses
                flat = torch.empty(value.numel(), dtype=value.dtype)
                flat.copy_(value.detach().reshape(-1))
                h.update(flat.view(torch.uint8).numpy())
    return h.hexdigest()[:24]


class _Exported(torch.nn.Module):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.gm = gm

    def forward(self, *inputs):
        return self.gm(*inputs)


class LeanLoop:
    """Runs a compiled in-place chunk until every chain is done (see the module docstring).

    Called like :class:`~.executor.ChunkedLoop`: ``loop(state, *args)`` returns the final
    state. The state's tensors are updated in place; ``args`` are read only. The package's
    generated code does not check strides: inputs are laid out as the chunk was traced
    (``traced``), whatever layout a later block's tensors have.
    """

    def __init__(self, runner, traced: TracedChunk, chunk_size: int, path: str):
        self._runner = runner
        self._state_spec = traced.state_spec
        self._num_state = traced.num_state
        self._strides = [x.stride() for x in traced.inputs[:-1]]
        self.chunk_size = chunk_size
        self.path = path
        self.calls = 0
        self.interrupted = False

    def __call__(self, state, *args):
        # the state owns new buffers (written in place), laid out as the package expects
        leaves, arg_leaves = in_place_inputs(state, args)
        inputs = with_strides(leaves + arg_leaves, self._strides)
        leaves = inputs[: self._num_state]
        flag = torch.zeros((), dtype=torch.bool)
        inputs.append(flag)
        self.interrupted = False
        try:
            self.calls += self._runner.run_until(inputs, flag, 2**62)
        except KeyboardInterrupt:  # delivered once the C++ loop returns: the state is whole
            self.interrupted = True
        return pytree.tree_unflatten(leaves, self._state_spec)


def _trace_chunk(iteration, example_state, example_args, chunk_size, done, key, configs):
    """The in-place chunk (:func:`~.executor.trace_in_place`) and its package path (keyed by
    the graph, its constants and shapes, ``key``, the Inductor ``configs`` and probtorch's
    graph passes and added C++, which change the package's code)."""
    from ..graph_passes import ProbtorchPasses

    traced = trace_in_place(iteration, example_state, example_args, chunk_size, done)
    gm, inputs = traced.graph, traced.inputs
    settings = key + str(chunk_size) + repr(sorted((configs or {}).items()))
    digest = _fingerprint(gm, inputs, settings + ProbtorchPasses().uuid())
    path = os.path.join(lean_cache_dir(), f"nuts_chunk_{digest}.pt2")
    return traced, path


def _export(gm: torch.fx.GraphModule, inputs: list):
    return torch.export.export(_Exported(gm), tuple(x.clone() for x in inputs), strict=False)


def _compile_package(
    gm: torch.fx.GraphModule, inputs: list, path: str, configs: dict | None = None
) -> None:
    """Export the chunk and compile it with AOTInductor into the package at ``path``."""
    _compile_exported(_export(gm, inputs), path, configs)


def _compile_exported(exported, path: str, configs: dict | None = None) -> None:
    """Compile an exported chunk with AOTInductor into the package at ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path[: -len(".pt2")] + f".tmp{os.getpid()}.pt2"
    with warnings.catch_warnings():
        # torch 2.13's AOTInductor deep-copies the graph with a pytree LeafSpec and warns of
        # its own deprecated isinstance check: not the user's code, so not shown to them
        warnings.filterwarnings(
            "ignore", message=r"`isinstance\(treespec, LeafSpec\)`", category=FutureWarning
        )
        _aoti_compile(exported, tmp, configs)
    os.replace(tmp, path)  # atomic: readers never see a half-written package


def _aoti_compile(exported, tmp: str, configs: dict | None) -> None:
    torch._inductor.aoti_compile_and_package(
        exported,
        package_path=tmp,
        inductor_configs={
            **inductor_base_options(),
            "aot_inductor.allow_stack_allocation": True,
            "size_asserts": False,
            "alignment_asserts": False,
            "scalar_asserts": False,
            "cpp.threads": 1,
            **(configs or {}),
        },
    )


def _warn_fallback(error: BaseException | str) -> None:
    if isinstance(error, BaseException):
        error = untraceable_reason(error)
    warn_at_caller(f"the lean executor could not be built ({error}); using the quick path")


def build_lean_loop(
    iteration: Callable,
    example_state,
    example_args: tuple,
    chunk_size: int,
    done: Callable,
    key: str = "",
    inductor_configs: dict | None = None,
) -> LeanLoop | None:
    """Capture, compile (or load from the cache) and wrap the in-place chunk.

    Returns None, with a warning, when it cannot be built here (no C++ toolchain, an
    unsupported op); callers then use the quick path. ``inductor_configs`` are added to
    AOTInductor's options (and to the package's cache key).
    """
    try:
        traced, path = _trace_chunk(
            iteration, example_state, example_args, chunk_size, done, key, inductor_configs
        )
        if not os.path.exists(path):
            _compile_package(traced.graph, traced.inputs, path, inductor_configs)
        runner = _load_driver().LeanRunner(path)
    except Exception as error:  # a missing toolchain or an unsupported op: fall back
        _warn_fallback(error)
        return None
    return LeanLoop(runner, traced, chunk_size, path)


def background_builds_allowed() -> bool:
    """Build lean packages in a background process? ``PROBTORCH_LEAN_BACKGROUND`` decides
    (``1``/``0``); by default only where this process may use at least two CPUs, so that
    the build does not take CPU time from the sampler."""
    setting = os.environ.get("PROBTORCH_LEAN_BACKGROUND", "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return False
    if setting in ("1", "true", "yes", "on"):
        return True
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return cpus >= 2


# packages being built by a background process, by path (one build per package)
_building: dict[str, subprocess.Popen] = {}


class TieredBuild:
    """The lean executor for a chunk: loaded from the cache, or built in the background.

    ``TieredBuild(...)`` traces the chunk (about a second). If its package is on disk,
    :meth:`poll` returns the lean loop at once. Otherwise, when background builds are
    allowed (:func:`background_builds_allowed`), a separate, low-priority Python process
    exports and compiles the package while the caller samples on the quick path, and
    :meth:`poll` returns the lean loop once the package is there. The build goes on if the
    caller exits first, so the next run of the same model finds the package. Both
    executors run the same graph on the same pre-drawn random numbers, so switching at a
    block boundary does not change the draws.
    """

    def __init__(
        self,
        iteration,
        example_state,
        example_args,
        chunk_size,
        done,
        key="",
        inductor_configs: dict | None = None,
    ):
        self.loop: LeanLoop | None = None
        self.failed: str | None = None
        self.traced: TracedChunk | None = None  # the captured chunk (the quick path reuses it)
        self._process: subprocess.Popen | None = None
        self._chunk_size = chunk_size
        try:
            self.traced, self.path = _trace_chunk(
                iteration, example_state, example_args, chunk_size, done, key, inductor_configs
            )
            gm, inputs = self.traced.graph, self.traced.inputs
        except Exception as error:  # an op make_fx cannot trace: stay on the quick path
            self.failed = untraceable_reason(error)
            _warn_fallback(self.failed)
            return
        if os.path.exists(_failure_marker(self.path)):
            with open(_failure_marker(self.path)) as f:
                self.failed = f.read().strip() or "an earlier build failed"
            _warn_fallback(f"{self.failed}; delete {_failure_marker(self.path)} to retry")
            return
        if os.path.exists(self.path) or not background_builds_allowed():
            return
        running = _building.get(self.path)
        if running is not None and running.poll() is None:
            self._process = running
            return
        self._process = _start_build(gm, inputs, self.path, inductor_configs)
        _building[self.path] = self._process

    @property
    def pending(self) -> bool:
        """A background build is running."""
        return self._process is not None and self._process.poll() is None

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the background build (tests, scripts that want the package now)."""
        if self._process is not None:
            self._process.wait(timeout)

    def poll(self) -> LeanLoop | None:
        """The lean loop if its package is ready (loaded once), else None."""
        if self.loop is not None or self.failed is not None:
            return self.loop
        if self.pending:
            return None
        if self._process is not None and self._process.returncode != 0:
            self.failed = _build_error(self.path, self._process.returncode)
            _warn_fallback(self.failed)
            return None
        if not os.path.exists(self.path):
            return None
        try:
            runner = _load_driver().LeanRunner(self.path)
        except Exception as error:
            self.failed = untraceable_reason(error)
            _warn_fallback(error)
            return None
        self.loop = LeanLoop(runner, self.traced, self._chunk_size, self.path)
        return self.loop


def _start_build(
    gm: torch.fx.GraphModule, inputs: list, path: str, configs: dict | None = None
) -> subprocess.Popen:
    """Start ``python -m probtorch.inference.mcmc.lean JOB`` on the exported chunk.

    The chunk is exported here (about a second), as :func:`build_lean_loop` does, so that
    the other process compiles the very program this one would, rather than re-tracing
    the graph in a process whose state (default dtype, imported modules) may differ.
    """
    os.makedirs(os.path.dirname(path), exist_ok=True)
    job = path[: -len(".pt2")] + f".job{os.getpid()}"
    torch.export.save(_export(gm, inputs), job + ".program.pt2")
    torch.save({"program": job + ".program.pt2", "path": path, "configs": configs,
                "dtype": torch.get_default_dtype()}, job)  # fmt: skip
    return spawn_build("probtorch.inference.mcmc.lean", job)


def spawn_build(module: str, job: str) -> subprocess.Popen:
    """Start ``python -m module job`` in the background, its output in ``job + ".log"``.
    It builds Inductor's precompiled header if missing, off the sampler's path
    (:mod:`~probtorch.inference.precompiled_header`)."""
    log = open(job + ".log", "w")  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(
            [sys.executable, "-m", module, job],
            env={**os.environ, "PROBTORCH_DEFER_HEADER": "0"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal stops the sampler, not the build
        )
    finally:
        log.close()


def _failure_marker(path: str) -> str:
    """A file beside a package that could not be built, holding the error (no retries)."""
    return path[: -len(".pt2")] + ".failed"


def _build_error(path: str, returncode: int) -> str:
    logs = sorted(glob.glob(path[: -len(".pt2")] + ".job*.log"), key=os.path.getmtime, reverse=True)
    last = ""
    if logs:
        with open(logs[0]) as f:
            lines = [line.strip() for line in f if line.strip()]
        last = lines[-1] if lines else ""
    return f"background build exited with {returncode}: {last}"


def _main(job: str) -> int:
    """The background build: compile the saved graph's package and the C++ driver."""
    try:
        os.nice(10)
    except OSError:  # pragma: no cover
        pass
    torch.set_num_threads(1)
    # what Dynamo imports in the sampler's process, which lowering expects
    importlib.import_module("torch._dynamo")
    importlib.import_module("torch._higher_order_ops.triton_kernel_wrap")

    spec = torch.load(job, weights_only=False)
    torch.set_default_dtype(spec["dtype"])  # as in the sampler's process
    try:
        if not os.path.exists(spec["path"]):
            exported = torch.export.load(spec["program"])
            _compile_exported(exported, spec["path"], spec.get("configs"))
        _load_driver()  # built once per machine; the sampler then loads it in milliseconds
    except Exception as error:
        with open(_failure_marker(spec["path"]), "w") as f:
            f.write(untraceable_reason(error))
        raise
    finally:
        os.remove(spec["program"])
        os.remove(job)
    os.remove(job + ".log")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
