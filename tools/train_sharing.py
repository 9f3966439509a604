"""Train small Linformer encoders on the reversal task, every sharing mode and several (n, k), to convergence.

The runs behind notebook 05, Sections 5.5-5.6: the notebook trains short versions of the same
models itself and loads these from ``course_lib/data/sharing_runs.json`` (package data, so an
installed course has it too).  Every run is fixed by its seed (model weights and batches) and
runs on one CPU thread, so the same machine and torch version give the same numbers again.

Convergence is measured, not assumed: every ``--eval-every`` steps the model is scored on one
fixed held-out batch (the *monitor* batch), and a run stops as *converged* once the best
monitor loss has fallen by less than ``--tol`` nats over the last ``--window`` steps (a plateau
test; never before ``--min-steps``).  A run that reaches ``--max-steps`` first is stored with
``converged: false``.  The reported loss and accuracy come from a second, larger held-out batch
that played no part in stopping.  A plateau test cannot rule out a later drop; the stored
monitor curves show how flat each run was when it stopped.

    python tools/train_sharing.py                          write course_lib/data/sharing_runs.json
    python tools/train_sharing.py --max-steps 300 --out /tmp/runs.json   a quick look
"""

import argparse
import json
import multiprocessing
import pathlib
import platform
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import tasks  # noqa: E402
from course_lib.torch.linformer import SHARING_MODES, LinformerEncoder, distinct_projection_matrices  # noqa: E402

MODEL = dict(n_layers=2, d_model=32, n_heads=2, vocab_size=8)
TRAIN = dict(batch_size=32, lr=3e-3, log_every=20)
MONITOR_BATCH, TEST_BATCH = 256, 1024  # held-out sequences: stopping rule / reported numbers
# Experiment "sharing": every mode at one (n, k), with exact attention as the baseline.
SHARING_RUNS = [(32, None, "exact")] + [(32, 8, mode) for mode in SHARING_MODES]
# Experiment "k-vs-n", with the sharing experiment's (32, 8): k = 8 at n = 32 and 64, k = 16 at
# n = 64 and 128, k = 8 and 16 at n = 64, and n/k = 4 at (32, 8), (64, 16); n/k = 8 at (64, 8), (128, 16).
# Exact attention is trained at n = 32 only (above): the retraining had a budget of ~25 minutes on a
# shared CPU, and exact attention at n = 64, 128 costs the most per step.
K_VS_N_RUNS = [(64, 8, "headwise"), (64, 16, "headwise"), (128, 16, "headwise")]


def plateaued(monitor_loss, per_window, tol):
    """True when the best monitor loss fell by less than ``tol`` over the last ``per_window`` evaluations."""
    if len(monitor_loss) <= per_window:
        return False
    return min(monitor_loss[:-per_window]) - min(monitor_loss) < tol


