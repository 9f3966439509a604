"""The attention variants the harness measures: how each is called, and how much work it is.

A ``Case`` is one variant at one size on one device.  ``VARIANTS`` maps a name to a ``Variant``:
a builder that turns random inputs into the call to time, the call's FLOP count, and which of
the sizes k (Linformer), m (Performer) and c (the chunk of the chunked causal form) it uses.

FLOP convention: only matrix products are counted, 2 FLOPs (a multiply and an add) per term.
Softmax, feature maps, scaling and masking are O(n·s) or O(n·f) element-wise work and are left
out, so the FLOP rate is the rate of *useful* matrix work.  Backward doubles every product
(C = A B needs dA = dC Bᵀ and dB = Aᵀ dC): forward+backward = 3 × forward.  Recomputation
inside a fused backward (SDPA re-forms q kᵀ) is not counted: it is the kernel's overhead.  A
causal variant is counted like its non-causal twin: a dense kernel computes the masked half
too, and the prefix-sum forms perform the same products as running sums.

The linear-attention and Performer modules are imported inside the builders, so the harness
(and every other variant) works wherever those modules are missing.
"""

import dataclasses
import importlib.util
import math
import os
import pathlib
import sys

import torch

MODES = ("forward", "forward+backward")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16}


@dataclasses.dataclass
class Case:
    """One measurement: a variant at one size, on one device."""

    variant: str
    n: int
    k: int = 0  # Linformer's projected length (0: the variant has none)
    m: int = 0  # Performer's random features
    chunk: int = 0  # positions per chunk of the chunked causal form (0: the library's default)
    b: int = 1
    h: int = 8
    d: int = 64  # head dim, d = e
    dtype: str = "float32"
    device: str = "cpu"
    mode: str = "forward"
    repeats: int = 5
    warmup: int = 2
    threads: int = 0  # 0: torch's default


# --- FLOP counts (s = n and e = d throughout) ------------------------------------------------

def exact_flops(case):
    """Exact attention: q kᵀ ``(n, d)·(d, s)`` and P v ``(n, s)·(s, e)``, with s = n and e = d.

    Notebook 04, Eq. (4.5).
    FLOPs = 2·b·h·n·s·(d + e) = 4·b·h·n²·d.
    """
    return 2 * case.b * case.h * case.n * case.n * (case.d + case.d)


def linformer_flops(case):
    """Linformer: E k ``(k, s)·(s, d)``, F v ``(k, s)·(s, e)``, q k̄ᵀ ``(n, d)·(d, k)``, P̄ v̄ ``(n, k)·(k, e)``.

    Notebook 04, Eq. (4.5).
    FLOPs = 2·b·h·k·(s·d + s·e + n·d + n·e) = 2·b·h·k·(n + s)·(d + e) = 8·b·h·k·n·d for s = n, e = d.
    """
    return 2 * case.b * case.h * case.k * (case.n + case.n) * (case.d + case.d)


def linear_flops(case, f=None):
    """Linear attention with f features: φ(k)ᵀ v ``(f, s)·(s, e)``, φ(q) S ``(n, f)·(f, e)``, φ(q)·z ``(n, f)·(f,)``.

    Notebook 06, Eq. (6.3).  FLOPs = 2·b·h·(s·f·e + n·f·e + n·f); elu+1 keeps f = d.
    """
    f = f or case.d
    return 2 * case.b * case.h * (case.n * f * case.d + case.n * f * case.d + case.n * f)


def chunk_size(case):
    """The chunk c of ``case``: its own, else the library's ``DEFAULT_CHUNK_SIZE`` for that variant's module."""
    if case.chunk:
        return case.chunk
    if case.variant in RECURRENT + LATER_RECURRENT:
        from course_lib.torch.gated import DEFAULT_CHUNK_SIZE
    else:
        from course_lib.torch.linear import DEFAULT_CHUNK_SIZE

    return DEFAULT_CHUNK_SIZE


def chunked_flops(case):
    """Chunked causal linear attention: the prefix-sum products plus, per chunk of c, φ(q)φ(k)ᵀ and its product with v.

    Notebook 06, Eq. (6.6).  FLOPs = linear + 2·b·h·n·c·(f + e) (each c × c block in full, masked half included).
    """
    return linear_flops(case) + 2 * case.b * case.h * case.n * chunk_size(case) * (case.d + case.d)


