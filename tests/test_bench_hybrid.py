"""tools/bench_hybrid.py, the stored decode grid of notebook 14: what it writes and what its bytes mean."""

import json

import pytest

from tools import bench_hybrid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid") / "bench.json"
    bench_hybrid.main(["--positions", "64", "128", "--steps", "2", "--prefill-n", "96", "--d-model", "32",
                       "--out", str(out)])
    return json.loads(out.read_text())


def test_every_model_has_its_rows_and_the_command_that_made_them(tiny):
    assert tiny["meta"]["command"].startswith("python tools/bench_hybrid.py --positions 64 128")
    assert tiny["bandwidth_gbs"] > 0
    for section, count in (("decode", 2), ("prefill", 1), ("rollback", len(bench_hybrid.ROLLBACK_J))):
        models = [row["model"] for row in tiny[section]]
        assert sorted(set(models)) == sorted(bench_hybrid.MODELS) and len(models) == count * 3, section


def test_cache_bytes_grow_with_position_only_for_softmax_layers(tiny):
    # d_model 32, 4 heads of 8, float32: a softmax layer holds keys and values, 2 · 4 · 8 · 4 bytes a token
    per_token = 2 * 4 * 8 * 4
    at = {(row["model"], row["position"]): row["cache_bytes"] for row in tiny["decode"]}
    assert at["softmax", 128] - at["softmax", 64] == 4 * 64 * per_token
    assert at["hybrid", 128] - at["hybrid", 64] == 1 * 64 * per_token
    assert at["recurrent", 128] == at["recurrent", 64] > 0


def test_bytes_read_are_the_weights_a_step_reads_plus_its_cache(tiny):
    for row in tiny["decode"]:
        weights = tiny["meta"][f"parameter_bytes_{row['model']}"]
        assert row["bytes_read"] == weights + row["cache_bytes"]
    # the embedding table is read one row a token: 256 × 32 − 32 numbers fewer than all parameters
    model = bench_hybrid.make_model("softmax", d_model=32)
    every = sum(p.numel() * 4 for p in model.parameters())
    assert tiny["meta"]["parameter_bytes_softmax"] == every - (256 - 1) * 32 * 4


def test_a_softmax_layer_stores_no_state_for_rollback(tiny):
    stored = {(row["model"], row["j"]): row["stored_bytes"] for row in tiny["rollback"]}
    assert all(stored["softmax", j] == 0 for j in bench_hybrid.ROLLBACK_J)
    assert stored["recurrent", 8] == 8 * stored["recurrent", 1] > 0
    assert stored["hybrid", 1] * 4 == stored["recurrent", 1] * 3
