"""Train the linearized MiniLMs of notebook 10 and score every variant on held-out passages.

    python tools/train_linearized.py                  write course_lib/data/linearized_*.{safetensors,json}
    python tools/train_linearized.py --quick --out /tmp/l10    a small run in a few minutes, for a look
    python tools/train_linearized.py --score-only     re-score the stored models (no training): see below
    python tools/train_linearized.py --no-adapter-runs    stage 2 without adapters, two rows added: see below
    python tools/train_linearized.py --seed-runs 3 --jobs 2    seeds 1 and 2 of three rows beside seed 0: see below

Every fit uses the *training* passages of ``course_lib.tasks.passage_split`` (the corpus's
start); every score comes from its *held-out* passages (the corpus's end), which no stage sees.
What it trains (independent parts, run by ``--jobs`` processes at once, one torch thread each;
every stage's wall time and process CPU time are stored):

1. Hedgehog (Zhang et al. 2024): maps with W = I at the start; stage 1 (attention distillation
   per layer) with checkpoints for the notebook's training-steps widget, then stage 2 (end to
   end); stage 1 repeated with fewer features (the features widget) and, with --stage1-seeds
   above 1, with other seeds (the spread; about 100 CPU seconds each, left out by default so that
   the whole run fits 15 minutes on 2 cores).
2. Hedgehog with a sliding window of exact keys beside the maps (Eq. 10.9; LoLCATs, Zhang et
   al. 2025): stage 1, then stage 2.
3. T2R (Kasai et al. 2021): random relu maps swapped in, trained end to end (stage 2 only).
4. Linformer: E, F learned for every layer (stage 1, lesson 04's loss), then trained end to end.

and it scores, on the same held-out passages, the exact model and the untrained swap-ins of
lesson 09 (uniform attention, elu+1, FAVOR+, mean-pooling Linformer).

``--score-only`` trains nothing: it loads the stored models of ``linearized_results.json``'s run
and re-makes only scores in that file: each held-out row's ranking score (mean reciprocal rank
with its paired test against the exact model), the second text source
(``course_lib.tasks.module_docstrings``, never trained on), reference points for the cosine
(the exact model in lower precision, and on its text with one word dropped) and what may
explain a gap between the sources (token counts, one layer at a time, shorter passages).
Every other field is kept as it is; a row whose cosine the stored model does not reproduce
stops the run.  Linformer's stage-1 E, F are not stored, so that row gets no new scores.

``--no-adapter-runs`` trains only stage 2 without the low-rank adapters (``--rank 0``: only the
feature maps learn end to end; same steps, texts, seed and loss as the stored stage 2), from the
stored stage-1 models of Hedgehog and Hedgehog + window, and adds (or replaces) their two rows,
"..., stages 1 + 2, no adapters", in the results file, with the command and wall time. Every
other row and every checkpoint stays as it is; no model is saved.

``--seed-runs N`` trains seeds 1 to N - 1 of three stored rows with the stored settings: Hedgehog
stage 1, Hedgehog stages 1 + 2 (from that seed's stage 1) and T2R (stage 2 only).  A seed sets the
minibatch order, stage 1's query rows and every random start (T2R's W, the adapters' A), as seed 0
does for the stored models.  Each model is scored like its stored row, on the same held-out
passages, and so are the stored runs' starts, untrained: Hedgehog at W = I (stage 1's gain is
measured from it) and T2R at each seed's random W.  They go to ``seed_runs`` in the results file
(per seed: the scores, training wall and CPU seconds; per row: seed 0, mean, lowest and highest),
with the command and its wall time; the stage-1 cosines also go to ``stage1_seeds``.  Every
stored row and checkpoint stays as it is; no model is saved.  With ``--quick`` (and ``--out``) it
trains a few steps on a few passages, for a test.
"""

import argparse
import copy
import json
import multiprocessing
import os
import pathlib
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import linearize as lin  # noqa: E402
from course_lib import swap_in  # noqa: E402
from course_lib.linearize import evaluate  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import DOCSTRING_SOURCE, module_docstrings, passage_split  # noqa: E402
from course_lib.torch.linformer import mean_pooling  # noqa: E402

DATA = ROOT / "course_lib" / "data"
COMMAND = "python tools/train_linearized.py"


def cpu_name():
    info = pathlib.Path("/proc/cpuinfo")
    for line in info.read_text().splitlines() if info.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


