"""Checks for the lesson 13 exercises (what a state can compute).

A construction exercise returns the inputs of one head (keys, values, β, …); the check runs them through
the library's recurrence and compares what the head *computes* — the answers it tracks at every position —
with the task's answers, so any right construction passes, not only the reference's.
"""

import copy
import dataclasses

import numpy as np

from course_lib.checks import Exercise, Mistake, run_check
from course_lib.numpy import delta

UNREADABLE = -1  # an answer the read-out cannot tell (an output near 0, or a transition that tracks no count)
NOT_LOCAL = -2  # 13.1: a head whose inputs at one position depend on the bits at other positions


def _rng(seed):
    return np.random.default_rng(seed)


@dataclasses.dataclass
class _Construction(Exercise):
    """An exercise whose answer is a construction: ``run`` turns a construction into what it computes.

    The reference construction, the learner's and each mistake are all run through the library by ``run``
    before the comparison, so any right construction passes.
    """

    run: object = None

    def _wrong(self, mistake, candidate):
        """What the mistake computes; for a slip recognised by the learner's answer (``fn.shows(answer, *case)``),
        the learner's own result when the answer to this case shows that slip."""
        shows = getattr(mistake.fn, "shows", None)
        if shows is None:
            return self.run(mistake.fn)

        def wrong(*args):
            if not shows(candidate(*copy.deepcopy(args)), *copy.deepcopy(args)):
                raise ValueError("not this slip")  # run_check skips a mistake that raises
            return self.run(candidate)(*args)
        return wrong

    def __call__(self, candidate, *, verbose=True):
        mistakes = tuple(Mistake(m.name, self._wrong(m, candidate), m.hint) for m in self.mistakes)
        return run_check(self.number, self.run(candidate), self.run(self.reference), self.cases(), names=self.names,
                         mistakes=mistakes, atol=self.atol, rtol=self.rtol, verbose=verbose)


# --- Exercise 13.1: one head that computes parity, from the empty state ------------------------
# The lesson starts its state at e₁e₁ᵀ (initial_state); here the state starts at zero, so the first
# token must also write.  The head's answer at t is read from o_t[0]: even above 0.25, odd below −0.25.

def _parity_head_reference(bits):
    """d = e = 1: token 1 writes ±1 (β = 1 overwrites the empty state), every later 1-bit reflects (β = 2)."""
    bits = np.asarray(bits)
    k = np.ones((*bits.shape, 1))  # (..., n, 1): one fixed unit key
    q = np.ones((*bits.shape, 1))
    v = np.zeros((*bits.shape, 1))
    beta = 2.0 * bits.astype(float)  # a reflection at every 1-bit, the identity at every 0-bit
    v[..., 0, 0] = 1.0 - 2.0 * bits[..., 0]  # the first token writes +1 (even) or −1 (odd) ...
    beta[..., 0] = 1.0  # ... by overwriting the empty state (β = 1: S ← S + k (v − kᵀS))
    return q, k, v, beta


