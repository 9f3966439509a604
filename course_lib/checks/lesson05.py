"""Checks for the lesson 05 exercises (Linformer parameter sharing)."""

import numpy as np

from course_lib.checks import Exercise, Mistake, run_check, to_numpy

# --- Exercise 5.1: share E and F across layers inside the PyTorch modules -----------------


def _encoder(n_layers, n_heads, max_len, k, seed):
    """A seeded headwise ``LinformerEncoder`` (width 8 · heads, vocabulary 8): the exercise's input."""
    import torch

    from course_lib.torch.linformer import LinformerEncoder

    torch.manual_seed(seed)
    return LinformerEncoder(n_layers, 8 * n_heads, n_heads, max_len, k, "headwise", vocab_size=8)


def _tie(model, source_of):
    """Give every layer the projections ``source_of(model, layer, name)`` (the same Parameter object)."""
    for layer in model.layers:
        for name in ("E", "F"):
            setattr(layer.attention, name, source_of(model, layer, name))
    return model


def _share_reference(model):
    return _tie(model, lambda m, layer, name: getattr(m.layers[0].attention, name))


def summarise(model):
    """What the check compares: distinct E/F matrices, parameter count, output and gradient of one batch.

    The gradient of E in the first layer after one backward pass tells a shared Parameter (it
    gathers the gradient of every layer) from equal copies (only its own layer's).
    """
    import torch

    from course_lib.torch.linformer import distinct_projection_matrices

    tokens = torch.randint(0, 8, (2, model.layers[0].attention.max_len), generator=torch.Generator().manual_seed(0))
    model.zero_grad()
    out = model(tokens)  # (b, n, vocab)
    out.square().sum().backward()
    grad = model.layers[0].attention.E.grad
    return (distinct_projection_matrices(model), sum(p.numel() for p in model.parameters()), out.detach(),
            grad.detach())


def _copy_values(model):
    import torch

    def source_of(m, layer, name):
        return torch.nn.Parameter(getattr(m.layers[0].attention, name).detach().clone())
    return _tie(model, source_of)


def _one_matrix(model):
    return _tie(model, lambda m, layer, name: m.layers[0].attention.E)


def _keys_only(model):
    return _tie(model, lambda m, layer, name: m.layers[0].attention.E
                if name == "E" else layer.attention.F)


def _last_layer(model):
    return _tie(model, lambda m, layer, name: getattr(m.layers[-1].attention, name))


MISTAKES_5_1 = (
    Mistake("copied-values", _copy_values,
            "the layers hold EQUAL copies, not one shared matrix: a new nn.Parameter (or .data.copy_) makes "
            "a separate tensor that training moves apart. Assign the same Parameter object: "
            "layer.attention.E = model.layers[0].attention.E."),
    Mistake("one-matrix", _one_matrix,
            "that is layerwise sharing (one matrix serves as every E and every F). Keep keys and values apart: "
            "every layer's E is layer 1's E, every layer's F is layer 1's F — 2 matrices in all."),
    Mistake("keys-only", _keys_only,
            "only E is shared: every layer still has its own F. Tie F to layer 1's F as well."),
    Mistake("last-layer", _last_layer,
            "the layers share the LAST layer's matrices; the exercise asks for layer 1's "
            "(model.layers[0]), whose values every layer then uses."),
)


def _cases_5_1():
    return [(f"{L} layers, {h} heads, n = {n}, k = {k}", (_encoder(L, h, n, k, seed),), {})
            for L, h, n, k, seed in ((2, 2, 8, 4, 0), (3, 1, 6, 2, 1), (4, 2, 5, 5, 2))]


class _ModelExercise(Exercise):
    """An exercise whose answer is a model: the check compares ``summarise`` of it."""

    def __call__(self, candidate, *, verbose=True):
        def wrap(fn):
            return lambda *args, **kwargs: summarise(fn(*args, **kwargs))
        mistakes = [Mistake(m.name, wrap(m.fn), m.hint) for m in self.mistakes]
        return run_check(self.number, wrap(candidate), wrap(self.reference), self.cases(), names=self.names,
                         mistakes=mistakes, atol=self.atol, rtol=self.rtol, verbose=verbose)


exercise_5_1 = _ModelExercise("5.1", "share E and F across the layers", _share_reference, _cases_5_1,
                              MISTAKES_5_1, names=("distinct matrices", "parameters", "output",
                                                   "gradient of layer 1's E"), atol=1e-5, rtol=1e-4)


# --- Exercise 5.2: a Linformer that is exact for attention on a fixed set of positions -------
# The learner derives E from the idea: if every row of P is non-zero only on k fixed key positions
# (the lookup task's table), a projection that SELECTS those positions makes E K and F V exactly
# those keys and values, and Eq. (4.4) is then exact attention restricted to them — at every n.
# The rows may come in any order, so the check compares E with its rows sorted by position, and
# the output of Linformer with E = F against exact attention that sees only those keys.

