"""Linearizing MiniLM: the kernels against their definitions, the two stages on tiny data, the stored models,
the held-out results file, and bad input."""

import json
import pathlib
import sys

import numpy as np
import pytest
import torch

from course_lib import data_path, linearize, swap_in
from course_lib.linearize import distill, evaluate, kernels
from course_lib.pretrained import load_minilm
from course_lib.tasks import passage_split
from course_lib.torch.feature_maps import attention_cross_entropy
from course_lib.torch.full import MultiHeadAttention, attention_weights, softmax_attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import train_linearized  # noqa: E402

SHORT = ["The for statement iterates over a sequence.", "A while loop runs while its condition holds true, "
         "again and again, until it becomes false."]


@pytest.fixture(scope="module")
def model():
    return load_minilm()


@pytest.fixture(scope="module")
def tiny(model):
    return model.tokenize(SHORT)  # (2, n): the first text is padded


def _qkv(seed=0, b=2, h=3, n=7, d=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))


def _layer(method, **options):
    """A linearized layer (3 heads of d = 4) from a random MultiHeadAttention, float64."""
    torch.manual_seed(0)
    return kernels.linearized_layer(MultiHeadAttention(12, 3).double(), method, **options)


def _mask(lengths, n):
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]  # (b, 1, s)


# --- kernels ---------------------------------------------------------------------------------------

def test_stage1_loss_is_the_cross_entropy_of_the_explicit_weights():
    # Hedgehog's features are positive, so every kernel value is > 0 and the two forms agree to round-off
    # (a relu map's zero weights meet the log's floor differently in the two forms).
    kernel = _layer("hedgehog")
    for p in kernel.feature_map.parameters():  # move off the initial values: a generic map
        p.data += 0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype)
    q, k, v = _qkv()
    mask = _mask([7, 4], 7)
    expected = attention_cross_entropy(attention_weights(q, k, key_mask=mask), kernel.weights(q, k, key_mask=mask),
                                       key_mask=mask)
    torch.testing.assert_close(kernel.stage1_loss(q, k, v, mask), expected, rtol=1e-6, atol=1e-9)
    rows = torch.tensor([0, 2, 5])  # a subset of the query rows: the mean over those rows only
    per_row = -(attention_weights(q, k, key_mask=mask) * (kernel.weights(q, k, key_mask=mask) + 1e-12).log()).sum(-1)
    keep = mask[..., rows].expand(2, 3, 3)
    torch.testing.assert_close(kernel.stage1_loss(q, k, v, mask, rows), per_row[..., rows][keep].mean(), rtol=1e-6,
                               atol=1e-9)


def test_learned_linear_attention_is_its_explicit_weights_times_v():
    kernel = _layer("hedgehog")
    q, k, v = _qkv()
    mask = _mask([7, 5], 7)
    torch.testing.assert_close(kernel.attend(q, k, v, mask), kernel.weights(q, k, key_mask=mask) @ v)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    heads = kernel.heads(x)  # the copied projections, split into heads
    expected = kernel.out_proj((kernel.weights(*heads[:2], key_mask=mask) @ heads[2]).transpose(1, 2).reshape(2, 7, 12))
    torch.testing.assert_close(kernel(x, key_mask=mask[:, 0]), expected)


@pytest.mark.parametrize("method", ["hedgehog", "t2r"])
def test_a_windowed_kernel_is_its_weights_times_v_and_its_loss_their_cross_entropy(method):
    # as above, the two forms of the loss agree for positive features (Hedgehog); a relu map's zero
    # weights outside the band meet the log's floor differently, so T2R is held to a finite loss
    kernel = _layer(method, window=1)
    with torch.no_grad():
        kernel.log_scale.copy_(torch.tensor([0.5, -1.0, 2.0]).reshape(3, 1, 1))  # one γ per head
    q, k, v = _qkv()
    mask = _mask([7, 5], 7)
    weights = kernel.weights(q, k, key_mask=mask)
    torch.testing.assert_close(kernel.attend(q, k, v, mask), weights @ v)
    if method == "t2r":
        assert torch.isfinite(kernel.stage1_loss(q, k, v, mask))
        return
    expected = attention_cross_entropy(attention_weights(q, k, key_mask=mask), weights, key_mask=mask)
    torch.testing.assert_close(kernel.stage1_loss(q, k, v, mask), expected, rtol=1e-6, atol=1e-9)
    rows = torch.tensor([0, 3, 6])  # rows near both ends and in the middle: the band is placed by position
    per_row = -(attention_weights(q, k, key_mask=mask) * (weights + 1e-12).log()).sum(-1)
    torch.testing.assert_close(kernel.stage1_loss(q, k, v, mask, rows), per_row[..., rows][mask[..., rows].expand(
        2, 3, 3)].mean(), rtol=1e-6, atol=1e-9)


