"""Graph rewrites that Inductor runs on probtorch's compiled kernels (after autograd).

:class:`ProbtorchPasses` runs the passes below; every probtorch compile uses it
(:func:`~probtorch.inference.compile.inductor_base_options`).

:class:`BatchedTriangularSolve`. A potential is evaluated for all chains at once with
``torch.func.vmap``. A triangular solve whose matrix is shared by the chains (for example a
``MultivariateNormal`` with a fixed ``scale_tril``, through ``torch.linalg.solve_triangular``
in its ``log_prob``) then reaches Inductor as a solve of a ``(1, n, n)`` matrix against
``(C, n, k)`` right-hand sides. torch broadcasts the matrix: it copies it once per chain and
solves each chain separately. The pass solves once, the chains being columns of one
right-hand side: ``A X = B`` for ``B`` of shape ``(C, n, k)`` is ``A [X_1 ... X_C] = [B_1 ...
B_C]``. Same arithmetic per column (LAPACK/BLAS ``trsm`` solves columns independently), no
copies. On the 100-dimensional Gaussian benchmark (4 chains) it took the potential's value and
gradient from 91 to 59 us per call (the compiled graph itself: 20 us).

Example::

    >>> import torch
    >>> from probtorch.inference.compile import compile_fn
    >>> def gaussian_nll(L):  # one chain's negative log density, up to a constant
    ...     def nll(x):
    ...         y = torch.linalg.solve_triangular(L, x.unsqueeze(-1), upper=False)
    ...         return 0.5 * y.pow(2).sum()
    ...     return nll
    >>> nll = gaussian_nll(torch.linalg.cholesky(torch.eye(3) + 0.5))
    >>> batched = torch.func.vmap(torch.func.grad(nll))
    >>> x = torch.randn(4, 3)
    >>> torch.allclose(compile_fn(batched)(x), batched(x))
    True
"""

from __future__ import annotations

import math

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

__all__ = [
    "BatchedTriangularSolve",
    "InterleavedScatterAdd",
    "NarrowMatmul",
    "OuterShortReduction",
    "ProbtorchPasses",
    "RealizeBroadcastOperands",
    "RowTimesMatrixAsLibraryCall",
]

_aten = torch.ops.aten


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


class _OpRewrite(CustomGraphPass):
    """Offers every node that calls ``target`` on two tensors (with known values) to
    ``_rewrite(graph, node, a, b)``."""

    target = None

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is self.target:
                a, b, out = (_val(x) for x in (*node.args[:2], node))
                if all(isinstance(t, torch.Tensor) for t in (a, b, out)):
                    self._rewrite(graph, node, a, b)

    @staticmethod
    def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, a, b) -> None:
        raise NotImplementedError


def _reads_layout(node: torch.fx.Node) -> bool:
    """Whether a consumer reads ``node``'s memory layout directly (keep the original op)."""
    return any(user.target is _aten.as_strided.default for user in node.users)


def _emitter(graph: torch.fx.Graph, fake_mode):
    """``emit(op, *args, **kwargs)``: a new node before the insertion point, with its value."""

    def emit(op, *args, **kwargs):
        values = [_val(x) if isinstance(x, torch.fx.Node) else x for x in args]
        new = graph.call_function(op, tuple(args), kwargs)
        with fake_mode:
            new.meta["val"] = op(*values, **kwargs)
        return new

    return emit