def _is_local(construction, bits, inputs):
    """True when flipping bit j leaves (q, k, v, β) unchanged at every t ≠ j (checked at j = 0 and j = n/2).

    A head is a recurrence: token t's inputs may depend on token t alone.  Without this rule a head fed the
    answer (v_t = ±1 from the parity computed in Python, or the parity put into q) would pass.
    """
    bits = np.asarray(bits)
    n = bits.shape[-1]
    for j in sorted({0, n // 2}):
        flipped = bits.copy()
        flipped[..., j] = 1 - flipped[..., j]
        other = [np.asarray(x, np.float64) for x in construction(flipped)]
        keep = np.arange(n) != j
        for x, y in zip(inputs, other, strict=True):
            if x.shape != y.shape:
                return False
            if x.ndim >= bits.ndim:  # the position axis first: β is (..., n), q, k and v are (..., n, d)
                x, y = (np.moveaxis(z, bits.ndim - 1, 0) for z in (x, y))
                if not np.array_equal(x[keep], y[keep], equal_nan=True):
                    return False
    return True


def _run_parity(construction):
    """What a parity construction computes: the library's chunked float32 delta rule, read out at every position."""

    def computed(bits):
        inputs = [np.asarray(x, np.float64) for x in construction(np.array(bits, copy=True))]
        if not _is_local(construction, bits, inputs):
            return np.full(np.shape(bits), float(NOT_LOCAL))
        q, k, v, beta = (np.asarray(x, np.float32) for x in inputs)
        spoilt = np.zeros(beta.shape, np.float32)  # (..., n): a non-finite input at a position, shown there
        for x in (q, k, v, beta[..., None]):
            spoilt = spoilt + np.where(np.isfinite(x), 0, x).sum(axis=-1)
        q, k, v, beta = (np.where(np.isfinite(x), x, 0) for x in (q, k, v, beta))  # the library refuses NaN and inf
        out = delta.delta_rule_attention(q, k, v, beta)  # the default call: chunked, from the empty state
        first = out[..., 0]  # (..., n)
        read = np.where(first > 0.25, 0.0, np.where(first < -0.25, 1.0, UNREADABLE))
        return np.where(np.isfinite(spoilt), read, spoilt)
    return computed


def _parity_slip(*, first_beta=1.0, beta_one=2.0, beta_zero=0.0, value=0.0, first_write=True, first_sign="bit"):
    """The reference with one thing changed; ``first_sign``: the first write's sign from the first bit (``"bit"``),
    always +1 (``"fixed"``) or from the bit with odd positive (``"inverted"``)."""
    def head(bits):
        q, k, v, beta = _parity_head_reference(bits)
        bits = np.asarray(bits)
        beta = beta_one * bits + beta_zero * (1 - bits)
        v = np.full(v.shape, value)
        if first_write:
            signs = {"bit": 1.0 - 2.0 * bits[..., 0], "fixed": np.ones(bits.shape[:-1]),
                     "inverted": 2.0 * bits[..., 0] - 1.0}
            v[..., 0, 0] = signs[first_sign]
            beta[..., 0] = first_beta
        return q, k, v, beta
    return head


def _non_unit_keys(bits):
    """Keys of length 0.9 with β = 2: a step scales by 1 − β‖k‖² = −0.62 instead of reflecting (one instance of the
    slip; ``shows`` recognises any)."""
    q, k, v, beta = _parity_head_reference(bits)
    return q, 0.9 * k, v, beta


def _shows_non_unit_keys(construction, *case):
    """True when some later step (t ≥ 2, β > 0) has β‖k‖² ≠ 2 with a key that is not a unit vector."""
    _, k, _, beta = (np.asarray(x, np.float64) for x in construction)
    squared = np.sum(k[..., 1:, :] ** 2, axis=-1)  # (..., n − 1): ‖k_t‖² after the first token
    steps = beta[..., 1:] > 0
    off = (np.abs(beta[..., 1:] * squared - 2.0) > 0.01) & (np.abs(squared - 1.0) > 0.01)
    return bool(np.any(off & steps))


_non_unit_keys.shows = _shows_non_unit_keys


def _zero_query(bits):
    """q = 0: o_t = S_tᵀ q_t reads nothing (recognised by ``shows``)."""
    q, k, v, beta = _parity_head_reference(bits)
    return np.zeros_like(q), k, v, beta


_zero_query.shows = lambda construction, *case: not np.any(np.asarray(construction[0], np.float64))


def _faint_write(bits):
    """A first write of ±0.1: every output within ±0.25, where the read-out tells nothing (recognised by ``shows``)."""
    q, k, v, beta = _parity_head_reference(bits)
    return q, k, 0.1 * v, beta


def _shows_faint_outputs(construction, *case):
    """True when the head's outputs o_t[0] are finite, not all zero, and all within ±0.25."""
    q, k, v, beta = (np.asarray(x, np.float32) for x in construction)
    with np.errstate(all="ignore"):
        first = delta.delta_rule_attention(q, k, v, beta)[..., 0]
    largest = float(np.max(np.abs(first)))
    return bool(np.all(np.isfinite(first))) and 0 < largest <= 0.25


_faint_write.shows = _shows_faint_outputs


def _parity_from_the_answer(bits):
    """The loophole the locality rule closes: β = 1 everywhere, overwriting with v = ±1 from the true parity."""
    bits = np.asarray(bits)
    ones = np.ones((*bits.shape, 1))
    parity = np.cumsum(bits, axis=-1) % 2
    return ones, ones, (1.0 - 2.0 * parity)[..., None], np.ones(bits.shape)


MISTAKES_13_1 = (
    Mistake("zero-query", _zero_query,
            "your query is zero: o_t = S_tᵀ q_t reads nothing, whatever the state holds. Read along the key that "
            "the 1-bits reflect."),
    Mistake("too-faint-to-read", _faint_write,
            "your head's outputs are not zero, but all lie within ±0.25, where the read-out cannot tell even from "
            "odd: write a larger first value (or read with a longer query)."),
    Mistake("empty-state", _parity_slip(first_write=False),
            "every output is 0: nothing in the state lies along the key your query reads and your 1-bits "
            "reflect. The state starts at zero and a reflection of zero is zero, so the first write must put "
            "something along that key before the first reflection."),
    Mistake("beta-one", _parity_slip(beta_one=1.0),
            "β = 1 is a projection, not a reflection: I − k kᵀ has the eigenvalue 0 along k, so a 1-bit erases "
            "the state instead of flipping its sign. β = 2 gives the eigenvalue −1."),
    Mistake("every-token-reflects", _parity_slip(beta_zero=2.0),
            "a 0-bit must leave the state alone (β = 0: the identity); reflecting at every token counts the "
            "length's parity, not the 1s'."),
    Mistake("writes-a-value", _parity_slip(value=1.0),
            "a reflection must write nothing: with v ≠ 0 the update adds β k vᵀ and the state drifts "
            "(S ← −S + 2v), so it stops flipping. Use v = 0 after the first token."),
    Mistake("first-write-ignores-the-first-bit", _parity_slip(first_sign="fixed"),
            "every sequence that starts with a 1 has every answer flipped: the first token writes the state and is "
            "also the first bit, so its write must already hold that bit's parity."),
    Mistake("inverted-read-out", _parity_slip(first_sign="inverted"),
            "every answer is the opposite parity: the read-out takes o_t[0] above 0.25 as even and below −0.25 as "
            "odd. Flip the sign of the first write (or of the query)."),
    Mistake("non-unit-keys", _non_unit_keys,
            "a step multiplies the state along k by 1 − β‖k‖², which is −1 only when β‖k‖² = 2: with keys that are "
            "not unit vectors β = 2 scales the state instead of reflecting it (the library warns above 2). Use "
            "unit keys, or β = 2/‖k‖²."),
    Mistake("reads-the-answer", _parity_from_the_answer,
            "−2 means: flipping one bit j changed your q, k, v or β at another position t ≠ j. A head sees one "
            "token at a time: its inputs at t may depend on bit t only, so the parity must come from the "
            "recurrence, not from Python (no cumsum, no parity of the prefix)."),
)


def _cases_13_1():
    cases = []
    for description, seed, shape in (("n = 1,000 random bits", 131, (1000,)),
                                     ("n = 1,000, first bit 1", 132, (1000,)),
                                     ("a batch of 3 sequences of 1,000 bits", 133, (3, 1000))):
        bits = _rng(seed).integers(0, 2, size=shape)
        if "first bit 1" in description:
            bits[0] = 1
        cases.append((description, (bits,), {}))
    return cases


exercise_13_1 = _Construction("13.1", "one head that computes parity, from the empty state",
                              _parity_head_reference, _cases_13_1, MISTAKES_13_1,
                              names=("parity (−1: unreadable, |o| < 0.25)",), atol=0, rtol=0, run=_run_parity)


# --- Exercise 13.2: the fewest reflections a token that count mod m ----------------------------
# A 2-dimensional state, DeltaProduct with n_h steps a token: token 1 applies the learner's n_h
# generalised Householder matrices, token 0 the identity (β = 0).  The state after c ones is M^c, with
# M the product; the check decodes each position's count as the nearest M^j, j < m.

def _cyclic_reference(m):
    """m = 2: one reflection (order 2). m ≥ 3: two reflections whose mirrors are π/m apart (a rotation by 2π/m)."""
    if m == 2:
        return np.array([[1.0, 0.0]]), np.array([2.0])
    angles = np.array([0.0, np.pi / m])
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])  # (2, 2), (2,)