def test_start_scale_gives_the_kernel_softmaxs_weight_outside_the_window():
    kernel = _layer("hedgehog", window=1)
    q, k, _ = _qkv(n=9)
    mask = _mask([9, 6], 9)
    kernel.start_scale(q, k, mask)
    far = (torch.arange(9)[:, None] - torch.arange(9)[None, :]).abs() > 1
    far = far & mask[..., None, :]  # (b, 1, n, s)
    scores = (q @ k.transpose(-1, -2) / 2).masked_fill(~far, -torch.inf).logsumexp(-1)  # ln softmax's mass there
    phi_q, phi_k = kernel.features(q, k)
    linear = (phi_q @ phi_k.transpose(-1, -2)).log().masked_fill(~far, -torch.inf).logsumexp(-1)
    gap = scores - linear - kernel.log_scale[..., 0]  # (b, h, n): 0 on average over real rows, head by head
    for head in range(3):
        assert abs(gap[:, head][mask[:, 0]].mean()) < 1e-9
    assert _layer("hedgehog").start_scale(q, k, mask) is None  # without a window there is no γ to set


def test_learned_linformer_starts_at_mean_pooling_and_its_loss_is_lesson_04s():
    kernel = _layer("linformer", k_proj=2, n_max=7)
    torch.testing.assert_close(kernel.E, kernels.mean_pooling(2, 7, dtype=torch.float64))
    q, k, v = _qkv()
    target = softmax_attention(q, k, v)
    expected = ((kernel.attend(q, k, v, None) - target).square().sum((-2, -1)) / target.square().sum((-2, -1))).mean()
    torch.testing.assert_close(kernel.stage1_loss(q, k, v, torch.ones(2, 1, 7, dtype=torch.bool)), expected)


def test_uniform_kernel_is_the_mean_of_the_real_values():
    q, k, v = _qkv()
    mask = _mask([7, 3], 7)
    out = kernels.uniform_kernel()(q, k, v, key_mask=mask)
    torch.testing.assert_close(out[1], v[1, :, :3].mean(-2, keepdim=True).expand(3, 7, 4), rtol=1e-6, atol=1e-6)


def test_an_adapter_changes_nothing_before_training():
    base = torch.nn.Linear(6, 5)
    adapter = kernels.LowRankAdapter(base, 2, generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 6)
    torch.testing.assert_close(adapter(x), base(x))
    assert adapter.A.shape == (2, 6) and adapter.B.shape == (5, 2)


# --- linearize ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, kind", [("hedgehog", kernels.LearnedLinearAttention),
                                          ("t2r", kernels.LearnedLinearAttention),
                                          ("linformer", kernels.LearnedLinformer)])
def test_linearize_puts_a_kernel_in_every_layer_and_freezes_the_rest(model, method, kind):
    before = {name: p.clone() for name, p in model.state_dict().items()}
    student = linearize.linearize(model, method, rank=2)
    assert all(isinstance(layer.attention, kind) for layer in student.layers)
    for mine, theirs in zip(student.layers, model.layers, strict=True):  # the pretrained projections, copied
        torch.testing.assert_close(mine.attention.out_proj.weight, theirs.attention.out_proj.weight)
        torch.testing.assert_close(mine.attention.q_proj.base.weight, theirs.attention.q_proj.weight)
    trainable = [name for name, p in student.named_parameters() if p.requires_grad]
    maps = (".feature_map.", ".key_map.", ".E", ".F", "_proj.A", "_proj.B")
    assert trainable and all(any(part in n for part in maps) for n in trainable), trainable
    assert linearize.added_parameters(student) == sum(student.get_parameter(n).numel() for n in trainable)
    assert all(torch.equal(before[name], p) for name, p in model.state_dict().items())  # the teacher is untouched


