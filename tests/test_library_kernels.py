"""Triangular solves, matrix products, matrix-vector products and Cholesky factors straight
through BLAS/LAPACK (library_kernels.py): the same results as torch for every layout they
take, refused for what they cannot read, and used by
replayed NUTS calls where they give torch's bits."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from probtorch.inference import generated_call, library_kernels
from probtorch.inference.combined_kernels import build_library


@pytest.fixture(scope="module", autouse=True)
def built():
    """The functions built and taken into use, as a compiled step's combined unit does."""
    assert build_library()
    for kind in ("trsm", "gemm", "potrf", "gemv"):
        assert set(library_kernels._KINDS[kind]) == {torch.float64, torch.float32}


def _triangular(n, upper, dtype, gen, batch=()):
    a = torch.randn(*batch, n, n, generator=gen, dtype=torch.float64)
    factor = torch.linalg.cholesky(a @ a.mT + n * torch.eye(n, dtype=torch.float64))
    return (factor.mT if upper else factor).to(dtype)


def _solve(A, B, **kw):
    expected = torch.linalg.solve_triangular(A, B, **kw)
    out = torch.empty_strided(expected.shape, expected.stride(), dtype=expected.dtype)
    call = library_kernels.direct_solve_triangular(A, B, out, **kw)
    assert call is not None
    call()
    return expected, out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("row_major", [True, False])
@pytest.mark.parametrize("unitriangular", [False, True])
def test_direct_solve_gives_torchs_result(dtype, upper, left, row_major, unitriangular):
    gen = torch.Generator().manual_seed(0)
    A = _triangular(7, upper, dtype, gen)
    A = A.contiguous() if row_major else A.mT.contiguous().mT
    B = torch.randn(7, 3, generator=gen, dtype=dtype)
    B = B if left else B.mT
    expected, out = _solve(A, B, upper=upper, left=left, unitriangular=unitriangular)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out, expected, rtol=0, atol=tolerance)
    if left:  # how the NUTS steps of Gaussian models call it: torch's own BLAS call
        assert generated_call._bitwise_equal(out, expected)


def test_direct_solve_broadcasts_batches_and_reads_strided_right_hand_sides():
    gen = torch.Generator().manual_seed(1)
    A = _triangular(5, False, torch.float64, gen, batch=(2, 1))  # one factor per outer entry
    B = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)[:, ::2].mT  # (3, 5, 2)
    expected, out = _solve(A, B.expand(2, 3, 5, 2), upper=False)
    assert generated_call._bitwise_equal(out, expected)
    # a single factor for a batch: torch may solve the batch as one right-hand side matrix
    # (other bits; the replay then keeps torch's call)
    A = _triangular(5, True, torch.float64, gen)
    expected, out = _solve(A, torch.randn(4, 5, 1, generator=gen, dtype=torch.float64), upper=True)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


def test_direct_solve_refuses_what_blas_cannot_read():
    solve = library_kernels.direct_solve_triangular
    A = _triangular(4, False, torch.float64, torch.Generator().manual_seed(2))
    B = torch.ones(4, 2, dtype=torch.float64)
    column_major = torch.empty(2, 4, dtype=torch.float64).mT
    assert solve(A, B, column_major, upper=False) is not None
    assert solve(A, B, torch.empty(4, 2, dtype=torch.float64), upper=False) is None  # row-major out
    strided = torch.empty(8, 8, dtype=torch.float64)[::2, ::2]  # neither row nor column major
    assert solve(strided, B, column_major, upper=False) is None
    assert solve(A.float(), B, column_major, upper=False) is None  # mixed dtypes
    assert solve(A, B, torch.empty(2, 3, dtype=torch.float64).mT, upper=False) is None
    assert solve(A.to(torch.complex128), B.to(torch.complex128),
                 column_major.to(torch.complex128), upper=False) is None  # fmt: skip


