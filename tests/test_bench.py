"""The benchmark harness: structure, FLOP counts and memory ordering — never speed.

Benchmarks are a command and a notebook, not timed unit tests: these tests check that every
case runs in its own subprocess and comes back with the columns, positive times, and peak
memories in the order the algorithms dictate (exact attention stores n × s weights per head,
Linformer n × k, linear attention and the chunked causal form no n-sized square at all).
"""

import contextlib
import csv
import dataclasses
import io
import json
import re
import signal
import subprocess

import pytest
import torch

from course_lib import bench
from course_lib.bench import generation, measure, variants
from course_lib.torch.linear import DEFAULT_CHUNK_SIZE, causal_linear_attention
from tests.conftest import HAS_CUDA, requires_cuda

# n = 1024 keeps each subprocess fast; exact attention's scores alone are h·n²·4 bytes = 4 MiB per head.
SMALL = dict(b=1, h=2, d=32, repeats=1, warmup=1)
N, K, M = 1024, 32, 16
GRID = ["exact", "sdpa", "linformer", "linear", "performer"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """One run of the command (five subprocesses): its exit code, CSV rows, plot path and progress lines."""
    out = tmp_path_factory.mktemp("bench")
    argv = ["--variants", *GRID, "--n", str(N), "--k", str(K), "--m", str(M), "--h", "2", "--d", "32",
            "--repeats", "1", "--warmup", "1", "--csv", str(out / "bench.csv"), "--plot", str(out / "bench.html")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = bench.main(argv)
    with open(out / "bench.csv", newline="") as src:
        header = next(csv.reader(src))
    return code, header, bench.read_csv(out / "bench.csv"), out / "bench.html", err.getvalue()


def test_command_writes_every_column_and_succeeds(grid):
    code, header, rows, _, _ = grid
    assert code == 0, [(r["status"], r["message"]) for r in rows]
    assert header == bench.COLUMNS
    assert [(r["variant"], r["n"], r["k"], r["m"]) for r in rows] == [
        ("exact", N, 0, 0), ("sdpa", N, 0, 0), ("linformer", N, K, 0), ("linear", N, 0, 0), ("performer", N, 0, M)]
    for r in rows:
        assert r["status"] == "ok"
        assert 0 < r["time_min_s"] <= r["time_median_s"]
        assert r["peak_bytes"] > 0 and r["gflops"] > 0 and r["matmul_gflops"] > 0
        assert r["threads"] >= 1 and "torch" in r["hardware"]


def test_progress_line_per_case(grid):
    *_, progress = grid
    lines = [line for line in progress.splitlines() if line.startswith("[")]
    assert [line.split(" … ")[0] for line in lines] == [
        "[1/5] exact n=1024", "[2/5] sdpa n=1024", "[3/5] linformer n=1024 k=32", "[4/5] linear n=1024",
        "[5/5] performer n=1024 m=16"]
    assert all(re.search(r"iB \(\d+\.\d s\)$", line) for line in lines), lines  # "… 14.9 ms, 4.2 MiB (3.1 s)"


def test_exact_attention_holds_the_n_by_n_weights_and_the_others_do_not(grid):
    _, _, rows, _, _ = grid
    peak = {r["variant"]: r["peak_bytes"] for r in rows if r["status"] == "ok"}
    scores_bytes = SMALL["h"] * N * N * 4  # one float32 (h, n, s) tensor: 8 MiB
    assert peak["exact"] >= scores_bytes, peak
    # Linformer's largest tensors are (h, n, k) and (h, n, e): 256 KiB each here; linear attention's
    # are (h, n, d) (256 KiB), Performer's (h, n, m) features (128 KiB): none near an n × n square.
    for variant in set(peak) - {"exact"}:
        assert peak[variant] < scores_bytes / 4, (variant, peak)
    assert bench.savings(rows)[(N, K)][1] > 4


def test_memory_method_is_reported(grid):
    _, _, rows, _, _ = grid
    methods = {r["memory_method"] for r in rows}
    expected = "VmHWM after clear_refs" if bench.clear_refs_available() else "getrusage lifetime peak (approximate)"
    assert methods == {expected}


def test_plot_is_self_contained_html_with_the_figure(grid):
    _, _, rows, html, _ = grid
    text = html.read_text()
    assert "<html>" in text and "Plotly.newPlot" in text
    assert "<script src=\"http" not in text and len(text) > 1_000_000, "plotly.js must be embedded (offline)"
    for name in ("exact", "sdpa", f"linformer k={K}"):  # one line per variant (and per k), in both panels
        assert text.count(f'"name":"{name}"') == 2, name
    assert "peak memory (MiB)" in text


def test_peak_memory_sees_a_known_allocation():
    # Why a tolerance at all: Linux counts resident pages in per-CPU (before 6.2: per-thread) caches
    # that reach the shared counter in batches, and VmHWM is read from the shared counter, so a peak
    # can read low or high by bench.rss_resolution() (one batch per CPU or thread: 256 KiB on 2 CPUs,
    # 4 MiB on 16; a 16-core VM read 65,597,440 bytes for 64 MiB, 1.4 MiB short).  The object is
    # made at least 16 × that resolution, so the check keeps its meaning on any machine, and it is
    # filled, so every page is written and resident (untouched pages would never count).
    slack = bench.rss_resolution()
    size = max(64 * 2**20, 16 * slack)
    peak, method = bench.peak_memory(lambda: torch.full((size // 4,), 1.0), "cpu")
    if bench.clear_refs_available():
        # Plus up to 1 MiB of memory freed elsewhere during the call, 8 MiB of Python and allocator overhead.
        assert size - slack - 2**20 <= peak < size + slack + 8 * 2**20, (peak, size, slack, method)
    else:
        assert peak >= 0


def test_rss_resolution_counts_batches_per_cpu():
    pages = bench.rss_resolution() // 4096
    assert pages >= 64 * 2  # at least one 64-page batch on each of two CPUs (this course's smallest machine)


def test_forward_backward_case_runs_in_process():
    row = bench.run_case(bench.Case("linformer", 64, k=16, mode="forward+backward", **SMALL))
    assert row["status"] == "ok" and row["time_median_s"] > 0 and row["peak_bytes"] >= 0
    assert row["flops"] == 3 * bench.linformer_flops(bench.Case("linformer", 64, k=16, **SMALL))


@pytest.mark.parametrize("variant", list(bench.VARIANTS))
def test_every_variant_runs_forward_and_backward(variant):
    case = bench.Case(variant, 64, k=16 if "k" in bench.VARIANTS[variant].sizes else 0,
                      m=8 if "m" in bench.VARIANTS[variant].sizes else 0, mode="forward+backward", **SMALL)
    if variant.startswith("fla_") and not _peer_installed():
        # The peer lives outside the course (tools/peer_env.py); without it the row must say how to get it.
        row = bench.run_isolated(case)
        assert row["status"] == "error" and "tools/peer_env.py" in row["message"], row
        return
    if bench.VARIANTS[variant].forward_only:  # a check has no backward: refused, saying which mode to use
        with pytest.raises(ValueError, match="mode forward"):
            bench.run_case(case)
        case = dataclasses.replace(case, mode="forward")
    row = bench.run_case(case)
    assert row["status"] == "ok" and row["time_median_s"] > 0 and row["flops"] > 0


def _peer_installed():
    try:
        variants.load_peer("fla_delta_naive")
        variants.load_peer("fla_gated_delta_naive")
        variants.load_peer("fla_kda_naive")
        variants.load_peer("fla_delta_product_naive")
    except FileNotFoundError:
        return False
    return True


def test_the_recurrences_agree_with_their_token_loops_and_the_peer():
    out = _outputs(["delta", "delta_loop", "gated_delta", "gated_delta_loop", "gla", "gla_loop"], n=70, chunk=16)
    for name in ("delta", "gated_delta", "gla"):
        torch.testing.assert_close(out[name], out[f"{name}_loop"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out["delta"], out["gated_delta"], atol=1e-3)  # the decay is really applied
    if _peer_installed():  # the peer scales q by 1/√d inside; the course leaves scaling to the caller
        peer = _outputs(["fla_delta", "fla_gated_delta"], n=64)
        ours = _outputs(["delta", "gated_delta"], n=64)
        for name in ("delta", "gated_delta"):
            torch.testing.assert_close(peer[f"fla_{name}"] * 4.0, ours[name], atol=1e-4, rtol=1e-4)


def _outputs(variants, n=48, **sizes):
    """Each variant's output on the same inputs (seeded inside the harness)."""
    out = {}
    for name in variants:
        t = {x: torch.randn(1, 2, n, 16, generator=torch.Generator().manual_seed(i)) for i, x in enumerate("qkv")}
        t["gen"] = torch.Generator().manual_seed(3)
        fn, _ = bench.VARIANTS[name].build(bench.Case(name, n, d=16, h=2, **sizes), t)
        out[name] = fn()
    return out


def test_causal_variants_are_causal_and_agree_with_their_twins():
    out = _outputs(["exact", "sdpa", "causal_exact", "causal_sdpa", "causal_linear", "causal_linear_prefix"], chunk=8)
    torch.testing.assert_close(out["exact"], out["sdpa"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["causal_exact"], out["causal_sdpa"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["causal_linear"], out["causal_linear_prefix"], atol=1e-5, rtol=1e-5)
    favor = _outputs(["causal_performer", "causal_performer_prefix"], m=16)
    torch.testing.assert_close(favor["causal_performer"], favor["causal_performer_prefix"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out["exact"], out["causal_exact"], atol=1e-3)  # the mask is really applied
    # Causal: the last query sees every key, so its row is the non-causal row.
    torch.testing.assert_close(out["exact"][..., -1, :], out["causal_exact"][..., -1, :], atol=1e-5, rtol=1e-5)


def test_default_causal_linear_backward_stays_below_the_prefix_sum_states():
    # Prefix sums store n states of f × e for the backward (h·n·d·d·4 bytes = 8 MiB here, and
    # their gradients as many); the default chunked form keeps one state per chunk (128 KiB for c = 64).
    case = dict(n=N, mode="forward+backward", **SMALL)
    states = SMALL["h"] * N * SMALL["d"] ** 2 * 4
    prefix = bench.run_case(bench.Case("causal_linear_prefix", **case))["peak_bytes"]
    chunked = bench.run_case(bench.Case("causal_linear", **case))["peak_bytes"]  # chunk 0: the library's default
    if bench.clear_refs_available():
        assert prefix >= states > chunked and prefix > 4 * chunked, (prefix, chunked)


def test_flop_counts_match_hand_computed_values():
    # Exact: q kᵀ and P v, each 2·b·h·n·s·d with s = n: 4 · 8 · 4096² · 64.
    assert bench.exact_flops(bench.Case("exact", 4096)) == 34_359_738_368
    # Linformer: E k, F v (2·h·k·s·d each), q k̃ᵀ, P̃ ṽ (2·h·n·k·d each): 8 · 8 · 128 · 4096 · 64.
    assert bench.linformer_flops(bench.Case("linformer", 4096, k=128)) == 2_147_483_648
    assert bench.total_flops(bench.Case("linformer", 4096, k=128, mode="forward+backward")) == 3 * 2_147_483_648
    assert bench.exact_flops(bench.Case("sdpa", 512, b=2, h=1, d=16)) == 4 * 2 * 512 * 512 * 16
    assert bench.matmul_size(2_147_483_648) == 1024  # 2 · 1024³ FLOPs
    # Linear, f = d = e = 64: φ(k)ᵀv and φ(q)S (2·n·d² each) and the normaliser φ(q)·z (2·n·d), per head.
    assert bench.linear_flops(bench.Case("linear", 4096)) == 8 * (4 * 4096 * 64**2 + 2 * 4096 * 64)
    # Performer, m = 256: q ωᵀ, k ωᵀ (2·n·d·m each), then linear attention with f = m.
    assert bench.performer_flops(bench.Case("performer", 4096, m=256)) == 8 * (
        4 * 4096 * 64 * 256 + 4 * 4096 * 256 * 64 + 2 * 4096 * 256)
    # Chunked: the same, plus per chunk of c = 64 the c × c blocks φ(q)φ(k)ᵀ and their product with v.
    chunked = bench.Case("causal_linear", 4096, chunk=64)
    assert bench.chunked_flops(chunked) == bench.linear_flops(chunked) + 8 * 2 * 4096 * 64 * 128


def test_grid_measures_k_free_variants_once_per_n_and_skips_k_from_n_up():
    skipped = []
    cases = bench.make_cases(["exact", "linformer"], [256, 1024], ks=[128, 256, 512], skipped=skipped)
    assert [(c.variant, c.n, c.k) for c in cases] == [
        ("exact", 256, 0), ("linformer", 256, 128), ("exact", 1024, 0), ("linformer", 1024, 128),
        ("linformer", 1024, 256), ("linformer", 1024, 512)]
    assert [reason for _, reason in skipped] == [
        "k = n = 256: Linformer at k = n projects nothing away",
        "k = 512 > n = 256: Linformer projects n positions down to k ≤ n"]


def test_impossible_case_is_one_clear_line(capsys):
    row = bench.run_isolated(bench.Case("linformer", 256, k=512))  # refused before any subprocess starts
    assert (row["status"], row["message"]) == ("error", "k = 512 > n = 256: Linformer projects n positions down "
                                                        "to k ≤ n")
    with pytest.raises(ValueError, match="k = 512 > n = 256"):
        bench.run_case(bench.Case("linformer", 256, k=512))
    assert bench.main(["--variants", "linformer", "--n", "256", "--k", "512"]) == 2
    assert "nothing to measure: k = 512 > n = 256: Linformer projects" in capsys.readouterr().err


def test_out_of_memory_is_status_oom_in_one_line(capsys, monkeypatch):
    # n = 2²³ with h = d = 1: the inputs are 32 MiB each, but the (n, s) scores would be 2⁴⁸ bytes,
    # more than any 64-bit Linux process can map (128 TiB), so the allocation fails at once on any
    # machine, whatever its overcommit policy, and nothing is really allocated.
    measure.worker(json.dumps({"variant": "exact", "n": 2**23, "h": 1, "d": 1, "repeats": 1, "warmup": 1}))
    row = json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])
    assert (row["status"], row["message"]) == ("oom", f"out of memory at n = {2**23}"), row
    # A subprocess the kernel's OOM killer ends (SIGKILL) prints nothing: the driver still says why.
    killed = subprocess.CompletedProcess([], returncode=-signal.SIGKILL, stdout="", stderr="")
    monkeypatch.setattr(measure.subprocess, "run", lambda *args, **kwargs: killed)
    row = bench.run_isolated(bench.Case("exact", 65536))
    assert (row["status"], row["message"]) == ("oom", "out of memory at n = 65536 (the process was killed)")
    assert bench.is_out_of_memory(MemoryError()) and not bench.is_out_of_memory(ValueError("out of range"))


def test_generation_times_every_method_and_they_compute_the_same_attention():
    rows = generation.run(64, h=2, d=16, repeats=2, warmup=0, count=4)
    grid = generation.positions(64, 4)
    assert grid == [1, 4, 16, 64]
    assert [(r["method"], r["position"]) for r in rows] == [(m, p) for p in grid for m in generation.METHODS]
    state = {(r["method"], r["position"]): r["state_bytes"] for r in rows}
    assert state["linear_step", 1] == state["linear_step", 64] == 2 * 16 * 17 * 4  # S and Z: constant
    assert state["softmax_cache", 64] == 64 * state["softmax_cache", 1]  # the cache grows with t
    for r in rows:
        assert 0 < r["time_min_s"] <= r["time_median_s"] and r["cpu_min_s"] >= 0 and r["threads"] >= 1
        assert r["ratio_to_linear_step"] == r["time_min_s"] / state_time(rows, "linear_step", r["position"])
    tokens = generation.Generation(64, h=2, d=16)
    tokens.advance(40)
    saved = tokens.snapshot()
    outputs = {}
    with torch.inference_mode():
        for method in (*generation.METHODS, "linear_step"):  # linear_step twice: restore puts the state back
            out = tokens.step(method)()
            outputs.setdefault(method, []).append((out[0] if isinstance(out, tuple) else out).clone())
            tokens.restore(saved)
    outputs = {method: values[0] for method, values in outputs.items()} | {"again": outputs["linear_step"][-1]}
    torch.testing.assert_close(outputs["softmax_cache"], outputs["softmax_no_cache"][..., -1, :], atol=1e-5, rtol=1e-5)
    # the recurrent steps from the state of 40 tokens = row 41 of the parallel causal form
    parallel = causal_linear_attention(tokens.q[..., :41, :], tokens.k[..., :41, :], tokens.v[..., :41, :])
    torch.testing.assert_close(outputs["linear_step"], parallel[..., -1, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs["linear_step_functional"], parallel[..., -1, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs["again"], outputs["linear_step"], atol=0, rtol=0)


def state_time(rows, method, position):
    return next(r["time_min_s"] for r in rows if r["method"] == method and r["position"] == position)


def test_generation_ratios_crossover_and_totals():
    def rows_of(linear, cache):
        return ([{"method": "linear_step", "position": p, "time_min_s": t, "cpu_min_s": t} for p, t in linear.items()]
                + [{"method": "softmax_cache", "position": p, "time_min_s": t, "cpu_min_s": t}
                   for p, t in cache.items()])
    rows = rows_of({1: 2.0, 16: 2.0, 256: 2.0, 4096: 2.0}, {1: 1.0, 16: 3.0, 256: 1.5, 4096: 60.0})
    assert generation.ratios(rows) == {1: 0.5, 16: 1.5, 256: 0.75, 4096: 30.0}
    assert generation.crossover(rows) == (256, 4096)  # cheaper at 16, but not yet for good
    assert generation.crossover(rows_of({1: 1.0, 8: 1.0}, {1: 2.0, 8: 3.0})) == (0, 1)  # from the first token
    assert generation.crossover(rows_of({1: 1.0, 8: 1.0}, {1: 2.0, 8: 0.5})) is None
    totals = rows_of({1: 1.0, 3: 1.0}, {1: 1.0, 3: 3.0})
    assert generation.total_time(totals, "linear_step") == 3.0  # 1 + (3 - 1)·1
    assert generation.total_time(totals, "softmax_cache") == 5.0  # 1 + (3 - 1)·(1 + 3)/2


def test_generation_command_writes_its_csv_and_report(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = bench.main(["--generation", "--n", "32", "--h", "1", "--d", "8", "--positions", "3", "--repeats",
                           "2", "--warmup", "0", "--csv", str(tmp_path / "gen.csv")])
    assert code == 0
    rows = bench.read_csv(tmp_path / "gen.csv")
    assert list(rows[0]) == generation.COLUMNS and len(rows) == 3 * len(generation.METHODS)
    assert "Plotly.newPlot" in (tmp_path / "gen.html").read_text()
    text = out.getvalue()
    assert "softmax_cache / linear_step" in text and "linear_step is cheaper than softmax_cache" in text


def test_shipped_generation_csv_reads_and_meets_its_claims():
    from course_lib import data_path

    rows = bench.read_csv(data_path("bench_generation_cpu.csv"))
    assert list(rows[0]) == generation.COLUMNS
    assert {r["method"] for r in rows} == set(generation.METHODS) and {r["threads"] for r in rows} == {1}
    assert {1024, 4096, 16384} <= {r["position"] for r in rows}
    assert any(line.startswith("softmax_cache / linear_step") for line in generation.report(rows))
    # The claims notebook 07 quotes from this file: at token 4,096 the in-place step is
    # at least 30× cheaper than the fair cached softmax step, and flat in position (4,096 against 16).
    assert generation.ratios(rows)[4096] >= 30
    linear = {r["position"]: r["time_min_s"] for r in rows if r["method"] == "linear_step"}
    assert linear[4096] / linear[16] <= 1.3 and generation.crossover(rows) is not None


def test_worker_reports_a_failure_in_one_line(capsys):
    measure.worker(json.dumps({"variant": "linformer", "n": 8, "k": 16}))
    row = json.loads(capsys.readouterr().out.split("RESULT ", 1)[1])
    assert (row["status"], row["message"]) == ("error", "ValueError: k = 16 > n = 8: Linformer projects n "
                                                        "positions down to k ≤ n")


def test_help_documents_the_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0
    for option in ("--variants", "--n", "--k", "--m", "--chunk", "--dtype", "--device", "--mode", "--repeats", "--csv",
                   "--plot", "--generation", "out of memory at n =", "k = 512 > n = 256", *bench.VARIANTS):
        assert option in text, option


def test_formatting_uses_the_units_the_notebooks_mask():
    assert bench.format_time(0.0123) == "12.3 ms" and bench.format_time(4.56) == "4.56 s"
    assert bench.format_bytes(3 * 2**29) == "1.5 GiB"


def test_shipped_linformer_grid_still_reads():
    from course_lib import data_path

    grid = bench.read_csv(data_path("bench_linformer_cpu.csv"))
    assert {r["variant"] for r in grid} >= {"exact", "sdpa", "linformer"}
    assert bench.savings(grid)[4096, 128][0] > 1  # the grid notebook 04 reads
    assert any(line.strip().startswith("linformer n=4096 k=128") for line in bench.report(grid))


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the no-GPU refusal is not reachable")
def test_cuda_without_a_gpu_is_refused_clearly(capsys):
    assert bench.main(["--device", "cuda", "--n", "64", "--k", "16"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@requires_cuda
def test_cuda_case_measures_allocator_peak():
    row = bench.run_isolated(bench.Case("exact", 1024, device="cuda", **SMALL))
    assert row["status"] == "ok", row["message"]
    assert row["memory_method"] == "cuda max_memory_allocated"
    assert row["peak_bytes"] >= SMALL["h"] * 1024 * 1024 * 4 and "GPU" in row["hardware"]


@requires_cuda
def test_cuda_generation_and_new_variants_run():
    for variant in ("causal_linear", "performer"):
        row = bench.run_isolated(bench.Case(variant, 1024, m=64, device="cuda", **SMALL))
        assert row["status"] == "ok", row["message"]
    rows = generation.run(64, h=2, d=16, device="cuda", repeats=1, warmup=1, count=3)
    assert all(r["time_median_s"] > 0 for r in rows)


# --- presets: every stored grid is one command ------------------------------------------------

def test_grid_preset_holds_every_variant_the_lessons_compare_in_one_setting():
    from course_lib.bench import presets

    cases = presets.cases(presets.GRID)
    assert {(c.b, c.h, c.d, c.dtype, c.device, c.threads) for c in cases} == {(1, 8, 64, "float32", "cpu", 0)}
    assert {c.variant for c in cases} <= set(bench.VARIANTS)
    largest = {}
    for c in cases:
        largest[c.variant, c.mode] = max(largest.get((c.variant, c.mode), 0), c.n)
    for variant in ("sdpa", "linformer", "linear", "performer", "causal_sdpa", "causal_linear",
                    "causal_performer"):  # lessons 06, 08, 09: every n, both modes (the causal ones chunked)
        assert largest[variant, "forward"] == largest[variant, "forward+backward"] == 16384, variant
    assert largest["exact", "forward"] == 8192 and largest["causal_linear_prefix", "forward"] == 16384
    assert {c.chunk for c in cases if c.variant in ("causal_linear", "causal_performer")} == {DEFAULT_CHUNK_SIZE}
    assert {c.k for c in cases if c.variant == "linformer" and c.n != 512} == {128}
    assert {c.m for c in cases if "performer" in c.variant and c.n != 512} == {256}
    # At n = 512, the cost axis of lesson 09's error against cost: k and m swept (forward).
    assert {c.k for c in cases if c.variant == "linformer" and c.n == 512 and c.mode == "forward"} == {
        32, 64, 128, 256}
    assert {c.m for c in cases if c.variant == "performer" and c.n == 512 and c.mode == "forward"} == {
        32, 64, 128, 256, 512}
    assert {c.n for c in cases} == {32 * 2**i for i in range(10)}  # n = 32 … 128: where exact attention wins
    stored = {presets.key(row) for row in bench.read_csv(presets.data_file(presets.GRID))}
    assert {presets.key(c) for c in cases} <= stored  # the shipped grid is the preset's, every case measured
    # Forward first, n ascending: a run cut short holds every variant at the small n.
    order = [(bench.MODES.index(c.mode), c.n) for c in cases]
    assert order == sorted(order)
    assert len({presets.key(c) for c in cases}) == len(cases)


def test_linformer_preset_is_the_command_of_lesson_04s_stored_grid():
    from course_lib import data_path
    from course_lib.bench import presets

    stored = bench.read_csv(data_path("bench_linformer_cpu.csv"))
    assert sorted(presets.key(c) for c in presets.cases(presets.LINFORMER)) == sorted(map(presets.key, stored))
    assert {(r["repeats"], r["warmup"]) for r in stored} == {(presets.LINFORMER.repeats, presets.LINFORMER.warmup)}


@pytest.fixture
def tiny_preset(monkeypatch):
    from course_lib.bench import presets

    tiny = presets.Preset(about="two variants, two n", csv="unused.csv", budget=0.5, min_repeats=2, repeats=4,
                          warmup=1, setting=dict(b=1, h=2, d=16, dtype="float32", device="cpu", threads=1),
                          parts=(presets.Part(("linear", "sdpa"), (64, 128)),
                                 presets.Part(("linear",), (64,), "forward+backward")))
    monkeypatch.setitem(presets.PRESETS, "tiny", tiny)
    return tiny


def test_preset_command_writes_its_grid_and_resumes(tiny_preset, tmp_path):
    csv_path = tmp_path / "grid.csv"
    argv = ["--preset", "tiny", "--csv", str(csv_path), "--no-plot", "--note", "provisional: test"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert bench.main(argv) == 0
    rows = bench.read_csv(csv_path)
    assert [(r["variant"], r["mode"], r["n"]) for r in rows] == [
        ("linear", "forward", 64), ("sdpa", "forward", 64), ("linear", "forward", 128), ("sdpa", "forward", 128),
        ("linear", "forward+backward", 64)]
    for r in rows:
        assert r["status"] == "ok" and r["threads"] == 1 and r["note"] == "provisional: test"
        assert 2 <= r["repeats"] <= 4 and 0 < r["time_min_s"] <= r["time_median_s"] and r["case_s"] > 0
    assert "5 cases in" in err.getvalue()
    # --resume keeps every measured case: nothing runs again, the file is the same.
    before = csv_path.read_text()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert bench.main(argv + ["--resume"]) == 0
    assert csv_path.read_text() == before and "[1/5]" not in err.getvalue()


def test_preset_refuses_the_options_it_fixes(tiny_preset, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--preset", "tiny", "--n", "256", "--h", "4"])
    assert exit_.value.code == 2
    assert "--preset tiny fixes the grid; leave out --n --h" in capsys.readouterr().err


def test_budget_gives_slow_cases_fewer_timed_calls_never_fewer_than_the_minimum():
    assert measure.repeats_within(0, 5.0, 20, 5) == 20  # no budget: always the preset's count
    assert measure.repeats_within(10, 0.1, 20, 5) == 20
    assert measure.repeats_within(10, 1.0, 20, 5) == 10
    assert measure.repeats_within(10, 6.0, 20, 5) == 5
    assert measure.repeats_within(10, 6.0, 3, 5) == 3  # never more than asked for
    calls = iter([2.0, 1.5, 1.5])  # a slow call: two warm-up calls, the second predicts the timed ones

    def fake_timed(step, device, repeats):
        return [next(calls)]
    original = measure.timed
    measure.timed = fake_timed
    try:
        assert measure.warm_up(None, "cpu", 3, slow=1.0) == (2, 1.5)
    finally:
        measure.timed = original
    row = bench.run_case(bench.Case("linear", 64, **{**SMALL, "repeats": 7}), budget=1e-9, min_repeats=2)
    assert row["repeats"] == 2 and row["status"] == "ok"


def test_help_lists_the_presets_and_their_files(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = capsys.readouterr().out
    for expected in ("--preset", "--budget", "--resume", "--note", "grid ", "course_lib/data/bench_grid_cpu.csv",
                     "linformer ", "course_lib/data/bench_linformer_cpu.csv",
                     "python -m course_lib.bench --preset grid"):
        assert expected in text, expected