class Clock:
    """Wall and process CPU seconds of each named stage."""

    def __init__(self):
        self.stages = {}

    def run(self, name, fn, *args, **kwargs):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn(*args, **kwargs)
        self.stages[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
        print(f"{name}: {self.stages[name]['wall_s']:.0f} s wall, {self.stages[name]['cpu_s']:.0f} s CPU", flush=True)
        return result


def score(name, model, heldout, exact, rows, *, max_length=256, **info):
    """Score ``model`` on the held-out passages and append a row of the results table."""
    result = evaluate.heldout_scores(model, heldout, exact, max_length=max_length)
    rows.append({"name": name, **info, **{k: v for k, v in result.items()}})
    print(f"  {name}: cosine {result['cosine']:.3f} (control {result['control']:.3f}), centred "
          f"{result['centred_cosine']:.3f}, retrieval {result['retrieval_hits']}/{len(heldout)} (against exact: "
          f"{result['retrieval_lost']} lost, {result['retrieval_gained']} gained, p = {result['retrieval_p']:.2f})",
          flush=True)
    return result


def heldout_attention_loss(student, teacher, token_ids, key_mask):
    """Stage 1's loss on held-out passages, per layer (every query row)."""
    inputs = lin.layer_inputs(teacher, token_ids, key_mask)
    mask = key_mask[:, None, :]  # (b, 1, s)
    with torch.no_grad():
        return [layer.attention.stage1_loss(q, k, v, mask).item()
                for layer, (q, k, v) in zip(student.layers, inputs, strict=True)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=None,
                        help="training passages from the corpus's start (default: all that are not held out)")
    parser.add_argument("--stage1-train", type=int, default=32, help="the first of them that stage 1 uses")
    parser.add_argument("--heldout", type=int, default=48, help="held-out passages (from the corpus's end)")
    parser.add_argument("--n", type=int, default=256, help="tokens per passage")
    parser.add_argument("--features", type=int, default=32, help="f of each Hedgehog map (2f features)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[16], help="other f, stage 1 only")
    parser.add_argument("--window", type=int, default=4, help="w of the windowed Hedgehog: 2w + 1 exact keys")
    parser.add_argument("--t2r-features", type=int, default=64)
    parser.add_argument("--k", type=int, default=64, help="Linformer's projected length")
    parser.add_argument("--m", type=int, default=256, help="FAVOR+ random features (untrained row)")
    parser.add_argument("--rank", type=int, default=8, help="rank of the low-rank adapters that stage 2 trains")
    parser.add_argument("--adapt", nargs="+", default=["q", "k", "v"], choices=list(lin.ADAPTABLE),
                        help="the linears of every layer that get an adapter in stage 2")
    parser.add_argument("--stage1-steps", type=int, default=200)
    parser.add_argument("--stage1-lr", type=float, default=2e-2)
    parser.add_argument("--stage1-batch", type=int, default=8)
    parser.add_argument("--stage1-rows", type=int, default=32, help="query rows scored per text and step")
    parser.add_argument("--linformer-lr", type=float, default=3e-3, help="stage 1 for E, F (lesson 04's rate)")
    parser.add_argument("--stage1-seeds", type=int, default=1,
                        help="stage 1 runs (seeds of minibatch order); more than 1 adds about 100 CPU seconds each")
    parser.add_argument("--stage2-steps", type=int, default=100)
    parser.add_argument("--stage2-lr", type=float, default=3e-3)
    parser.add_argument("--stage2-batch", type=int, default=4)
    parser.add_argument("--stage2-embedding-weight", type=float, default=4.0, help="λ of Eq. (10.8)")
    parser.add_argument("--stage2-layer-weight", type=float, default=0.0,
                        help="weight of the intermediate layers' hidden states in stage 2 (0: the last only)")
    parser.add_argument("--stage2-schedule", choices=["constant", "cosine"], default="cosine")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes that train the independent parts at once (default: one per CPU core)")
    parser.add_argument("--quick", action="store_true", help="tiny settings, for a look (needs --out)")
    parser.add_argument("--score-only", action="store_true",
                        help="train nothing: re-score the stored models and update only scores in the results file")
    parser.add_argument("--no-adapter-runs", action="store_true",
                        help="train only stage 2 without adapters from the stored stage-1 models; add their rows")
    parser.add_argument("--seed-runs", type=int, default=0, metavar="N",
                        help="train seeds 1 to N - 1 of Hedgehog stage 1, stages 1 + 2 and T2R; add their scores")
    parser.add_argument("--out", default=str(DATA))
    args = parser.parse_args(argv)
    if args.quick and pathlib.Path(args.out).resolve() == DATA.resolve():
        parser.error("--quick writes toy results: pass --out to keep them out of course_lib/data")
    if args.seed_runs:
        if args.seed_runs < 2:
            parser.error("--seed-runs needs at least 2 (seed 0 is the stored run)")
        return seed_runs(pathlib.Path(args.out), seeds=args.seed_runs, jobs=args.jobs, quick=args.quick)
    if args.no_adapter_runs:
        return no_adapter_runs(pathlib.Path(args.out), jobs=args.jobs)
    if args.score_only:
        return score_stored(pathlib.Path(args.out), threads=args.jobs * args.threads)
    if args.quick:
        args.train, args.stage1_train, args.heldout, args.sweep, args.stage1_seeds = 8, 8, 8, [8], 2
        args.stage1_steps, args.stage2_steps = 20, 10
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock, start, cpu_start = Clock(), time.perf_counter(), time.process_time()

    model = load_minilm()
    train, heldout = passage_split(args.train, args.heldout, min_tokens=args.n, tokenizer=model.tokenizer)
    args.train = len(train)
    assert not set(train) & set(heldout)
    stage2_ids, stage2_mask = model.tokenize(train, max_length=args.n, truncate=True)  # (b, n) each
    token_ids, key_mask = model.tokenize(train[:args.stage1_train], max_length=args.n, truncate=True)  # stage 1's
    probe_ids, probe_mask = model.tokenize(heldout[:8], max_length=args.n, truncate=True)
    torch.set_num_threads(args.threads * args.jobs)  # the parts have not started: every core for this one
    exact = clock.run("exact reference", evaluate.exact_reference, model, heldout)
    torch.set_num_threads(args.threads)
    exact_row = {"name": "exact", "training": "none", "cosine": 1.0, "control": float(np.mean(
        (exact["embeddings"] @ exact["embeddings"].T)[~np.eye(len(heldout), dtype=bool)])), "centred_cosine": 1.0,
        "identification": 1.0, "retrieval": exact["retrieval"], "retrieval_hits": exact["retrieval_hits"],
        "retrieval_found": exact["retrieval_found"], "retrieval_lost": 0, "retrieval_gained": 0, "retrieval_p": 1.0,
        "half_cosine": 1.0, "retrieval_control": exact["retrieval"]}
    print(f"  exact: retrieval {exact['retrieval_hits']}/{len(heldout)}", flush=True)
    CONTEXT.update(args=args, out=out, model=model, heldout=heldout, exact=exact, stage1_texts=(token_ids, key_mask),
                   stage2_texts=(stage2_ids, stage2_mask), probe=(probe_ids, probe_mask))

    # The parts share nothing but the context above, so they run in parallel processes (forked:
    # each starts with the loaded model); the longest first.
    parts = [("window", ()), ("hedgehog", ()), ("linformer", ()), ("t2r", ())]
    parts += [("seed", (seed,)) for seed in range(1, args.stage1_seeds)] + [("sweep", (f,)) for f in args.sweep]
    parts += [("untrained", ())]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(run_part, name, *extra) for name, extra in parts]
            done = [future.result() for future in futures]
    else:
        done = [run_part(name, *extra) for name, extra in parts]
    results = {}
    for (name, _), part in zip(parts, done, strict=True):
        results.setdefault(name, []).append(part)
        clock.stages.update(part["stages"])
    hedgehog, window = results["hedgehog"][0], results["window"][0]
    t2r, linformer = results["t2r"][0], results["linformer"][0]
    rows = [exact_row, *results["untrained"][0]["rows"], *hedgehog["rows"], *window["rows"], t2r["row"],
            *linformer["rows"]]
    seed_rows = [{"seed": 0, "cosine": hedgehog["rows"][0]["cosine"]}]
    seed_rows += [part["seed_row"] for part in results.get("seed", [])]
    sweep_rows = [part["sweep_row"] for part in results.get("sweep", [])]
    sweep_rows.append({"f": args.features, "features": 2 * args.features, "cosine": hedgehog["rows"][0]["cosine"],
                       "seconds": hedgehog["seconds"], "heldout_loss": hedgehog["checkpoint_rows"][-1]["heldout_loss"]})
    half = {**hedgehog["half"], **{k: v for part in results.get("sweep", []) for k, v in part["half"].items()}}
    save_file({k: v.contiguous() for k, v in half.items()},
              str(out / "linearized_checkpoints.safetensors"), metadata={"command": COMMAND})

    results = {
        "command": COMMAND + (" --quick" if args.quick else ""), "settings": vars(args),
        "hardware": f"{cpu_name()}, {args.threads} thread(s) per process, {args.jobs} processes at once, "
                    f"torch {torch.__version__}, Python {platform.python_version()}",
        "train_passages": len(train), "stage1_passages": args.stage1_train, "heldout_passages": len(heldout),
        "n": args.n, "rows": rows, "stages": clock.stages, "total_wall_s": time.perf_counter() - start,
        "total_cpu_s": time.process_time() - cpu_start + sum(part["cpu_s"] for part in done),
        "stage1_losses": hedgehog["stage1_losses"], "stage2_losses": hedgehog["losses"],
        "window_stage1_losses": window["stage1_losses"], "window_stage2_losses": window["losses"],
        "t2r_losses": t2r["losses"],
        "linformer_stage1_losses": linformer["stage1_losses"], "linformer_stage2_losses": linformer["losses"],
        "stage2_total_losses": {"hedgehog": hedgehog["total_losses"], "window": window["total_losses"],
                                "t2r": t2r["total_losses"], "linformer": linformer["total_losses"]},
        "stage1_checkpoints": hedgehog["checkpoint_rows"], "stage1_seeds": seed_rows, "feature_sweep": sweep_rows,
        "stage1_one_layer_cosines": hedgehog["one_layer"],
        "added_parameters": {"hedgehog": hedgehog["added"], "window": window["added"], "t2r": t2r["added"],
                             "linformer": linformer["added"]},
    }
    (out / "linearized_results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out} in {results['total_wall_s']:.0f} s wall, {results['total_cpu_s']:.0f} s CPU", flush=True)


RANKING_KEYS = ("mrr", "reciprocal_ranks", "mrr_better", "mrr_worse", "mrr_statistic", "mrr_p", "mrr_control")
SECOND_KEYS = ("cosine", "control", "centred_cosine", "cosines", "retrieval_hits", "half_cosine", *RANKING_KEYS)


def stored_models(model, settings):
    """Row name → a model to score: the exact one, lesson 09's untrained swap-ins and every stored model."""
    generator = torch.Generator().manual_seed(0)  # the same draw of FAVOR+'s omega as part_untrained
    d, k, n = model.config.d_model // model.config.n_heads, settings["k"], settings["n"]
    w = settings["window"]
    return {"exact": model,
            "uniform attention (mean of V)": model.with_attention(lin.uniform_kernel()),
            "elu+1, untrained": model.with_attention(lin.elu_kernel()),
            f"FAVOR+ (m = {settings['m']}), untrained": model.with_attention(
                swap_in.performer_kernel(settings["m"], d, generator)),
            f"Linformer (k = {k}), mean pooling, untrained": model.with_attention(
                swap_in.linformer_kernel(mean_pooling(k, n), mean_pooling(k, n))),
            "Hedgehog, stage 1": lin.load_linearized("hedgehog_stage1"),
            "Hedgehog, stages 1 + 2": lin.load_linearized("hedgehog"),
            f"Hedgehog + window (w = {w}), stage 1": lin.load_linearized("hedgehog_window_stage1"),
            f"Hedgehog + window (w = {w}), stages 1 + 2": lin.load_linearized("hedgehog_window"),
            "T2R, trained end to end": lin.load_linearized("t2r"),
            f"Linformer (k = {k}), E, F learned + end to end": lin.load_linearized("linformer")}


def exact_row_scores(exact, texts):
    """The exact model's own row: cosine 1, its control, its ranking score (the reference of every paired test)."""
    embeddings = exact["embeddings"].astype(np.float64)
    ranks = np.array(exact["reciprocal_ranks"])
    return {"cosine": 1.0, "control": float(np.mean((embeddings @ embeddings.T)[~np.eye(len(texts), dtype=bool)])),
            "centred_cosine": 1.0, "cosines": [1.0] * len(texts), "retrieval_hits": exact["retrieval_hits"],
            "half_cosine": 1.0, "mrr": float(ranks.mean()), "reciprocal_ranks": ranks.tolist(), "mrr_better": 0,
            "mrr_worse": 0, "mrr_statistic": 0.0, "mrr_p": 1.0, "mrr_control": float(ranks.mean())}


def reference_points(model, texts, exact, rng):
    """What the exact model itself gives on a change that should not matter: the cosine's reference points."""
    points = {}
    for name, dtype in (("exact model in float16", torch.float16), ("exact model in bfloat16", torch.bfloat16)):
        lower = swap_in.embeddings(copy.deepcopy(model).to(dtype), texts).astype(np.float64)
        lower /= np.linalg.norm(lower, axis=1, keepdims=True)  # normalised in float64, not in the low precision
        points[name] = np.einsum("td,td->t", lower, exact["embeddings"]).tolist()
    dropped = []
    for text in texts:  # one word, at a random place among the first 120 (inside the 256 tokens the model reads)
        words = text.split()
        i = int(rng.integers(min(len(words), 120)))
        dropped.append(" ".join(words[:i] + words[i + 1:]))
    points["exact model, one word dropped"] = np.einsum("td,td->t", swap_in.embeddings(model, dropped),
                                                         exact["embeddings"]).tolist()
    return points


def token_statistics(tokenizer, texts, n):
    """Tokens per text (cut at n) and per half, and the shares of word pieces and of tokens that are not words."""
    encoded = tokenizer.encode_batch(list(texts))
    tokens = [e.tokens[1:-1][:n - 2] for e in encoded]  # without [CLS] and [SEP]
    flat = [t for text in tokens for t in text]
    halves = [len(e.ids) for half in swap_in.split_halves(list(texts)) for e in tokenizer.encode_batch(half)]
    return {"tokens": float(np.mean([len(t) + 2 for t in tokens])), "half_tokens": float(np.mean(halves)),
            "word_pieces": float(np.mean([t.startswith("##") for t in flat])),
            "not_words": float(np.mean([not t.lstrip("#").isalpha() for t in flat]))}


def score_stored(out, *, threads):
    """``--score-only``: the ranking scores, the second source and the reference points, from the stored models."""
    torch.set_num_threads(threads)
    path = out / "linearized_results.json"
    results = json.loads(path.read_text())
    settings, start = results["settings"], time.perf_counter()
    model = load_minilm()
    _, heldout = passage_split(settings["train"], settings["heldout"], min_tokens=settings["n"],
                               tokenizer=model.tokenizer)
    docstrings = [text for _, text in module_docstrings()]
    models = stored_models(model, settings)
    sources = {"held-out passages": heldout, "module docstrings": docstrings}
    exact = {name: evaluate.exact_reference(model, texts) for name, texts in sources.items()}
    second = []
    for row in results["rows"]:
        name = row["name"]
        if name not in models:
            print(f"  {name}: not stored, kept as it is", flush=True)
            continue
        if name == "exact":
            held = exact_row_scores(exact["held-out passages"], heldout)
            row.update({key: held[key] for key in RANKING_KEYS})
            second.append({"name": name, **exact_row_scores(exact["module docstrings"], docstrings)})
            continue
        new = evaluate.heldout_scores(models[name], heldout, exact["held-out passages"])
        if abs(new["cosine"] - row["cosine"]) > 1e-4:
            raise SystemExit(f"{name}: the stored model gives cosine {new['cosine']:.4f}, the file {row['cosine']:.4f}")
        row.update({key: new[key] for key in RANKING_KEYS})
        other = evaluate.heldout_scores(models[name], docstrings, exact["module docstrings"])
        second.append({"name": name, **{key: other[key] for key in SECOND_KEYS}})
        print(f"  {name}: MRR {new['mrr']:.3f} (p = {new['mrr_p']:.2f}); docstrings: cosine {other['cosine']:.3f} "
              f"(control {other['control']:.2f}), MRR {other['mrr']:.3f} (p = {other['mrr_p']:.2f})", flush=True)
    rng = np.random.default_rng(0)
    points = {name: reference_points(model, texts, exact[name], rng) for name, texts in sources.items()}
    one_layer = []  # the stage-1 map in one layer of the exact model, on the second source
    stage1 = models["Hedgehog, stage 1"]
    for i in range(model.config.n_layers):
        single = copy.deepcopy(model)
        single.layers[i].attention = stage1.layers[i].attention
        one_layer.append(evaluate.heldout_scores(single, docstrings, exact["module docstrings"],
                                                 retrieval=False)["cosine"])
    shorter = {}  # the held-out passages cut to 128 tokens: is the second source's gap its shorter texts?
    short_exact = evaluate.exact_reference(model, heldout, max_length=128)
    for name in ("Hedgehog, stages 1 + 2", f"Hedgehog + window (w = {settings['window']}), stages 1 + 2"):
        shorter[name] = evaluate.heldout_scores(models[name], heldout, short_exact, max_length=128,
                                                retrieval=False)["cosine"]
    results["second_source"] = {
        "source": DOCSTRING_SOURCE, "texts": len(docstrings), "words": [40, 180], "rows": second,
        "tokens": {name: token_statistics(model.tokenizer, texts, settings["n"]) for name, texts in sources.items()},
        "one_layer_cosines": one_layer, "heldout_at_128_tokens": shorter}
    results["reference_points"] = points
    results["score_command"] = COMMAND + " --score-only"
    results["score_wall_s"] = time.perf_counter() - start
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"re-scored {path} in {results['score_wall_s']:.0f} s", flush=True)


