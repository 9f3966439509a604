"""Train notebook 11's recurrent mixers on recall tasks where theory predicts a difference: Zoology's protocol.

The runs behind notebook 11, Section 11.4, stored in ``course_lib/data/recall_runs.json``.  Task
families (``course_lib.recall``), each cell stated with its prediction in the notebook:

- ``overwrite``: 8 keys written 24 times at random places, the query asks for the latest value
  (sum rule: old + new; delta rule with β = 1: replaces); once more with learned positions
  (``overwrite_positions``): the confound of absolute position embeddings, measured;
- ``capacity`` (stored apart, in ``course_lib/data/recall_capacity_runs.json``): MQAR with N = 16 and 32 pairs
  for heads of d_head = 8 (N / d_head = 2, 4; at 1 the hand-set sum and delta rules both recall ≥ 0.97 of the
  pairs, so the notebook scores that cell by hand only);
- ``needle`` (stored apart, in ``course_lib/data/recall_needle_runs.json``): one marked pair among 32 at a random
  depth, then its key; linear, DeltaNet and Gated DeltaNet.

The model is ``tasks.mqar_model`` (notebook 07's ``CausalLM`` with its mixer swapped; d_model = 64,
2 blocks, 8 heads of 8: 512 state numbers a layer) **without absolute position embeddings** (order from
the short convolution and the recurrence, as recurrent language models are built), except in the
``overwrite_positions`` cell.  Mixers: linear (no decay), gate (a data-dependent decay per head),
DeltaNet, Gated DeltaNet on overwrite; linear and DeltaNet (the sum rule against the delta rule) on the
position confound and the capacity cells (``FAMILY_MIXERS``), so that the sweep fits its time on 2 cores.

Zoology's protocol (Arora et al. 2023, §3 and App. E), within this CPU's means: every cell is run at
each of ``LRS`` (Adam, constant rate, batches of 16 drawn fresh) and three seeds.  Every
``EVAL_EVERY`` steps a run is scored on a validation batch (its own generator); at each step budget
of ``BUDGETS`` it is also scored on the test batch (another generator, never used to choose
anything).  The best learning rate of a cell at a budget is the one with the highest validation
accuracy, averaged over the seeds; the notebook reports that rate's test accuracy, per seed.  A run
stops at the last budget, or once the validation accuracy reaches ``STOP_ACCURACY`` (its later
budgets then carry its test accuracy at the stop).  Steps to 90 % is the first scored step at which
the validation accuracy reached 0.9.  A seed fixes the initial weights and the training batches,
shared by every mixer and rate.

Each run is one process with one CPU thread; ``--jobs`` runs that many at once.

    python tools/train_recall.py                 write course_lib/data/recall_runs.json (overwrite, with and
                                                 without positions: 29 minutes on 2 cores)
    python tools/train_recall.py --families capacity --out course_lib/data/recall_capacity_runs.json
                                                 the capacity cells, linear against DeltaNet (36 runs)
    python tools/train_recall.py --families needle --out course_lib/data/recall_needle_runs.json
                                                 the needle cell (27 runs)
    python tools/train_recall.py --save linear deltanet gated_deltanet     then the weights the notebook reads
    python tools/train_recall.py --out course_lib/data/recall_needle_runs.json --save deltanet gated_deltanet \
        --save-cell needle --weights course_lib/data/recall_needle_models.safetensors     and the needle's
    python tools/train_recall.py --families overwrite --seeds 0 --lrs 0.003 --budgets 500 --out /tmp/r.json
"""

import argparse
import json
import multiprocessing
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import recall, tasks  # noqa: E402
from tools.train_copy import write_runs  # noqa: E402 (stored as the copy runs are)