def test_t2r_shares_one_map_and_hedgehog_has_two(model):
    hedgehog, t2r = (linearize.linearize(model, m) for m in ("hedgehog", "t2r"))
    assert hedgehog.layers[0].attention.key_map is not None
    assert t2r.layers[0].attention.key_map is None
    heads, d = model.config.n_heads, model.config.d_model // model.config.n_heads
    assert linearize.added_parameters(hedgehog) == 6 * 2 * heads * (d * d + d)


def test_linearize_refuses_bad_arguments(model):
    with pytest.raises(TypeError, match="model must be a MiniLM"):
        linearize.linearize(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="method must be one of"):
        linearize.linearize(model, "performer")
    with pytest.raises(ValueError, match="rank must be"):
        linearize.linearize(model, rank=-1)
    with pytest.raises(ValueError, match="adapt must list distinct names from 'q'"):
        linearize.linearize(model, rank=2, adapt=("q", "mlp"))
    with pytest.raises(ValueError, match="window is for the feature-map methods"):
        linearize.linearize(model, "linformer", window=4)
    with pytest.raises(ValueError, match="window must be None or an int >= 0"):
        linearize.linearize(model, "hedgehog", window=-2)


def test_adapters_anywhere_change_nothing_before_training_and_are_all_that_trains_besides_the_maps(model):
    everywhere = tuple(kernels.ADAPTABLE)
    student = linearize.linearize(model, "hedgehog", rank=2, adapt=everywhere)
    plain = linearize.linearize(model, "hedgehog")
    trainable = {name for name, p in student.named_parameters() if p.requires_grad}
    for site, path in kernels.ADAPTABLE.items():
        assert f"layers.3.{path}.A" in trainable and f"layers.3.{path}.B" in trainable, site
    linears = [model.layers[0].get_submodule(path) for path in kernels.ADAPTABLE.values()]
    rank_2 = sum(2 * (lin.in_features + lin.out_features) for lin in linears)  # A (2, in) and B (out, 2) per site
    assert linearize.added_parameters(student) - linearize.added_parameters(plain) == 6 * rank_2
    assert student.linearized["adapt"] == list(everywhere)
    np.testing.assert_allclose(student.encode(SHORT), plain.encode(SHORT), atol=1e-6)  # B = 0: no change yet


def test_encode_refuses_texts_that_are_not_strings(model):
    student = linearize.linearize(model, "t2r", n_features=8)
    for encoder in (model, student):  # the exact model and a linearized one check alike
        for bad in (123, ["a text", 4], [], {"a": 1}, None):
            with pytest.raises(TypeError, match="texts must be a string or a non-empty list of strings"):
                encoder.encode(bad)
    assert student.encode("one text").shape == (384,)  # a single string gives one vector, as MiniLM.encode


def test_a_linearized_model_ignores_padding(model):
    student = linearize.linearize(model, "hedgehog")
    alone = student.encode([SHORT[0]])
    batched = student.encode(SHORT)  # SHORT[0] is padded to SHORT[1]'s length here
    np.testing.assert_allclose(batched[0], alone[0], atol=1e-5)


# --- the two stages on tiny data -------------------------------------------------------------------

def test_stage1_lowers_its_loss_and_trains_only_the_kernels(model, tiny):
    student = linearize.linearize(model, "hedgehog", rank=2)
    frozen = {n: p.clone() for n, p in student.named_parameters() if "_map." not in n}
    run = linearize.distill_attention(student, model, *tiny, steps=15, lr=3e-2, batch_size=2, rows=None,
                                      checkpoints=(0, 15))
    losses = np.array(run["losses"])  # (steps, layers)
    assert losses.shape == (15, 6) and (losses[-1] < losses[0]).all()
    assert set(run["checkpoints"]) == {0, 15}
    assert all(torch.equal(p, frozen[n]) for n, p in student.named_parameters() if n in frozen)


def test_stage1_with_a_window_sets_gamma_first_and_lowers_its_loss(model, tiny):
    student = linearize.linearize(model, "hedgehog", window=2)
    run = linearize.distill_attention(student, model, *tiny, steps=10, lr=3e-2, batch_size=2, rows=None)
    assert (student.layers[0].attention.log_scale.abs() > 0.5).all()  # set from data: γ = 1 would starve the kernel
    losses = np.array(run["losses"])
    assert (losses[-1] < losses[0]).all()


