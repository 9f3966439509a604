"""Named grids: every stored timing grid is one ``python -m course_lib.bench --preset NAME`` command.

A ``Preset`` is a list of ``Part``s (variants × lengths in one mode) under one setting (b, h, d,
dtype, threads) and one method (warm-up, timed calls, time budget), and the CSV it writes.  The
stored CSVs in ``course_lib/data/`` are read back by ``course_lib.bench.stored``.

``grid``: the one grid lessons 06, 08 and 09 share.  Every variant the lessons compare, forward
(inference) and forward+backward (training), b = 1, h = 8, d = e = 64, float32, CPU with torch's
default threads, n = 32 … 16,384 by powers of two (n = 32 … 128, the short lengths where exact
attention still wins, were added later and measured the same way by ``--preset grid --resume``, which
measures only the cases the CSV lacks).  The causal linear forms are measured as the library calls them
by default (``causal_linear``, ``causal_performer``: chunked, memory linear in n) and in the prefix-sum
teaching form (``causal_linear_prefix``, ``causal_performer_prefix``: ``chunk_size=None``).  Where a form
stops short, memory or time stops it on this course's 2-core, 23 GiB machine:

- ``exact``/``causal_exact`` hold h × n × n scores and weights: a peak of 1.5 GiB at n = 4,096
  forward, so 6 GiB at 8,192 and 24 GiB at 16,384; with the backward 3.5 GiB at 4,096, 14 GiB
  at 8,192;
- the prefix-sum forms store all n states of f × e per head: 128 KiB per token for elu+1
  (f = 64), 512 KiB for FAVOR+ (m = 256: 1 GiB of states at n = 2,048, and calls of seconds);
  autograd keeps them and their gradients.

Linformer runs at k = 128 and FAVOR+ at m = 256 throughout; at n = 512, MiniLM's length, k and m
are swept too (k = 32 … 256, m = 32 … 512): the cost axis of lesson 09's error-against-cost figure.

Method (the Linformer grid's): each case in its own process, 3 warm-up calls, 20 timed calls,
the minimum and the median kept, peak memory from one more call of the same process.  Calls
that take long get fewer timed calls (``budget``): at most ``budget`` = 10 seconds of timed
calls (so fewer than 20 above half a second), never fewer than ``min_repeats`` = 5; and two
warm-up calls when the second takes over a second.

``linformer``: lesson 04's grid (``course_lib/data/bench_linformer_cpu.csv``), as it was measured.
"""

import dataclasses
import pathlib
import textwrap

from course_lib.bench.variants import MODES, Case, make_cases


@dataclasses.dataclass(frozen=True)
class Part:
    """Variants × lengths in one mode; ``k`` and ``m`` for the variants that use them."""

    variants: tuple
    ns: tuple
    mode: str = "forward"
    ks: tuple = (128,)
    ms: tuple = (256,)
    chunks: tuple = (0,)  # chunk sizes of the variants that have one (0: the library's default)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A stored grid: its parts, the setting shared by every case, the method and its CSV in ``course_lib/data/``."""

    about: str
    parts: tuple
    csv: str
    setting: dict = dataclasses.field(default_factory=lambda: dict(b=1, h=8, d=64, dtype="float32", device="cpu",
                                                                   threads=0))
    repeats: int = 20
    warmup: int = 3
    budget: float = 0.0  # seconds of timed calls per case; 0: always ``repeats``
    min_repeats: int = 5


def _powers(low, high):
    return tuple(2**i for i in range(low.bit_length() - 1, high.bit_length()))


NS = _powers(32, 16384)  # 32, 64, …, 16,384
UP_TO_8K, UP_TO_4K, UP_TO_2K, UP_TO_1K = NS[:-1], NS[:-2], NS[:-3], NS[:-4]

# Fast enough and small enough at every n; the causal linear forms as the library calls them by default (chunked).
LINEAR_TIME = ("sdpa", "linformer", "linear", "performer", "causal_sdpa", "causal_linear", "causal_performer")

GRID = Preset(
    about="lessons 06, 08, 09: every variant, forward and forward+backward, n = 32 … 16,384, h = 8",
    csv="bench_grid_cpu.csv",
    parts=(
        Part(("exact", "causal_exact"), UP_TO_8K),
        Part(LINEAR_TIME + ("causal_linear_prefix",), NS),
        Part(("causal_performer_prefix",), UP_TO_2K),
        Part(("exact", "causal_exact"), UP_TO_4K, "forward+backward"),
        Part(LINEAR_TIME, NS, "forward+backward"),
        Part(("causal_linear_prefix",), UP_TO_8K, "forward+backward"),
        Part(("causal_performer_prefix",), UP_TO_1K, "forward+backward"),
        # Error against cost (lesson 09): Linformer's k and FAVOR+'s m swept at MiniLM's length.
        Part(("linformer", "performer"), (512,), ks=(32, 64, 128, 256), ms=(32, 64, 128, 256, 512)),
    ),
    budget=10.0,
)

