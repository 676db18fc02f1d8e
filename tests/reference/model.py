"""Float64 reference forward pass for the qwen3moe, qwen3 and glm4moe architectures.

Owns: hyperparameters from GGUF metadata, weight loading (every weight
dequantized exactly to float64), the transformer forward pass as llama.cpp
defines it for these architectures (glm4moe: attention biases, optional q/k
norms, partial RoPE, leading dense layers, biased sigmoid routing with a
shared expert; its trailing NextN layers are not run), and the output head
(log-sum-exp over the whole vocabulary row and the top-k ids per position),
which is computed in vocabulary chunks so memory stays bounded.
"""

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import dequant
import gguf

SUPPORTED_ARCHS = ("qwen3moe", "qwen3", "glm4moe")

# llama.cpp clamps the routed weights' sum to this before dividing by it
EXPERT_WEIGHTS_SUM_MIN = 6.103515625e-5


class Hparams:
    def __init__(self, md):
        arch = md.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError("unsupported architecture %r" % arch)
        self.arch = arch

        def get(key, default=None):
            v = md.get(arch + "." + key, default)
            if v is None:
                raise ValueError("missing metadata %s.%s" % (arch, key))
            return v

        self.block_count = int(get("block_count"))
        # glm4moe's trailing NextN (multi-token prediction) layers are not run
        self.n_nextn = int(get("nextn_predict_layers", 0)) if arch == "glm4moe" else 0
        if not 0 <= self.n_nextn < self.block_count:
            raise ValueError("nextn_predict_layers %d with block_count %d"
                             % (self.n_nextn, self.block_count))
        self.n_layer = self.block_count - self.n_nextn
        self.n_embd = int(get("embedding_length"))
        self.n_head = int(get("attention.head_count"))
        self.n_head_kv = int(get("attention.head_count_kv", self.n_head))
        self.head_dim = int(get("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(get("attention.value_length", self.head_dim))
        self.eps = float(get("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(get("rope.freq_base", 10000.0))
        self.rope_dim = int(get("rope.dimension_count", self.head_dim))  # n_rot
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ValueError("rope.dimension_count %d with head_dim %d" % (self.rope_dim, self.head_dim))
        self.n_expert = 0
        self.n_expert_used = 0
        self.n_expert_shared = 0
        self.n_layer_dense_lead = 0
        if arch in ("qwen3moe", "glm4moe"):
            self.n_expert = int(get("expert_count"))
            self.n_expert_used = int(get("expert_used_count"))
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError("expert_used_count %d with expert_count %d"
                                 % (self.n_expert_used, self.n_expert))
        if arch == "glm4moe":
            if self.head_dim_v != self.head_dim:
                raise ValueError("glm4moe needs value_length == key_length")
            self.n_ff_exp = int(get("expert_feed_forward_length"))
            self.n_expert_shared = int(get("expert_shared_count"))
            self.n_layer_dense_lead = int(get("leading_dense_block_count", 0))
            self.expert_weights_scale = float(get("expert_weights_scale", 1.0))
            self.expert_weights_norm = bool(get("expert_weights_norm", False))
            gating = int(get("expert_gating_func", 2))
            # 0 ("none") is what llama.cpp reads as glm4moe's default, sigmoid
            if gating not in (0, 1, 2):
                raise ValueError("glm4moe.expert_gating_func %d: only 1 (softmax) "
                                 "and 2 (sigmoid) are known" % gating)
            self.expert_gating = "softmax" if gating == 1 else "sigmoid"
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head %d not a multiple of n_head_kv %d" % (self.n_head, self.n_head_kv))


def rms_norm(x, w, eps):
    """RMSNorm over the last axis, then multiply by w."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    e = np.exp(-np.abs(x))  # no overflow for large |x|
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def rope_neox(x, pos, base, n_rot):
    """x (T, H, D); rotate pairs (i, i + n_rot/2) for i < n_rot/2."""
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half, dtype=np.float64) / n_rot)
    theta = pos.astype(np.float64)[:, None] * inv[None, :]  # (T, half)
    cos = np.cos(theta)[:, None, :]
    sin = np.sin(theta)[:, None, :]
    x0 = x[..., :half]
    x1 = x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def _mm_einsum(x, w):
    return np.einsum("tk,nk->tn", x, w)


def _mm_blas(x, w):
    return x @ w.T


def _pick_mm():
    """Use BLAS when it is an optimized one, numpy's own loops otherwise.

    numpy linked to the reference BLAS runs x @ w.T several times slower than
    einsum; an optimized BLAS is much faster than einsum. A short timing
    decides; BLOOMERY_REF_MATMUL=einsum|blas overrides it.
    """
    env = os.environ.get("BLOOMERY_REF_MATMUL")
    if env in ("einsum", "blas"):
        return _mm_einsum if env == "einsum" else _mm_blas
    import time
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256))
    w = rng.standard_normal((1024, 256))
    fs = (_mm_einsum, _mm_blas)
    best = [float("inf"), float("inf")]
    for _ in range(3):
        for i, f in enumerate(fs):
            t = time.perf_counter()
            f(x, w)
            best[i] = min(best[i], time.perf_counter() - t)
    return fs[0] if best[0] <= best[1] else fs[1]


_MM = None
_MM_LOCK = threading.Lock()


def mm(x, w):
    """x (T, K) times w (N, K) transposed -> (T, N), float64."""
    global _MM
    if _MM is None:
        with _MM_LOCK:
            if _MM is None:
                _MM = _pick_mm()
    return _MM(x, w)


def swiglu_ffn(x, gate, up, down):
    """down(silu(gate x) * up x); gate, up (n_ff, n_embd), down (n_embd, n_ff)."""
    return mm(silu(mm(x, gate)) * mm(x, up), down)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _n_threads():
    env = os.environ.get("BLOOMERY_REF_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_POOL = None


def pmap(f, items):
    """map f over items on a shared thread pool (numpy releases the GIL)."""
    global _POOL
    items = list(items)
    n = _n_threads()
    if n <= 1 or len(items) <= 1:
        return [f(x) for x in items]
    if _POOL is None or _POOL._max_workers != n:
        _POOL = ThreadPoolExecutor(n)
    return list(_POOL.map(f, items))


class Layer:
    pass


class Model:
    """A GGUF qwen3moe / qwen3 / glm4moe model computed in float64.

    Small models are decoded once (every weight kept in float64). With
    lazy=True (the default when the decoded weights would pass
    LAZY_BYTES) a layer's weights are decoded when the layer runs, experts one
    at a time, and the output matrix chunk by chunk, so memory stays bounded
    for large files at the cost of decoding again on every pass.

    norm_topk applies to qwen3moe only; glm4moe files say whether the routed
    weights are normalised (expert_weights_norm).
    """

    LAZY_BYTES = 2 << 30

    def __init__(self, path, norm_topk=True, lazy=None):
        self.path = path
        self.gf = gguf.load(path)
        self.hp = Hparams(self.gf.metadata)
        self.norm_topk = norm_topk
        t = self.gf.tensors
        hp = self.hp
        self.tok_embd_t = t["token_embd.weight"]
        self.n_vocab = self.tok_embd_t.shape[0]
        self.tied = "output.weight" not in t
        self.output_t = self.tok_embd_t if self.tied else t["output.weight"]
        if lazy is None:
            total = sum(x.n_elements for x in t.values()) * 8
            lazy = total > self.LAZY_BYTES
        self.lazy = lazy
        self.output_norm = self._w("output_norm.weight")
        self._output = None
        self.layers = [None if lazy else self._layer(i) for i in range(hp.n_layer)]

    def _w(self, name):
        t = self.gf.tensors
        if name not in t:
            raise KeyError("tensor %s missing from %s" % (name, self.path))
        return dequant.dequantize(t[name])

    def _opt(self, name):
        """The tensor decoded, or None when the file lacks it."""
        return self._w(name) if name in self.gf.tensors else None

    def _layer(self, i):
        hp = self.hp
        w = self._w
        p = "blk.%d." % i
        glm = hp.arch == "glm4moe"
        L = Layer()
        L.attn_norm = w(p + "attn_norm.weight")
        L.wq = w(p + "attn_q.weight")  # (n_head*hd, n_embd)
        L.wk = w(p + "attn_k.weight")
        L.wv = w(p + "attn_v.weight")
        L.wo = w(p + "attn_output.weight")  # (n_embd, n_head*hd_v)
        if glm:
            L.bq = w(p + "attn_q.bias")
            L.bk = w(p + "attn_k.bias")
            L.bv = w(p + "attn_v.bias")
            # GLM-4.5 has q/k norms, GLM-4.5-Air not
            L.q_norm = self._opt(p + "attn_q_norm.weight")
            L.k_norm = self._opt(p + "attn_k_norm.weight")
            L.ffn_norm = w(p + "post_attention_norm.weight")
        else:
            L.bq = L.bk = L.bv = None
            L.q_norm = w(p + "attn_q_norm.weight")
            L.k_norm = w(p + "attn_k_norm.weight")
            L.ffn_norm = w(p + "ffn_norm.weight")
        L.is_moe = hp.n_expert > 0 and i >= hp.n_layer_dense_lead
        L.probs_bias = None
        L.shexp = None
        if L.is_moe:
            L.router = w(p + "ffn_gate_inp.weight")  # (n_expert, n_embd)
            L.expert = self._expert_loader(p)
            if glm:
                L.probs_bias = w(p + "exp_probs_b.bias")  # (n_expert,)
                if hp.n_expert_shared > 0:
                    L.shexp = tuple(w(p + n) for n in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                                       "ffn_down_shexp.weight"))
                    n_ff_sh = hp.n_ff_exp * hp.n_expert_shared
                    if L.shexp[0].shape[0] != n_ff_sh:
                        raise ValueError("%sffn_gate_shexp.weight has %d rows, want %d"
                                         % (p, L.shexp[0].shape[0], n_ff_sh))
        else:
            L.gate = w(p + "ffn_gate.weight")  # (n_ff, n_embd)
            L.up = w(p + "ffn_up.weight")
            L.down = w(p + "ffn_down.weight")  # (n_embd, n_ff)
        return L

    def _expert_loader(self, p):
        """expert(e) -> (gate (n_ff, n_embd), up, down (n_embd, n_ff)) of layer prefix p."""
        names = [p + n for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                 "ffn_down_exps.weight")]
        for n in names:
            if n not in self.gf.tensors:
                raise KeyError("tensor %s missing from %s" % (n, self.path))
        if self.lazy:
            ts = [self.gf.tensors[n] for n in names]
            return lambda e, ts=ts: tuple(dequant.dequantize(x, rows=[e])[0] for x in ts)
        g, u, d = (self._w(n) for n in names)  # (n_expert, ...)
        return lambda e, g=g, u=u, d=d: (g[e], u[e], d[e])

    def layer(self, i):
        return self.layers[i] if self.layers[i] is not None else self._layer(i)

    # ---- weights -------------------------------------------------------
    @property
    def output(self):
        """Output matrix (n_vocab, n_embd) float64, decoded on first use."""
        if self._output is None:
            self._output = dequant.dequantize(self.output_t)
        return self._output

    def output_rows(self, s, e):
        """Rows s..e-1 of the output matrix."""
        if self.lazy and self._output is None:
            return dequant.dequantize(self.output_t, rows=np.arange(s, e))
        return self.output[s:e]

    def embed(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise ValueError("token id out of range [0, %d)" % self.n_vocab)
        if self.tied and self._output is not None:
            return self._output[ids]
        uniq, inv = np.unique(ids, return_inverse=True)
        rows = dequant.dequantize(self.tok_embd_t, rows=uniq)
        return rows[inv]

    # ---- blocks --------------------------------------------------------
    def attention(self, L, x, pos):
        hp = self.hp
        T = x.shape[0]
        q, k, v = mm(x, L.wq), mm(x, L.wk), mm(x, L.wv)
        if L.bq is not None:
            q, k, v = q + L.bq, k + L.bk, v + L.bv
        q = q.reshape(T, hp.n_head, hp.head_dim)
        k = k.reshape(T, hp.n_head_kv, hp.head_dim)
        v = v.reshape(T, hp.n_head_kv, hp.head_dim_v)
        if L.q_norm is not None:
            q = rms_norm(q, L.q_norm, hp.eps)
        if L.k_norm is not None:
            k = rms_norm(k, L.k_norm, hp.eps)
        q = rope_neox(q, pos, hp.rope_base, hp.rope_dim)
        k = rope_neox(k, pos, hp.rope_base, hp.rope_dim)
        scale = 1.0 / math.sqrt(hp.head_dim)
        group = hp.n_head // hp.n_head_kv
        out = np.empty((T, hp.n_head, hp.head_dim_v))
        blk = 256

        def one(job):
            a, h = job
            b = min(T, a + blk)
            kv = h // group
            # query rows a..b-1 see keys 0..row
            mask = np.arange(b)[None, :] > np.arange(a, b)[:, None]
            s = mm(q[a:b, h, :], k[:b, kv, :]) * scale
            s[mask] = -np.inf
            out[a:b, h, :] = softmax(s, axis=-1) @ v[:b, kv, :]

        pmap(one, [(a, h) for a in range(0, T, blk) for h in range(hp.n_head)])
        return mm(out.reshape(T, hp.n_head * hp.head_dim_v), L.wo)

    def route(self, L, x):
        """Chosen experts (T, k), best first, and their weights (T, k)."""
        hp = self.hp
        k = hp.n_expert_used
        logits = mm(x, L.router)  # (T, n_expert)
        if hp.arch == "qwen3moe":
            probs = softmax(logits, axis=-1)
            # top-k by probability; stable order by descending probability
            sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
            wsel = np.take_along_axis(probs, sel, axis=-1)
            if self.norm_topk:
                wsel = wsel / np.sum(wsel, axis=-1, keepdims=True)
            return sel, wsel
        probs = softmax(logits, axis=-1) if hp.expert_gating == "softmax" else sigmoid(logits)
        # the bias only steers the choice (ties: lower id); weights are the unbiased probs
        sel = np.argsort(-(probs + L.probs_bias), axis=-1, kind="stable")[:, :k]
        wsel = np.take_along_axis(probs, sel, axis=-1)
        if hp.expert_weights_norm:
            wsel = wsel / np.maximum(np.sum(wsel, axis=-1, keepdims=True), EXPERT_WEIGHTS_SUM_MIN)
        return sel, wsel * hp.expert_weights_scale

    def experts(self, L, x, sel, wsel):
        """sum over j of wsel[:, j] * expert sel[:, j] applied to x."""

        def one(e):
            rows, slot = np.nonzero(sel == e)
            if rows.size == 0:
                return None
            y = swiglu_ffn(x[rows], *L.expert(e))
            return rows, wsel[rows, slot][:, None] * y

        out = np.zeros_like(x)
        for r in pmap(one, range(self.hp.n_expert)):  # summed in expert order
            if r is not None:
                out[r[0]] += r[1]
        return out

    def moe(self, L, x):
        sel, wsel = self.route(L, x)
        out = self.experts(L, x, sel, wsel)
        if L.shexp is not None:
            out = out + swiglu_ffn(x, *L.shexp)
        self.last_routing = sel
        return out

    def dense_ffn(self, L, x):
        return swiglu_ffn(x, L.gate, L.up, L.down)

    def hidden(self, ids):
        """Final-normed hidden states (T, n_embd) for token ids at positions 0..T-1."""
        hp = self.hp
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.arange(len(ids))
        x = self.embed(ids)
        for i in range(hp.n_layer):
            L = self.layer(i)
            h = rms_norm(x, L.attn_norm, hp.eps)
            x = x + self.attention(L, h, pos)
            h = rms_norm(x, L.ffn_norm, hp.eps)
            x = x + (self.moe(L, h) if L.is_moe else self.dense_ffn(L, h))
        return rms_norm(x, self.output_norm, hp.eps)

    # ---- output head ---------------------------------------------------
    def logits(self, ids):
        """Full logits (T, n_vocab); only for small inputs."""
        return self.hidden(ids) @ self.output.T

    def head(self, hidden, top=32, vchunk=8192, tchunk=512):
        """For each row of hidden: (lse, top ids best first, their logits)."""
        V = self.n_vocab
        if self.lazy and self._output is None:
            tchunk = max(tchunk, hidden.shape[0])  # decode each chunk of rows once
        T = hidden.shape[0]
        top = min(top, V)
        lse = np.empty(T)
        top_ids = np.empty((T, top), dtype=np.int64)
        top_val = np.empty((T, top))
        chunks = [(s, min(V, s + vchunk)) for s in range(0, V, vchunk)]

        def run_chunk(h, c):
            s, e = c
            lg = np.empty((h.shape[0], e - s))
            W = self.output_rows(s, e)
            step = 1024
            for b in range(0, e - s, step):
                be = min(e - s, b + step)
                lg[:, b:be] = mm(h, W[b:be])
            m = np.max(lg, axis=1)
            ssum = np.sum(np.exp(lg - m[:, None]), axis=1)
            kk = min(top, e - s)
            if kk < e - s:
                idx = np.argpartition(-lg, kk - 1, axis=1)[:, :kk]
            else:
                idx = np.broadcast_to(np.arange(e - s), (h.shape[0], e - s))
            vals = np.take_along_axis(lg, idx, axis=1)
            return m, ssum, idx + s, vals

        for t0 in range(0, T, tchunk):
            h = np.ascontiguousarray(hidden[t0:t0 + tchunk])
            res = pmap(lambda c: run_chunk(h, c), chunks)
            ms = np.stack([r[0] for r in res], axis=1)
            ss = np.stack([r[1] for r in res], axis=1)
            mx = np.max(ms, axis=1)
            lse[t0:t0 + h.shape[0]] = mx + np.log(np.sum(ss * np.exp(ms - mx[:, None]), axis=1))
            ids = np.concatenate([r[2] for r in res], axis=1)
            vals = np.concatenate([r[3] for r in res], axis=1)
            # best first; ties broken by lower id
            for i in range(h.shape[0]):
                o = np.lexsort((ids[i], -vals[i]))[:top]
                top_ids[t0 + i] = ids[i, o]
                top_val[t0 + i] = vals[i, o]
        return lse, top_ids, top_val


def greedy(model, prompt_ids, n, top=4):
    """Greedy continuation of n tokens: list of (id, lse, top ids, top logits)."""
    ids = list(int(i) for i in prompt_ids)
    out = []
    for _ in range(n):
        h = model.hidden(ids)[-1:]
        lse, tid, tval = model.head(h, top=top)
        nxt = int(tid[0, 0])
        out.append((nxt, float(lse[0]), tid[0].tolist(), tval[0].tolist()))
        ids.append(nxt)
    return out
