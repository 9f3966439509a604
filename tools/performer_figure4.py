"""Write ``course_lib/data/performer_figure4.npz``: the Performer paper's Figure 4 setting, stored for notebook 08.

    .venv/bin/python tools/performer_figure4.py [--out PATH] [--samples 20]

Choromanski et al. 2020, Figure 4: mean squared error of FAVOR attention's output against exact
softmax attention for L = 4,096 positions, d = 16, m random features varied, 15 draws of ω per
point; orthogonal versus i.i.d. rows, positive versus trigonometric features.  Here m runs from
16 to 1,024 with 20 draws per point.  Queries and keys have N(0, σ²) entries, values N(0, 1)
(the paper does not state its inputs; σ = 0.5 and σ = 1 are stored).  Beside the estimators,
the two trivial answers every error is read against: outputting zeros (MSE = mean of the exact
output squared) and uniform attention, the mean of V for every query.

Everything in float64 with ``course_lib.torch`` on one thread (one seeded ``torch.Generator``).
The stored file took 944 s (``seconds``) on the shared 2-core machine under a load of about 15;
most of it is m = 1,024, and a quiet machine runs it several times faster.  Saved arrays: ``ms (M,)``, ``sigmas (S,)``,
``mse (S, 2 features, 2 orthogonal, M, samples)`` with features order ``("positive", "trig")``
and orthogonal order ``(True, False)``; ``zero_mse (S,)``, ``uniform_mse (S,)``; ``z_sq (S,)``,
the median of ‖x + y‖² over all query-key pairs (x = q d^(-1/4), y = k d^(-1/4): Lemma 2's
exponent); ``L``, ``d``, ``seconds`` (the run's wall time).
"""

import argparse
import time

import numpy as np
import torch

from course_lib.torch import full, performer

L, D, MS, SIGMAS = 4096, 16, (16, 32, 64, 128, 256, 512, 1024), (0.5, 1.0)
FEATURES, ORTHOGONAL = ("positive", "trig"), (True, False)


def median_z_sq(q, k):
    """Median of ‖x_i + y_j‖² over every pair, x = q d^(-1/4), y = k d^(-1/4) (Lemma 2's e^{‖z‖²})."""
    x, y = q * D**-0.25, k * D**-0.25
    z_sq = x.square().sum(-1)[:, None] + y.square().sum(-1)[None, :] + 2 * x @ y.T  # (n, s)
    return z_sq.median().item()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="course_lib/data/performer_figure4.npz")
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(2009)
    mse = np.zeros((len(SIGMAS), len(FEATURES), len(ORTHOGONAL), len(MS), args.samples))
    zero, uniform, z_sq = (np.zeros(len(SIGMAS)) for _ in range(3))
    for a, sigma in enumerate(SIGMAS):
        q, k = (sigma * torch.randn(L, D, generator=gen, dtype=torch.float64) for _ in range(2))  # (n, d)
        v = torch.randn(L, D, generator=gen, dtype=torch.float64)  # (s, e)
        exact = full.softmax_attention(q, k, v)  # (n, e)
        zero[a] = exact.square().mean().item()
        uniform[a] = (v.mean(dim=0) - exact).square().mean().item()
        z_sq[a] = median_z_sq(q, k)
        print(f"sigma {sigma}: zeros {zero[a]:.3g}, uniform attention {uniform[a]:.3g}, median |z|^2 {z_sq[a]:.2f}")
        for b, features in enumerate(FEATURES):
            for c, orthogonal in enumerate(ORTHOGONAL):
                for i, m in enumerate(MS):
                    for j in range(args.samples):
                        omega = performer.random_matrix(m, D, gen, orthogonal=orthogonal, dtype=torch.float64)
                        out = performer.performer_attention(q, k, v, omega, features=features)
                        mse[a, b, c, i, j] = (out - exact).square().mean().item()
                    print(f"sigma {sigma} {features:>8} orthogonal={orthogonal!s:>5} m = {m:>4}: "
                          f"mean MSE {mse[a, b, c, i].mean():.3g}", flush=True)
    seconds = time.perf_counter() - start
    np.savez(args.out, ms=np.array(MS), sigmas=np.array(SIGMAS), mse=mse, zero_mse=zero, uniform_mse=uniform,
             z_sq=z_sq, L=L, d=D, seconds=seconds)
    print(f"wrote {args.out} in {seconds:.0f} s")


if __name__ == "__main__":
    main()
