"""Multi-query associative recall and notebook 11's models (Arora et al. 2023, Zoology, §3)."""

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

from course_lib import data_path, tasks

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import train_mqar  # noqa: E402


def _batch(b=64, n_pairs=6, seed=0, **task):
    return tasks.mqar_batch(b, n_pairs, torch.Generator().manual_seed(seed), **task)


def test_every_row_is_pairs_then_every_key_asked_again():
    tokens, targets = _batch(n_keys=16, n_values=8)
    assert tokens.shape == targets.shape == (64, 18) and tokens.dtype == targets.dtype == torch.long
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        keys, values, queries = row[0:12:2], row[1:12:2], row[12:]
        assert len(set(keys)) == 6 and all(0 <= k < 16 for k in keys)  # distinct key tokens
        assert all(16 <= v < 24 for v in values)  # value tokens come after the keys
        assert sorted(queries) == sorted(keys)  # every key asked once
        assert target[:12] == [tasks.IGNORED] * 12  # only the queries are scored
        assert target[12:] == [dict(zip(keys, values, strict=True))[q] for q in queries]
    assert len({tuple(row[12:]) for row in tokens.tolist()}) > 1  # the query order varies
    assert torch.equal(tokens, _batch(n_keys=16, n_values=8)[0])  # the generator fixes the batch


def test_too_many_pairs_for_the_keys_is_refused():
    with pytest.raises(ValueError, match="n_pairs"):
        _batch(n_pairs=9, n_keys=8)
    with pytest.raises(ValueError, match="mixer"):
        tasks.mqar_model("mamba", 10, 6)


@pytest.mark.parametrize("mixer", tasks.MIXERS)
def test_every_mixer_is_causal_and_sized_by_its_heads(mixer):
    torch.manual_seed(0)
    model = tasks.mqar_model(mixer, 20, 12, d_model=16, n_heads=2, chunk_size=4).double().eval()
    tokens = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % 20  # the future of position 6
    with torch.no_grad():
        logits, other = model(tokens), model(changed)
    assert logits.shape == (3, 12, 20)
    assert torch.allclose(logits[:, :7], other[:, :7], atol=1e-12) and not torch.allclose(logits, other)
    assert model.attention == mixer
    assert tasks.state_numbers(model) == (None if mixer == "softmax" else 2 * 2 * 8 * 8)  # layers · h · (d/h)²


def test_the_plateau_test_waits_for_min_step_and_the_window():
    steps = list(range(100, 1100, 100))
    assert tasks.plateau_step(steps, [1.0] * 10) == 600  # flat from the start: passes at min_step
    assert tasks.plateau_step(steps, [2.0 - 0.1 * i for i in range(10)]) is None  # still falling
    falling = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5, 1.4, 1.4, 1.4, 1.4]  # falls until step 700, then flat
    assert tasks.plateau_step(steps, falling) == 1000  # at 900 the best still fell by 0.1 since step 600


def test_training_stops_early_and_scoring_leaves_the_run_unchanged():
    def run(**options):
        torch.manual_seed(0)
        model = tasks.mqar_model("gate", 24, 9, d_model=16, n_heads=2)
        return tasks.train_mqar(model, n_pairs=3, steps=6, generator=torch.Generator().manual_seed(1),
                                eval_generator=torch.Generator().manual_seed(2), eval_batch=8, n_keys=16, n_values=8,
                                **options)

    full, scored = run(eval_every=100), run(eval_every=2)
    assert full["step"] == list(range(1, 7)) and full["stop"] == "steps" and full["eval_step"] == []
    assert scored["eval_step"] == [2, 4, 6] and all(0 <= a <= 1 for a in scored["eval_accuracy"])
    assert np.allclose(full["loss"], scored["loss"], rtol=1e-6)  # the held-out batch draws nothing from training
    early = run(eval_every=2, stop_accuracy=0.0)
    assert early["stop"] == "accuracy" and early["step"] == [1, 2]


def test_the_grid_covers_both_sweeps():
    grid = train_mqar.grid(tasks.MIXERS)
    assert len(grid) == len(set(grid)) == 3 + 5 * 5  # softmax at each N; five recurrent mixers in five cells
    recurrent = {(n, h) for m, n, h in grid if m != "softmax"}
    assert {(n, train_mqar.FIXED_HEADS) for n in train_mqar.PAIRS} <= recurrent
    assert {(train_mqar.FIXED_PAIRS, h) for h in train_mqar.HEADS} <= recurrent


def test_the_stored_sweep_matches_the_tool_and_replays():
    stored = json.loads(data_path("mqar_runs.json").read_text())
    settings, runs = stored["settings"], stored["runs"]
    assert settings["task"] == train_mqar.TASK and settings["model"] == train_mqar.MODEL
    assert settings["train"] == train_mqar.TRAIN and settings["plateau"] == train_mqar.PLATEAU
    cells = {}
    for run in runs:
        cells.setdefault((run["mixer"], run["n_pairs"], run["n_heads"]), []).append(run["seed"])
        assert run["stop"] in ("accuracy", "plateau") and 0 <= run["eval_accuracy"][-1] <= 1  # none at the cap
        assert run["eval_step"][-1] <= settings["max_steps"]["softmax" if run["mixer"] == "softmax" else "recurrent"]
    assert set(cells) == set(train_mqar.grid(tasks.MIXERS))
    assert all(sorted(seeds) == list(train_mqar.SEEDS) for seeds in cells.values())
    # the first steps of one stored run, trained again, give its logged losses (one thread, as stored)
    run = next(r for r in runs if (r["mixer"], r["n_pairs"], r["n_heads"], r["seed"]) == ("deltanet", 2, 8, 0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = train_mqar.build("deltanet", 2, 8, 0)
        history = tasks.train_mqar(model, n_pairs=2, steps=10, generator=torch.Generator().manual_seed(
            train_mqar.batch_seed(0)), eval_generator=torch.Generator().manual_seed(train_mqar.TEST_SEED),
            **train_mqar.TASK, **train_mqar.TRAIN)
    finally:
        torch.set_num_threads(threads)
    assert np.allclose(history["loss"], run["loss"][:10], rtol=0.02)
