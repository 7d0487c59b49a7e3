"""probtorch's Inductor graph rewrites (probtorch/inference/graph_passes.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import probtorch as pt
import probtorch.distributions as dist
from probtorch.inference.compile import compile_fn, count_compiles
from probtorch.inference.graph_passes import (
    BatchedTriangularSolve,
    InterleavedScatterAdd,
    NarrowMatmul,
    OuterShortReduction,
    RealizeBroadcastOperands,
    RowTimesMatrixAsLibraryCall,
)
from probtorch.inference.potential import initialize_model

F64 = torch.float64
SOLVE = torch.ops.aten.linalg_solve_triangular.default


def _triangular(n, upper, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=F64) + 3 * torch.eye(n, dtype=F64)
    return m.triu() if upper else m.tril()


def _solves(gm):
    return [node for node in gm.graph.nodes if node.target is SOLVE]


@pytest.mark.parametrize(
    "a_shape,b_shape,left",
    [
        ((5, 5), (4, 5, 1), True),  # chains x one right-hand side (MultivariateNormal)
        ((1, 5, 5), (4, 5, 3), True),
        ((1, 1, 5, 5), (2, 3, 5, 2), True),  # two batch dims
        ((5, 5), (4, 2, 5), False),  # X A = B
        ((1, 5, 5), (3, 4, 1, 5), False),
    ],
)
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("unitriangular", [False, True])
def test_rewrite_solves_once_and_matches(a_shape, b_shape, left, upper, unitriangular):
    n = a_shape[-1]
    A = _triangular(n, upper).reshape(a_shape)
    B = torch.randn(b_shape, dtype=F64, generator=torch.Generator().manual_seed(1))

    def solve(A, B):
        return torch.linalg.solve_triangular(
            A, B, upper=upper, left=left, unitriangular=unitriangular
        )

    gm = make_fx(solve, tracing_mode="fake")(A, B)
    assert [s.meta["val"].dim() for s in _solves(gm)] == [len(b_shape)], "a batched solve"
    _run_pass(BatchedTriangularSolve(), gm)
    solves = _solves(gm)
    assert len(solves) == 1
    assert solves[0].meta["val"].dim() == 2, "the rewritten solve has no batch dims"
    expected = solve(A, B)
    actual = gm(A, B)
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def _run_pass(graph_pass, gm: torch.fx.GraphModule) -> None:
    """Rewrite ``gm`` in place with ``graph_pass``, check its graph and regenerate its code."""
    graph_pass(gm.graph)
    gm.graph.lint()
    gm.recompile()


def test_batched_matrix_is_left_alone():
    A = torch.stack([_triangular(4, False, seed) for seed in range(3)])
    B = torch.randn(3, 4, 1, dtype=F64)

    def solve(A, B):
        return torch.linalg.solve_triangular(A, B, upper=False)

    gm = make_fx(solve, tracing_mode="fake")(A, B)
    before = [s.meta["val"].shape for s in _solves(gm)]
    BatchedTriangularSolve()(gm.graph)
    assert [s.meta["val"].shape for s in _solves(gm)] == before == [torch.Size([3, 4, 1])]


def _mvn_model(scale_tril):
    loc = torch.zeros(scale_tril.shape[-1])
    pt.sample("x", dist.MultivariateNormal(loc, scale_tril=scale_tril))


def test_compiled_mvn_potential_with_shared_scale_tril_equals_eager(float64):
    """The chains' potential of a MultivariateNormal with a fixed scale_tril (the rewrite's
    target): compiled equals eager, without graph breaks or recompiles."""
    L = torch.linalg.cholesky(_triangular(6, False) @ _triangular(6, False).mT)
    eager, z0 = initialize_model(_mvn_model, (L,), {}, num_chains=4, compile=False)
    compiled, _ = initialize_model(_mvn_model, (L,), {}, num_chains=4, compile=True)
    with count_compiles() as stats:
        value, grad = compiled.value_and_grad(z0)
        compiled.value_and_grad(z0 + 1)
    assert stats.graph_breaks == 0 and stats.graphs == 1
    ref_value, ref_grad = eager.value_and_grad(z0)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


def test_compile_fn_applies_the_rewrite(float64, monkeypatch):
    """compile_fn's default options run the rewrite: the compiled graph holds no batched
    solve (fresh caches, so the graph is really compiled)."""
    from torch._inductor.utils import fresh_cache

    L = _triangular(5, False)
    seen = []
    rewrite = BatchedTriangularSolve.__call__

    def spy(self, graph):
        rewrite(self, graph)
        seen.extend(n.meta["val"].dim() for n in graph.nodes if n.target is SOLVE)

    monkeypatch.setattr(BatchedTriangularSolve, "__call__", spy)

    def nll(x):
        return 0.5 * torch.linalg.solve_triangular(L, x.unsqueeze(-1), upper=False).pow(2).sum()

    batched = torch.func.vmap(torch.func.grad(nll))
    x = torch.randn(4, 5)
    with fresh_cache():
        actual = compile_fn(batched)(x)
    torch.testing.assert_close(actual, batched(x), rtol=1e-12, atol=1e-12)
    assert seen and all(d == 2 for d in seen), seen


_ISA_SCRIPT = """
import json
from torch._inductor import cpu_vec_isa
probed = []
real = cpu_vec_isa.VecISA.check_build
def spy(self, code):
    probed.append(code)
    return real(self, code)
