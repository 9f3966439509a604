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
import math

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
    """The chunk c of ``case``: its own, else the library's ``DEFAULT_CHUNK_SIZE``."""
    if case.chunk:
        return case.chunk
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


@dataclasses.dataclass
class Variant:
    """``build(case, tensors)`` returns ``(fn, leaves)``: a call, and the inputs that get gradients."""

    build: object
    flops: object
    sizes: tuple = ()  # which of "k", "m", "chunk" the variant depends on
    about: str = ""  # one line for --help


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
}


# --- the grid ---------------------------------------------------------------------------------

def problem(case):
    """Why ``case`` cannot be measured, in one line; None when it can."""
    if case.variant not in VARIANTS:
        return f"unknown variant {case.variant!r}: one of {', '.join(VARIANTS)}"
    sizes = VARIANTS[case.variant].sizes
    if case.n < 1:
        return f"n = {case.n}: a sequence needs n ≥ 1 positions"
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
