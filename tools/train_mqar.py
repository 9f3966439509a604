"""Train notebook 11's six token mixers on multi-query associative recall (MQAR), several seeds.

The runs behind notebook 11, Section 11.4: the notebook trains the first steps of one run itself
(asserting that they reproduce the stored losses) and loads every run from
``course_lib/data/mqar_runs.json`` (package data, so an installed course has it too).

The model is notebook 07's ``CausalLM`` (2 blocks of norm → mixer → residual, norm → MLP →
residual; d_model = 64; learned positions) with its attention swapped by ``tasks.mqar_model``:
softmax, or a recurrent mixer — linear (no decay), RetNet (a fixed decay per head), gate (a
data-dependent decay per head), DeltaNet, Gated DeltaNet — all with one front end (a short
convolution, L2-normalised keys).  The recurrent state of a layer is h matrices of (64 / h)²
numbers, so the number of heads sets the state's size at a fixed width.  Two sweeps share one
grid: the number of pairs N at a fixed state (8 heads), and the state at a fixed N (N = 8; 1, 4 or
8 heads).  Softmax keeps every key and has no state to size: it runs at each N with one head.

Every run: Adam at a constant learning rate (no schedule that decays before a late jump), batches
of 16 drawn fresh, scored every ``EVAL_EVERY`` steps on one held-out batch of 256 rows; it stops
when that accuracy reaches ``STOP_ACCURACY``, or when the plateau test of notebook 05 passes (the
best held-out loss fell by less than 0.01 nats over the last 300 steps, not before step 600), or
after the step cap, 4,000 steps, set above every run's stop here: a run ends because it learned the
task or stopped learning, not because the budget ran out.  A seed fixes the initial
weights and the batches, shared by every mixer.

Each run is one process with one CPU thread (the same machine and torch version give the same
numbers again); ``--jobs`` runs that many at once.

    python tools/train_mqar.py                      write course_lib/data/mqar_runs.json (17 min on 2 cores)
    python tools/train_mqar.py --seeds 0 --mixers deltanet --out /tmp/mqar.json   a quick look
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
from tools.train_copy import write_runs  # noqa: E402 (stored as the copy runs are)

TASK = dict(n_keys=128, n_values=32)  # a row's keys are distinct; more key tokens than a head has dimensions
MODEL = dict(d_model=64, n_layers=2, conv_size=4, chunk_size=32)  # one chunk holds a whole row (3N ≤ 24)
TRAIN = dict(batch_size=16, lr=3e-3, eval_every=100, eval_batch=256)
PLATEAU = dict(window=300, tol=0.01, min_step=600)
STOP_ACCURACY = 0.99
FIXED_HEADS, FIXED_PAIRS = 8, 8  # the N sweep at 8 heads (8 × 8 × 8 a layer), the state sweep at N = 8
PAIRS, HEADS = (2, 4, 8), (1, 4, 8)
SOFTMAX_HEADS = 1
MAX_STEPS = dict(softmax=4000, recurrent=4000)  # caps no run should reach: the plateau test ends runs
SEEDS = (0, 1, 2)
TEST_SEED = 12345  # the held-out batch: its own generator, never a training batch


def grid(mixers):
    """The (mixer, n_pairs, n_heads) of every run: N at the fixed state, then the state at the fixed N.

    Softmax keeps every key (no state to size): it runs at each N with one head of 64, its easiest setting.
    """
    cells = [(n_pairs, FIXED_HEADS) for n_pairs in PAIRS]
    cells += [(FIXED_PAIRS, heads) for heads in HEADS if (FIXED_PAIRS, heads) not in cells]
    jobs = [("softmax", n_pairs, SOFTMAX_HEADS) for n_pairs in PAIRS] if "softmax" in mixers else []
    return jobs + [(mixer, n_pairs, heads) for n_pairs, heads in cells for mixer in mixers if mixer != "softmax"]


def build(mixer, n_pairs, n_heads, seed):
    """The model of one run, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return tasks.mqar_model(mixer, TASK["n_keys"] + TASK["n_values"], 3 * n_pairs, n_heads=n_heads, **MODEL)


def batch_seed(seed):
    """The training batches of a seed: the same for every mixer."""
    return 1000 + seed


def run(job):
    """One training run in its own process: ``job = (mixer, n_pairs, n_heads, seed)``."""
    mixer, n_pairs, n_heads, seed = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(mixer, n_pairs, n_heads, seed)
    start = time.perf_counter()
    history = tasks.train_mqar(model, n_pairs=n_pairs, steps=MAX_STEPS.get(mixer, MAX_STEPS["recurrent"]),
                               generator=torch.Generator().manual_seed(batch_seed(seed)),
                               eval_generator=torch.Generator().manual_seed(TEST_SEED), stop_accuracy=STOP_ACCURACY,
                               plateau=PLATEAU, **TASK, **TRAIN)
    seconds = time.perf_counter() - start
    result = dict(mixer=mixer, n_pairs=n_pairs, n_heads=n_heads, seed=seed, state=tasks.state_numbers(model),
                  seconds=seconds, **history)
    result["loss"] = result["loss"][:200] + result["loss"][200::10]  # every step for the live check, then every 10th
    print(f"{mixer:>14} N = {n_pairs:>2} h = {n_heads} seed {seed}: accuracy {history['eval_accuracy'][-1]:.3f} "
          f"at step {history['eval_step'][-1]} ({history['stop']}), {seconds:.0f} s", flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--mixers", nargs="+", default=list(tasks.MIXERS), choices=tasks.MIXERS)
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "mqar_runs.json"))
    args = parser.parse_args()
    jobs = [(*cell, seed) for cell in grid(args.mixers) for seed in args.seeds]
    jobs.sort(key=lambda job: -job[1])  # the longest sequences first: the pool ends with short runs
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(run, jobs, chunksize=1)
    wall = time.perf_counter() - start
    settings = dict(task=TASK, model=MODEL, train=TRAIN, plateau=PLATEAU, stop_accuracy=STOP_ACCURACY,
                    max_steps=MAX_STEPS, fixed_heads=FIXED_HEADS, softmax_heads=SOFTMAX_HEADS, fixed_pairs=FIXED_PAIRS,
                    pairs=PAIRS, heads=HEADS,
                    seeds=dict(models=args.seeds, batches=[batch_seed(s) for s in args.seeds], test=TEST_SEED))
    write_runs(args.out, "python tools/train_mqar.py", settings, runs, jobs=args.jobs, wall=wall, count=len(jobs))


if __name__ == "__main__":
    main()