class BatchedTriangularSolve(_OpRewrite):
    """Solve a triangular system shared across a batch once, the batch as extra columns."""

    target = _aten.linalg_solve_triangular.default

    def uuid(self) -> str:
        return "probtorch.BatchedTriangularSolve.v1"

    @staticmethod
    def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, a, b) -> None:
        a_node, b_node = node.args[:2]
        out = _val(node)
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        if math.prod(batch_a) != 1 or math.prod(batch_b) <= 1:
            return
        fake_mode = torch._guards.detect_fake_mode([a, b])
        if _reads_layout(node) or fake_mode is None:
            return
        upper = node.kwargs["upper"]  # keyword-only in the op's schema, as are the others
        left = node.kwargs.get("left", True)
        unitriangular = node.kwargs.get("unitriangular", False)
        n = a.shape[-1]
        nb = len(batch_b)
        emit = _emitter(graph, fake_mode)

        with graph.inserting_before(node):
            matrix = emit(_aten.view.default, a_node, [n, n])
            if left:  # B: (*batch, n, k) -> (n, batch * k)
                k = b.shape[-1]
                columns = emit(_aten.permute.default, b_node, [nb, *range(nb), nb + 1])
                rhs = emit(_aten.reshape.default, columns, [n, math.prod(batch_b) * k])
            else:  # B: (*batch, k, n) -> (batch * k, n)
                rhs = emit(_aten.reshape.default, b_node, [-1, n])
            solved = emit(
                _aten.linalg_solve_triangular.default,
                matrix,
                rhs,
                upper=upper,
                left=left,
                unitriangular=unitriangular,
            )
            if left:
                split = emit(_aten.reshape.default, solved, [n, *batch_b, k])
                result = emit(_aten.permute.default, split, [*range(1, nb + 1), 0, nb + 1])
                result = emit(_aten.reshape.default, result, list(out.shape))
            else:
                result = emit(_aten.reshape.default, solved, list(out.shape))
        node.replace_all_uses_with(result)
        graph.erase_node(node)


class NarrowMatmul(_OpRewrite):
    """Compute a CPU matrix product with few columns, ``A @ B`` for ``B`` of 2 to 8 columns
    (16 in float64), as ``(Bᵀ Aᵀ)ᵀ``: same products and sums, other loop order.

    A model's ``X @ beta`` under the chain ``vmap`` becomes ``X @ B`` with one column per
    chain, and its gradient ``Xᵀ G``; MKL computes these narrow products 2-5x slower than the
    same products transposed (float32, one core: 5000 x 25 data and 4 chains, 81 against
    24 us; 1000 x 100, 70 against 17 us). The transposes are views (BLAS reads them with a
    transpose flag) and the result is the transposed view of a contiguous product. Small
    products (fewer than 16384 elements in ``A``) are left alone: there the extra call
    setup costs more than it saves.
    """

    target = _aten.mm.default

    def uuid(self) -> str:
        return "probtorch.NarrowMatmul.v1"

    @staticmethod
    def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, a, b) -> None:
        a_node, b_node = node.args[:2]
        if a.device.type != "cpu" or not all(isinstance(d, int) for d in (*a.shape, *b.shape)):
            return
        (m, k), n = a.shape, b.shape[1]
        widest = 8 if a.dtype == torch.float32 else 16
        if not (2 <= n <= widest and m * k >= 16384 and m > n):
            return
        fake_mode = torch._guards.detect_fake_mode([a, b])
        if _reads_layout(node) or fake_mode is None:
            return
        emit = _emitter(graph, fake_mode)
        with graph.inserting_before(node):
            bt = emit(_aten.permute.default, b_node, [1, 0])
            at = emit(_aten.permute.default, a_node, [1, 0])
            product = emit(_aten.mm.default, bt, at)
            result = emit(_aten.permute.default, product, [1, 0])
        node.replace_all_uses_with(result)
        graph.erase_node(node)


_VIEWS = frozenset(
    (
        _aten.unsqueeze.default, _aten.squeeze.dim, _aten.squeeze.dims, _aten.view.default,
        _aten.reshape.default, _aten._unsafe_view.default, _aten.expand.default,
        _aten.permute.default, _aten.transpose.int, _aten.slice.Tensor, _aten.select.int,
    )
)  # fmt: skip
_COSTLY = frozenset(
    (
        _aten.div.Tensor, _aten.div.Scalar, _aten.reciprocal.default, _aten.sqrt.default,
        _aten.rsqrt.default, _aten.pow.Tensor_Scalar, _aten.pow.Tensor_Tensor,
        _aten.exp.default, _aten.log.default, _aten.log1p.default, _aten.expm1.default,
        _aten.tanh.default, _aten.sigmoid.default, _aten.erf.default,
    )
)  # fmt: skip


def _unexpanded(node: torch.fx.Node) -> torch.fx.Node:
    """The input of an ``expand`` that only stretches dimensions of size 1 (a broadcast
    operand, which elementwise ops broadcast again), else ``node``."""
    if node.op == "call_function" and node.target is _aten.expand.default:
        source = node.args[0]
        if isinstance(source, torch.fx.Node) and isinstance(_val(source), torch.Tensor):
            if _val(source).dim() == _val(node).dim():
                return source
    return node


