"""Train small Linformer encoders and exact-attention baselines on two tasks, three seeds each, past a plateau.

The runs behind notebook 05, Sections 5.5-5.7: the notebook trains short versions of the same
models itself and loads these from ``course_lib/data/sharing_runs.json`` (package data, so an
installed course has it too).  Every run is fixed by its seed (model weights and batches) and
runs on one CPU thread, so the same machine and torch version give the same numbers again.

Tasks (``course_lib.tasks``): *reversal* (the attention that solves it is an n × n permutation,
rank n) and *lookup* (every position fetches a symbol from an 8-entry table at the start, so
the attention that solves it has rank at most 8 at every n).

Experiments, each configuration trained from every ``--seeds`` seed:

* ``sharing``: reversal at n = 32, k = 8, every sharing mode, and exact attention;
* ``k-vs-n``: reversal, headwise, (n, k) = (64, 8), and exact attention at n = 64 (with the sharing
  experiment's (32, 8) and exact n = 32): the same k at two n;
* ``lookup``: the lookup task, headwise, k = 4 (half the table) at n = 32 and 64, and exact attention;
* ``init`` (not in the default run; ``--experiments init``): reversal at (64, 8), headwise, E and F
  started at mean pooling instead of N(0, 1/k) (lesson 04 found N(0, 1/k) the worst fixed
  projection on MiniLM).

The default run is sized for about 15 CPU minutes (n <= 64, at most 3,000 steps); the notebook
states these settings.  Longer sequences (n = 128) and longer budgets are one ``--max-steps`` and
an edit of ``CONFIGS`` away.

Convergence is measured, not assumed: every ``--eval-every`` steps the model is scored on one
fixed held-out batch (the *monitor* batch); the plateau test passes once the best monitor loss
has fallen by less than ``--tol`` nats over the last ``--window`` steps (never before
``--min-steps``).  The run is then scored on a second, larger held-out batch (*at the stop*),
trained ``--extra`` steps more and scored again (*final*): the difference says whether the
plateau held.  A run that reaches ``--max-steps`` (``--lookup-max-steps`` on the lookup task)
without passing the test is stored with ``converged: false`` (no extra steps).  Exact attention
trains with PyTorch's fused kernel (``scaled_dot_product_attention``), the same function as the
course's step-by-step one.

    python tools/train_sharing.py                   write course_lib/data/sharing_runs.json (~15 CPU minutes)
    python tools/train_sharing.py --max-steps 300 --extra 100 --seeds 0 --out /tmp/runs.json   a quick look
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
from course_lib.torch.linformer import (  # noqa: E402
    SHARING_MODES,
    LinformerEncoder,
    LinformerSelfAttention,
    distinct_projection_matrices,
    mean_pooling,
)

MODEL = dict(n_layers=2, d_model=32, n_heads=2, vocab_size=8)
TRAIN = dict(batch_size=32, lr=3e-3, log_every=100)
TABLE = 8  # lookup task: table entries, the rank of the attention that solves it
MONITOR_BATCH, TEST_BATCH = 256, 1024  # held-out sequences: stopping rule / reported numbers
# (experiment, task, n, k, sharing, init); k None is exact attention.
CONFIGS = (
    [("sharing", "reversal", 32, None, "exact", None)]
    + [("sharing", "reversal", 32, 8, mode, "gaussian") for mode in SHARING_MODES]
    + [("k-vs-n", "reversal", 64, None, "exact", None)]
    + [("k-vs-n", "reversal", 64, 8, "headwise", "gaussian")]
    + [("lookup", "lookup", n, None, "exact", None) for n in (32, 64)]
    + [("lookup", "lookup", n, 4, "headwise", "gaussian") for n in (32, 64)]
    + [("init", "reversal", 64, 8, "headwise", "pooling")]
)
DEFAULT_EXPERIMENTS = ("sharing", "k-vs-n", "lookup")


def fused_attention(q, k, v, *, causal=False, key_mask=None):
    """Exact attention by PyTorch's fused kernel: the same function as ``softmax_attention``, faster."""
    mask = None if key_mask is None else key_mask[..., None, :]  # (b, 1, 1, s): True = attend
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)


