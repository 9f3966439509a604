"""The stored data of notebook 09: the MiniLM swap-in scores and the errors of the error-against-cost figure.

    python tools/lesson09_data.py swap-in    write course_lib/data/swap_in_minilm.json
    python tools/lesson09_data.py pareto     write course_lib/data/pareto_cpu.json

Both measure on held-out passages (``course_lib.tasks.passage_split``).  ``swap-in`` runs one
thread; it is long (every variant in all six layers on 48 passages of 256 tokens and their
halves, then four of them one layer at a time on 24 passages): an interrupted run resumes
from the rows it finished (kept in the system's temporary folder).  Timings come from the
course's one stored grid (``python -m course_lib.bench --preset grid``), not from here.
"""

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import swap_in  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import passage_split  # noqa: E402
from course_lib.torch.full import softmax_attention  # noqa: E402
from course_lib.torch.linformer import mean_pooling  # noqa: E402

DATA = ROOT / "course_lib" / "data"


def _embed_sorted(model, texts, max_length):
    """Embeddings of ``texts`` in their own order, computed shortest first (less padding per batch)."""
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = swap_in.embeddings(model, [texts[i] for i in order], max_length=max_length)
    return out[np.argsort(order)]


def _scores(model, exact, texts, halves, n):
    """embedding_scores of ``model`` against ``exact`` on ``texts``, and retrieval top-1 on ``halves``."""
    scores = swap_in.embedding_scores(_embed_sorted(model, texts, n), exact)
    if halves is not None:
        queries, documents = (_embed_sorted(model, part, n) for part in halves)
        scores["retrieval_top1"] = swap_in.retrieval_top1(queries, documents)
    return scores


PER_LAYER = (swap_in.CONTROLS[1], "Linformer, mean pooling E = F|k = 32", "linear, elu+1", "FAVOR+|m = 256")
CACHE = pathlib.Path(tempfile.gettempdir()) / "course_swap_in_cache.jsonl"  # an interrupted run's rows; --fresh clears


def _cached(key, compute):
    """The scores stored under ``key`` in CACHE, or ``compute()`` appended to it."""
    rows = [json.loads(line) for line in CACHE.read_text().splitlines()] if CACHE.exists() else []
    for row in rows:
        if row["key"] == key:
            return row["scores"]
    scores = compute()
    with CACHE.open("a") as f:
        f.write(json.dumps({"key": key, "scores": scores}) + "\n")
    return scores


