"""The tutorials (tutorials/*.ipynb): each runs top to bottom, and none is committed with outputs.

Every notebook is executed with nbclient in a fresh ipykernel ("python3", resolved to this
test process's interpreter, i.e. the project's virtualenv) in smoke mode: ``PROBTORCH_SMOKE=1``
makes each notebook shrink its steps and draws. A failing cell fails the test and shows the
cell's traceback. The kernel inherits ``TORCHINDUCTOR_CACHE_DIR`` (set by conftest.py), so
compiled kernels are cached with the rest of the suite's.

Scheduling: one test per notebook, marked slow. They carry no ``xdist_group``: under
``--dist loadgroup`` ungrouped tests are handed out one by one, so the notebooks (the longest
take about a minute on a cold compile cache) spread over the workers instead of queueing on one.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("*.ipynb"))
KERNEL = "python3"
CELL_TIMEOUT_S = 600


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PROBTORCH_SMOKE"] = "1"
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / ".cache" / "inductor"))
    # One intra-op thread per kernel, as conftest.py sets for the test processes: two
    # workers share two cores.
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


def test_tutorials_exist():
    assert NOTEBOOKS, f"no notebooks in {TUTORIALS}"


def test_kernel_runs_this_interpreter():
    """The "python3" kernel must start the venv's Python, not whatever is first on PATH."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=KERNEL)
    cmd = km.format_kernel_cmd()
    assert os.path.realpath(cmd[0]) == os.path.realpath(sys.executable), cmd


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stripped(path):
    """Notebooks are committed without outputs (they are executed in CI instead)."""
    nb = nbformat.read(path, as_version=4)
    dirty = [
        i
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)
    ]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs or execution counts"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_listed_in_readme(path):
    assert f"(tutorials/{path.name})" in (ROOT / "README.md").read_text(), (
        f"{path.name} has no line in README.md's Tutorials section"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(TUTORIALS)}},
    )
    client.execute(env=_kernel_env())