def chunked_performer_flops(case):
    """Chunked causal FAVOR+: ``performer_flops`` plus, per chunk of c, the c × c blocks with f = m features.

    Notebook 08, Eq. (8.6) with notebook 06, Eq. (6.6).  FLOPs = performer + 2·b·h·n·c·(m + e).
    """
    return performer_flops(case) + 2 * case.b * case.h * case.n * chunk_size(case) * (case.m + case.d)


def performer_flops(case):
    """FAVOR+: q ωᵀ and k ωᵀ ``(n, d)·(d, m)``, then linear attention with f = m features.

    Notebook 08, Eq. (8.6).  FLOPs = 2·b·h·(n + s)·d·m + linear attention with f = m.
    """
    return 2 * case.b * case.h * (case.n + case.n) * case.d * case.m + linear_flops(case, f=case.m)


def gated_flops(case):
    """Chunked gated linear attention (a decay per head): per chunk of c, Q Kᵀ and its product with V
    (c × c blocks in full), Q S and the chunk's write Kᵀ V (d × e each).

    Notebook 12, Eqs. (12.1)-(12.3).  FLOPs = 2·b·h·n·(c·(d + e) + 2·d·e).
    """
    return 2 * case.b * case.h * case.n * (chunk_size(case) * (case.d + case.d) + 2 * case.d * case.d)


def delta_flops(case):
    """The chunked (WY/UT) delta rule: per chunk of c, K Kᵀ and Q Kᵀ (c² d each), the triangular solve for
    W and U (c²(d + e)/2), W S, Q S and Kᵀ Ũ (c d e each), and the scores times Ũ (c² e).

    Notebook 12, Eq. (12.7).  FLOPs = 2·b·h·n·(c·(2.5 d + 1.5 e) + 3·d·e).
    """
    c, d, e = chunk_size(case), case.d, case.d
    return 2 * case.b * case.h * case.n * (c * (2.5 * d + 1.5 * e) + 3 * d * e)


def peer_delta_flops(case):
    """The peer at its chunk of 64: ``delta_flops`` with c = 64 (its solve is a row-by-row loop, the same products)."""
    return delta_flops(dataclasses.replace(case, chunk=PEER_CHUNK))


def loop_flops(case):
    """The token loop of the delta rule: per token kᵀS, the rank-one update and qᵀS, d·e each. 2·b·h·n·3·d·e."""
    return 2 * case.b * case.h * case.n * 3 * case.d * case.d


def product_flops(case, flops=delta_flops, n_householder=2):
    """DeltaProduct with n_h = 2: ``flops`` (chunked or loop) over its n·n_h rank-one steps (reads at every step)."""
    return flops(dataclasses.replace(case, n=case.n * n_householder))


def gated_loop_flops(case):
    """The token loop of gated linear attention: per token the write k vᵀ and the read qᵀS. 2·b·h·n·2·d·e."""
    return 2 * case.b * case.h * case.n * 2 * case.d * case.d


def total_flops(case):
    """FLOPs of ``case`` (forward, or forward+backward = 3 × forward)."""
    forward = VARIANTS[case.variant].flops(case)
    return forward * (3 if case.mode == "forward+backward" else 1)


# --- builders: (case, tensors) → (the call, the inputs that get gradients) ------------------

def _qkv(t):
    return [t["q"], t["k"], t["v"]]


def _build_exact(case, t, causal=False):
    from course_lib.torch.full import softmax_attention

    return (lambda: softmax_attention(t["q"], t["k"], t["v"], causal=causal)), _qkv(t)


def _build_sdpa(case, t, causal=False):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return (lambda: sdpa(t["q"], t["k"], t["v"], is_causal=causal)), _qkv(t)


