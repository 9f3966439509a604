"""Precompute notebook 02's attention spectra over many passages: writes course_lib/data/lowrank_spectra.npz.

Notebook 02 reproduces the Linformer paper's Figure 1 on all-MiniLM-L6-v2: the normalised
cumulative singular values of P (Eq. 2.2), per layer and head, averaged over 100 passages
of n = 512 tokens.  That is 7,200 matrices of 512 x 512, many minutes on a 2-core CPU, so
this script computes them once and the notebook recomputes the first passage live and asserts
that it agrees with the stored numbers.  The untrained encoder, whose maps are nearly uniform
and vary little from passage to passage, is averaged over the first 25 passages.  Section 2.7
follows the rank and the output error of the trained model as n grows (n = 128, 256, 512, the
first 25 passages cut to n tokens), with MiniLM's own value vectors V.

    python tools/lowrank_spectra.py [--passages 100] [--untrained-passages 25] [--n 512]
                                    [--by-n-passages 25] [--parts spectra,by_n]
                                    [--out course_lib/data/lowrank_spectra.npz]

``--parts by_n`` recomputes only the by-n arrays and keeps the others of an existing file.

Stored arrays (float32; L = 6 layers, H = 12 heads, r = n):
    <model>_mean_cumulative  (L, H, r)  c_k averaged over the passages, model = trained / untrained
    <model>_shares           (P, L, H, len(ks))  c_k of every passage at k in ``ks``
    random_shares            (P, len(ks))  the same for softmax(Z) with Z_ij ~ N(0, 1), seeded
    ks, n                    the k values and the sequence length
    by_n_lengths, by_n_ks    the lengths N = (128, 256, 512) and the ranks K = (16, 32, 64) of section 2.7
    by_n_<quantity>_heads    (N, [K,] L, H) the mean over passages of each head's value
    by_n_<quantity>_passages (N, [K,] P) the mean over the 72 heads of each passage's value
      quantities: rank90 (the smallest k with c_k >= 0.9, Eq. 2.4); P_error (‖P − P_k‖_F / ‖P‖_F);
      output_error (‖PV − P_k V‖_F / ‖PV‖_F, Eq. 2.8); best_output_error (the best rank-k copy of PV
      itself, relative to ‖PV‖_F); uniform_output_error (‖PV − 1 mean(V)‖_F / ‖PV‖_F, uniform
      attention); uniform_P_error (‖P − 11ᵀ/n‖_F / ‖P‖_F)
"""

import argparse
import os
import pathlib
import sys
import time

# Many 512 x 512 factorisations in a row run fastest with one BLAS thread each.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course_lib.numpy import lowrank  # noqa: E402
from course_lib.pretrained import load_minilm, untrained_minilm  # noqa: E402
from course_lib.tasks import english_passages  # noqa: E402
from course_lib.torch.full import split_heads  # noqa: E402

KS = (16, 32, 64, 128, 256)
RANDOM_SEED = 2
BY_N_LENGTHS, BY_N_KS = (128, 256, 512), (16, 32, 64)


def passage_spectra(model, passage, n):
    """c_k of every layer and head for one passage: ``(L, H, n)`` float32."""
    maps = model.attention_maps(passage, max_length=n, truncate=True, as_numpy=False)  # (L, H, n, n)
    return lowrank.cumulative_spectrum(maps.numpy(), method="gram")  # (L, H, n)


def random_spectra(n, count, seed=RANDOM_SEED):
    """c_k of softmax(Z), Z_ij ~ N(0, 1): ``(count, n)`` float32."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((count, n, n), dtype=np.float32)  # (count, n, s)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return lowrank.cumulative_spectrum(weights / weights.sum(axis=-1, keepdims=True), method="gram")


def summarise(model, passages, n, name):
    total, shares, start = None, [], time.perf_counter()
    for i, passage in enumerate(passages):
        spectra = passage_spectra(model, passage, n)  # (L, H, n)
        total = spectra.astype(np.float64) if total is None else total + spectra
        shares.append(spectra[..., [k - 1 for k in KS]])
        print(f"{name}: passage {i + 1}/{len(passages)}, {time.perf_counter() - start:.0f} s", flush=True)
    return (total / len(passages)).astype(np.float32), np.stack(shares).astype(np.float32)


def value_vectors(model, text, n):
    """V of every layer and head, ``(L, H, n, e)`` float64: the values that ``attention_maps``' P multiplies."""
    token_ids, key_mask = model.tokenize([text], max_length=n, truncate=True)
    values = []
    with torch.inference_mode():
        x = model.embeddings(token_ids)  # (1, n, d_model)
        for layer in model.layers:
            values.append(split_heads(layer.attention.v_proj(x), layer.attention.n_heads)[0])  # (H, n, e)
            x = layer(x, key_mask)  # (1, n, d_model): the next layer's input
    return torch.stack(values).double().numpy()  # (L, H, n, e)