LINFORMER = Preset(
    about="lesson 04: exact, sdpa, linformer and its step-by-step twin, k = 128, 256, 512, n = 512 … 8,192",
    csv="bench_linformer_cpu.csv",
    parts=(Part(("exact", "sdpa", "linformer", "linformer_reference"), _powers(512, 8192), ks=(128, 256, 512)),),
)

# The recurrences of lessons 11-12 beside their peer, flash-linear-attention 0.6.0's pure-PyTorch references
# (``python tools/peer_env.py`` first; without it their rows are errors that say so).  The chunk sweep at
# n = 4,096 is what the recurrences' DEFAULT_CHUNK_SIZE (``RECURRENT_CHUNK_SIZE``, course_lib/_shared.py)
# was chosen from.  One thread per case: a two-thread call on a 2-core machine stalls whenever anything
# else runs (seen: 200x on single calls), one thread keeps the other core for the rest of the machine;
# the peer is measured the same way.
RECURRENT = Preset(
    about="lessons 11-13: the delta rule, gated delta rule, Kimi Delta Attention, DeltaProduct (n_h = 2) and gated "
          "linear attention per head and per channel, chunked, looped and the peer's, forward+backward, "
          "n = 256 … 16,384, h = 4; chunk sizes 16 … 256 at n = 4,096",
    csv="bench_recurrent_cpu.csv",
    parts=(
        Part(("delta", "gated_delta", "gla", "gla_channel", "kda", "delta_product", "fla_delta", "fla_gated_delta"),
             _powers(256, 16384), "forward+backward"),
        Part(("fla_kda",), _powers(256, 4096), "forward+backward"),  # the peer's KDA: 20 s a call at 4,096
        Part(("delta_loop", "gated_delta_loop", "gla_loop", "gla_channel_loop", "kda_loop", "delta_product_loop",
              "fla_delta_product"),
             _powers(256, 2048), "forward+backward"),
        Part(("delta", "gated_delta", "gla"), (4096,), "forward+backward", chunks=(16, 32, 64, 128, 256)),
        Part(("delta", "gated_delta", "fla_delta", "fla_gated_delta", "finite_check"), _powers(256, 16384)),
    ),
    setting=dict(b=1, h=4, d=64, dtype="float32", device="cpu", threads=1),
    budget=10.0,
)

PRESETS = {"grid": GRID, "linformer": LINFORMER, "recurrent": RECURRENT}


def data_file(preset):
    """Where ``preset``'s CSV lives: ``course_lib/data/``, package data that the lessons read."""
    return pathlib.Path(__file__).resolve().parents[1] / "data" / preset.csv


def cases(preset, *, repeats=None, warmup=None, threads=None, skipped=None):
    """Every case of ``preset`` in the order it is measured: forward first, then n ascending.

    ``repeats``, ``warmup`` and ``threads`` override the preset's (a quicker, provisional run).
    """
    common = dict(preset.setting, repeats=repeats or preset.repeats,
                  warmup=preset.warmup if warmup is None else warmup)
    if threads is not None:
        common["threads"] = threads
    every = {key(case): case for part in preset.parts for chunk in part.chunks  # a case in two parts: once
             for case in make_cases(part.variants, part.ns, part.ks, part.ms, skipped=skipped, mode=part.mode,
                                    **common, chunk=chunk)}.values()
    # Forward before forward+backward, n ascending: a run cut short still holds every variant at small n.
    return sorted(every, key=lambda case: (MODES.index(case.mode), case.n))


def key(row):
    """What identifies a case in a CSV row or a ``Case``: a row with the same key measured the same thing."""
    row = dataclasses.asdict(row) if isinstance(row, Case) else row
    return tuple(row[name] for name in ("variant", "mode", "device", "dtype", "b", "h", "n", "d", "k", "m", "chunk"))


def describe():
    """Lines for ``--help``: each preset, what it holds and where it writes."""
    lines = []
    for name, preset in PRESETS.items():
        lines.append(f"  {name:<10} {preset.about}")
        lines.append(f"  {'':<10} writes course_lib/data/{preset.csv}")
        for part in preset.parts:
            ns = f"n = {part.ns[0]} … {part.ns[-1]}" if len(part.ns) > 1 else f"n = {part.ns[0]}"
            sweep = [f"{size} = {' '.join(map(str, values))}" for size, values in (("k", part.ks), ("m", part.ms))
                     if len(values) > 1]
            names = textwrap.wrap(" ".join(part.variants) + (f" ({'; '.join(sweep)})" if sweep else ""), 60)
            lines.append(f"  {'':<12}{part.mode:<17} {ns:<17} {names[0]}")
            lines += [f"  {'':<47}{more}" for more in names[1:]]
    return "\n".join(lines)
