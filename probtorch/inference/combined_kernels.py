"""Build the small C++ kernels of one Inductor-generated module as one shared library.

Inductor compiles every C++ kernel of a graph into a library of its own. Each build pays
a fixed cost besides its code: g++ loads the 130 MB precompiled header of Inductor's C++
prelude (about 1.2 s however small the kernel, on this project's machines) and links a
shared object (0.25 s). A NUTS step whose model calls library routines (matrix products,
Cholesky factorizations, triangular solves) is split by them into several kernels:
logistic regression's step has 3, the SAAS GP's 7. With one compile thread (one core, or
``TORCHINDUCTOR_COMPILE_THREADS=1``) Inductor builds them one after the other, so those
fixed costs add up. Inside :func:`combined_cpp_kernels` the largest kernel of a module is
built alone, as Inductor builds it, and the others as one translation unit (each kernel
in a namespace of its own, one Python binding per kernel). The kernels' code and flags are
Inductor's. The largest kernel stays alone because g++ inlines differently in a larger
unit: with a small kernel beside it, the 100-d Gaussian's NUTS kernel called a mask cast
through the PLT 33 times instead of inlining it (4 KB more code); small kernels built
together compiled to the same machine code as built alone.

On Linux the unit also holds :mod:`.library_kernels`' direct BLAS and LAPACK calls and
:mod:`.call_program`'s loop (a few small functions, about 0.3 s of g++), which replayed
NUTS calls then use; a module of two kernels is built as the largest alone and the other
with those functions, and a module of one kernel as one unit with them (g++ then compiles
that kernel a little differently: hier_reg's NUTS kernel calls a mask cast through the PLT
19 times instead of 17; its whole runs, now through a program, were 5 % faster).

With more compile threads Inductor builds the kernels in parallel, and the fixed costs
overlap; there nothing changes. Whatever this module cannot handle is built the usual way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator

from . import call_program, library_kernels
from .compile import _FALSE
from .kernel_source import DOUBLE_REDUCE_ALL, PRELUDE, without_reductions

__all__ = ["build_library", "combined_cpp_kernels", "combined_source"]

_ENTRY = re.compile(r'extern\s+"C"\s+void\s+kernel\(')
_SCALARS = {"int64_t": "PyLong_AsLongLong", "long": "PyLong_AsLong"}

_lock = threading.Lock()
_depth = 0
_original: tuple[Callable, Callable] | None = None


class _PendingKernel:
    """What ``AsyncCompile.cpp_pybinding`` returns while the module's kernels are being
    collected; the module's ``async_compile.wait(globals())`` replaces it by the kernel."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: _Batch, index: int):
        self.batch = batch
        self.index = index

    def resolve(self) -> Callable:
        return self.batch.kernels()[self.index]

    def __call__(self, *args):  # only if a kernel runs before the module's wait()
        return self.resolve()(*args)


class _Batch:
    def __init__(self):
        self.argtypes: list[list[str]] = []
        self.sources: list[str] = []
        self._kernels: list[Callable] | None = None

    def add(self, argtypes: list[str], source: str) -> _PendingKernel:
        self.argtypes.append(list(argtypes))
        self.sources.append(source)
        return _PendingKernel(self, len(self.sources) - 1)

    def kernels(self) -> list[Callable]:
        if self._kernels is None:
            self._kernels = _build(self.argtypes, self.sources)
        return self._kernels


def _separately(argtypes: list[list[str]], sources: list[str]) -> list[Callable]:
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return [
        CppPythonBindingsCodeCache.load_pybinding(types, source)
        for types, source in zip(argtypes, sources)
    ]


def _library() -> list[tuple[list[str], str]]:
    """The library functions every combined unit holds (Linux only; module docstring)."""
    if not sys.platform.startswith("linux"):
        return []
    return [*library_kernels.SOURCES, *call_program.SOURCES]


def _build(argtypes: list[list[str]], sources: list[str]) -> list[Callable]:
    """The kernels: the largest built alone, the others as one library (module docstring)."""
    largest = max(range(len(sources)), key=lambda i: len(sources[i]))
    rest = [i for i in range(len(sources)) if i != largest]
    if not _library():
        if len(rest) < 2:
            return _separately(argtypes, sources)
    elif not rest:  # one kernel: built with the library functions (machine code checked)
        largest, rest = None, [largest]
    combined = _unit([argtypes[i] for i in rest], [sources[i] for i in rest], argtypes)
    if combined is None:
        return _separately(argtypes, sources)
    kernels: list = [None] * len(sources)
    if largest is not None:
        kernels[largest] = _separately([argtypes[largest]], [sources[largest]])[0]
        address = _library() and call_program.library_address(kernels[largest], "kernel")
        if address:
            call_program.note_entry(kernels[largest], address, argtypes[largest])
    for position, i in enumerate(rest):
        kernels[i] = combined[position]
    return kernels


