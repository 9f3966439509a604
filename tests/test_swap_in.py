"""Swapping attention variants into the pretrained MiniLM (course_lib.swap_in, notebook 09)."""

import numpy as np
import pytest
import torch

from course_lib import swap_in
from course_lib.pretrained import load_minilm
from course_lib.torch.full import softmax_attention
from course_lib.torch.linformer import linformer_attention, mean_pooling
from course_lib.torch.performer import performer_attention, random_matrix

TEXTS = ["Attention weighs every token against every other token.",
         "A short one.",
         "Linear attention replaces the softmax kernel by a product of feature maps, so it runs in linear time."]


@pytest.fixture(scope="module")
def model():
    return load_minilm()


def qkv(b=2, h=3, n=16, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def test_embeddings_match_encode(model):
    # Same pooling as MiniLM.encode; float32 round-off of one forward pass is ~1e-6.
    np.testing.assert_allclose(swap_in.embeddings(model, TEXTS), model.encode(TEXTS), atol=1e-5)


def test_exact_kernel_gives_cosine_one(model):
    cos = swap_in.embedding_cosines(model, softmax_attention, TEXTS, max_length=64)
    np.testing.assert_allclose(cos, 1.0, atol=1e-5)


def test_a_bad_kernel_moves_the_embeddings(model):
    def uniform(q, k, v, *, causal=False, key_mask=None):  # every query averages every value, padding included
        return v.mean(dim=-2, keepdim=True).expand_as(v)
    assert swap_in.embedding_cosines(model, uniform, TEXTS, max_length=64).min() < 0.9


def test_eckart_young_with_all_positions_is_exact():
    q, k, v = qkv()
    mask = torch.ones(2, 1, 16, dtype=torch.bool)
    mask[1, :, 10:] = False
    # k = s keeps every singular direction: P Vᵀ V v = P v up to float64 round-off.
    out = swap_in.eckart_young_kernel(16)(q, k, v, key_mask=mask)
    torch.testing.assert_close(out, softmax_attention(q, k, v, key_mask=mask), atol=1e-10, rtol=0)


def test_eckart_young_error_falls_with_k():
    q, k, v = qkv(n=32)
    exact = softmax_attention(q, k, v)
    errors = [float((swap_in.eckart_young_kernel(kp)(q, k, v) - exact).norm()) for kp in (2, 8, 32)]
    assert errors[0] > errors[1] > errors[2]


def test_linformer_kernel_is_linformer_and_ignores_padding():
    q, k, v = qkv(b=1)
    E, F = mean_pooling(4, 16, dtype=torch.float64), mean_pooling(4, 16, dtype=torch.float64)
    kernel = swap_in.linformer_kernel(E, F)
    torch.testing.assert_close(kernel(q, k, v), linformer_attention(q, k, v, E, F))
    padded = [torch.cat([x, 1e3 * torch.ones(1, 3, 4, 8, dtype=torch.float64)], dim=-2) for x in (k, v)]
    mask = torch.arange(20)[None, None, :] < 16  # (1, 1, s)
    E20, F20 = (torch.cat([x, torch.zeros(4, 4, dtype=torch.float64)], dim=-1) for x in (E, F))
    out = swap_in.linformer_kernel(E20, F20)(q, *padded, key_mask=mask)
    torch.testing.assert_close(out, kernel(q, k, v))


def test_performer_kernel_uses_one_draw():
    q, k, v = qkv(d=8)
    kernel = swap_in.performer_kernel(16, 8, torch.Generator().manual_seed(3))
    omega = random_matrix(16, 8, torch.Generator().manual_seed(3), dtype=torch.float32)
    torch.testing.assert_close(kernel(q, k, v), performer_attention(q, k, v, omega.double()))
    torch.testing.assert_close(kernel(q, k, v), kernel(q, k, v))  # no redraw between calls


@pytest.mark.parametrize("kernel", [swap_in.linear_kernel(), swap_in.eckart_young_kernel(4),
                                    swap_in.linformer_kernel(mean_pooling(4, 16), mean_pooling(4, 16))])
def test_causal_is_refused(kernel):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="causal"):
        kernel(q, k, v, causal=True)