def _transition(keys, beta):
    """The product (I − β_{n_h} k k ᵀ) ⋯ (I − β_1 k kᵀ) of one token's steps, the first step applied first."""
    M = np.eye(keys.shape[-1])
    for k, b in zip(keys, beta, strict=True):
        M = (np.eye(len(k)) - b * np.outer(k, k)) @ M
    return M


def _diagnostic(M):
    """``[spectral radius, order]`` of a token's transition M: the order is the least j ≤ 12 with Mʲ = I, else 0."""
    radius = float(np.abs(np.linalg.eigvals(M)).max())
    order = next((j for j in range(1, 13) if np.allclose(np.linalg.matrix_power(M, j), np.eye(len(M)), atol=1e-6)),
                 0)
    return np.array([round(radius, 2), float(order)])


def _run_cyclic(construction):
    """``(n_h, counts, [spectral radius, order])``: the construction's steps a token, the counts mod m it tracks
    on 300 random bits, and its transition's spectral radius and order (a count mod m needs radius 1, order m)."""

    def computed(m):
        keys, beta = (np.asarray(x, np.float64) for x in construction(m))
        if keys.ndim != 2 or beta.shape != keys.shape[:1]:
            raise ValueError(f"expected keys (n_h, d) and beta (n_h,), got {keys.shape} and {beta.shape}")
        n_h, d = keys.shape
        bits = _rng(140 + m).integers(0, 2, size=300)
        steps = np.concatenate([keys.ravel(), beta])
        if not np.isfinite(steps).all():  # no transition to run: report the first non-finite value in place of n_h
            return np.array(steps[~np.isfinite(steps)][0]), np.full(len(bits), UNREADABLE), np.full(2, np.nan)
        n = len(bits)
        steps_k = np.broadcast_to(keys, (n, n_h, d)).reshape(n * n_h, d)  # token 1's steps at every token ...
        steps_b = (bits[:, None] * beta[None, :]).reshape(n * n_h)  # ... with β = 0 (the identity) at token 0
        rows = np.broadcast_to(np.eye(d)[:, None, :], (d, n, d))  # (d, n, d): query e_i reads row i of S_t
        k_all, b_all = np.broadcast_to(steps_k, (d, n * n_h, d)), np.broadcast_to(steps_b, (d, n * n_h))
        out = delta.delta_product_attention(rows.astype(np.float32), k_all.astype(np.float32),
                                            np.zeros((d, n * n_h, d), np.float32), b_all.astype(np.float32),
                                            n_householder=n_h, initial_state=np.eye(d, dtype=np.float32))
        states = np.swapaxes(out, 0, 1)  # (n, d, d): S_t, the library's chunked float32 recurrence
        M = _transition(keys, beta)
        powers = np.stack([np.linalg.matrix_power(M, j) for j in range(m)])  # (m, d, d)
        faithful = np.allclose(np.linalg.matrix_power(M, m), np.eye(d), atol=1e-6) and all(
            np.abs(powers[i] - powers[j]).max() > 0.1 for i in range(m) for j in range(i))
        if not faithful:  # M^m ≠ I, or two counts share a state: no read-out can tell the counts apart
            return np.array(float(n_h)), np.full(n, UNREADABLE), _diagnostic(M)
        gaps = np.abs(states[:, None] - powers[None]).max(axis=(-1, -2))  # (n, m)
        counts = gaps.argmin(axis=1)
        return np.array(float(n_h)), counts, _diagnostic(M)
    return computed


