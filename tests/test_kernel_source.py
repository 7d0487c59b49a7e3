"""The C++ probtorch adds to Inductor's CPU kernels (probtorch/inference/kernel_source.py):
float64 rows reduced with shuffles in probtorch's compiles, results as eager's."""

import pytest
import torch
from torch._inductor.utils import run_and_get_code

from probtorch.inference.compile import compile_fn
from probtorch.inference.kernel_source import (
    DOUBLE_REDUCE_ALL,
    PRELUDE,
    with_reductions,
    without_reductions,
)

MARK = "PROBTORCH_REDUCE_ALL_DOUBLE"


def _rows(seed=0, dtype=torch.float64):
    # 37 columns: two vector steps of 16 doubles and a tail, then one horizontal reduction
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(6, 37, generator=gen, dtype=dtype) + 0.5
    x[1, 5] = -3.0  # a row whose extreme sits in the first vector step
    x[2, 36] = 7.0  # and one whose extreme sits in the tail
    return x


REDUCTIONS = {
    "sum": lambda x: x.sum(-1),
    "prod": lambda x: x.prod(-1),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "dot": lambda x: (x * x.exp()).sum(-1) + x.mean(-1),
}


def _isa(simdlen):
    from torch._inductor import config, cpu_vec_isa

    with config.patch({"cpp.simdlen": simdlen}):
        return cpu_vec_isa.pick_vec_isa()


# None: Inductor's choice (AVX-512 on this project's machines); 256: AVX2, the other branch
@pytest.mark.parametrize("simdlen", [None, 256])
@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_probtorch_compiles_reduce_float64_rows_with_shuffles_and_match_eager(name, simdlen):
    if not _isa(simdlen):
        pytest.skip(f"no vector ISA of {simdlen} bits on this CPU")
    fn = REDUCTIONS[name]
    x = _rows()
    got, code = run_and_get_code(compile_fn(fn, options={"cpp.simdlen": simdlen}), x)
    source = "\n".join(code)
    assert MARK in source and "vec_reduce_all<double" in source
    want = fn(x)
    if name in ("amax", "amin"):
        assert torch.equal(got, want)
    else:  # the lanes are added as a tree: the last bits may differ from eager's order
        torch.testing.assert_close(got, want, rtol=1e-13, atol=0.0)


def test_a_nan_in_a_row_still_wins_its_maximum():
    x = _rows(1)
    x[3, 20] = float("nan")
    got = compile_fn(REDUCTIONS["amax"])(x)
    assert torch.isnan(got[3]) and not torch.isnan(got[[0, 1, 2, 4, 5]]).any()
    assert torch.equal(got[[0, 1, 2, 4, 5]], x.amax(-1)[[0, 1, 2, 4, 5]])


def test_a_plain_torch_compile_gets_inductor_s_own_code():
    x = _rows(2)
    got, code = run_and_get_code(torch.compile(lambda x: x.sum(-1) * 2.0), x)
    assert MARK not in "\n".join(code)
    torch.testing.assert_close(got, x.sum(-1) * 2.0)


def test_a_unit_of_several_kernels_carries_the_code_once_and_only_if_they_had_it():
    from probtorch.inference.combined_kernels import combined_source

    src = PRELUDE + '\nextern "C" void kernel(double* out) { out[0] = 1.0; }'
    plain = combined_source([["double*"]] * 2, [src, src])
    added = combined_source([["double*"]] * 2, [with_reductions(src)] * 2)
    assert MARK not in plain
    assert added.count(DOUBLE_REDUCE_ALL) == 1 and added.startswith(PRELUDE + DOUBLE_REDUCE_ALL)


def test_the_code_goes_after_the_prelude_once_and_comes_off_with_it():
    src = PRELUDE + '\nextern "C" void kernel(double* out) { out[0] = 1.0; }'
    added = with_reductions(src)
    assert added.startswith(PRELUDE + DOUBLE_REDUCE_ALL)
    assert with_reductions(added) == added
    assert with_reductions("int f();") == "int f();"  # no prelude: left alone
    assert without_reductions(added) == without_reductions(src)
    assert PRELUDE not in without_reductions(added)
