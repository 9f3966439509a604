"""Train the small causal model of notebook 07 on the copy task: softmax and linear attention, several seeds.

The runs behind notebook 07, Section 7.4: the notebook trains the first steps of two of these
runs itself (asserting that they reproduce the stored losses) and loads the full runs from
``course_lib/data/copy_runs.json`` (package data, so an installed course has it too).

The task follows Katharopoulos et al. 2020, §4.1, scaled to a CPU: every sequence draws its own
length L (8 … 32 symbols from 10, the separator, the copy; the paper: up to 128 positions, 10
symbols), so the copy starts at a different offset in every row.  For each seed, the softmax and
the linear run share everything but the attention: the initial weights (``torch.manual_seed``),
the batches (one generator seed), the optimiser and the steps.  The training loss is logged at
every step, and the loss and per-token accuracy on one held-out batch of 256 sequences every
``EVAL_EVERY`` steps.  At the end each model also *generates* the copies of that batch token by
token through ``CausalLM.step`` (the RNN for linear attention, a key/value cache for softmax).

Each run is one process with one CPU thread (the same machine and torch version give the same
numbers again); ``--jobs`` runs that many at once.

    python tools/train_copy.py                    write course_lib/data/copy_runs.json (about 10 min, 2 cores)
    python tools/train_copy.py --steps 100 --seeds 0 --out /tmp/copy.json   a quick look
"""

import argparse
import json
import multiprocessing
import os
import pathlib
import platform
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import tasks  # noqa: E402
from course_lib.torch.causal_lm import ATTENTIONS, CausalLM, generate  # noqa: E402

TASK = dict(length=32, min_length=8, n_symbols=10)  # L = 8 … 32 symbols, the separator, the copy
MODEL = dict(d_model=64, n_heads=4, n_layers=2)
TRAIN = dict(batch_size=32, lr=3e-3, log_every=1)
STEPS, EVAL_EVERY, SEEDS = 3000, 50, (0, 1, 2)
TEST_SEED, TEST_BATCH = 12345, 256  # the held-out batch: its own generator, never a training batch


def build(attention, seed):
    """The model of one run, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    vocab = TASK["n_symbols"] + 1  # the symbols and the separator
    return CausalLM(vocab, 2 * TASK["length"], attention=attention, **MODEL)


def batch_seed(seed):
    """The training batches of a seed: the same for its softmax and its linear run."""
    return 1000 + seed


def generated_accuracy(model):
    """Per-token accuracy of the copies made by greedy generation from each row's first half and separator."""
    tokens = tasks.copy_batch(TEST_BATCH, TASK["length"], TASK["n_symbols"],
                              torch.Generator().manual_seed(TEST_SEED), min_length=TASK["min_length"])
    lengths = tasks.copy_lengths(tokens)
    right = total = 0
    for length in lengths.unique().tolist():  # one prompt length per call
        rows = tokens[lengths == length]
        made = generate(model.eval(), rows[:, :length + 1], length)  # (rows, 2L + 1)
        right += (made[:, length + 1:] == rows[:, length + 1:2 * length + 1]).sum().item()
        total += rows.shape[0] * length
    return right / total


def run(job):
    """One training run in its own process: ``job = (attention, seed, steps)``."""
    attention, seed, steps = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(attention, seed)
    start = time.perf_counter()
    history = tasks.train_copy(model, steps=steps, generator=torch.Generator().manual_seed(batch_seed(seed)),
                               eval_every=EVAL_EVERY, eval_generator=torch.Generator().manual_seed(TEST_SEED),
                               eval_batch=TEST_BATCH, **TASK, **TRAIN)
    seconds = time.perf_counter() - start
    result = dict(attention=attention, seed=seed, seconds=seconds, generated_accuracy=generated_accuracy(model),
                  **history)
    print(f"{attention:>7} seed {seed}: held-out loss {history['eval_loss'][-1]:.3g}, accuracy "
          f"{history['eval_accuracy'][-1]:.3f}, generated {result['generated_accuracy']:.3f}, {seconds:.0f} s",
          flush=True)
    return result


def rounded(value, digits=5):
    """``value`` with every float rounded to ``digits`` significant digits: a smaller file, the same runs."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: rounded(item, digits) for key, item in value.items()}
    if isinstance(value, list):
        return [rounded(item, digits) for item in value]
    return value


def write_runs(out, command, settings, runs, *, jobs, wall, count):
    """Store a sweep as JSON (floats to 5 digits) with what produced it: command, torch, machine, wall time, load."""
    meta = dict(command=command, torch=torch.__version__, threads=1, jobs=jobs,
                machine=platform.processor() or platform.machine(), wall_seconds=round(wall),
                load_average=[round(x, 1) for x in os.getloadavg()])
    pathlib.Path(out).write_text(json.dumps(rounded(dict(settings=settings, meta=meta, runs=runs))) + "\n")
    print(f"wrote {out}: {count} runs in {wall:.0f} s (load average {meta['load_average']})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "copy_runs.json"))
    args = parser.parse_args()
    jobs = [(attention, seed, args.steps) for seed in args.seeds for attention in ATTENTIONS]
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(run, jobs, chunksize=1)
    wall = time.perf_counter() - start
    runs = {attention: [r for r in results if r["attention"] == attention] for attention in ATTENTIONS}
    settings = dict(task=TASK, model=MODEL, train=TRAIN, steps=args.steps, eval_every=EVAL_EVERY,
                    seeds=dict(models=args.seeds, batches=[batch_seed(s) for s in args.seeds], test=TEST_SEED),
                    test_batch=TEST_BATCH)
    write_runs(args.out, "python tools/train_copy.py", settings, runs, jobs=args.jobs, wall=wall, count=len(jobs))


if __name__ == "__main__":
    main()