def test_stage2_lowers_its_loss(model, tiny):
    student = linearize.linearize(model, "t2r")
    run = linearize.distill_outputs(student, model, *tiny, steps=12, lr=1e-2, batch_size=2)
    assert run["losses"][-1] < run["losses"][0]


def test_stage2_with_every_layer_and_a_cosine_schedule_lowers_its_loss(model, tiny):
    student = linearize.linearize(model, "hedgehog", rank=2, adapt=("q", "k", "v", "out", "ffn_out"))
    run = linearize.distill_outputs(student, model, *tiny, steps=12, lr=1e-2, batch_size=2, layer_weight=1.0,
                                    schedule="cosine")
    assert run["losses"][-1] < run["losses"][0]
    assert all(total > loss for total, loss in zip(run["total_losses"], run["losses"], strict=True))  # + layers' term


def test_hidden_states_end_with_the_models_output(model, tiny):
    states = distill.hidden_states(model, *tiny, batch_size=1)
    assert states.shape == (6, *tiny[0].shape, 384)
    with torch.no_grad():
        torch.testing.assert_close(states[-1], model(*tiny))


def test_the_cosine_schedule_falls_from_one_to_near_zero():
    factors = [distill._learning_rate(step, 10, "cosine") for step in range(1, 11)]
    assert factors[0] == 1.0 and all(a > b for a, b in zip(factors, factors[1:], strict=False)) and factors[-1] < 0.03
    assert distill._learning_rate(7, 10, "constant") == 1.0


def test_stages_refuse_bad_arguments(model, tiny):
    student = linearize.linearize(model)
    with pytest.raises(TypeError, match="teacher must be a MiniLM"):
        linearize.distill_attention(student, "minilm", *tiny, steps=1)
    with pytest.raises(ValueError, match="batch_size must be between 1 and the 2 texts"):
        linearize.distill_outputs(student, model, *tiny, steps=1, batch_size=3)
    with pytest.raises(ValueError, match="schedule must be 'constant' or 'cosine'"):
        linearize.distill_outputs(student, model, *tiny, steps=1, batch_size=1, schedule="linear")
    with pytest.raises(ValueError, match="layer_weight must be >= 0"):
        linearize.distill_outputs(student, model, *tiny, steps=1, batch_size=1, layer_weight=-1)


def test_save_and_load_round_trip(model, tmp_path):
    student = linearize.linearize(model, "hedgehog", n_features=8)
    with torch.no_grad():
        student.layers[2].attention.feature_map.weight.add_(0.5)
    linearize.save_linearized(student, tmp_path / "x.safetensors")
    from safetensors.torch import load_file

    again = linearize.load_trained(linearize.linearize(model, "hedgehog", n_features=8),
                                   load_file(tmp_path / "x.safetensors"))
    np.testing.assert_array_equal(again.encode(SHORT), student.encode(SHORT))
    with pytest.raises(ValueError, match="do not fit this model"):
        linearize.load_trained(linearize.linearize(model, "t2r"), load_file(tmp_path / "x.safetensors"))
    with pytest.raises(ValueError, match="was not made by"):
        linearize.save_linearized(model, tmp_path / "y.safetensors")


# --- the attention measures -------------------------------------------------------------------------

def test_softmax_rows_are_monotone_in_qk_and_elu_rows_are_flatter():
    q, k, _ = _qkv(n=40, d=8)
    q, k = 3 * q, 3 * k  # peaked softmax rows, like MiniLM's
    soft = evaluate.variant_weights("softmax", q, k)
    elu = evaluate.variant_weights("elu+1", q, k)
    assert evaluate.monotonicity(q, k, soft) == pytest.approx(1.0)
    assert evaluate.mean_entropy(soft) < evaluate.mean_entropy(elu) < np.log(40)
    omega = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    favor = evaluate.variant_weights("FAVOR+", q, k, omega=omega)
    torch.testing.assert_close(favor.sum(-1), torch.ones(2, 3, 40, dtype=torch.float64), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="variant must be one of"):
        evaluate.variant_weights("relu", q, k)


# --- the stored models and results (course_lib/data, written by tools/train_linearized.py) ------------

@pytest.fixture(scope="module")
def results():
    return json.loads(data_path("linearized_results.json").read_text())


@pytest.fixture(scope="module")
def heldout_texts(results):
    return passage_split(0, results["heldout_passages"])[1]