def _build_linformer(case, t):
    from course_lib.torch.linformer import linformer_attention

    # One E and one F for every head and batch row: layerwise sharing, as in Linformer's Table 3.
    shape = (case.k, case.n)  # (k, s)
    t["E"] = torch.randn(shape, generator=t["gen"]).div_(math.sqrt(case.k)).to(t["q"])
    t["F"] = torch.randn(shape, generator=t["gen"]).div_(math.sqrt(case.k)).to(t["q"])
    leaves = [*_qkv(t), t["E"], t["F"]]
    return (lambda: linformer_attention(t["q"], t["k"], t["v"], t["E"], t["F"])), leaves


def _build_linformer_reference(case, t):
    from course_lib.torch.full import softmax_attention
    from course_lib.torch.linformer import project_sequence

    _, leaves = _build_linformer(case, t)
    E, F = t["E"], t["F"]
    # The same Linformer (Eq. 4.4), its softmax over the k projected keys written out step by step.
    return (lambda: softmax_attention(t["q"], project_sequence(E, t["k"]), project_sequence(F, t["v"]))), leaves


def _chunk_option(case, prefix):
    """The ``chunk_size`` keyword of a causal call: None (prefix sums), the case's chunk, or none (the default)."""
    if prefix:
        return {"chunk_size": None}
    return {"chunk_size": case.chunk} if case.chunk else {}  # no keyword at all: the library's default call


def _build_linear(case, t, causal=False, prefix=False):
    from course_lib.torch import linear

    if not causal:
        return (lambda: linear.linear_attention(t["q"], t["k"], t["v"])), _qkv(t)
    options = _chunk_option(case, prefix)
    return (lambda: linear.causal_linear_attention(t["q"], t["k"], t["v"], **options)), _qkv(t)


def _build_performer(case, t, causal=False, prefix=False):
    from course_lib.torch.performer import performer_attention, random_matrix

    # ω is drawn once, outside the timed call: redrawing features is the caller's choice, not the kernel's cost.
    omega = random_matrix(case.m, case.d, t["gen"]).to(t["q"])  # (f, d)
    options = _chunk_option(case, prefix) if causal else {}
    return (lambda: performer_attention(t["q"], t["k"], t["v"], omega, causal=causal, **options)), _qkv(t)


# --- the recurrences of notebooks 11-12 and their peer ----------------------------------------

PEER_CHUNK = 64  # flash-linear-attention's references at the chunk the course compares with
PEER_HINT = "the peer is not installed: run `python tools/peer_env.py` (benchmark environment only)"


