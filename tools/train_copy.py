"""Train the small causal model of notebook 07 on the copy task, with softmax and with linear attention.

The runs behind notebook 07, Section 7.4: the notebook trains the first steps of the same two
models itself and loads the full runs from ``course_lib/data/copy_runs.json`` (package data, so
an installed course has it too).  Both runs share everything but the attention: the seed of the
initial weights, the batches (one generator seed), the optimiser and the number of steps.  Each
run is scored on one held-out batch, in parallel (teacher forcing) and by greedy generation of the
copy token by token through ``CausalLM.step`` (the RNN for linear attention, a key/value cache for
softmax).  One CPU thread, so the same machine and torch version give the same numbers again.

    python tools/train_copy.py                          write course_lib/data/copy_runs.json
    python tools/train_copy.py --steps 50 --out /tmp/copy.json   a quick look
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
from course_lib.torch.causal_lm import ATTENTIONS, CausalLM, generate  # noqa: E402

TASK = dict(length=16, n_symbols=10)  # 16 symbols, the separator, the 16 again: 33 tokens
MODEL = dict(d_model=64, n_heads=4, n_layers=2)
TRAIN = dict(batch_size=32, lr=3e-3, log_every=10)
MODEL_SEED, BATCH_SEED, TEST_SEED, TEST_BATCH = 0, 1, 2, 256


def build(attention):
    """The model of one run, its weights fixed by ``MODEL_SEED``."""
    torch.manual_seed(MODEL_SEED)
    vocab = TASK["n_symbols"] + 1  # the symbols and the separator
    return CausalLM(vocab, 2 * TASK["length"], attention=attention, **MODEL)


def generated_accuracy(model):
    """Per-token accuracy of the copy made by greedy generation from the first half and the separator."""
    length = TASK["length"]
    tokens = tasks.copy_batch(TEST_BATCH, length, TASK["n_symbols"], torch.Generator().manual_seed(TEST_SEED))
    made = generate(model.eval(), tokens[:, :length + 1], length)  # (b, 2L + 1)
    return (made[:, length + 1:] == tokens[:, length + 1:]).double().mean().item()


def run(attention, steps):
    model = build(attention)
    start = time.perf_counter()
    history = tasks.train_copy(model, steps=steps, generator=torch.Generator().manual_seed(BATCH_SEED),
                               **TASK, **TRAIN)
    seconds = time.perf_counter() - start
    loss, accuracy = tasks.evaluate_copy(model, generator=torch.Generator().manual_seed(TEST_SEED), **TASK,
                                         batch_size=TEST_BATCH)
    return dict(history, seconds=seconds, test_loss=loss, test_accuracy=accuracy,
                generated_accuracy=generated_accuracy(model))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "course_lib" / "data" / "copy_runs.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the same reduction order on every run
    runs = {}
    for attention in ATTENTIONS:
        runs[attention] = run(attention, args.steps)
        print(f"{attention}: final training loss {runs[attention]['loss'][-1]:.3g}, held-out loss "
              f"{runs[attention]['test_loss']:.3g}, generated accuracy {runs[attention]['generated_accuracy']:.3f}, "
              f"{runs[attention]['seconds']:.0f} s", flush=True)
    settings = dict(task=TASK, model=MODEL, train=TRAIN, steps=args.steps, seeds=dict(model=MODEL_SEED,
                    batches=BATCH_SEED, test=TEST_SEED), test_batch=TEST_BATCH)
    meta = dict(command="python tools/train_copy.py", torch=torch.__version__, machine=platform.processor()
                or platform.machine(), threads=1)
    pathlib.Path(args.out).write_text(json.dumps(dict(settings=settings, meta=meta, runs=runs), indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