@pytest.mark.parametrize("name", list(linearize.NAMES))
def test_every_stored_model_loads_with_linear_attention_in_every_layer(name):
    student = linearize.load_linearized(name)
    assert all(isinstance(layer.attention, (kernels.LearnedLinearAttention, kernels.LearnedLinformer))
               for layer in student.layers)
    embeddings = student.encode(SHORT)
    assert embeddings.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("name", ["hedgehog", "hedgehog_window", "t2r", "linformer"])
def test_a_stored_model_in_half_precision_encodes_like_float32(name):
    student = linearize.load_linearized(name)
    full = student.encode(SHORT)
    half = student.half().encode(SHORT)  # learned maps take float32 features from float16 weights
    cosines = np.einsum("td,td->t", full, half)
    np.testing.assert_allclose(cosines, 1.0, atol=2e-3)  # float16 weights and activations: ~3 decimal digits


def test_load_linearized_and_encode_refuse_bad_input():
    with pytest.raises(ValueError, match="name must be one of 'hedgehog'"):
        linearize.load_linearized("performer")
    student = linearize.load_linearized("hedgehog")
    for bad in (123, ["a text", 4], [], {"a": 1}):
        with pytest.raises(TypeError, match="texts must be a string or a non-empty list of strings"):
            student.encode(bad)


@pytest.mark.parametrize("name, row_name", [("hedgehog", "Hedgehog, stages 1 + 2"),
                                            ("hedgehog_window", "Hedgehog + window (w = 4), stages 1 + 2")])
def test_the_stored_hedgehog_reproduces_its_stored_heldout_cosines(model, results, heldout_texts, name, row_name):
    row = next(r for r in results["rows"] if r["name"] == row_name)
    texts = heldout_texts[:4]
    exact = swap_in.embeddings(model, texts)
    got = np.einsum("td,td->t", swap_in.embeddings(linearize.load_linearized(name), texts), exact)
    np.testing.assert_allclose(got, row["cosines"][:4], atol=2e-3)  # float32 sums in another order


def test_results_cover_every_row_of_the_table_on_heldout_passages(results):
    names = [r["name"] for r in results["rows"]]
    for needed in ("exact", "uniform attention", "elu+1", "FAVOR+", "Linformer (k = 64), mean pooling", "T2R",
                   "Hedgehog, stage 1", "Hedgehog, stages 1 + 2", "Hedgehog + window (w = 4), stage 1",
                   "Hedgehog + window (w = 4), stages 1 + 2", "E, F learned + end to end"):
        assert any(needed in name for name in names), needed
    train, heldout = passage_split(results["train_passages"], results["heldout_passages"])
    assert not set(train) & set(heldout)
    for row in results["rows"]:
        assert -1 <= row["control"] <= 1 and row["cosine"] <= 1.0 + 1e-9 and 0 <= row["retrieval"] <= 1
        assert 0 <= row["retrieval_control"] <= 1 and row["half_cosine"] <= 1.0 + 1e-9
        if row["training"] != "none":  # a trained variant keeps each passage's own direction
            assert row["cosine"] - row["control"] > 0.3 and row["identification"] > 0.9
    exact_found = np.array(results["rows"][0]["retrieval_found"])
    for row in results["rows"]:  # the paired counts are those of the stored per-passage hits
        found = np.array(row["retrieval_found"])
        assert len(found) == results["heldout_passages"] and found.sum() == row["retrieval_hits"]
        assert swap_in.paired_retrieval(found, exact_found) == {
            "lost": row["retrieval_lost"], "gained": row["retrieval_gained"], "p": row["retrieval_p"]}


def test_the_stored_files_stay_small():
    # the repository keeps every tracked file under 3 MB: the checkpoints are float16, the sweep has few f
    files = sorted(data_path("linearized_results.json").parent.glob("linearized_*"))
    assert len(files) == len(linearize.NAMES) + 2  # the models, the checkpoints and the results
    assert all(f.stat().st_size < 3e6 for f in files), {f.name: f.stat().st_size for f in files}


