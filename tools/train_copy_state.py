"""Lesson 07's copy task again, for notebook 11: a wider state, and the delta rule.

The runs behind notebook 11, Section 11.5.  Lesson 07's linear model never copied 99 % of the
tokens in any seed; read as a memory, each of its heads holds up to 32 position-to-symbol pairs
in a 16 × 16 state.  Two questions, on exactly lesson 07's task, batches, held-out batch,
optimiser and seeds (``tools/train_copy.py``):

* **the state's size**: lesson 07's own model (elu + 1 features, no convolution) with one head of
  64 instead of four of 16 — a state of 64 × 64 per layer instead of 4 × 16 × 16, the same
  parameters.  Its four-head runs are lesson 07's stored ones (``copy_runs.json``), not re-run.
* **the delta rule**: ``tasks.mqar_model``'s ``"deltanet"`` at four heads of 16 (the same state as
  lesson 07's model), beside ``"linear"`` with the same front end (short convolution,
  L2-normalised keys, no decay): the mixer is the only difference between those two.  And
  ``"linear"`` without the convolution, to tell the front end's share from the keys' and features'.

Every run trains up to ``STEPS`` steps (lesson 07's 3,000) and stops early once the held-out
accuracy (teacher forcing, scored every ``EVAL_EVERY`` steps before the next update) reaches
``STOP_ACCURACY``; scoring draws nothing from the training generator, so a run that stops early
is the same run as a longer one up to that step.  At the end each model also *generates* the
copies of the held-out batch greedily, token by token (a whole forward pass per new token: exact
for any causal model, whatever its mixer).

Each run is one process with one CPU thread; ``--jobs`` runs that many at once.

    python tools/train_copy_state.py          write course_lib/data/copy_state_runs.json (12 min on 2 cores)
    python tools/train_copy_state.py --seeds 0 --steps 100 --out /tmp/copy_state.json   a quick look
"""

import argparse
import multiprocessing
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import tasks  # noqa: E402
from course_lib.torch.causal_lm import CausalLM  # noqa: E402
from tools import train_copy  # noqa: E402
from tools.train_copy import batch_seed, write_runs  # noqa: E402

TASK, MODEL, TRAIN, STEPS, SEEDS = (train_copy.TASK, train_copy.MODEL, train_copy.TRAIN, train_copy.STEPS,
                                    train_copy.SEEDS)  # lesson 07's task, model width, optimiser, steps, seeds
EVAL_EVERY, TEST_SEED, TEST_BATCH = train_copy.EVAL_EVERY, train_copy.TEST_SEED, train_copy.TEST_BATCH

STOP_ACCURACY = 0.99
VARIANTS = {  # name: (model family, heads, short-convolution width); d_model = 64 and 2 layers, as lesson 07's
    "elu+1 linear, 1 head": ("causal_lm", 1, 0),
    "linear, L2 keys, 4 heads": ("linear", 4, 0),
    "linear, conv + L2 keys, 4 heads": ("linear", 4, 4),
    "DeltaNet, 4 heads": ("deltanet", 4, 4),
}


def build(variant, seed):
    """The model of one run, its weights fixed by ``seed`` (as lesson 07's ``build``)."""
    family, heads, conv_size = VARIANTS[variant]
    torch.manual_seed(seed)
    vocab, max_len = TASK["n_symbols"] + 1, 2 * TASK["length"]
    if family == "causal_lm":
        return CausalLM(vocab, max_len, attention="linear", d_model=MODEL["d_model"], n_heads=heads,
                        n_layers=MODEL["n_layers"])
    return tasks.mqar_model(family, vocab, max_len, d_model=MODEL["d_model"], n_heads=heads,
                            n_layers=MODEL["n_layers"], conv_size=conv_size)


