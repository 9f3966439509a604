"""Notebook set-up: seeds, device, Colab detection and the plotly renderer.

Every notebook's first code cell after the Colab cell runs ``device = setup()``.
"""

import os
import random
import sys

import numpy as np

SEED = 0

# The lesson map: notebook name → its title (the notebook's first heading; a test keeps the two equal).
LESSONS = {
    "00_welcome": "00 · Welcome to *Efficient Attention, from the Ground Up*",
    "01_attention_recap": "01 · Attention recap",
    "02_low_rank": "02 · Self-attention is low rank",
    "03_johnson_lindenstrauss": "03 · Random projections and the Johnson–Lindenstrauss lemma",
    "04_linformer": "04 · Linformer: attention through k projected keys",
    "05_parameter_sharing": "05 · Parameter sharing in Linformer",
    "06_linear_attention": "06 · Linear attention: attention as a kernel, in linear time",
    "07_transformers_are_rnns": "07 · Transformers are RNNs: generation one token at a time",
    "08_favor_plus": "08 · FAVOR+: softmax attention from positive orthogonal random features",
    "09_putting_it_together": "09 · Putting it together: choosing an efficient attention",
    "10_linearizing": "10 · Linearizing a pretrained transformer: distilling softmax into linear attention",
    "11_state_capacity": "11 · What a fixed state remembers",
    "12_chunkwise_gating_delta": "12 · Chunkwise-parallel gating and the delta rule",
    "13_state_tracking": "13 · What a state can compute",
    "14_hybrids_and_the_cache": "14 · Hybrid models and the state cache",
}


def in_colab():
    """True when running inside Google Colab."""
    return "google.colab" in sys.modules


def small():
    """True when the small-size switch is on (``COURSE_SMALL=1``): heavy cells shrink."""
    return os.environ.get("COURSE_SMALL", "0") not in ("", "0")


def pick_device():
    """The best available torch device name: ``"cuda"``, then ``"mps"``, then ``"cpu"``."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def seed_everything(seed=SEED):
    """Seed Python's, NumPy's global and torch's random number generators."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_plotly_renderer():
    """Pick a plotly renderer: Colab's own there; elsewhere the JupyterLab MIME renderer.

    ``plotly_mimetype`` stores the figure as JSON in the notebook (deterministic, so stored
    outputs can be compared); ``COURSE_PLOTLY_RENDERER`` overrides the choice.
    """
    import plotly.io as pio

    renderer = os.environ.get("COURSE_PLOTLY_RENDERER") or ("colab" if in_colab() else "plotly_mimetype")
    pio.renderers.default = renderer
    return renderer


def setup(seed=SEED, *, verbose=True):
    """Seed everything, pick the device and set the plotly renderer.

    Args:
        seed: seed for Python, NumPy and torch.
        verbose: print one line describing the environment.

    Returns:
        The device name (``"cuda"``, ``"mps"`` or ``"cpu"``).
    """
    seed_everything(seed)
    device = pick_device()
    set_plotly_renderer()
    np.set_printoptions(precision=4, suppress=True)
    if verbose:
        where = "Colab" if in_colab() else "local"
        print(f"course_lib set up: seed={seed}, device={device}, runtime={where}")
    return device


def lesson_map():
    """The lessons as a Markdown table (shown in notebook 00)."""
    rows = [f"| `notebooks/{name}.ipynb` | {title} |" for name, title in LESSONS.items()]
    return "\n".join(["| notebook | lesson |", "|---|---|", *rows])


def show_table(header, rows, note=""):
    """Display printed results as a small Markdown table (a slide shows it large); numeric columns right-aligned."""
    import re

    from IPython.display import Markdown, display

    rows = [[str(cell) for cell in row] for row in rows]
    numeric = [j > 0 and all(re.fullmatch(r"[-+±×.,%\d e<>]+", row[j]) for row in rows) for j in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if right else ":---" for right in numeric) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    display(Markdown("\n".join(lines) + (f"\n\n{note}" if note else "")))