def load_peer(name, folder=None):
    """One of flash-linear-attention 0.6.0's reference files, loaded by path (``tools/peer_env.py`` unpacks them).

    ``folder``: where they lie; default ``$COURSE_PEER_DIR`` or ``build/peer`` in the repository.
    """
    folder = pathlib.Path(folder or os.environ.get("COURSE_PEER_DIR")
                          or pathlib.Path(__file__).resolve().parents[2] / "build" / "peer")
    path = folder / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: {PEER_HINT}")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # for einops, unpacked beside the files
    spec = importlib.util.spec_from_file_location(f"peer_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recurrent_inputs(case, t, channels=False):
    """Unit keys (β‖k‖² ≤ 1, as the mixers make them), β in (0, 1), log decays near −0.02 per token."""
    t["k"] = torch.nn.functional.normalize(t["k"], dim=-1)
    shape = (case.b, case.h, case.n)
    t["beta"] = torch.sigmoid(torch.randn(shape, generator=t["gen"])).to(t["q"])
    gate_shape = (*shape, case.d) if channels else shape
    t["log_decay"] = torch.nn.functional.logsigmoid(torch.randn(gate_shape, generator=t["gen"]) + 4).to(t["q"])


def _build_delta(case, t, gated=False, loop=False, channels=False):
    from course_lib.torch.delta import delta_rule_attention

    _recurrent_inputs(case, t, channels)
    options = {"chunk_size": None} if loop else ({"chunk_size": case.chunk} if case.chunk else {})
    if gated:
        options["log_decay"] = t["log_decay"]
    leaves = [*_qkv(t), t["beta"], *([t["log_decay"]] if gated else [])]
    return (lambda: delta_rule_attention(t["q"], t["k"], t["v"], t["beta"], **options)), leaves


def _build_delta_product(case, t, n_householder=2, loop=False):
    from course_lib.torch.delta import delta_product_attention

    _recurrent_inputs(case, t)
    steps = (case.b, case.h, case.n * n_householder)  # n_h keys, values and strengths a token, token-major
    t["k"] = torch.nn.functional.normalize(torch.randn(*steps, case.d, generator=t["gen"]), dim=-1).to(t["q"])
    t["v"] = torch.randn(*steps, case.d, generator=t["gen"]).to(t["q"])
    t["beta"] = torch.sigmoid(torch.randn(steps, generator=t["gen"])).to(t["q"])
    options = {"chunk_size": None} if loop else ({"chunk_size": case.chunk} if case.chunk else {})
    leaves = [*_qkv(t), t["beta"], t["log_decay"]]
    return (lambda: delta_product_attention(t["q"], t["k"], t["v"], t["beta"], n_householder=n_householder,
                                            log_decay=t["log_decay"], **options)), leaves


def _build_peer_delta_product(case, t, n_householder=2):
    peer = load_peer("fla_delta_product_naive")
    _build_delta_product(case, t, n_householder)
    q, k, v, g, beta = (x.transpose(1, 2).contiguous() for x in (t["q"], t["k"], t["v"], t["log_decay"], t["beta"]))
    return (lambda: peer.naive_recurrent_gated_delta_product(q, k, v, g, beta, scale=1.0,
                                                             num_householder=n_householder)[0].transpose(1, 2)), \
        [q, k, v, g, beta]


def _build_finite_check(case, t):
    from course_lib.torch.gated import _check_tensors

    _recurrent_inputs(case, t)
    names, xs = ("q", "k", "v", "beta"), (t["q"], t["k"], t["v"], t["beta"])
    return (lambda: _check_tensors(names, xs)), list(xs)


def finite_check_flops(case):
    """The NaN/inf check of the recurrences' inputs q, k, v, β: a min and a max of each number, 2·b·h·n·(3d + 1)."""
    return 2 * case.b * case.h * case.n * (3 * case.d + 1)


def _build_gla(case, t, channels=False, loop=False):
    from course_lib.torch.gated import gated_linear_attention

    _recurrent_inputs(case, t, channels)
    options = {"chunk_size": None} if loop else ({"chunk_size": case.chunk} if case.chunk else {})
    leaves = [*_qkv(t), t["log_decay"]]
    return (lambda: gated_linear_attention(t["q"], t["k"], t["v"], t["log_decay"], **options)), leaves


def _build_peer_delta(case, t):
    peer = load_peer("fla_delta_naive")
    _recurrent_inputs(case, t)
    return (lambda: peer.delta_rule_chunkwise(t["q"], t["k"], t["v"], t["beta"], chunk_size=PEER_CHUNK)[0]), \
        [*_qkv(t), t["beta"]]


def _build_peer_gated_delta(case, t):
    peer = load_peer("fla_gated_delta_naive")
    _recurrent_inputs(case, t)
    # Its own layout, (b, n, h, d), made before the timed call: the leaves are what it is given.
    q, k, v, g, beta = (x.transpose(1, 2).contiguous() for x in (t["q"], t["k"], t["v"], t["log_decay"], t["beta"]))
    # Its output (b, n, h, e) is handed back as (b, h, n, e), a view, like every other variant's.
    return (lambda: peer.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=PEER_CHUNK)[0].transpose(1, 2)), \
        [q, k, v, g, beta]


def _build_peer_kda(case, t):
    peer = load_peer("fla_kda_naive")
    _recurrent_inputs(case, t, channels=True)
    q, k, v, g, beta = (x.transpose(1, 2).contiguous() for x in (t["q"], t["k"], t["v"], t["log_decay"], t["beta"]))
    return (lambda: peer.naive_chunk_kda(q, k, v, g, beta, chunk_size=PEER_CHUNK)[0].transpose(1, 2)), \
        [q, k, v, g, beta]


@dataclasses.dataclass
class Variant:
    """``build(case, tensors)`` returns ``(fn, leaves)``: a call, and the inputs that get gradients."""

    build: object
    flops: object
    sizes: tuple = ()  # which of "k", "m", "chunk" the variant depends on
    about: str = ""  # one line for --help
    forward_only: bool = False  # times something without a backward (a check)


