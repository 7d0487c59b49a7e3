"""Pyro's and NumPyro's MCMC options that probtorch spells otherwise or does without.

Ported code that passes one of them gets an error that says what to write here, instead
of Python's "unexpected keyword argument" or "missing argument".

Example::

    >>> print(ported_option_hint("MCMC", "disable_progbar"))
    MCMC got Pyro's option 'disable_progbar': write progress_bar=False
"""

from __future__ import annotations

__all__ = ["MCMC_OPTIONS", "KERNEL_OPTIONS", "ported_option_hint", "refuse_ported_options"]

_TRANSFORMS = (
    "each latent site is mapped to unconstrained space by its support "
    "(torch.distributions.biject_to); to sample a site in other coordinates, "
    "reparameterize it in the model (probtorch.reparam)"
)

# name -> (library, what to do here)
MCMC_OPTIONS: dict[str, tuple[str, str]] = {
    "warmup_steps": (
        "Pyro's",
        "it is num_warmup here, e.g. MCMC(kernel, num_warmup=500, num_samples=1000)",
    ),
    "initial_params": (
        "Pyro's",
        "initial values are given to run(): mcmc.run(*args, init_params={...})",
    ),
    "disable_progbar": ("Pyro's", "write progress_bar=False"),
    "hook_fn": (
        "Pyro's",
        "there is no per-iteration hook: the progress bar shows the step size and the "
        "divergences, and run(..., extra_fields=(...)) keeps per-draw statistics",
    ),
    "mp_context": (
        "Pyro's",
        "chains run in this process, batched (chain_method='vectorized', the default) or "
        "one after another ('sequential'), never in worker processes",
    ),
    "disable_validation": (
        "Pyro's",
        "sites are checked once, eagerly, when the model is first traced, never inside "
        "the sampler; probtorch.enable_validation(False) turns those checks off",
    ),
    "transforms": ("Pyro's", _TRANSFORMS),
    "jit_model_args": (
        "NumPyro's",
        "leave it out: a run with other arguments needs no option here",
    ),
    "postprocess_fn": (
        "NumPyro's",
        "draws are returned on each site's support (constrained); transform get_samples() "
        "yourself",
    ),
    "save_params": (
        "Pyro's",
        "every latent and deterministic site is kept; select sites from get_samples()",
    ),
}

KERNEL_OPTIONS: dict[str, tuple[str, str]] = {
    "full_mass": (
        "Pyro's",
        "it is dense_mass here (True, or a list of tuples of latent site names)",
    ),
    "jit_compile": (
        "Pyro's",
        "the kernel is compiled with torch.compile by default; compile=False runs it eagerly",
    ),
    "ignore_jit_warnings": (
        "Pyro's",
        "there is no TorchScript tracing here (compile=True/False chooses torch.compile or eager)",
    ),
    "jit_options": (
        "Pyro's",
        "there is no TorchScript tracing here (compile=True/False chooses torch.compile or eager)",
    ),
    "transforms": ("Pyro's", _TRANSFORMS),
    "max_plate_nesting": (
        "Pyro's",
        "the plates are found by running the model; leave it out",
    ),
    "use_multinomial_sampling": (
        "Pyro's",
        "NUTS always samples from the trajectory multinomially, as Stan; leave it out",
    ),
    "forward_mode_differentiation": (
        "NumPyro's",
        "gradients are reverse-mode (autograd); leave it out",
    ),
    "regularize_mass_matrix": (
        "NumPyro's",
        "the adapted mass matrix is always regularized as Stan's; leave it out",
    ),
    "kinetic_fn": (
        "NumPyro's",
        "the kinetic energy is Gaussian with the (adapted) inverse mass matrix; custom "
        "kinetic energies are not supported",
    ),
}

_NUTS_ONLY_HMC = (
    "NUTS chooses each trajectory's length itself; HMC(model, num_steps=...) or "
    "HMC(model, trajectory_length=...) runs fixed-length trajectories"
)
_NUTS_OPTIONS: dict[str, tuple[str, str]] = {
    "trajectory_length": ("HMC's", _NUTS_ONLY_HMC),
    "num_steps": ("HMC's", _NUTS_ONLY_HMC),
}


def ported_option_hint(owner: str, name: str) -> str | None:
    """The explanation for ``owner`` (``"MCMC"``, ``"NUTS"`` or ``"HMC"``) given option
    ``name`` of another library, or None when it is no such option."""
    table = MCMC_OPTIONS if owner == "MCMC" else KERNEL_OPTIONS
    if owner == "NUTS":
        table = {**table, **_NUTS_OPTIONS}
    if name not in table:
        return None
    library, advice = table[name]
    return f"{owner} got {library} option {name!r}: {advice}"


def refuse_ported_options(owner: str, options: dict) -> None:
    """Raise a TypeError explaining the first of ``options`` that another library's
    ``owner`` takes; return quietly when none is."""
    for name in options:
        hint = ported_option_hint(owner, name)
        if hint is not None:
            raise TypeError(hint)
