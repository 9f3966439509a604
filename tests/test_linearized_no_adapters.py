"""The stage-2 runs without adapters (python tools/train_linearized.py --no-adapter-runs) and their rows."""

import json
import pathlib
import sys

import numpy as np
import pytest

from course_lib import data_path, linearize
from course_lib.pretrained import load_minilm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import train_linearized  # noqa: E402

NO_ADAPTERS = ", no adapters"


@pytest.fixture(scope="module")
def results():
    return json.loads(data_path("linearized_results.json").read_text())


def test_the_option_runs_only_the_runs_without_adapters(monkeypatch, tmp_path):
    called = {}
    monkeypatch.setattr(train_linearized, "no_adapter_runs", lambda out, *, jobs: called.update(out=out, jobs=jobs))
    monkeypatch.setattr(train_linearized, "score_stored", lambda *a, **k: pytest.fail("--score-only ran"))
    train_linearized.main(["--no-adapter-runs", "--jobs", "2", "--out", str(tmp_path)])
    assert called == {"out": tmp_path, "jobs": 2}


def test_the_rows_without_adapters_sit_beside_the_stored_stage_2(results):
    rows = {r["name"]: r for r in results["rows"]}
    extra = [name for name in rows if name.endswith(NO_ADAPTERS)]
    assert extra == ["Hedgehog, stages 1 + 2" + NO_ADAPTERS, "Hedgehog + window (w = 4), stages 1 + 2" + NO_ADAPTERS]
    assert [r["name"] for r in results["rows"][-2:]] == extra  # appended after every stored row
    assert results["no_adapter_command"].startswith("python tools/train_linearized.py --no-adapter-runs")
    assert 0 < results["no_adapter_wall_s"] < 3600
    model = load_minilm()
    maps = {"Hedgehog": linearize.linearize(model, "hedgehog", n_features=results["settings"]["features"]),
            "Hedgehog + window": linearize.linearize(model, "hedgehog", n_features=results["settings"]["features"],
                                                     window=results["settings"]["window"])}
    for name in extra:
        row, stored = rows[name], rows[name.removesuffix(NO_ADAPTERS)]
        assert row["command"].endswith("--no-adapter-runs") and row["training"] == "stage 1 + stage 2, no adapters"
        key = "Hedgehog + window" if "window" in name else "Hedgehog"
        assert row["added"] == linearize.added_parameters(maps[key])  # the maps only: rank 0
        assert row["added"] < results["added_parameters"]["window" if "window" in name else "hedgehog"]
        assert np.isclose(np.mean(row["cosines"]), row["cosine"]) and len(row["cosines"]) == len(stored["cosines"])
        assert row["cosine"] > row["control"] + 0.3 and row["cosines"] != stored["cosines"]  # trained, another run