def train_until_plateau(model, n, seed, rule):
    """Adam on fresh reversal batches until the plateau test passes or ``max_steps``; returns the logs."""
    vocab, generator = MODEL["vocab_size"], torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=TRAIN["lr"])
    history, monitor = {"step": [], "loss": []}, {"step": [], "loss": [], "accuracy": []}
    converged = False
    for step in range(1, rule["max_steps"] + 1):
        model.train()
        loss = tasks.reversal_loss(model, *tasks.reversal_batch(TRAIN["batch_size"], n, vocab, generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % TRAIN["log_every"] == 0:
            history["step"].append(step)
            history["loss"].append(loss.item())
        if step % rule["eval_every"] == 0:
            held = tasks.evaluate_reversal(model, n=n, vocab_size=vocab, batch_size=MONITOR_BATCH,
                                           generator=torch.Generator().manual_seed(10_000 + seed))
            monitor["step"].append(step)
            monitor["loss"].append(held[0])
            monitor["accuracy"].append(held[1])
            if step >= rule["min_steps"] and plateaued(monitor["loss"], rule["window"] // rule["eval_every"],
                                                       rule["tol"]):
                converged = True
                break
    return history, monitor, step, converged


def run(job):
    """Train one model; return a JSON-ready record of its configuration and results."""
    experiment, n, k, sharing, seed, rule = job
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    torch.manual_seed(seed)
    model = LinformerEncoder(max_len=n, k=k, sharing="none" if k is None else sharing, **MODEL)
    start = time.perf_counter()
    history, monitor, steps, converged = train_until_plateau(model, n, seed, rule)
    seconds = time.perf_counter() - start
    loss, accuracy = tasks.evaluate_reversal(model, n=n, vocab_size=MODEL["vocab_size"], batch_size=TEST_BATCH,
                                             generator=torch.Generator().manual_seed(20_000 + seed))
    record = dict(experiment=experiment, attention="exact" if k is None else "linformer", sharing=sharing,
                  n=n, k=k, seed=seed, steps=steps, max_steps=rule["max_steps"], converged=converged,
                  parameters=sum(p.numel() for p in model.parameters()),
                  projection_matrices=distinct_projection_matrices(model), history=history, monitor=monitor,
                  eval_loss=loss, eval_accuracy=accuracy, train_seconds=round(seconds, 1))
    print(f"{experiment:8} n={n:4} k={k!s:5} {sharing:10} seed {seed}: {steps:5} steps "
          f"({'converged' if converged else 'NOT converged'}), loss {loss:.4f} accuracy {accuracy:.4f} "
          f"({record['train_seconds']} s)", flush=True)
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3000, help="stop here even without a plateau")
    parser.add_argument("--min-steps", type=int, default=1000, help="never stop before this step")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between monitor evaluations")
    parser.add_argument("--window", type=int, default=500, help="plateau window in steps")
    parser.add_argument("--tol", type=float, default=0.01, help="least fall of the best monitor loss (nats)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run per seed")
    parser.add_argument("--configs", nargs="+", metavar="N:K:SHARING",
                        help="train only these configurations, e.g. 64:8:headwise (default: all)")
    parser.add_argument("--jobs", type=int, default=3, help="runs trained at once (one thread each)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "course_lib" / "data" / "sharing_runs.json")
    args = parser.parse_args(argv)
    rule = dict(max_steps=args.max_steps, min_steps=args.min_steps, eval_every=args.eval_every,
                window=args.window, tol=args.tol)
    jobs = [(experiment, n, k, sharing, seed, rule)
            for experiment, configs in (("sharing", SHARING_RUNS), ("k-vs-n", K_VS_N_RUNS))
            for n, k, sharing in configs for seed in args.seeds
            if args.configs is None or f"{n}:{k}:{sharing}".replace("None", "-") in args.configs]
    jobs.sort(key=lambda job: -job[1])  # longest sequences first, so the pool ends evenly
    start, runs = time.perf_counter(), []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for record in pool.imap_unordered(run, jobs):
            runs.append(record)
            write(args, rule, runs, len(jobs), time.perf_counter() - start, argv)  # partial results survive a stop
    print(f"wrote {args.out}")
    return 0


def write(args, rule, runs, n_jobs, seconds, argv):
    """Write the runs so far (in the order of the experiments) and the metadata to ``args.out``."""
    runs = sorted(runs, key=lambda r: (r["experiment"] != "sharing", r["n"], r["k"] or 0,
                                       (("exact",) + SHARING_MODES).index(r["sharing"]), r["seed"]))
    meta = dict(task="reversal", model=MODEL, train=TRAIN, convergence=dict(
                    rule=f"stop once the best held-out (monitor) loss fell by less than {args.tol} nats over "
                         f"the last {args.window} steps, evaluated every {args.eval_every} steps, "
                         f"not before step {args.min_steps}; at most {args.max_steps} steps", **rule),
                monitor_batch=MONITOR_BATCH, test_batch=TEST_BATCH, wall_seconds=round(seconds),
                jobs=args.jobs, complete=len(runs) == n_jobs, torch=torch.__version__, machine=platform.machine(),
                command="python tools/train_sharing.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, runs=runs), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