def _unit(argtypes, sources, all_argtypes=()) -> list[Callable] | None:
    """The bindings of ``sources`` (Inductor kernels) built as one library with
    :func:`_library`'s functions, which are taken into use, and callers for the numbers of
    arguments of ``all_argtypes`` (every kernel of the module) too; None where the unit
    cannot be written or built."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    library = _library()
    arities = {len(types) for types in [*all_argtypes, *argtypes]}
    arities |= {len(types) for types, _ in library}
    code = combined_source(
        [*argtypes, *(types for types, _ in library)],
        [*sources, *(source for _, source in library)],
        extra=call_program.callers_source(arities) if library else "",
    )
    if code is None:
        return None
    try:
        module = CppPythonBindingsCodeCache.load_async(code, "cpu")()
        bindings = [getattr(module, f"kernel_{k}") for k in range(len(sources) + len(library))]
    except Exception:  # noqa: BLE001 - g++ or the loader refused the combined unit
        return None
    if library:
        _register(module, bindings[: len(sources)], list(argtypes), bindings[len(sources) :],
                  arities)  # fmt: skip
    return bindings[: len(sources)]


def build_library() -> bool:
    """Build :mod:`.library_kernels`' and :mod:`.call_program`'s functions as a library of
    their own and take them into use (where no compiled step has done so yet); whether
    that worked (False off Linux). Each compiled step builds them anyway (above)."""
    return bool(_library()) and _unit([], []) is not None


def _register(module, kernels, kernel_types, functions, arities) -> None:
    """Take a combined unit's library functions into use and tell :mod:`.call_program`
    which C functions its bindings call."""
    count = len(library_kernels.SOURCES)
    library_kernels.register(functions[:count])
    call_program.register(functions[count:])
    call_program.register_callers(module.__file__, arities)
    types = kernel_types + [t for t, _ in _library()]
    _note_entries(module, kernels + functions, types)


def _note_entries(module, functions, types) -> None:
    """Tell :mod:`.call_program` the C functions that ``functions`` (the unit's bindings, in
    order) call."""
    try:
        library = ctypes.CDLL(module.__file__)
        table = (ctypes.c_void_p * len(functions)).in_dll(library, "probtorch_kernel_addresses")
    except (OSError, ValueError, AttributeError):
        return
    for function, argtypes, address in zip(functions, types, table):
        if address:
            call_program.note_entry(function, address, argtypes)


def _argument(argtype: str, n: int) -> str | None:
    argtype = argtype.replace("const ", "").strip()
    if argtype.endswith("*"):
        return f"static_cast<{argtype}>(probtorch_tensor_data(PyTuple_GET_ITEM(args, {n})))"
    if argtype in _SCALARS:
        return f"probtorch_scalar({_SCALARS[argtype]}(PyTuple_GET_ITEM(args, {n})))"
    return None


def combined_source(argtypes: list[list[str]], sources: list[str], extra: str = "") -> str | None:
    """One C++ source for Inductor's kernel ``sources`` (each defining ``extern "C" void
    kernel(...)`` with the argument types ``argtypes``) and a Python module ``kernel`` whose
    function ``kernel_i`` calls the i-th, as Inductor's own binding of one kernel does;
    None where a source is not of that form. The kernels' addresses are exported as
    ``probtorch_kernel_addresses``; ``extra``: more C++ (at file scope).

    Example::

        >>> src = PRELUDE + '\\nextern "C" void kernel(double* out) { out[0] = 1.0; }'
        >>> code = combined_source([["double*"], ["double*"]], [src, src])
        >>> "probtorch_kernel_1::kernel(" in code
        True
    """
    # kernel_source's C++ once at the top, where the kernels have it (probtorch's compiles)
    added = any(PRELUDE + DOUBLE_REDUCE_ALL in source for source in sources)
    parts = [PRELUDE + DOUBLE_REDUCE_ALL if added else PRELUDE]
    bindings, methods = [], []
    for i, (types, source) in enumerate(zip(argtypes, sources)):
        body = without_reductions(source)
        if len(_ENTRY.findall(body)) != 1 or "#define" in body or "#include" in body:
            return None
        arguments = [_argument(t, n) for n, t in enumerate(types)]
        if any(a is None for a in arguments):
            return None
        parts.append(f"namespace probtorch_kernel_{i} {{\n{_ENTRY.sub('void kernel(', body)}\n}}")
        bindings.append(
            f"static PyObject* kernel_{i}_py(PyObject*, PyObject* args) {{\n"
            f"    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != {len(types)}) {{\n"
            f'        PyErr_SetString(PyExc_TypeError, "kernel_{i}: {len(types)} arguments");\n'
            "        return nullptr;\n    }\n"
            f"    try {{\n        probtorch_kernel_{i}::kernel({', '.join(arguments)});\n"
            "    } catch (std::exception const& e) {\n"
            "        PyErr_SetString(PyExc_RuntimeError, e.what());\n        return nullptr;\n"
            "    }\n    Py_RETURN_NONE;\n}"
        )
        methods.append(f'    {{"kernel_{i}", kernel_{i}_py, METH_VARARGS, ""}},')
    addresses = ", ".join(
        f"reinterpret_cast<void*>(&probtorch_kernel_{i}::kernel)" for i in range(len(sources))
    )
    parts.append(f'extern "C" void* probtorch_kernel_addresses[] = {{{addresses}}};')
    parts.append(extra)
    parts.append(_BINDING_HEAD)
    parts.extend(bindings)
    parts.append(
        "static PyMethodDef probtorch_methods[] = {\n"
        + "\n".join(methods)
        + "\n    {nullptr, nullptr, 0, nullptr}};\n"
        + _BINDING_TAIL
    )
    return "\n".join(parts)


# The tensor-to-pointer function is torch's (its address is passed in the environment by
# Inductor's loader, as for Inductor's own kernel bindings), so no torch header is needed.
_BINDING_HEAD = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

static void* (*probtorch_tensor_data)(PyObject* obj);

template <typename T> static inline T probtorch_scalar(T value) {
    if (value == static_cast<T>(-1) && PyErr_Occurred())
        throw std::runtime_error("expected an integer argument");
    return value;
}
"""

