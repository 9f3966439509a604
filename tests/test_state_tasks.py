"""The state-tracking tasks of notebook 13: every answer is the automaton's state after its prefix."""

import itertools

import numpy as np
import pytest

from course_lib import state_tasks


def test_s3_has_six_elements_and_a_group_table():
    assert len(set(state_tasks.S3)) == 6 and state_tasks.S3[0] == (0, 1, 2)
    table = state_tasks.COMPOSE
    assert all(sorted(row) == list(range(6)) for row in table)  # a Latin square: every element once a row
    assert all(sorted(col) == list(range(6)) for col in table.T)
    for a, b, c in itertools.product(range(6), repeat=3):  # associative
        assert table[table[a, b], c] == table[a, table[b, c]]
    assert any(table[a, b] != table[b, a] for a, b in itertools.product(range(6), repeat=2))  # not abelian


def test_parity_and_counting_by_hand():
    bits = np.array([1, 0, 1, 1, 0, 1, 1])
    assert state_tasks.parity_answers(bits).tolist() == [1, 1, 0, 1, 1, 0, 1]
    assert state_tasks.count_mod_answers(bits, 3).tolist() == [1, 1, 2, 0, 0, 1, 2]


def test_s3_answers_compose_later_after_earlier():
    swap01, cycle = state_tasks.S3.index((1, 0, 2)), state_tasks.S3.index((1, 2, 0))
    got = state_tasks.s3_answers(np.array([swap01, cycle]))
    assert state_tasks.S3[got[0]] == (1, 0, 2)
    assert state_tasks.S3[got[1]] == state_tasks.compose((1, 2, 0), (1, 0, 2)) == (2, 1, 0)


@pytest.mark.parametrize("task", state_tasks.TASKS)
def test_every_prefix_is_answered_as_a_sequence_of_its_own(task):
    rng = np.random.default_rng(0)
    tokens, answers = state_tasks.sample(task, 4, 30, rng, m=5)
    symbols, classes = state_tasks.sizes(task, 5)
    assert tokens.shape == answers.shape == (4, 30) and tokens.dtype == answers.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < symbols and answers.max() < classes
    for t in (1, 7, 30):  # causal: a prefix's answers are the answers of the prefix
        assert np.array_equal(state_tasks.answers(task, tokens[:, :t], 5), answers[:, :t])


def test_parity_equals_counting_mod_two():
    bits = np.random.default_rng(1).integers(0, 2, (3, 50))
    assert np.array_equal(state_tasks.parity_answers(bits), state_tasks.count_mod_answers(bits, 2))


def test_accuracy_by_length_bins_positions():
    target = np.zeros((2, 8), np.int64)
    predicted = target.copy()
    predicted[:, 4:] = 1  # wrong beyond position 4
    assert state_tasks.accuracy_by_length(predicted, target, (0, 4, 6, 8)) == [1.0, 0.0, 0.0]
    predicted[0, 5] = 0
    assert state_tasks.accuracy_by_length(predicted, target, (0, 4, 8)) == [1.0, 0.125]


def test_unknown_task_is_named():
    with pytest.raises(ValueError, match="task must be one of"):
        state_tasks.sizes("s5")


def test_the_learning_rate_of_a_cell_is_chosen_on_the_training_length_only():
    def run(lr, seed, val, beyond):
        return dict(task="parity", mixer="deltanet", lr=lr, seed=seed, val_accuracy=val, accuracy=[1.0, beyond])

    runs = [run(1e-2, 0, [0.5, 1.0], 0.5), run(1e-2, 1, [1.0, 1.0], 0.5),  # 0.875: best at the training length
            run(3e-3, 0, [1.0, 0.9], 1.0), run(3e-3, 1, [0.6, 0.7], 1.0)]  # 0.8 there, however good beyond it
    scores = state_tasks.learning_rate_scores(runs, last=2)
    assert scores == {("parity", "deltanet"): {3e-3: pytest.approx(0.8), 1e-2: pytest.approx(0.875)}}
    assert state_tasks.best_learning_rates(runs, last=2) == {("parity", "deltanet"): 1e-2}


def test_a_tie_goes_to_the_smaller_learning_rate():
    runs = [dict(task="mod", mixer="gate", lr=lr, val_accuracy=[1.0]) for lr in (1e-2, 1e-3, 3e-3)]
    assert state_tasks.best_learning_rates(runs) == {("mod", "gate"): 1e-3}
