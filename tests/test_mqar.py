"""Multi-query associative recall and notebook 11's models (Arora et al. 2023, Zoology, §3)."""

import numpy as np
import pytest
import torch

from course_lib import tasks


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
        batches, held_out = torch.Generator().manual_seed(1), _batch(8, 3, seed=2, n_keys=16, n_values=8)
        return tasks.train_scored(
            model, lambda: tasks.reversal_loss(model, *tasks.mqar_batch(16, 3, batches, n_keys=16, n_values=8)),
            lambda: tasks.evaluate_batch(model, *held_out), steps=6, **options)

    full, scored = run(eval_every=100), run(eval_every=2)
    assert full["step"] == list(range(1, 7)) and full["stop"] == "steps" and full["eval_step"] == []
    assert scored["eval_step"] == [2, 4, 6] and all(0 <= a <= 1 for a in scored["eval_accuracy"])
    assert np.allclose(full["loss"], scored["loss"], rtol=1e-6)  # the held-out batch draws nothing from training
    early = run(eval_every=2, stop_accuracy=0.0)
    assert early["stop"] == "accuracy" and early["step"] == [1, 2]
