"""A replayed NUTS call run as a loop in C++: no Python between its kernels.

A bound :class:`~.generated_call.CallTape` is a fixed sequence of C functions (Inductor's
kernels and :mod:`.library_kernels`' BLAS calls) with fixed arguments: buffer addresses
and integers. Replayed from Python, each of them costs a Python call and the conversion
of every tensor argument to its address (one kernel of the 100-d Gaussian's step takes
about 40). Here the sequence is written once per bound call as a *program*, an int64
tensor ``[number of steps, then per step: function address, number of arguments,
arguments...]``, and :func:`run` makes whole blocks of calls in one C++ loop that stops
after a call whose done flag (a bool the step writes) is set.

The loop calls each function through a caller for its number of arguments, which calls
it as a function of that many 64-bit integers: pointers and ``int64_t`` are passed alike
on the platforms this runs on (Linux, where the loop is built); a kernel with another
argument type (a float, say) keeps the Python replay. A library call that has no C
function but fixed arguments (a random draw into a fixed buffer, say) is a *Python step*:
the loop calls it as a Python callable, with the GIL its binding holds; an exception it
raises stops the loop and comes out of :func:`run` (as the cause of a SystemError). The
callers are generated for the numbers of arguments of the kernels being built (the 100-d
Gaussian's NUTS kernel takes 177). The loop is built into the library of a compiled
step's small kernels (:mod:`.combined_kernels`), so it costs no build of its own. A
program is used only after one call through it gave bit for bit what the Python replay
gives (:func:`~.generated_call.replay_call`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence

import torch

__all__ = [
    "PYTHON",
    "SOURCES",
    "available",
    "callers_source",
    "note_entry",
    "program",
    "register",
    "register_callers",
    "run",
    "symbol_address",
]

_RUNNER = r"""#include <torch/csrc/inductor/cpp_prefix.h>
using probtorch_caller = void (*)(void*, const int64_t*);
extern "C" int probtorch_python_failed;  // set by a Python step that raised (callers)
extern "C" void kernel(const int64_t* program, const bool* done, int64_t max_calls,
                       int64_t* calls_made)
{
    int64_t calls = 0;
    while (calls < max_calls) {
        const int64_t* step = program + 1;
        for (int64_t s = 0; s < program[0]; ++s) {
            reinterpret_cast<probtorch_caller>(step[0])(reinterpret_cast<void*>(step[1]),
                                                        step + 3);
            if (probtorch_python_failed) {  // its exception is raised by the binding
                probtorch_python_failed = 0;
                calls_made[0] = calls;
                return;
            }
            step += 3 + step[2];
        }
        ++calls;
        if (*done) break;
    }
    calls_made[0] = calls;
}
"""

# A Python step: a callable of no arguments (the PyObject's address as the function),
# called with the GIL the loop's binding holds; an exception stops the loop and is raised
# by the binding.
_PYTHON_CALLER = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
extern "C" int probtorch_python_failed = 0;
extern "C" void probtorch_call_python(void* f, const int64_t*) {
    PyObject* result = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(f));
    if (result == nullptr) probtorch_python_failed = 1;
    else Py_DECREF(result);
}
"""

SOURCES: list[tuple[list[str], str]] = [
    (["const int64_t*", "const bool*", "int64_t", "int64_t*"], _RUNNER)
]

_INTEGERS = {"int64_t", "long", "const int64_t", "const long"}
_lock = threading.Lock()
_runner: list[Callable] = []
_entries: dict[int, tuple[object, int, tuple[str, ...]]] = {}
_callers: dict = {}  # number of arguments (or PYTHON) -> address of its caller
PYTHON = "python"  # a program step that calls a Python callable of no arguments


def callers_source(arities: set[int]) -> str:
    """C++ for the callers of functions of each number of arguments in ``arities``:
    ``probtorch_call_<n>(function, arguments)`` calls ``function`` with the ``n`` 64-bit
    words at ``arguments``."""
    parts = [_PYTHON_CALLER]
    for n in sorted(arities):
        words = ", ".join(["int64_t"] * n) or "void"
        arguments = ", ".join(f"a[{i}]" for i in range(n))
        parts.append(
            f'extern "C" void probtorch_call_{n}(void* f, const int64_t* a) {{\n'
            f"    reinterpret_cast<void (*)({words})>(f)({arguments});\n}}"
        )
    return "\n".join(parts)


def register_callers(path: str, arities: set[int]) -> None:
    """Note the callers :func:`callers_source` defined in the library at ``path``."""
    found = {n: symbol_address(path, f"probtorch_call_{n}") for n in arities}
    found[PYTHON] = symbol_address(path, "probtorch_call_python")
    with _lock:
        for n, address in found.items():
            if address:
                _callers.setdefault(n, address)


def register(functions: list[Callable]) -> None:
    """Take the built :data:`SOURCES` function into use (the first registration stays)."""
    with _lock:
        if not _runner:
            _runner.append(functions[0])


def available() -> bool:
    """Whether the loop was built in this process."""
    return bool(_runner)


def note_entry(function: Callable, address: int, argtypes: Sequence[str]) -> None:
    """Record that calling ``function`` (a Python binding) calls the C function at
    ``address`` with arguments of ``argtypes``."""
    with _lock:
        _entries[id(function)] = (function, address, tuple(argtypes))


def symbol_address(path: str, symbol: str, mode: int = ctypes.DEFAULT_MODE) -> int | None:
    """The address of the exported C ``symbol`` in the shared library at ``path`` (opened
    with ``mode``; a library already loaded is not loaded again), or None."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(path, mode=mode), symbol), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def library_address(function: Callable, symbol: str) -> int | None:
    """The address of the exported C ``symbol`` in the library that defines the Python
    binding ``function`` (a function of an extension module), or None."""
    path = getattr(getattr(function, "__self__", None), "__file__", None)
    return symbol_address(path, symbol) if path else None


def _word(argtype: str, value) -> int | None:
    argtype = argtype.strip()
    if argtype.endswith("*"):
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            return value.data_ptr()
        return None
    if argtype in _INTEGERS and isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def program(steps: Sequence[tuple[Callable, Sequence]]) -> torch.Tensor | None:
    """The program for ``steps`` (``(Python binding, its arguments)`` each, called in
    order; ``(PYTHON, callable)`` for a Python call of no arguments, which the caller must
    keep alive as long as it runs the program), or None where one of them has no known C
    function or caller, or an argument the loop cannot pass. A step is ``[caller,
    function, number of arguments, arguments]``."""
    words = [len(steps)]
    for function, arguments in steps:
        if function is PYTHON:
            caller = _callers.get(PYTHON)
            if caller is None or not callable(arguments):
                return None
            words += [caller, id(arguments), 0]
            continue
        entry = _entries.get(id(function))
        caller = _callers.get(len(arguments))
        if entry is None or entry[0] is not function or caller is None:
            return None
        _, address, argtypes = entry
        if len(argtypes) != len(arguments):
            return None
        converted = [_word(t, a) for t, a in zip(argtypes, arguments)]
        if any(w is None for w in converted):
            return None
        words += [caller, address, len(converted), *converted]
    return torch.tensor(words, dtype=torch.int64)


def run(program: torch.Tensor, done: torch.Tensor, max_calls: int, calls_made: torch.Tensor):
    """Make the program's calls up to ``max_calls`` times, stopping after a call that set
    ``done`` (a bool tensor); the number of calls made is written to ``calls_made[0]``."""
    _runner[0](program, done, max_calls, calls_made)