def exact_projection(support, n):
    """``(k, n)``, k = len(support): row i selects key position ``support[i]`` (0-based), so E K = K[support]."""
    support = sorted(int(j) for j in support)
    E = np.zeros((len(support), n))
    E[np.arange(len(support)), support] = 1.0
    return E


def _qkv(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 3, n, c)) for c in (8, 8, 5))  # (b, h, n, d), (b, h, s, d), (b, h, s, e)


def _by_position(E):
    """E with its rows in the order of the position each row weighs most (the answer's rows may come in any order)."""
    return E[np.argsort(np.argmax(np.abs(E), axis=-1), kind="stable")]


def _selecting(fn):
    """What the check compares: E (rows by position) and Linformer's output with E = F on batched inputs."""
    def result(support, n):
        from course_lib.numpy import linformer

        E = to_numpy(fn(support, n))
        q, k, v = _qkv(n, seed=n)
        if E.ndim != 2 or E.shape[-1] != n or not np.all(np.isfinite(E)):
            return E, np.empty(0)  # nothing to compute with: the message says what is wrong with E
        return _by_position(E), linformer.linformer_attention(q, k, v, E, E)  # (b, h, n, e)
    return result


def _mean_pooling(support, n):
    from course_lib.numpy.linformer import mean_pooling

    return mean_pooling(len(support), n)


def _averaging(support, n):
    return exact_projection(support, n) / len(support)


def _complement(support, n):
    return exact_projection([j for j in range(n) if j not in set(support)], n)


def _one_mixture(support, n):
    return exact_projection(support, n).sum(axis=0, keepdims=True)  # (1, n)


def _transposed(support, n):
    return exact_projection(support, n).T  # (n, k)


MISTAKES_5_2 = (
    Mistake("mean-pooling", _mean_pooling,
            "mean pooling averages blocks of consecutive positions, the table's and everybody else's: the projected "
            "keys are then averages that no query asked for. Each row of E must pick ONE of the support positions."),
    Mistake("rows-average", _averaging,
            "each row picks one position with weight 1, not 1/k: E K scales the keys, and so the scores, and F V "
            "scales the values; exact attention sees the keys and values as they are."),
    Mistake("complement", _complement,
            "you selected the positions OUTSIDE the support: select exactly the positions in `support`."),
    Mistake("one-mixture", _one_mixture,
            "one row that sums the support gives ONE projected key: the softmax over k = 1 column has nothing to "
            "choose. Give every support position its own row (k = len(support))."),
    Mistake("transposed", _transposed,
            "E has shape (k, n): one row per projected key, one column per position, so that E K is (k, d)."),
)


def _cases_5_2():
    return [("support {0, 1, 2, 3} of n = 8 (a table at the start)", ([0, 1, 2, 3], 8), {}),
            ("support {2, 5, 9} of n = 12", ([2, 5, 9], 12), {}),
            ("support {7, 0, 20, 3, 31} of n = 32, not sorted", ([7, 0, 20, 3, 31], 32), {})]


def _exact_on_support(support, n):
    """The truth the check is built on: exact attention that sees only the support's keys."""
    from course_lib.numpy.full import softmax_attention

    q, k, v = _qkv(n, seed=n)
    mask = np.isin(np.arange(n), support)  # (s,) True on the support
    return softmax_attention(q, k, v, key_mask=mask)


class _SupportExercise(Exercise):
    """Exercise 5.2's check: rows in any order pass; the output must be exact attention on the support."""

    def __call__(self, candidate, *, verbose=True):
        mistakes = [Mistake(m.name, _selecting(m.fn), m.hint) for m in self.mistakes]
        return run_check(self.number, _selecting(candidate), _selecting(self.reference), self.cases(),
                         names=self.names, mistakes=mistakes, atol=self.atol, rtol=self.rtol, verbose=verbose)


exercise_5_2 = _SupportExercise("5.2", "a Linformer that is exact on a fixed set of positions", exact_projection,
                                _cases_5_2, MISTAKES_5_2, names=("E, rows in order of position", "Linformer output"))


# --- Exercise 5.3: when has a training run converged? (the rule of tools/train_sharing.py) -


def plateau_stop(steps, losses, *, window, tol, min_steps):
    """``(stop step, converged)``: the first evaluation at which the best loss fell by < tol over the window.

    ``steps`` are the evenly spaced steps at which the held-out loss ``losses`` was measured; the
    test runs at every evaluation from ``min_steps`` on and compares the best loss up to ``t -
    window`` with the best loss up to ``t``.  Without a plateau: ``(steps[-1], False)``.  ``window`` is
    a whole number of evaluation intervals (as in tools/train_sharing.py), so ``t - window`` is an
    evaluation step and "up to t - window" and "window // interval evaluations back" are one rule.
    """
    per_window = window // (steps[1] - steps[0])
    for i, t in enumerate(steps):
        if t >= min_steps and i >= per_window and min(losses[:i + 1 - per_window]) - min(losses[:i + 1]) < tol:
            return t, True
    return steps[-1], False