def _causal(build, **options):
    return lambda case, t: build(case, t, causal=True, **options)


VARIANTS = {
    "exact": Variant(_build_exact, exact_flops, about="the course's softmax_attention (forms the n × s weights)"),
    "causal_exact": Variant(_causal(_build_exact), exact_flops, about="exact, causal=True"),
    "sdpa": Variant(_build_sdpa, exact_flops, about="PyTorch's fused scaled_dot_product_attention (stores no "
                    "n × s matrix)"),
    "causal_sdpa": Variant(_causal(_build_sdpa), exact_flops, about="sdpa, is_causal=True"),
    "linformer": Variant(_build_linformer, linformer_flops, ("k",), "linformer_attention: E k, F v, then the fused "
                         "kernel; one E, F for every head"),
    "linformer_reference": Variant(_build_linformer_reference, linformer_flops, ("k",),
                                   "the same projections, then the step-by-step softmax_attention"),
    "linear": Variant(_build_linear, linear_flops, about="linear_attention, elu+1 features (non-causal)"),
    "causal_linear": Variant(_causal(_build_linear), chunked_flops, ("chunk",), "causal_linear_attention as called "
                             "by default: chunked, DEFAULT_CHUNK_SIZE (or --chunk); memory linear in n"),
    "causal_linear_prefix": Variant(_causal(_build_linear, prefix=True), linear_flops, about="causal_linear_attention"
                                    "(chunk_size=None): prefix sums, the teaching form (backward stores n states)"),
    "performer": Variant(_build_performer, performer_flops, ("m",), "performer_attention, positive features (FAVOR+), "
                         "m random features"),
    "causal_performer": Variant(_causal(_build_performer), chunked_performer_flops, ("m", "chunk"),
                                "performer_attention(causal=True) as called by default: chunked"),
    "causal_performer_prefix": Variant(_causal(_build_performer, prefix=True), performer_flops, ("m",),
                                       "performer_attention(causal=True, chunk_size=None): prefix sums"),
    # Notebooks 11-12: the recurrences, chunked as the library calls them by default, their token loops, the peer.
    "delta": Variant(_build_delta, delta_flops, ("chunk",), "delta_rule_attention as called by default: WY/UT "
                     "chunks (DeltaNet)"),
    "gated_delta": Variant(lambda case, t: _build_delta(case, t, gated=True), delta_flops, ("chunk",),
                           "delta_rule_attention(log_decay=...) by default: Gated DeltaNet, chunked"),
    "gla": Variant(_build_gla, gated_flops, ("chunk",), "gated_linear_attention, a decay per head, chunked"),
    "gla_channel": Variant(lambda case, t: _build_gla(case, t, channels=True), gated_flops, ("chunk",),
                           "gated_linear_attention, a decay per channel (GLA), chunked"),
    "delta_loop": Variant(lambda case, t: _build_delta(case, t, loop=True), loop_flops,
                          about="delta_rule_attention(chunk_size=None): the token loop"),
    "gated_delta_loop": Variant(lambda case, t: _build_delta(case, t, gated=True, loop=True), loop_flops,
                                about="the gated delta rule's token loop"),
    "gla_loop": Variant(lambda case, t: _build_gla(case, t, loop=True), gated_loop_flops,
                        about="gated_linear_attention(chunk_size=None): the token loop"),
    "gla_channel_loop": Variant(lambda case, t: _build_gla(case, t, channels=True, loop=True), gated_loop_flops,
                                about="gated_linear_attention(chunk_size=None), a decay per channel: the token loop"),
    "kda": Variant(lambda case, t: _build_delta(case, t, gated=True, channels=True), delta_flops, ("chunk",),
                   "delta_rule_attention(log_decay=(..., n, d)) by default: Kimi Delta Attention, chunked, "
                   "sub-chunks inside"),
    "kda_loop": Variant(lambda case, t: _build_delta(case, t, gated=True, loop=True, channels=True), loop_flops,
                        about="Kimi Delta Attention's token loop"),
    "delta_product": Variant(_build_delta_product, product_flops, ("chunk",), "delta_product_attention, n_h = 2, a "
                             "decay per head: the chunked delta rule over 2n steps"),
    "delta_product_loop": Variant(lambda case, t: _build_delta_product(case, t, loop=True),
                                  lambda case: product_flops(case, loop_flops),
                                  about="delta_product_attention(chunk_size=None): its token loop, 2n steps"),
    "fla_delta_product": Variant(_build_peer_delta_product, lambda case: product_flops(case, loop_flops),
                                 about="the peer: flash-linear-attention 0.6.0's naive_recurrent_gated_delta_product "
                                 "(pure PyTorch, a token loop, n_h = 2)"),
    "finite_check": Variant(_build_finite_check, finite_check_flops, about="the check every recurrence makes of its "
                            "q, k, v and β (one aminmax pass each, NaN and inf refused): its share of a forward call",
                            forward_only=True),
    "fla_kda": Variant(_build_peer_kda, peer_delta_flops, about="the peer: flash-linear-attention 0.6.0's "
                       "naive_chunk_kda (pure PyTorch, chunk 64), tools/peer_env.py"),
    "fla_delta": Variant(_build_peer_delta, peer_delta_flops, about="the peer: flash-linear-attention 0.6.0's "
                         "delta_rule_chunkwise (pure PyTorch, chunk 64), tools/peer_env.py"),
    "fla_gated_delta": Variant(_build_peer_gated_delta, peer_delta_flops, about="the peer: flash-linear-attention "
                               "0.6.0's naive_chunk_gated_delta_rule (pure PyTorch, chunk 64)"),
}
RECURRENT = ("delta", "gated_delta", "gla", "gla_channel", "delta_loop", "gated_delta_loop", "gla_loop", "fla_delta",
             "fla_gated_delta")