def test_the_stored_ranking_scores_and_second_source_are_those_of_their_per_text_ranks(results):
    # python tools/train_linearized.py --score-only: the mean reciprocal rank of every stored model with its
    # paired test against the exact model, on the held-out passages and on the module docstrings
    from course_lib.tasks import module_docstrings

    second = results["second_source"]
    assert second["texts"] == len(module_docstrings()) and results["score_command"].endswith("--score-only")
    for rows, size in ((results["rows"], results["heldout_passages"]), (second["rows"], second["texts"])):
        reference = np.array(rows[0]["reciprocal_ranks"])
        for row in rows:
            if "mrr" not in row:
                continue  # Linformer's stage-1 E, F are not stored: that row was not re-scored
            ranks = np.array(row["reciprocal_ranks"])
            assert len(ranks) == size and np.isclose(ranks.mean(), row["mrr"]) and (ranks <= 1).all()
            assert np.allclose(1 / ranks, np.round(1 / ranks))  # 1 / an integer rank
            test = swap_in.paired_rank_test(ranks, reference)
            assert test == {key: pytest.approx(row[f"mrr_{key}"]) for key in ("better", "worse", "statistic", "p")}
    points = results["reference_points"]["held-out passages"]
    assert min(points["exact model in float16"]) > 0.999 > np.mean(points["exact model, one word dropped"])


# --- python tools/train_linearized.py --seed-runs 3: seeds 1 and 2 beside the stored seed 0 ---------------

SEED_ROWS = ("Hedgehog, stage 1", "Hedgehog, stages 1 + 2", "T2R, trained end to end")


def test_seed_runs_quick_adds_seeds_and_starts_and_keeps_every_stored_row(tmp_path):
    # a few steps on four short passages (a few seconds): the mode writes its fields and changes nothing else
    stored = data_path("linearized_results.json").read_text()
    (tmp_path / "linearized_results.json").write_text(stored)
    threads = torch.get_num_threads()
    try:
        train_linearized.main(["--seed-runs", "3", "--quick", "--jobs", "1", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)  # the tool sets one thread per process
    before, after = json.loads(stored), json.loads((tmp_path / "linearized_results.json").read_text())
    runs = after.pop("seed_runs")
    before.pop("seed_runs", None)
    assert {k: v for k, v in after.items() if k != "stage1_seeds"} == \
        {k: v for k, v in before.items() if k != "stage1_seeds"}  # every stored row and field as it was
    assert runs["command"].endswith("--seed-runs 3 --quick") and runs["seeds"] == [0, 1, 2] and runs["wall_s"] > 0
    assert [r["seed"] for r in after["stage1_seeds"]] == [0, 1, 2]
    for name in SEED_ROWS:
        rows = runs["rows"][name]
        assert [r["seed"] for r in rows] == [0, 1, 2] and rows[0]["stored"]
        assert all(r["cpu_s"] >= 0 and r["seconds"] > 0 and -1 <= r["cosine"] <= 1 and 0 < r["mrr"] <= 1
                   for r in rows[1:])
        for key, summary in runs["summary"][name].items():
            values = [r[key] for r in rows]
            assert summary == {"seed0": values[0], "mean": pytest.approx(np.mean(values)), "low": min(values),
                               "high": max(values)}
    assert sorted(runs["starts"]) == ["Hedgehog at W = I, untrained", *(
        f"T2R at its random start (seed {seed}), untrained" for seed in range(3))]
    assert all(np.isclose(np.mean(r["cosines"]), r["cosine"]) for r in runs["starts"].values())


def test_the_stored_seed_runs_sit_beside_seed_0_and_start_where_stage_1_starts(results):
    runs = results["seed_runs"]
    assert runs["command"].startswith("python tools/train_linearized.py --seed-runs 3") and runs["seeds"] == [0, 1, 2]
    rows = {r["name"]: r for r in results["rows"]}
    for name in SEED_ROWS:
        seeds = runs["rows"][name]
        assert [r["seed"] for r in seeds] == [0, 1, 2]
        assert seeds[0]["cosine"] == rows[name]["cosine"] and seeds[0]["mrr"] == rows[name]["mrr"]  # the stored model
        assert all(r["cosine"] != seeds[0]["cosine"] and r["cosine"] > r["control"] + 0.3 for r in seeds[1:])
    assert [r["cosine"] for r in results["stage1_seeds"]] == [r["cosine"] for r in runs["rows"]["Hedgehog, stage 1"]]
    start = runs["starts"]["Hedgehog at W = I, untrained"]
    # stage 1's step-0 checkpoint is W = I too, scored without retrieval by the same scorer
    assert start["cosine"] == pytest.approx(results["stage1_checkpoints"][0]["cosine"], abs=1e-6)