def _last_not_best(steps, losses, *, window, tol, min_steps):
    per_window = window // (steps[1] - steps[0])
    for i, t in enumerate(steps):
        if t >= min_steps and i >= per_window and losses[i - per_window] - losses[i] < tol:
            return t, True
    return steps[-1], False


def _relative(steps, losses, *, window, tol, min_steps):
    per_window = window // (steps[1] - steps[0])
    for i, t in enumerate(steps):
        best_before, best = min(losses[:i + 1 - per_window] or [np.inf]), min(losses[:i + 1])
        if t >= min_steps and i >= per_window and (best_before - best) / best < tol:
            return t, True
    return steps[-1], False


def _strict(steps, losses, *, window, tol, min_steps):
    per_window = window // (steps[1] - steps[0])
    for i, t in enumerate(steps):
        if t >= min_steps and i > per_window and min(losses[:i - per_window]) - min(losses[:i + 1]) < tol:
            return t, True
    return steps[-1], False


def _no_min_steps(steps, losses, *, window, tol, min_steps):
    return plateau_stop(steps, losses, window=window, tol=tol, min_steps=0)


def _window_in_evaluations(steps, losses, *, window, tol, min_steps):
    return plateau_stop(steps, losses, window=window * (steps[1] - steps[0]), tol=tol, min_steps=min_steps)


MISTAKES_5_3 = (
    Mistake("last-not-best", _last_not_best,
            "you compared two single evaluations (the loss now and one window ago); one noisy evaluation can "
            "rise or fall by more than tol. Compare the BEST loss up to t − window with the best loss up to t."),
    Mistake("relative-tol", _relative,
            "tol is an absolute fall in nats (cross-entropy), not a fraction of the loss: near a loss of 0.01 "
            "a relative test never passes, near 2 it passes on a real fall."),
    Mistake("no-min-steps", _no_min_steps,
            "a run first sits on the plateau of guessing (loss ≈ ln 8 ≈ 2.08) before it learns: never stop "
            "before min_steps."),
    Mistake("window-in-evaluations", _window_in_evaluations,
            "window is in training steps; with an evaluation every steps[1] − steps[0] steps, t − window is "
            "window // (steps[1] − steps[0]) evaluations back."),
    Mistake("strict-window", _strict,
            "t′ ≤ t − window includes the evaluation at step t − window itself: the best loss before the window is "
            "min(losses[:i + 1 − w]) with w = window // (steps[1] − steps[0]), not min(losses[:i − w])."),
)


def _curve(seed, *, stall, floor, rate, noise, n_evals=40, every=100):
    """A synthetic held-out loss: a plateau at ln 8 for ``stall`` steps, then decay to ``floor``, plus noise."""
    rng = np.random.default_rng(seed)
    steps = [every * (i + 1) for i in range(n_evals)]
    loss = [float(np.log(8.0) if t <= stall else floor + (np.log(8.0) - floor) * np.exp(-rate * (t - stall))
                  + noise * rng.standard_normal()) for t in steps]
    return steps, [max(x, 1e-4) for x in loss]


def _cases_5_3():
    rule = dict(window=500, tol=0.01, min_steps=1000)
    cases = [("a slow start, then a plateau at 0.4", _curve(0, stall=600, floor=0.4, rate=3e-3, noise=0.02)),
             ("a run that learns to a loss near 0", _curve(1, stall=200, floor=0.002, rate=4e-3, noise=0.0)),
             ("a long stall at ln 8, then learning", _curve(2, stall=800, floor=0.8, rate=2e-3, noise=0.01)),
             ("still falling at the last step", _curve(3, stall=0, floor=0.0, rate=2e-4, noise=0.0))]
    steps, falling = _curve(5, stall=0, floor=0.0, rate=5e-4, noise=0.0)
    spiked = [x + 0.5 * (t == 1500) for t, x in zip(steps, falling, strict=True)]  # one noisy evaluation
    cases.append(("a falling run with one noisy evaluation at step 1500", (steps, spiked)))
    out = [(name, curve, rule) for name, curve in cases]
    # window 600 = 3 evaluations: t − window is an evaluation step, whichever way the rule is read
    out.append(("evaluations every 200 steps, window 600", _curve(4, stall=400, floor=1.2, rate=1e-3, noise=0.0,
                                                                  every=200), rule | {"window": 600}))
    return out


exercise_5_3 = Exercise("5.3", "when has a training run converged?", plateau_stop, _cases_5_3, MISTAKES_5_3,
                        names=("stop step", "converged"))

EXERCISES = [exercise_5_1, exercise_5_2, exercise_5_3]