def _is_pointwise(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and torch.Tag.pointwise in getattr(node.target, "tags", ())


class RealizeBroadcastOperands(CustomGraphPass):
    """Compute once a costly elementwise result that the graph broadcasts to many times its
    size, instead of again for every element it is broadcast to.

    Inductor inlines an elementwise producer into its consumers unless it is read by many
    nodes or (on CPU) calls ``exp``, ``log``, ``tanh`` or ``sigmoid``; broadcasting does not
    count. A kernel's inputs scaled by lengthscales, ``X / (tausq * inv_length_sq).rsqrt()``
    (the SAAS GP), and then compared pairwise were so recomputed for each of the 30 x 30
    pairs: a reciprocal square root and two divisions per pair and dimension, a third of the
    SAAS NUTS step. This pass routes the broadcast uses of such a result (a division, root,
    power or transcendental function of at least ``min_numel`` elements, broadcast to at
    least ``min_factor`` times its size) through ``inductor_force_stride_order``, which
    makes Inductor store it once; same arithmetic, same results.

    A cheap elementwise result over such a costly one counts as costly too (Inductor inlines
    both): the backward of ``sq.clamp_min(eps).sqrt()`` in a Matérn kernel ends in a
    ``where`` over a square root and a division per pair, which Inductor computed again for
    each of the 10 dimensions the pair's difference gradient is broadcast to (and once more
    per element of the loop's scalar tail). Stored once, that kernel of the SAAS GP's
    gradient took 47 instead of 193 us per call (4 chains, one core), and its NUTS sampling
    phase on the split path 3.28 instead of 3.69 s (medians of five alternating runs).
    """

    min_numel = 32
    min_factor = 8
    inline_depth = 8

    def uuid(self) -> str:
        return f"probtorch.RealizeBroadcastOperands.v2-{self.inline_depth}"

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.inductor_prims import force_stride_order as force

        for node in list(graph.nodes):
            val = _val(node)
            if not (
                node.op == "call_function"
                and self._costly(node)
                and isinstance(val, torch.Tensor)
                and val.device.type == "cpu"
                and val.numel() >= self.min_numel
            ):
                continue
            uses = self._broadcast_uses(node, val.numel())
            if not uses:
                continue
            with graph.inserting_after(node):
                stored = graph.call_function(force, (node, list(val.stride())))
            stored.meta["val"] = val
            for user in uses:
                user.replace_input_with(node, stored)

    def _costly(self, node: torch.fx.Node) -> bool:
        """Whether ``node`` is costly or an elementwise expression over a costly one that
        Inductor would inline with it (within ``inline_depth`` elementwise steps)."""
        if not _is_pointwise(node):
            return False
        frontier, seen = [(node, 0)], set()
        while frontier:
            n, depth = frontier.pop()
            if n.target in _COSTLY:
                return True
            if depth == self.inline_depth:
                continue
            for arg in n.all_input_nodes:
                if arg not in seen and arg.op == "call_function" and _is_pointwise(arg):
                    seen.add(arg)
                    frontier.append((arg, depth + 1))
        return False

    def _broadcast_uses(self, node: torch.fx.Node, numel: int) -> list:
        """The direct users of ``node`` through which it reaches (via views) an elementwise
        consumer at least ``min_factor`` times its size."""
        uses = []
        for user in node.users:
            frontier, amplified = [user], False
            while frontier and not amplified:
                n = frontier.pop()
                if n.op == "call_function" and n.target in _VIEWS:
                    frontier.extend(n.users)
                elif _is_pointwise(n) and isinstance(_val(n), torch.Tensor):
                    amplified = _val(n).numel() >= self.min_factor * numel
            if amplified:
                uses.append(user)
        return uses


class OuterShortReduction(CustomGraphPass):
    """Sum an elementwise expression of broadcast operands over a short last dimension in
    the outer loop, so that Inductor vectorizes across the results instead of along the
    short dimension.

    ``(Xs[..., :, None, :] - Xs[..., None, :, :]).pow(2).sum(-1)`` (squared distances of all
    pairs of points, the start of any stationary kernel, e.g. the SAAS GP's Matérn) over a
    last dimension of 10: Inductor's loop runs one vector of 8 and a tail of 2 per pair,
    then adds the vector's lanes, for each of the 30 x 30 pairs. Here the operands are
    first copied with the short dimension moved to the front (each is a fraction of the
    expression's size), the expression is computed on them, and the sum runs over the
    front dimension: the loop over the dimensions is outside, and the vector runs along the
    pairs. Same products, summed in another order (so rounding may differ in the last
    bits). Applies on CPU to a sum over the last dimension, of 2 to ``max_size``
    elements, of an elementwise expression whose operands have as many dimensions and are
    each at most ``1 / min_factor`` of its size, with at least ``min_results`` results and
    a last result dimension of at least 8. In the SAAS GP's gradient (4 chains, 30 points,
    10 dimensions, one core) the kernel holding the distances went from 115-135 to 37 us
    per call.

    The gradient of those distances with respect to the points sums over the other point
    of each pair, ``(w[..., :, :, None] * (X_i - X_j)).sum(-2)``: a sum over a dimension
    that is not the last one, whose short last dimension Inductor vectorized (one vector of
    8 of the 10 dimensions and a scalar tail, per pair). Such a sum gets the same treatment,
    with the summed dimension kept next to last so that the vector runs along the last
    remaining one (the 30 points); an operand broadcast by ``expand`` (the pair weights
    over the dimensions) is moved before it is expanded. SAAS GP NUTS sampling, 4 chains,
    one core: 6,640 -> 6,920 leapfrog steps per second (+4 %, 2-4 runs each).

    Example::

        >>> import torch
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> def squared_distances(X):
        ...     return (X.unsqueeze(-2) - X.unsqueeze(-3)).pow(2).sum(-1)
        >>> X = torch.randn(4, 30, 10, dtype=torch.float64)
        >>> gm = make_fx(squared_distances, tracing_mode="fake")(X)
        >>> OuterShortReduction()(gm.graph)
        >>> _ = gm.recompile()
        >>> [n.args[1] for n in gm.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
        [[0]]
        >>> torch.allclose(gm(X), squared_distances(X))
        True
    """

    max_size = 16
    min_results = 64
    min_factor = 4
    max_nodes = 8

    def uuid(self) -> str:
        return "probtorch.OuterShortReduction.v2"

    def __call__(self, graph: torch.fx.Graph) -> None:
        order = {node: i for i, node in enumerate(graph.nodes)}
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is _aten.sum.dim_IntList:
                self._rewrite(graph, node, order)

    def _rewrite(self, graph: torch.fx.Graph, node: torch.fx.Node, order_of: dict) -> None:
        source, out = node.args[0], _val(node)
        val = _val(source)
        if not (
            isinstance(val, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and val.device.type == "cpu"
            and val.dtype.is_floating_point
            and val.dim() >= 3
            and all(isinstance(size, int) for size in val.shape)
            and _is_pointwise(source)
            and "dtype" not in node.kwargs
        ):
            return
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        nd, size = val.dim(), val.shape[-1]
        if dims is None or len(dims) != 1 or not 2 <= size <= self.max_size:
            return
        summed = dims[0] % nd
        if summed == nd - 1:  # the short dimension itself: summed in the outer loop
            order, vector_dim = [nd - 1, *range(nd - 1)], nd - 2
        else:  # another one: kept before the vectorized (last remaining) dimension
            others = [k for k in range(nd - 1) if k != summed]
            if not others:
                return
            order, vector_dim = [nd - 1, *others[:-1], summed, others[-1]], others[-1]
        if val.shape[vector_dim] < 8 or val.numel() // val.shape[summed] < self.min_results:
            return
        expression, leaves = self._expression(source, val.shape)
        if expression is None:
            return
        operands = {leaf: _unexpanded(leaf) for leaf in leaves}
        for operand in operands.values():
            operand_val = _val(operand)
            if not (
                isinstance(operand_val, torch.Tensor)
                and operand_val.dim() == nd
                and operand_val.numel() * self.min_factor <= val.numel()
            ):
                return
        # unexpanded operands must still make the expression's shape (where every operand
        # was stretched along a dimension, the expanded one stays: then it is too large)
        if torch.broadcast_shapes(*(_val(o).shape for o in operands.values())) != val.shape:
            return
        fake_mode = torch._guards.detect_fake_mode([val])
        if fake_mode is None:
            return
        from torch._inductor.inductor_prims import force_stride_order
        from torch._prims_common import make_contiguous_strides_for

        emit = _emitter(graph, fake_mode)
        kept = order if keepdim else [k for k in order if k != summed]
        back = [kept.index(k) for k in range(nd) if keepdim or k != summed]
        with graph.inserting_before(node):
            moved = {}
            for leaf, operand in operands.items():
                view = emit(_aten.permute.default, operand, order)
                strides = make_contiguous_strides_for(_val(view).shape)
                moved[leaf] = emit(force_stride_order, view, list(strides))
            for part in sorted(expression, key=order_of.__getitem__):
                args = torch.fx.map_arg(part.args, lambda x: moved[x])
                kwargs = torch.fx.map_arg(part.kwargs, lambda x: moved[x])
                moved[part] = emit(part.target, *args, **kwargs)
            result = emit(_aten.sum.dim_IntList, moved[source], [order.index(summed)], keepdim)
            if back != list(range(len(back))):
                result = emit(_aten.permute.default, result, back)
        node.replace_all_uses_with(result)
        graph.erase_node(node)
        for part in sorted(expression, key=order_of.__getitem__, reverse=True):
            if not part.users:  # the expression was the sum's alone
                graph.erase_node(part)

    def _expression(self, source: torch.fx.Node, shape) -> tuple:
        """The elementwise nodes of ``source``'s expression (of its full shape) and its
        operands, or ``(None, None)`` where it is larger than ``max_nodes``."""
        expression, leaves, frontier = {source}, set(), [source]
        while frontier:
            for arg in frontier.pop().all_input_nodes:
                if arg in expression or arg in leaves:
                    continue
                arg_val = _val(arg)
                if (
                    _is_pointwise(arg)
                    and isinstance(arg_val, torch.Tensor)
                    and arg_val.shape == shape
                ):
                    expression.add(arg)
                    frontier.append(arg)
                    if len(expression) > self.max_nodes:
                        return None, None
                else:
                    leaves.add(arg)
        return expression, leaves


class RowTimesMatrixAsLibraryCall(_OpRewrite):
    """Compute a CPU batched row-times-matrix product ``(B, 1, K) @ (B, K, N)`` with ``K``
    and ``N`` of at least ``min_size`` by BLAS, as ``baddbmm`` with ``beta=0``.

    Inductor lowers every CPU ``bmm`` with one row to its own multiply-and-sum loop. For a
    dense metric's velocity ``M^{-1} r`` (4 chains, D = 100, float64) that loop took 15 us
    where ``torch.bmm`` takes 9.5 us; Inductor keeps ``baddbmm`` as a library call. The same
    products, summed by BLAS; ``beta=0`` ignores the (zero) input.
    """

    target = _aten.bmm.default
    min_size = 64

    def uuid(self) -> str:
        return "probtorch.RowTimesMatrixAsLibraryCall.v1"

    @classmethod
    def _rewrite(cls, graph: torch.fx.Graph, node: torch.fx.Node, a, b) -> None:
        a_node, b_node = node.args[:2]
        if a.device.type != "cpu" or not all(isinstance(d, int) for d in (*a.shape, *b.shape)):
            return
        (_, m, k), n = a.shape, b.shape[2]
        if not (m == 1 and k >= cls.min_size and n >= cls.min_size):
            return
        fake_mode = torch._guards.detect_fake_mode([a, b])
        if _reads_layout(node) or fake_mode is None:
            return
        emit = _emitter(graph, fake_mode)
        out = _val(node)
        with graph.inserting_before(node):
            zero = emit(_aten.full.default, [1, 1, 1], 0.0, dtype=out.dtype, device=out.device)
            product = emit(_aten.baddbmm.default, zero, a_node, b_node, beta=0)
        node.replace_all_uses_with(product)
        graph.erase_node(node)


class InterleavedScatterAdd(CustomGraphPass):
    """Sum a scatter-add into zeros with many more sources than targets in ``parts``
    interleaved partial sums: ``zeros(G).index_put_([idx], v, accumulate=True)`` as
    ``zeros(parts, G).index_put_([arange(N) % parts, idx], v, accumulate=True).sum(0)``.

    The gradient of a gather ``a[group]`` is such a scatter-add. Inductor's CPU code adds
    the sources one after another, ``out[idx[i]] += v[i]``; where consecutive sources
    share a target (data sorted by group, as a hierarchical model's usually is) every add
    waits for the previous one's store, about ten cycles per source. With the sources
    spread over ``parts`` rows, consecutive adds go to different rows and overlap. Same
    terms, summed in another order (each row's sum, then the rows'). Hierarchical
    regression (919 observations in 85 groups, 4 chains, float64): the scatter-add's line
    took 12.3 % of its NUTS kernel's time before and 4.7 % after (perf).
    """

    parts = 4
    min_sources = 64

    def uuid(self) -> str:
        return f"probtorch.InterleavedScatterAdd.v1.{self.parts}"

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is _aten.index_put.default:
                self._rewrite(graph, node)

    @classmethod
    def _rewrite(cls, graph: torch.fx.Graph, node: torch.fx.Node) -> None:
        base, indices, values = node.args[:3]
        accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate")
        out, src = _val(node), _val(values)
        if not (accumulate and isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor)):
            return
        if not (_is_zeros(base) and out.device.type == "cpu" and out.dtype.is_floating_point):
            return
        # one index tensor, after leading full slices (None): out[:, ..., idx[n]] += v[..., n]
        k = len(indices) - 1
        if k < 0 or any(i is not None for i in indices[:k]) or indices[k] is None:
            return
        idx = _val(indices[k])
        integer = (torch.int64, torch.int32)
        if not (isinstance(idx, torch.Tensor) and idx.dim() == 1 and idx.dtype in integer):
            return
        n, g = idx.shape[0], out.shape[k]
        if not (isinstance(n, int) and n >= max(cls.min_sources, 2 * g)):
            return
        if tuple(src.shape) != (*out.shape[:k], n, *out.shape[k + 1 :]):
            return
        fake_mode = torch._guards.detect_fake_mode([out, src, idx])
        if fake_mode is None or _reads_layout(node):
            return
        emit = _emitter(graph, fake_mode)
        shape = [*out.shape[:k], cls.parts, *out.shape[k:]]
        with graph.inserting_before(node):
            zeros = emit(_aten.full.default, shape, 0.0, dtype=out.dtype, device=out.device)
            sources = emit(
                torch.ops.prims.iota.default,
                n,
                start=0,
                step=1,
                dtype=idx.dtype,
                device=idx.device,
                requires_grad=False,
            )
            lane = emit(_aten.remainder.Scalar, sources, cls.parts)
            spread = graph.call_function(
                _aten.index_put.default, (zeros, [*indices[:k], lane, indices[k]], values, True)
            )
            with fake_mode:
                spread.meta["val"] = _aten.index_put.default(
                    _val(zeros), [None] * k + [_val(lane), idx], src, True
                )
            result = emit(_aten.sum.dim_IntList, spread, [k])
        node.replace_all_uses_with(result)
        graph.erase_node(node)


def _is_zeros(node) -> bool:
    """Whether ``node`` makes a tensor of zeros."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return False
    if node.target in (_aten.zeros.default, _aten.new_zeros.default, _aten.zeros_like.default):
        return True
    if node.target in (_aten.full.default, _aten.new_full.default, _aten.full_like.default):
        fill = node.args[1] if len(node.args) > 1 else node.kwargs.get("fill_value")
        return isinstance(fill, (int, float)) and fill == 0
    return False


class ProbtorchPasses(CustomGraphPass):
    """:class:`BatchedTriangularSolve`, :class:`NarrowMatmul`,
    :class:`RowTimesMatrixAsLibraryCall`, :class:`InterleavedScatterAdd`,
    :class:`OuterShortReduction`, then :class:`RealizeBroadcastOperands`. Its cache key
    also names the C++ that :mod:`.kernel_source` adds to the kernels of the compiles it
    configures."""

    def __init__(self):
        self.passes = (
            BatchedTriangularSolve(),
            NarrowMatmul(),
            RowTimesMatrixAsLibraryCall(),
            InterleavedScatterAdd(),
            OuterShortReduction(),
            RealizeBroadcastOperands(),
        )

    def uuid(self) -> str:
        from .kernel_source import VERSION

        return "+".join([*(p.uuid() for p in self.passes), VERSION])

    def __call__(self, graph: torch.fx.Graph) -> None:
        for rewrite in self.passes:
            rewrite(graph)