def test_texts_must_be_a_list(model):
    with pytest.raises(TypeError, match="list of strings"):
        swap_in.embedding_cosines(model, softmax_attention, "one string")


def test_settings_cover_every_variant():
    names = {row[0] for row in swap_in.swap_in_settings(32, 8, ks=(4,), ms=(8,))}
    assert names == {*swap_in.CONTROLS, swap_in.TRUNCATED_P, "Linformer, mean pooling E = F",
                     "Linformer, Gaussian E, F", "linear, elu+1", "FAVOR+"}


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_embedding_scores_of_the_exact_model_and_of_a_collapse():
    rng = np.random.default_rng(0)
    exact = _unit(rng.normal(size=(6, 16)))
    scores = swap_in.embedding_scores(exact, exact)
    assert scores["cosine"] == pytest.approx(1) and scores["centred_cosine"] == pytest.approx(1)
    assert scores["identification"] == 1
    # every text collapsed onto one common direction plus a little noise: a high raw cosine to
    # the exact mean direction, but the centred cosine and identification see through it
    common = _unit(exact.mean(axis=0, keepdims=True))
    collapsed = _unit(common + 0.05 * rng.normal(size=(6, 16)))
    scores = swap_in.embedding_scores(collapsed, exact)
    assert scores["cosine"] == pytest.approx(scores["control"], abs=0.1)
    assert abs(scores["centred_cosine"]) < 0.5 and scores["identification"] < 0.5


def test_retrieval_top1_counts_own_documents():
    docs = np.eye(4)
    assert swap_in.retrieval_top1(docs, docs) == 1.0
    assert swap_in.retrieval_top1(docs[[1, 0, 2, 3]], docs) == 0.5
    assert swap_in.retrieval_found(docs[[1, 0, 2, 3]], docs).tolist() == [False, False, True, True]
    with pytest.raises(ValueError, match="queries and documents"):
        swap_in.retrieval_top1(docs, docs[:3])


@pytest.mark.parametrize("lost, gained, both, p", [
    (0, 0, 5, 1.0),  # never disagree
    (2, 1, 3, 1.0),  # tail (1 + 3) / 8 = 0.5, doubled
    (4, 1, 0, 0.375),  # (1 + 5) / 32, doubled
    (5, 0, 2, 0.0625),  # 1 / 32, doubled
    (0, 6, 1, 0.03125),  # 1 / 64, doubled: the test is symmetric
])
def test_paired_retrieval_counts_the_texts_where_the_models_disagree(lost, gained, both, p):
    reference = np.array([True] * lost + [False] * gained + [True] * both + [False] * 3)
    found = np.array([False] * lost + [True] * gained + [True] * both + [False] * 3)
    assert swap_in.paired_retrieval(found, reference) == {"lost": lost, "gained": gained, "p": pytest.approx(p)}


def test_paired_retrieval_refuses_texts_that_do_not_pair():
    with pytest.raises(ValueError, match=r"found and reference_found must be \(t,\) booleans for the same texts"):
        swap_in.paired_retrieval([True, False], [True, False, True])


def test_reciprocal_ranks_rank_each_query_own_document_among_all():
    documents = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # query 0 is nearest its own; query 1 sits between documents 0 and 1 but nearer 0: its own is second;
    # query 2 ranks document 1 (cosine 0.6) above its own (0.28) and document 0 (-0.28) below: second
    queries = np.array([[1.0, 0.0], [0.8, 0.6], [-0.28, 0.96]])
    np.testing.assert_allclose(swap_in.reciprocal_ranks(queries, documents), [1.0, 0.5, 0.5])
    assert swap_in.mean_reciprocal_rank(queries, documents) == pytest.approx(2 / 3)
    # a tie with another document counts against the query: e_1 against [e_0, e_2, e_3] are all at 0
    np.testing.assert_allclose(swap_in.reciprocal_ranks(np.eye(4)[[1, 0, 2, 3]], np.eye(4)), [0.25, 0.25, 1, 1])
    with pytest.raises(ValueError, match="queries and documents"):
        swap_in.reciprocal_ranks(queries, documents[:2])


