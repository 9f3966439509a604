"""Notebook 09's swap-in scores passage by passage, for its paired tests.

    python tools/lesson09_passages.py    write course_lib/data/swap_in_passages.json

``tools/lesson09_data.py swap-in`` stores each variant's scores as means over the 48 held-out
passages.  A comparison of two variants on the same passages is decided by the passages on which
they differ, so this stores, for every variant of that table except the Eckart-Young oracle (an
SVD per head and passage, and no comparison of notebook 09 rests on it), per passage: whether its
second half is retrieved (``swap_in.retrieval_found`` on ``swap_in.split_halves``), whether its
swapped embedding is nearest its own exact one (identification: ``retrieval_found(swapped,
exact)``) and its centred cosine.  The same texts, settings and seeds as ``swap-in``, so each
mean equals that file's (notebook 09 asserts it).  One thread, about ten minutes.
"""

import json
import pathlib
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from lesson09_data import _embed_sorted  # noqa: E402  (tools/ is this script's own folder)

from course_lib import swap_in  # noqa: E402
from course_lib.pretrained import load_minilm  # noqa: E402
from course_lib.tasks import passage_split  # noqa: E402

PASSAGES, N = 48, 256  # as lesson09_data.py swap-in


def centred_cosines(swapped, exact):
    """Per text: the cosine after each set is centred on its own mean (``swap_in.embedding_scores``' mean of it)."""
    centred = [x - x.mean(axis=0) for x in (np.asarray(swapped, np.float64), np.asarray(exact, np.float64))]
    centred = [x / np.linalg.norm(x, axis=1, keepdims=True) for x in centred]  # (t, d_model) unit rows
    return np.einsum("td,td->t", *centred)


def main():
    start = time.perf_counter()
    torch.set_num_threads(1)
    model = load_minilm()
    _, texts = passage_split(0, PASSAGES, min_tokens=N, tokenizer=model.tokenizer)
    halves = swap_in.split_halves(texts)
    exact = _embed_sorted(model, texts, N)
    rows = {"exact": {"found": swap_in.retrieval_found(*(_embed_sorted(model, part, N) for part in halves))}}
    settings = swap_in.swap_in_settings(N, model.config.d_model // model.config.n_heads, ks=(32, 128))
    for variant, setting, kernel in settings:  # every row is built, so the seeded draws match swap-in's
        if variant == swap_in.TRUNCATED_P:
            continue
        swapped_model = model.with_attention(kernel)
        swapped = _embed_sorted(swapped_model, texts, N)
        rows[f"{variant}|{setting}"] = {
            "found": swap_in.retrieval_found(*(_embed_sorted(swapped_model, part, N) for part in halves)),
            "identified": swap_in.retrieval_found(swapped, exact),
            "centred": np.round(centred_cosines(swapped, exact), 4)}
        print(variant, setting, f"{time.perf_counter() - start:.0f} s", flush=True)
    out = {"command": "python tools/lesson09_passages.py", "passages": len(texts), "n": N,
           "seconds": round(time.perf_counter() - start), "threads": torch.get_num_threads(),
           "rows": {key: {name: [bool(x) if name != "centred" else float(x) for x in values]
                          for name, values in row.items()} for key, row in rows.items()}}
    (ROOT / "course_lib" / "data" / "swap_in_passages.json").write_text(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
