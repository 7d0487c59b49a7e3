"""The split executor's sampler graph kept on disk, so later runs load it without tracing.

:class:`~.executor.SplitLoop` compiles the NUTS block with the model's gradient left out
(:mod:`..potential_hole`) and every size a symbol, so one compiled graph serves every
model with the same sampler settings. Inductor's own cache would serve it too, but only
after the graph was traced again (``make_fx`` with symbolic sizes: 3.4-5.7 s on this
machine, longer than compiling the model's gradient). Here it is kept as Inductor's saved
artifact (``CompiledArtifact.save``) with what a later run needs besides: the constants
folded into the graph and the conditions on the inputs' sizes under which it was traced
and compiled (ShapeEnv's guards, as Inductor's cache checks them), checked against the
inputs of the run that loads it.

An entry's name hashes the sampler settings, the inputs' dtypes, devices, ranks and which
sizes are 1 (those are specialized), the vector instruction set Inductor generates code for
(a cache directory shared between machines), torch's version and the source of
``probtorch/inference``: any change to that code makes new entries. Entries live in
``$PROBTORCH_CACHE_DIR/sampler-graphs`` (``~/.cache/probtorch`` by default). The compiled
kernels themselves stay in Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``); where it was
emptied, loading builds them again from the saved code.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from ..generated_call import lifted_constants
from .lean import lean_cache_dir

__all__ = ["Constants", "entry_path", "is_kept", "load", "save", "serves", "source_fingerprint"]

_GRAPH, _META = "graph.bin", "meta.pt"


@functools.cache
def source_fingerprint() -> str:
    """A hash of torch's version and every source file of ``probtorch/inference``."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256(torch.__version__.encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def entry_path(name: str, options: dict, inputs: Sequence[torch.Tensor]) -> str:
    """Where the graph ``name`` (the sampler and its settings), compiled with Inductor
    ``options`` for inputs like ``inputs``, is kept."""
    structure = [(str(x.dtype), x.device.type, tuple(int(s == 1) for s in x.shape)) for x in inputs]
    settings = sorted((str(k), repr(v)) for k, v in options.items())
    text = repr((name, settings, structure, _vector_isa(), source_fingerprint()))
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    return os.path.join(lean_cache_dir(), "sampler-graphs", digest)


@functools.cache
def _vector_isa() -> str:
    """The vector ISA Inductor's CPU code uses here ("" where it picks none), found as
    probtorch's compiles find it (:func:`~..compile.inductor_base_options`: from the CPU
    flags where Inductor would compile probes)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    from ..compile import inductor_base_options

    found = {k: v for k, v in inductor_base_options().items() if k == "cpp.vec_isa_ok"}
    with inductor_config.patch(found):
        return str(pick_vec_isa())


def is_kept(path: str) -> bool:
    """An entry is at ``path`` (whole: its files are renamed into place when written)."""
    return os.path.isfile(os.path.join(path, _GRAPH)) and os.path.isfile(os.path.join(path, _META))


class Constants(torch.nn.Module):
    """A stand-in for a loaded graph's module: the constants AOT autograd passes before its
    inputs, as buffers in the same order (:func:`~..generated_call.lifted_constants`)."""

    def __init__(self, constants: Sequence[torch.Tensor]):
        super().__init__()
        for k, value in enumerate(constants):
            self.register_buffer(f"c{k}", value)


def save(path: str, artifact, gm: torch.fx.GraphModule) -> bool:
    """Keep ``artifact`` (``standalone_compile`` of ``gm``, traced with symbolic sizes) at
    ``path``; whether that worked (a graph whose guards cannot be written is not kept)."""
    shape_env = getattr(gm, "shape_env", None)
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    if shape_env is None or any(not isinstance(v, torch.Tensor) for v in placeholders):
        return False
    try:
        guards = shape_env.produce_guards_expression(placeholders, ignore_static=False)
    except Exception:  # noqa: BLE001 - a guard ShapeEnv cannot write as code
        return False
    meta = {"guards": guards, "constants": [c.detach().clone() for c in lifted_constants(gm)]}
    os.makedirs(path, exist_ok=True)
    # written under other names, then renamed: a reader sees whole files or none
    graph_tmp = tempfile.mktemp(dir=path, prefix="graph-", suffix=".tmp")
    meta_tmp = tempfile.mktemp(dir=path, prefix="meta-", suffix=".tmp")
    try:
        artifact.save(path=graph_tmp, format="binary")
        torch.save(meta, meta_tmp)
        os.replace(graph_tmp, os.path.join(path, _GRAPH))
        os.replace(meta_tmp, os.path.join(path, _META))
    except Exception:  # noqa: BLE001 - not serializable, or the disk refused it
        for leftover in (graph_tmp, meta_tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
        return False
    return True


def _meta_serving(path: str, inputs: Sequence[torch.Tensor]) -> dict | None:
    """The metadata of the entry at ``path`` if it was compiled for sizes like those of
    ``inputs`` (its guards hold for them); else None."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not is_kept(path):
        return None
    try:
        meta = torch.load(os.path.join(path, _META), weights_only=True)
        guards = meta["guards"]
        if guards and not ShapeEnv().evaluate_guards_expression(guards, list(inputs)):
            return None
    except Exception:  # noqa: BLE001 - an unreadable or foreign entry: compile instead
        return None
    return meta


def serves(path: str, inputs: Sequence[torch.Tensor]) -> bool:
    """Whether :func:`load` would find a graph at ``path`` for ``inputs`` (without loading)."""
    return _meta_serving(path, inputs) is not None


def load(path: str, inputs: Sequence[torch.Tensor]) -> tuple[object, Constants] | None:
    """The artifact kept at ``path`` and its constants, where it was compiled for sizes
    like those of ``inputs``; else None."""
    meta = _meta_serving(path, inputs)
    if meta is None:
        return None
    try:
        artifact = torch._inductor.CompiledArtifact.load(
            path=os.path.join(path, _GRAPH), format="binary"
        )
    except Exception:  # noqa: BLE001 - an unreadable or foreign entry: compile instead
        return None
    return artifact, Constants(meta["constants"])