def _one_reflection(m):
    angle = np.pi / m
    return np.array([[np.cos(angle), np.sin(angle)]]), np.array([2.0])


def _full_angle(m):
    angles = np.array([0.0, 2 * np.pi / m])
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])


def _projections(m):
    keys, _ = _cyclic_reference(max(m, 3))
    return keys, np.array([1.0, 1.0])


_projections.shows = lambda construction, *case: np.allclose(np.asarray(construction[1], float), 1.0, atol=0.05)


def _degrees(m):
    """Mirrors 180/m apart, in degrees where radians are meant: any failure no other slip explains."""
    angles = np.array([0.0, 180.0 / m])
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1), np.array([2.0, 2.0])


_degrees.shows = lambda construction, *case: True  # the last resort: the diagnostic above says what the transition does


def _padded(m):
    keys, beta = _cyclic_reference(m)
    return np.concatenate([keys, [[1.0, 0.0]]]), np.concatenate([beta, [0.0]])  # a third step that does nothing


MISTAKES_13_2 = (
    Mistake("one-reflection", _one_reflection,
            "one reflection is its own inverse (H² = I): it tracks a count mod 2 at most. A rotation by 2π/m with "
            "m ≥ 3 has the eigenvalues e^{±2πi/m}, not real, and a reflection's are real: it takes two."),
    Mistake("mirrors-at-the-full-angle", _full_angle,
            "two reflections whose mirrors are φ apart rotate by 2φ: mirrors 2π/m apart rotate by 4π/m, which "
            "for an even m comes back to the start after m/2 ones. Put the mirrors π/m apart."),
    Mistake("projections", _projections,
            "β = 1 makes each step a projection (eigenvalue 0 along k): the state collapses. Reflections need "
            "β = 2."),
    Mistake("not-the-fewest", _padded,
            "your steps track the count, but fewer steps do: for m = 2 one reflection has order 2. The fewest "
            "steps a token: 1 for m = 2, 2 for every m ≥ 3."),
    Mistake("not-order-m", _degrees,
            "the transition printed above needs spectral radius 1 and order m (Mᵐ = I, no smaller power): unit "
            "keys (a reflection needs kᵀk = 1, keys as the rows of an (n_h, d) array), β = 2, and mirrors π/m "
            "apart in radians."),
)


