"""Inductor's precompiled C++ header follows ``TORCHINDUCTOR_CACHE_DIR``
(probtorch.inference.compile.keep_headers_with_cache)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from probtorch.inference import compile as pt_compile

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import torch
from probtorch.inference.compile import compile_fn
f = compile_fn(lambda x: (2.0 * x).sin().sum(), True)
x = torch.linspace(0.0, 1.0, 100, dtype=torch.float64)
assert torch.allclose(f(x), (2.0 * x).sin().sum())
"""


def test_header_is_built_in_the_inductor_cache_not_the_temp_dir(tmp_path):
    cache, tmp = tmp_path / "inductor", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((cache / "precompiled_headers").glob("*.gch"))
    assert not list(tmp.glob("torchinductor_*/precompiled_headers/*.gch"))


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