def _step(x, scale_tril):
    """A step with a solve between two kernels, as a Gaussian model's gradient makes."""
    y = torch.tanh(x) + 1.0
    z = torch.linalg.solve_triangular(scale_tril, y.mT, upper=False)
    x.copy_(x + 0.1 * torch.linalg.solve_triangular(scale_tril.mT, z, upper=True).mT)
    return (x.sum(),)


def test_replayed_call_solves_through_blas_with_the_generated_codes_bits(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    scale_tril = _triangular(6, False, torch.float64, gen)
    runs = {}
    for direct in (True, False):
        if not direct:
            monkeypatch.setattr(library_kernels, "direct_solve_triangular", lambda *a, **k: None)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        gm = make_fx(_step)(x.clone(), scale_tril)
        call, pool = generated_call.compile_graph(
            gm, [x.clone(), scale_tril], {}, written=[0], pool_buffers=True, replay=True
        )
        tape = call.bind.__self__
        solves = [s for s in tape._steps if s[0] == "op" and "solve" in str(s[1])]
        assert len(solves) == 2 and all((s[4][4] is not None) == direct for s in solves)
        run = call.bind([x, scale_tril])
        runs[direct] = [run()[0].clone() for _ in range(3)], x.clone()
    assert generated_call._bitwise_equal(runs[True], runs[False])
    y = torch.randn(4, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    for _ in range(3):
        _step(y, scale_tril)
    torch.testing.assert_close(runs[True][1], y)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((4, 25), (25, 50)), ((4, 1, 10), (4, 10, 10)), ((3, 7, 7), (3, 7, 7)), ((2, 5, 3), (3, 4))],
)
@pytest.mark.parametrize("transposed", [False, True])
def test_direct_matmul_gives_torchs_bits(dtype, a_shape, b_shape, transposed):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(*a_shape, generator=gen, dtype=dtype)
    b = torch.randn(*b_shape, generator=gen, dtype=dtype)
    if transposed:  # column-major operands
        a, b = a.mT.contiguous().mT, b.mT.contiguous().mT
    expected = torch.matmul(a, b)
    out = torch.empty_like(expected)
    product = library_kernels.direct_matmul(a, b.expand(*expected.shape[:-2], *b.shape[-2:]), out)
    assert product is not None
    product()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    multiply_adds = a.shape[-2] * a.shape[-1] * b.shape[-1]
    if a.dim() == b.dim() and not transposed and multiply_adds >= 400:
        # where torch calls BLAS for mm and bmm (smaller batched products it sums itself)
        assert generated_call._bitwise_equal(out, expected)
    wrong_inner = torch.ones(a.shape[-1] + 1, 2, dtype=dtype)
    assert library_kernels.direct_matmul(a, wrong_inner, out) is None
    assert library_kernels.direct_matmul(a, b, out.to(torch.float16)) is None


@pytest.mark.parametrize("upper", [False, True])
def test_direct_cholesky_gives_torchs_factor_and_info(upper):
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64)
    A = a @ a.mT + 5 * torch.eye(5, dtype=torch.float64)
    A[1] -= 50 * torch.eye(5, dtype=torch.float64)  # not positive definite: info > 0
    expected, expected_info = torch.linalg.cholesky_ex(A, upper=upper)
    L = torch.empty_strided(expected.shape, expected.stride(), dtype=torch.float64)
    info = torch.empty(3, dtype=torch.int32)
    factor = library_kernels.direct_cholesky(A, L, info, upper=upper)
    assert factor is not None
    factor()
    assert generated_call._bitwise_equal((L, info), (expected, expected_info))
    assert int(info[1]) > 0 and int(info[0]) == int(info[2]) == 0
    row_major = torch.empty(3, 5, 5, dtype=torch.float64)
    assert library_kernels.direct_cholesky(A, row_major, info) is None
    assert library_kernels.direct_cholesky(A, L, info.long()) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", ["row-major", "column-major", "padded", "strided vector"])