NO_ADAPTERS = ", no adapters"


def no_adapter_runs(out, *, jobs):
    """``--no-adapter-runs``: stage 2 with ``rank = 0`` from the stored stage-1 models; rows appended to the file."""
    path = out / "linearized_results.json"
    results = json.loads(path.read_text())
    args = argparse.Namespace(**{**results["settings"], "rank": 0, "out": str(out)})
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = load_minilm()
    train, heldout = passage_split(args.train, args.heldout, min_tokens=args.n, tokenizer=model.tokenizer)
    assert len(train) == results["train_passages"] and not set(train) & set(heldout)
    torch.set_num_threads(args.threads * jobs)
    exact = evaluate.exact_reference(model, heldout)
    torch.set_num_threads(args.threads)
    CONTEXT.update(args=args, out=out, model=model, heldout=heldout, exact=exact,
                   stage2_texts=model.tokenize(train, max_length=args.n, truncate=True))
    parts = [("no_adapters", ("hedgehog_window_stage1",)), ("no_adapters", ("hedgehog_stage1",))]
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            done = [future.result() for future in [pool.submit(run_part, name, *extra) for name, extra in parts]]
    else:
        done = [run_part(name, *extra) for name, extra in parts]
    new = [row for part in reversed(done) for row in part["rows"]]  # Hedgehog first, as in the file
    names = {row["name"] for row in new}
    results["rows"] = [row for row in results["rows"] if row["name"] not in names] + new
    for part in done:
        results["stages"].update(part["stages"])
    results["no_adapter_command"] = COMMAND + " --no-adapter-runs" + (f" --jobs {jobs}" if jobs != 1 else "")
    results["no_adapter_wall_s"] = time.perf_counter() - start
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"added {len(new)} rows to {path} in {results['no_adapter_wall_s']:.0f} s", flush=True)


