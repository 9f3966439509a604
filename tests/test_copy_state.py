"""Notebook 11's copy-task runs: lesson 07's task with a wider state and with the delta rule."""

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

from course_lib import data_path, tasks
from course_lib.torch.causal_lm import CausalLM, generate

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import train_copy  # noqa: E402
import train_copy_state  # noqa: E402


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_greedy_copy_by_forward_passes_equals_stepwise_generation(attention):
    torch.manual_seed(0)
    model = CausalLM(11, 24, d_model=32, n_heads=2, n_layers=2, attention=attention).eval()
    prompt = tasks.copy_batch(6, 8, 10, torch.Generator().manual_seed(3))[:, :9]  # (6, 9): symbols, separator
    assert torch.equal(train_copy_state.greedy_copy(model, prompt, 8), generate(model, prompt, 8))


def test_a_perfect_copier_scores_one_and_an_off_by_one_copier_less():
    class Copier(torch.nn.Module):  # logits that pick the token `back(row)` positions behind
        def __init__(self, shift):
            super().__init__()
            self.shift = shift

        def forward(self, tokens):
            lengths = tasks.copy_lengths(tokens)  # the separator is always in the prompt
            source = (torch.arange(tokens.shape[1]) - lengths[:, None] + self.shift).clamp(0)  # (b, t)
            return torch.nn.functional.one_hot(tokens.gather(1, source), 11).float()

    tokens = tasks.copy_batch(16, 10, 10, torch.Generator().manual_seed(4), min_length=3)
    assert train_copy_state.greedy_accuracy(Copier(0), tokens) == 1.0
    assert train_copy_state.greedy_accuracy(Copier(1), tokens) < 0.5


def test_every_variant_is_lesson_07s_width_and_depth_and_states_are_as_stated():
    for variant, (family, _, _) in train_copy_state.VARIANTS.items():
        model = train_copy_state.build(variant, 0)
        assert model.embed.embedding_dim == train_copy.MODEL["d_model"]
        assert len(model.blocks) == train_copy.MODEL["n_layers"]
        if family != "causal_lm":  # the course's mixers report their state; elu + 1 keeps f = d features
            assert tasks.state_numbers(model) == train_copy.MODEL["n_layers"] * train_copy_state.state_numbers(variant)
    assert train_copy_state.state_numbers("DeltaNet, 4 heads") == 4 * 16 * 16  # lesson 07's state
    assert train_copy_state.state_numbers("elu+1 linear, 1 head") == 64 * 64


def test_a_run_stops_once_the_held_out_accuracy_is_reached(monkeypatch):
    monkeypatch.setattr(train_copy_state, "EVAL_EVERY", 2)
    monkeypatch.setattr(train_copy_state, "TEST_BATCH", 8)
    monkeypatch.setattr(train_copy_state, "STOP_ACCURACY", 0.0)
    threads = torch.get_num_threads()
    try:
        early = train_copy_state.run(("DeltaNet, 4 heads", 0, 6))
    finally:
        torch.set_num_threads(threads)
    assert early["stop"] == "accuracy" and early["step"] == [1, 2] and early["eval_step"] == [2]
    monkeypatch.setattr(train_copy_state, "STOP_ACCURACY", 1.1)
    try:
        full = train_copy_state.run(("DeltaNet, 4 heads", 0, 4))
    finally:
        torch.set_num_threads(threads)
    assert full["stop"] == "steps" and full["eval_step"] == [2, 4] and full["step"] == [1, 2, 3, 4]
    assert np.allclose(full["loss"][:2], early["loss"], rtol=1e-6)  # the early stop is the same run, cut short


def test_the_stored_runs_match_the_tool_and_replay():
    stored = json.loads(data_path("copy_state_runs.json").read_text())
    settings = stored["settings"]
    assert settings["task"] == train_copy.TASK and settings["train"] == train_copy.TRAIN
    assert settings["steps"] == train_copy.STEPS and settings["stop_accuracy"] == train_copy_state.STOP_ACCURACY
    assert set(stored["runs"]) == set(train_copy_state.VARIANTS)
    for variant, runs in stored["runs"].items():
        assert sorted(r["seed"] for r in runs) == list(train_copy.SEEDS)
        for run in runs:
            assert run["stop"] in ("accuracy", "steps") and 0 <= run["generated_accuracy"] <= 1
            assert (run["eval_accuracy"][-1] >= settings["stop_accuracy"]) == (run["stop"] == "accuracy")
            assert run["state"] == train_copy_state.state_numbers(variant)
    # the first steps of one stored run, trained again, give its logged losses (one thread, as stored)
    run = next(r for r in stored["runs"]["DeltaNet, 4 heads"] if r["seed"] == 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = train_copy_state.build("DeltaNet, 4 heads", 0)
        history = tasks.train_copy(model, steps=10, generator=torch.Generator().manual_seed(train_copy.batch_seed(0)),
                                   **train_copy.TASK, **train_copy.TRAIN)
    finally:
        torch.set_num_threads(threads)
    assert np.allclose(history["loss"], run["loss"][:10], rtol=0.02)
