"""GPT-2's forward pass in numpy, over a trained GPT2LMHeadModel's weights, with a key/value
cache: what decoding runs in a build.

Why not call the transformers model: one cached step of a model this small costs about 4 ms in
transformers' Python layers and 0.2 ms here, and decoding takes one step per token (a whole
model's tasks must decode in well under a second). The arithmetic is transformers' GPT-2
(pre-norm blocks, gelu_new, causal attention scaled by 1/sqrt(head size), tied output embedding);
tests/test_tlm.py checks the logits against the transformers model to 1e-5.
"""

from __future__ import annotations

import numpy as np


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu_new(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))


class NumpyGPT2:
    """The forward pass of one GPT2LMHeadModel, fp32, from its state dict."""

    def __init__(self, state: dict[str, np.ndarray], n_layer: int, n_head: int, n_positions: int,
                 eps: float = 1e-5) -> None:
        f = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()}
        self.wte, self.wpe = f["transformer.wte.weight"], f["transformer.wpe.weight"]
        self.wte_t = np.ascontiguousarray(self.wte.T)
        self.layers = []
        for i in range(n_layer):
            p = f"transformer.h.{i}."
            self.layers.append(tuple(f[p + n] for n in (
                "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias")))
        self.ln_f = (f["transformer.ln_f.weight"], f["transformer.ln_f.bias"])
        self.n_head, self.n_positions, self.eps = n_head, n_positions, eps
        self.embd = self.wte.shape[1]
        self.head = self.embd // n_head

    def start(self) -> Cache:
        return Cache(len(self.layers), self.n_positions, self.n_head, self.head)

    def step(self, ids: list[int], cache: Cache) -> np.ndarray:
        """Feeds ``ids`` after what ``cache`` holds; returns the final hidden state after the last
        (``logits`` turns it into scores of the tokens asked for)."""
        t0, n = cache.length, len(ids)
        if t0 + n > self.n_positions:
            raise OverflowError("sentence longer than the model's context")
        x = self.wte[ids] + self.wpe[t0: t0 + n]
        scale = np.float32(1.0 / np.sqrt(self.head))
        causal = np.triu(np.full((n, t0 + n), -np.inf, dtype=np.float32), k=t0 + 1) if n > 1 else None
        for layer, (ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fc2w, fc2b) in enumerate(self.layers):
            h = _layer_norm(x, ln1w, ln1b, self.eps)
            qkv = h @ qkvw + qkvb
            q, k, v = (qkv[:, i * self.embd:(i + 1) * self.embd].reshape(n, self.n_head, self.head) for i in range(3))
            cache.k[layer, :, t0: t0 + n] = k.transpose(1, 0, 2)
            cache.v[layer, :, t0: t0 + n] = v.transpose(1, 0, 2)
            keys, values = cache.k[layer, :, : t0 + n], cache.v[layer, :, : t0 + n]  # (H, T, D)
            scores = np.matmul(q.transpose(1, 0, 2), keys.transpose(0, 2, 1)) * scale  # (H, n, T)
            if causal is not None:
                scores = scores + causal
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended = np.matmul(scores, values).transpose(1, 0, 2).reshape(n, self.embd)
            x = x + attended @ projw + projb
            h = _layer_norm(x, ln2w, ln2b, self.eps)
            x = x + _gelu_new(h @ fcw + fcb) @ fc2w + fc2b
        cache.length += n
        return _layer_norm(x[-1], *self.ln_f, self.eps)

    def logits(self, hidden: np.ndarray, ids: list[int] | None = None) -> np.ndarray:
        """Scores of the tokens ``ids`` (every token when None) after ``hidden``: the tied output
        embedding, computed only where asked (decoding scores a few legal tokens at a time)."""
        return hidden @ (self.wte_t if ids is None else self.wte[ids].T)


class Cache:
    """Keys and values of every layer for the tokens fed so far."""

    def __init__(self, layers: int, positions: int, heads: int, head: int) -> None:
        self.k = np.zeros((layers, heads, positions, head), dtype=np.float32)
        self.v = np.zeros((layers, heads, positions, head), dtype=np.float32)
        self.length = 0