def part_no_adapters(clock, stored):
    """Stage 2 without adapters (only the maps learn) from the stored stage-1 model ``stored``; its row."""
    args, rows = CONTEXT["args"], []
    student = lin.load_linearized(stored)
    stage1 = next(row for row in json.loads((CONTEXT["out"] / "linearized_results.json").read_text())["rows"]
                  if row["name"] == STAGE1_ROWS[stored](args))
    label = STAGE1_ROWS[stored](args).replace(", stage 1", "")
    student, run = _stage2(clock, f"{label}{NO_ADAPTERS}", student, "hedgehog")
    clock.run(f"score {label}, stages 1 + 2{NO_ADAPTERS}", score, f"{label}, stages 1 + 2{NO_ADAPTERS}", student,
              CONTEXT["heldout"], CONTEXT["exact"], rows, training="stage 1 + stage 2, no adapters",
              seconds=stage1["seconds"] + run["seconds"], added=lin.added_parameters(student),
              command=COMMAND + " --no-adapter-runs")
    return {"rows": rows}


SEED_ROWS = ("Hedgehog, stage 1", "Hedgehog, stages 1 + 2", "T2R, trained end to end")
SEED_KEYS = ("cosine", "control", "centred_cosine", "identification", "retrieval_hits", "half_cosine", "mrr",
             "mrr_better", "mrr_worse", "mrr_p", "mrr_control")
