"""Write ``course_lib/data/performer_figure4.npz``: the Performer paper's Figure 4 setting, stored for notebook 08.

    .venv/bin/python tools/performer_figure4.py [--out PATH] [--samples 15]

Choromanski et al. 2020, Figure 4: mean squared error of FAVOR attention's output against exact
softmax attention for L = 4,096 positions, d = 16, m random features varied, 15 draws of ω per
point; orthogonal versus i.i.d. rows, positive versus trigonometric features.  Queries and keys
have N(0, σ²) entries, values N(0, 1) (the paper does not state its inputs; σ = 0.5 and σ = 1 are stored).
Everything in float64 with ``course_lib.torch`` (one seeded ``torch.Generator``).  Saved arrays:
``ms (M,)``, ``sigmas (S,)``, ``mse (S, 2 features, 2 orthogonal, M, samples)`` with features
order ``("positive", "trig")`` and orthogonal order ``(True, False)``.
"""

import argparse

import numpy as np
import torch

from course_lib.torch import full, performer

L, D, MS, SIGMAS = 4096, 16, (16, 32, 64, 128, 256), (0.5, 1.0)
FEATURES, ORTHOGONAL = ("positive", "trig"), (True, False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="course_lib/data/performer_figure4.npz")
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(2009)
    mse = np.zeros((len(SIGMAS), len(FEATURES), len(ORTHOGONAL), len(MS), args.samples))
    for a, sigma in enumerate(SIGMAS):
        q, k = (sigma * torch.randn(L, D, generator=gen, dtype=torch.float64) for _ in range(2))  # (n, d)
        v = torch.randn(L, D, generator=gen, dtype=torch.float64)  # (s, e)
        exact = full.softmax_attention(q, k, v)
        for b, features in enumerate(FEATURES):
            for c, orthogonal in enumerate(ORTHOGONAL):
                for i, m in enumerate(MS):
                    for j in range(args.samples):
                        omega = performer.random_matrix(m, D, gen, orthogonal=orthogonal, dtype=torch.float64)
                        out = performer.performer_attention(q, k, v, omega, features=features)
                        mse[a, b, c, i, j] = (out - exact).square().mean().item()
                    print(f"sigma {sigma} {features:>8} orthogonal={orthogonal!s:>5} m = {m:>3}: "
                          f"mean MSE {mse[a, b, c, i].mean():.3g}", flush=True)
    np.savez(args.out, ms=np.array(MS), sigmas=np.array(SIGMAS), mse=mse, L=L, d=D)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