def _cases_13_2():
    return [(f"m = {m}, 300 random bits", (m,), {}) for m in (3, 2, 5, 6)]


exercise_13_2 = _Construction("13.2", "the fewest reflections a token that count mod m",
                              _cyclic_reference, _cases_13_2, MISTAKES_13_2,
                              names=("n_h", "count mod m at every position",
                                     "the transition: [spectral radius, order (0: none ≤ 12)]"),
                              atol=0, rtol=0, run=_run_cyclic)


# --- Exercise 13.3: which transitions can track parity -----------------------------------------
# For each family, the learner answers whether a one-layer recurrence of that family can track parity
# at any length, and the most negative real part an eigenvalue of its transition can reach.

FAMILIES = ("linear attention (S ← S + k vᵀ)", "decay or gate, a ∈ (0, 1] (RetNet, Mamba-2, GLA)",
            "delta rule, β ∈ [0, 1] (DeltaNet)", "gated delta rule, β ∈ [0, 1] (Gated DeltaNet)",
            "DeltaProduct, n_h = 2, β ∈ [0, 1]", "delta rule, β ∈ [0, 2]",
            "complex diagonal, e^{iθ} (Mamba-3's rotary state)", "complex diagonal, e^{iθ} with θ ∈ [0, π/3]")
_ANSWERS = dict(zip(FAMILIES, ((False, 1.0), (False, 0.0), (False, 0.0), (False, 0.0), (False, 0.0), (True, -1.0),
                               (True, -1.0), (True, 0.5)), strict=True))