def build(n, k, sharing, init):
    """The model of one configuration (seed torch first)."""
    model = LinformerEncoder(max_len=n, k=k, sharing="none" if k is None else sharing, **MODEL)
    swapped = 0
    for module in model.modules():
        if k is None and hasattr(module, "attention") and callable(module.attention) \
                and not isinstance(module.attention, torch.nn.Module):
            module.attention, swapped = fused_attention, swapped + 1
        if isinstance(module, LinformerSelfAttention) and init == "pooling":
            with torch.no_grad():  # every E and F (a shared one once more, harmlessly) starts as mean pooling
                for proj in (module.E, module.F):
                    proj.copy_(mean_pooling(k, n).expand_as(proj))
    if k is None and swapped != MODEL["n_layers"]:
        raise RuntimeError(f"expected to give {MODEL['n_layers']} exact-attention layers the fused kernel, "
                           f"found {swapped}")
    return model


def batches(task, n):
    if task == "reversal":
        return lambda size, generator: tasks.reversal_batch(size, n, MODEL["vocab_size"], generator)
    return lambda size, generator: tasks.lookup_batch(size, n, MODEL["vocab_size"], generator, table=TABLE)


def plateaued(monitor_loss, per_window, tol):
    """True when the best monitor loss fell by less than ``tol`` over the last ``per_window`` evaluations."""
    if len(monitor_loss) <= per_window:
        return False
    return min(monitor_loss[:-per_window]) - min(monitor_loss) < tol


