"""Decoding with a state: µs per token and cache bytes against position, prefill against steps, rollback. Notebook 14.

    python tools/bench_hybrid.py            # about 3 min, one thread; writes course_lib/data/bench_hybrid_cpu.json

Three ``HybridLM`` models of the same width (d_model 256, 4 heads of 64, 4 blocks, vocabulary 256,
random weights: time and bytes do not depend on what the weights learned), float32, batch 1:

- ``softmax``: four softmax layers with a key/value cache (rotary positions);
- ``hybrid``: three ``gated_deltanet`` layers, then one softmax layer (the 3:1 of Qwen3-Next and Kimi Linear);
- ``recurrent``: four ``gated_deltanet`` layers.

Measured, under ``torch.inference_mode()``, on ``--threads`` threads (default one, as the recurrent grid):

- ``decode``: at each position p (1,024 … 16,384) the cache is filled by chunked prefills of
  ``PIECE`` tokens to p − 1 tokens, then ``--steps`` consecutive one-token steps are timed one by one
  (after ``WARMUP`` untimed ones); ``time_min_s`` and ``time_median_s`` per token.  ``cache_bytes``:
  ``HybridCache.nbytes()`` before the first timed step, after the warm-up: p − 1 + ``WARMUP`` tokens
  (the keys and values in use, or the recurrent states).
  ``bytes_read``: what one step must read from memory: every parameter except the embedding table
  (one row of it) plus the cache — the decode roofline's numerator.
- ``bandwidth_gbs``: this machine's memory read bandwidth on the same threads, a sum over a 512 MiB
  tensor (the best of ``REPEATS``), so ``bytes_read / bandwidth`` is the least time a step can take.
- ``prefill``: ``PREFILL_N`` tokens by one chunked ``prefill`` against the same tokens fed by ``step``.
- ``rollback``: from a cache of ``PREFILL_N`` tokens (``--prefill-n``) with a snapshot taken ``SNAPSHOT_BACK`` tokens
  earlier, dropping the last j tokens by replay (``HybridLM.rollback``: a chunked prefill of the
  ``SNAPSHOT_BACK − j`` tokens since the snapshot) against a state stored after every token:
  ``save_s`` is what storing one token's recurrent states costs during decoding, ``stored_bytes``
  what j of them hold (a softmax layer stores nothing: its length moves back).
"""

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course_lib.bench.measure import hardware  # noqa: E402
from course_lib.torch.hybrid import HybridLM, KeyValues  # noqa: E402

MODELS = {"softmax": ["softmax"] * 4, "hybrid": ["gated_deltanet"] * 3 + ["softmax"],
          "recurrent": ["gated_deltanet"] * 4}
POSITIONS = (1024, 2048, 4096, 8192, 16384)
VOCAB, D_MODEL, N_HEADS = 256, 256, 4
PIECE = 1024  # prefill the cache in pieces: the softmax mask of one piece is PIECE × p, not p × p
WARMUP, REPEATS = 4, 5
PREFILL_N, SNAPSHOT_BACK, ROLLBACK_J = 4096, 64, (1, 8, 32, 64)
OUT = ROOT / "course_lib" / "data" / "bench_hybrid_cpu.json"


def make_model(name, d_model=D_MODEL, n_heads=N_HEADS, seed=0):
    torch.manual_seed(seed)
    return HybridLM(VOCAB, layers=MODELS[name], d_model=d_model, n_heads=n_heads).eval()


def fill(model, n, generator, piece=PIECE):
    """A cache that has seen ``n`` random tokens, by chunked prefills of ``piece`` tokens."""
    cache = model.empty_cache(1)
    for start in range(0, n, piece):
        tokens = torch.randint(VOCAB, (1, min(piece, n - start)), generator=generator)
        cache = model.prefill(tokens, cache)[1]
    return cache


