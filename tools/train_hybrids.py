"""Train small hybrid models, layer patterns from all-recurrent to all-softmax, on recall and on English text.

The runs behind notebook 14, Section 14.5: the notebook loads them from ``course_lib/data/hybrid_runs.json``
(and the weights of one run, ``hybrid_recall_ddds.safetensors``, for its generation examples) and trains the
first steps of one run itself.

Every model is a ``HybridLM`` of four layers, d_model = 64, 4 heads, no absolute positions (notebook 14),
one letter a layer, first layer first:

* ``D``: Gated DeltaNet (``"gated_deltanet"``, a state of 4 × 16 × 16 numbers and the short convolution's inputs);
* ``S``: softmax attention with rotary positions (a key and a value cached per token);
* ``W``: softmax over a sliding window of the last ``WINDOW`` keys (``("softmax", {"window": WINDOW})``).

Two tasks, three seeds, every pattern (the window, which is about recall beyond its reach, on recall only):

* ``recall``: multi-query associative recall (notebook 11's ``tasks.mqar_batch``), ``N_PAIRS`` pairs, then every
  key again; scored on 256 held-out rows: accuracy, accuracy by the distance from a query back to its value
  (the window's reach), and each row's accuracy (the paired tests of the notebook).
* ``text``: next-byte loss on the course's English text (``tasks.passage_split``: training passages from the
  corpus's start, the 48 held-out passages from its end); scored on each held-out passage's first
  ``EVAL_WINDOWS`` windows of the training length, one loss a passage.  Each text run is also scored at
  ``CONTROL_STEP``: the same model, trained less, is the positive control a flat result is read beside.

Adam at a constant learning rate (no schedule that decays before a recurrent model's late jump in recall),
fresh batches every step, one budget of steps a task for every pattern (no early stop: a run ends at the
same step whatever it learned; the notebook shows each run's held-out curve up to there).  A seed fixes
the initial weights and the batches, shared by every pattern.  Each run is one process with one CPU
thread; ``--jobs`` runs that many at once.

    python tools/train_hybrids.py                 write course_lib/data/hybrid_runs.json (27 runs, 30 min on the
                                                  2 cores of an Intel Xeon, 60 CPU-min; over the 20-min budget)
    python tools/train_hybrids.py --tasks recall --patterns SSSS DSDS DDDD DDDS DDDW --seeds 0 --steps 2400 \
        --jobs 1 --out course_lib/data/hybrid_runs_long.json      one seed, three times the steps (the long runs)
    python tools/train_hybrids.py --tasks recall --patterns SSSS --seeds 0 --steps 2400 --lrs 0.001 0.01 --jobs 1 \
        --out course_lib/data/hybrid_runs_softmax_lr.json         the all-softmax model at two more learning rates
    python tools/train_hybrids.py --tasks recall --patterns DDDD DDDS --seeds 0 --lrs 0.001 0.01 --jobs 2 \
        --out course_lib/data/hybrid_runs_lr.json                 DDDD and DDDS at two more rates (8 min on 2 cores)
    python tools/train_hybrids.py --tasks recall --patterns DDDS --seeds 0 --steps 200 --out /tmp/h.json
"""

import argparse
import itertools
import multiprocessing
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from course_lib import tasks  # noqa: E402
from course_lib.torch.hybrid import HybridLM  # noqa: E402
from tools.train_copy import write_runs  # noqa: E402 (stored as the copy runs are)

WINDOW = 16
LETTERS = {"D": "gated_deltanet", "S": "softmax", "W": ("softmax", {"window": WINDOW})}
PATTERNS = ("DDDD", "DDDS", "DSDS", "SSSS", "DDDW")
MODEL = dict(d_model=64, n_heads=4, conv_size=4, chunk_size=64)
TASKS = ("recall", "text")
RECALL = dict(n_keys=64, n_values=32)
N_PAIRS = 32  # a row: 2N pair tokens, then N queries (3N = 96 tokens); heads of d = 16 hold about d pairs
DISTANCE_EDGES = (0, WINDOW - 1, 31, 63, 3 * N_PAIRS - 1)  # query → value: 1-15 (in the window), 16-31, 32-63, 64-95
TEXT_LENGTH, EVAL_WINDOWS, VOCAB_TEXT = 64, 4, 256  # bytes a window; windows a held-out passage; byte values
TRAIN = dict(recall=dict(batch_size=16, lr=3e-3, steps=800), text=dict(batch_size=16, lr=3e-3, steps=600))
EVAL_EVERY, CONTROL_STEP = 100, 400  # the text runs' control: the same model 200 steps before the end
EVAL_ROWS, HELDOUT_PASSAGES = 256, 48
SEEDS = (0, 1, 2)
TEST_SEED = 12345  # the held-out recall rows: their own generator, never a training batch
LOSS_STEPS = 100  # the training loss is stored at every one of the first steps (the notebook's live check)
WEIGHTS = dict(task="recall", pattern="DDDS", seed=0, file="hybrid_recall_ddds.safetensors")