cpu_vec_isa.VecISA.check_build = spy
from probtorch.inference.compile import inductor_base_options
inductor_base_options()
isas = cpu_vec_isa.valid_vec_isa_list()
print(json.dumps({
    "isas": [str(i) for i in isas],
    "bf16": [bool(getattr(i, "is_avx512_bf16_supported", lambda: False)()) for i in isas],
    "probed": len([c for c in probed if c != getattr(cpu_vec_isa.VecAMX, "_amx_code", None)]),
    "restored": cpu_vec_isa.VecISA.check_build is spy,
}))
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"),
    reason="the ISA probes are answered from the CPU flags on Linux x86-64 only",
)
def test_isa_probes_answered_from_cpu_flags_give_inductors_answer():
    """With the probes answered from the CPU flags, Inductor's ISA list (and its BF16 flag,
    which changes the compile flags) is the one its compile-and-load probes give. On CPUs
    with AMX its probe still runs (not counted here)."""

    def run(probe):
        env = {**os.environ, "PROBTORCH_PROBE_VEC_ISA": probe}
        out = subprocess.run(
            [sys.executable, "-c", _ISA_SCRIPT], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    trusted, probed = run("0"), run("1")
    assert trusted["isas"] == probed["isas"] and trusted["bf16"] == probed["bf16"]
    assert trusted["probed"] == 0 and trusted["restored"]


MM = torch.ops.aten.mm.default


def _products(gm):
    return [
        (tuple(n.args[0].meta["val"].shape), tuple(n.args[1].meta["val"].shape))
        for n in gm.graph.nodes
        if n.target is MM
    ]


@pytest.mark.parametrize(
    "a_shape,b_shape,dtype,rewritten",
    [
        ((5000, 25), (25, 4), torch.float32, True),  # X @ B: data times one column per chain
        ((25, 5000), (5000, 4), torch.float32, True),  # its gradient, Xᵀ G
        ((1000, 100), (100, 8), torch.float32, True),
        ((1000, 100), (100, 16), F64, True),
        ((1000, 100), (100, 9), torch.float32, False),  # wide enough for MKL
        ((1000, 100), (100, 17), F64, False),
        ((5000, 25), (25, 1), torch.float32, False),  # one column: a matrix-vector product
        ((85, 10), (10, 4), F64, False),  # small: call setup dominates
    ],
)
def test_narrow_products_are_computed_transposed(a_shape, b_shape, dtype, rewritten):
    g = torch.Generator().manual_seed(2)
    A = torch.randn(a_shape, generator=g, dtype=dtype)
    B = torch.randn(b_shape, generator=g, dtype=dtype)
    gm = make_fx(torch.mm, tracing_mode="fake")(A, B)
    _run_pass(NarrowMatmul(), gm)
    expected = [(b_shape[::-1], a_shape[::-1])] if rewritten else [(a_shape, b_shape)]
    assert _products(gm) == expected
    out = gm(A, B)
    assert out.shape == (a_shape[0], b_shape[1])
    tol = 1e-12 if dtype == F64 else 1e-4
    torch.testing.assert_close(out, A @ B, rtol=tol, atol=tol)


def test_natural_regression_under_the_chain_vmap_is_rewritten_and_exact(float64, monkeypatch):
    """``X @ beta`` batched over chains (and its gradient) reaches Inductor as two narrow
    products; compiled with probtorch's options both are transposed, and the potential and
    gradient equal eager ones."""
    from torch._inductor.utils import fresh_cache

    g = torch.Generator().manual_seed(3)
    X = torch.randn(2000, 20, generator=g, dtype=F64)
    y = torch.bernoulli(torch.full((2000,), 0.4, dtype=F64), generator=g)

    def nll(beta):
        logits = X @ beta
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")

    seen = []
    rewrite = NarrowMatmul.__call__

    def spy(self, graph):
        rewrite(self, graph)
        seen.extend(tuple(n.args[1].meta["val"].shape) for n in graph.nodes if n.target is MM)

    monkeypatch.setattr(NarrowMatmul, "__call__", spy)
    batched = torch.func.vmap(torch.func.grad_and_value(nll))
    beta = torch.randn(4, 20, generator=g, dtype=F64)
    with fresh_cache():
        grad, value = compile_fn(batched)(beta)
    ref_grad, ref_value = batched(beta)
    torch.testing.assert_close(value, ref_value, rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-10)
    assert sorted(seen) == [(20, 2000), (2000, 20)]  # both products: chains first


def _pairwise_kernel(X, tausq, inv_length_sq):
    """A Matern-style kernel's sum over pairs, inputs scaled by lengthscales (the SAAS GP)."""
    Xs = X / (tausq * inv_length_sq).rsqrt()
    r2 = (Xs.unsqueeze(-2) - Xs.unsqueeze(-3)).pow(2).sum(-1)
    return torch.exp(-(r2 + 1e-12).sqrt()).sum()


def _pairwise_inputs():
    g = torch.Generator().manual_seed(0)
    return (
        torch.rand(30, 10, generator=g, dtype=F64),
        torch.tensor(0.7, dtype=F64),
        (torch.rand(10, generator=g, dtype=F64) + 0.5),
    )


def _forced(gm):
    from torch._inductor.inductor_prims import force_stride_order

    return [n.args[0].target for n in gm.graph.nodes if n.target is force_stride_order]


def test_costly_values_broadcast_to_many_times_their_size_are_stored_once():
    gm = make_fx(_pairwise_kernel, tracing_mode="fake")(*_pairwise_inputs())
    _run_pass(RealizeBroadcastOperands(), gm)
    # the scaled inputs (300 elements, compared over 30 x 30 pairs) are stored; the
    # lengthscales (10 elements) and the cheap subtraction are left to Inductor
    assert _forced(gm) == [torch.ops.aten.div.Tensor]
    args = _pairwise_inputs()
    assert torch.equal(gm(*args), _pairwise_kernel(*args))


def _matern_pairs(X, tausq, inv_length_sq):
    """A Matern-5/2 kernel's sum over pairs, as BoTorch writes it (square root of the
    clamped squared distance)."""
    Xs = X / (tausq * inv_length_sq).rsqrt()
    r = (Xs.unsqueeze(-2) - Xs.unsqueeze(-3)).pow(2).sum(-1).clamp_min(1e-30).sqrt()
    s5 = 5.0**0.5 * r
    return ((1.0 + s5 + 5.0 / 3.0 * r.pow(2)) * torch.exp(-s5)).sum()


def test_a_cheap_result_over_a_costly_one_is_stored_once_before_its_broadcast():
    # The gradient's per-pair factor is a `where` (clamp_min's backward) over a square root
    # and a division; it is broadcast over the 10 dimensions of each pair's difference.
    grad = torch.func.grad(_matern_pairs, argnums=(0, 2))
    args = _pairwise_inputs()
    plain = make_fx(grad, tracing_mode="fake")(*args)
    gm = make_fx(grad, tracing_mode="fake")(*args)
    only_costly = RealizeBroadcastOperands()
    only_costly.inline_depth = 0  # the pass as it was: costly nodes themselves only
    _run_pass(only_costly, plain)
    _run_pass(RealizeBroadcastOperands(), gm)
    from torch._inductor.inductor_prims import force_stride_order

    stored = {
        (n.args[0].target, tuple(n.meta["val"].shape))
        for n in gm.graph.nodes
        if n.target is force_stride_order
    }
    assert (torch.ops.aten.where.self, (30, 30)) in stored, stored
    assert len(stored) > len(_forced(plain))
    for a, e in zip(gm(*args), grad(*args)):
        assert torch.equal(a, e)


@pytest.mark.parametrize("kernel", [_pairwise_kernel, _matern_pairs])
def test_compile_fn_stores_the_broadcast_value_and_matches_eager(float64, monkeypatch, kernel):
    from torch._inductor.utils import fresh_cache

    seen = []
    realize = RealizeBroadcastOperands.__call__

    def spy(self, graph):
        realize(self, graph)
        seen.append(len(_forced(torch.fx.GraphModule({}, graph))))

    monkeypatch.setattr(RealizeBroadcastOperands, "__call__", spy)
    grad = torch.func.grad(kernel, argnums=(0, 2))
    args = _pairwise_inputs()
    with fresh_cache():
        actual = compile_fn(grad)(*args)
    expected = grad(*args)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert seen and max(seen) >= 1, seen


def _squared_distances(X, keepdim=False):
    return (X.unsqueeze(-2) - X.unsqueeze(-3)).pow(2).sum(-1, keepdim=keepdim)


def _short_sums(gm) -> list:
    """(input shape, dims) of each sum over dimensions in ``gm``."""
    return [
        (tuple(n.args[0].meta["val"].shape), list(n.args[1]))
        for n in gm.graph.nodes
        if n.target is torch.ops.aten.sum.dim_IntList
    ]


@pytest.mark.parametrize("keepdim", [False, True])
def test_a_pairwise_sum_over_a_short_last_dimension_runs_in_the_outer_loop(keepdim):
    X = torch.randn(4, 30, 10, generator=torch.Generator().manual_seed(0), dtype=F64)
    gm = make_fx(_squared_distances, tracing_mode="fake")(X, keepdim)
    assert _short_sums(gm) == [((4, 30, 30, 10), [-1])]
    _run_pass(OuterShortReduction(), gm)
    # the 10 dimensions lead: the sum runs over them, the vector along the 30 x 30 pairs
    assert _short_sums(gm) == [((10, 4, 30, 30), [0])]
    assert not any(
        n.target is torch.ops.aten.pow.Tensor_Scalar and not n.users for n in gm.graph.nodes
    )
    actual, expected = gm(X, keepdim), _squared_distances(X, keepdim)
    assert actual.shape == expected.shape == ((4, 30, 30, 1) if keepdim else (4, 30, 30))
    torch.testing.assert_close(actual, expected, rtol=1e-14, atol=1e-14)


def _distance_gradients(X, G):
    """The sums of a pairwise kernel's gradient with respect to its inputs: over one point
    of each pair, of the pair's weight (broadcast over the dimensions) times the
    difference, with and without kept dimensions."""
    difference = X.unsqueeze(-2) - X.unsqueeze(-3)  # (4, 30, 30, 10)
    weight = G.unsqueeze(-1).expand(*G.shape, X.shape[-1])
    return (
        (weight * 2 * difference).sum(2),
        (-(weight * difference)).sum(1),
        (weight * difference).sum(1, keepdim=True),
        (weight * difference).sum(-3),
    )


def test_pairwise_sums_over_points_keep_a_short_last_dimension_out_of_the_vector():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(4, 30, 10, generator=g, dtype=F64)
    G = torch.randn(4, 30, 30, generator=g, dtype=F64)
    gm = make_fx(_distance_gradients, tracing_mode="fake")(X, G)
    assert _short_sums(gm) == [((4, 30, 30, 10), [d]) for d in (2, 1, 1, -3)]
    _run_pass(OuterShortReduction(), gm)
    # the 10 dimensions lead, the summed points come next to last, the vector runs along
    # the other point of each pair (not along the 10 dimensions, which left a scalar tail)
    assert _short_sums(gm) == [((10, 4, 30, 30), [2])] * 4
    assert not any(n.target is torch.ops.aten.expand.default and n.users for n in gm.graph.nodes)
    for actual, expected in zip(gm(X, G), _distance_gradients(X, G)):
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize(
    "fn,shape",
    [
        # every operand stretched by expand along a dimension: without the expand the
        # expression would lose that dimension, so the sum is left as it is
        (lambda x: (x.expand(4, 30, 30, 10) * 2).sum(1), (4, 30, 1, 10)),
        (lambda w: w.unsqueeze(-1).expand(4, 30, 30, 10).exp().sum(-1), (4, 30, 30)),
    ],
)
def test_sums_of_operands_all_stretched_by_expand_are_left_alone_and_right(fn, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    gm = make_fx(fn, tracing_mode="fake")(x)
    before = _short_sums(gm)
    _run_pass(OuterShortReduction(), gm)
    assert _short_sums(gm) == before
    torch.testing.assert_close(gm(x), fn(x), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize(
    "fn,shape",
    [
        (lambda X: _squared_distances(X), (4, 30, 32)),  # a long last dimension: vectors fit it
        (lambda X: _squared_distances(X), (4, 6, 10)),  # 6 x 6 results a chain: too few
        (lambda X: X.pow(2).sum(-1), (4, 30, 10)),  # not broadcast: a copy costs the sum
    ],
)
def test_sums_that_gain_nothing_in_the_outer_loop_are_left_alone(fn, shape):
    gm = make_fx(fn, tracing_mode="fake")(torch.randn(shape, dtype=F64))
    before = _short_sums(gm)
    _run_pass(OuterShortReduction(), gm)
    assert _short_sums(gm) == before


def test_compiled_matern_gradient_sums_pairs_in_the_outer_loop_and_matches_eager(
    float64, monkeypatch
):
    from torch._inductor.utils import fresh_cache

    rewritten = []
    rewrite = OuterShortReduction._rewrite

    def spy(self, graph, node, order):
        rewrite(self, graph, node, order)
        rewritten.append(node.graph is None or node not in graph.nodes)

    monkeypatch.setattr(OuterShortReduction, "_rewrite", spy)
    X = torch.rand(4, 30, 10, generator=torch.Generator().manual_seed(1), dtype=F64)
    tausq, inv_length_sq = torch.tensor(0.7), torch.full((10,), 1.3)
    value_and_grad = torch.func.grad_and_value(lambda X: _matern_pairs(X, tausq, inv_length_sq))
    with fresh_cache():
        grad, value = compile_fn(value_and_grad)(X)
    ref_grad, ref_value = value_and_grad(X)
    torch.testing.assert_close(value, ref_value, rtol=1e-13, atol=0.0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert sum(rewritten) >= 3, rewritten  # the distances and their gradient's two sums


@pytest.mark.parametrize(
    "a_shape,b_shape,rewritten",
    [
        ((4, 1, 100), (4, 100, 100), True),  # a dense metric's velocity, 4 chains
        ((4, 1, 100), (4, 100, 70), True),
        ((4, 2, 100), (4, 100, 100), False),  # two rows: Inductor calls BLAS already
        ((4, 1, 10), (4, 10, 100), False),  # short rows: Inductor's loop is fine
    ],
)
def test_row_times_matrix_products_go_to_blas(a_shape, b_shape, rewritten):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, generator=g, dtype=F64)
    b = torch.randn(b_shape, generator=g, dtype=F64)
    gm = make_fx(torch.bmm, tracing_mode="fake")(a, b)
    _run_pass(RowTimesMatrixAsLibraryCall(), gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert (torch.ops.aten.baddbmm.default in targets) == rewritten
    assert (torch.ops.aten.bmm.default in targets) == (not rewritten)
    torch.testing.assert_close(gm(a, b), torch.bmm(a, b), rtol=1e-12, atol=1e-12)


def test_compiled_dense_velocity_goes_to_blas_and_equals_eager(float64, monkeypatch):
    from torch._inductor.utils import fresh_cache

    from probtorch.inference.mcmc.integrator import velocity

    seen = []
    rewrite = RowTimesMatrixAsLibraryCall.__call__

    def spy(self, graph):
        rewrite(self, graph)
        seen.extend(n.target for n in graph.nodes if n.op == "call_function")

    monkeypatch.setattr(RowTimesMatrixAsLibraryCall, "__call__", spy)
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 100, 100, generator=g, dtype=F64)
    inverse_mass = a @ a.transpose(-1, -2) / 100 + torch.eye(100, dtype=F64)
    r = torch.randn(4, 100, generator=g, dtype=F64)
    with fresh_cache():
        actual = compile_fn(velocity)(inverse_mass, r)
    torch.testing.assert_close(actual, velocity(inverse_mass, r), rtol=1e-12, atol=1e-12)
    assert torch.ops.aten.baddbmm.default in seen and torch.ops.aten.bmm.default not in seen


INDEX_PUT = torch.ops.aten.index_put.default


def _sorted_groups(n, groups, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, groups, (n,), generator=g).sort().values


@pytest.mark.parametrize(
    "out_shape,k,n,zeros,accumulate,rewritten",
    [
        ((4, 85), 1, 919, True, True, True),  # a hierarchical gradient, 4 chains
        ((85,), 0, 919, True, True, True),
        ((85, 3), 0, 400, True, True, True),  # trailing dimensions
        ((85,), 0, 100, True, True, False),  # fewer than two sources per target
        ((10,), 0, 40, True, True, False),  # too few sources to matter
        ((85,), 0, 919, False, True, False),  # added into a tensor that may not be zero
        ((85,), 0, 919, True, False, False),  # written, not added
    ],
)
def test_scatter_adds_into_zeros_go_to_interleaved_rows(
    out_shape, k, n, zeros, accumulate, rewritten
):
    def scatter(base, values, index):
        start = torch.zeros_like(base) if zeros else base
        return INDEX_PUT(start, [None] * k + [index], values, accumulate)

    g = torch.Generator().manual_seed(1)
    base = torch.randn(out_shape, generator=g, dtype=F64)
    values = torch.randn((*out_shape[:k], n, *out_shape[k + 1 :]), generator=g, dtype=F64)
    index = _sorted_groups(n, out_shape[k])
    gm = make_fx(scatter, tracing_mode="fake")(base, values, index)
    _run_pass(InterleavedScatterAdd(), gm)
    puts = [node.args[0].meta["val"].shape for node in gm.graph.nodes if node.target is INDEX_PUT]
    parts = InterleavedScatterAdd.parts
    expected = (*out_shape[:k], parts, *out_shape[k:]) if rewritten else out_shape
    assert puts == [torch.Size(expected)]
    # the same sums in another order: equal up to rounding
    torch.testing.assert_close(
        gm(base, values, index), scatter(base, values, index), rtol=1e-13, atol=1e-13
    )


def test_compiled_hierarchical_gradient_adds_in_rows_and_equals_eager(float64, monkeypatch):
    """The gradient of ``a[group]`` under the chain vmap reaches Inductor as a scatter-add
    into zeros; compiled with probtorch's options it is interleaved and equals eager."""
    from torch._inductor.utils import fresh_cache

    group = _sorted_groups(919, 85)
    y = torch.randn(919, generator=torch.Generator().manual_seed(2), dtype=F64)

    def nll(a):
        return 0.5 * (y - a[group]).pow(2).sum()

    rewritten = []
    rewrite = InterleavedScatterAdd._rewrite.__func__

    def spy(cls, graph, node):
        before = len(graph.nodes)
        rewrite(cls, graph, node)
        rewritten.append(len(graph.nodes) != before)

    monkeypatch.setattr(InterleavedScatterAdd, "_rewrite", classmethod(spy))
    batched = torch.func.vmap(torch.func.grad(nll))
    a = torch.randn(4, 85, generator=torch.Generator().manual_seed(3), dtype=F64)
    with fresh_cache():
        actual = compile_fn(batched)(a)
    torch.testing.assert_close(actual, batched(a), rtol=1e-12, atol=1e-12)
    assert rewritten == [True]