def test_direct_matvec_gives_torchs_bits(dtype, layout):
    """torch's mv calls BLAS's gemv (transposed for a row-major matrix): the direct call
    makes the same call, so the bits are torch's for every layout."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(300, 25, generator=gen, dtype=dtype)
    x = torch.randn(25, generator=gen, dtype=dtype)
    if layout == "column-major":
        a = a.mT.contiguous().mT
    elif layout == "padded":  # leading dimension larger than the rows
        a = torch.randn(25, 320, generator=gen, dtype=dtype)[:, :300].mT
    elif layout == "strided vector":
        x = torch.randn(50, generator=gen, dtype=dtype)[::2]
    expected = torch.mv(a, x)
    out = torch.empty_like(expected)
    product = library_kernels.direct_matvec(a, x, out)
    assert product is not None
    product()
    assert generated_call._bitwise_equal(out, expected)
    assert library_kernels.direct_matvec(a, x[:-1], out) is None  # wrong length
    assert library_kernels.direct_matvec(a, x, out.to(torch.float16)) is None
    assert library_kernels.direct_matvec(a[None], x, out) is None  # not a matrix


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "shape, layout",
    [((5000, 25), "column-major"), ((5000, 25), "row-major"), ((25, 5000), "row-major"),
     ((37, 3), "column-major"), ((1, 9), "row-major"), ((9, 1), "column-major")],
)  # fmt: skip
def test_own_matvec_agrees_with_torch_and_repeats_its_bits(dtype, shape, layout):
    """probtorch's own matrix-vector loops (not BLAS): within roundings of torch's ``mv``
    (error bounds of a sum of ``cols`` products), the same bits on every call."""
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(*shape, generator=gen, dtype=dtype)
    if layout == "column-major":
        a = a.mT.contiguous().mT
    x = torch.randn(shape[1], generator=gen, dtype=dtype)
    out, again = torch.empty(shape[0], dtype=dtype), torch.empty(shape[0], dtype=dtype)
    product = library_kernels.own_matvec(a, x, out)
    assert product is not None
    product()
    library_kernels.own_matvec(a, x, again)()
    assert generated_call._bitwise_equal(out, again)
    exact = a.double() @ x.double()
    bound = 2 * shape[1] * torch.finfo(dtype).eps * (a.double().abs() @ x.double().abs())
    assert bool(((out.double() - exact).abs() <= bound).all())
    strided = torch.randn(2 * shape[1], generator=gen, dtype=dtype)[::2]
    refused = library_kernels.own_matvec(a, strided, out) is None
    assert refused == (layout == "row-major" and shape[0] > 1 and shape[1] > 1)
    assert library_kernels.own_matvec(a, x, out.to(torch.float16)) is None


def test_matvec_op_is_own_matvec_and_the_pass_replaces_mv():
    """``probtorch::matvec`` computes what own_matvec computes (copies for layouts it does
    not read); :func:`use_own_matvec` puts it in place of a graph's float ``aten.mv``."""
    from probtorch.inference.matvec_op import use_own_matvec

    gen = torch.Generator().manual_seed(9)
    a = torch.randn(40, 6, generator=gen)
    x = torch.randn(6, generator=gen)
    direct = torch.empty(40)
    library_kernels.own_matvec(a, x, direct)()
    assert generated_call._bitwise_equal(torch.ops.probtorch.matvec(a, x), direct)
    out = torch.empty(40)
    torch.ops.probtorch.matvec.out(a, x, out=out)
    assert generated_call._bitwise_equal(out, direct)
    sliced = torch.randn(40, 12, generator=gen)[:, ::2]  # neither row- nor column-major
    torch.testing.assert_close(torch.ops.probtorch.matvec(sliced, x), torch.mv(sliced, x))

    def model(a, x, n):
        return (torch.mv(a, x).sum() + torch.mv(n, n[0]).sum(),)

    n = torch.ones(3, 3, dtype=torch.int64)
    gm = make_fx(model, tracing_mode="fake")(a, x, n)
    assert use_own_matvec(gm) == 1  # the integer product keeps aten.mv
    targets = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    assert torch.ops.probtorch.matvec.default in targets and torch.ops.aten.mv.default in targets
    torch.testing.assert_close(gm(a, x, n)[0], model(a, x, n)[0])
