"""Chunked causal sums with their own backward, in memory linear in n. Notebook 06, Section 6.5.

For features a = phi(q), b = phi(k) and values v, ``CausalSums`` computes the numerator
y_i = Σ_{j ≤ i} (a_i·b_j) v_j and the normaliser z_i = Σ_{j ≤ i} a_i·b_j of causal linear
attention.  Autograd of the prefix-sum form keeps every state S_i = Σ_{j ≤ i} b_j v_jᵀ, an
``(n, f, e)`` tensor; this Function keeps only its inputs and the states at the chunk
boundaries, ``(n/c, f, e)``, and its backward recomputes the rest: the paper's gradients as
sums running forward and backward in time (Katharopoulos et al. 2020, §3.3.1, Eqs. 13-15).

Shapes: ``a, b (L, n, f)``, ``v (L, n, e)`` with the leading dims flattened into L; chunked,
``(L·g, c, f)`` with g chunks of c positions; ``i``, ``j`` index positions inside a chunk.
Every chunk is handled at once (batched products, one prefix sum over the chunk axis): a Python
loop over chunks would pay a kernel launch per chunk.  Each product's einsum is in its comment;
``bmm`` takes a transposed operand as a strided view, without the copy ``einsum`` may make.

The normaliser is the numerator's machinery with v = 1 (e = 1), written out rather than
appended to v as a ones column: ``bmm`` with 65 value columns runs 10-30 % slower than with
64 on CPU (``tools/bench_linear.py --kernel-choices`` measures both), and the extra work is a few small products.
"""

import math

import torch


def _chunks(x, chunk_size):
    """``(L, n, f)`` → ``(L·g, c, f)``, zero-padded to g·c positions (zero rows add nothing)."""
    length, n, width = x.shape
    g = -(-n // chunk_size)
    if g * chunk_size != n:
        x = torch.nn.functional.pad(x, (0, 0, 0, g * chunk_size - n))  # (L, g·c, f)
    return x.reshape(length * g, chunk_size, width)  # (L·g, c, f)


def _unchunk(x, length, n):
    """``(L·g, c, e)`` → ``(L, n, e)``: drop the padding."""
    padded = -(-n // x.shape[1]) * x.shape[1]  # g·c
    return x.reshape(length, padded, x.shape[-1])[:, :n]  # (L, n, e)


def _triangle(size, reverse, like):
    """Strictly lower (reverse: upper) triangular ones: row g sums the entries before (after) g."""
    ones = torch.ones(size, size, dtype=like.dtype, device=like.device)
    return ones.triu(1) if reverse else ones.tril(-1)


def _prefix_over_chunks(x, length, reverse=False):
    """Sum of ``x (L·g, f, e)`` over the chunks before each chunk (``reverse``: after it).

    An exclusive prefix sum over the chunk axis, written as products with triangular ones
    matrices: on CPU, ``torch.cumsum`` along a non-last axis runs several times slower than
    those products on the same data (``tools/bench_linear.py --kernel-choices``).  Chunks are grouped in blocks of
    b ≈ √g so both triangles stay small: one sums the earlier chunks of the same block, the
    other the earlier blocks; about 2·(b + g/b) multiply-adds per state entry.
    """
    shape, width = x.shape, x.shape[-2] * x.shape[-1]
    g = shape[0] // length if length else 0
    x = x.reshape(length, g, width)  # (L, g, f·e)
    block = math.isqrt(max(g, 1) - 1) + 1  # ⌈√g⌉ (1 for no chunks at all)
    blocks = -(-g // block)
    if blocks * block != g:
        x = torch.nn.functional.pad(x, (0, 0, 0, blocks * block - g))  # (L, G·b, f·e)
    x = x.reshape(length, blocks, block, width)  # (L, G, b, f·e)
    within = _triangle(block, reverse, x) @ x  # (L, G, b, f·e): the earlier chunks of the same block
    within += (_triangle(blocks, reverse, x) @ x.sum(dim=2)).unsqueeze(2)  # + all chunks of earlier blocks
    return within.reshape(length, blocks * block, width)[:, :g].reshape(shape)  # (L·g, f, e)


class CausalSums(torch.autograd.Function):
    """Numerator y_i = Σ_{j ≤ i} (a_i·b_j) v_j and normaliser z_i = Σ_{j ≤ i} a_i·b_j, chunked."""

    @staticmethod
    def forward(ctx, a, b, v, chunk_size):
        length, n, _ = a.shape
        ac, bc, vc = (_chunks(x, chunk_size) for x in (a, b, v))  # (L·g, c, f), (L·g, c, e)
        states = _prefix_over_chunks(torch.bmm(bc.transpose(1, 2), vc), length)  # "gjf,gje->gfe", earlier chunks
        key_states = _prefix_over_chunks(bc.sum(dim=1, keepdim=True), length)  # (L·g, 1, f): the same with v = 1
        scores = torch.bmm(ac, bc.transpose(1, 2)).tril_()  # "gif,gjf->gij" (L·g, c, c), j <= i kept
        y = torch.bmm(ac, states)  # "gif,gfe->gie": the earlier chunks
        y.baddbmm_(scores, vc)  # += "gij,gje->gie": this chunk, causally masked
        z = torch.baddbmm(scores.sum(dim=-1, keepdim=True), ac, key_states.transpose(1, 2))  # (L·g, c, 1)
        ctx.save_for_backward(a, b, v, states, key_states)
        ctx.chunk_size = chunk_size
        return _unchunk(y, length, n), _unchunk(z, length, n).squeeze(-1)  # (L, n, e), (L, n)

    @staticmethod
    def backward(ctx, grad_y, grad_z):
        a, b, v, states, key_states = ctx.saved_tensors
        length, n, _ = a.shape
        ac, bc, vc, gy, gz = (_chunks(x.contiguous(), ctx.chunk_size)
                              for x in (a, b, v, grad_y, grad_z.unsqueeze(-1)))  # gz (L·g, c, 1)
        # Eq. 13: grad_a_i = Σ_{j ≤ i} (grad_y_i·v_j + grad_z_i) b_j, the forward's pattern again.
        grad_scores = torch.baddbmm(gz, gy, vc.transpose(1, 2)).tril_()  # "gie,gje->gij" + grad_z_i
        grad_a = torch.bmm(grad_scores, bc)  # "gij,gjf->gif"
        grad_a.baddbmm_(gy, states.transpose(1, 2))  # += "gie,gfe->gif"
        grad_a.baddbmm_(gz, key_states)  # += grad_z_i · (keys of earlier chunks)
        # Eqs. 14-15: sums over i >= j, so the state runs backward in time: Σ_{later chunks} a_iᵀ grad_y_i.
        future = _prefix_over_chunks(torch.bmm(ac.transpose(1, 2), gy), length, reverse=True)  # (L·g, f, e)
        future_z = _prefix_over_chunks(torch.bmm(gz.transpose(1, 2), ac), length, reverse=True)  # (L·g, 1, f)
        grad_b = torch.bmm(grad_scores.transpose(1, 2), ac)  # "gij,gif->gjf"
        grad_b.baddbmm_(vc, future.transpose(1, 2))  # += "gje,gfe->gjf"
        grad_b += future_z
        scores = torch.bmm(ac, bc.transpose(1, 2)).tril_()  # recomputed, not stored: (L·g, c, c)
        grad_v = torch.bmm(scores.transpose(1, 2), gy)  # "gij,gie->gje"
        grad_v.baddbmm_(bc, future)  # += "gjf,gfe->gje"
        return _unchunk(grad_a, length, n), _unchunk(grad_b, length, n), _unchunk(grad_v, length, n), None