def head_errors(P, V, ks=BY_N_KS):
    """Section 2.7's quantities for every head of one passage: a dict of ``(L, H)`` or ``(K, L, H)`` arrays."""
    at_ks = [k - 1 for k in ks]  # entry k - 1 holds rank k

    def per_k(errors):  # (L, H, r) -> (K, L, H)
        return np.moveaxis(errors[..., at_ks], -1, 0)

    c = lowrank.cumulative_spectrum(P, method="gram")  # (L, H, n), Eq. (2.2)
    output = P @ V  # (L, H, n, e)
    best_output = lowrank.truncation_errors(output, relative=True)  # (L, H, e): the best rank-k copy of PV itself
    best_output = np.concatenate([best_output, np.zeros_like(c[..., :max(ks)])], axis=-1)  # 0 from k = e on
    uniform_output = np.linalg.norm(output - V.mean(axis=-2, keepdims=True), axis=(-2, -1))  # (L, H)
    return {
        "rank90": (c < 0.9).sum(axis=-1) + 1.0,  # Eq. (2.4)
        "P_error": per_k(lowrank.truncation_errors(P, relative=True, method="gram")),
        "output_error": per_k(lowrank.output_truncation_errors(P, V, relative=True, method="gram")),
        "best_output_error": per_k(best_output),
        "uniform_output_error": uniform_output / np.linalg.norm(output, axis=(-2, -1)),
        "uniform_P_error": np.linalg.norm(P - 1.0 / P.shape[-1], axis=(-2, -1)) / np.linalg.norm(P, axis=(-2, -1)),
    }


def by_n(model, passages):
    """Section 2.7's arrays: every quantity of ``head_errors`` at every n, per head and per passage."""
    arrays, start = {"by_n_lengths": np.array(BY_N_LENGTHS), "by_n_ks": np.array(BY_N_KS)}, time.perf_counter()
    per_n = []
    for n in BY_N_LENGTHS:
        rows = []
        for i, passage in enumerate(passages):
            P = model.attention_maps(passage, max_length=n, truncate=True, as_numpy=True)  # (L, H, n, n) float64
            rows.append(head_errors(P, value_vectors(model, passage, n)))
            print(f"by n: n = {n}, passage {i + 1}/{len(passages)}, {time.perf_counter() - start:.0f} s", flush=True)
        per_n.append({name: np.stack([r[name] for r in rows]) for name in rows[0]})  # (P, [K,] L, H)
    for name in per_n[0]:
        stacked = np.stack([values[name] for values in per_n])  # (N, P, [K,] L, H)
        arrays[f"by_n_{name}_heads"] = stacked.mean(axis=1).astype(np.float32)  # (N, [K,] L, H)
        arrays[f"by_n_{name}_passages"] = np.moveaxis(stacked.mean(axis=(-2, -1)), 1, -1).astype(np.float32)
    return arrays


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--untrained-passages", type=int, default=25)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--by-n-passages", type=int, default=25)
    parser.add_argument("--parts", default="spectra,by_n", help="spectra, by_n or both (comma-separated)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "course_lib" / "data" / "lowrank_spectra.npz")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"spectra", "by_n"}:
        parser.error(f"--parts must name spectra, by_n or both, got {args.parts!r}")
    torch.manual_seed(0)
    passages = english_passages(max(args.passages, args.by_n_passages), min_tokens=args.n)
    arrays = {}
    if "spectra" in parts:
        arrays |= {"ks": np.array(KS), "n": np.array(args.n)}
        runs = (("trained", load_minilm(), passages[:args.passages]),
                ("untrained", untrained_minilm(seed=0), passages[:args.untrained_passages]))
        for name, model, texts in runs:
            arrays[f"{name}_mean_cumulative"], arrays[f"{name}_shares"] = summarise(model, texts, args.n, name)
        arrays["random_shares"] = random_spectra(args.n, args.passages)[:, [k - 1 for k in KS]]
    elif args.out.exists():
        with np.load(args.out) as kept:
            arrays |= {name: kept[name] for name in kept.files if not name.startswith("by_n_")}
    if "by_n" in parts:
        arrays |= by_n(load_minilm(), passages[:args.by_n_passages])
    elif args.out.exists():
        with np.load(args.out) as kept:
            arrays |= {name: kept[name] for name in kept.files if name.startswith("by_n_")}
    args.out.parent.mkdir(exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