def _families_reference(family):
    """``(can_track, lowest)``: can it track parity, and the lowest real part of an eigenvalue it can reach."""
    can, lowest = _ANSWERS[family]
    return np.array(can), np.array(lowest)


def _families_slip(wrong):
    def answer(family):
        can, lowest = _ANSWERS[family]
        key = FAMILIES.index(family)
        return (np.array(wrong[key][0]), np.array(wrong[key][1])) if key in wrong else (np.array(can),
                                                                                        np.array(lowest))
    return answer


MISTAKES_13_3 = (
    Mistake("a-gate-can-flip", _families_slip({1: (True, 0.0)}),
            "a decay a ∈ (0, 1] only shrinks the state: its eigenvalues are real and ≥ 0, so on a run of 1s the "
            "state converges instead of alternating. Gates forget; they do not flip signs."),
    Mistake("a-decay-reaches-minus-one", _families_slip({1: (True, -1.0)}),
            "a = exp(log a) with log a ≤ 0 lies in (0, 1]: no decay is negative."),
    Mistake("products-of-projections-flip", _families_slip({4: (True, -1.0)}),
            "with β ∈ [0, 1] each factor I − β k kᵀ is symmetric with eigenvalues in [0, 1] (positive "
            "semi-definite), and a product of two such matrices has real eigenvalues ≥ 0: more steps a token "
            "make rotations possible only with β above 1."),
    Mistake("negative-is-unstable", _families_slip({5: (False, -1.0)}),
            "β = 2 with a unit key gives the eigenvalue 1 − β = −1: a reflection, norm-preserving and stable "
            "(|λ| ≤ 1 for every β in [0, 2]). It flips the sign at every 1-bit: parity."),
    Mistake("rotation-cannot-flip", _families_slip({6: (False, 1.0)}),
            "e^{iθ} with θ = π is −1: a rotation by half a turn flips the sign (Mamba-3's complex state tracks "
            "parity, and counts mod m with θ = 2π/m)."),
    Mistake("linear-attention-lowest-zero", _families_slip({0: (False, 0.0)}),
            "linear attention's transition is the identity: every eigenvalue is 1 (it only adds)."),
    Mistake("rotation-stays-right-of-zero", _families_slip({6: (True, 0.0)}),
            "e^{iθ} has real part cos θ, and θ may be any angle: θ = π gives −1."),
    Mistake("products-of-projections-track", _families_slip({4: (True, 0.0)}),
            "with β ∈ [0, 1] a product of two steps I − β k kᵀ has real eigenvalues in [0, 1]: on a run of 1s "
            "the state still settles, whatever the number of steps."),
    Mistake("delta-lowest-minus-two", _families_slip({5: (True, -2.0)}),
            "the eigenvalue along a unit key is 1 − β, not 1 − 2β: with β ≤ 2 it reaches −1, no lower."),
    Mistake("gated-delta-lowest-minus-one", _families_slip({3: (False, -1.0)}),
            "a gate a ∈ (0, 1] times I − β k kᵀ with β ∈ [0, 1]: every eigenvalue is a product of two numbers "
            "in [0, 1], so the lowest is 0."),
    Mistake("small-angle-cannot-track", _families_slip({7: (False, 0.5)}),
            "the criterion is not a negative real part: e^{iπ/3} has |λ| = 1 and lies off [0, ∞), so the state "
            "cycles with period 6 and never settles — and the count mod 6 holds the parity. Grazzi et al.'s "
            "Theorem 1 rules out only eigenvalues in [0, ∞)."),
)


