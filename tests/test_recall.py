"""Notebook 11's recall tasks, their hand-set controls and the sweep protocol (``course_lib.recall``)."""

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

from course_lib import data_path, recall, tasks

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import train_recall  # noqa: E402


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- overwrite-MQAR --------------------------------------------------------------------------------

def test_overwrite_target_is_the_latest_value_of_each_key():
    n_pairs, n_writes = 5, 12
    tokens, targets = recall.overwrite_batch(64, n_pairs, n_writes, _gen(), n_keys=16, n_values=8)
    assert tokens.shape == targets.shape == (64, 2 * n_writes + n_pairs) and tokens.dtype == torch.long
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        keys, values, queries = row[0:2 * n_writes:2], row[1:2 * n_writes:2], row[2 * n_writes:]
        assert len(set(keys)) == n_pairs and all(0 <= k < 16 for k in keys)  # N distinct keys, each written
        assert all(16 <= v < 24 for v in values)
        latest = {}
        for key, value in zip(keys, values, strict=True):  # a dict keeps the last write of each key
            latest[key] = value
        assert sorted(queries) == sorted(latest)  # every key asked once
        assert target[:2 * n_writes] == [tasks.IGNORED] * (2 * n_writes)
        assert target[2 * n_writes:] == [latest[q] for q in queries]
    assert torch.equal(tokens, recall.overwrite_batch(64, n_pairs, n_writes, _gen(), n_keys=16, n_values=8)[0])


def test_rewrites_are_interleaved_not_in_blocks():
    tokens, _ = recall.overwrite_batch(256, 8, 16, _gen(1))
    rows = tokens[:, :32:2].tolist()  # (b, W) the written keys
    first_repeat = []
    for keys in rows:
        seen = set()
        for i, key in enumerate(keys):
            if key in seen:
                first_repeat.append(i)
                break
            seen.add(key)
    assert min(first_repeat) < 4 and max(first_repeat) >= 8  # a key comes back early in some rows, late in others
    rewritten = recall.rewritten(tokens, 8)  # (b, N)
    assert 0.2 < rewritten.double().mean() < 0.9  # some queries ask for a rewritten key, some do not
    counts = [[keys.count(q) for q in row[32:]] for keys, row in zip(rows, tokens.tolist(), strict=True)]
    assert rewritten.tolist() == [[c > 1 for c in row] for row in counts]


def test_overwrite_with_one_write_each_is_mqar():
    tokens, targets = recall.overwrite_batch(32, 6, 6, _gen(2))
    assert not recall.rewritten(tokens, 6).any() and tokens.shape == (32, 18)


