"""Holm's step-down correction against cases computed by hand."""

import numpy as np
import pytest

from course_lib.stats import holm


def test_textbook_case():
    # m = 4, sorted 0.01, 0.02, 0.03, 0.04: times 4, 3, 2, 1 -> 0.04, 0.06, 0.06, 0.04 -> monotone 0.04, 0.06,
    # 0.06, 0.06.
    assert np.allclose(holm([0.01, 0.02, 0.03, 0.04]), [0.04, 0.06, 0.06, 0.06])


def test_order_is_kept():
    # The same family shuffled: each adjusted p stays with its own test.
    assert np.allclose(holm([0.04, 0.01, 0.03, 0.02]), [0.06, 0.04, 0.06, 0.06])


def test_step_down_carries_the_maximum():
    # m = 3: 0.001 * 3 = 0.003; 0.04 * 2 = 0.08; 0.045 * 1 = 0.045, raised to 0.08 (it cannot pass where a
    # smaller p failed).
    assert np.allclose(holm([0.045, 0.001, 0.04]), [0.08, 0.003, 0.08])


def test_capped_at_one():
    # 0.3 * 3 = 0.9; 0.5 * 2 = 1.0; 0.9 * 1 = 0.9 -> raised to 1.0.
    assert np.allclose(holm([0.3, 0.5, 0.9]), [0.9, 1.0, 1.0])
    assert np.allclose(holm([0.6, 0.7]), [1.0, 1.0])  # 1.2 and 0.7 -> capped, then raised


def test_ties_and_a_single_test():
    assert np.allclose(holm([0.02, 0.02]), [0.04, 0.04])
    assert np.allclose(holm([0.03]), [0.03])  # a family of one: nothing to correct
    assert holm([]).shape == (0,)


def test_never_below_the_raw_p_and_monotone():
    rng = np.random.default_rng(0)
    p = rng.random(25) ** 3
    adjusted = holm(p)
    assert (adjusted >= p).all() and (adjusted <= 1).all()
    order = np.argsort(p)
    assert (np.diff(adjusted[order]) >= 0).all()  # monotone in the raw p
    assert (adjusted <= np.minimum(len(p) * p, 1) + 1e-15).all()  # never more conservative than Bonferroni


@pytest.mark.parametrize("bad", [[[0.1, 0.2]], [0.1, 1.2], [-0.1], [np.nan]])
def test_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="p_values"):
        holm(bad)