# Lessons 12-13's later additions (GLA per channel's loop, Kimi Delta Attention, DeltaProduct, the input check):
# the recurrences' default chunk, like RECURRENT
LATER_RECURRENT = ("gla_channel_loop", "kda", "kda_loop", "delta_product", "delta_product_loop", "fla_kda",
                   "fla_delta_product", "finite_check")


# --- the grid ---------------------------------------------------------------------------------

def problem(case):
    """Why ``case`` cannot be measured, in one line; None when it can."""
    if case.variant not in VARIANTS:
        return f"unknown variant {case.variant!r}: one of {', '.join(VARIANTS)}"
    sizes = VARIANTS[case.variant].sizes
    if case.n < 1:
        return f"n = {case.n}: a sequence needs n ≥ 1 positions"
    if VARIANTS[case.variant].forward_only and case.mode != "forward":
        return f"{case.variant} times a check, which has no backward: measure it with mode forward"
    if "k" in sizes and case.k < 1:
        return f"k = {case.k}: Linformer needs k ≥ 1 projected positions"
    if "k" in sizes and case.k > case.n:
        return f"k = {case.k} > n = {case.n}: Linformer projects n positions down to k ≤ n"
    if "m" in sizes and case.m < 1:
        return f"m = {case.m}: Performer needs m ≥ 1 random features"
    if case.chunk < 0:
        return f"chunk = {case.chunk}: a chunk holds c ≥ 1 positions"
    return None


def make_cases(variants, ns, ks=(), ms=(), skipped=None, **common):
    """Every case of the grid; a variant that ignores k (or m) is measured once per n.

    Cases that cannot be measured (k > n) and those that teach nothing (k = n projects nothing
    away) are left out; pass a list as ``skipped`` to receive ``(case, reason)`` for each.
    """
    cases = []
    for n in ns:
        for name in variants:
            sizes = VARIANTS[name].sizes
            for k in (ks if "k" in sizes else [0]):
                for m in (ms if "m" in sizes else [0]):
                    chunk = chunk_size(Case(name, n, chunk=common.get("chunk", 0))) if "chunk" in sizes else 0
                    case = Case(name, n, k=k, m=m, **{**common, "chunk": chunk})
                    reason = problem(case) or (f"k = n = {n}: Linformer at k = n projects nothing away"
                                               if k and k == n else None)
                    if reason is None:
                        cases.append(case)
                    elif skipped is not None:
                        skipped.append((case, reason))
    return cases
