"""Build the split executor's sampler graphs before the first model needs them.

``NUTS(executor="auto")`` runs a model on the split path when the sampler graph for its
settings is kept on disk (:mod:`.sampler_cache`): only the model's gradient is then compiled
(6-15 s on one core for the benchmark models). Without it, the first model on a machine
takes the quick path (16-30 s of compile) while the graph is built in the background for
later models. Where every run starts on a fresh machine (a container, a cluster job) that
first model is every model; :func:`build_sampler_graphs` builds the graphs ahead, for
example in an image's build step with the caches inside the image::

    PROBTORCH_CACHE_DIR=/opt/cache/probtorch TORCHINDUCTOR_CACHE_DIR=/opt/cache/inductor \\
        python -m probtorch.inference.mcmc.prebuild --dtype float64 --jobs 4

(the same two variables set when the models run; Inductor's precompiled C++ header, which
a model's compile would defer (:mod:`probtorch.inference.precompiled_header`), is built too
and goes into ``TORCHINDUCTOR_CACHE_DIR``:
:func:`probtorch.inference.compile.keep_headers_with_cache`). One graph serves every model
whose sampler shares its settings: the dtype, a diagonal or dense metric, scalar code
(models of at most :data:`~.kernels.SCALAR_CODE_MAX_NUMEL` elements per chain) or vector
code, one chain or several, and the NUTS options ``max_tree_depth``,
``target_accept_prob``, ``max_delta_energy`` and ``chunk_size``. The kept entries also
depend on torch's version, probtorch's source and the CPU's vector instruction set, so they
are built on (or for) the machine that runs the models. CPU only, as the split path.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing import get_context

import torch

__all__ = ["SamplerSetting", "build_sampler_graphs", "sampler_settings"]

# latent dimensions of the stand-in model for each code class (kernels.codegen_options)
_CODE_DIMS = {"scalar": 3, "vector": 100}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass(frozen=True)
class SamplerSetting:
    """One sampler graph: what a model's run must share with it to use it."""

    dtype: str = "float64"
    dense_mass: bool = False
    code: str = "vector"
    num_chains: int = 4
    max_tree_depth: int = 10
    target_accept_prob: float = 0.8
    max_delta_energy: float = 1000.0
    chunk_size: int = 1

    def __post_init__(self):
        if self.dtype not in _DTYPES:
            raise ValueError(f"SamplerSetting: dtype {self.dtype!r} is not one of {list(_DTYPES)}")
        if self.code not in _CODE_DIMS:
            raise ValueError(f"SamplerSetting: code {self.code!r} is not one of {list(_CODE_DIMS)}")
        if self.num_chains < 1:
            raise ValueError(f"SamplerSetting: num_chains must be >= 1, got {self.num_chains}")


def sampler_settings(
    dtypes: Sequence[str] = ("float64",),
    dense_mass: Sequence[bool] = (False, True),
    code: Sequence[str] = ("scalar", "vector"),
    num_chains: Sequence[int] = (1, 4),
    **nuts_options,
) -> list[SamplerSetting]:
    """Every combination of the given choices (the NUTS options are shared by all), with
    one chain count kept of those above 1 (several chains share a graph).

    Example::

        >>> len(sampler_settings())  # diagonal/dense x scalar/vector x one/several chains
        8
        >>> sampler_settings(dense_mass=[False], code=["vector"], num_chains=[4, 8])
        [SamplerSetting(dtype='float64', dense_mass=False, code='vector', num_chains=4, max_tree_depth=10, target_accept_prob=0.8, max_delta_energy=1000.0, chunk_size=1)]
    """  # noqa: E501
    if not num_chains or any(c < 1 for c in num_chains):
        raise ValueError(
            f"sampler_settings: num_chains must be counts >= 1, got {list(num_chains)}"
        )
    several = [c for c in num_chains if c > 1]
    chains = ([1] if 1 in num_chains else []) + ([min(several)] if several else [])
    return [
        SamplerSetting(dtype=d, dense_mass=bool(m), code=k, num_chains=c, **nuts_options)
        for d, m, k, c in itertools.product(dtypes, dense_mass, code, chains)
    ]


def build_one(setting: SamplerSetting) -> tuple[SamplerSetting, float, str | None]:
    """Build (or find kept) the sampler graph of ``setting`` in this process: a short run of
    a standard normal on the split path. Returns the setting, the seconds it took and
    None, or the reason it was not kept."""
    import warnings

    import probtorch as pt
    import probtorch.distributions as dist

    from ..precompiled_header import building_headers
    from . import sampler_cache
    from .executor import SplitLoop
    from .kernels import NUTS
    from .mcmc import MCMC

    start = time.perf_counter()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(_DTYPES[setting.dtype])
    try:
        dims = _CODE_DIMS[setting.code]

        def standard_normal():
            pt.sample("x", dist.Normal(torch.zeros(dims), 1.0).to_event(1))

        options = asdict(setting)
        for key in ("dtype", "code", "num_chains"):
            del options[key]
        kernel = NUTS(standard_normal, executor="split", **options)
        mcmc = MCMC(kernel, num_warmup=10, num_samples=10, num_chains=setting.num_chains,
                    progress_bar=False, seed=0)  # fmt: skip
        # off any sampler's path: Inductor's precompiled header is built now if missing
        with warnings.catch_warnings(record=True) as caught, building_headers():
            warnings.simplefilter("always")
            mcmc.run()
        loop = kernel._block_loop
        failure = None
        if not isinstance(loop, SplitLoop) or loop._fallback is not None:
            failure = "; ".join(str(w.message).splitlines()[0] for w in caught) or "not compiled"
        elif not loop.kept_paths:
            failure = f"compiled but not kept in {sampler_cache.lean_cache_dir()}/sampler-graphs"
        return setting, time.perf_counter() - start, failure
    finally:
        torch.set_default_dtype(previous)


