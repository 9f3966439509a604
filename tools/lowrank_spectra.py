"""Precompute notebook 02's attention spectra over many passages: writes course_lib/data/lowrank_spectra.npz.

Notebook 02 reproduces the Linformer paper's Figure 1 on all-MiniLM-L6-v2: the normalised
cumulative singular values of P (Eq. 2.2), per layer and head, averaged over 100 passages
of n = 512 tokens.  That is 7,200 matrices of 512 x 512, many minutes on a 2-core CPU, so
this script computes them once and the notebook recomputes the first passage live and asserts
that it agrees with the stored numbers.  The untrained encoder, whose maps are nearly uniform
and vary little from passage to passage, is averaged over the first 25 passages.

    python tools/lowrank_spectra.py [--passages 100] [--untrained-passages 25] [--n 512]
                                    [--out course_lib/data/lowrank_spectra.npz]

Stored arrays (float32; L = 6 layers, H = 12 heads, r = n):
    <model>_mean_cumulative  (L, H, r)  c_k averaged over the passages, model = trained / untrained
    <model>_shares           (P, L, H, len(ks))  c_k of every passage at k in ``ks``
    random_shares            (P, len(ks))  the same for softmax(Z) with Z_ij ~ N(0, 1), seeded
    ks, n                    the k values and the sequence length
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

from course_lib.numpy.lowrank import cumulative_spectrum  # noqa: E402
from course_lib.pretrained import load_minilm, untrained_minilm  # noqa: E402
from course_lib.tasks import english_passages  # noqa: E402

KS = (16, 32, 64, 128, 256)
RANDOM_SEED = 2


def passage_spectra(model, passage, n):
    """c_k of every layer and head for one passage: ``(L, H, n)`` float32."""
    maps = model.attention_maps(passage, max_length=n, truncate=True, as_numpy=False)  # (L, H, n, n)
    return cumulative_spectrum(maps.numpy(), method="gram")  # (L, H, n)


def random_spectra(n, count, seed=RANDOM_SEED):
    """c_k of softmax(Z), Z_ij ~ N(0, 1): ``(count, n)`` float32."""
    rng = np.random.default_rng(seed)
    scores = rng.standard_normal((count, n, n), dtype=np.float32)  # (count, n, s)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return cumulative_spectrum(weights / weights.sum(axis=-1, keepdims=True), method="gram")


def summarise(model, passages, n, name):
    total, shares, start = None, [], time.perf_counter()
    for i, passage in enumerate(passages):
        spectra = passage_spectra(model, passage, n)  # (L, H, n)
        total = spectra.astype(np.float64) if total is None else total + spectra
        shares.append(spectra[..., [k - 1 for k in KS]])
        print(f"{name}: passage {i + 1}/{len(passages)}, {time.perf_counter() - start:.0f} s", flush=True)
    return (total / len(passages)).astype(np.float32), np.stack(shares).astype(np.float32)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--untrained-passages", type=int, default=25)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "course_lib" / "data" / "lowrank_spectra.npz")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    passages = english_passages(args.passages, min_tokens=args.n)
    arrays = {"ks": np.array(KS), "n": np.array(args.n)}
    runs = (("trained", load_minilm(), passages), ("untrained", untrained_minilm(seed=0),
                                                    passages[:args.untrained_passages]))
    for name, model, texts in runs:
        arrays[f"{name}_mean_cumulative"], arrays[f"{name}_shares"] = summarise(model, texts, args.n, name)
    arrays["random_shares"] = random_spectra(args.n, args.passages)[:, [k - 1 for k in KS]]
    args.out.parent.mkdir(exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