@pytest.mark.parametrize("scores, reference, expected", [
    ([1, 2, 3], [0, 0, 0], {"better": 3, "worse": 0, "statistic": 6, "p": 0.25}),  # 1 of 8 patterns as high, doubled
    ([0, 0, 0], [1, -2, 3], {"better": 1, "worse": 2, "statistic": 2, "p": 0.75}),  # sums 0,1,2,3,3,4,5,6: 3/8 ≤ 2
    ([1, -1, 2], [0, 0, 0], {"better": 2, "worse": 1, "statistic": 4.5, "p": 0.75}),  # a tie: ranks 1.5, 1.5, 3
    ([0.5, 0.5, 1 / 3], [0.5, 1, 1], {"better": 0, "worse": 2, "statistic": 0, "p": 0.5}),  # 1 of 4 patterns, doubled
    ([1, 2], [1, 2], {"better": 0, "worse": 0, "statistic": 0, "p": 1.0}),  # no text differs
])
def test_paired_rank_test_against_hand_counted_sign_patterns(scores, reference, expected):
    assert swap_in.paired_rank_test(scores, reference) == {key: pytest.approx(value) for key, value in expected.items()}


def test_paired_rank_test_equals_scipy_exact_wilcoxon_and_refuses_unpaired_scores():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for t in (6, 20, 48):
        scores = rng.normal(size=t) + 0.3
        expected = scipy_stats.wilcoxon(scores, method="exact").pvalue
        assert swap_in.paired_rank_test(scores, np.zeros(t))["p"] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ValueError, match=r"scores and reference_scores must be \(t,\) floats"):
        swap_in.paired_rank_test([1.0, 2.0], [1.0, 2.0, 3.0])


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_retrieval_noise_control_is_the_exact_score_without_error_and_chance_at_right_angles():
    rng = np.random.default_rng(7)  # not the control's own seed 0: its first turn would be a query itself
    queries = _unit(rng.standard_normal((30, 16)))
    documents = _unit(queries + 0.3 * rng.standard_normal((30, 16)))  # each near its own query, a few confusable
    exact = swap_in.retrieval_top1(queries, documents)
    ones = np.ones(30)
    np.testing.assert_allclose(swap_in.retrieval_noise_control(queries, documents, ones, ones, draws=5), (exact, 0.0),
                               atol=1e-12)  # no error: the exact score in every draw
    mean, sd = swap_in.retrieval_noise_control(queries, documents, 0 * ones, 0 * ones, draws=100)
    assert abs(mean - 1 / 30) < 3 * 0.033 / np.sqrt(100) + 0.02 and sd > 0  # orthogonal turns: chance, 1 / t
    shares = [swap_in.retrieval_noise_control(queries, documents, c * ones, c * ones, draws=100)[0]
              for c in (0.99, 0.9, 0.6)]
    # a larger error costs more hits (26/30 without error; measured 0.85, 0.60, 0.13, each ± 0.01 over 100 draws)
    assert abs(shares[0] - exact) < 0.05 and shares[0] > shares[1] + 0.1 > shares[2] + 0.2
    again = swap_in.retrieval_noise_control(queries, documents, 0.9 * ones, 0.9 * ones, draws=100)
    assert again[0] == shares[1]  # seeded: the same draws
    with pytest.raises(ValueError, match="t cosines each"):
        swap_in.retrieval_noise_control(queries, documents, ones[:5], ones)


def test_split_halves():
    first, second = swap_in.split_halves(["one two three four five", "a b"])
    assert first == ["one two", "a"] and second == ["three four five", "b"]
    with pytest.raises(ValueError, match="two words"):
        swap_in.split_halves(["lonely"])


