"""Lesson 05's tasks and stored runs: the lookup task's low-rank attention, scoring that skips the
table, the training tool's fused exact attention, and the stored runs the lesson reads."""

import json

import numpy as np
import pytest
import torch

from course_lib import data_path, tasks
from course_lib.torch.full import softmax_attention
from course_lib.torch.linformer import LinformerEncoder
from tools import train_sharing


def test_lookup_targets_are_the_table_entries_the_indices_point_to():
    tokens, targets = tasks.lookup_batch(16, 20, 8, torch.Generator().manual_seed(0), table=5)
    assert tokens.shape == targets.shape == (16, 20) and tokens.dtype == torch.int64
    assert torch.all(targets[:, :5] == tasks.IGNORED)  # the table itself is not scored
    index = tokens[:, 5:]
    assert index.min() >= 0 and index.max() < 5  # every query is an index into the table
    assert torch.equal(targets[:, 5:], tokens[:, :5].gather(1, index))
    again = tasks.lookup_batch(16, 20, 8, torch.Generator().manual_seed(0), table=5)
    assert torch.equal(tokens, again[0]) and torch.equal(targets, again[1])  # fixed by the generator


def test_the_attention_that_solves_lookup_has_rank_at_most_the_table_at_every_n():
    for n in (16, 64, 256):
        tokens, _ = tasks.lookup_batch(1, n, 8, torch.Generator().manual_seed(n), table=8)
        P = np.zeros((n, n))
        P[np.arange(8), np.arange(8)] = 1.0  # a table position may read itself (it is not scored)
        P[np.arange(8, n), tokens[0, 8:].numpy()] = 1.0  # a query reads the entry its index names
        assert np.linalg.matrix_rank(P) <= 8
    J = np.eye(64)[::-1]  # reversal's attention: full rank
    assert np.linalg.matrix_rank(J) == 64


@pytest.mark.parametrize("table, n, vocab", [(0, 10, 8), (9, 20, 8), (8, 8, 8)])
def test_lookup_rejects_a_table_that_does_not_fit(table, n, vocab):
    with pytest.raises(ValueError, match="table must satisfy"):
        tasks.lookup_batch(2, n, vocab, torch.Generator().manual_seed(0), table=table)


def test_evaluate_batch_scores_only_the_scored_positions():
    class Echo(torch.nn.Module):  # predicts its input token at every position
        def forward(self, tokens):
            return torch.nn.functional.one_hot(tokens, 8).double() * 50.0

    tokens = torch.tensor([[1, 2, 3, 4]])
    targets = torch.tensor([[tasks.IGNORED, 2, 0, tasks.IGNORED]])
    loss, accuracy = tasks.evaluate_batch(Echo(), tokens, targets)
    assert accuracy == 0.5  # position 2 right, position 3 wrong; the ignored ones count for nothing
    assert loss == pytest.approx(25.0, abs=1e-6)  # (0 + 50) / 2: cross-entropy of the two scored tokens
    reversal = tasks.evaluate_reversal(Echo(), n=6, vocab_size=8, generator=torch.Generator().manual_seed(1))
    tokens, targets = tasks.reversal_batch(256, 6, 8, torch.Generator().manual_seed(1))
    assert reversal[1] == pytest.approx((tokens == targets).double().mean().item())


def test_the_tool_gives_exact_attention_the_fused_kernel_with_the_same_output():
    tool = train_sharing
    q, k, v = (torch.randn(2, 3, 10, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(tool.fused_attention(q, k, v), softmax_attention(q, k, v))
    torch.manual_seed(0)
    fused = tool.build(12, None, "exact", None)
    torch.manual_seed(0)
    plain = LinformerEncoder(max_len=12, k=None, sharing="none", **tool.MODEL)
    tokens = torch.randint(0, 8, (3, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(fused(tokens), plain(tokens), atol=1e-5, rtol=1e-5)


def test_the_tool_starts_pooling_runs_at_mean_pooling():
    tool = train_sharing
    model = tool.build(16, 4, "headwise", "pooling")
    first = model.layers[0].attention
    pool = np.zeros((4, 16))
    for i in range(4):
        pool[i, 4 * i:4 * i + 4] = 0.25
    np.testing.assert_allclose(first.E.detach().numpy(), pool, rtol=1e-6)
    np.testing.assert_allclose(first.F.detach().numpy(), pool, rtol=1e-6)


def test_plateau_test_passes_only_on_a_flat_best_loss():
    tool = train_sharing
    assert not tool.plateaued([2.0, 1.0, 0.5, 0.2], per_window=2, tol=0.01)  # still falling
    assert tool.plateaued([2.0, 1.0, 0.5, 0.499, 0.6], per_window=2, tol=0.01)  # best moved by 0.001
    assert not tool.plateaued([2.0, 1.0], per_window=2, tol=0.01)  # not one window of evaluations yet


def test_stored_runs_have_three_seeds_and_an_exact_baseline_at_every_n():
    runs = json.loads(data_path("sharing_runs.json").read_text())["runs"]
    configs = {}
    for r in runs:
        configs.setdefault((r["experiment"], r["task"], r["n"], r["k"], r["sharing"], r["init"]), []).append(r["seed"])
    assert all(sorted(seeds) == [0, 1, 2] for seeds in configs.values()), configs
    for task in ("reversal", "lookup"):
        lengths = {n for (_, t, n, k, _, _) in configs if t == task and k is not None}
        exact = {n for (_, t, n, k, _, _) in configs if t == task and k is None}
        assert lengths <= exact, f"{task}: Linformer at n = {sorted(lengths)}, exact only at {sorted(exact)}"
    for r in runs:
        assert r["steps"] >= r["stop_step"] and (not r["converged"] or r["steps"] > r["stop_step"])
        assert 0 <= r["final"]["accuracy"] <= 1 and r["monitor"]["step"][-1] <= r["steps"]


def test_selecting_the_support_makes_linformer_exact_attention_on_it():
    from course_lib.checks.lesson05 import _cases_5_2, _exact_on_support, _selecting, exact_projection

    for _, (support, n), _ in _cases_5_2():
        _, output = _selecting(exact_projection)(support, n)
        np.testing.assert_allclose(output, _exact_on_support(support, n), atol=1e-12)
        rows_reversed = exact_projection(support, n)[::-1]  # another order of the rows: the same answer
        np.testing.assert_allclose(_selecting(lambda s, n_, E=rows_reversed: E)(support, n)[1], output, atol=1e-12)