IDENTITY = "Hedgehog at W = I, untrained"


def t2r_start(seed):
    """The name of T2R's untrained start with ``seed``'s random W."""
    return f"T2R at its random start (seed {seed}), untrained"


def seed_runs(out, *, seeds, jobs, quick=False):
    """``--seed-runs``: seeds 1 to ``seeds`` - 1 of ``SEED_ROWS`` and the untrained starts, into ``seed_runs``."""
    path = out / "linearized_results.json"
    results = json.loads(path.read_text())
    settings = {**results["settings"], "out": str(out)}
    if quick:  # a few steps on a few short passages: does the mode write its fields?
        settings.update(train=4, stage1_train=4, heldout=4, n=32, stage1_steps=2, stage2_steps=2, stage1_batch=2,
                        stage2_batch=2, features=4, t2r_features=8, rank=2)
    args = argparse.Namespace(**settings)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    start, cpu = time.perf_counter(), time.process_time()
    model = load_minilm()
    train, heldout = passage_split(args.train, args.heldout, min_tokens=args.n, tokenizer=model.tokenizer)
    assert quick or len(train) == results["train_passages"]
    assert not set(train) & set(heldout)
    torch.set_num_threads(args.threads * jobs)
    exact = evaluate.exact_reference(model, heldout, max_length=args.n)
    torch.set_num_threads(args.threads)
    CONTEXT.update(args=args, out=out, model=model, heldout=heldout, exact=exact,
                   stage1_texts=model.tokenize(train[:args.stage1_train], max_length=args.n, truncate=True),
                   stage2_texts=model.tokenize(train, max_length=args.n, truncate=True))
    parts = [("seed_hedgehog", (seed,)) for seed in range(1, seeds)]  # the longest first
    parts += [("seed_t2r", (seed,)) for seed in range(1, seeds)] + [("starts", (seed,)) for seed in range(seeds)]
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            done = [future.result() for future in [pool.submit(run_part, name, *extra) for name, extra in parts]]
    else:
        done = [run_part(name, *extra) for name, extra in parts]
    stored = {row["name"]: row for row in results["rows"]}
    runs = {name: [{"seed": 0, "seconds": stored[name].get("seconds"), "stored": True,
                    **{key: stored[name][key] for key in SEED_KEYS}}] for name in SEED_ROWS}
    for part in done:
        for name, row in part.get("seed_rows", {}).items():
            runs[name].append(row)
    starts = {name: row for part in done for name, row in part.get("starts", {}).items()}
    command = COMMAND + f" --seed-runs {seeds}" + (f" --jobs {jobs}" if jobs != 1 else "")
    command += " --quick" if quick else ""
    results["seed_runs"] = {
        "command": command, "seeds": list(range(seeds)), "rows": runs, "summary": {
            name: {key: seed_summary([run[key] for run in rows]) for key in ("cosine", "mrr", "retrieval_hits")}
            for name, rows in runs.items()},
        "starts": starts, "stages": {k: v for part in done for k, v in part["stages"].items()},
        "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu + sum(p["cpu_s"] for p in done)}
    results["stage1_seeds"] = [{"seed": run["seed"], "cosine": run["cosine"]} for run in runs["Hedgehog, stage 1"]]
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"added seeds 1 to {seeds - 1} to {path} in {results['seed_runs']['wall_s']:.0f} s", flush=True)