@pytest.mark.parametrize("args, kwargs, match", [
    ((8, 4), {}, "n_writes must be at least n_pairs"),
    ((40, 40), dict(n_keys=32), "n_pairs must lie in"),
    ((0, 4), {}, "n_pairs must be a positive int"),
])
def test_overwrite_bad_arguments_are_named(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        recall.overwrite_batch(4, *args, _gen(), **kwargs)


# --- capacity and needle -----------------------------------------------------------------------------

def test_capacity_rows_have_ratio_times_d_head_pairs():
    for ratio in (1, 2, 4):
        tokens, targets = recall.capacity_batch(8, ratio, 8, _gen(), n_keys=64)
        assert tokens.shape == targets.shape == (8, 3 * ratio * 8)
        assert (targets != tasks.IGNORED).sum(1).tolist() == [ratio * 8] * 8
    with pytest.raises(ValueError, match="ratio · d_head = 64"):
        recall.capacity_batch(8, 4, 16, _gen(), n_keys=32)
    with pytest.raises(ValueError, match="ratio must be a positive int"):
        recall.capacity_batch(8, 0.5, 16, _gen())


def test_needle_target_is_the_marked_pairs_value():
    n_pairs, marked = 10, 3
    tokens, targets, depth = recall.needle_batch(128, n_pairs, _gen(), n_keys=40, n_values=8, n_needle_keys=marked,
                                                 return_depth=True)
    assert tokens.shape == targets.shape == (128, 2 * n_pairs + 1) and depth.shape == (128,)
    for row, target, at in zip(tokens.tolist(), targets.tolist(), depth.tolist(), strict=True):
        keys, values = row[0:2 * n_pairs:2], row[1:2 * n_pairs:2]
        assert keys[at] < marked and row[-1] == keys[at]  # the needle is marked and asked for
        others = keys[:at] + keys[at + 1:]
        assert len(set(others)) == n_pairs - 1 and min(others) >= marked  # distinct, unmarked
        assert target[:-1] == [tasks.IGNORED] * (2 * n_pairs) and target[-1] == values[at]


def test_needle_with_just_enough_keys():
    tokens, targets, depth = recall.needle_batch(64, 12, _gen(5), n_keys=15, n_needle_keys=4, return_depth=True)
    for row, at in zip(tokens.tolist(), depth.tolist(), strict=True):
        keys = row[0:24:2]
        assert keys[at] < 4 and sorted(keys[:at] + keys[at + 1:]) == list(range(4, 15))  # every unmarked key once


def test_needle_depths_cover_the_row():
    _, _, depth = recall.needle_batch(512, 8, _gen(3), n_keys=16, return_depth=True)
    assert sorted(set(depth.tolist())) == list(range(8))  # first pair to last
    _, _, fixed = recall.needle_batch(16, 8, _gen(3), n_keys=16, depth=5, return_depth=True)
    assert (fixed == 5).all()


@pytest.mark.parametrize("args, kwargs, match", [
    ((30,), dict(n_keys=16, n_needle_keys=4), "distinct unmarked keys"),
    ((8,), dict(n_keys=16, depth=8), "depth must lie in"),
    ((8,), dict(n_keys=16, n_needle_keys=0), "n_needle_keys must be a positive int"),
])
def test_needle_bad_arguments_are_named(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        recall.needle_batch(4, *args, _gen(), **kwargs)


# --- hand-set controls --------------------------------------------------------------------------------

def test_hand_set_sum_rule_reads_the_sum_of_outer_products():
    tokens, _ = recall.overwrite_batch(2, 4, 7, _gen(4), n_keys=16, n_values=8)
    model = recall.HandSetRecall("sum", 16, 8, n_heads=2, head_dim=4, generator=_gen(5))
    logits = model(tokens)  # (b, n, vocab)
    K, V = model.key_vectors, model.value_vectors  # (h, 16, d), (h, 8, d)
    for b, row in enumerate(tokens.tolist()):
        S = torch.zeros(2, 4, 4)
        for t, token in enumerate(row):
            if t and token >= 16 and row[t - 1] < 16:  # a value after a key: write
                S = S + K[:, row[t - 1], :, None] * V[:, token - 16, None, :]
            if token < 16:  # a key: read, and score every value
                read = torch.einsum("hd,hde->he", K[:, token], S)
                expected = torch.einsum("he,hje->j", read, V)
                torch.testing.assert_close(logits[b, t, 16:], expected, rtol=1e-5, atol=1e-5)
                assert (logits[b, t, :16] < -1e3).all()


def test_delta_rule_overwrites_where_the_sum_rule_mixes():
    tokens, targets = recall.overwrite_batch(256, 8, 24, _gen(6), n_keys=32, n_values=32)
    again = recall.rewritten(tokens, 8)

    def right(rule, **options):
        model = recall.HandSetRecall(rule, 32, 32, n_heads=1, head_dim=64, generator=_gen(7), **options)
        loss, accuracy = tasks.evaluate_batch(model, tokens, targets)  # the trained models' scoring function
        with torch.no_grad():
            hits = model(tokens)[:, -8:].argmax(-1) == targets[:, -8:]
        return accuracy, hits[again].double().mean().item()

    delta, delta_again = right("delta")
    total, sum_again = right("sum")
    assert delta > 0.98 and delta_again > 0.98  # 32 near-orthogonal keys in 64 dimensions: replaced
    assert sum_again < 0.6 and total < 0.7  # old + new: a coin toss or worse under a rewritten key
    decayed, decay_again = right("decay", gamma=0.9)
    assert sum_again < decay_again < delta_again  # recency helps, replacing helps more


def test_token_gate_keeps_the_needle_where_fixed_rules_lose_it():
    tokens, targets = recall.needle_batch(256, 64, _gen(8), n_keys=72, n_values=32, n_needle_keys=4)

    def accuracy(rule, **options):
        model = recall.HandSetRecall(rule, 72, 32, n_heads=8, head_dim=8, generator=_gen(9), **options)
        return tasks.evaluate_batch(model, tokens, targets)[1]

    assert accuracy("token_gate", n_marked=4) == 1.0
    assert max(accuracy("sum"), accuracy("delta"), accuracy("decay", gamma=0.9)) < 0.9


@pytest.mark.parametrize("rule, kwargs, match", [
    ("mamba", {}, "rule must be one of"),
    ("decay", {}, "needs a decay gamma"),
    ("delta", dict(beta=1.5), "beta must lie in"),
    ("token_gate", {}, "n_marked"),
])
def test_hand_set_bad_arguments_are_named(rule, kwargs, match):
    with pytest.raises(ValueError, match=match):
        recall.HandSetRecall(rule, 8, 8, **kwargs)


# --- the model without positions, and the protocol ----------------------------------------------------

def test_mqar_model_without_positions():
    torch.manual_seed(0)
    with_positions = tasks.mqar_model("deltanet", 16, 12, n_heads=2)
    torch.manual_seed(0)
    without = tasks.mqar_model("deltanet", 16, 12, n_heads=2, positions=False)
    assert with_positions.position.weight.requires_grad and with_positions.position.weight.abs().sum() > 0
    assert not without.position.weight.requires_grad and (without.position.weight == 0).all()
    for (name, a), (_, b) in zip(with_positions.state_dict().items(), without.state_dict().items(), strict=True):
        assert name == "position.weight" or torch.equal(a, b)  # the same draw for every other weight
    tokens, targets = tasks.mqar_batch(4, 4, _gen(), n_keys=8, n_values=8)
    tasks.train_scored(without, lambda: tasks.reversal_loss(without, tokens, targets),
                       lambda: tasks.evaluate_batch(without, tokens, targets), steps=3, eval_every=3)
    assert (without.position.weight == 0).all()  # frozen: training never gives the model a position


def test_best_rate_is_chosen_on_validation_never_on_test():
    def fake(lr, seed, validation, test):
        return dict(cell="c", mixer="m", lr=lr, seed=seed, eval_step=[100, 200], eval_accuracy=[0.1, validation],
                    test_accuracy={"200": test})
    runs = [fake(1e-3, s, 0.5, 0.9) for s in range(3)] + [fake(1e-2, s, 0.6, 0.1) for s in range(3)]
    assert recall.best_rates(runs, 200) == {("c", "m"): 1e-2}  # the better validation, whatever the test says
    assert recall.best_rates(runs, 100) == {("c", "m"): 1e-3}  # a tie at step 100: the smaller rate
    assert recall.test_accuracies(runs, "c", "m", 1e-2, 200) == [0.1] * 3
    assert recall.validation_at(dict(eval_step=[100], eval_accuracy=[0.99]), 500) == 0.99  # stopped sooner


def test_one_sweep_run_keeps_validation_and_test_apart():
    cell = ("tiny", dict(kind="overwrite", n_pairs=2, n_writes=3, n_keys=8, n_values=8), False)
    result = train_recall.run((cell, "linear", 3e-3, 0, (100, 200)))
    assert result["eval_step"] == [100, 200] and set(result["test_accuracy"]) == {"100", "200"}
    assert result["stop"] in ("steps", "accuracy") and 0 <= result["test_accuracy"]["200"] <= 1
    assert result["steps_to_90"] is None or result["steps_to_90"] in result["eval_step"]


def test_task_batch_names_each_generator_and_refuses_others():
    task = dict(kind="overwrite", n_pairs=3, n_writes=5, n_keys=8, n_values=8)
    assert all(torch.equal(a, b) for a, b in zip(recall.task_batch(task, 4, _gen()),
                                                  recall.overwrite_batch(4, 3, 5, _gen(), n_keys=8, n_values=8),
                                                  strict=True))
    assert recall.task_batch(dict(kind="capacity", ratio=2, d_head=4, n_keys=8), 4, _gen())[0].shape == (4, 24)
    assert recall.task_batch(dict(kind="needle", n_pairs=5, n_keys=8), 4, _gen())[0].shape == (4, 11)
    with pytest.raises(ValueError, match="task kind must be"):
        recall.task_batch(dict(kind="copy"), 4, _gen())


def test_row_correct_counts_the_scored_positions_only():
    tokens, targets = recall.overwrite_batch(64, 8, 24, _gen(10), n_keys=32, n_values=32)
    model = recall.HandSetRecall("delta", 32, 32, n_heads=1, head_dim=64, generator=_gen(7))
    correct = recall.row_correct(model, tokens, targets)
    assert correct.shape == (64,) and correct.max() <= 8
    assert correct.sum().item() / (64 * 8) == pytest.approx(tasks.evaluate_batch(model, tokens, targets)[1])


def test_sign_flip_test_finds_a_shift_and_not_noise():
    rng = torch.Generator().manual_seed(11)
    noise = torch.randn(400, generator=rng).numpy()
    same = recall.paired_sign_flip_test(noise, torch.randn(400, generator=rng).numpy())
    shifted = recall.paired_sign_flip_test(noise + 0.3, noise + 0.3 * torch.randn(400, generator=rng).numpy())
    assert same["p"] > 0.01 and shifted["p"] < 1e-3 and shifted["difference"] > 0.2
    assert recall.paired_sign_flip_test([1.0, 1.0], [1.0, 1.0])["p"] == 1.0  # no difference at all
    with pytest.raises(ValueError, match="same units"):
        recall.paired_sign_flip_test([1.0, 2.0], [1.0])


@pytest.mark.parametrize("store", sorted(train_recall.STORES))
def test_each_stored_sweep_matches_the_tool_and_replays(store):
    stored = json.loads(data_path(store).read_text())
    settings, runs = stored["settings"], stored["runs"]
    families = train_recall.STORES[store]
    assert settings["model"] == train_recall.MODEL and settings["lrs"] == list(train_recall.LRS)
    assert settings["budgets"] == list(train_recall.BUDGETS) and settings["seeds"]["models"] == list(train_recall.SEEDS)
    cells = {name: (task, positions) for family in families for name, task, positions in train_recall.CELLS[family]}
    assert {name: (cell["task"], cell["positions"]) for name, cell in settings["cells"].items()} == cells
    expected = {(name, mixer, lr, seed) for family in families for name, _, _ in train_recall.CELLS[family]
                for mixer in train_recall.FAMILY_MIXERS[family] for lr in train_recall.LRS
                for seed in train_recall.SEEDS}
    assert sorted((r["cell"], r["mixer"], r["lr"], r["seed"]) for r in runs) == sorted(expected)  # each run once
    for run in runs:
        assert set(run["test_accuracy"]) == {str(b) for b in train_recall.BUDGETS}
        assert all(0 <= a <= 1 for a in run["test_accuracy"].values())
        assert len(run["test_rows_correct"]) == settings["test_batch"]
    # the first steps of one stored run, trained again in one thread, give its logged losses
    run = min(runs, key=lambda r: (r["seed"], r["lr"], r["cell"], r["mixer"]))
    name, task, positions = next(c for f in families for c in train_recall.CELLS[f] if c[0] == run["cell"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = train_recall.build(run["mixer"], task, positions, run["seed"])
        batches = torch.Generator().manual_seed(train_recall.batch_seed(run["seed"]))
        history = tasks.train_scored(
            model, lambda: tasks.reversal_loss(model, *recall.task_batch(task, train_recall.BATCH_SIZE, batches)),
            lambda: (0.0, 0.0), steps=5, lr=run["lr"], eval_every=100)
    finally:
        torch.set_num_threads(threads)
    assert np.allclose(history["loss"], run["loss"][:5], rtol=0.02)