def state_numbers(variant):
    """Recurrent-state numbers per sequence and layer: heads × (64 / heads)² (elu + 1 keeps f = d features)."""
    heads = VARIANTS[variant][1]
    return heads * (MODEL["d_model"] // heads) ** 2


def greedy_copy(model, prompt, n_new):
    """``prompt (b, p)`` followed by ``n_new`` greedy tokens of ``model``: one forward pass of the prefix per token.

    Exact greedy decoding for any causal model, whatever its mixer (lesson 07's ``generate`` steps
    the RNN or the key/value cache instead; both give the same tokens).
    """
    made = prompt
    model.eval()
    with torch.no_grad():
        for _ in range(n_new):
            made = torch.cat([made, model(made)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return made


def greedy_accuracy(model, tokens):
    """Per-token accuracy of the copies ``model`` makes greedily from each row's first half and separator."""
    lengths = tasks.copy_lengths(tokens)
    right = total = 0
    for length in lengths.unique().tolist():  # one prompt length per group of rows
        rows = tokens[lengths == length]
        made = greedy_copy(model, rows[:, :length + 1], length)  # (rows, 2L + 1)
        right += (made[:, length + 1:] == rows[:, length + 1:2 * length + 1]).sum().item()
        total += rows.shape[0] * length
    return right / total


def held_out():
    """Lesson 07's held-out batch of 256 rows (its own generator: never a training batch)."""
    return tasks.copy_batch(TEST_BATCH, TASK["length"], TASK["n_symbols"], torch.Generator().manual_seed(TEST_SEED),
                            min_length=TASK["min_length"])


def score(model):
    """``(loss, accuracy)`` on the held-out batch, teacher-forced, without gradients (the model left in eval mode)."""
    return tasks.evaluate_copy(model, **TASK, generator=torch.Generator().manual_seed(TEST_SEED),
                               batch_size=TEST_BATCH)


def run(job):
    """One training run in its own process: ``job = (variant, seed, steps)``."""
    variant, seed, steps = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(variant, seed)
    generator = torch.Generator().manual_seed(batch_seed(seed))
    start = time.perf_counter()
    history = tasks.train_scored(  # lesson 07's training loop (tasks.train_copy), with the early stop
        model, lambda: tasks.copy_loss(model, tasks.copy_batch(TRAIN["batch_size"], TASK["length"], TASK["n_symbols"],
                                                               generator, min_length=TASK["min_length"])),
        lambda: score(model), steps=steps, lr=TRAIN["lr"], eval_every=EVAL_EVERY, stop_accuracy=STOP_ACCURACY)
    seconds = time.perf_counter() - start
    result = dict(variant=variant, seed=seed, state=state_numbers(variant), seconds=seconds,
                  generated_accuracy=greedy_accuracy(model, held_out()), **history)
    result["loss"] = result["loss"][:200] + result["loss"][200::10]  # every step for a live check, then every 10th
    result["step"] = result["step"][:200] + result["step"][200::10]
    print(f"{variant:>32} seed {seed}: accuracy {history['eval_accuracy'][-1]:.3f} at step {history['eval_step'][-1]} "
          f"({history['stop']}), generated {result['generated_accuracy']:.3f}, {seconds:.0f} s", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "copy_state_runs.json"))
    args = parser.parse_args()
    if args.steps % EVAL_EVERY:
        parser.error(f"--steps must be a multiple of {EVAL_EVERY} (the held-out score's interval), got {args.steps}")
    jobs = [(variant, seed, args.steps) for variant in args.variants for seed in args.seeds]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(run, jobs, chunksize=1)
    wall = time.perf_counter() - start
    runs = {variant: [r for r in results if r["variant"] == variant] for variant in args.variants}
    settings = dict(task=TASK, model=MODEL, train=TRAIN, steps=args.steps, eval_every=EVAL_EVERY,
                    stop_accuracy=STOP_ACCURACY,
                    variants={v: dict(family=f, heads=h, conv_size=c) for v, (f, h, c) in VARIANTS.items()},
                    seeds=dict(models=args.seeds, batches=[batch_seed(s) for s in args.seeds], test=TEST_SEED),
                    test_batch=TEST_BATCH)
    write_runs(args.out, "python tools/train_copy_state.py", settings, runs, jobs=args.jobs, wall=wall, count=len(jobs))


if __name__ == "__main__":
    main()
