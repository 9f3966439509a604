"""Learn Linformer's E and F for the frozen MiniLM, layer by layer, and compare them with fixed projections.

The data behind notebook 04, Section 4.4: the notebook fits one layer for a few seconds itself
and loads the full comparison from ``course_lib/data/learned_projections.npz`` (package data, so an
installed course has it too).  Passages come from ``course_lib.tasks.passage_split``: training
passages from the corpus's start, held-out ones from its end, never trained on.  For each layer
and k, the layer's 12 heads share one E and one F ``(k, n)`` (headwise sharing, the default of
``LinformerSelfAttention``), started at mean pooling and fitted by Adam
(``course_lib.torch.linformer.fit_projections``, Eq. 4.6) to the exact attention output of those
heads on the training passages, with the held-out error recorded along the way.  The q, k, v of a
head are those the exact model computes (each layer sees exact attention's hidden states), so the
error is the attention kernel's alone.

Methods, each scored on the held-out passages by the relative error of the output
‖Ỹ − P V‖_F / ‖P V‖_F: the trivial answers *output zero* (error 1) and *uniform attention* (every
row the mean of V); inside Eq. (4.4), Gaussian E, F (N(0, 1/k)), mean pooling, Theorem 2's
E = δR, F = e^{−δ}R (Wang et al. 2020, Eq. 9; δ = 0.1 as in notebook 03) and the learned E, F;
and three references that need the exact P of each input: *best fixed for P* (P Fᵀ F V with the
one F, orthonormal rows, that minimises Σ ‖P − P Fᵀ F‖²_F over the training passages and the
layer's heads: the top-k eigenvectors of Σ PᵀP — the best input-independent projection of P's
rows, exercise 4.1), *SVD-optimal for P* (the same with each input's own top-k right singular
vectors, optimal for that P) and *output-optimal* (the best rank-k approximation of Y = P V
itself, a floor for every method here; 0 once k >= e).

    python tools/fit_projections.py                     write course_lib/data/learned_projections.npz (~6 CPU minutes)
    python tools/fit_projections.py --layers 3 --k 64 --steps 50 --train 8 --out /tmp/l.npz    a quick look
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
from course_lib.tasks import passage_split  # noqa: E402
from course_lib.torch import linformer as torch_linformer  # noqa: E402
from course_lib.torch.full import softmax_attention  # noqa: E402

METHODS = ("output zero", "uniform attention (mean of V)", "Gaussian E, F", "mean pooling",
           "Theorem 2, E = δR, F = e^(−δ)R", "learned E, F", "best fixed for P (needs P)",
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


def second_moment(q, k):
    """Σ PᵀP over the passages and heads ``(s, s)``, float64, one passage at a time."""
    total = 0.0
    for q_b, k_b in zip(q.double().numpy(), k.double().numpy(), strict=True):  # (H, n, d) each
        rows = full.attention_weights(q_b, k_b).reshape(-1, k_b.shape[-2])  # (H · n, s)
        total = total + rows.T @ rows
    return total


def top_eigenvectors(M, k):
    """The k eigenvectors of the symmetric M with the largest eigenvalues, as rows ``(k, s)``."""
    return np.linalg.eigh(M)[1][:, ::-1][:, :k].T


def evaluate(q, k, v, k_proj, learned, fixed, rng):
    """Relative output error of every method ``(methods, heads)`` and the P errors of the fixed and per-input
    rank-k projections ``(2, heads)``, mean over passages; float64, one passage at a time."""
    n = q.shape[-2]
    G_E, G_F = jl.gaussian_projection(k_proj, n, rng), jl.gaussian_projection(k_proj, n, rng)
    T_E, T_F = jl.theorem2_projections(k_proj, n, rng)  # δ = 0.1, notebook 03
    pool = np_linformer.mean_pooling(k_proj, n)
    L_E, L_F = (x.double().numpy() for x in learned)  # (k, s)
    outputs, p_errors = [], []
    for q_b, k_b, v_b in zip(*(x.double().numpy() for x in (q, k, v)), strict=True):  # (H, n, d) each
        P = full.attention_weights(q_b, k_b)  # (H, n, s)
        Y = P @ v_b  # (H, n, e)
        top = np.linalg.svd(P)[2][..., :k_proj, :]  # (H, k, s): top-k right singular vectors of each P
        uniform = np.broadcast_to(v_b.mean(axis=-2, keepdims=True), Y.shape)  # every row the mean of V
        linformer_outputs = [np_linformer.linformer_attention(q_b, k_b, v_b, E, F)
                             for E, F in ((G_E, G_F), (pool, pool), (T_E, T_F), (L_E, L_F))]
        fixed_P, svd_P = P @ fixed.T @ fixed, P @ np.swapaxes(top, -1, -2) @ top  # (H, n, s) each
        errors = [np.ones(len(Y)), relative_errors(uniform, Y)]
        errors += [relative_errors(out, Y) for out in linformer_outputs]
        errors += [relative_errors(fixed_P @ v_b, Y), relative_errors(svd_P @ v_b, Y), best_rank_k_error(Y, k_proj)]
        outputs.append(errors)
        p_errors.append([relative_errors(fixed_P, P), relative_errors(svd_P, P)])
    return np.mean(outputs, axis=0), np.mean(p_errors, axis=0)


def linformer_errors(q, k, v, E, F):
    """Relative error of Linformer with E, F per head ``(heads,)``, mean over passages (torch, float32)."""
    with torch.no_grad():
        exact = softmax_attention(q, k, v)  # (b, H, n, e)
        error = torch.linalg.matrix_norm(torch_linformer.linformer_attention(q, k, v, E, F) - exact)
        return (error / torch.linalg.matrix_norm(exact)).mean(dim=0).numpy()


def heldout_error(q, k, v, E, F):
    """Relative error of Linformer with E, F, mean over passages and heads."""
    return float(linformer_errors(q, k, v, E, F).mean())


def fit_one(train, heldout, k_proj, args):
    """Fit one layer's E, F at one k; return them with the training curve and the held-out curve."""
    pool = torch_linformer.mean_pooling(k_proj, args.n)  # (k, s): one E and one F for the layer's heads
    curve = {"step": [], "train": [], "heldout": []}

    def record(step, E, F):  # the same metric on both sets: relative error, mean over passages and heads
        if step % args.eval_every == 0:
            curve["step"].append(step)
            curve["train"].append(heldout_error(*train, E, F))
            curve["heldout"].append(heldout_error(*heldout, E, F))

    record(0, pool, pool)

    E, F, losses = torch_linformer.fit_projections(*train, pool, pool, steps=args.steps, lr=args.lr, callback=record)
    return E, F, np.sqrt(losses), curve


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, nargs="+", default=[32, 64], help="k values fitted on --layer")
    parser.add_argument("--layer", type=int, default=3, help="the layer fitted at every --k (1 to 6)")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 3, 5],
                        help="layers fitted at --k-layers")
    parser.add_argument("--k-layers", type=int, default=64, help="the k of the --layers fits")
    parser.add_argument("--n", type=int, default=256, help="tokens per passage")
    parser.add_argument("--train", type=int, default=32, help="training passages (passage_split)")
    parser.add_argument("--heldout", type=int, default=16, help="held-out passages (passage_split)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=20, help="steps between held-out evaluations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "learned_projections.npz"))
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    model = load_minilm()
    train_texts, heldout_texts = passage_split(args.train, args.heldout, min_tokens=args.n)
    train_all, heldout_all = minilm_qkv(model, train_texts, args.n), minilm_qkv(model, heldout_texts, args.n)
    heads = model.config.n_heads
    jobs = [(args.layer, k) for k in sorted(args.k)] + [(layer, args.k_layers) for layer in sorted(args.layers)
                                                        if (layer, args.k_layers) not in
                                                        [(args.layer, k) for k in args.k]]
    results, stored = [], {}
    for layer, k_proj in jobs:
        cut = slice((layer - 1) * heads, layer * heads)
        train, heldout = ([x[:, cut] for x in xs] for xs in (train_all, heldout_all))  # (passages, heads, n, d)
        E, F, rms, curve = fit_one(train, heldout, k_proj, args)
        fixed = top_eigenvectors(second_moment(*train[:2]), k_proj)  # (k, s): best fixed F for P's rows
        rng = np.random.default_rng(args.seed + 1000 * layer + k_proj)
        output_errors, p_errors = evaluate(*heldout, k_proj, (E, F), fixed, rng)
        train_errors = linformer_errors(*train, E, F)  # (heads,): the learned E, F where they were fitted
        results.append(dict(layer=layer, k=k_proj, heldout=output_errors, p_errors=p_errors, train=train_errors,
                            rms=rms, curve=curve))
        if layer == args.layer:
            stored[f"E_k{k_proj}"], stored[f"F_k{k_proj}"] = E.numpy(), F.numpy()
        print(f"layer {layer}, k = {k_proj:>4}: held-out error, mean over heads: "
              + ", ".join(f"{m} {e:.3g}" for m, e in zip(METHODS, output_errors.mean(axis=1), strict=True))
              + f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    save(args, results, stored, time.perf_counter() - start)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s")


def save(args, results, stored, seconds):
    """Write the sweep over k on ``--layer`` and the sweep over layers at ``--k-layers`` (one fit each)."""
    sweep = [r for r in results if r["layer"] == args.layer]
    across = sorted((r for r in results if r["k"] == args.k_layers), key=lambda r: r["layer"])
    np.savez_compressed(
        args.out, methods=np.array(METHODS), layer=np.array(args.layer), ks=np.array([r["k"] for r in sweep]),
        heldout_errors=np.stack([r["heldout"] for r in sweep]),  # (k, methods, heads) on --layer
        train_errors=np.stack([r["train"] for r in sweep]),  # (k, heads): learned E, F on the training passages
        p_errors=np.stack([r["p_errors"] for r in sweep]),  # (k, 2, heads): ‖P − P Π‖/‖P‖ held out, fixed / per input
        rms_curves=np.stack([r["rms"] for r in sweep]),  # (k, steps): training loss (root mean relative squared error)
        heldout_curve_steps=np.array(sweep[0]["curve"]["step"]),
        heldout_curves=np.stack([r["curve"]["heldout"] for r in sweep]),  # (k, evaluations)
        train_curves=np.stack([r["curve"]["train"] for r in sweep]),  # (k, evaluations): the same metric, training
        layers=np.array([r["layer"] for r in across]), k_layers=np.array(args.k_layers),
        layers_heldout_errors=np.stack([r["heldout"] for r in across]),  # (layers, methods, heads)
        layers_train_errors=np.stack([r["train"] for r in across]),  # (layers, heads)
        layers_rms_curves=np.stack([r["rms"] for r in across]),
        layers_heldout_curves=np.stack([r["curve"]["heldout"] for r in across]),
        layers_train_curves=np.stack([r["curve"]["train"] for r in across]),
        settings=np.array(f"n = {args.n}, {args.train} training and {args.heldout} held-out passages "
                          f"(passage_split), {args.steps} Adam steps at lr {args.lr}, seed {args.seed}"),
        command=np.array("python tools/fit_projections.py"), seconds=np.array(round(seconds)), **stored)


if __name__ == "__main__":
    main()