_BINDING_TAIL = r"""
static struct PyModuleDef probtorch_module =
    {PyModuleDef_HEAD_INIT, "kernel", nullptr, -1, probtorch_methods};

PyMODINIT_FUNC PyInit_kernel(void) {
    const char* address = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if (!address) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
        return nullptr;
    }
    char* end = nullptr;
    errno = 0;
    uintptr_t value = std::strtoull(address, &end, 10);
    if (errno != 0 || end == address || value == 0) {
        PyErr_SetString(PyExc_RuntimeError, "cannot parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        return nullptr;
    }
    probtorch_tensor_data = reinterpret_cast<decltype(probtorch_tensor_data)>(value);
    return PyModule_Create(&probtorch_module);
}
"""


def _install() -> None:
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    global _original
    _original = (AsyncCompile.cpp_pybinding, AsyncCompile.wait)
    cpp_pybinding, wait = _original

    def collecting_cpp_pybinding(self, argtypes, source_code):
        if get_compile_threads() > 1:
            return cpp_pybinding(self, argtypes, source_code)
        batch = self.__dict__.setdefault("_probtorch_batch", _Batch())
        return batch.add(argtypes, source_code)

    def building_wait(self, scope):
        batch = self.__dict__.pop("_probtorch_batch", None)
        if batch is not None:
            for name, value in list(scope.items()):
                if isinstance(value, _PendingKernel):
                    scope[name] = value.resolve()
        return wait(self, scope)

    AsyncCompile.cpp_pybinding = collecting_cpp_pybinding
    AsyncCompile.wait = building_wait


def _uninstall() -> None:
    from torch._inductor.async_compile import AsyncCompile

    global _original
    AsyncCompile.cpp_pybinding, AsyncCompile.wait = _original
    _original = None


@contextlib.contextmanager
def combined_cpp_kernels() -> Iterator[None]:
    """Inside, the C++ kernels of each module Inductor generates (or loads from its
    cache), all but the largest, are built as one library when Inductor has one compile
    thread (see the module docstring). Reentrant; the patch on Inductor's ``AsyncCompile``
    is removed on exit.

    Example::

        >>> import torch
        >>> def f(x):
        ...     return (x.sin() @ x).cos().sum(0)
        >>> with combined_cpp_kernels():
        ...     g = torch._inductor.standalone_compile(
        ...         torch.fx.symbolic_trace(f), [torch.randn(3, 3)],
        ...         dynamic_shapes="from_example_inputs")
    """
    global _depth
    if os.environ.get("PROBTORCH_COMBINE_KERNELS", "1").strip().lower() in _FALSE:
        yield
        return
    with _lock:
        if _depth == 0:
            _install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _uninstall()