def _answer_slip(families, part, example):
    """A slip recognised by the learner's answer for one of ``families`` (``shows``): ``part="verdict"`` the
    can-track answer is wrong; ``part="lowest"`` it is right and the lowest real part is not.  Called, it
    answers as ``_families_slip(example)``: one instance of the slip."""
    def shows(answer, family):
        if family not in families:
            return False
        can, lowest = _ANSWERS[family]
        verdict_right = bool(np.asarray(answer[0])) == can
        if part == "verdict":
            return not verdict_right
        return verdict_right and abs(float(np.asarray(answer[1])) - lowest) > 1e-9
    slip = _families_slip(example)
    slip.shows = shows
    return slip


SETTLING = FAMILIES[:5]  # every eigenvalue real and in [0, 1]
MISTAKES_13_3 += (
    Mistake("settling-family-tracks", _answer_slip(SETTLING, "verdict", {2: (True, 0.0)}),
            "every transition of this family has real eigenvalues in [0, 1] (decays, steps I − β k kᵀ with β ≤ 1, "
            "and their products): on a run of 1s the state moves monotonically along each eigenvector and settles, "
            "so no read-out alternates beyond the lengths it was fitted on (Theorem 1, §13.2)."),
    Mistake("cycling-family-cannot-track", _answer_slip(FAMILIES[5:], "verdict", {5: (False, 0.0)}),
            "this family reaches an eigenvalue off [0, ∞) — negative (a reflection) or complex with |λ| = 1 (a "
            "rotation) — so a run of 1s can make the state cycle instead of settle; a cycle of even length holds "
            "the parity."),
    Mistake("lowest-linear-attention", _answer_slip(FAMILIES[:1], "lowest", {0: (False, 0.5)}),
            "linear attention's transition is the identity: every eigenvalue is 1 (it only adds)."),
    Mistake("lowest-decay", _answer_slip(FAMILIES[1:2], "lowest", {1: (False, -1.0)}),
            "the eigenvalues of Diag(a) are the decays a = exp(log a), log a ≤ 0: how low can a number in (0, 1] "
            "go, and can it be negative?"),
    Mistake("lowest-delta-beta-one", _answer_slip(FAMILIES[2:3], "lowest", {2: (False, -1.0)}),
            "along a unit key I − β k kᵀ has the eigenvalue 1 − β (every other eigenvalue is 1): take the lowest "
            "over β ∈ [0, 1]."),
    Mistake("lowest-gated-delta", _answer_slip(FAMILIES[3:4], "lowest", {3: (False, 1.0)}),
            "a gate a ∈ (0, 1] times I − β k kᵀ with β ∈ [0, 1]: each eigenvalue is a product of two numbers in "
            "[0, 1]."),
    Mistake("lowest-deltaproduct-beta-one", _answer_slip(FAMILIES[4:5], "lowest", {4: (False, -1.0)}),
            "each step I − β k kᵀ with β ≤ 1 is positive semi-definite, and a product of two such matrices has real "
            "eigenvalues ≥ 0; a projection (β = 1) reaches the bottom of that range."),
    Mistake("lowest-delta-beta-two", _answer_slip(FAMILIES[5:6], "lowest", {5: (True, 0.0)}),
            "along a unit key I − β k kᵀ has the eigenvalue 1 − β: take the lowest over β ∈ [0, 2]."),
    Mistake("lowest-rotation", _answer_slip(FAMILIES[6:7], "lowest", {6: (True, 1.0)}),
            "e^{iθ} has real part cos θ, and θ may be any angle."),
    Mistake("lowest-small-angle", _answer_slip(FAMILIES[7:], "lowest", {7: (True, 1.0)}),
            "e^{iθ} has real part cos θ, which falls as θ grows from 0 to π/3: the lowest is at the end of the range, "
            "not at 0 or −1."),
)


def _cases_13_3():
    return [(family, (family,), {}) for family in FAMILIES]


exercise_13_3 = _Construction("13.3", "which transitions can track parity", _families_reference, _cases_13_3,
                              MISTAKES_13_3, names=("can track parity", "lowest real part of an eigenvalue"), atol=1e-9,
                              rtol=0, run=lambda answers: answers)  # the answers are what is compared

EXERCISES = [exercise_13_1, exercise_13_2, exercise_13_3]