def parameter_bytes(model):
    """Bytes of parameters one step reads: all of them but the embedding table, of which one row."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    table = model.embed.weight
    return total - table.numel() * table.element_size() + table.shape[1] * table.element_size()


def read_bandwidth(mebibytes=512):
    """Memory read bandwidth, GB/s: the best of ``REPEATS`` sums over a tensor far larger than any cache."""
    x = torch.ones(mebibytes * 2**20 // 4)
    x.sum()
    best = min(_seconds(x.sum) for _ in range(REPEATS))
    return x.numel() * x.element_size() / best / 1e9


def _seconds(fn):
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def decode_rows(name, model, positions, steps, generator):
    rows = []
    weights = parameter_bytes(model)
    for p in positions:
        cache = fill(model, p - 1, generator)
        tokens = torch.randint(VOCAB, (WARMUP + steps,), generator=generator)
        times = []
        for i, token in enumerate(tokens):
            if i == WARMUP:
                nbytes = cache.nbytes()  # after the warm-up: p + 3 tokens seen, what the first timed step reads
            seconds = _seconds(lambda token=token, cache=cache: model.step(token[None], cache))
            if i >= WARMUP:
                times.append(seconds)
        rows.append({"model": name, "layers": "".join("S" if layer == "softmax" else "D" for layer in model.layers),
                     "position": p, "steps": steps, "time_min_s": min(times),
                     "time_median_s": statistics.median(times), "cache_bytes": nbytes,
                     "bytes_read": weights + nbytes})
        print(f"decode {name:9s} p = {p:6d}: {min(times) * 1e6:8.0f} µs min, {statistics.median(times) * 1e6:8.0f} µs "
              f"median, cache {nbytes / 2**20:7.2f} MiB", flush=True)
    return rows


def prefill_row(name, model, n, generator):
    tokens = torch.randint(VOCAB, (1, n), generator=generator)
    model.prefill(tokens[:, :PIECE])  # warm-up
    chunked = min(_seconds(lambda: model.prefill(tokens)) for _ in range(2))
    cache = model.empty_cache(1)
    began = time.perf_counter()
    for t in range(n):
        cache = model.step(tokens[:, t], cache)[1]
    steps = time.perf_counter() - began
    print(f"prefill {name:9s} n = {n}: chunked {chunked:.3f} s, by steps {steps:.2f} s", flush=True)
    return {"model": name, "n": n, "chunked_s": chunked, "steps_s": steps}


def recurrent_states(cache):
    return [state for state in cache.states if not isinstance(state, KeyValues)]


def rollback_rows(name, model, n, generator):
    rows = []
    snapshot = fill(model, n - SNAPSHOT_BACK, generator)
    cache = snapshot.copy()
    cache = model.prefill(torch.randint(VOCAB, (1, SNAPSHOT_BACK), generator=generator), cache)[1]
    states = recurrent_states(cache)
    save = [_seconds(lambda: [type(s)(*(t.clone() for t in s)) for s in states]) for _ in range(20)]
    per_token = sum(t[0].numel() * t.element_size() for s in states for t in s)
    for j in ROLLBACK_J:
        model.rollback(cache, j, snapshot=snapshot)  # warm-up
        replay = min(_seconds(lambda j=j: model.rollback(cache, j, snapshot=snapshot)) for _ in range(REPEATS))
        rows.append({"model": name, "j": j, "snapshot_back": SNAPSHOT_BACK, "replay_s": replay,
                     "save_s": min(save), "stored_bytes": j * per_token})
        print(f"rollback {name:9s} j = {j:3d}: replay {replay * 1e3:7.2f} ms; stored states "
              f"{j * per_token / 2**20:6.2f} MiB, {min(save) * 1e6:.0f} µs a token to save", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS))
    parser.add_argument("--steps", type=int, default=32, help="timed one-token steps per position (default 32)")
    parser.add_argument("--prefill-n", type=int, default=PREFILL_N)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=D_MODEL)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--note", default="", help="stored in meta (e.g. the machine's load)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    command = "python tools/bench_hybrid.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"meta": {"command": command,
                       "hardware": hardware(), "threads": args.threads, "date": datetime.date.today().isoformat(),
                       "d_model": args.d_model, "n_heads": N_HEADS, "vocab": VOCAB, "blocks": 4, "dtype": "float32",
                       "batch": 1, "note": args.note},
              "bandwidth_gbs": read_bandwidth(), "decode": [], "prefill": [], "rollback": []}
    print(f"read bandwidth {result['bandwidth_gbs']:.1f} GB/s", flush=True)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for name in MODELS:
            model = make_model(name, args.d_model)
            result["meta"][f"parameter_bytes_{name}"] = parameter_bytes(model)
            result["decode"] += decode_rows(name, model, args.positions, args.steps, generator)
            result["prefill"].append(prefill_row(name, model, args.prefill_n, generator))
            result["rollback"] += rollback_rows(name, model, args.prefill_n, generator)
    result["meta"]["seconds"] = round(time.perf_counter() - began, 1)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['meta']['seconds']} s")


if __name__ == "__main__":
    main()