def test_with_attention_swaps_only_the_chosen_layers(model):
    calls = []

    def counting(q, k, v, *, causal=False, key_mask=None):
        calls.append(1)
        return softmax_attention(q, k, v, causal=causal, key_mask=key_mask)

    swapped = model.with_attention(counting, layers=[2])
    swap_in.embeddings(swapped, TEXTS[:1], max_length=16)
    assert len(calls) == 1  # one layer ran the new kernel, the other five their own
    assert model.layers[2].attention.attention is not counting  # the original is untouched
    with pytest.raises(ValueError, match="layers must be indices"):
        model.with_attention(counting, layers=[6])


def test_controls_zero_and_uniform():
    q, k, v = qkv(b=1, n=6)
    mask = torch.tensor([[[True, True, True, True, False, False]]])  # (1, 1, s)
    assert swap_in.zero_kernel()(q, k, v).abs().max() == 0
    out = swap_in.uniform_kernel()(q, k, v, key_mask=mask)
    torch.testing.assert_close(out, v[..., :4, :].mean(dim=-2, keepdim=True).expand_as(out))
    # uniform attention is softmax attention with all-zero scores
    torch.testing.assert_close(out, softmax_attention(0 * q, k, v, key_mask=mask))


def test_between_texts_sees_a_collapse():
    rng = np.random.default_rng(1)
    spread = _unit(rng.normal(size=(8, 32)))
    collapsed = _unit(np.ones((8, 32)) + 0.01 * rng.normal(size=(8, 32)))
    assert abs(swap_in.between_texts(spread)) < 0.3 and swap_in.between_texts(collapsed) > 0.99
    assert swap_in.embedding_scores(spread, spread)["between_texts"] == pytest.approx(swap_in.between_texts(spread))


def test_attention_inputs_are_what_the_kernel_sees(model):
    captured = swap_in.attention_inputs(model, TEXTS[:2], max_length=16)
    assert len(captured) == model.config.n_layers
    q, k, v, key_mask = captured[0]
    assert q.shape == k.shape == v.shape and q.shape[:2] == (2, model.config.n_heads)
    assert key_mask.shape == (2, 1, q.shape[2]) and not key_mask[1].all()  # the second text is padded
    token_ids, mask = model.tokenize(TEXTS[:2], max_length=16, truncate=True)
    x = model.embeddings(token_ids)
    torch.testing.assert_close(q, model.layers[0].attention.q_proj(x).unflatten(-1, (12, -1)).transpose(1, 2))


def test_with_module_replaces_the_attention_modules(model):
    import copy

    made = []

    def make(attention):  # a copy of the layer's own attention: the embeddings must not move
        made.append(attention)
        return copy.deepcopy(attention)

    swapped = swap_in.with_module(model, make, layers=[0, 5])
    assert len(made) == 2 and swapped.layers[1].attention is not made[0]
    np.testing.assert_allclose(swap_in.embeddings(swapped, TEXTS, max_length=32),
                               swap_in.embeddings(model, TEXTS, max_length=32), atol=1e-6)
    with pytest.raises(ValueError, match="layers must be indices"):
        swap_in.with_module(model, make, layers=[-1])


def test_ranking_noise_control_is_the_exact_mrr_without_error_and_falls_with_the_error():
    rng = np.random.default_rng(7)
    queries = _unit(rng.standard_normal((30, 16)))
    documents = _unit(queries + 0.3 * rng.standard_normal((30, 16)))
    ones = np.ones(30)
    exact = swap_in.mean_reciprocal_rank(queries, documents)
    np.testing.assert_allclose(swap_in.ranking_noise_control(queries, documents, ones, ones, draws=5), (exact, 0.0),
                               atol=1e-12)
    scores = [swap_in.ranking_noise_control(queries, documents, c * ones, c * ones, draws=50)[0]
              for c in (0.99, 0.6, 0)]
    assert scores[0] > scores[1] > scores[2] and scores[2] < 0.3  # chance: (1 + 1/2 + … + 1/30) / 30 ≈ 0.13
