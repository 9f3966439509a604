"""The copy task of notebook 07 with lengths that vary per row (Katharopoulos et al. 2020, §4.1)."""

import json

import pytest
import torch

from course_lib import data_path, tasks
from course_lib.torch.causal_lm import CausalLM


def _batch(b=64, length=9, min_length=2, seed=0):
    return tasks.copy_batch(b, length, 10, torch.Generator().manual_seed(seed), min_length=min_length)


def test_every_row_is_symbols_separator_copy_then_padding():
    tokens = _batch()
    lengths = tasks.copy_lengths(tokens)
    assert tokens.shape == (64, 19) and tokens.dtype == torch.long
    assert lengths.min() >= 2 and lengths.max() <= 9 and len(lengths.unique()) > 3  # the lengths vary
    for row, length in zip(tokens, lengths.tolist(), strict=True):
        assert row[:length].min() >= 1 and row[:length].max() <= 10
        assert row[length] == tasks.COPY_SEPARATOR
        assert torch.equal(row[length + 1:2 * length + 1], row[:length])
        assert torch.all(row[2 * length + 1:] == tasks.COPY_SEPARATOR)  # padding after the copy
    assert torch.equal(tokens, _batch())  # the generator fixes the batch


def test_without_min_length_every_row_has_the_full_length():
    tokens = tasks.copy_batch(4, 5, 10, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 11) and torch.all(tasks.copy_lengths(tokens) == 5)
    with pytest.raises(ValueError, match="min_length"):
        tasks.copy_batch(4, 5, 10, torch.Generator(), min_length=6)


class _Lookup(torch.nn.Module):
    """Predicts token p + 1 as the token ``offset(row)`` positions back: a copier when the offset is L."""

    def __init__(self, offsets):
        super().__init__()
        self.offsets = offsets  # (b,)

    def forward(self, x):
        positions = torch.arange(x.shape[1])
        source = (positions[None, :] - self.offsets[:, None]).clamp(min=0)  # (b, t)
        return 50.0 * torch.nn.functional.one_hot(x.gather(1, source), 11).double()


def test_the_copy_needs_each_rows_own_offset():
    tokens = _batch()
    lengths = tasks.copy_lengths(tokens)
    assert tasks.copy_loss(_Lookup(lengths), tokens).item() < 1e-6  # L positions back: a perfect copier
    fixed = torch.full_like(lengths, int(lengths.max()))
    assert tasks.copy_loss(_Lookup(fixed), tokens).item() > 5  # one fixed offset fails on the other lengths
    assert tasks.copy_loss(_Lookup(lengths + 1), tokens).item() > 5  # L + 1 back is off by one


def test_only_the_copy_is_scored():
    tokens = _batch()
    scored = tasks._copy_scored(tokens)
    assert scored.shape == (64, 18) and scored.sum() == tasks.copy_lengths(tokens).sum()


def test_scoring_between_steps_leaves_the_run_unchanged():
    def run(eval_every):
        torch.manual_seed(0)
        model = CausalLM(11, 12, d_model=16, n_heads=2, n_layers=1, attention="linear")
        return tasks.train_copy(model, length=6, min_length=2, n_symbols=10, steps=4, log_every=1, batch_size=8,
                                generator=torch.Generator().manual_seed(1), eval_every=eval_every,
                                eval_generator=torch.Generator().manual_seed(2), eval_batch=16)

    plain, scored = run(0), run(2)
    assert plain["loss"] == scored["loss"] and plain["step"] == scored["step"] == [1, 2, 3, 4]
    assert scored["eval_step"] == [2, 4] and len(scored["eval_loss"]) == len(scored["eval_accuracy"]) == 2
    assert set(plain) == {"step", "loss"}


def test_the_stored_runs_have_three_seeds_logged_at_every_step():
    stored = json.loads(data_path("copy_runs.json").read_text())
    steps = stored["settings"]["steps"]
    assert stored["settings"]["task"]["min_length"] < stored["settings"]["task"]["length"]  # lengths vary
    for attention in ("softmax", "linear"):
        runs = stored["runs"][attention]
        assert len({run["seed"] for run in runs}) >= 3
        for run in runs:
            assert run["step"] == list(range(1, steps + 1)) and len(run["loss"]) == steps
            assert run["eval_step"][-1] == steps and 0 <= run["eval_accuracy"][-1] <= 1
