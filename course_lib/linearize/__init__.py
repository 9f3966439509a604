"""Linearizing a pretrained transformer: MiniLM's softmax attention replaced by trained linear attention.

Implements notebook 10.  The pieces, one concern a file:

    kernels.py    trainable attention layers (learned feature maps, learned Linformer E, F), low-rank
                  adapters, a sliding window beside a learned map, and ``linearize(model, method)``:
                  MiniLM with one in every layer
    distill.py    stage 1 (attention distillation per layer) and stage 2 (end to end)
    evaluate.py   held-out scores against the exact model; entropy and monotonicity of rows

The trained weights ship in ``course_lib/data/linearized_<name>.safetensors``, written by
``python tools/train_linearized.py``, which trains on ``course_lib.tasks.passage_split``'s
training passages only:

    model = load_linearized("hedgehog")     # Hedgehog maps after both stages
    model.encode(["a sentence", ...])       # as MiniLM.encode, every layer's attention linear
"""

import json

from safetensors import safe_open
from safetensors.torch import save_file

from course_lib import data_path
from course_lib.linearize.distill import (
    distill_attention,
    distill_outputs,
    hidden_states,
    layer_inputs,
    output_loss,
)
from course_lib.linearize.evaluate import (
    exact_reference,
    heldout_scores,
    mean_entropy,
    monotonicity,
    variant_weights,
)
from course_lib.linearize.kernels import (
    ADAPTABLE,
    METHODS,
    LearnedLinearAttention,
    LearnedLinformer,
    LowRankAdapter,
    added_parameters,
    check_minilm,
    elu_kernel,
    linearize,
    linearized_layer,
    trainable_state,
    uniform_kernel,
)

__all__ = ["ADAPTABLE", "METHODS", "NAMES", "LearnedLinearAttention", "LearnedLinformer", "LowRankAdapter",
           "added_parameters", "check_minilm", "distill_attention", "distill_outputs", "elu_kernel",
           "exact_reference", "heldout_scores", "hidden_states", "layer_inputs", "linearize", "linearized_layer",
           "load_linearized", "load_trained", "mean_entropy", "monotonicity", "output_loss", "save_linearized",
           "trainable_state", "uniform_kernel", "variant_weights"]

# The stored models: name → what it is (each is course_lib/data/linearized_<name>.safetensors).
NAMES = {
    "hedgehog": "Hedgehog feature maps after stage 1 (attention distillation) and stage 2 (end to end)",
    "hedgehog_stage1": "Hedgehog feature maps after stage 1 only",
    "hedgehog_window": "Hedgehog feature maps beside a sliding window of exact keys (Eq. 10.9), after both stages",
    "hedgehog_window_stage1": "Hedgehog feature maps beside a sliding window of exact keys, after stage 1 only",
    "t2r": "T2R relu feature maps, swapped in and trained end to end",
    "linformer": "Linformer with E, F learned for every layer, then trained end to end",
}


def save_linearized(model, path, **info):
    """Write a linearized model's trained parameters and its ``linearize`` settings to ``path`` (safetensors)."""
    check_minilm(model)
    if not hasattr(model, "linearized"):
        raise ValueError("model was not made by course_lib.linearize.linearize: it has no trained kernels to save.")
    state = {name: p.contiguous() for name, p in trainable_state(model).items()}
    save_file(state, str(path), metadata={"linearize": json.dumps(model.linearized), "info": json.dumps(info)})


def load_trained(model, state):
    """Load ``state`` (trained parameters by name) into a ``linearize``d model; every trainable one must be there."""
    expected = set(trainable_state(model))
    if set(state) != expected:
        raise ValueError(f"the stored parameters do not fit this model: missing {sorted(expected - set(state))[:3]}, "
                         f"unexpected {sorted(set(state) - expected)[:3]}.")
    model.load_state_dict(state, strict=False)
    return model


def load_linearized(name="hedgehog", *, device="cpu"):
    """MiniLM with the stored trained kernels in every layer. Notebook 10, Section 10.6.

    Args:
        name: one of ``NAMES``: ``"hedgehog"`` (both stages), ``"hedgehog_stage1"``,
            ``"hedgehog_window"``, ``"hedgehog_window_stage1"``, ``"t2r"``, ``"linformer"``.
        device: torch device.

    Returns:
        A ``MiniLM`` in eval mode whose ``encode(texts)`` works as the exact model's.
    """
    from course_lib.pretrained import load_minilm

    if not isinstance(name, str) or name not in NAMES:
        raise ValueError(f"name must be one of {', '.join(map(repr, NAMES))}, got {name!r}.")
    path = data_path(f"linearized_{name}.safetensors")
    with safe_open(str(path), framework="pt") as stored:
        settings = json.loads(stored.metadata()["linearize"])
        state = {key: stored.get_tensor(key) for key in stored.keys()}  # noqa: SIM118 (safe_open has no iterator)
    model = linearize(load_minilm(device=device), **settings)
    return load_trained(model, {key: value.to(device) for key, value in state.items()}).eval()
