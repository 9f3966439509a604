"""Train the linearized MiniLMs of notebook 10 and score every variant on held-out passages.

    python tools/train_linearized.py                  write course_lib/data/linearized_*.{safetensors,json}
    python tools/train_linearized.py --quick --out /tmp/l10    a small run in a few minutes, for a look

Every fit uses the *training* passages of ``course_lib.tasks.passage_split`` (the corpus's
start); every score comes from its *held-out* passages (the corpus's end), which no stage sees.
What it trains, in order (each stage's wall time and process CPU time are stored):

1. Hedgehog (Zhang et al. 2024): maps with W = I at the start; stage 1 (attention distillation
   per layer) with checkpoints for the notebook's training-steps widget, repeated with other
   seeds (the spread) and with fewer features (the features widget); then stage 2 (end to end).
2. T2R (Kasai et al. 2021): random relu maps swapped in, trained end to end (stage 2 only).
3. Linformer: E, F learned for every layer (stage 1, lesson 04's loss), then trained end to end.

and it scores, on the same held-out passages, the exact model and the untrained swap-ins of
lesson 09 (uniform attention, elu+1, FAVOR+, mean-pooling Linformer).
"""

import argparse
import copy
import json
import pathlib
import platform
import sys
import time

import numpy as np
import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import linearize as lin  # noqa: E402
from course_lib import swap_in  # noqa: E402
from course_lib.linearize import evaluate  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import passage_split  # noqa: E402
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