def layers(pattern):
    """The layer specs of a pattern such as ``"DDDS"``: one letter a layer, first layer first."""
    return [LETTERS[letter] for letter in pattern]


def build(task, pattern, seed):
    """The model of one run, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    vocab = RECALL["n_keys"] + RECALL["n_values"] if task == "recall" else VOCAB_TEXT
    return HybridLM(vocab, layers=layers(pattern), **MODEL)


def batch_seed(seed):
    """The training batches of a seed: the same for every pattern."""
    return 1000 + seed


# --- recall ----------------------------------------------------------------------------------


def query_distances(tokens):
    """``(b, 3N)``: at each query, the positions back to its value token (0 elsewhere); rows from ``mqar_batch``."""
    n_pairs = tokens.shape[1] // 3
    keys, queries = tokens[:, 0:2 * n_pairs:2], tokens[:, 2 * n_pairs:]  # (b, N) each
    pair = (queries[:, :, None] == keys[:, None, :]).int().argmax(-1)  # (b, N): which pair each query asks
    positions = 2 * n_pairs + torch.arange(n_pairs)  # (N,): the queries' positions
    distances = torch.zeros_like(tokens)
    distances[:, 2 * n_pairs:] = positions - (2 * pair + 1)  # the value sits right after its key
    return distances


def score_recall(model, tokens, targets):
    """Held-out recall: ``(loss, accuracy, accuracy by distance bin, accuracy per row, per row beyond the window)``."""
    model.eval()
    with torch.no_grad():
        logits = model(tokens)  # (b, 3N, vocab)
    scored = targets != tasks.IGNORED  # (b, 3N): the queries
    loss = torch.nn.functional.cross_entropy(logits[scored], targets[scored]).item()
    right = (logits.argmax(-1) == targets) & scored
    distances = query_distances(tokens)
    by_distance = []
    for low, high in zip(DISTANCE_EDGES[:-1], DISTANCE_EDGES[1:], strict=True):
        in_bin = scored & (distances > low) & (distances <= high)
        by_distance.append(right[in_bin].double().mean().item())
    per_row = (right.sum(1) / scored.sum(1)).tolist()
    far = scored & (distances >= WINDOW)  # queries whose value lies beyond a window layer's reach
    per_row_far = (right & far).sum(1) / far.sum(1).clamp(min=1)
    return loss, right[scored].double().mean().item(), by_distance, per_row, per_row_far.tolist()


def train_recall(model, seed, steps, batch_size, lr):
    held_out = tasks.mqar_batch(EVAL_ROWS, N_PAIRS, torch.Generator().manual_seed(TEST_SEED), **RECALL)
    generator = torch.Generator().manual_seed(batch_seed(seed))

    def next_loss():
        return tasks.reversal_loss(model, *tasks.mqar_batch(batch_size, N_PAIRS, generator, **RECALL))

    history = _train(model, next_loss, lambda: score_recall(model, *held_out)[:2], steps, lr)
    loss, accuracy, by_distance, per_row, per_row_far = score_recall(model, *held_out)
    return dict(history, accuracy=accuracy, by_distance=by_distance, per_row=per_row, per_row_far=per_row_far)


# --- English text ------------------------------------------------------------------------------


def text_data():
    """``(training bytes (t,), held-out windows (48, EVAL_WINDOWS, TEXT_LENGTH + 1))`` of the course's corpus."""
    train, heldout = tasks.passage_split(None, HELDOUT_PASSAGES, min_tokens=256)
    stream = torch.tensor(list(" ".join(train).encode()), dtype=torch.long)
    span = EVAL_WINDOWS * TEXT_LENGTH + 1  # windows that share their edge byte: every byte predicted once
    passages = [torch.tensor(list(p.encode()[:span]), dtype=torch.long) for p in heldout]
    windows = torch.stack([p.unfold(0, TEXT_LENGTH + 1, TEXT_LENGTH) for p in passages])  # (48, windows, n + 1)
    return stream, windows


def text_batch(stream, batch_size, generator):
    """``(tokens, targets)`` ``(b, TEXT_LENGTH)``: windows of the training bytes at random offsets, next bytes."""
    starts = torch.randint(0, len(stream) - TEXT_LENGTH - 1, (batch_size,), generator=generator)
    rows = stream[starts[:, None] + torch.arange(TEXT_LENGTH + 1)]  # (b, n + 1)
    return rows[:, :-1], rows[:, 1:]


def score_text(model, windows):
    """``(mean loss, loss per held-out passage)`` in nats per byte, each window read from its start."""
    model.eval()
    flat = windows.flatten(0, 1)  # (48 · windows, n + 1)
    with torch.no_grad():
        logits = model(flat[:, :-1])  # (48 · windows, n, 256)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), flat[:, 1:], reduction="none")
    per_passage = losses.reshape(len(windows), -1).mean(1)  # (48,)
    return per_passage.mean().item(), per_passage.tolist()