def seed_summary(values):
    """Seed 0 (the stored model), the mean, and the lowest and highest over the seeds."""
    return {"seed0": values[0], "mean": float(np.mean(values)), "low": min(values), "high": max(values)}


def _seed_row(clock, name, student, seed, seconds, cpu_s):
    """``student`` scored like the stored row ``name``: the scores of ``SEED_KEYS`` and the training time."""
    result = clock.run(f"score {name}, seed {seed}", score, name, student, CONTEXT["heldout"], CONTEXT["exact"], [],
                       max_length=CONTEXT["args"].n)
    return {"seed": seed, "seconds": seconds, "cpu_s": cpu_s, **{key: result[key] for key in SEED_KEYS}}


def part_seed_hedgehog(clock, seed):
    """Hedgehog stage 1 and then stage 2 with ``seed``; both rows' scores."""
    args, model = CONTEXT["args"], CONTEXT["model"]
    hedgehog = lin.linearize(model, "hedgehog", n_features=args.features, seed=seed)
    first = clock.run(f"Hedgehog stage 1, seed {seed}", lin.distill_attention, hedgehog, model,
                      *CONTEXT["stage1_texts"], seed=seed, **_stage1_settings(args))
    first_cpu = clock.stages[f"Hedgehog stage 1, seed {seed}"]["cpu_s"]
    rows = {SEED_ROWS[0]: _seed_row(clock, SEED_ROWS[0], hedgehog, seed, first["seconds"], first_cpu)}
    hedgehog, run = _stage2(clock, f"Hedgehog, seed {seed}", hedgehog, "hedgehog", seed=seed,
                            n_features=args.features)
    cpu_s = first_cpu + clock.stages[f"Hedgehog, seed {seed} stage 2"]["cpu_s"]
    rows[SEED_ROWS[1]] = _seed_row(clock, SEED_ROWS[1], hedgehog, seed, first["seconds"] + run["seconds"], cpu_s)
    return {"seed_rows": rows}


def part_seed_t2r(clock, seed):
    """T2R with ``seed``: its random W, its adapters and its minibatches; its row's scores."""
    args = CONTEXT["args"]
    t2r = lin.linearize(CONTEXT["model"], "t2r", n_features=args.t2r_features, seed=seed)
    t2r, run = _stage2(clock, f"T2R, seed {seed}", t2r, "t2r", seed=seed, n_features=args.t2r_features)
    cpu_s = clock.stages[f"T2R, seed {seed} stage 2"]["cpu_s"]
    return {"seed_rows": {SEED_ROWS[2]: _seed_row(clock, SEED_ROWS[2], t2r, seed, run["seconds"], cpu_s)}}


def part_starts(clock, seed):
    """The untrained starts, scored like every row: T2R at ``seed``'s random W and, with seed 0, Hedgehog at W = I."""
    args, model, starts = CONTEXT["args"], CONTEXT["model"], {}
    models = {t2r_start(seed): lin.linearize(model, "t2r", n_features=args.t2r_features, seed=seed)}
    if seed == 0:  # W = I, b = 0 whatever the seed: one row
        models[IDENTITY] = lin.linearize(model, "hedgehog", n_features=args.features)
    for name, start in models.items():
        result = clock.run(f"score {name}", score, name, start, CONTEXT["heldout"], CONTEXT["exact"], [],
                           max_length=args.n)
        starts[name] = {"name": name, "training": "none", "seed": seed, **{key: result[key] for key in SEED_KEYS},
                        "cosines": result["cosines"], "reciprocal_ranks": result["reciprocal_ranks"]}
    return {"starts": starts}


STAGE1_ROWS = {"hedgehog_stage1": lambda args: "Hedgehog, stage 1",
               "hedgehog_window_stage1": lambda args: f"Hedgehog + window (w = {args.window}), stage 1"}


CONTEXT = {}  # what every part reads: set by main before the parts run (inherited by forked processes)


def run_part(name, *extra):
    """Run one part in this process; its result, with its stages' wall and CPU seconds and its total CPU."""
    torch.set_num_threads(CONTEXT["args"].threads)
    cpu = time.process_time()
    clock = Clock()
    result = PARTS[name](clock, *extra)
    return {**result, "stages": clock.stages, "cpu_s": time.process_time() - cpu}


def _stage1_settings(args):
    return dict(steps=args.stage1_steps, lr=args.stage1_lr, batch_size=args.stage1_batch, rows=args.stage1_rows)


