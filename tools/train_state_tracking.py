"""Train small models on notebook 13's state-tracking tasks and score them at lengths beyond training.

The runs behind notebook 13, Section 13.6: the notebook loads them from
``course_lib/data/state_tracking_runs.json`` and trains one short run itself.

Every model is a ``HybridLM`` (no absolute positions: a recurrent layer counts nothing but what its
state holds) of one layer, d_model = 16, one head, trained on sequences of ``TRAIN_LENGTH`` tokens with
an answer at every position (so every length ≤ 40 is trained), then scored on held-out sequences of
``TEST_LENGTH`` tokens, accuracy per bin of positions (``EDGES``).  The mixers:

* ``deltanet``: DeltaNet with β = σ(·) ∈ [0, 1] (the transition's eigenvalues in [0, 1]);
* ``deltanet_neg``: DeltaNet with β = 2σ(·) ∈ [0, 2] (an eigenvalue in [−1, 1]: reflections);
* ``deltaproduct2``, ``deltaproduct3``: DeltaProduct, n_h = 2 or 3 steps a token, β ∈ [0, 2];
* ``gate``: a data-dependent decay per head (eigenvalues in (0, 1]);
* ``softmax``: softmax attention with rotary positions.

Parity and counting mod 3 train every mixer; S3 trains the delta rule with n_h = 1, 2 and 3 steps a token.

Adam at a constant learning rate, batches of 32 drawn fresh, a held-out batch at the training length
scored every ``EVAL_EVERY`` steps; every run takes ``MAX_STEPS`` steps.  No early stop: in a first
probe, DeltaNet with β ∈ [0, 2] stopped at 99 % (or at 100 %) of the held-out answers at length 40 after
400-600 steps and then lost accuracy beyond 128 positions.  Every (task, mixer, seed) trains at each
learning rate of ``LRS``, and the notebook keeps, per (task, mixer), the learning rate whose held-out
accuracy at the training length was best (``state_tasks.best_learning_rates``: Zoology's protocol; the
test lengths never choose).  At one learning rate (3e-3) a seed of DeltaNet with β ∈ [0, 2] never learned
parity in 1,500 steps, nor in 4,000; at 1e-2 it did.  A seed fixes the initial weights and the batches,
shared by every mixer and learning rate.  For the delta-rule mixers a run also stores β for each token
value, at initialisation and after training (``beta_init``, ``beta_final``: one list of n_h numbers per
token value; the keys are unit vectors, so β is β‖k‖²).  Each run is one process with one CPU thread;
``--jobs`` runs that many at once.

    python tools/train_state_tracking.py          write course_lib/data/state_tracking_runs.json
                                                  (117 runs: 39 CPU-minutes at each run's least time here,
                                                  50 min with --jobs 1 beside other work)
    python tools/train_state_tracking.py --tasks parity --mixers deltanet --seeds 0 --lrs 1e-2 --out /tmp/st.json
"""

import argparse
import multiprocessing
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import state_tasks  # noqa: E402
from course_lib.torch.hybrid import HybridLM  # noqa: E402
from tools.train_copy import write_runs  # noqa: E402 (stored as the copy runs are)

MODEL = dict(d_model=16, n_heads=1, n_layers=1, conv_size=4, chunk_size=64)
TRAIN = dict(batch_size=32, eval_batch=128)
LRS = (1e-3, 3e-3, 1e-2)  # half a decade apart around 3e-3, the rate of a first probe
TRAIN_LENGTH, TEST_LENGTH, TEST_BATCH = 40, 256, 128
EDGES = (0, 40, 64, 128, 256)  # accuracy at positions 1-40 (trained), 41-64, 65-128, 129-256
EVAL_EVERY, STOP_ACCURACY, MAX_STEPS = 100, None, 1500  # one budget for every run: no early stop
MOD = 3
TASKS = ("parity", "mod", "s3")
MIXERS = dict(parity=("deltanet", "deltanet_neg", "gate", "softmax"),
              mod=("deltanet", "deltanet_neg", "deltaproduct2", "deltaproduct3", "gate", "softmax"),
              s3=("deltanet_neg", "deltaproduct2", "deltaproduct3"))  # S3: n_h = 1, 2, 3 steps a token
SPECS = {"deltanet": "deltanet", "deltanet_neg": ("deltanet", {"negative_eigenvalues": True}),
         "deltaproduct2": ("deltaproduct", {"n_householder": 2, "negative_eigenvalues": True}),
         "deltaproduct3": ("deltaproduct", {"n_householder": 3, "negative_eigenvalues": True}),
         "gate": "gate", "softmax": "softmax"}
