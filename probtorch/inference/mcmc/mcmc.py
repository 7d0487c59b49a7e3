"""The ``MCMC`` driver: warmup, sampling, progress, interrupts, collection and export.

It only orchestrates. The kernel (``NUTS``/``HMC``) does the transitions; the
:class:`~.warmup.WarmupAdapter` adapts step size and mass matrix; diagnostics come from
ArviZ.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import operator

import torch

from ..._caller import warn_at_caller
from ..._errors import explaining_rng_key
from ...params import active_store, fitted_scope, param_scope, store_chosen
from ..compile import inference_threads
from .adaptation import warmup_windows
from .diagnostics import ess_and_rhat, summary_table, to_inference_data
from .kernels import STAT_NAMES, SamplerState, empty_stats
from .ported_options import refuse_ported_options
from .warmup import init_adapt_state, run_warmup

__all__ = ["MCMC"]


class _Required:
    """The default of an argument that must be given (so that a missing one, or Pyro's
    spelling of it, gets an error that says what to write)."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED = _Required()
_DRIVER_OPTIONS = (
    "num_warmup",
    "num_samples",
    "num_chains",
    "thinning",
    "chain_method",
    "progress_bar",
    "seed",
)


def _check_driver_options(num_warmup, num_samples, options: dict) -> None:
    """A TypeError naming what to write for another library's option, an unknown option or
    a missing ``num_warmup`` / ``num_samples``."""
    refuse_ported_options("MCMC", options)
    for name in options:
        close = difflib.get_close_matches(name, _DRIVER_OPTIONS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise TypeError(
            f"MCMC got an unexpected option {name!r}{hint} Its options: "
            f"{', '.join(_DRIVER_OPTIONS)}"
        )
    missing = [
        n for n, v in (("num_warmup", num_warmup), ("num_samples", num_samples)) if v is _REQUIRED
    ]
    if missing:
        raise TypeError(
            f"MCMC needs {' and '.join(missing)}: MCMC(kernel, num_warmup, num_samples), "
            f"NumPyro's order (Pyro's MCMC(kernel, num_samples, warmup_steps) takes "
            f"num_samples second)"
        )


class MCMC:
    """Run a kernel for ``num_warmup`` adaptation and ``num_samples`` sampling transitions.

    Args:
        kernel: a :class:`~probtorch.inference.mcmc.kernels.NUTS` or ``HMC`` kernel.
        num_warmup: warmup (adaptation) transitions per chain; they are not kept. With
            ``num_warmup=0`` nothing is adapted: the chains run at the kernel's
            ``step_size`` and ``inverse_mass_matrix``, as given.
        num_samples: draws kept per chain (after thinning: ``num_samples // thinning``).
        num_chains: number of chains.
        thinning: keep every ``thinning``-th draw, counted back from the last (kept), as
            NumPyro does.
        chain_method: ``"vectorized"`` (all chains in one batched kernel, the default) or
            ``"sequential"`` (one chain after the other). Both start the chains at the same
            initial points, but a chain's random numbers (momenta, tree directions) come
            from one stream shared by the chains, so for one seed the two methods give
            different draws of the same posterior (NumPyro's give the same).
        progress_bar: show a tqdm progress bar per phase.
        seed: random seed; the same seed (and chain method) gives the same draws.

    Example::

        >>> import torch, probtorch as pt, probtorch.distributions as dist
        >>> from probtorch.inference import MCMC, NUTS
        >>> def model(y):
        ...     mu = pt.sample("mu", dist.Normal(0.0, 10.0))
        ...     with pt.plate("n", len(y)):
        ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
        >>> mcmc = MCMC(NUTS(model, compile=False), num_warmup=200, num_samples=200,
        ...             num_chains=2, progress_bar=False, seed=0)
        >>> mcmc.run(torch.full((10,), 3.0))
        >>> round(float(mcmc.get_samples()["mu"].mean()), 0)
        3.0
    """

    def __init__(
        self,
        kernel,
        num_warmup: int = _REQUIRED,
        num_samples: int = _REQUIRED,
        num_chains: int = 1,
        thinning: int = 1,
        chain_method: str = "vectorized",
        progress_bar: bool = True,
        seed: int | None = None,
        **ported_options,
    ):
        _check_driver_options(num_warmup, num_samples, ported_options)
        if num_warmup < 0 or num_samples < 1:
            raise ValueError(
                f"need num_warmup >= 0 and num_samples >= 1, got {num_warmup}, {num_samples}"
            )
        if num_chains < 1 or thinning < 1:
            raise ValueError(
                f"need num_chains >= 1 and thinning >= 1, got {num_chains}, {thinning}"
            )
        if thinning > num_samples:
            raise ValueError(
                f"thinning={thinning} keeps one of each {thinning} of num_samples={num_samples} "
                f"draws per chain: none (num_samples counts the draws before thinning)"
            )
        if chain_method not in ("vectorized", "sequential"):
            why = (
                " (NumPyro's 'parallel' maps chains to devices or processes; probtorch runs "
                "them in one batched kernel, 'vectorized', the default)"
                if chain_method == "parallel"
                else ""
            )
            raise ValueError(
                f"chain_method must be 'vectorized' or 'sequential', got {chain_method!r}{why}"
            )
        if not (hasattr(kernel, "setup") and hasattr(kernel, "run_segment")):
            what = getattr(kernel, "__name__", type(kernel).__name__)
            raise TypeError(
                f"MCMC takes a kernel, e.g. MCMC(NUTS(model), ...) or HMC(model), not {what!r}"
            )
        if seed is not None:
            try:
                seed = operator.index(seed)  # Python and NumPy integers
            except TypeError:
                raise TypeError(f"seed must be an integer, got {seed!r}") from None
        self.kernel = kernel
        self.num_warmup = int(num_warmup)
        self.num_samples = int(num_samples)
        self.num_chains = int(num_chains)
        self.thinning = int(thinning)
        self.chain_method = chain_method
        self.progress_bar = progress_bar
        self.seed = seed
        self._post_warmup_state: SamplerState | None = None
        # whether post_warmup_state was left by run() (not by warmup() or the user): such a
        # state is continued only with the same arguments
        self._warm_left_by_run = False
        # the settings its warmup ran with; None for a state the user set (post_warmup_state)
        self._adapted_with: dict | None = None
        self._model_changed = False
        self._continued_runs = 0  # runs that continued this state (each draws its own stream)
        self.last_state: SamplerState | None = None
        self._samples: dict[str, torch.Tensor] | None = None  # (C, S, ...)
        self._stats: dict[str, torch.Tensor] | None = None  # (C, S)
        self._extra_fields: tuple = ("diverging",)
        self._model_args: tuple = ()
        self._model_kwargs: dict = {}
        # the potential (model and arguments) of the last run, for its exports: the
        # kernel's is replaced by a run of another MCMC that shares the kernel
        self._potential = None
        self._param_store = None  # the store the last run's pt.param sites read
        self.interrupted = False

    @property
    def post_warmup_state(self) -> SamplerState | None:
        """The adapted chains at the start of sampling (None: the next run warms up)."""
        return self._post_warmup_state

    @post_warmup_state.setter
    def post_warmup_state(self, state: SamplerState | None) -> None:
        self._post_warmup_state = state
        self._warm_left_by_run = False
        self._adapted_with = None
        self._continued_runs = 0  # a state set anew continues as its first continuation

    def _adaptation_settings(self) -> dict:
        """What a warmup adapts with: ``num_warmup`` and the kernel's adaptation options."""
        k = self.kernel
        names = ("step_size", "adapt_step_size", "adapt_mass_matrix", "dense_mass",
                 "mass_blocks", "inverse_mass_matrix", "target_accept_prob",
                 "find_heuristic_step_size")  # fmt: skip
        return {"num_warmup": self.num_warmup, **{n: getattr(k, n, None) for n in names}}

    def _kept_state(self, args, kwargs) -> SamplerState | None:
        """``post_warmup_state`` if this run continues it (see :meth:`run`), else None. A
        state the driver kept (by :meth:`run` or :meth:`warmup`) is dropped, with a
        warning, where ``num_chains`` changed since, and continued with a warning where
        ``num_warmup`` or the kernel's adaptation options changed."""
        given = self.post_warmup_state
        if given is None:
            return None
        potential = self.kernel.potential
        if self._warm_left_by_run and not _same_args(potential, args, kwargs):
            return None  # the previous run adapted to other data: warm up anew
        kept_by_driver = self._adapted_with is not None
        if kept_by_driver and len(given.z) != self.num_chains:
            warn_at_caller(
                f"num_chains={self.num_chains}, but the post_warmup_state kept from the "
                f"previous run has {len(given.z)} chains: warming up anew"
            )
            return None
        self._model_changed = _same_args(potential, args, kwargs) and _model_changed(
            potential, given
        )
        if self._model_changed and self._warm_left_by_run:
            warn_at_caller(
                "the model's potential energy at the chains' positions differs from the last "
                "run's with the same arguments (the model reads something else that changed, "
                "e.g. a global tensor or number): warming up anew",
            )
            return None
        if kept_by_driver:
            now = self._adaptation_settings()
            changed = [
                f"{n}={now[n]!r}"
                for n, was in self._adapted_with.items()
                if not (now[n] is was or (isinstance(was, _PLAIN) and now[n] == was))
            ]
            if changed:
                warn_at_caller(
                    f"{', '.join(changed)} changed since post_warmup_state was adapted, but "
                    f"this run continues from it without warmup, at its adapted step size and "
                    f"mass matrix; set mcmc.post_warmup_state = None before run() to warm up "
                    f"anew"
                )
        return given

    # -- running ------------------------------------------------------------------------
    def run(
        self, *args, init_params: dict | torch.Tensor | None = None, extra_fields=(), **kwargs
    ) -> None:
        """Warm up (unless continuing from ``post_warmup_state``) and draw samples.

        ``init_params`` are constrained initial values per latent site (each with the
        site's shape, or with a leading ``num_chains`` dimension); for a kernel built from
        ``potential_fn``, the values it takes (a dict, or one tensor). After a run,
        ``post_warmup_state`` holds the adapted chains at the start of sampling, so a
        second ``run`` with the same arguments samples again from there without warming
        up (set it to None for a new warmup, e.g. from other ``init_params``). A run with
        other arguments (new data, or data changed in place) warms up anew, as in NumPyro
        and Pyro, and so does one after ``num_chains`` changed (with a warning); one after
        ``num_warmup`` or the kernel's adaptation options changed continues, with a warning
        that they are unused. Setting ``mcmc.post_warmup_state = mcmc.last_state`` continues the
        chains where they stopped, and a state you set (or :meth:`warmup` left) is
        continued even with other arguments of the same shapes: the chains keep their
        positions, step sizes and metric, and their potential energy and gradient are
        computed under the new arguments. A continued run draws a random stream of its
        own (from the seed and the state).

        ``extra_fields`` names per-draw statistics to keep besides ``diverging``:
        ``energy``, ``tree_depth`` (NUTS: the doublings the trajectory kept, Stan's
        ``treedepth__``; NumPyro's counts a last doubling rejected for a U-turn or a
        divergence inside it too, one more for such trees), ``num_steps``, ``accept_prob``,
        ``step_size``, ``potential_energy``, and NumPyro's ``mean_accept_prob`` (the running mean of
        ``accept_prob`` over the run's transitions, thinned ones included; a continued run
        starts its own) and ``adapt_state.step_size``.

        Ctrl-C keeps the transitions finished so far, with a warning; chains are cut to the
        shortest, so ``last_state`` may lie a few transitions past a chain's last kept draw.
        Afterwards a warning reports divergent transitions and trees cut at
        ``max_tree_depth``, as Stan does. torch runs with ``PROBTORCH_NUM_THREADS`` intra-op
        threads meanwhile (default 1; see
        :func:`probtorch.inference.compile.inference_threads`).
        """
        with inference_threads(), fitted_scope(getattr(self.kernel, "model", None)):
            self._run(args, kwargs, init_params, extra_fields)

    def warmup(
        self,
        *args,
        init_params: dict | None = None,
        extra_fields=(),
        collect_warmup: bool = False,
        **kwargs,
    ) -> None:
        """Run only the warmup (adaptation), as NumPyro's ``MCMC.warmup``.

        Afterwards ``post_warmup_state`` holds the adapted chains, and ``run`` with the
        same arguments samples from there without warming up again. A previous warmup is
        not reused: this always adapts anew. With ``collect_warmup`` the warmup transitions
        are kept as the draws (``get_samples``, ``get_extra_fields``, ``print_summary``;
        thinned as sampling draws are), to look at how the chains and the step size
        settled; otherwise no draws are kept.

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> from probtorch.inference import MCMC, NUTS
            >>> def model():
            ...     pt.sample("x", dist.Normal(0.0, 1.0))
            >>> mcmc = MCMC(NUTS(model, compile=False), num_warmup=50, num_samples=20,
            ...             progress_bar=False, seed=0)
            >>> mcmc.warmup(collect_warmup=True, extra_fields=("step_size",))
            >>> mcmc.get_extra_fields()["step_size"].shape
            torch.Size([50])
            >>> mcmc.run()  # no new warmup
            >>> mcmc.get_samples()["x"].shape
            torch.Size([20])
        """
        self.post_warmup_state = None
        with inference_threads(), fitted_scope(getattr(self.kernel, "model", None)):
            self._run(args, kwargs, init_params, extra_fields, warmup_only=True,
                      collect_warmup=collect_warmup)  # fmt: skip

    def _run(
        self, args, kwargs, init_params, extra_fields, warmup_only=False, collect_warmup=False
    ) -> None:
        if isinstance(extra_fields, str):  # one name, not its letters
            extra_fields = (extra_fields,)
        fields = tuple(dict.fromkeys(("diverging",) + tuple(extra_fields)))
        available = [n for n in STAT_NAMES if n != "tree_depth" or self._builds_trees()]
        unknown = set(fields) - set(STAT_NAMES) - set(_FIELD_ALIASES) - {_MEAN_ACCEPT}
        if unknown:  # refused before anything changes: the last run's results stay
            raise ValueError(
                f"unknown extra_fields {sorted(unknown)}; available: {available}, "
                f"{_MEAN_ACCEPT!r} and NumPyro's {sorted(_FIELD_ALIASES)}"
            )
        if "tree_depth" in fields and not self._builds_trees():
            raise ValueError(
                f"extra_fields: tree_depth is NUTS's; {type(self.kernel).__name__} builds no "
                f"trees (num_steps counts its leapfrog steps)"
            )
        self._extra_fields = fields
        self._model_args, self._model_kwargs = args, kwargs
        self._param_store = active_store()  # what the model's pt.param sites read
        seed = self.seed if self.seed is not None else int(torch.randint(0, 2**31, ()).item())
        self._model_changed = False
        given = self._kept_state(args, kwargs)
        continuing = given is not None
        if continuing and init_params is not None:
            raise ValueError(
                "init_params would be ignored: this run continues from post_warmup_state (set "
                "by the previous run, or by you); set mcmc.post_warmup_state = None to start "
                "from init_params with a new warmup"
            )
        with torch.random.fork_rng(devices=[]):
            # a continued run draws a stream of its own: restarting the seed's stream would
            # drive it with the same momenta as the run it continues (NumPyro carries its
            # key in the state for the same reason)
            if continuing:
                torch.manual_seed(continuation_seed(seed, given, self._continued_runs))
                self._continued_runs += 1
            else:
                torch.manual_seed(seed)
            with explaining_rng_key(args, "MCMC.run(*args, **kwargs)", "MCMC(..., seed=...)"):
                state = self._setup(args, kwargs, seed, init_params, given)
            phase = (continuing, warmup_only, collect_warmup)
            self.interrupted, self._interrupted_in = False, None
            self._problems = [0, 0, 0]  # sampling transitions, divergent, at max_tree_depth
            if self.chain_method == "vectorized":
                warm, state, draws, stats = self._run_chains(state, *phase)
                note = self._interrupted_in and _interrupt_note(self._interrupted_in, draws)
            else:
                parts = []
                for c in range(self.num_chains):
                    parts.append(self._run_chains(_chain(state, c), *phase))
                    if self.interrupted:  # Ctrl-C ends the run, not only this chain
                        break
                parts, note = self._kept_chains(parts)
                warm = _cat_states([p[0] for p in parts])
                state = _cat_states([p[1] for p in parts])
                draws = _cat_chains([p[2] for p in parts])
                stats = {k: _cat_chains([p[3][k] for p in parts]) for k in parts[0][3]}
        if note:
            warn_at_caller(note)
        if warm is not None and len(warm.z) != self.num_chains:  # chains dropped (sequential)
            warm = given  # the given one still holds (None when not continuing)
        if warm is not given:  # a new state: its continuations count from zero
            self._continued_runs = 0
        if not continuing:
            self._adapted_with = self._adaptation_settings()
        self._post_warmup_state = warm
        self._warm_left_by_run = not warmup_only
        self.last_state = state
        self._potential = self.kernel.potential
        self._collect(draws, stats)
        warmed_up = None if continuing else self.num_warmup
        problems = (
            None
            if warmup_only
            else problems_message(self.kernel, *self._problems, num_warmup=warmed_up)
        )
        if problems:
            warn_at_caller(problems)

    def _kept_chains(self, parts: list) -> tuple[list, str | None]:
        """The sequential chains kept after an interrupt (in the last of ``parts``), and what
        the warning says: the finished chains in full, or every chain run cut to the
        interrupted one's length, whichever keeps more draws."""
        if not self.interrupted:
            return parts, None
        c, done = len(parts) - 1, parts[:-1]
        total, kept = self.num_chains, parts[-1][2].shape[1]
        where = f"interrupted during {self._interrupted_in} of chain {c + 1} of {total} "
        where += "(chain_method='sequential'): keeping "
        full = done[0][2].shape[1] if done else 0
        if done and len(done) * full >= len(parts) * kept:
            dropped = f"; chain {c + 1}'s {kept} draws were dropped"
            return done, where + f"the {len(done)} finished chain(s) of {full} draws{dropped}"
        return parts, where + f"{len(parts)} chain(s) of {kept} draws (the interrupted chain's)"

    def _setup(self, args, kwargs, seed, init_params, warm) -> SamplerState:
        """The chains' state to start from: ``warm`` (a state to continue, or None) or a new
        one from the kernel's set-up."""
        potential = self.kernel.potential
        if warm is not None and len(warm.z) != self.num_chains:
            raise ValueError(
                f"post_warmup_state has {len(warm.z)} chains but this MCMC runs "
                f"num_chains={self.num_chains} (a run interrupted in sequential chains keeps "
                f"fewer; continue with MCMC(..., num_chains={len(warm.z)}))"
            )
        if (
            warm is not None
            and potential is not None
            and _same_args(potential, args, kwargs)
            and not self._model_changed
        ):
            return warm  # continue: the kernel's compiled functions are reused
        # without warmup nothing is adapted: the chains run at the kernel's step_size
        state = self.kernel.setup(
            args,
            kwargs,
            self.num_chains,
            seed,
            init_params=init_params,
            find_step_size=self.num_warmup > 0,
        )
        if warm is None:
            return state
        if warm.z.shape != state.z.shape:
            raise ValueError(
                f"post_warmup_state has shape {tuple(warm.z.shape)} but this run has "
                f"{self.num_chains} chains of {state.z.shape[1]} dims (its model or data "
                f"differ); set mcmc.post_warmup_state = None for a new warmup"
            )
        return self._at_new_arguments(warm)

    def _at_new_arguments(self, warm: SamplerState) -> SamplerState:
        """``warm`` with its potential energy and gradient computed by the kernel's (new)
        potential: the ones kept were computed under other arguments."""
        pe, grad = self.kernel.potential.eager_value_and_grad(warm.z)
        bad = ~(torch.isfinite(pe) & torch.isfinite(grad).all(-1))
        if bool(bad.any()):
            chains = bad.nonzero().flatten().tolist()
            raise ValueError(
                f"post_warmup_state: under this run's arguments the potential energy or its "
                f"gradient is not finite at the positions of chain(s) {chains} (sites "
                f"{self.kernel.potential.site_names}); set mcmc.post_warmup_state = None "
                f"for a new warmup"
            )
        return warm._replace(potential_energy=pe, grad=grad)

    def _run_chains(
        self,
        state: SamplerState,
        continuing: bool,
        warmup_only: bool = False,
        collect_warmup: bool = False,
    ):
        """Warmup then sampling for the chains in ``state`` (only the warmup with
        ``warmup_only``).

        Returns the post-warmup state, the last state, the draws ``(C, S, D)`` and the
        per-draw statistics ``(C, S)``: the sampling phase's, or the warmup's with
        ``collect_warmup`` (none without).
        """
        kernel = self.kernel
        C, D = state.z.shape
        empty = state.z.new_zeros(C, 0, D)
        kept = empty, _with_running_mean(empty_stats(state.z))
        keep = self._kept(self.num_samples)
        if not continuing and self.num_warmup > 0:
            with _progress("warmup", self.num_warmup, self.progress_bar) as bar:
                warmed = run_warmup(kernel, state, self.num_warmup, bar)
            state = warmed.state
            if collect_warmup:
                warm_keep = self._kept(self.num_warmup)
                kept = (
                    warmed.draws[:, warm_keep],
                    {k: v[:, warm_keep] for k, v in _with_running_mean(warmed.stats).items()},
                )
            if warmed.interrupted:
                self.interrupted, self._interrupted_in = True, "warmup"
                return None, state, *kept
        if warmup_only:
            return state, state, *kept
        warm = state
        adapt = init_adapt_state(state, kernel.dense_mass)
        with _progress("sample", self.num_samples, self.progress_bar) as bar:
            result = kernel.run_segment(state, adapt, self.num_samples, progress=bar)
        if result.interrupted:
            self.interrupted, self._interrupted_in = True, "sampling"
        for i, n in enumerate(problem_counts(kernel, result.stats)):  # before thinning
            self._problems[i] += n
        draws = result.draws[:, keep]
        stats = {k: v[:, keep] for k, v in _with_running_mean(result.stats).items()}
        return warm, result.state, draws, stats

    def _kept(self, num: int) -> slice:
        """The draws of ``num`` transitions that thinning keeps: every ``thinning``-th,
        counted back from the last, which is always kept (as NumPyro's; an interrupted run
        keeps those of its draws that the whole run would have kept)."""
        return slice(num % self.thinning + self.thinning - 1, None, self.thinning)

    def _collect(self, draws: torch.Tensor, stats: dict) -> None:
        potential = self._potential
        C, S, D = draws.shape
        if S == 0:
            self._samples = {}
        else:
            values = potential.constrain(draws.reshape(C * S, D))
            self._samples = {k: v.reshape((C, S) + v.shape[1:]) for k, v in values.items()}
        self._stats = stats

    # -- results ------------------------------------------------------------------------
    def _require_run(self) -> None:
        if self._samples is None:
            raise RuntimeError("call .run(...) first")

    def _require_draws(self, what: str) -> None:
        """A summary of the draws needs some (a run interrupted in its warmup, or
        ``warmup()`` without ``collect_warmup``, kept none)."""
        self._require_run()
        if self._stats["diverging"].shape[-1] == 0:
            raise RuntimeError(
                f"{what}: this MCMC kept no draws (its run was interrupted during warmup, or "
                f"only warmup() ran, without collect_warmup=True); run(...) draws them"
            )

    def get_samples(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Draws per site (latent and deterministic), ``(C * S, ...)`` or ``(C, S, ...)``:
        copies, so that changing them in place (``s["mu"] -= m``) leaves the run's own
        draws, summaries and exports as they were."""
        self._require_run()
        if group_by_chain:
            return {k: v.clone() for k, v in self._samples.items()}
        return {k: v.flatten(0, 1).clone() for k, v in self._samples.items()}

    def get_extra_fields(self, group_by_chain: bool = False) -> dict[str, torch.Tensor]:
        """Per-draw statistics named in ``run(extra_fields=...)``, plus ``diverging``
        (copies, as :meth:`get_samples`'s). NumPyro's ``"adapt_state.step_size"`` gives
        ``"step_size"``, each transition's step size: after warmup the adapted one, as
        NumPyro's (in a collected warmup NumPyro's is the one after each update)."""
        self._require_run()
        fields = {k: self._stats[_FIELD_ALIASES.get(k, k)] for k in self._extra_fields}
        if group_by_chain:
            return {k: v.clone() for k, v in fields.items()}
        return {k: v.flatten().clone() for k, v in fields.items()}

    def print_summary(self, prob: float = 0.9, exclude_deterministic: bool = True) -> None:
        """Mean, sd, quantiles, bulk ESS and R-hat per scalar, and the divergence count:
        of the latent sites, and of the deterministic ones too with
        ``exclude_deterministic=False`` (NumPyro's option and default)."""
        self._require_draws("print_summary")
        samples = self._samples
        if exclude_deterministic:
            latent = set(self._potential.site_names)
            samples = {k: v for k, v in samples.items() if k in latent}
        print(summary_table(samples, prob=prob))
        print(f"\nNumber of divergences: {int(self._stats['diverging'].sum())}")

    def summary(self, prob: float = 0.9) -> None:
        """Pyro's name for :meth:`print_summary`, of every recorded site."""
        self.print_summary(prob=prob, exclude_deterministic=False)

    def diagnostics(self) -> dict:
        """Pyro's ``MCMC.diagnostics()``: per site its bulk ``n_eff`` and ``r_hat`` (ArviZ's;
        tensors shaped like the site), and per chain the indices of its divergent draws
        (``"divergences"``) and its mean acceptance probability (``"acceptance rate"``).

        Example::

            >>> import probtorch as pt, probtorch.distributions as dist
            >>> from probtorch.inference import MCMC, NUTS
            >>> def model():
            ...     pt.sample("x", dist.Normal(torch.zeros(2), 1.0).to_event(1))
            >>> mcmc = MCMC(NUTS(model, compile=False), num_warmup=20, num_samples=30,
            ...             num_chains=2, progress_bar=False, seed=0)
            >>> mcmc.run()
            >>> d = mcmc.diagnostics()
            >>> d["x"]["r_hat"].shape, sorted(d["divergences"]), sorted(d["acceptance rate"])
            (torch.Size([2]), ['chain 0', 'chain 1'], ['chain 0', 'chain 1'])
        """
        self._require_draws("diagnostics")
        result: dict = {}
        for name, value in self._samples.items():
            ess, rhat = ess_and_rhat(value)
            result[name] = {"n_eff": torch.as_tensor(ess), "r_hat": torch.as_tensor(rhat)}
        diverging = self._stats["diverging"]
        accept = self._stats["accept_prob"].double()
        result["divergences"] = {
            f"chain {c}": torch.nonzero(diverging[c]).reshape(-1).tolist()
            for c in range(diverging.shape[0])
        }
        result["acceptance rate"] = {
            f"chain {c}": float(accept[c].mean()) for c in range(accept.shape[0])
        }
        return result

    def _builds_trees(self) -> bool:
        """Whether the kernel builds NUTS trees (HMC does not: it has no tree_depth)."""
        return hasattr(self.kernel, "max_tree_depth")

    def to_inference_data(
        self,
        posterior_predictive: dict | None = None,
        prior: dict | None = None,
        coords: dict | None = None,
        dims: dict | None = None,
        *,
        constant_data: dict | None = None,
        predictions: dict | None = None,
        predictions_constant_data: dict | None = None,
        pred_dims: dict | None = None,
        log_likelihood: bool = True,
    ):
        """ArviZ InferenceData: posterior, sample_stats, observed_data, log_likelihood.

        Args:
            posterior_predictive: draws from :class:`~probtorch.inference.Predictive` with
                these samples (``(chains * draws, ...)`` or, with ``batch_ndims=2``,
                ``(chains, draws, ...)``), for the ``posterior_predictive`` group.
            prior: prior draws (``Predictive(model, num_samples=n)``): observed sites (and
                the value an ``obs_mask`` site combines) go to ``prior_predictive``, the
                others to ``prior``.
            coords, dims: as in ``arviz.from_dict``; ``dims`` overrides the dim names taken
                from the plates. A name in ``dims`` that no group holds, more dims than a
                value has, or coords of another length than their dim are refused, naming
                the site.
            constant_data, predictions_constant_data: arrays by name (the model's inputs,
                say), for those groups, as ``arviz.from_numpyro``'s.
            predictions: draws at new inputs (``Predictive`` on other data), shaped as
                ``posterior_predictive``'s; ``pred_dims`` names their dims (and those of
                ``predictions_constant_data``).
            log_likelihood: False leaves the pointwise log likelihood out (it evaluates
                the model for every draw).

        ``log_likelihood`` holds the observed sites and, as NumPyro's, the ``pt.factor``
        sites (a likelihood written ``pt.factor("ll", logp)`` in a plate is pointwise;
        it observes nothing, so it is not in ``observed_data``).

        Dims are named after the enclosing plates. Observations a mask leaves out
        (``obs_mask``, ``handlers.mask``) are not in ``log_likelihood`` and
        ``observed_data``: a partly masked site has its counted entries along one dim
        ``{site}_counted`` (in the predictive groups too), so that ``az.loo`` sees only
        real observations and ``az.loo_pit`` pairs each observation with its draws.

        Example::

            >>> import torch, probtorch as pt, probtorch.distributions as dist
            >>> from probtorch.inference import MCMC, NUTS, Predictive
            >>> def model(y=None):
            ...     mu = pt.sample("mu", dist.Normal(0.0, 1.0))
            ...     with pt.plate("obs", 4):
            ...         pt.sample("y", dist.Normal(mu, 1.0), obs=y)
            >>> mcmc = MCMC(NUTS(model, compile=False), num_warmup=50, num_samples=50,
            ...             num_chains=2, progress_bar=False, seed=0)
            >>> mcmc.run(torch.zeros(4))
            >>> ppc = Predictive(model, mcmc.get_samples())(seed=0)
            >>> idata = mcmc.to_inference_data(posterior_predictive=ppc)
            >>> dict(idata.posterior_predictive["y"].sizes)
            {'chain': 2, 'draw': 50, 'obs': 4}
        """
        self._require_draws("to_inference_data")
        # as ArviZ's from_numpyro: mean_accept_prob where it was asked for
        left_out = {"tree_depth"} if not self._builds_trees() else set()
        if _MEAN_ACCEPT not in self._extra_fields:
            left_out.add(_MEAN_ACCEPT)
        stats = {k: v for k, v in self._stats.items() if k not in left_out}
        # the log likelihood reads the params the run read (the fitted SVI's store, or the
        # one chosen around run), unless the caller chooses one now
        chosen = store_chosen() or self._param_store is None
        with contextlib.nullcontext() if chosen else param_scope(self._param_store):
            return to_inference_data(
                self._potential,
                self._samples,
                stats,
                posterior_predictive=posterior_predictive,
                prior=prior,
                coords=coords,
                dims=dims,
                # a potential_fn's own factor is the whole density, no likelihood
                factors=getattr(self.kernel, "potential_fn", None) is None,
                constant_data=constant_data,
                predictions=predictions,
                predictions_constant_data=predictions_constant_data,
                pred_dims=pred_dims,
                log_likelihood=log_likelihood,
            )


# NumPyro's names of extra fields that probtorch records under its own
_FIELD_ALIASES = {"adapt_state.step_size": "step_size"}

# NumPyro's running mean of accept_prob over a phase's transitions
_MEAN_ACCEPT = "mean_accept_prob"


def _with_running_mean(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``stats`` of a phase's transitions ``(C, S)``, before thinning, with NumPyro's
    ``mean_accept_prob``: each transition's mean of ``accept_prob`` over the phase's
    transitions up to it (a run continued from a kept state starts its own mean).

    >>> accept = torch.tensor([[1.0, 0.5, 0.0]])
    >>> _with_running_mean({"accept_prob": accept})["mean_accept_prob"]
    tensor([[1.0000, 0.7500, 0.5000]])
    """
    accept = stats["accept_prob"]
    count = torch.arange(1, accept.shape[1] + 1, dtype=accept.dtype, device=accept.device)
    return {**stats, _MEAN_ACCEPT: accept.cumsum(1) / count}


# settings compared by value (others, tensors and dicts of them, by identity)
_PLAIN = (bool, int, float, str, tuple, list)


def _model_changed(potential, state: SamplerState) -> bool:
    """Whether the model's potential energy at ``state``'s positions (evaluated now, eagerly)
    differs from the one the state holds beyond rounding: the model reads something besides
    its arguments (a global) that changed since the state was made. Called where the
    arguments are the same (:func:`_same_args`)."""
    if potential is None or not potential.arguments_unchanged():
        return False
    try:
        pe, _ = potential.eager_value_and_grad(state.z)
    except (RuntimeError, ValueError):
        return True  # the model no longer runs where it did
    kept = state.potential_energy
    tol = 1e-9 if kept.dtype == torch.float64 else 1e-4
    return not bool(torch.allclose(pe.to(kept.dtype), kept, rtol=tol, atol=tol, equal_nan=True))


def continuation_seed(seed: int, state: SamplerState, count: int = 0) -> int:
    """The seed of a run that continues from ``state``: a hash of ``seed``, the state's
    positions and step sizes, and ``count``, the number of runs this MCMC continued before
    (the same seed, state and count give the same draws; a second run from the same
    post-warmup state draws anew).

    Example::

        >>> import torch
        >>> from probtorch.inference.mcmc.kernels import SamplerState
        >>> s = SamplerState(*(torch.zeros(2, 3),) * 6)
        >>> continuation_seed(0, s) == continuation_seed(0, s) != continuation_seed(1, s)
        True
        >>> continuation_seed(0, s, 1) != continuation_seed(0, s, 0)
        True
    """
    h = hashlib.sha256(f"{int(seed)}/{int(count)}".encode() if count else str(int(seed)).encode())
    for x in (state.z, state.step_size):
        h.update(x.detach().cpu().contiguous().numpy().tobytes())
    return int.from_bytes(h.digest()[:8], "little") % 2**62


def problem_counts(kernel, stats: dict) -> tuple[int, int, int]:
    """Transitions, divergent ones and NUTS trees cut at ``max_tree_depth`` in ``stats``."""
    diverged = int(stats["diverging"].sum())
    max_depth = getattr(kernel, "max_tree_depth", None)
    capped = 0
    if max_depth is not None and "tree_depth" in stats:
        capped = int((stats["tree_depth"] >= max_depth).sum())
    return stats["diverging"].numel(), diverged, capped


# Stan's warmup buffers and first window (75 + 25 + 50): shorter warmups scale them down
_SHORT_WARMUP = 150


def problems_message(
    kernel, total: int, diverged: int, capped: int, num_warmup: int | None = None
) -> str | None:
    """What Stan reports after sampling, or None: divergent transitions (the draws may miss
    part of the posterior) and NUTS trees cut at ``max_tree_depth`` (inefficient, not
    biased), out of ``total`` sampling transitions (before thinning). Divergences after a
    short warmup (``num_warmup``, of this run) are put down to it first: Stan's schedule
    then adapts the final step size over a few iterations only, and it often ends too
    large (NumPyro's too: 1.7-8.3 on a standard normal after 20 iterations); without
    warmup (``num_warmup=0``) to the kernel's ``step_size``, which nothing adapted.

    Example::

        >>> from types import SimpleNamespace
        >>> kernel = SimpleNamespace(target_accept_prob=0.8, max_tree_depth=10)
        >>> print(problems_message(kernel, 2, 1, 1))  # doctest: +NORMALIZE_WHITESPACE
        1 of 2 transitions after warmup diverged: the draws may miss part of the posterior
        (raise target_accept_prob above 0.8, or reparameterize, e.g. non-centered); 1 of 2
        transitions reached max_tree_depth=10: sampling was inefficient (raise
        max_tree_depth, or use dense_mass=True for correlated parameters)
    """
    found = []
    if diverged:
        short = num_warmup is not None and 0 < num_warmup < _SHORT_WARMUP
        if num_warmup == 0:
            advice = (
                f"no warmup adapted the step size: the chains ran at step_size="
                f"{kernel.step_size:g}; warm up (num_warmup > 0) or pass a smaller step_size"
            )
        elif short and getattr(kernel, "adapt_step_size", False):
            windows = warmup_windows(num_warmup)
            last = num_warmup - windows[-1][1] if windows else num_warmup
            advice = (
                f"the warmup of {num_warmup} iterations is too short: its final step size "
                f"was adapted over its last {last} only and may be too large; use "
                f"num_warmup >= {_SHORT_WARMUP} (Stan's and NumPyro's default is 1000)"
            )
        else:
            advice = (
                f"raise target_accept_prob above {kernel.target_accept_prob:g}, or "
                f"reparameterize, e.g. non-centered"
            )
        found.append(
            f"{diverged} of {total} transitions after warmup diverged: the draws may miss part "
            f"of the posterior ({advice})"
        )
    if capped:
        found.append(
            f"{capped} of {total} transitions reached max_tree_depth={kernel.max_tree_depth}: "
            f"sampling was inefficient (raise max_tree_depth, or use dense_mass=True for "
            f"correlated parameters)"
        )
    return "; ".join(found) or None


def _interrupt_note(phase: str, draws: torch.Tensor) -> str:
    if phase == "warmup":
        what = f"the {draws.shape[1]} warmup draws were" if draws.shape[1] else "no draws were"
        return f"interrupted during warmup: {what} kept"
    return f"interrupted during sampling: keeping the {draws.shape[1]} draws per chain made so far"


def _same_args(potential, args, kwargs) -> bool:
    """The same argument objects as the potential's, none changed in place since (False
    where the kernel has no potential yet: a state set on a new MCMC)."""
    return (
        potential is not None
        and len(args) == len(potential.model_args)
        and all(a is b for a, b in zip(args, potential.model_args))
        and kwargs.keys() == potential.model_kwargs.keys()
        and all(kwargs[k] is potential.model_kwargs[k] for k in kwargs)
        and potential.arguments_unchanged()
    )


def _chain(state: SamplerState, c: int) -> SamplerState:
    return SamplerState(*(t[c : c + 1] for t in state))


def _cat_states(states: list) -> SamplerState | None:
    if any(s is None for s in states):
        return None
    return SamplerState(*(torch.cat(fields) for fields in zip(*states)))


def _cat_chains(parts: list[torch.Tensor]) -> torch.Tensor:
    size = min(p.shape[1] for p in parts)  # an interrupt may leave chains uneven
    return torch.cat([p[:, :size] for p in parts])


class _progress:
    """A tqdm bar for one phase, called with the number of transitions just completed and
    their divergences (it shows the phase's total, over all of its adaptation windows);
    :meth:`compiling` says in it that the sampler is being compiled, until the first
    transitions are reported."""

    def __init__(self, phase: str, total: int, enabled: bool):
        self.phase, self.total, self.enabled = phase, total, enabled
        self._compiling = False
        self.divergences = 0

    def __enter__(self):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, desc=self.phase, disable=not self.enabled)
        return self

    def compiling(self) -> None:
        if self.enabled:
            self.bar.set_description(f"{self.phase} (compiling)")
            self._compiling = True

    def __call__(self, n: int, step_size: torch.Tensor, divergences: int) -> None:
        if self._compiling:
            self.bar.set_description(self.phase, refresh=False)
            self._compiling = False
        self.divergences += divergences
        divergences = self.divergences
        if self.enabled:
            values = step_size.tolist()
            shown = ", ".join(f"{v:.2e}" for v in values[:4]) + (" ..." if len(values) > 4 else "")
            self.bar.set_postfix(step_size=shown, divergences=divergences, refresh=False)
            self.bar.update(n)

    def __exit__(self, *exc):
        self.bar.close()
