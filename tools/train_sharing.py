"""Train small Linformer encoders on the reversal task for every sharing mode and several (n, k).

The longer runs behind notebook 05: it trains shorter versions of the same models itself,
and loads these from ``course_lib/data/sharing_runs.json`` (package data, so an installed
course has it too).  Every run is fixed by its seed (model weights and batches) and runs on
one CPU thread, so the same machine and torch version give the same numbers again.

    python tools/train_sharing.py                      write course_lib/data/sharing_runs.json
    python tools/train_sharing.py --steps 200 --out /tmp/runs.json   a quick look
"""

import argparse
import json
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
# Experiment "sharing": every mode at one (n, k), with exact attention as the baseline.
SHARING_RUNS = [(32, None, "exact")] + [(32, 8, mode) for mode in SHARING_MODES]
# Experiment "k-vs-n", with the sharing experiment's (32, 8): k = 8 at n = 32 and 64, k = 16 at
# n = 64 and 128, k = 8 and 16 at n = 64, and n/k = 4 at (32, 8), (64, 16); n/k = 8 at (64, 8), (128, 16).
K_VS_N_RUNS = [(64, None, "exact"), (128, None, "exact"), (64, 8, "headwise"), (64, 16, "headwise"),
               (128, 16, "headwise")]


def run(experiment, n, k, sharing, *, steps, seed):
    """Train one model; return a JSON-ready record of its configuration and results."""
    torch.manual_seed(seed)
    model = LinformerEncoder(max_len=n, k=k, sharing="none" if k is None else sharing, **MODEL)
    start = time.perf_counter()
    history = tasks.train_reversal(model, n=n, vocab_size=MODEL["vocab_size"], steps=steps,
                                   generator=torch.Generator().manual_seed(seed), **TRAIN)
    seconds = time.perf_counter() - start
    loss, accuracy = tasks.evaluate_reversal(model, n=n, vocab_size=MODEL["vocab_size"],
                                             generator=torch.Generator().manual_seed(10_000 + seed))
    return dict(experiment=experiment, attention="exact" if k is None else "linformer", sharing=sharing,
                n=n, k=k, seed=seed, steps=steps, parameters=sum(p.numel() for p in model.parameters()),
                projection_matrices=distinct_projection_matrices(model), history=history,
                eval_loss=loss, eval_accuracy=accuracy, train_seconds=round(seconds, 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="training steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one run per seed")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "course_lib" / "data" / "sharing_runs.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every run
    runs = []
    for experiment, configs in (("sharing", SHARING_RUNS), ("k-vs-n", K_VS_N_RUNS)):
        for n, k, sharing in configs:
            for seed in args.seeds:
                runs.append(run(experiment, n, k, sharing, steps=args.steps, seed=seed))
                last = runs[-1]
                print(f"{experiment:8} n={n:4} k={k!s:5} {sharing:10} seed {seed}: loss {last['eval_loss']:.4f} "
                      f"accuracy {last['eval_accuracy']:.4f} ({last['train_seconds']} s)", flush=True)
    meta = dict(task="reversal", model=MODEL, train=TRAIN, torch=torch.__version__, machine=platform.machine(),
                command="python tools/train_sharing.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, runs=runs), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