def train_past_plateau(model, batch, seed, rule):
    """Adam on fresh batches until the plateau test passes (or ``max_steps``), then ``extra`` steps more."""
    generator, optimizer = torch.Generator().manual_seed(seed), torch.optim.Adam(model.parameters(), lr=TRAIN["lr"])
    monitor_batch = batch(MONITOR_BATCH, torch.Generator().manual_seed(10_000 + seed))
    test_batch = batch(TEST_BATCH, torch.Generator().manual_seed(20_000 + seed))
    history, monitor = {"step": [], "loss": []}, {"step": [], "loss": [], "accuracy": []}
    stop, at_stop, end = None, None, rule["max_steps"]
    step = 0
    while step < end:
        step += 1
        model.train()
        loss = tasks.reversal_loss(model, *batch(TRAIN["batch_size"], generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % TRAIN["log_every"] == 0:
            history["step"].append(step)
            history["loss"].append(round(loss.item(), 6))
        if step % rule["eval_every"] == 0:
            held = tasks.evaluate_batch(model, *monitor_batch)
            monitor["step"].append(step)
            monitor["loss"].append(round(held[0], 6))
            monitor["accuracy"].append(round(held[1], 6))
            if stop is None and step >= rule["min_steps"] and plateaued(
                    monitor["loss"], rule["window"] // rule["eval_every"], rule["tol"]):
                stop, at_stop, end = step, tasks.evaluate_batch(model, *test_batch), step + rule["extra"]
    final = tasks.evaluate_batch(model, *test_batch)
    return history, monitor, stop, at_stop or final, final, step


def run(job):
    """Train one model; return a JSON-ready record of its configuration and results."""
    (experiment, task, n, k, sharing, init), seed, rule = job
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    torch.manual_seed(seed)
    model = build(n, k, sharing, init)
    start, cpu = time.perf_counter(), time.process_time()
    history, monitor, stop, at_stop, final, steps = train_past_plateau(model, batches(task, n), seed, rule)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    record = dict(experiment=experiment, task=task, attention="exact" if k is None else "linformer",
                  sharing=sharing, init=init, n=n, k=k, seed=seed, converged=stop is not None,
                  stop_step=stop if stop is not None else steps, steps=steps,
                  parameters=sum(p.numel() for p in model.parameters()),
                  projection_matrices=distinct_projection_matrices(model), history=history, monitor=monitor,
                  at_stop=dict(loss=round(at_stop[0], 6), accuracy=round(at_stop[1], 6)),
                  final=dict(loss=round(final[0], 6), accuracy=round(final[1], 6)),
                  train_seconds=round(seconds, 1), cpu_seconds=round(cpu, 1))
    print(f"{experiment:8} {task:8} n={n:4} k={k!s:5} {sharing:10} {init!s:8} seed {seed}: "
          f"{'stop at ' + str(stop) if stop else 'NOT converged'}, {steps} steps, accuracy {at_stop[1]:.4f} "
          f"-> {final[1]:.4f} ({record['train_seconds']} s, {record['cpu_seconds']} s CPU)", flush=True)
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=3000, help="stop here even without a plateau")
    parser.add_argument("--lookup-max-steps", type=int, default=2000, help="--max-steps of the lookup runs")
    parser.add_argument("--min-steps", type=int, default=600, help="never stop before this step")
    parser.add_argument("--eval-every", type=int, default=100, help="steps between monitor evaluations")
    parser.add_argument("--window", type=int, default=300, help="plateau window in steps")
    parser.add_argument("--tol", type=float, default=0.01, help="least fall of the best monitor loss (nats)")
    parser.add_argument("--extra", type=int, default=300, help="steps trained past the plateau test")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    parser.add_argument("--experiments", nargs="+", default=list(DEFAULT_EXPERIMENTS),
                        help=f"experiments to train (default: {' '.join(DEFAULT_EXPERIMENTS)})")
    parser.add_argument("--jobs", type=int, default=3, help="runs trained at once (one thread each)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "course_lib" / "data" / "sharing_runs.json")
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs already in --out (same rule) and train only the missing ones")
    args = parser.parse_args(argv)
    rule = dict(max_steps=args.max_steps, min_steps=args.min_steps, eval_every=args.eval_every,
                window=args.window, tol=args.tol, extra=args.extra)
    lookup_rule = dict(rule, max_steps=min(args.max_steps, args.lookup_max_steps))
    jobs = [(config, seed, lookup_rule if config[1] == "lookup" else rule) for config in CONFIGS for seed in args.seeds
            if config[0] in args.experiments]
    priority = {"sharing": 0, "k-vs-n": 1, "lookup": 2, "init": 3}  # a stopped pool has the core runs first
    jobs.sort(key=lambda job: (priority[job[0][0]], -job[0][2], job[0][3] is None))  # then the longest first
    start, runs = time.perf_counter(), []
    if args.resume and args.out.exists():  # every run is fixed by its seed: a kept run is the run it would be again
        kept = json.loads(args.out.read_text())
        if kept["meta"]["convergence"]["rule"] != rule_text(args):
            raise ValueError(f"--resume: {args.out} was trained with another rule; remove it or change --out")
        done = {(r["experiment"], r["task"], r["n"], r["k"], r["sharing"], r["init"], r["seed"]) for r in kept["runs"]}
        runs = [r for r in kept["runs"] if r["experiment"] in args.experiments
                and (r["experiment"], r["task"], r["n"], r["k"], r["sharing"], r["init"]) in CONFIGS]
        jobs = [job for job in jobs if (*job[0], job[1]) not in done]
    total = len(runs) + len(jobs)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for record in pool.imap_unordered(run, jobs):
            runs.append(record)
            write(args, rule, runs, total, time.perf_counter() - start, argv)  # partial results survive a stop
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s")
    return 0


def rule_text(args):
    """The stopping rule in words, as stored with the runs."""
    return (f"the plateau test passes once the best held-out (monitor) loss fell by less than {args.tol} nats over "
            f"the last {args.window} steps, evaluated every {args.eval_every} steps, not before step "
            f"{args.min_steps}; then {args.extra} steps more; at most {args.max_steps} steps without a pass "
            f"({min(args.max_steps, args.lookup_max_steps)} for the lookup task)")


def write(args, rule, runs, n_jobs, seconds, argv):
    """Write the runs so far (in the order of the configurations) and the metadata to ``args.out``."""
    order = {config: i for i, config in enumerate(CONFIGS)}
    runs = sorted(runs, key=lambda r: (order[r["experiment"], r["task"], r["n"], r["k"], r["sharing"], r["init"]],
                                       r["seed"]))
    meta = dict(tasks=dict(reversal="tasks.reversal_batch", lookup=f"tasks.lookup_batch, table = {TABLE}"),
                model=MODEL, train=TRAIN, convergence=dict(
                    rule=rule_text(args), lookup_max_steps=min(args.max_steps, args.lookup_max_steps), **rule),
                monitor_batch=MONITOR_BATCH, test_batch=TEST_BATCH, wall_seconds=round(seconds),
                cpu_seconds=round(sum(r["cpu_seconds"] for r in runs)), jobs=args.jobs,
                complete=len(runs) == n_jobs, torch=torch.__version__, machine=platform.machine(),
                command="python tools/train_sharing.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, runs=runs), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