def swap_in_run(args):
    """Every variant in every layer on held-out passages, then four of them one layer at a time."""
    start = time.perf_counter()
    if args.fresh and CACHE.exists():
        CACHE.unlink()
    model = load_minilm()
    _, texts = passage_split(0, args.passages, min_tokens=args.n, tokenizer=model.tokenizer)
    halves = swap_in.split_halves(texts)
    exact = _embed_sorted(model, texts, args.n)
    exact_halves = [_embed_sorted(model, part, args.n) for part in halves]
    reference = {"between_texts": swap_in.between_texts(exact),
                 "retrieval_top1": swap_in.retrieval_top1(*exact_halves)}
    print("exact", reference, flush=True)
    layer_texts = texts[:args.layer_passages]
    rows, per_layer = [], []
    settings = swap_in.swap_in_settings(args.n, model.config.d_model // model.config.n_heads, ks=(32, 128))
    for variant, setting, kernel in settings:
        scores = _cached(f"all|{variant}|{setting}",
                         lambda kernel=kernel: _scores(model.with_attention(kernel), exact, texts, halves, args.n))
        rows.append({"variant": variant, "setting": setting, **scores})
        print(variant, setting, {k: round(v, 3) for k, v in scores.items()}, flush=True)
    for variant, setting, kernel in settings:
        if variant not in PER_LAYER and f"{variant}|{setting}" not in PER_LAYER:
            continue
        for layer in range(model.config.n_layers):
            scores = _cached(f"layer {layer + 1}|{variant}|{setting}", lambda kernel=kernel, layer=layer: _scores(
                model.with_attention(kernel, layers=[layer]), exact[:len(layer_texts)], layer_texts, None, args.n))
            per_layer.append({"variant": variant, "setting": setting, "layer": layer + 1, **scores})
            print(variant, setting, "layer", layer + 1, round(scores["centred_cosine"], 3), flush=True)
    out = {"command": "python tools/lesson09_data.py swap-in", "passages": len(texts),
           "per_layer_passages": len(layer_texts), "n": args.n,
           "texts": "course_lib.tasks.passage_split(0, passages, min_tokens=n)[1], held out; retrieval on "
                    "swap_in.split_halves of them; one layer at a time on the first per_layer_passages",
           "seconds": round(time.perf_counter() - start), "threads": torch.get_num_threads(),
           "exact": reference, "rows": rows, "per_layer": per_layer}
    (DATA / "swap_in_minilm.json").write_text(json.dumps(out, indent=1) + "\n")
    CACHE.unlink()


def pareto_run(args):
    """Relative error to exact softmax of each variant on every MiniLM layer's q, k, v (held-out passages).

    The cost axis of notebook 09's error-against-cost figure is the shared timing grid
    (``course_lib.bench.stored``, the k and m sweeps at n = 512); this stores only the errors,
    which do not depend on the machine.
    """
    torch.set_num_threads(1)
    model = load_minilm()
    _, texts = passage_split(0, args.batch, min_tokens=args.n, tokenizer=model.tokenizer)  # held out
    layers = swap_in.attention_inputs(model, texts, max_length=args.n)  # every layer's (q, k, v, key_mask)
    rng, generator = np.random.default_rng(0), torch.Generator().manual_seed(0)
    d = layers[0][0].shape[-1]
    methods = [("attention output zero", "–", swap_in.zero_kernel()),
               ("uniform attention (mean of V)", "–", swap_in.uniform_kernel()),
               ("exact", "–", softmax_attention),
               ("SDPA", "–", lambda q, k, v, **_: torch.nn.functional.scaled_dot_product_attention(q, k, v))]
    ks = (32, 64, 128, 256)
    methods += [("Linformer, mean pooling", f"k = {kp}", swap_in.linformer_kernel(mean_pooling(kp, args.n),
                                                                                   mean_pooling(kp, args.n)))
                for kp in ks]
    methods += [("Linformer, Gaussian", f"k = {kp}", swap_in.linformer_kernel(*swap_in.gaussian_projections(
        kp, args.n, rng))) for kp in ks]
    methods.append(("linear, elu+1", "–", swap_in.linear_kernel()))
    methods += [("FAVOR+", f"m = {m}", swap_in.performer_kernel(m, d, generator)) for m in (32, 64, 128, 256, 512)]
    rows = []
    with torch.inference_mode():
        for name, setting, fn in methods:
            errors = []
            for q, k, v, _ in layers:  # passages of >= n tokens: no padding
                reference = softmax_attention(q.double(), k.double(), v.double())  # (b, h, n, e)
                error = torch.linalg.vector_norm(fn(q, k, v).double() - reference) / torch.linalg.vector_norm(reference)
                errors.append(float(error))
            rows.append({"variant": name, "setting": setting, "error": float(np.mean(errors)), "per_layer": errors})
            print(name, setting, " ".join(f"{e:.3g}" for e in errors), flush=True)
    out = {"command": "python tools/lesson09_data.py pareto", "b": args.batch, "h": layers[0][0].shape[1],
           "n": args.n, "d": d, "texts": "course_lib.tasks.passage_split(0, b, min_tokens=n)[1], held out",
           "error": "relative error ||out - exact|| / ||exact|| per layer (float64 reference); error: their mean",
           "rows": rows}
    (DATA / "pareto_cpu.json").write_text(json.dumps(out, indent=1) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["swap-in", "pareto"])
    parser.add_argument("--passages", type=int, default=48, help="swap-in: held-out passages")
    parser.add_argument("--layer-passages", type=int, default=24, help="swap-in: passages for one layer at a time")
    parser.add_argument("--fresh", action="store_true", help="swap-in: ignore the rows of an interrupted run")
    parser.add_argument("--n", type=int, default=None, help="tokens per passage (swap-in 256, pareto 512)")
    parser.add_argument("--batch", type=int, default=4, help="pareto: passages in the batch")
    args = parser.parse_args(argv)
    args.n = args.n or (512 if args.what == "pareto" else 256)
    if args.what == "swap-in":
        torch.set_num_threads(1)
        swap_in_run(args)
    else:
        pareto_run(args)


if __name__ == "__main__":
    main()
