"""The stored data of notebook 09: MiniLM swap-in cosines, the error-versus-time points, the CPU grid.

    python tools/lesson09_data.py swap-in    write course_lib/data/swap_in_minilm.json
    python tools/lesson09_data.py pareto     write course_lib/data/pareto_cpu.json
    python tools/lesson09_data.py merge A.csv B.csv ...   write course_lib/data/bench_09_cpu.csv

The grid behind ``bench_09_cpu.csv`` (forward, float32, b = 1, h = 8, d = 64, k = 128, m = 256,
one thread, 5 timed repeats; exact stops at n = 8192, SDPA too, where one call took minutes on
the shared 2-core machine):

    python -m course_lib.bench --variants exact sdpa --n 256 512 1024 2048 4096 8192 \\
        --k 128 --m 256 --repeats 5 --warmup 1 --threads 1 --csv A.csv --no-plot
    python -m course_lib.bench --variants linformer linear performer --n 256 512 1024 2048 4096 8192 16384 \\
        --k 128 --m 256 --repeats 5 --warmup 1 --threads 1 --csv B.csv --no-plot
    python tools/lesson09_data.py merge A.csv B.csv
"""

import argparse
import csv
import json
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import swap_in  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import english_passages  # noqa: E402
from course_lib.torch.full import softmax_attention  # noqa: E402
from course_lib.torch.linformer import mean_pooling  # noqa: E402

DATA = ROOT / "course_lib" / "data"


def swap_in_run(args):
    """Cosine to the exact embeddings for every variant and setting on ``args.passages`` passages."""
    model = load_minilm()
    texts = list(english_passages(args.passages, min_tokens=args.n, tokenizer=model.tokenizer))
    exact = swap_in.embeddings(model, texts, max_length=args.n)
    others = exact @ exact.T  # (t, t): how close two *different* passages are, for scale
    rows = []
    for variant, setting, kernel in swap_in.swap_in_settings(args.n, model.config.d_model // model.config.n_heads):
        cos = swap_in.embedding_cosines(model, kernel, texts, max_length=args.n, reference=exact)
        rows.append({"variant": variant, "setting": setting, "mean": float(cos.mean()), "min": float(cos.min())})
        print(variant, setting, f"{cos.mean():.3f}", flush=True)
    unrelated = float(others[~np.eye(len(texts), dtype=bool)].mean())
    out = {"command": "python tools/lesson09_data.py swap-in", "passages": len(texts), "n": args.n,
           "unrelated_passages_mean_cosine": unrelated, "rows": rows}
    (DATA / "swap_in_minilm.json").write_text(json.dumps(out, indent=1) + "\n")


def minilm_qkv(model, texts, n, layer):
    """q, k, v ``(b, h, n, d)`` of one MiniLM layer on texts cut to n tokens."""
    captured = []

    def capture(q, k, v, *, causal=False, key_mask=None):
        captured.append((q, k, v))
        return softmax_attention(q, k, v, causal=causal, key_mask=key_mask)

    token_ids, key_mask = model.tokenize(texts, max_length=n, truncate=True)
    with torch.inference_mode():
        model.with_attention(capture)(token_ids, key_mask)
    return captured[layer]


def pareto_run(args):
    """Relative error to exact softmax and the minimum time of each variant on one MiniLM layer's q, k, v."""
    torch.set_num_threads(1)
    model = load_minilm()
    texts = list(english_passages(args.batch, min_tokens=args.n, tokenizer=model.tokenizer))
    q, k, v = minilm_qkv(model, texts, args.n, args.layer)  # (b, h, n, d) each
    reference = softmax_attention(q.double(), k.double(), v.double())  # (b, h, n, e)
    rng, generator = np.random.default_rng(0), torch.Generator().manual_seed(0)
    d = q.shape[-1]
    methods = [("exact", "–", softmax_attention),
               ("SDPA", "–", lambda q, k, v, **_: torch.nn.functional.scaled_dot_product_attention(q, k, v))]
    methods += [("Linformer, mean pooling", f"k = {kp}", swap_in.linformer_kernel(mean_pooling(kp, args.n),
                                                                                   mean_pooling(kp, args.n)))
                for kp in (32, 64, 128, 256)]
    methods += [("Linformer, Gaussian", f"k = {kp}", swap_in.linformer_kernel(*swap_in.gaussian_projections(
        kp, args.n, rng))) for kp in (64, 256)]
    methods.append(("linear, elu+1", "–", swap_in.linear_kernel()))
    methods += [("FAVOR+", f"m = {m}", swap_in.performer_kernel(m, d, generator)) for m in (32, 64, 128, 256, 512)]
    times = {i: [] for i in range(len(methods))}
    with torch.inference_mode():
        for _ in range(args.repeats):  # interleaved: every method sees the same machine load
            for i, (_, _, fn) in enumerate(methods):
                start = time.perf_counter()
                fn(q, k, v)
                times[i].append(time.perf_counter() - start)
        rows = []
        for i, (name, setting, fn) in enumerate(methods):
            error = torch.linalg.vector_norm(fn(q, k, v).double() - reference) / torch.linalg.vector_norm(reference)
            rows.append({"variant": name, "setting": setting, "error": float(error), "time_s": min(times[i])})
            print(name, setting, f"{float(error):.3g}", f"{min(times[i]) * 1e3:.2f} ms", flush=True)
    out = {"command": "python tools/lesson09_data.py pareto", "b": args.batch, "h": q.shape[1], "n": args.n,
           "d": d, "layer": args.layer + 1, "threads": 1, "repeats": args.repeats,
           "hardware": f"{torch.__version__}, 1 thread", "rows": rows}
    (DATA / "pareto_cpu.json").write_text(json.dumps(out, indent=1) + "\n")


def merge(paths):
    """Concatenate bench CSVs (same header) into course_lib/data/bench_09_cpu.csv."""
    rows, header = [], None
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = header or reader.fieldnames
            rows += list(reader)
    with open(DATA / "bench_09_cpu.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["swap-in", "pareto", "merge"])
    parser.add_argument("csvs", nargs="*", help="merge: the bench CSVs")
    parser.add_argument("--passages", type=int, default=12, help="swap-in: passages")
    parser.add_argument("--n", type=int, default=None, help="tokens per passage (swap-in 256, pareto 512)")
    parser.add_argument("--batch", type=int, default=4, help="pareto: passages in the batch")
    parser.add_argument("--layer", type=int, default=2, help="pareto: the layer (0-based) whose q, k, v are used")
    parser.add_argument("--repeats", type=int, default=7, help="pareto: timed calls (the minimum is kept)")
    args = parser.parse_args(argv)
    args.n = args.n or (512 if args.what == "pareto" else 256)
    if args.what == "swap-in":
        torch.set_num_threads(1)
        swap_in_run(args)
    elif args.what == "pareto":
        pareto_run(args)
    else:
        merge(args.csvs)


if __name__ == "__main__":
    main()
