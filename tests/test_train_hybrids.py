"""The hybrid sweep's tool (tools/train_hybrids.py): what it scores is what lesson 14 says it scores, and the
stored runs and weights match the tool that wrote them."""

import json
import sys

import torch
from safetensors.torch import load_file

from course_lib import data_path, tasks
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT))
from tools import train_hybrids  # noqa: E402


def test_query_distances_are_the_positions_back_to_each_value():
    tokens, targets = tasks.mqar_batch(4, 5, torch.Generator().manual_seed(0), n_keys=16, n_values=8)
    distances = train_hybrids.query_distances(tokens)
    for row, target in zip(tokens.tolist(), targets.tolist(), strict=True):
        for t, answer in enumerate(target):
            if answer == tasks.IGNORED:
                continue
            value_at = row.index(row[t]) + 1  # the key's first place, the value right after it
            assert row[value_at] == answer
    expected = torch.zeros_like(tokens)
    for b, row in enumerate(tokens.tolist()):
        for t in range(10, 15):
            expected[b, t] = t - (row.index(row[t]) + 1)
    assert torch.equal(distances, expected) and distances.max() <= 3 * 5 - 2


def test_a_model_that_knows_the_answers_scores_one():
    tokens, targets = tasks.mqar_batch(8, train_hybrids.N_PAIRS, torch.Generator().manual_seed(1),
                                       **train_hybrids.RECALL)

    class Oracle(torch.nn.Module):  # the evaluation's positive control: logits that put the answer first
        def forward(self, x):
            return torch.nn.functional.one_hot(targets.clamp(min=0), 96).float()

    loss, accuracy, by_distance, per_row, per_row_far = train_hybrids.score_recall(Oracle(), tokens, targets)
    assert accuracy == 1.0 and by_distance == [1.0] * 4 and per_row == [1.0] * 8 and per_row_far == [1.0] * 8


def test_held_out_text_windows_share_their_edges():
    stream, windows = train_hybrids.text_data()
    assert windows.shape == (48, train_hybrids.EVAL_WINDOWS, train_hybrids.TEXT_LENGTH + 1)
    assert torch.equal(windows[:, 1:, 0], windows[:, :-1, -1])  # every byte of a passage predicted once
    assert stream.max() < train_hybrids.VOCAB_TEXT and len(stream) > 100_000


def test_one_short_run_returns_what_the_lesson_reads():
    threads = torch.get_num_threads()
    try:
        result = train_hybrids.run(("recall", "DDDW", 0, 2, None))  # sets one thread, as each run's process does
    finally:
        torch.set_num_threads(threads)
    assert {"accuracy", "by_distance", "per_row", "per_row_far", "loss", "lr"} <= set(result)
    assert len(result["per_row"]) == train_hybrids.EVAL_ROWS and result["lr"] == train_hybrids.TRAIN["recall"]["lr"]


def test_the_stored_runs_and_weights_match_the_tool():
    stored = json.loads(data_path("hybrid_runs.json").read_text())
    settings = stored["settings"]
    assert settings["window"] == train_hybrids.WINDOW and settings["recall"]["n_pairs"] == train_hybrids.N_PAIRS
    assert settings["patterns"] == list(train_hybrids.PATTERNS) and settings["model"] == train_hybrids.MODEL
    model = train_hybrids.build("recall", "DDDS", 0)
    model.load_state_dict(load_file(data_path(settings["weights"]["file"])))  # every tensor, every shape