def _stage2_settings(args):
    return dict(steps=args.stage2_steps, lr=args.stage2_lr, batch_size=args.stage2_batch,
                embedding_weight=args.stage2_embedding_weight, layer_weight=args.stage2_layer_weight,
                schedule=args.stage2_schedule)


def _with_adapters(student, method, *, seed=0, **options):
    """``student``'s trained kernels in a fresh ``linearize``d model with adapters (for stage 2)."""
    args = CONTEXT["args"]
    if not args.rank:
        return student
    staged = lin.linearize(CONTEXT["model"], method, rank=args.rank, adapt=args.adapt, seed=seed, **options)
    return lin.load_trained(staged, {**lin.trainable_state(staged), **lin.trainable_state(student)})


def _stage2(clock, name, student, method, *, seed=0, **options):
    """Stage 2 with adapters on the stage-2 texts (``seed``: their A and the minibatch order); the model, its run."""
    student = _with_adapters(student, method, seed=seed, **options)
    run = clock.run(f"{name} stage 2", lin.distill_outputs, student, CONTEXT["model"], *CONTEXT["stage2_texts"],
                    seed=seed, **_stage2_settings(CONTEXT["args"]))
    return student, run


def part_untrained(clock):
    """The untrained swap-ins of lesson 09: uniform attention, elu+1, FAVOR+, mean-pooling Linformer."""
    args, model, rows = CONTEXT["args"], CONTEXT["model"], []
    generator = torch.Generator().manual_seed(0)
    d = model.config.d_model // model.config.n_heads
    untrained = {"uniform attention (mean of V)": lin.uniform_kernel(), "elu+1, untrained": lin.elu_kernel(),
                 f"FAVOR+ (m = {args.m}), untrained": swap_in.performer_kernel(args.m, d, generator),
                 f"Linformer (k = {args.k}), mean pooling, untrained": swap_in.linformer_kernel(
                     mean_pooling(args.k, args.n), mean_pooling(args.k, args.n))}
    for name, kernel in untrained.items():
        clock.run(f"score {name}", score, name, model.with_attention(kernel), CONTEXT["heldout"], CONTEXT["exact"],
                  rows, training="none")
    return {"rows": rows}


def part_hedgehog(clock):
    """Hedgehog stage 1 (seed 0) with checkpoints for the steps widget, one layer at a time, then stage 2."""
    args, model, heldout, exact = CONTEXT["args"], CONTEXT["model"], CONTEXT["heldout"], CONTEXT["exact"]
    marks = sorted({0, *(int(round(args.stage1_steps * x)) for x in (0.05, 0.125, 0.25, 0.5, 1.0))})
    half = {}  # the checkpoints' maps in float16 (a heatmap's precision): the file stays small
    hedgehog = lin.linearize(model, "hedgehog", n_features=args.features)
    first = clock.run("Hedgehog stage 1", lin.distill_attention, hedgehog, model, *CONTEXT["stage1_texts"],
                      checkpoints=marks, seed=0, **_stage1_settings(args))
    checkpoint_rows = []
    for step, state in first["checkpoints"].items():
        lin.load_trained(hedgehog, state)
        result = evaluate.heldout_scores(hedgehog, heldout, exact, retrieval=False)
        checkpoint_rows.append({"step": step, "cosine": result["cosine"], "centred_cosine": result["centred_cosine"],
                                "heldout_loss": heldout_attention_loss(hedgehog, model, *CONTEXT["probe"])})
        if 0 < step < args.stage1_steps:  # step 0 is W = I, the last step is linearized_hedgehog_stage1
            half.update({f"step{step}.{key}": value.half() for key, value in state.items()})
        print(f"  stage 1 checkpoint {step}: cosine {result['cosine']:.3f}", flush=True)
    lin.save_linearized(hedgehog, CONTEXT["out"] / "linearized_hedgehog_stage1.safetensors", command=COMMAND)
    rows = []
    clock.run("score Hedgehog, stage 1", score, "Hedgehog, stage 1", hedgehog, heldout, exact, rows,
              training="stage 1", seconds=first["seconds"])
    one_layer = []  # the stage-1 map of one layer in the exact model: which layer costs most
    for i in range(model.config.n_layers):
        single = copy.deepcopy(model)
        single.layers[i].attention = hedgehog.layers[i].attention
        one_layer.append(evaluate.heldout_scores(single, heldout, exact, retrieval=False)["cosine"])
    print("  one layer at a time: " + ", ".join(f"{c:.3f}" for c in one_layer), flush=True)
    hedgehog, run = _stage2(clock, "Hedgehog", hedgehog, "hedgehog", n_features=args.features)
    lin.save_linearized(hedgehog, CONTEXT["out"] / "linearized_hedgehog.safetensors", command=COMMAND)
    clock.run("score Hedgehog, stages 1 + 2", score, "Hedgehog, stages 1 + 2", hedgehog, heldout, exact, rows,
              training="stage 1 + stage 2", seconds=first["seconds"] + run["seconds"])
    return {"rows": rows, "stage1_losses": first["losses"], "seconds": first["seconds"],
            "checkpoint_rows": checkpoint_rows, "half": half, "one_layer": one_layer, "losses": run["losses"],
            "total_losses": run["total_losses"], "added": lin.added_parameters(hedgehog)}


