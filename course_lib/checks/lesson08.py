"""Checks for the lesson 08 exercises (FAVOR+: positive random features, orthogonal random matrices)."""

import numpy as np

from course_lib.checks import Exercise, Mistake
from course_lib.numpy import performer


def _gaussians(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape)


# --- Exercise 8.1: positive random features ---------------------------------------------------

def _positive_reference(x, omega):
    phi = performer.positive_features(x, omega)  # (..., n, f)
    return phi, phi @ np.swapaxes(phi, -1, -2)  # (..., n, n): estimates of exp(x_iᵀx_j)


def _positive(*, half_norm=-0.5, divide=True):
    """The exercise's function, made with one slip."""
    def features(x, omega):
        m = omega.shape[-2]
        phi = np.exp(x @ omega.T + half_norm * np.sum(x * x, axis=-1, keepdims=True))  # (..., n, f)
        phi = phi / np.sqrt(m) if divide else phi
        return phi, phi @ np.swapaxes(phi, -1, -2)
    return features


MISTAKES_8_1 = (
    Mistake("missing-half-norm", _positive(half_norm=0.0),
            "phi(x) = exp(ωᵀx − ‖x‖²/2) / √m: without the − ‖x‖²/2 term E[phi(x)·phi(y)] is "
            "exp(xᵀy + ‖x‖²/2 + ‖y‖²/2), not exp(xᵀy) (Eq. 8.4, Lemma 1)."),
    Mistake("plus-half-norm", _positive(half_norm=0.5),
            "the norm term has the wrong sign: subtract ‖x‖²/2 (it is exp(‖x‖²/2) only in the trig features)."),
    Mistake("missing-1/sqrt(m)", _positive(divide=False),
            "divide by √m: phi(x)·phi(y) averages m terms, so each feature carries 1/√m (the estimate is "
            "m times too large otherwise)."),
)


def _cases_8_1():
    return [
        ("n = 4, d = 3, m = 5", (0.5 * _gaussians(81, 4, 3), _gaussians(82, 5, 3)), {}),
        ("n = 10, d = 8, m = 16", (0.3 * _gaussians(83, 10, 8), _gaussians(84, 16, 8)), {}),
        ("batched (2, 3), n = 6, d = 4, m = 8", (0.5 * _gaussians(85, 2, 3, 6, 4), _gaussians(86, 8, 4)), {}),
    ]


exercise_8_1 = Exercise("8.1", "positive random features", _positive_reference, _cases_8_1, MISTAKES_8_1,
                        names=("phi", "kernel_estimate"))


# --- Exercise 8.2: an orthogonal random matrix ------------------------------------------------

def _orthogonal_reference(gaussian_blocks, chi_samples):
    m = chi_samples.shape[0]
    blocks = []
    for g in gaussian_blocks:  # (d, d) each
        q, r = np.linalg.qr(g)
        blocks.append((q * np.sign(np.diag(r))).T)  # rows orthonormal
    directions = np.concatenate(blocks)[:m]  # (f, d)
    norms = np.linalg.norm(chi_samples, axis=-1)  # (f,): χ_d-distributed
    return directions, norms, directions * norms[:, None]


def _orthogonal(*, orthogonalise=True, transpose=True, sign_fix=True, scale=True):
    """The exercise's function, made with one slip."""
    def matrix(gaussian_blocks, chi_samples):
        m, blocks = chi_samples.shape[0], []
        for g in gaussian_blocks:
            if orthogonalise:
                q, r = np.linalg.qr(g)
                q = q * np.sign(np.diag(r)) if sign_fix else q
                blocks.append(q.T if transpose else q)
            else:
                blocks.append(g / np.linalg.norm(g, axis=-1, keepdims=True))
        directions = np.concatenate(blocks)[:m]
        norms = np.linalg.norm(chi_samples, axis=-1) if scale else np.ones(m)
        return directions, norms, directions * norms[:, None]
    return matrix


MISTAKES_8_2 = (
    Mistake("not-orthogonal", _orthogonal(orthogonalise=False),
            "the rows are normalised Gaussian rows but not orthogonal to each other: take the Q factor of "
            "np.linalg.qr of each Gaussian block (§2.4, orthogonal random features)."),
    Mistake("norms-all-one", _orthogonal(scale=False),
            "every row has norm 1: rescale row i by the norm of chi_samples[i] (a χ_d sample), so each row is "
            "marginally N(0, I_d) like an i.i.d. Gaussian row and the estimator stays unbiased."),
    Mistake("columns-not-rows", _orthogonal(transpose=False),
            "you took the columns of Q as the rows of ω: take the rows of Qᵀ (Q.T), as the sign fix "
            "multiplies Q's columns."),
    Mistake("no-sign-fix", _orthogonal(sign_fix=False),
            "multiply Q's columns by sign(diag(R)) before transposing: np.linalg.qr's sign convention "
            "otherwise makes the blocks not uniformly (Haar) distributed (Mezzadri 2007)."),
)


def _cases_8_2():
    return [
        ("m = d = 4 (one block)", (_gaussians(87, 1, 4, 4), _gaussians(88, 4, 4)), {}),
        ("m = 10, d = 4 (three blocks, the last truncated)", (_gaussians(89, 3, 4, 4), _gaussians(90, 10, 4)), {}),
        ("m = 16, d = 8 (two blocks)", (_gaussians(91, 2, 8, 8), _gaussians(92, 16, 8)), {}),
    ]


exercise_8_2 = Exercise("8.2", "an orthogonal random matrix", _orthogonal_reference, _cases_8_2, MISTAKES_8_2,
                        names=("directions", "norms", "omega"))

EXERCISES = [exercise_8_1, exercise_8_2]