def score(name, model, heldout, exact, rows, **info):
    """Score ``model`` on the held-out passages and append a row of the results table."""
    result = evaluate.heldout_scores(model, heldout, exact)
    rows.append({"name": name, **info, **{k: v for k, v in result.items()}})
    print(f"  {name}: cosine {result['cosine']:.3f} (control {result['control']:.3f}), centred "
          f"{result['centred_cosine']:.3f}, retrieval {result['retrieval_hits']}/{len(heldout)}", flush=True)
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
    parser.add_argument("--train", type=int, default=64, help="training passages (from the corpus's start)")
    parser.add_argument("--stage1-train", type=int, default=32, help="the first of them that stage 1 uses")
    parser.add_argument("--heldout", type=int, default=48, help="held-out passages (from the corpus's end)")
    parser.add_argument("--n", type=int, default=256, help="tokens per passage")
    parser.add_argument("--features", type=int, default=32, help="f of each Hedgehog map (2f features)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[8, 16], help="other f, stage 1 only")
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
    parser.add_argument("--stage1-seeds", type=int, default=3, help="stage 1 runs (seeds of minibatch order)")
    parser.add_argument("--stage2-steps", type=int, default=150)
    parser.add_argument("--stage2-lr", type=float, default=3e-3)
    parser.add_argument("--stage2-batch", type=int, default=4)
    parser.add_argument("--stage2-embedding-weight", type=float, default=4.0, help="λ of Eq. (10.7)")
    parser.add_argument("--stage2-layer-weight", type=float, default=0.0,
                        help="weight of the intermediate layers' hidden states in stage 2 (0: the last only)")
    parser.add_argument("--stage2-schedule", choices=["constant", "cosine"], default="constant")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny settings, for a look (needs --out)")
    parser.add_argument("--out", default=str(DATA))
    args = parser.parse_args(argv)
    if args.quick:
        if pathlib.Path(args.out).resolve() == DATA.resolve():
            parser.error("--quick writes toy results: pass --out to keep them out of course_lib/data")
        args.train, args.stage1_train, args.heldout, args.sweep, args.stage1_seeds = 8, 8, 8, [8], 2
        args.stage1_steps, args.stage2_steps = 20, 10
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock, start = Clock(), time.perf_counter()

    model = load_minilm()
    train, heldout = passage_split(args.train, args.heldout, min_tokens=args.n, tokenizer=model.tokenizer)
    assert not set(train) & set(heldout)
    token_ids, key_mask = model.tokenize(train, max_length=args.n, truncate=True)  # (b, n) each
    ids1, mask1 = token_ids[:args.stage1_train], key_mask[:args.stage1_train]  # stage 1 keeps q, k, v of each layer
    probe_ids, probe_mask = model.tokenize(heldout[:8], max_length=args.n, truncate=True)
    exact = clock.run("exact reference", evaluate.exact_reference, model, heldout)
    rows = [{"name": "exact", "training": "none", "cosine": 1.0, "control": float(np.mean(
        (exact["embeddings"] @ exact["embeddings"].T)[~np.eye(len(heldout), dtype=bool)])), "centred_cosine": 1.0,
        "identification": 1.0, "retrieval": exact["retrieval"], "retrieval_hits": exact["retrieval_hits"]}]
    print(f"  exact: retrieval {exact['retrieval_hits']}/{len(heldout)}", flush=True)

    # --- untrained swap-ins (lesson 09) ---
    generator = torch.Generator().manual_seed(0)
    d = model.config.d_model // model.config.n_heads
    untrained = {"uniform attention (mean of V)": lin.uniform_kernel(), "elu+1, untrained": lin.elu_kernel(),
                 f"FAVOR+ (m = {args.m}), untrained": swap_in.performer_kernel(args.m, d, generator),
                 f"Linformer (k = {args.k}), mean pooling, untrained": swap_in.linformer_kernel(
                     mean_pooling(args.k, args.n), mean_pooling(args.k, args.n))}
    for name, kernel in untrained.items():
        clock.run(f"score {name}", score, name, model.with_attention(kernel), heldout, exact, rows, training="none")

    # --- Hedgehog: stage 1 (with checkpoints, seeds and fewer features), then stage 2 ---
    steps1 = dict(steps=args.stage1_steps, lr=args.stage1_lr, batch_size=args.stage1_batch, rows=args.stage1_rows)
    marks = sorted({0, *(int(round(args.stage1_steps * x)) for x in (0.05, 0.125, 0.25, 0.5, 1.0))})
    half = {}  # the checkpoints' maps in float16 (a heatmap's precision): the file stays small
    hedgehog = lin.linearize(model, "hedgehog", n_features=args.features)
    stage1 = clock.run("Hedgehog stage 1", lin.distill_attention, hedgehog, model, ids1, mask1,
                       checkpoints=marks, seed=0, **steps1)
    checkpoint_rows = []
    for step, state in stage1["checkpoints"].items():
        lin.load_trained(hedgehog, state)
        result = evaluate.heldout_scores(hedgehog, heldout, exact, retrieval=False)
        checkpoint_rows.append({"step": step, "cosine": result["cosine"], "centred_cosine": result["centred_cosine"],
                                "heldout_loss": heldout_attention_loss(hedgehog, model, probe_ids, probe_mask)})
        if 0 < step < args.stage1_steps:  # step 0 is W = I, the last step is linearized_hedgehog_stage1
            half.update({f"step{step}.{key}": value.half() for key, value in state.items()})
        print(f"  stage 1 checkpoint {step}: cosine {result['cosine']:.3f}", flush=True)
    lin.save_linearized(hedgehog, out / "linearized_hedgehog_stage1.safetensors", command=COMMAND)
    score("Hedgehog, stage 1", hedgehog, heldout, exact, rows, training="stage 1", seconds=stage1["seconds"])
    one_layer = []  # the stage-1 map of one layer in the exact model: which layer costs most
    for i in range(model.config.n_layers):
        single = copy.deepcopy(model)
        single.layers[i].attention = hedgehog.layers[i].attention
        one_layer.append(evaluate.heldout_scores(single, heldout, exact, retrieval=False)["cosine"])
    print("  one layer at a time: " + ", ".join(f"{c:.3f}" for c in one_layer), flush=True)
    seed_rows = [{"seed": 0, "cosine": rows[-1]["cosine"]}]
    for seed in range(1, args.stage1_seeds):
        other = lin.linearize(model, "hedgehog", n_features=args.features)
        clock.run(f"Hedgehog stage 1, seed {seed}", lin.distill_attention, other, model, ids1, mask1,
                  seed=seed, **steps1)
        cosine = evaluate.heldout_scores(other, heldout, exact, retrieval=False)["cosine"]
        seed_rows.append({"seed": seed, "cosine": cosine})
        print(f"  stage 1 seed {seed}: cosine {seed_rows[-1]['cosine']:.3f}", flush=True)
    sweep_rows = []
    for f in args.sweep:
        other = lin.linearize(model, "hedgehog", n_features=f)
        run = clock.run(f"Hedgehog stage 1, f = {f}", lin.distill_attention, other, model, ids1, mask1,
                        seed=0, **steps1)
        result = evaluate.heldout_scores(other, heldout, exact, retrieval=False)
        sweep_rows.append({"f": f, "features": 2 * f, "cosine": result["cosine"], "seconds": run["seconds"],
                           "heldout_loss": heldout_attention_loss(other, model, probe_ids, probe_mask)})
        half.update({f"features{2 * f}.{key}": value.half() for key, value in lin.trainable_state(other).items()})
        print(f"  stage 1 with f = {f}: cosine {result['cosine']:.3f}", flush=True)
    sweep_rows.append({"f": args.features, "features": 2 * args.features, "cosine": seed_rows[0]["cosine"],
                       "seconds": stage1["seconds"], "heldout_loss": checkpoint_rows[-1]["heldout_loss"]})
    save_file({k: v.contiguous() for k, v in half.items()},
              str(out / "linearized_checkpoints.safetensors"), metadata={"command": COMMAND})

    steps2 = dict(steps=args.stage2_steps, lr=args.stage2_lr, batch_size=args.stage2_batch,
                  embedding_weight=args.stage2_embedding_weight, layer_weight=args.stage2_layer_weight,
                  schedule=args.stage2_schedule)
    adapters = dict(rank=args.rank, adapt=args.adapt)
    if args.rank:
        staged = lin.linearize(model, "hedgehog", n_features=args.features, **adapters)
        lin.load_trained(staged, {**lin.trainable_state(staged), **lin.trainable_state(hedgehog)})
        hedgehog = staged
    stage2 = clock.run("Hedgehog stage 2", lin.distill_outputs, hedgehog, model, token_ids, key_mask, seed=0, **steps2)
    lin.save_linearized(hedgehog, out / "linearized_hedgehog.safetensors", command=COMMAND)
    score("Hedgehog, stages 1 + 2", hedgehog, heldout, exact, rows, training="stage 1 + stage 2",
          seconds=stage1["seconds"] + stage2["seconds"])

    # --- T2R: swap in, then train end to end ---
    t2r = lin.linearize(model, "t2r", n_features=args.t2r_features, **adapters)
    t2r_run = clock.run("T2R stage 2", lin.distill_outputs, t2r, model, token_ids, key_mask, seed=0, **steps2)
    lin.save_linearized(t2r, out / "linearized_t2r.safetensors", command=COMMAND)
    score("T2R, trained end to end", t2r, heldout, exact, rows, training="stage 2", seconds=t2r_run["seconds"])

    # --- Linformer: E, F learned for every layer, then end to end ---
    linformer = lin.linearize(model, "linformer", k_proj=args.k, n_max=args.n)
    lf1 = clock.run("Linformer stage 1", lin.distill_attention, linformer, model, ids1, mask1, seed=0,
                    **{**steps1, "lr": args.linformer_lr})
    score(f"Linformer (k = {args.k}), E, F learned", linformer, heldout, exact, rows, training="stage 1",
          seconds=lf1["seconds"])
    if args.rank:
        staged = lin.linearize(model, "linformer", k_proj=args.k, n_max=args.n, **adapters)
        lin.load_trained(staged, {**lin.trainable_state(staged), **lin.trainable_state(linformer)})
        linformer = staged
    lf2 = clock.run("Linformer stage 2", lin.distill_outputs, linformer, model, token_ids, key_mask, seed=0, **steps2)
    lin.save_linearized(linformer, out / "linearized_linformer.safetensors", command=COMMAND)
    score(f"Linformer (k = {args.k}), E, F learned + end to end", linformer, heldout, exact, rows,
          training="stage 1 + stage 2", seconds=lf1["seconds"] + lf2["seconds"])

    results = {
        "command": COMMAND + (" --quick" if args.quick else ""), "settings": vars(args),
        "hardware": f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}",
        "train_passages": len(train), "stage1_passages": len(ids1), "heldout_passages": len(heldout), "n": args.n,
        "rows": rows, "stages": clock.stages, "total_wall_s": time.perf_counter() - start,
        "stage1_losses": stage1["losses"], "stage2_losses": stage2["losses"], "t2r_losses": t2r_run["losses"],
        "linformer_stage1_losses": lf1["losses"], "linformer_stage2_losses": lf2["losses"],
        "stage2_total_losses": {"hedgehog": stage2["total_losses"], "t2r": t2r_run["total_losses"],
                                "linformer": lf2["total_losses"]},  # what stage 2 minimised: Eq. 10.7 + layers' term
        "stage1_checkpoints": checkpoint_rows, "stage1_seeds": seed_rows, "feature_sweep": sweep_rows,
        "stage1_one_layer_cosines": one_layer,
        "added_parameters": {"hedgehog": lin.added_parameters(hedgehog), "t2r": lin.added_parameters(t2r),
                             "linformer": lin.added_parameters(linformer)},
    }
    (out / "linearized_results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out} in {results['total_wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
