"""The README's Python blocks run as written, so the README cannot rot."""

import pathlib
import re
import sys
import types

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert python_blocks(), "README.md lost its quickstart"


def test_readme_python_blocks_run(monkeypatch):
    # A real module, as for a user's script: torch.compile looks the model's module up.
    module = types.ModuleType("readme_quickstart")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["energy"].shape == (4,)
    assert namespace["grad"].shape == (4, 10)
    assert namespace["draws"]["theta"].shape == (2000, 8)
    assert 2.0 < float(namespace["draws"]["mu"].mean()) < 7.0
