"""Inductor's small C++ kernels of one generated module built as one library when Inductor
has one compile thread (the largest alone): same results bit for bit, patch removed after."""

import sys

import pytest
import torch
from torch._inductor import config
from torch._inductor.async_compile import AsyncCompile
from torch._inductor.codecache import PyCodeCache
from torch._inductor.utils import fresh_cache
from torch.fx.experimental.proxy_tensor import make_fx

from probtorch.inference.combined_kernels import combined_cpp_kernels, combined_source
from probtorch.inference.compile import inductor_base_options
from probtorch.inference.generated_call import _is_kernel, generated_module
from probtorch.inference.kernel_source import PRELUDE


def _solve(scale_tril, y):
    return torch.linalg.solve_triangular(scale_tril, y.unsqueeze(-1), upper=False).squeeze(-1)


def _split_by_solves(x, scale_tril):
    """Three C++ kernels: before, between and after two triangular solves (library calls)."""
    y = torch.tanh(x) * 2.0
    z = torch.exp(-_solve(scale_tril, y).abs()) + y
    return ((_solve(scale_tril, z).sin() * z).sum(-1),)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, 5, generator=gen, dtype=torch.float64)
    scale_tril = torch.linalg.cholesky(a @ a.mT + 5 * torch.eye(5, dtype=torch.float64))
    return [torch.randn(4, 5, generator=gen, dtype=torch.float64), scale_tril]


def _compile(threads: int, options: dict | None = None):
    """The graph compiled from empty caches with ``threads`` compile threads inside
    :func:`combined_cpp_kernels` (``options``: Inductor's): its result and the generated
    module's kernels."""
    inputs = _inputs()
    gm = make_fx(_split_by_solves)(*inputs)
    with fresh_cache(), config.patch(compile_threads=threads), combined_cpp_kernels():
        loaded = len(PyCodeCache.modules)
        compiled = torch._inductor.standalone_compile(
            gm,
            inputs,
            dynamic_shapes="from_example_inputs",
            options={"config_patches": options or {}},
        )
        module = generated_module(PyCodeCache.modules[loaded:])
    kernels = [value for name, value in vars(module).items() if _is_kernel(name, value)]
    return compiled(*inputs), kernels


def test_one_compile_thread_builds_the_kernels_as_one_library_with_the_same_results():
    original = (AsyncCompile.cpp_pybinding, AsyncCompile.wait)
    combined, kernels = _compile(threads=1)
    separate, separate_kernels = _compile(threads=2)
    assert (AsyncCompile.cpp_pybinding, AsyncCompile.wait) == original  # patch removed
    assert len(kernels) == len(separate_kernels) >= 3
    # the largest kernel alone, the others in one library
    assert len({id(k.__self__) for k in kernels}) == 2
    assert len({id(k.__self__) for k in separate_kernels}) == len(separate_kernels)
    assert torch.equal(combined[0], separate[0])
    torch.testing.assert_close(combined[0], _split_by_solves(*_inputs())[0])


def test_kernels_of_probtorch_s_compiles_are_combined_with_their_added_code_once():
    # probtorch's options add kernel_source's C++ after every kernel's prelude
    combined, kernels = _compile(threads=1, options=inductor_base_options())
    assert len(kernels) >= 3 and len({id(k.__self__) for k in kernels}) == 2
    torch.testing.assert_close(combined[0], _split_by_solves(*_inputs())[0])


def test_combined_source_refuses_what_it_cannot_bind():
    kernel = PRELUDE + '\nextern "C" void kernel(double* out, int64_t n) { out[0] = n; }'
    code = combined_source([["double*", "int64_t"]] * 2, [kernel, kernel])
    assert code.count("void kernel(") == 2 and 'extern "C" void kernel' not in code
    with_macro = PRELUDE + '\n#define N 3\nextern "C" void kernel(double* out) { }'
    assert combined_source([["double*"]] * 2, [kernel, with_macro]) is None
    assert combined_source([["double*"], ["at::Half"]], [kernel, kernel]) is None


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_switch_turns_it_off(monkeypatch, value):
    monkeypatch.setenv("PROBTORCH_COMBINE_KERNELS", value)
    original = AsyncCompile.cpp_pybinding
    with combined_cpp_kernels():
        assert AsyncCompile.cpp_pybinding is original


def test_a_combined_unit_that_fails_to_build_falls_back_to_one_library_per_kernel(monkeypatch):
    from probtorch.inference import combined_kernels

    def broken(argtypes, sources, **kwargs):
        return combined_source(argtypes, sources, **kwargs) + "\nthis is not C++;\n"

    monkeypatch.setattr(combined_kernels, "combined_source", broken)
    result, kernels = _compile(threads=1)
    assert len({id(k.__self__) for k in kernels}) == len(kernels) >= 3
    torch.testing.assert_close(result[0], _split_by_solves(*_inputs())[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="built on Linux only")
def test_the_combined_unit_brings_the_direct_blas_calls(monkeypatch):
    from probtorch.inference import library_kernels

    kinds = ("trsm", "gemm", "potrf", "gemv", "matvec")
    monkeypatch.setattr(library_kernels, "_KINDS", {kind: {} for kind in kinds})
    _compile(threads=1)
    for kind in kinds:
        assert set(library_kernels._KINDS[kind]) == {torch.float64, torch.float32}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="built on Linux only")
def test_a_module_of_one_kernel_is_built_with_the_library_functions():
    def one_kernel(x):
        return ((x.sin() * 2.0).sum(-1),)

    x = torch.randn(4, 5, dtype=torch.float64)
    gm = make_fx(one_kernel)(x)
    with fresh_cache(), config.patch(compile_threads=1), combined_cpp_kernels():
        loaded = len(PyCodeCache.modules)
        compiled = torch._inductor.standalone_compile(gm, [x], dynamic_shapes="from_example_inputs")
        module = generated_module(PyCodeCache.modules[loaded:])
    (kernel,) = [value for name, value in vars(module).items() if _is_kernel(name, value)]
    library = kernel.__self__
    assert kernel is library.kernel_0 and callable(library.kernel_1)  # the trsm, gemm, ...
    torch.testing.assert_close(compiled(x)[0], one_kernel(x)[0])
