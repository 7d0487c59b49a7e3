"""One row per distribution family, for the table-driven tests in test_distributions_table.py.

A row holds everything the generic tests need: how to build the family from its parameters
(float64 tensors, batch_shape ``()``), a reference log density (a frozen ``scipy.stats``
distribution under the mapped parameterization, or a hand-written formula where scipy has
none), points across the support including near its bounds, the exact mean and variance of
a statistic of a draw (the draw itself unless a row says otherwise), written with torch ops
so that the rsample-gradient test can differentiate them, and the checks a row cannot pass,
each with its reason.

Adding a family = adding one row. Every parameter mapping below was checked numerically
(log_prob against the reference at the listed points, and the exact moments against
scipy's), not taken from memory; ``test_log_prob_matches_reference`` and
``test_sample_moments`` keep it that way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.special as sp
import torch
from scipy import stats

import probtorch.distributions as dist

__all__ = ["Family", "TABLE", "FAMILIES"]

F64 = torch.float64
EULER = 0.5772156649015329


def t(value) -> torch.Tensor:
    return torch.as_tensor(value, dtype=F64)


@dataclass
class Invalid:
    """Parameters that violate a constraint, and what the ValueError must mention."""

    params: dict[str, Any]
    param: str  # the parameter the message must name
    constraint: str  # text of the constraint's repr the message must contain
    site_check_reason: str | None = None  # why probtorch's site check cannot report it


@dataclass
class Family:
    """One family: constructor, parameters, reference density, exact moments, known gaps.

    Attributes:
        name: the ``probtorch.distributions`` name (also the pytest id).
        params: constructor keyword arguments (float64 tensors or Python ints).
        moments: ``params -> (mean, variance)`` of ``stat(draw)``, flattened, in torch ops.
        points: values in the support at which log_prob is compared with the reference.
        scipy_ref: ``params -> frozen scipy distribution``; its logpdf/logpmf is the
            reference. ``None`` where scipy has no such family.
        hand_ref: ``(params, x) -> log density`` (numpy) where ``scipy_ref`` is ``None``.
        stat: ``x -> (..., m)`` statistic whose moments are tested; ``None``: the draw,
            event dims flattened. Used where the draw has no finite variance (Cauchy) or is
            circular or constrained (VonMises, LKJ).
        make: ``(**params, validate_args=...) -> distribution``; default ``dist.<name>``.
        grad_params: parameters the rsample-gradient test differentiates; default every
            float tensor parameter except ``total_count``.
        sampler_reason: why ``sample``/``rsample`` cannot be compiled with fullgraph=True
            (the test then asserts that it indeed fails); ``None``: it compiles.
        compiled_rng_reason: why compiled draws differ from eager ones for the same seed even
            with Inductor's ``fallback_random``; the compile test then checks the compiled
            draws' moments instead of comparing draw for draw.
        xfail: known failures, ``{test: reason}`` with ``test`` one of "moments",
            "transform", ...; the test is run and must fail (a strict xfail), so a fix
            upstream shows up as an unexpected pass.
    """

    name: str
    params: dict[str, Any]
    moments: Callable[[dict], tuple[torch.Tensor, torch.Tensor]]
    points: list
    scipy_ref: Callable[[dict], Any] | None = None
    hand_ref: Callable[[dict, np.ndarray], float] | None = None
    stat: Callable[[torch.Tensor], torch.Tensor] | None = None
    make: Callable[..., Any] | None = None
    invalid: list[Invalid] = field(default_factory=list)
    grad_params: tuple[str, ...] | None = None
    sampler_reason: str | None = None
    compiled_rng_reason: str | None = None
    xfail: dict[str, str] = field(default_factory=dict)
    ref_note: str = ""

    def build(self, params: dict | None = None, validate_args: bool | None = None):
        params = self.params if params is None else params
        make = self.make if self.make is not None else getattr(dist, self.name)
        return make(**params, validate_args=validate_args)

    def dist(self, validate_args: bool | None = False):
        return self.build(validate_args=validate_args)

    @property
    def differentiable(self) -> tuple[str, ...]:
        if self.grad_params is not None:
            return self.grad_params
        return tuple(
            k
            for k, v in self.params.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and k != "total_count"
        )

    def numpy_params(self) -> dict[str, Any]:
        return {
            k: (v.detach().numpy() if isinstance(v, torch.Tensor) else v)
            for k, v in self.params.items()
        }

    def ref_log_prob(self, x: np.ndarray) -> float:
        p = self.numpy_params()
        if self.scipy_ref is not None:
            ref = self.scipy_ref(p)
            return float(ref.logpmf(x) if hasattr(ref, "logpmf") else ref.logpdf(x))
        return float(self.hand_ref(p, x))


def _univariate(mean, var):
    return lambda p: (t(0.0) + mean(p), t(0.0) + var(p))


# --------------------------------------------------------------------------------------
# hand references (scipy has no such family) and statistics
# --------------------------------------------------------------------------------------


def _beta_moments(a, b):
    return a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))


def _affine(moments, p):
    mean, var = moments
    return p["loc"] + p["scale"] * mean, p["scale"] ** 2 * var


def _beta_binomial_moments(a, b, n):
    mean, var = _beta_moments(a, b)
    return n * mean, n * var * (a + b + n)


def _kumaraswamy_logpdf(p, x):
    a, b = p["concentration1"], p["concentration0"]
    return np.log(a) + np.log(b) + (a - 1) * np.log(x) + (b - 1) * np.log1p(-(x**a))


def _kumaraswamy_moments(p):
    a, b = p["concentration1"], p["concentration0"]

    def raw(n):  # E[X^n] = b B(1 + n/a, b)
        log_beta = torch.lgamma(1 + n / a) + torch.lgamma(b) - torch.lgamma(1 + n / a + b)
        return b * torch.exp(log_beta)

    m1, m2 = raw(1.0), raw(2.0)
    return m1, m2 - m1**2


def _continuous_bernoulli_logpdf(p, x):
    lam = p["probs"]
    log_norm = np.log(2 * np.arctanh(1 - 2 * lam) / (1 - 2 * lam))
    return log_norm + x * np.log(lam) + (1 - x) * np.log1p(-lam)


def _continuous_bernoulli_moments(p):
    lam = p["probs"]
    c = 1 / (2 * torch.atanh(1 - 2 * lam))
    mean = lam / (2 * lam - 1) + c
    var = lam * (lam - 1) / (1 - 2 * lam) ** 2 + c**2
    return mean, var


def _relaxed_bernoulli_logpdf(p, x):
    # binary Concrete (Maddison et al. 2017, eq. 28), alpha = probs / (1 - probs)
    temp, probs = p["temperature"], p["probs"]
    log_alpha = np.log(probs) - np.log1p(-probs)
    log_num = np.log(temp) + log_alpha + (-temp - 1) * (np.log(x) + np.log1p(-x))
    log_den = 2 * np.logaddexp(log_alpha - temp * np.log(x), -temp * np.log1p(-x))
    return log_num - log_den


def _logit_stat(x):
    return torch.logit(x).unsqueeze(-1)


def _logistic_normal_logpdf(p, y):
    # y = stick-breaking(u), u ~ Normal(loc, scale) with torch's offset log(K - i):
    # z_i = y_i / (1 - sum_{j<i} y_j), u_i = logit(z_i) + log(K - i), K = len(u).
    loc, scale = p["loc"], p["scale"]
    k = len(loc)
    rest = 1 - np.concatenate([[0.0], np.cumsum(y[:-1])])[:k]
    z = y[:k] / rest
    u = sp.logit(z) + np.log(k - np.arange(k))
    log_jac = -np.log(z) - np.log1p(-z) - np.log(rest)
    return float(np.sum(stats.norm(loc, scale).logpdf(u) + log_jac))


def _logistic_normal_stat(y):
    k = y.shape[-1] - 1
    rest = 1 - torch.cumsum(y, -1)[..., :k] + y[..., :k]
    offset = torch.log(torch.arange(k, 0, -1, dtype=y.dtype))
    return torch.logit(y[..., :k] / rest) + offset


def _lkj_log_normalizer(d, eta):
    # log of the integral of det(C)^(eta-1) over d x d correlation matrices
    # (Lewandowski, Kurowicka & Joe 2009, eq. 16).
    total = 0.0
    for k in range(1, d):
        b = eta + (d - k - 1) / 2
        total += (2 * eta - 2 + d - k) * (d - k) * math.log(2)
        total += (d - k) * (sp.betaln(b, b))
    return total


def _lkj_cholesky_logpdf(p, L):
    # density of the strictly lower entries of L: det(C)^(eta-1) / c_d times the Jacobian
    # |dC_offdiag / dL_offdiag| = prod_j L_jj^(d-1-j), since row i of C below the diagonal
    # is L[:i, :i] @ L[i, :i] (linear in row i given the rows above).
    d, eta = p["dim"], float(p["concentration"])
    diag = np.diag(L)
    return float(
        np.sum((2 * (eta - 1) + d - 1 - np.arange(d)) * np.log(diag)) - _lkj_log_normalizer(d, eta)
    )


def _lkj_logpdf(p, C):
    d, eta = p["dim"], float(p["concentration"])
    return float((eta - 1) * np.linalg.slogdet(C)[1] - _lkj_log_normalizer(d, eta))


def _lkj_moments(p):
    # each off-diagonal correlation is 2 Beta(b, b) - 1 with b = eta - 1 + d/2
    d, eta = p["dim"], p["concentration"]
    b = eta - 1 + d / 2
    m = d * (d - 1) // 2
    return torch.zeros(m, dtype=F64) + 0 * b, (1 / (2 * b + 1)).expand(m)


def _strict_lower(x):
    d = x.shape[-1]
    rows, cols = torch.tril_indices(d, d, offset=-1)
    return x[..., rows, cols]


def _lower(x):
    d = x.shape[-1]
    rows, cols = torch.tril_indices(d, d)
    return x[..., rows, cols]


def _cauchy_moments(p):
    # f(x) = 1 / (1 + x^2). For X ~ Cauchy(l, s), E[g(X)] = g(l + i s) for g analytic and
    # bounded in the upper half plane; g(w) = 1/(w + i) gives E[f] = -Im g(l + i s) and
    # g(w) = 1/(w + i)^2 gives Re E[g] = E[f] - 2 E[f^2].
    loc = p.get("loc", t(0.0))
    s = p["scale"] + 1
    r2 = loc**2 + s**2
    ef = s / r2
    re_g2 = (loc**2 - s**2) / r2**2  # Re 1/(loc + i s)^2
    ef2 = (ef - re_g2) / 2
    return ef, ef2 - ef**2


def _cauchy_stat(x):
    return (1 / (1 + x**2)).unsqueeze(-1)


def _von_mises_stat(loc):
    return lambda x: torch.cos(x - loc).unsqueeze(-1)


def _von_mises_moments(p):
    k = p["concentration"]
    i0, i1 = torch.special.i0(k), torch.special.i1(k)
    i2 = i0 - 2 * i1 / k
    mean = i1 / i0
    return mean, (1 + i2 / i0) / 2 - mean**2


def _mixture(mixing_probs, loc, scale, validate_args=None):
    return dist.MixtureSameFamily(
        dist.Categorical(probs=mixing_probs, validate_args=validate_args),
        dist.Normal(loc, scale, validate_args=validate_args),
        validate_args=validate_args,
    )


def _mixture_logpdf(p, x):
    w, loc, scale = p["mixing_probs"], p["loc"], p["scale"]
    return sp.logsumexp(np.log(w) + stats.norm(loc, scale).logpdf(x))


def _mixture_moments(p):
    w, loc, scale = p["mixing_probs"], p["loc"], p["scale"]
    mean = (w * loc).sum()
    return mean, (w * (scale**2 + loc**2)).sum() - mean**2


def _ordered_logistic_probs(predictor, cutpoints):
    q = sp.expit(cutpoints - predictor)
    return np.diff(np.concatenate([[0.0], q, [1.0]]))


def _ordered_logistic_moments(p):
    q = torch.sigmoid(p["cutpoints"] - p["predictor"])
    probs = torch.diff(torch.cat([t([0.0]), q, t([1.0])]))
    return _index_moments(probs)


def _index_moments(probs):
    k = torch.arange(len(probs), dtype=F64)
    mean = (probs * k).sum()
    return mean, (probs * k**2).sum() - mean**2


def _zip_logpmf(p, x):
    rate, gate = p["rate"], p["gate"]
    base = np.log1p(-gate) + stats.poisson(rate).logpmf(x)
    return np.logaddexp(np.log(gate), base) if x == 0 else base


def _zinb_logpmf(p, x):
    n, probs, gate = p["total_count"], p["probs"], p["gate"]
    base = np.log1p(-gate) + stats.nbinom(n, 1 - probs).logpmf(x)
    return np.logaddexp(np.log(gate), base) if x == 0 else base


def _zero_inflated_moments(mean, var, gate):
    return (1 - gate) * mean, (1 - gate) * (var + mean**2) - ((1 - gate) * mean) ** 2


# --------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------

_NO_CHECK_BEFORE_CHOLESKY = (
    "the constructor takes the Cholesky factor of the covariance before any check can run "
    "(torch.linalg.LinAlgError, naming no site)"
)

_BERNOULLI_RNG = (
    "Inductor decomposes torch.bernoulli into rand() < p even with fallback_random, so the "
    "random stream differs from eager's"
)

_MVN_L = t([[1.2, 0.0], [0.6, 0.7]])
_MVN_POINTS = [np.array(v) for v in ([0.0, 0.0], [0.3, -1.0], [5.0, -4.0], [-6.0, 6.0])]
_NOT_PD = t([[1.0, 2.0], [2.0, 1.0]])

TABLE: list[Family] = [
    # ---- continuous, univariate ------------------------------------------------------
    Family(
        "Normal",
        {"loc": t(0.5), "scale": t(1.5)},
        _univariate(lambda p: p["loc"], lambda p: p["scale"] ** 2),
        [-20.0, -1.0, 0.5, 2.0, 25.0],
        scipy_ref=lambda p: stats.norm(p["loc"], p["scale"]),
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
    ),
    Family(
        "LogNormal",
        {"loc": t(0.3), "scale": t(0.5)},
        _univariate(
            lambda p: torch.exp(p["loc"] + p["scale"] ** 2 / 2),
            lambda p: torch.expm1(p["scale"] ** 2) * torch.exp(2 * p["loc"] + p["scale"] ** 2),
        ),
        [1e-6, 0.05, 1.0, 2.5, 30.0],
        scipy_ref=lambda p: stats.lognorm(s=p["scale"], scale=np.exp(p["loc"])),
        invalid=[Invalid({"loc": t(0.0), "scale": t(0.0)}, "scale", "GreaterThan")],
    ),
    Family(
        "HalfNormal",
        {"scale": t(1.7)},
        _univariate(
            lambda p: p["scale"] * math.sqrt(2 / math.pi),
            lambda p: p["scale"] ** 2 * (1 - 2 / math.pi),
        ),
        [1e-8, 0.1, 1.0, 4.0, 12.0],
        scipy_ref=lambda p: stats.halfnorm(scale=p["scale"]),
        invalid=[Invalid({"scale": t(-0.5)}, "scale", "GreaterThan")],
    ),
    Family(
        "HalfCauchy",
        {"scale": t(0.8)},
        _cauchy_moments,
        [1e-8, 0.1, 1.0, 10.0, 1e4],
        scipy_ref=lambda p: stats.halfcauchy(scale=p["scale"]),
        stat=_cauchy_stat,
        invalid=[Invalid({"scale": t(-0.5)}, "scale", "GreaterThan")],
        ref_note="moments of 1/(1+x^2) (no finite mean)",
    ),
    Family(
        "Cauchy",
        {"loc": t(0.7), "scale": t(1.3)},
        _cauchy_moments,
        [-1e4, -3.0, 0.7, 2.0, 1e3],
        scipy_ref=lambda p: stats.cauchy(p["loc"], p["scale"]),
        stat=_cauchy_stat,
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
        ref_note="moments of 1/(1+x^2) (no finite mean)",
    ),
    Family(
        "StudentT",
        {"df": t(10.0), "loc": t(-0.4), "scale": t(1.6)},
        _univariate(lambda p: p["loc"], lambda p: p["scale"] ** 2 * p["df"] / (p["df"] - 2)),
        [-50.0, -2.0, -0.4, 1.0, 40.0],
        scipy_ref=lambda p: stats.t(p["df"], p["loc"], p["scale"]),
        invalid=[
            Invalid({"df": t(-1.0), "loc": t(0.0), "scale": t(1.0)}, "df", "GreaterThan"),
        ],
    ),
    Family(
        "Laplace",
        {"loc": t(0.2), "scale": t(0.9)},
        _univariate(lambda p: p["loc"], lambda p: 2 * p["scale"] ** 2),
        [-30.0, -1.0, 0.2, 0.2001, 15.0],
        scipy_ref=lambda p: stats.laplace(p["loc"], p["scale"]),
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
    ),
    Family(
        "Gumbel",
        {"loc": t(1.0), "scale": t(2.0)},
        _univariate(
            lambda p: p["loc"] + EULER * p["scale"], lambda p: (math.pi * p["scale"]) ** 2 / 6
        ),
        [-8.0, -1.0, 1.0, 5.0, 40.0],
        scipy_ref=lambda p: stats.gumbel_r(p["loc"], p["scale"]),
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
    ),
    Family(
        "Logistic",
        {"loc": t(-1.0), "scale": t(0.7)},
        _univariate(lambda p: p["loc"], lambda p: (math.pi * p["scale"]) ** 2 / 3),
        [-40.0, -3.0, -1.0, 0.5, 30.0],
        scipy_ref=lambda p: stats.logistic(p["loc"], p["scale"]),
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
    ),
    Family(
        "SoftLaplace",
        {"loc": t(0.5), "scale": t(1.2)},
        _univariate(lambda p: p["loc"], lambda p: (math.pi / 2 * p["scale"]) ** 2),
        [-40.0, -2.0, 0.5, 3.0, 30.0],
        scipy_ref=lambda p: stats.hypsecant(p["loc"], p["scale"]),
        invalid=[Invalid({"loc": t(0.0), "scale": t(-1.0)}, "scale", "GreaterThan")],
        ref_note="hyperbolic secant: 1/(pi cosh z) = 2/(pi (e^z + e^-z))",
    ),
    Family(
        "AsymmetricLaplace",
        {"loc": t(0.3), "scale": t(1.1), "asymmetry": t(1.8)},
        lambda p: _asymmetric_laplace_moments(p),
        [-30.0, -1.0, 0.3, 1.0, 20.0],
        scipy_ref=lambda p: stats.laplace_asymmetric(p["asymmetry"], p["loc"], p["scale"]),
        invalid=[
            Invalid(
                {"loc": t(0.0), "scale": t(1.0), "asymmetry": t(-1.0)}, "asymmetry", "GreaterThan"
            )
        ],
        ref_note="left scale = scale*asymmetry, right scale = scale/asymmetry",
    ),
    Family(
        "SkewLogistic",
        {"loc": t(0.4), "scale": t(0.8), "asymmetry": t(2.5)},
        _univariate(
            lambda p: (
                p["loc"] + p["scale"] * (torch.digamma(p["asymmetry"]) - torch.digamma(t(1.0)))
            ),
            lambda p: p["scale"] ** 2 * (math.pi**2 / 6 + torch.polygamma(1, p["asymmetry"])),
        ),
        [-30.0, -2.0, 0.4, 2.0, 30.0],
        scipy_ref=lambda p: stats.genlogistic(p["asymmetry"], p["loc"], p["scale"]),
        invalid=[
            Invalid({"loc": t(0.0), "scale": t(-1.0), "asymmetry": t(1.0)}, "scale", "GreaterThan")
        ],
        ref_note="type I generalized logistic (scipy genlogistic, c = asymmetry)",
    ),
    Family(
        "Exponential",
        {"rate": t(2.5)},
        _univariate(lambda p: 1 / p["rate"], lambda p: 1 / p["rate"] ** 2),
        [0.0, 1e-8, 0.4, 3.0, 20.0],
        scipy_ref=lambda p: stats.expon(scale=1 / p["rate"]),
        invalid=[Invalid({"rate": t(-2.0)}, "rate", "GreaterThan")],
    ),
    Family(
        "Gamma",
        {"concentration": t(2.5), "rate": t(1.5)},
        _univariate(
            lambda p: p["concentration"] / p["rate"], lambda p: p["concentration"] / p["rate"] ** 2
        ),
        [1e-8, 0.01, 1.0, 3.0, 40.0],
        scipy_ref=lambda p: stats.gamma(p["concentration"], scale=1 / p["rate"]),
        invalid=[
            Invalid({"concentration": t(-1.0), "rate": t(1.0)}, "concentration", "GreaterThan")
        ],
    ),
    Family(
        "InverseGamma",
        {"concentration": t(6.0), "rate": t(2.0)},
        _univariate(
            lambda p: p["rate"] / (p["concentration"] - 1),
            lambda p: p["rate"] ** 2 / ((p["concentration"] - 1) ** 2 * (p["concentration"] - 2)),
        ),
        [1e-3, 0.05, 0.4, 2.0, 100.0],
        scipy_ref=lambda p: stats.invgamma(p["concentration"], scale=p["rate"]),
        invalid=[Invalid({"concentration": t(2.0), "rate": t(-1.0)}, "rate", "GreaterThan")],
    ),
    Family(
        "Chi2",
        {"df": t(3.5)},
        _univariate(lambda p: p["df"], lambda p: 2 * p["df"]),
        [1e-8, 0.1, 3.0, 10.0, 80.0],
        scipy_ref=lambda p: stats.chi2(p["df"]),
        invalid=[Invalid({"df": t(-3.0)}, "df", "GreaterThan")],
    ),
    Family(
        "Beta",
        {"concentration1": t(2.5), "concentration0": t(1.5)},
        lambda p: _beta_moments(p["concentration1"], p["concentration0"]),
        [1e-6, 0.1, 0.5, 0.9, 1 - 1e-6],
        scipy_ref=lambda p: stats.beta(p["concentration1"], p["concentration0"]),
        invalid=[
            Invalid(
                {"concentration1": t(0.0), "concentration0": t(1.0)},
                "concentration1",
                "GreaterThan",
            )
        ],
    ),
    Family(
        "AffineBeta",
        {
            "concentration1": t(2.0),
            "concentration0": t(3.0),
            "loc": t(-1.0),
            "scale": t(4.0),
        },
        lambda p: _affine(_beta_moments(p["concentration1"], p["concentration0"]), p),
        [-1 + 1e-6, -0.5, 1.0, 2.9, 3 - 1e-6],
        scipy_ref=lambda p: stats.beta(
            p["concentration1"], p["concentration0"], p["loc"], p["scale"]
        ),
        invalid=[
            Invalid(
                {
                    "concentration1": t(2.0),
                    "concentration0": t(3.0),
                    "loc": t(0.0),
                    "scale": t(-1.0),
                },
                "scale",
                "GreaterThan",
            )
        ],
    ),
    Family(
        "Kumaraswamy",
        {"concentration1": t(2.0), "concentration0": t(3.5)},
        _kumaraswamy_moments,
        [1e-6, 0.1, 0.5, 0.9, 1 - 1e-6],
        hand_ref=_kumaraswamy_logpdf,
        invalid=[
            Invalid(
                {"concentration1": t(-2.0), "concentration0": t(1.0)},
                "concentration1",
                "GreaterThan",
            )
        ],
        ref_note="hand: log a + log b + (a-1) log x + (b-1) log(1 - x^a); E X^n = b B(1+n/a, b)",
    ),
    Family(
        "Uniform",
        {"low": t(-1.5), "high": t(2.5)},
        _univariate(
            lambda p: (p["low"] + p["high"]) / 2, lambda p: (p["high"] - p["low"]) ** 2 / 12
        ),
        [-1.5, -1.5 + 1e-9, 0.0, 2.5 - 1e-9],
        scipy_ref=lambda p: stats.uniform(p["low"], p["high"] - p["low"]),
        invalid=[Invalid({"low": t(1.0), "high": t(0.0)}, "low", "LessThan")],
    ),
    Family(
        "Weibull",
        {"scale": t(1.5), "concentration": t(2.2)},
        _univariate(
            lambda p: p["scale"] * torch.exp(torch.lgamma(1 + 1 / p["concentration"])),
            lambda p: (
                p["scale"] ** 2
                * (
                    torch.exp(torch.lgamma(1 + 2 / p["concentration"]))
                    - torch.exp(2 * torch.lgamma(1 + 1 / p["concentration"]))
                )
            ),
        ),
        [1e-6, 0.1, 1.0, 3.0, 8.0],
        scipy_ref=lambda p: stats.weibull_min(p["concentration"], scale=p["scale"]),
        invalid=[Invalid({"scale": t(1.0), "concentration": t(-1.0)}, "concentration", "Greater")],
        ref_note="Weibull(scale, concentration) -> weibull_min(c=concentration, scale=scale)",
    ),
    Family(
        "Pareto",
        {"scale": t(1.5), "alpha": t(9.0)},
        _univariate(
            lambda p: p["alpha"] * p["scale"] / (p["alpha"] - 1),
            lambda p: p["scale"] ** 2 * p["alpha"] / ((p["alpha"] - 1) ** 2 * (p["alpha"] - 2)),
        ),
        [1.5, 1.5 + 1e-8, 2.0, 5.0, 100.0],
        scipy_ref=lambda p: stats.pareto(p["alpha"], scale=p["scale"]),
        invalid=[Invalid({"scale": t(1.0), "alpha": t(-2.0)}, "alpha", "GreaterThan")],
        ref_note="Pareto(scale, alpha) -> pareto(b=alpha, scale=scale)",
    ),
    Family(
        "FisherSnedecor",
        {"df1": t(5.0), "df2": t(12.0)},
        _univariate(
            lambda p: p["df2"] / (p["df2"] - 2),
            lambda p: (
                2
                * p["df2"] ** 2
                * (p["df1"] + p["df2"] - 2)
                / (p["df1"] * (p["df2"] - 2) ** 2 * (p["df2"] - 4))
            ),
        ),
        [1e-6, 0.1, 1.0, 4.0, 50.0],
        scipy_ref=lambda p: stats.f(p["df1"], p["df2"]),
        invalid=[Invalid({"df1": t(-1.0), "df2": t(3.0)}, "df1", "GreaterThan")],
    ),
    Family(
        "VonMises",
        {"loc": t(0.5), "concentration": t(2.0)},
        _von_mises_moments,
        [-math.pi, -2.0, 0.5, 2.0, math.pi - 1e-9],
        scipy_ref=lambda p: stats.vonmises(p["concentration"], p["loc"]),
        stat=_von_mises_stat(0.5),
        invalid=[
            Invalid({"loc": t(0.0), "concentration": t(-1.0)}, "concentration", "GreaterThan")
        ],
        sampler_reason="rejection sampler: a Python while loop on a data-dependent condition",
        ref_note="moments of cos(x - loc): I1/I0 and (1 + I2/I0)/2 - (I1/I0)^2",
    ),
    Family(
        "ContinuousBernoulli",
        {"probs": t(0.3)},
        _continuous_bernoulli_moments,
        [0.0, 1e-8, 0.3, 0.7, 1.0],
        hand_ref=_continuous_bernoulli_logpdf,
        invalid=[Invalid({"probs": t(1.5)}, "probs", "Interval")],
        ref_note="hand: C(l) l^x (1-l)^(1-x), C(l) = 2 atanh(1-2l)/(1-2l)",
    ),
    Family(
        "RelaxedBernoulli",
        {"temperature": t(0.7), "probs": t(0.35)},
        lambda p: (
            torch.logit(p["probs"]) / p["temperature"],
            math.pi**2 / 3 / p["temperature"] ** 2,
        ),
        [1e-6, 0.1, 0.5, 0.9, 1 - 1e-6],
        hand_ref=_relaxed_bernoulli_logpdf,
        stat=_logit_stat,
        invalid=[
            Invalid({"temperature": t(1.0), "probs": t(-0.1)}, "probs", "Interval"),
        ],
        ref_note="hand: binary Concrete density; logit(x) ~ (logit p + Logistic(0,1)) / T",
    ),
    Family(
        "MixtureSameFamily",
        {"mixing_probs": t([0.2, 0.5, 0.3]), "loc": t([-2.0, 0.0, 3.0]), "scale": t([0.5, 1, 2])},
        _mixture_moments,
        [-10.0, -2.0, 0.0, 3.0, 15.0],
        hand_ref=_mixture_logpdf,
        make=_mixture,
        invalid=[
            Invalid(
                {"mixing_probs": t([0.5, 0.5]), "loc": t([0.0, 1.0]), "scale": t([1.0, -1.0])},
                "scale",
                "GreaterThan",
            )
        ],
        ref_note="hand: logsumexp(log w + scipy norm.logpdf), Categorical x Normal",
    ),
    # ---- continuous, multivariate ----------------------------------------------------
    Family(
        "MultivariateNormal",
        {"loc": t([0.5, -1.0]), "scale_tril": _MVN_L},
        lambda p: (p["loc"], (p["scale_tril"] ** 2).sum(-1)),
        _MVN_POINTS,
        scipy_ref=lambda p: stats.multivariate_normal(
            p["loc"], p["scale_tril"] @ p["scale_tril"].T
        ),
        invalid=[
            Invalid(
                {"loc": t([0.0, 0.0]), "covariance_matrix": _NOT_PD},
                "covariance_matrix",
                "PositiveDefinite",
                site_check_reason=_NO_CHECK_BEFORE_CHOLESKY,
            )
        ],
    ),
    Family(
        "LowRankMultivariateNormal",
        {"loc": t([1.0, 0.0]), "cov_factor": t([[0.8], [-0.5]]), "cov_diag": t([0.4, 0.9])},
        lambda p: (p["loc"], (p["cov_factor"] ** 2).sum(-1) + p["cov_diag"]),
        _MVN_POINTS,
        scipy_ref=lambda p: stats.multivariate_normal(
            p["loc"], p["cov_factor"] @ p["cov_factor"].T + np.diag(p["cov_diag"])
        ),
        invalid=[
            Invalid(
                {"loc": t([0.0, 0.0]), "cov_factor": t([[1.0], [1.0]]), "cov_diag": t([1, -1.0])},
                "cov_diag",
                "GreaterThan",
            )
        ],
    ),
    Family(
        "MultivariateStudentT",
        {"df": t(9.0), "loc": t([0.5, -1.0]), "scale_tril": _MVN_L},
        lambda p: (p["loc"], p["df"] / (p["df"] - 2) * (p["scale_tril"] ** 2).sum(-1)),
        _MVN_POINTS + [np.array([30.0, -40.0])],
        scipy_ref=lambda p: stats.multivariate_t(
            p["loc"], p["scale_tril"] @ p["scale_tril"].T, df=float(p["df"])
        ),
        invalid=[
            Invalid(
                {"df": t(-1.0), "loc": t([0.0, 0.0]), "scale_tril": _MVN_L}, "df", "GreaterThan"
            )
        ],
    ),
    Family(
        "Dirichlet",
        {"concentration": t([2.0, 0.7, 3.0])},
        lambda p: (
            p["concentration"] / p["concentration"].sum(),
            p["concentration"]
            * (p["concentration"].sum() - p["concentration"])
            / (p["concentration"].sum() ** 2 * (p["concentration"].sum() + 1)),
        ),
        [
            np.array(v)
            for v in (
                [0.2, 0.3, 0.5],
                [1e-6, 0.5, 0.5 - 1e-6],
                [0.98, 1e-3, 0.019],
                [0.3, 0.6, 0.1],
            )
        ],
        scipy_ref=lambda p: stats.dirichlet(p["concentration"]),
        invalid=[Invalid({"concentration": t([1.0, -1.0, 1.0])}, "concentration", "GreaterThan")],
    ),
    Family(
        "LogisticNormal",
        {"loc": t([0.3, -0.5]), "scale": t([0.8, 1.2])},
        lambda p: (p["loc"], p["scale"] ** 2),
        [np.array(v) for v in ([0.2, 0.3, 0.5], [1e-4, 0.5, 0.5 - 1e-4], [0.98, 1e-3, 0.019])],
        hand_ref=_logistic_normal_logpdf,
        stat=_logistic_normal_stat,
        invalid=[Invalid({"loc": t([0.0, 0.0]), "scale": t([1.0, -1.0])}, "scale", "GreaterThan")],
        ref_note=(
            "hand: Normal density of the inverse stick-breaking map (with torch's offset "
            "log(K - i)) times its triangular Jacobian; the statistic is that inverse map"
        ),
    ),
    Family(
        "Wishart",
        {"df": t(5.0), "scale_tril": _MVN_L},
        lambda p: _wishart_moments(p),
        [np.array(v) for v in ([[1.0, 0.2], [0.2, 2.0]], [[8.0, -3.0], [-3.0, 4.0]])]
        + [np.array([[1e-3, 0.0], [0.0, 1e-3]]), np.array([[30.0, 10.0], [10.0, 20.0]])],
        scipy_ref=lambda p: stats.wishart(float(p["df"]), p["scale_tril"] @ p["scale_tril"].T),
        stat=_lower,
        invalid=[
            Invalid(
                {"df": t(5.0), "covariance_matrix": _NOT_PD},
                "covariance_matrix",
                "Positive",
                site_check_reason=_NO_CHECK_BEFORE_CHOLESKY,
            ),
            Invalid(
                {"df": t(0.5), "scale_tril": _MVN_L},
                "df",
                "GreaterThan",
                site_check_reason="the constructor checks df > dim - 1 even with "
                "validate_args=False and raises a ValueError naming no site",
            ),
        ],
        sampler_reason=(
            "the constructor checks df > dim - 1 with a data-dependent branch, and rsample "
            "re-draws singular samples in a loop guarded by `if is_singular.any():`"
        ),
        ref_note="moments of the lower triangle: E X = df S, Var X_ij = df (S_ij^2 + S_ii S_jj)",
    ),
    Family(
        "LKJCholesky",
        {"dim": 3, "concentration": t(2.0)},
        _lkj_moments,
        [
            np.linalg.cholesky(np.array(c))
            for c in (
                [[1, 0.3, -0.2], [0.3, 1, 0.5], [-0.2, 0.5, 1]],
                [[1, 0.95, 0.9], [0.95, 1, 0.94], [0.9, 0.94, 1]],
                np.eye(3),
            )
        ],
        hand_ref=_lkj_cholesky_logpdf,
        stat=_strict_lower,
        invalid=[Invalid({"dim": 3, "concentration": t(-1.0)}, "concentration", "GreaterThan")],
        ref_note=(
            "hand: det(C)^(eta-1)/c_d (Lewandowski et al. 2009, eq. 16) times the Jacobian "
            "prod_j L_jj^(d-1-j); moments of off-diagonals: 2 Beta(b, b) - 1, b = eta-1+d/2"
        ),
    ),
    Family(
        "LKJ",
        {"dim": 3, "concentration": t(0.8)},
        _lkj_moments,
        [
            np.array(c)
            for c in (
                [[1, 0.3, -0.2], [0.3, 1, 0.5], [-0.2, 0.5, 1]],
                [[1, 0.95, 0.9], [0.95, 1, 0.94], [0.9, 0.94, 1]],
                np.eye(3),
            )
        ],
        hand_ref=_lkj_logpdf,
        stat=_strict_lower,
        invalid=[Invalid({"dim": 3, "concentration": t(-1.0)}, "concentration", "GreaterThan")],
        ref_note="hand: det(C)^(eta-1)/c_d, density of the off-diagonal correlations",
    ),
    # ---- discrete --------------------------------------------------------------------
    Family(
        "Bernoulli",
        {"probs": t(0.3)},
        _univariate(lambda p: p["probs"], lambda p: p["probs"] * (1 - p["probs"])),
        [0.0, 1.0],
        scipy_ref=lambda p: stats.bernoulli(p["probs"]),
        compiled_rng_reason=_BERNOULLI_RNG,
        invalid=[Invalid({"probs": t(1.2)}, "probs", "Interval")],
    ),
    Family(
        "Binomial",
        {"total_count": t(12.0), "probs": t(0.35)},
        _univariate(
            lambda p: p["total_count"] * p["probs"],
            lambda p: p["total_count"] * p["probs"] * (1 - p["probs"]),
        ),
        [0.0, 1.0, 4.0, 11.0, 12.0],
        scipy_ref=lambda p: stats.binom(p["total_count"], p["probs"]),
        invalid=[Invalid({"total_count": t(5.0), "probs": t(-0.1)}, "probs", "Interval")],
    ),
    Family(
        "Poisson",
        {"rate": t(3.5)},
        _univariate(lambda p: p["rate"], lambda p: p["rate"]),
        [0.0, 1.0, 3.0, 10.0, 40.0],
        scipy_ref=lambda p: stats.poisson(p["rate"]),
        invalid=[Invalid({"rate": t(-1.0)}, "rate", "GreaterThan")],
    ),
    Family(
        "Geometric",
        {"probs": t(0.3)},
        _univariate(
            lambda p: (1 - p["probs"]) / p["probs"], lambda p: (1 - p["probs"]) / p["probs"] ** 2
        ),
        [0.0, 1.0, 5.0, 40.0],
        scipy_ref=lambda p: stats.geom(p["probs"], loc=-1),
        invalid=[Invalid({"probs": t(1.5)}, "probs", "Interval")],
        ref_note="torch counts failures before the first success: geom(p, loc=-1)",
    ),
    Family(
        "NegativeBinomial",
        {"total_count": t(4.5), "probs": t(0.4)},
        _univariate(
            lambda p: p["total_count"] * p["probs"] / (1 - p["probs"]),
            lambda p: p["total_count"] * p["probs"] / (1 - p["probs"]) ** 2,
        ),
        [0.0, 1.0, 3.0, 20.0, 60.0],
        scipy_ref=lambda p: stats.nbinom(p["total_count"], 1 - p["probs"]),
        invalid=[
            Invalid({"total_count": t(-1.0), "probs": t(0.5)}, "total_count", "GreaterThanEq")
        ],
        ref_note="torch's probs is the probability of the counted event: nbinom(n, 1 - probs)",
    ),
    Family(
        "GammaPoisson",
        {"concentration": t(2.5), "rate": t(0.8)},
        _univariate(
            lambda p: p["concentration"] / p["rate"],
            lambda p: p["concentration"] / p["rate"] * (1 + 1 / p["rate"]),
        ),
        [0.0, 1.0, 3.0, 20.0, 60.0],
        scipy_ref=lambda p: stats.nbinom(p["concentration"], p["rate"] / (1 + p["rate"])),
        invalid=[Invalid({"concentration": t(2.0), "rate": t(-1.0)}, "rate", "GreaterThan")],
        ref_note="Poisson(Gamma(c, r)) = nbinom(n=c, p=r/(1+r))",
    ),
    Family(
        "BetaBinomial",
        {"concentration1": t(2.0), "concentration0": t(3.5), "total_count": t(10.0)},
        lambda p: _beta_binomial_moments(
            p["concentration1"], p["concentration0"], p["total_count"]
        ),
        [0.0, 1.0, 5.0, 10.0],
        scipy_ref=lambda p: stats.betabinom(
            p["total_count"], p["concentration1"], p["concentration0"]
        ),
        invalid=[
            Invalid(
                {"concentration1": t(-2.0), "concentration0": t(1.0), "total_count": t(3.0)},
                "concentration1",
                "GreaterThan",
            )
        ],
    ),
    Family(
        "ZeroInflatedPoisson",
        {"rate": t(3.0), "gate": t(0.25)},
        lambda p: _zero_inflated_moments(p["rate"], p["rate"], p["gate"]),
        [0.0, 1.0, 3.0, 15.0],
        hand_ref=_zip_logpmf,
        compiled_rng_reason=_BERNOULLI_RNG + " (the gate is a Bernoulli draw)",
        invalid=[Invalid({"rate": t(1.0), "gate": t(1.5)}, "gate", "Interval")],
        ref_note="hand: log(gate + (1-gate) e^-rate) at 0, log(1-gate) + Poisson logpmf elsewhere",
    ),
    Family(
        "ZeroInflatedNegativeBinomial",
        {"total_count": t(3.0), "probs": t(0.6), "gate": t(0.3)},
        lambda p: _zero_inflated_moments(
            p["total_count"] * p["probs"] / (1 - p["probs"]),
            p["total_count"] * p["probs"] / (1 - p["probs"]) ** 2,
            p["gate"],
        ),
        [0.0, 1.0, 4.0, 30.0],
        hand_ref=_zinb_logpmf,
        compiled_rng_reason=_BERNOULLI_RNG + " (the gate is a Bernoulli draw)",
        invalid=[
            Invalid({"total_count": t(3.0), "probs": t(0.5), "gate": t(-0.5)}, "gate", "Interval")
        ],
        ref_note="hand: zero inflation of scipy nbinom(n, 1 - probs)",
    ),
    Family(
        "Categorical",
        {"probs": t([0.1, 0.2, 0.3, 0.4])},
        lambda p: _index_moments(p["probs"]),
        [0.0, 1.0, 2.0, 3.0],
        scipy_ref=lambda p: stats.rv_discrete(values=(np.arange(len(p["probs"])), p["probs"])),
        invalid=[Invalid({"probs": t([0.5, -0.1, 0.6])}, "probs", "Simplex")],
        ref_note="torch renormalizes probs, so only a negative entry is invalid",
    ),
    Family(
        "OrderedLogistic",
        {"predictor": t(0.4), "cutpoints": t([-1.0, 0.5, 2.0])},
        _ordered_logistic_moments,
        [0.0, 1.0, 2.0, 3.0],
        scipy_ref=lambda p: stats.rv_discrete(
            values=(np.arange(4), _ordered_logistic_probs(p["predictor"], p["cutpoints"]))
        ),
        invalid=[
            Invalid({"predictor": t(0.0), "cutpoints": t([1.0, -1.0])}, "cutpoints", "Ordered")
        ],
        ref_note="scipy rv_discrete over the sigmoid differences of the cutpoints",
    ),
    Family(
        "OneHotCategorical",
        {"probs": t([0.2, 0.5, 0.3])},
        lambda p: (p["probs"], p["probs"] * (1 - p["probs"])),
        [np.array(v) for v in ([1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0])],
        scipy_ref=lambda p: stats.multinomial(1, p["probs"]),
        invalid=[Invalid({"probs": t([0.5, -0.1, 0.6])}, "probs", "Simplex")],
    ),
    Family(
        "Multinomial",
        {"total_count": 7, "probs": t([0.2, 0.5, 0.3])},
        lambda p: (
            p["total_count"] * p["probs"],
            p["total_count"] * p["probs"] * (1 - p["probs"]),
        ),
        [np.array(v) for v in ([7.0, 0, 0], [2.0, 3, 2], [0, 0, 7.0], [1.0, 5, 1])],
        scipy_ref=lambda p: stats.multinomial(p["total_count"], p["probs"]),
        invalid=[Invalid({"total_count": 3, "probs": t([0.5, -0.1, 0.6])}, "probs", "Simplex")],
    ),
    Family(
        "DirichletMultinomial",
        {"concentration": t([1.5, 0.5, 3.0]), "total_count": t(6.0)},
        lambda p: _dirichlet_multinomial_moments(p),
        [np.array(v) for v in ([6.0, 0, 0], [2.0, 2, 2], [0, 0, 6.0], [1.0, 0, 5])],
        scipy_ref=lambda p: stats.dirichlet_multinomial(p["concentration"], int(p["total_count"])),
        sampler_reason="sample reads int(total_count.max()) and branches on it (data-dependent)",
        invalid=[
            Invalid(
                {"concentration": t([1.0, -1.0, 1.0]), "total_count": t(3.0)},
                "concentration",
                "GreaterThan",
            )
        ],
    ),
]


def _asymmetric_laplace_moments(p):
    left, right = p["scale"] * p["asymmetry"], p["scale"] / p["asymmetry"]
    total = left + right
    mean = p["loc"] + (right**2 - left**2) / total
    # mixture: loc - Exp(left) w.p. left/total, loc + Exp(right) w.p. right/total
    second = (left * 2 * left**2 + right * 2 * right**2) / total
    return mean, second - ((right**2 - left**2) / total) ** 2


def _wishart_moments(p):
    cov = p["scale_tril"] @ p["scale_tril"].T
    var = p["df"] * (cov**2 + torch.outer(torch.diagonal(cov), torch.diagonal(cov)))
    return p["df"] * _lower(cov), _lower(var)


def _dirichlet_multinomial_moments(p):
    a, n = p["concentration"], p["total_count"]
    a0 = a.sum()
    q = a / a0
    return n * q, n * q * (1 - q) * (n + a0) / (1 + a0)


FAMILIES = {row.name: row for row in TABLE}