def part_window(clock):
    """Hedgehog with a sliding window of 2w + 1 exact keys (Eq. 10.9): stage 1, then stage 2."""
    args, model, heldout, exact = CONTEXT["args"], CONTEXT["model"], CONTEXT["heldout"], CONTEXT["exact"]
    options = dict(n_features=args.features, window=args.window)
    windowed = lin.linearize(model, "hedgehog", **options)
    first = clock.run("Hedgehog + window stage 1", lin.distill_attention, windowed, model, *CONTEXT["stage1_texts"],
                      seed=0, **_stage1_settings(args))
    lin.save_linearized(windowed, CONTEXT["out"] / "linearized_hedgehog_window_stage1.safetensors", command=COMMAND)
    rows, name = [], f"Hedgehog + window (w = {args.window})"
    clock.run("score Hedgehog + window, stage 1", score, f"{name}, stage 1", windowed, heldout, exact, rows,
              training="stage 1", seconds=first["seconds"])
    windowed, run = _stage2(clock, "Hedgehog + window", windowed, "hedgehog", **options)
    lin.save_linearized(windowed, CONTEXT["out"] / "linearized_hedgehog_window.safetensors", command=COMMAND)
    clock.run("score Hedgehog + window, stages 1 + 2", score, f"{name}, stages 1 + 2", windowed, heldout, exact,
              rows, training="stage 1 + stage 2", seconds=first["seconds"] + run["seconds"])
    return {"rows": rows, "stage1_losses": first["losses"], "losses": run["losses"],
            "total_losses": run["total_losses"], "added": lin.added_parameters(windowed)}


def part_seed(clock, seed):
    """Hedgehog stage 1 with another seed (minibatch order and rows): the spread of stage 1."""
    args, model = CONTEXT["args"], CONTEXT["model"]
    other = lin.linearize(model, "hedgehog", n_features=args.features)
    clock.run(f"Hedgehog stage 1, seed {seed}", lin.distill_attention, other, model, *CONTEXT["stage1_texts"],
              seed=seed,
              **_stage1_settings(args))
    cosine = evaluate.heldout_scores(other, CONTEXT["heldout"], CONTEXT["exact"], retrieval=False)["cosine"]
    print(f"  stage 1 seed {seed}: cosine {cosine:.3f}", flush=True)
    return {"seed_row": {"seed": seed, "cosine": cosine}}


def part_sweep(clock, f):
    """Hedgehog stage 1 with f features per half: the features widget."""
    args, model = CONTEXT["args"], CONTEXT["model"]
    other = lin.linearize(model, "hedgehog", n_features=f)
    run = clock.run(f"Hedgehog stage 1, f = {f}", lin.distill_attention, other, model, *CONTEXT["stage1_texts"],
                    seed=0, **_stage1_settings(args))
    result = evaluate.heldout_scores(other, CONTEXT["heldout"], CONTEXT["exact"], retrieval=False)
    print(f"  stage 1 with f = {f}: cosine {result['cosine']:.3f}", flush=True)
    return {"sweep_row": {"f": f, "features": 2 * f, "cosine": result["cosine"], "seconds": run["seconds"],
                          "heldout_loss": heldout_attention_loss(other, model, *CONTEXT["probe"])},
            "half": {f"features{2 * f}.{key}": value.half() for key, value in lin.trainable_state(other).items()}}


def part_t2r(clock):
    """T2R: random relu maps swapped in, then trained end to end (stage 2 only)."""
    args, model = CONTEXT["args"], CONTEXT["model"]
    t2r, run = _stage2(clock, "T2R", lin.linearize(model, "t2r", n_features=args.t2r_features), "t2r",
                       n_features=args.t2r_features)
    lin.save_linearized(t2r, CONTEXT["out"] / "linearized_t2r.safetensors", command=COMMAND)
    rows = []
    clock.run("score T2R", score, "T2R, trained end to end", t2r, CONTEXT["heldout"], CONTEXT["exact"], rows,
              training="stage 2", seconds=run["seconds"])
    return {"row": rows[0], "losses": run["losses"], "total_losses": run["total_losses"],
            "added": lin.added_parameters(t2r)}


def part_linformer(clock):
    """Linformer: E, F learned for every layer (stage 1, lesson 04's loss), then trained end to end."""
    args, model, heldout, exact = CONTEXT["args"], CONTEXT["model"], CONTEXT["heldout"], CONTEXT["exact"]
    linformer = lin.linearize(model, "linformer", k_proj=args.k, n_max=args.n)
    first = clock.run("Linformer stage 1", lin.distill_attention, linformer, model, *CONTEXT["stage1_texts"], seed=0,
                      **{**_stage1_settings(args), "lr": args.linformer_lr})
    rows = []
    clock.run("score Linformer, stage 1", score, f"Linformer (k = {args.k}), E, F learned", linformer, heldout, exact,
              rows, training="stage 1", seconds=first["seconds"])
    linformer, run = _stage2(clock, "Linformer", linformer, "linformer", k_proj=args.k, n_max=args.n)
    lin.save_linearized(linformer, CONTEXT["out"] / "linearized_linformer.safetensors", command=COMMAND)
    clock.run("score Linformer, stages 1 + 2", score, f"Linformer (k = {args.k}), E, F learned + end to end",
              linformer, heldout, exact, rows, training="stage 1 + stage 2", seconds=first["seconds"] + run["seconds"])
    return {"rows": rows, "stage1_losses": first["losses"], "losses": run["losses"],
            "total_losses": run["total_losses"], "added": lin.added_parameters(linformer)}


PARTS = {"untrained": part_untrained, "hedgehog": part_hedgehog, "window": part_window, "seed": part_seed,
         "sweep": part_sweep, "t2r": part_t2r, "linformer": part_linformer,
         "no_adapters": part_no_adapters, "seed_hedgehog": part_seed_hedgehog, "seed_t2r": part_seed_t2r,
         "starts": part_starts}


if __name__ == "__main__":
    main()