MIXERS = ("linear", "gate", "deltanet", "gated_deltanet")
MODEL = dict(d_model=64, n_heads=8, n_layers=2, conv_size=4, chunk_size=32)  # 8 heads of 8: 512 numbers a layer
D_HEAD = MODEL["d_model"] // MODEL["n_heads"]
CELLS = {  # family → cells: (name, task keyword arguments, positions)
    "overwrite": [("overwrite", dict(kind="overwrite", n_pairs=8, n_writes=24, n_keys=32, n_values=32), False)],
    "overwrite_positions": [("overwrite_positions", dict(kind="overwrite", n_pairs=8, n_writes=24, n_keys=32,
                                                         n_values=32), True)],
    "capacity": [(f"capacity_{r}", dict(kind="capacity", ratio=r, d_head=D_HEAD, n_keys=64, n_values=32), False)
                 for r in (2, 4)],
    "needle": [("needle", dict(kind="needle", n_pairs=32, n_keys=64, n_values=32, n_needle_keys=4), False)],
}
FAMILIES = ("overwrite", "overwrite_positions")  # the default sweep; the other families are stored apart, each ≤ 30 min
STORES = {"recall_runs.json": FAMILIES, "recall_capacity_runs.json": ("capacity",),
          "recall_needle_runs.json": ("needle",)}  # course_lib/data/: the stored sweeps and their families
FAMILY_MIXERS = dict(overwrite=MIXERS, overwrite_positions=("linear", "deltanet"), capacity=("linear", "deltanet"),
                     needle=("linear", "deltanet", "gated_deltanet"))  # what each family trains by default
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
BATCH_SIZE, EVAL_EVERY, VAL_BATCH, TEST_BATCH = 16, 100, 256, 512
BUDGETS = (200, 500, 1000)  # steps; 1,000 is what 2 cores allow in 30 minutes, named as the limit
STOP_ACCURACY = 0.99
VAL_SEED, TEST_SEED = 2024, 12345  # the validation and test batches: their own generators


batch = recall.task_batch  # a cell's task by its keyword arguments


def row_length(task):
    """Tokens in a row of ``task``."""
    tokens, _ = batch(task, 1, torch.Generator().manual_seed(0))
    return tokens.shape[1]


