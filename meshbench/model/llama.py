"""A dense Llama forward pass in numpy: prefill of one prompt, decode of a batch.

Conventions follow llama.cpp's ``llama`` architecture so the same weights give the
same logits there: RMSNorm, rotary embedding on adjacent pairs (x[2i], x[2i+1]) at
angle pos * theta^(-2i/head_dim), grouped-query attention where query head h reads KV
head h // (n_heads / n_kv_heads), SwiGLU feed-forward, weights in (out, in) layout.

The model reads and writes K/V through ``KvSlot`` views (arrays plus a start
position); it never decides who owns them. That is the KV manager's job.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from meshbench.model.config import ModelConfig
from meshbench.model.weights import Weights


class KvSlot(Protocol):
    """One session's preallocated cache: K/V arrays and how many positions are stored."""

    k: np.ndarray  # (n_layers, capacity, n_kv_heads, head_dim)
    v: np.ndarray  # (n_layers, capacity, n_kv_heads, head_dim)
    length: int


def linear(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """x @ w.T for w in (out, in) layout: (N, in) -> (N, out).

    The layout is chosen by measurement (`meshbench bench layouts`, README): one row is a
    matrix-vector product; several rows multiply the weight by one contiguous (in, N)
    block, 1.3 to 1.5x faster here than ``x @ w.T`` for 2 to 16 rows.
    """
    if x.shape[0] == 1:
        return (w @ x[0])[None, :]  # (1, out)
    return (w @ np.ascontiguousarray(x.T)).T  # (N, out)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    # x: (N, dim), w: (dim,)
    ms = np.mean(x * x, axis=-1, keepdims=True)  # (N, 1)
    return x / np.sqrt(ms + eps) * w


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate adjacent pairs of x: (N, H, head_dim) at positions (N,)."""
    hd = x.shape[-1]
    freqs = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # (hd/2,)
    ang = positions.astype(np.float64)[:, None] * freqs[None, :]  # (N, hd/2)
    cos = np.cos(ang).astype(x.dtype)[:, None, :]  # (N, 1, hd/2)
    sin = np.sin(ang).astype(x.dtype)[:, None, :]
    xe, xo = x[..., 0::2], x[..., 1::2]  # (N, H, hd/2) each
    out = np.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xe * sin + xo * cos
    return out


def softmax(s: np.ndarray) -> np.ndarray:
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(axis=-1, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _attend(cfg: ModelConfig, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray) -> np.ndarray:
    """Causal GQA attention of queries q: (T, n_heads, hd) over k, v: (S, n_kv, hd).

    Query t sits at absolute position q_pos[t] and sees keys 0..q_pos[t]. Returns (T, dim).
    """
    T, S, hd = q.shape[0], k.shape[0], cfg.head_dim
    group = cfg.n_heads // cfg.n_kv_heads
    qg = q.reshape(T, cfg.n_kv_heads, group, hd).transpose(1, 2, 0, 3)  # (n_kv, group, T, hd)
    kt = k.transpose(1, 2, 0)  # (n_kv, hd, S)
    scores = (qg @ kt[:, None]) / np.sqrt(hd)  # (n_kv, group, T, S)
    if T > 1 or S > q_pos[0] + 1:
        mask = np.arange(S)[None, :] > q_pos[:, None]  # (T, S)
        scores = np.where(mask, -np.inf, scores)
    p = softmax(scores)  # (n_kv, group, T, S)
    out = p @ v.transpose(1, 0, 2)[:, None]  # (n_kv, group, T, hd)
    return out.transpose(2, 0, 1, 3).reshape(T, cfg.dim)  # (T, dim)


def _qkv(cfg: ModelConfig, lw, h: np.ndarray, pos: np.ndarray):
    """Project normed activations h: (N, dim) at positions (N,) to rotated q and k, and v.

    Returns q: (N, n_heads, hd), k: (N, n_kv, hd), v: (N, n_kv, hd).
    """
    n = h.shape[0]
    q = rope(linear(lw.wq, h).reshape(n, cfg.n_heads, cfg.head_dim), pos, cfg.rope_theta)
    k = rope(linear(lw.wk, h).reshape(n, cfg.n_kv_heads, cfg.head_dim), pos, cfg.rope_theta)
    v = linear(lw.wv, h).reshape(n, cfg.n_kv_heads, cfg.head_dim)
    return q, k, v


def _ffn(lw, x: np.ndarray) -> np.ndarray:
    # x: (N, dim) -> (N, dim)
    return linear(lw.w_down, silu(linear(lw.w_gate, x)) * linear(lw.w_up, x))


def prefill(cfg: ModelConfig, w: Weights, slot: KvSlot, tokens: Sequence[int]) -> np.ndarray:
    """Run a whole prompt in one forward pass; store its K/V; return the last logits (vocab,).

    Positions start at slot.length; the caller commits len(tokens) positions afterwards.
    """
    T = len(tokens)
    start = slot.length
    pos = np.arange(start, start + T)  # (T,)
    x = w.tok_embd[np.asarray(tokens)]  # (T, dim)
    for li, lw in enumerate(w.layers):
        q, k, v = _qkv(cfg, lw, rms_norm(x, lw.attn_norm, cfg.norm_eps), pos)  # (T, heads, hd)
        slot.k[li, start : start + T] = k
        slot.v[li, start : start + T] = v
        a = _attend(cfg, q, slot.k[li, : start + T], slot.v[li, : start + T], pos)  # (T, dim)
        x = x + linear(lw.wo, a)
        x = x + _ffn(lw, rms_norm(x, lw.ffn_norm, cfg.norm_eps))
    last = rms_norm(x[-1:], w.out_norm, cfg.norm_eps)  # (1, dim)
    return linear(w.output, last)[0]  # (vocab,)


def decode(cfg: ModelConfig, w: Weights, slots: Sequence[KvSlot], tokens: Sequence[int]) -> np.ndarray:
    """One decode step for B sessions in ONE forward pass; returns logits (B, vocab).

    Session b feeds tokens[b] at position slots[b].length. Every weight matrix is applied
    once to the stacked (B, dim) activations; only attention loops over sessions, each
    reading its own cache. The caller commits one position per session afterwards.
    """
    B = len(slots)
    pos = np.array([s.length for s in slots])  # (B,)
    x = w.tok_embd[np.asarray(tokens)]  # (B, dim)
    for li, lw in enumerate(w.layers):
        q, k, v = _qkv(cfg, lw, rms_norm(x, lw.attn_norm, cfg.norm_eps), pos)  # (B, heads, hd)
        a = np.empty((B, cfg.dim), dtype=x.dtype)  # (B, dim)
        for b, s in enumerate(slots):
            p = pos[b]
            s.k[li, p] = k[b]
            s.v[li, p] = v[b]
            a[b] = _attend(cfg, q[b : b + 1], s.k[li, : p + 1], s.v[li, : p + 1], pos[b : b + 1])[0]
        x = x + linear(lw.wo, a)
        x = x + _ffn(lw, rms_norm(x, lw.ffn_norm, cfg.norm_eps))
    return linear(w.output, rms_norm(x, w.out_norm, cfg.norm_eps))  # (B, vocab)