def _build_one_in_worker(setting: SamplerSetting):
    torch.set_num_threads(1)
    return build_one(setting)


def build_sampler_graphs(
    settings: Sequence[SamplerSetting] | None = None,
    jobs: int = 1,
    report: Callable[[str], None] | None = print,
) -> list[tuple[SamplerSetting, float, str | None]]:
    """Build the sampler graphs of ``settings`` (default: :func:`sampler_settings`'s eight)
    into ``$PROBTORCH_CACHE_DIR`` (``~/.cache/probtorch``), ``jobs`` at a time (separate
    processes, one thread each); a graph already kept is found in a few seconds (the short
    run still compiles the stand-in model's gradient, from Inductor's cache). Returns, per
    setting, the seconds it took and None or why it could not be built (also reported).
    About 40 s per graph on one core.

    Example (the graphs for float32 models with a diagonal metric and several chains,
    scalar and vector code: about a minute on one core)::

        from probtorch.inference.mcmc.prebuild import build_sampler_graphs, sampler_settings

        settings = sampler_settings(["float32"], dense_mass=[False], num_chains=[4])
        for setting, seconds, failure in build_sampler_graphs(settings, jobs=2):
            assert failure is None, failure
    """
    settings = list(sampler_settings() if settings is None else settings)
    if jobs < 1:
        raise ValueError(f"build_sampler_graphs: jobs must be >= 1, got {jobs}")
    if jobs == 1 or len(settings) == 1:
        results = map(build_one, settings)
        pool = None
    else:
        pool = ProcessPoolExecutor(min(jobs, len(settings)), mp_context=get_context("spawn"))
        results = pool.map(_build_one_in_worker, settings)
    done = []
    try:
        for setting, seconds, failure in results:
            done.append((setting, seconds, failure))
            if report is not None:
                status = "kept" if failure is None else f"NOT BUILT: {failure}"
                report(f"{_describe(setting)}: {status} ({seconds:.1f} s)")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return done


def _describe(s: SamplerSetting) -> str:
    chains = "1 chain" if s.num_chains == 1 else "several chains"
    metric = "dense" if s.dense_mass else "diagonal"
    return (f"{s.dtype}, {metric} metric, {s.code} code, {chains}, max_tree_depth "
            f"{s.max_tree_depth}, target_accept_prob {s.target_accept_prob}")  # fmt: skip


def _yes_no(text: str) -> list[bool]:
    choices = {"yes": [True], "no": [False], "both": [False, True]}
    if text not in choices:
        raise argparse.ArgumentTypeError(f"expected one of {list(choices)}, got {text!r}")
    return choices[text]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m probtorch.inference.mcmc.prebuild``; the exit status is the number of
    graphs not built."""
    parser = argparse.ArgumentParser(
        prog="python -m probtorch.inference.mcmc.prebuild",
        description="Build the NUTS sampler graphs that executor='auto' loads, so that the "
        "first model on this machine compiles only its gradient.",
    )
    parser.add_argument("--dtype", nargs="+", choices=list(_DTYPES), default=["float64"])
    parser.add_argument("--dense-mass", type=_yes_no, default=[False, True],
                        help="yes, no or both (default)")  # fmt: skip
    parser.add_argument("--code", nargs="+", choices=list(_CODE_DIMS),
                        default=list(_CODE_DIMS),
                        help="scalar: models of at most 64 elements per chain")  # fmt: skip
    parser.add_argument("--num-chains", nargs="+", type=int, default=[1, 4],
                        help="1 and/or a count above 1 (one graph serves all)")  # fmt: skip
    parser.add_argument("--max-tree-depth", type=int, default=10)
    parser.add_argument("--target-accept-prob", type=float, default=0.8)
    parser.add_argument("--jobs", type=int, default=1, help="graphs built at once")
    args = parser.parse_args(argv)
    try:
        settings = sampler_settings(
            args.dtype, args.dense_mass, args.code, args.num_chains,
            max_tree_depth=args.max_tree_depth, target_accept_prob=args.target_accept_prob,
        )  # fmt: skip
    except ValueError as error:
        parser.error(str(error))
    cache = os.environ.get("PROBTORCH_CACHE_DIR", "~/.cache/probtorch")
    print(f"building {len(settings)} sampler graph(s) into {cache}", flush=True)
    results = build_sampler_graphs(settings, jobs=args.jobs, report=lambda s: print(s, flush=True))
    return sum(failure is not None for _, _, failure in results)


if __name__ == "__main__":
    sys.exit(main())