def train_text(model, seed, steps, batch_size, lr):
    stream, windows = text_data()
    generator = torch.Generator().manual_seed(batch_seed(seed))
    control, evaluated_at = {}, itertools.count(EVAL_EVERY, EVAL_EVERY)  # the step of each score() call

    def next_loss():
        return tasks.reversal_loss(model, *text_batch(stream, batch_size, generator))

    def score():
        loss, per_passage = score_text(model, windows)
        if next(evaluated_at) == CONTROL_STEP:
            control["per_passage_control"] = per_passage
        return loss, None

    history = _train(model, next_loss, score, steps, lr)
    loss, per_passage = score_text(model, windows)
    return dict(history, loss_heldout=loss, per_passage=per_passage, **control)


# --- the loop ----------------------------------------------------------------------------------


def _train(model, next_loss, score, steps, lr):
    """``tasks.train_scored`` for ``steps`` steps, no early stop (``score()`` → ``(held-out loss, accuracy or None)``
    after every ``EVAL_EVERY`` steps), stored as the sweep stores it: the training loss at every one of the first
    ``LOSS_STEPS`` steps then at every 10th, and the held-out accuracy only where there is one."""
    history = tasks.train_scored(model, next_loss, score, steps=steps, lr=lr, eval_every=EVAL_EVERY)
    return dict(loss=[loss for step, loss in zip(history["step"], history["loss"], strict=True)
                      if step <= LOSS_STEPS or step % 10 == 0],
                eval_step=history["eval_step"], eval_loss=history["eval_loss"],
                eval_accuracy=[a for a in history["eval_accuracy"] if a is not None])


def run(job):
    """One run in its own process: ``job = (task, pattern, seed, steps, lr)`` (lr None: the task's)."""
    task, pattern, seed, steps, lr = job
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    model = build(task, pattern, seed)
    train = dict(TRAIN[task], steps=steps, lr=lr or TRAIN[task]["lr"])
    start = time.perf_counter()
    result = (train_recall if task == "recall" else train_text)(model, seed, **train)
    seconds = time.perf_counter() - start
    stored = (WEIGHTS["task"], WEIGHTS["pattern"], WEIGHTS["seed"], TRAIN[WEIGHTS["task"]]["steps"], None)
    if (task, pattern, seed, steps, lr) == stored:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ROOT / "course_lib" / "data" /
                  WEIGHTS["file"])
    score = f"accuracy {result['accuracy']:.3f}" if task == "recall" else f"loss {result['loss_heldout']:.3f}"
    print(f"{task:>6} {pattern} seed {seed}: held-out {score} after {steps} steps, {seconds:.0f} s", flush=True)
    return dict(task=task, pattern=pattern, seed=seed, steps=steps, lr=train["lr"], seconds=seconds, **result)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--steps", type=int, default=None, help="steps a run (default: each task's budget)")
    parser.add_argument("--lrs", type=float, nargs="+", default=[None],
                        help="learning rates, every run at each (default: each task's one)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process and one thread each")
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "hybrid_runs.json"))
    args = parser.parse_args()
    jobs = [(task, pattern, seed, args.steps or TRAIN[task]["steps"], lr)
            for task in args.tasks for seed in args.seeds for pattern in args.patterns for lr in args.lrs
            if task == "recall" or "W" not in pattern]  # the window is about recall beyond it: recall only
    jobs.sort(key=lambda job: (job[0] != "recall", job[2]))  # recall first, seed by seed: the first seed reads early
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(run, jobs, chunksize=1)
    wall = time.perf_counter() - start
    settings = dict(model=MODEL, letters={k: v if isinstance(v, str) else list(v) for k, v in LETTERS.items()},
                    window=WINDOW, patterns=args.patterns, text_patterns=[p for p in args.patterns if "W" not in p],
                    recall=dict(RECALL, n_pairs=N_PAIRS, eval_rows=EVAL_ROWS,
                                                                        distance_edges=DISTANCE_EDGES),
                    text=dict(length=TEXT_LENGTH, eval_windows=EVAL_WINDOWS, heldout_passages=HELDOUT_PASSAGES,
                              vocab=VOCAB_TEXT, control_step=CONTROL_STEP),
                    train=TRAIN, eval_every=EVAL_EVERY, loss_steps=LOSS_STEPS,
                    seeds=dict(models=args.seeds, batches=[batch_seed(s) for s in args.seeds], test=TEST_SEED),
                    weights=WEIGHTS, cpu_seconds=round(sum(r["seconds"] for r in results)))
    command = "python tools/train_hybrids.py" + ("" if sys.argv[1:] == [] else " " + " ".join(sys.argv[1:]))
    write_runs(args.out, command, settings, results, jobs=args.jobs, wall=wall, count=len(jobs))


if __name__ == "__main__":
    main()
