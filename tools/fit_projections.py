"""Learn Linformer's E and F for every head of the frozen MiniLM and compare them with fixed projections.

The data behind notebook 04, Section 4.4: the notebook fits one layer for a few seconds itself
and loads the full comparison from ``course_lib/data/learned_projections.npz`` (package data, so an
installed course has it too).  For each k, one layer's 12 heads share one E and one F ``(k, n)``
(headwise sharing, the default of ``LinformerSelfAttention``), started at mean pooling and fitted
by Adam (``course_lib.torch.linformer.fit_projections``, Eq. 4.6) to the exact attention output of
those heads on the *training* passages; every method is then scored on *held-out* passages that
played no part in fitting.  The q, k, v of a head are
those the exact model computes (each layer sees exact attention's hidden states), so the error
is the attention kernel's alone.

Methods, each inside Eq. (4.4) unless said otherwise: Gaussian E, F (N(0, 1/k)); mean pooling;
Theorem 2's construction E = δR, F = e^{−δ}R (Wang et al. 2020, Eq. 9; δ = 0.1 as in notebook 03); learned; and two
references that need the exact P of each input: SVD-optimal (P Fᵀ F V with F the top-k right
singular vectors of P, optimal for P) and output-optimal (the best rank-k approximation of
Y = P V itself, a floor for every method here; 0 once k >= e).

    python tools/fit_projections.py                     write course_lib/data/learned_projections.npz
    python tools/fit_projections.py --k 64 --steps 50 --out /tmp/l.npz    a quick look
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib.numpy import full, jl  # noqa: E402
from course_lib.numpy import linformer as np_linformer  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import english_passages  # noqa: E402
from course_lib.torch import linformer as torch_linformer  # noqa: E402
from course_lib.torch.full import softmax_attention  # noqa: E402

METHODS = ("Gaussian E, F", "mean pooling", "Theorem 2, E = δR, F = e^(−δ)R", "learned E, F",
           "SVD-optimal for P (needs P)", "output-optimal (needs P V)")


def minilm_qkv(model, passages, n):
    """q, k, v of every head for each passage cut to n tokens: ``(passages, layers · heads, n, d)`` float32."""
    captured = []

    def capture(q, k, v, *, causal=False, key_mask=None):  # a kernel that records its inputs
        captured.append((q, k, v))  # (b, h, n, d) each
        return softmax_attention(q, k, v, causal=causal, key_mask=key_mask)

    token_ids, key_mask = model.tokenize(passages, max_length=n, truncate=True)
    if not bool(key_mask.all()):
        raise ValueError(f"every passage must have at least n = {n} tokens")
    with torch.inference_mode():
        model.with_attention(capture)(token_ids, key_mask)
    return [torch.stack([c[i] for c in captured], dim=1).flatten(1, 2) for i in range(3)]  # (b, L·h, n, d)


def relative_errors(approx, exact):
    """‖approx − exact‖_F / ‖exact‖_F over the last two axes."""
    return np.linalg.norm(approx - exact, axis=(-2, -1)) / np.linalg.norm(exact, axis=(-2, -1))


def best_rank_k_error(Y, k):
    """Relative Frobenius error of the best rank-k approximation of each Y (Eckart-Young): a floor."""
    sigma = np.linalg.svd(Y, compute_uv=False)  # (..., min(n, e))
    return np.sqrt((sigma[..., k:] ** 2).sum(-1) / (sigma ** 2).sum(-1))


def evaluate(q, k, v, k_proj, learned, rng):
    """Relative error of every method, ``(methods, heads)``, mean over passages; float64, one passage at a time."""
    n = q.shape[-2]
    G_E, G_F = jl.gaussian_projection(k_proj, n, rng), jl.gaussian_projection(k_proj, n, rng)
    T_E, T_F = jl.theorem2_projections(k_proj, n, rng)  # δ = 0.1, notebook 03
    pool = np_linformer.mean_pooling(k_proj, n)
    L_E, L_F = (x.double().numpy() for x in learned)  # (k, s)
    per_passage = []
    for q_b, k_b, v_b in zip(*(x.double().numpy() for x in (q, k, v)), strict=True):  # (H, n, d) each
        P = full.attention_weights(q_b, k_b)  # (H, n, s)
        Y = P @ v_b  # (H, n, e)
        top = np.linalg.svd(P)[2][..., :k_proj, :]  # (H, k, s): top-k right singular vectors of each P
        outputs = [np_linformer.linformer_attention(q_b, k_b, v_b, E, F)
                   for E, F in ((G_E, G_F), (pool, pool), (T_E, T_F), (L_E, L_F))]
        outputs.append(P @ np.swapaxes(top, -1, -2) @ (top @ v_b))
        per_passage.append([relative_errors(out, Y) for out in outputs] + [best_rank_k_error(Y, k_proj)])
    return np.mean(per_passage, axis=0)  # (methods, H)


def learned_error(q, k, v, E, F):
    """Relative error of Linformer with E, F, ``(heads,)``, mean over passages (torch, float32)."""
    with torch.no_grad():
        exact = softmax_attention(q, k, v)  # (b, H, n, e)
        error = torch.linalg.matrix_norm(torch_linformer.linformer_attention(q, k, v, E, F) - exact)
        return (error / torch.linalg.matrix_norm(exact)).mean(dim=0).numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--layer", type=int, default=3, help="the layer whose heads are fitted (1 to 6)")
    parser.add_argument("--n", type=int, default=256, help="tokens per passage")
    parser.add_argument("--train", type=int, default=12, help="training passages")
    parser.add_argument("--heldout", type=int, default=8, help="held-out passages (the ones after them)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "learned_projections.npz"))
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    model = load_minilm()
    texts = english_passages(args.train + args.heldout, min_tokens=args.n)
    heads = model.config.n_heads
    layer = slice((args.layer - 1) * heads, args.layer * heads)
    q, k, v = (x[:, layer] for x in minilm_qkv(model, texts, args.n))  # (passages, heads, n, d)
    train, heldout = slice(0, args.train), slice(args.train, None)
    errors, train_errors, curves, stored = [], [], [], {}
    for k_proj in sorted(args.k):
        pool = torch_linformer.mean_pooling(k_proj, args.n)  # (k, s): one E and one F for the layer's heads
        E, F, losses = torch_linformer.fit_projections(q[train], k[train], v[train], pool, pool,
                                                       steps=args.steps, lr=args.lr)
        rng = np.random.default_rng(args.seed + k_proj)
        errors.append(evaluate(q[heldout], k[heldout], v[heldout], k_proj, (E, F), rng))
        train_errors.append(learned_error(q[train], k[train], v[train], E, F))
        curves.append(np.sqrt(losses))
        stored[f"E_k{k_proj}"], stored[f"F_k{k_proj}"] = E.numpy(), F.numpy()
        print(f"k = {k_proj:>4}: held-out error, mean over heads: "
              + ", ".join(f"{m} {e:.3g}" for m, e in zip(METHODS, errors[-1].mean(axis=1), strict=True))
              + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    np.savez_compressed(
        args.out, ks=np.array(sorted(args.k)), methods=np.array(METHODS), heldout_errors=np.stack(errors),  # (k, m, h)
        train_errors=np.stack(train_errors), rms_curves=np.stack(curves), layer=np.array(args.layer),
        settings=np.array(f"layer {args.layer}, n = {args.n}, {args.train} training and {args.heldout} held-out "
                          f"passages, {args.steps} Adam steps at lr {args.lr}, seed {args.seed}"),
        **stored)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