def build(mixer, task, positions, seed):
    """The model of one run, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    vocab = task["n_keys"] + task["n_values"]
    return tasks.mqar_model(mixer, vocab, row_length(task), positions=positions, **MODEL)


def batch_seed(seed):
    """The training batches of a seed: the same for every mixer and learning rate."""
    return 1000 + seed


def run(job):
    """One training run in its own process: ``job = (cell, mixer, lr, seed, budgets)``; its stored record."""
    return train(job)[1]


def train(job):
    """One training run: ``(model, record)``."""
    (name, task, positions), mixer, lr, seed, budgets = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(mixer, task, positions, seed)
    validation = batch(task, VAL_BATCH, torch.Generator().manual_seed(VAL_SEED))
    test = batch(task, TEST_BATCH, torch.Generator().manual_seed(TEST_SEED))
    generator = torch.Generator().manual_seed(batch_seed(seed))
    tested, scored = {}, [0]

    def score():
        scored[0] += 1
        step = scored[0] * EVAL_EVERY
        result = tasks.evaluate_batch(model, *validation)
        if step in budgets or result[1] >= STOP_ACCURACY:
            tested[step] = tasks.evaluate_batch(model, *test)[1]
        return result

    start = time.perf_counter()
    history = tasks.train_scored(model, lambda: tasks.reversal_loss(model, *batch(task, BATCH_SIZE, generator)),
                                 score, steps=max(budgets), lr=lr, eval_every=EVAL_EVERY, stop_accuracy=STOP_ACCURACY)
    seconds = time.perf_counter() - start
    correct = recall.row_correct(model, *test).tolist()  # per test row, at the run's end (last budget or stop)
    last = max(tested)
    test_at = {str(b): tested[b] if b in tested else tested[last] for b in budgets}  # after a stop: the stop's
    reached = [s for s, a in zip(history["eval_step"], history["eval_accuracy"], strict=True) if a >= 0.9]
    result = dict(cell=name, mixer=mixer, lr=lr, seed=seed, positions=positions, seconds=seconds,
                  stop=history["stop"], stop_step=history["eval_step"][-1], test_accuracy=test_at,
                  steps_to_90=reached[0] if reached else None, eval_step=history["eval_step"],
                  eval_loss=history["eval_loss"], eval_accuracy=history["eval_accuracy"],
                  test_rows_correct=correct, loss=history["loss"][:200] + history["loss"][200::10])
    print(f"{name:>20} {mixer:>14} lr {lr:g} seed {seed}: test {test_at[str(max(budgets))]:.3f}, "
          f"validation {history['eval_accuracy'][-1]:.3f} at step {history['eval_step'][-1]} ({history['stop']}), "
          f"{seconds:.0f} s", flush=True)
    return model, result


def save_best(out, weights, mixers, budgets, jobs_at_once=2, cell_name="overwrite"):
    """Train seed 0 of a cell again at each mixer's best rate (chosen on validation) and store its weights.

    The same seed, rate and thread count give the same weights as the sweep's run: notebook 11 reads
    what the trained mixers learned (their β, their keys, their gates) from these.
    """
    from safetensors.torch import save_file

    runs = json.loads(pathlib.Path(out).read_text())["runs"]
    best = recall.best_rates(runs, max(budgets))
    cell = next(c for cells in CELLS.values() for c in cells if c[0] == cell_name)
    jobs = [(cell, mixer, best[cell[0], mixer], 0, budgets) for mixer in mixers]
    with multiprocessing.get_context("spawn").Pool(jobs_at_once) as pool:
        trained = pool.map(train, jobs, chunksize=1)
    tensors, chosen = {}, {}
    for (_, mixer, lr, _, _), (model, result) in zip(jobs, trained, strict=True):
        tensors |= {f"{mixer}/{name}": value.contiguous() for name, value in model.state_dict().items()}
        chosen[mixer] = dict(lr=lr, test_accuracy=result["test_accuracy"][str(max(budgets))])
    save_file(tensors, weights, metadata=dict(cell=cell[0], seed="0", runs=json.dumps(chosen),
                                              command="python tools/train_recall.py " + " ".join(sys.argv[1:])))
    print(f"wrote {weights}: {chosen}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(CELLS))
    parser.add_argument("--mixers", nargs="+", choices=tasks.MIXERS,
                        help="the mixers of every family (default: FAMILY_MIXERS, per family)")
    parser.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS),
                        help=f"step budgets, each a multiple of {EVAL_EVERY}; the last is the run's length")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "recall_runs.json"))
    parser.add_argument("--save", nargs="+", choices=MIXERS, metavar="MIXER",
                        help="skip the sweep: read --out and store the weights of these mixers' best overwrite runs")
    parser.add_argument("--weights", default=str(ROOT / "course_lib" / "data" / "recall_models.safetensors"))
    parser.add_argument("--save-cell", default="overwrite", help="the cell whose best runs --save stores")
    args = parser.parse_args()
    if args.save:
        return save_best(args.out, args.weights, args.save, tuple(sorted(args.budgets)), args.jobs, args.save_cell)
    if any(b % EVAL_EVERY for b in args.budgets):
        parser.error(f"every budget must be a multiple of {EVAL_EVERY}.")
    budgets = tuple(sorted(args.budgets))
    cells = [cell for family in args.families for cell in CELLS[family]]
    jobs = [(cell, mixer, lr, seed, budgets) for family in args.families for cell in CELLS[family]
            for mixer in args.mixers or FAMILY_MIXERS[family] for lr in args.lrs for seed in args.seeds]
    jobs.sort(key=lambda job: -row_length(job[0][1]))  # the longest rows first: the pool ends with short runs
    start = time.perf_counter()
    partial = pathlib.Path(args.out + ".partial")  # each run as it ends, one JSON line: a stopped sweep keeps them
    partial.write_text("")
    runs = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for result in pool.imap_unordered(run, jobs, chunksize=1):
            runs.append(result)
            with partial.open("a") as f:
                f.write(json.dumps(result) + "\n")
    wall = time.perf_counter() - start
    partial.unlink()
    settings = dict(cells={name: dict(task=task, positions=positions) for name, task, positions in cells},
                    model=MODEL, lrs=args.lrs, budgets=list(budgets), batch_size=BATCH_SIZE,
                    mixers={family: list(args.mixers or FAMILY_MIXERS[family]) for family in args.families},
                    eval_every=EVAL_EVERY, validation_batch=VAL_BATCH, test_batch=TEST_BATCH,
                    stop_accuracy=STOP_ACCURACY,
                    seeds=dict(models=args.seeds, batches=[batch_seed(s) for s in args.seeds], validation=VAL_SEED,
                               test=TEST_SEED))
    command = "python tools/train_recall.py " + " ".join(sys.argv[1:])
    write_runs(args.out, command.strip(), settings, runs, jobs=args.jobs, wall=wall, count=len(jobs))


if __name__ == "__main__":
    main()
