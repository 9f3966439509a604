"""The benchmark harness: structure, FLOP counts and memory ordering — never speed.

Benchmarks are a command and a notebook, not timed unit tests: these tests check that every
case runs in its own subprocess and comes back with the columns, positive times, and peak
memories in the order the algorithms dictate (exact attention stores n × s weights per head,
Linformer n × k).
"""

import csv

import pytest
import torch

from course_lib import bench
from tests.conftest import HAS_CUDA, requires_cuda

# n = 1024 keeps each subprocess fast; exact attention's scores alone are h·n²·4 bytes = 4 MiB per head.
SMALL = dict(b=1, h=2, d=32, repeats=1, warmup=1)
N, K = 1024, 32


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """One run of the command (three subprocesses): its exit code, CSV rows, plot path and output."""
    out = tmp_path_factory.mktemp("bench")
    argv = ["--variants", "exact", "sdpa", "linformer", "--n", str(N), "--k", str(K), "--h", "2", "--d", "32",
            "--repeats", "1", "--warmup", "1", "--csv", str(out / "bench.csv"), "--plot", str(out / "bench.html")]
    code = bench.main(argv)
    with open(out / "bench.csv", newline="") as src:
        header = next(csv.reader(src))
    return code, header, bench.read_csv(out / "bench.csv"), out / "bench.html"


def test_command_writes_every_column_and_succeeds(grid):
    code, header, rows, _ = grid
    assert code == 0, [r["status"] for r in rows]
    assert header == bench.COLUMNS
    assert [(r["variant"], r["n"], r["k"]) for r in rows] == [("exact", N, 0), ("sdpa", N, 0), ("linformer", N, K)]
    for r in rows:
        assert r["status"] == "ok"
        assert 0 < r["time_min_s"] <= r["time_median_s"]
        assert r["peak_bytes"] > 0 and r["gflops"] > 0 and r["matmul_gflops"] > 0
        assert r["threads"] >= 1 and "torch" in r["hardware"]


def test_exact_attention_holds_the_n_by_n_weights_and_linformer_does_not(grid):
    _, _, rows, _ = grid
    peak = {r["variant"]: r["peak_bytes"] for r in rows}
    scores_bytes = SMALL["h"] * N * N * 4  # one float32 (h, n, s) tensor: 8 MiB
    assert peak["exact"] >= scores_bytes, peak
    # Linformer's largest tensors are (h, n, k) and (h, n, e): 256 KiB each here.
    assert peak["linformer"] < scores_bytes / 4, peak
    assert bench.savings(rows)[(N, K)][1] > 4


def test_memory_method_is_reported(grid):
    _, _, rows, _ = grid
    methods = {r["memory_method"] for r in rows}
    expected = "VmHWM after clear_refs" if bench.clear_refs_available() else "getrusage lifetime peak (approximate)"
    assert methods == {expected}


def test_plot_is_self_contained_html(grid):
    _, _, _, html = grid
    text = html.read_text()
    assert "<html>" in text and "plotly" in text.lower()
    assert "<script src=\"http" not in text and len(text) > 1_000_000, "plotly.js must be embedded (offline)"


def test_peak_memory_sees_a_known_allocation():
    size = 64 * 2**20
    peak, method = bench.peak_memory(lambda: torch.ones(size // 4), "cpu")
    if bench.clear_refs_available():
        # RSS resolution: memory freed elsewhere during the call can offset up to ~1 MiB of it.
        assert size - 2**20 <= peak < size + 8 * 2**20, (peak, method)
    else:
        assert peak >= 0


def test_forward_backward_case_runs_in_process():
    row = bench.run_case(bench.Case("linformer", 64, k=16, mode="forward+backward", **SMALL))
    assert row["status"] == "ok" and row["time_median_s"] > 0 and row["peak_bytes"] >= 0
    assert row["flops"] == 3 * bench.linformer_flops(bench.Case("linformer", 64, k=16, **SMALL))


def test_flop_counts_match_hand_computed_values():
    # Exact: q kᵀ and P v, each 2·b·h·n·s·d with s = n: 4 · 8 · 4096² · 64.
    assert bench.exact_flops(bench.Case("exact", 4096)) == 34_359_738_368
    # Linformer: E k, F v (2·h·k·s·d each), q k̃ᵀ, P̃ ṽ (2·h·n·k·d each): 8 · 8 · 128 · 4096 · 64.
    assert bench.linformer_flops(bench.Case("linformer", 4096, k=128)) == 2_147_483_648
    assert bench.total_flops(bench.Case("linformer", 4096, k=128, mode="forward+backward")) == 3 * 2_147_483_648
    assert bench.exact_flops(bench.Case("sdpa", 512, b=2, h=1, d=16)) == 4 * 2 * 512 * 512 * 16
    assert bench.matmul_size(2_147_483_648) == 1024  # 2 · 1024³ FLOPs


def test_grid_measures_k_free_variants_once_per_n_and_skips_k_from_n_up():
    cases = bench.make_cases(["exact", "linformer"], [256, 1024], ks=[128, 256, 512])
    assert [(c.variant, c.n, c.k) for c in cases] == [
        ("exact", 256, 0), ("linformer", 256, 128), ("exact", 1024, 0), ("linformer", 1024, 128),
        ("linformer", 1024, 256), ("linformer", 1024, 512)]


def test_help_documents_the_command(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--help"])
    text = capsys.readouterr().out
    assert exit_.value.code == 0
    for option in ("--variants", "--n", "--k", "--dtype", "--device", "--mode", "--repeats", "--csv", "--plot"):
        assert option in text


def test_formatting_uses_the_units_the_notebooks_mask():
    assert bench.format_time(0.0123) == "12.3 ms" and bench.format_time(4.56) == "4.56 s"
    assert bench.format_bytes(3 * 2**29) == "1.5 GiB"


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA device is present: the no-GPU refusal is not reachable")
def test_cuda_without_a_gpu_is_refused_clearly(capsys):
    assert bench.main(["--device", "cuda", "--n", "64", "--k", "16"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@requires_cuda
def test_cuda_case_measures_allocator_peak():
    row = bench.run_isolated(bench.Case("exact", 1024, device="cuda", **SMALL))
    assert row["status"] == "ok", row["status"]
    assert row["memory_method"] == "cuda max_memory_allocated"
    assert row["peak_bytes"] >= SMALL["h"] * 1024 * 1024 * 4 and "GPU" in row["hardware"]
