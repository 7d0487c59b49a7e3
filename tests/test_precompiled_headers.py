"""Inductor's precompiled C++ header follows ``TORCHINDUCTOR_CACHE_DIR``
(probtorch.inference.compile.keep_headers_with_cache) and is built once it pays for itself
(probtorch.inference.precompiled_header)."""

import functools
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from filelock import FileLock

from probtorch.inference import compile as pt_compile
from probtorch.inference import precompiled_header
from probtorch.inference.precompiled_header import RENT_LIMIT, header_on_demand

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import torch
from probtorch.inference.compile import compile_fn
f = compile_fn(lambda x: (2.0 * x).sin().sum(), True)
x = torch.linspace(0.0, 1.0, 100, dtype=torch.float64)
assert torch.allclose(f(x), (2.0 * x).sin().sum())
"""


def _compile_in_subprocess(cache, tmp, **env_vars):
    env = {k: v for k, v in os.environ.items() if k != "PROBTORCH_DEFER_HEADER"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), TMPDIR=str(tmp), **env_vars)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_header_deferred_then_built_in_the_inductor_cache_and_found(tmp_path):
    cache, tmp = tmp_path / "inductor", tmp_path / "tmp"
    tmp.mkdir()
    headers = cache / "precompiled_headers"
    # a first compile on a machine goes without the header and counts the kernel it built
    _compile_in_subprocess(cache, tmp)
    assert not list(headers.glob("*.gch"))
    (rent,) = headers.glob("*.h.rent")
    paid = rent.stat().st_size
    assert 1 <= paid < RENT_LIMIT
    # the same compile again loads its kernels from the cache: nothing built, no rent
    _compile_in_subprocess(cache, tmp)
    assert rent.stat().st_size == paid
    # a background build (PROBTORCH_DEFER_HEADER=0) builds it, in the cache directory
    _compile_in_subprocess(cache, tmp, PROBTORCH_DEFER_HEADER="0")
    (gch,) = headers.glob("*.gch")
    assert gch.name == rent.name[: -len(".rent")] + ".gch"
    assert not list(tmp.glob("torchinductor_*/precompiled_headers/*.gch"))
    # and a later compile finds it where Inductor put it: no rent paid
    _compile_in_subprocess(cache, tmp)
    assert rent.stat().st_size == paid


@pytest.fixture
def header_dir(monkeypatch):
    from torch._inductor import codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", "/inductor/default/precompiled_headers")
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", "/inductor/default/locks")
    monkeypatch.setattr(pt_compile, "_headers_placed", [False])
    return codecache


def test_without_the_variable_nothing_moves(header_dir, monkeypatch):
    monkeypatch.setattr(pt_compile, "_USER_INDUCTOR_CACHE", None)
    pt_compile.keep_headers_with_cache()
    assert header_dir._HEADER_DIR == "/inductor/default/precompiled_headers"


def test_the_directory_set_at_import_wins_once(header_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(pt_compile, "_USER_INDUCTOR_CACHE", str(tmp_path))
    # fresh_cache() points the variable elsewhere later: the header stays where it was put
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "fresh"))
    pt_compile.keep_headers_with_cache()
    assert header_dir._HEADER_DIR == str(tmp_path / "precompiled_headers")
    assert header_dir._HEADER_LOCK_DIR == str(tmp_path / "precompiled_headers" / "locks")
    monkeypatch.setattr(pt_compile, "_USER_INDUCTOR_CACHE", str(tmp_path / "other"))
    pt_compile.keep_headers_with_cache()
    assert header_dir._HEADER_DIR == str(tmp_path / "precompiled_headers")


class _Builder:
    def __init__(self, target):
        self.target = target

    def get_target_file_path(self):
        return self.target

    def build(self):
        Path(self.target).write_bytes(b"precompiled")


@pytest.fixture
def fake_inductor(tmp_path, monkeypatch):
    """Inductor's header step as torch 2.13 has it: the header's place, then a locked build
    of the .gch unless it exists (``_worker_compile_cpp``)."""
    monkeypatch.delenv("PROBTORCH_DEFER_HEADER", raising=False)
    monkeypatch.setattr(precompiled_header, "_generated_code", lambda: True)
    builds = []

    def worker_compile(lock, builders):
        with FileLock(lock):
            for b in builders:
                if not os.path.exists(b.get_target_file_path()):
                    builds.append(b.get_target_file_path())
                    b.build()

    codecache = types.SimpleNamespace(_HEADER_DIR=str(tmp_path), _worker_compile_cpp=worker_compile)

    @functools.cache
    def precompile_header(header, command_line, **command):
        path = os.path.join(codecache._HEADER_DIR, f"{abs(hash((header, command_line)))}.h")
        Path(path).write_text(f"#include <{header}>\n")
        codecache._worker_compile_cpp(path + ".lock", (_Builder(path + ".gch"),))
        return path

    return codecache, precompile_header, builds


def test_a_missing_header_is_rented_until_it_would_have_paid_for_itself(fake_inductor):
    codecache, build, builds = fake_inductor
    on_demand = header_on_demand(codecache, build)
    for paid in range(RENT_LIMIT):
        assert on_demand("prefix.h", "g++ -O3", min_optimize=False) is None
        path = on_demand.locate(codecache._HEADER_DIR, "prefix.h", "g++ -O3", min_optimize=False)
        assert os.path.getsize(path.rent_file) == paid + 1
    assert builds == []
    header = on_demand("prefix.h", "g++ -O3", min_optimize=False)
    assert builds == [header + ".gch"]
    # other flags, another header: its own rent
    assert on_demand("prefix.h", "g++ -O1", min_optimize=False) is None


def test_a_built_header_is_used_and_one_being_written_is_not(fake_inductor):
    codecache, build, builds = fake_inductor
    path = build("prefix.h", "g++ -O3")  # built by another process
    builds.clear()
    on_demand = header_on_demand(codecache, build)
    assert on_demand("prefix.h", "g++ -O3") == path
    with FileLock(path + ".lock"):  # a build in progress: the .gch may be half written
        assert on_demand("prefix.h", "g++ -O3") is None
    assert on_demand("prefix.h", "g++ -O3") == path
    assert builds == []


def test_with_deferral_off_the_header_is_built_at_once(fake_inductor, monkeypatch):
    codecache, build, builds = fake_inductor
    monkeypatch.setenv("PROBTORCH_DEFER_HEADER", "0")
    on_demand = header_on_demand(codecache, build)
    header = on_demand("prefix.h", "g++ -O3")
    assert builds == [header + ".gch"]
    assert not os.path.exists(header + ".rent")


def test_a_process_that_only_loads_cached_code_pays_no_rent(fake_inductor, monkeypatch):
    codecache, build, builds = fake_inductor
    monkeypatch.setattr(precompiled_header, "_generated_code", lambda: False)
    on_demand = header_on_demand(codecache, build)
    for _ in range(RENT_LIMIT + 1):
        assert on_demand("prefix.h", "g++ -O3") is None
    found = on_demand.locate(codecache._HEADER_DIR, "prefix.h", "g++ -O3")
    assert found.rent_paid() == 0
    assert builds == []