SEEDS = (0, 1, 2)
TEST_SEED = 12345  # the held-out batches: their own generator, never a training batch


def build(task, mixer, seed):
    """The model of one run, its weights fixed by ``seed``: vocabulary = max(symbols, answers)."""
    torch.manual_seed(seed)
    symbols, classes = state_tasks.sizes(task, MOD)
    model = dict(MODEL)
    layers = [SPECS[mixer]] * model.pop("n_layers")
    return HybridLM(max(symbols, classes), layers=layers, **model)


def token_betas(model, task):
    """β of the first layer for each token value, ``(symbols, n_h)`` as lists, or None for a mixer without β.

    In a one-layer model β_t depends on token t alone (its projection reads the normalised embedding).
    """
    mixer = model.blocks[0].mixer
    if not hasattr(mixer, "beta"):
        return None
    symbols, _ = state_tasks.sizes(task, MOD)
    with torch.no_grad():
        x = model.blocks[0].norm1(model.embed(torch.arange(symbols)[None]))  # (1, symbols, d_model)
        beta = mixer.beta(x)[0, 0]  # (symbols · n_h,): the first (only) head
    return beta.reshape(symbols, -1).tolist()


def run(job):
    """One run in its own process: ``job = (task, mixer, seed, lr, steps)``."""
    task, mixer, seed, lr, steps = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(task, mixer, seed)
    beta_init = token_betas(model, task)
    start = time.perf_counter()
    history = state_tasks.train(model, task, seed=seed, steps=steps, length=TRAIN_LENGTH, eval_every=EVAL_EVERY,
                                stop_accuracy=STOP_ACCURACY, m=MOD, held_out_seed=TEST_SEED + 1, lr=lr, **TRAIN)
    _, classes = state_tasks.sizes(task, MOD)
    tokens, target = state_tasks.sample(task, TEST_BATCH, TEST_LENGTH, np.random.default_rng(TEST_SEED), MOD)
    predicted = state_tasks.predict(model, tokens, classes)
    accuracy = state_tasks.accuracy_by_length(predicted, target, EDGES)
    beyond = (predicted == target)[:, TRAIN_LENGTH:].mean(axis=1)  # (TEST_BATCH,): each test sequence beyond training
    seconds = time.perf_counter() - start
    print(f"{task:>6} {mixer:>14} seed {seed} lr {lr:g}: accuracy by length {[f'{a:.3f}' for a in accuracy]} after "
          f"{history['step'][-1]} steps, {seconds:.0f} s", flush=True)
    betas = {} if beta_init is None else dict(beta_init=beta_init, beta_final=token_betas(model, task))
    return dict(task=task, mixer=mixer, seed=seed, lr=lr, steps=history["step"][-1], accuracy=accuracy,
                per_sequence=[round(float(a), 4) for a in beyond], seconds=seconds, **betas, **history)


def available(mixer):
    """True when this library's ``HybridLM`` builds ``mixer`` (a layer option may be newer than the tool)."""
    try:
        build("parity", mixer, 0)
    except (ValueError, TypeError):
        return False
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--mixers", nargs="+", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=MAX_STEPS)
    parser.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "state_tracking_runs.json"))
    args = parser.parse_args()
    jobs, skipped = [], []
    for task in args.tasks:
        for mixer in args.mixers or MIXERS[task]:
            if not available(mixer):
                skipped.append(mixer)
                continue
            jobs += [(task, mixer, seed, lr, args.steps) for seed in args.seeds for lr in args.lrs]
    if skipped:
        print(f"skipped (not in this library's HybridLM): {sorted(set(skipped))}", flush=True)
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(run, jobs, chunksize=1)
    wall = time.perf_counter() - start
    settings = dict(model=MODEL, train=TRAIN, train_length=TRAIN_LENGTH, test_length=TEST_LENGTH,
                    test_batch=TEST_BATCH, edges=EDGES, eval_every=EVAL_EVERY, stop_accuracy=STOP_ACCURACY,
                    max_steps=args.steps, lrs=args.lrs, mod=MOD, seeds=args.seeds, test_seed=TEST_SEED,
                    specs={m: SPECS[m] for m in {r["mixer"] for r in results}})
    command = "python tools/train_state_tracking.py" + ("" if sys.argv[1:] == [] else " " + " ".join(sys.argv[1:]))
    write_runs(args.out, command, settings, results, jobs=args.jobs, wall=wall, count=len(jobs))
    for (task, mixer), lr in state_tasks.best_learning_rates(results).items():
        print(f"best learning rate, {task} {mixer}: {lr:g}")


if __name__ == "__main__":
    main()
