"""Minimal GGUF v3 writer for building test models.

Owns: writing metadata (typed values, arrays, nested arrays) and F32/F16/MXFP4
tensors (mxfp4_encode: ggml's MXFP4 blocks), and the helpers that build tiny
random qwen3moe / qwen3 / glm4moe / deepseek2 / gpt-oss / qwen3next / qwen35moe
models.
Values are given as (type, value) pairs or plain Python values (int -> i32 or
u64 when large, float -> f32, bool, str, list -> array of the first element's
type). Tensors are float arrays in numpy order (slowest dimension first); they
are stored with ne = reversed(shape).
"""

import struct

import numpy as np

import gguf as G

_FMT = {
    G.T_UINT8: "<B", G.T_INT8: "<b", G.T_UINT16: "<H", G.T_INT16: "<h",
    G.T_UINT32: "<I", G.T_INT32: "<i", G.T_FLOAT32: "<f", G.T_BOOL: "<?",
    G.T_UINT64: "<Q", G.T_INT64: "<q", G.T_FLOAT64: "<d",
}


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _infer(v):
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int):
        return v
    if isinstance(v, bool):
        return (G.T_BOOL, v)
    if isinstance(v, int):
        return (G.T_INT32, v) if -2**31 <= v < 2**31 else (G.T_INT64 if v < 0 else G.T_UINT64, v)
    if isinstance(v, float):
        return (G.T_FLOAT32, v)
    if isinstance(v, str):
        return (G.T_STRING, v)
    if isinstance(v, list):
        return (G.T_ARRAY, v)
    raise TypeError("cannot infer GGUF type of %r" % (v,))


def _value(typ, v, elem_type=None):
    if typ in _FMT:
        return struct.pack(_FMT[typ], v)
    if typ == G.T_STRING:
        return _str(v)
    if typ == G.T_ARRAY:
        if elem_type is None:
            elem_type = _infer(v[0])[0] if v else G.T_INT32
        out = struct.pack("<IQ", elem_type, len(v))
        for x in v:
            if elem_type == G.T_ARRAY:
                out += _value(G.T_ARRAY, x)
            else:
                out += _value(elem_type, x)
        return out
    raise TypeError("unknown type %r" % typ)


class Writer:
    def __init__(self, alignment=32):
        self.kv = []
        self.tensors = []
        self.alignment = alignment

    def add(self, key, value, typ=None, elem_type=None):
        if typ is None:
            typ, value = _infer(value)
        self.kv.append((key, typ, value, elem_type))

    def add_tensor(self, name, arr, ggml_type="F32"):
        arr = np.asarray(arr)
        if ggml_type == "F32":
            data = arr.astype("<f4").tobytes()
        elif ggml_type == "F16":
            data = arr.astype("<f2").tobytes()
        elif ggml_type == "MXFP4":
            data = mxfp4_encode(arr)[0]
        else:
            raise ValueError("writer supports F32, F16 and MXFP4 only")
        ne = tuple(reversed(arr.shape))
        self.tensors.append((name, ne, G.GGML_TYPE_IDS[ggml_type], data))

    def tobytes(self):
        a = self.alignment
        if a != 32:
            self.kv = [k for k in self.kv if k[0] != "general.alignment"]
            self.kv.append(("general.alignment", G.T_UINT32, a, None))
        out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for key, typ, value, et in self.kv:
            out += _str(key) + struct.pack("<I", typ) + _value(typ, value, et)
        off = 0
        offs = []
        for name, ne, t, data in self.tensors:
            offs.append(off)
            out += _str(name) + struct.pack("<I", len(ne))
            out += b"".join(struct.pack("<Q", n) for n in ne)
            out += struct.pack("<IQ", t, off)
            off += (len(data) + a - 1) // a * a
        out += b"\0" * ((-len(out)) % a)
        for (name, ne, t, data), o in zip(self.tensors, offs):
            out += data + b"\0" * ((-len(data)) % a)
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.tobytes())


# E2M1 (FP4) values of the codes 0..15: bit 3 the sign, then {0, 0.5, 1, 1.5, 2, 3, 4, 6}
MXFP4_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                      dtype=np.float64)


def mxfp4_encode(arr):
    """ggml's MXFP4 blocks of a float array whose last dimension is a multiple of 32.

    Each block of 32 consecutive values: one E8M0 byte e (scale 2^(e - 127)),
    then 16 bytes, byte j holding element j's 4-bit E2M1 code in its low
    nibble and element j + 16's in its high one. As ggml's quantize_row_mxfp4_ref:
    e = floor(log2(max |x|)) - 2 + 127 (0 for an all-zero block), each value the
    nearest E2M1 value times the scale (ties: the lower code; beyond 6 x
    scale: clipped). Returns (bytes, the encoded values as float64 in arr's shape).
    """
    x = np.asarray(arr, dtype=np.float64)
    if x.ndim == 0 or x.shape[-1] % 32:
        raise ValueError("MXFP4 needs rows of a multiple of 32 values, not shape %s" % (x.shape,))
    blocks = x.reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1)
    _, ex = np.frexp(amax)  # amax = m 2^ex, 0.5 <= m < 1: floor(log2 amax) = ex - 1
    e = np.where(amax > 0, np.clip(ex - 1 - 2 + 127, 1, 254), 0).astype(np.int64)
    scale = np.ldexp(1.0, e - 127)
    err = np.abs(MXFP4_E2M1[None, None, :] * scale[:, None, None] - blocks[:, :, None])
    codes = np.argmin(err, axis=2).astype(np.uint8)  # the first of equal errors
    values = MXFP4_E2M1[codes] * scale[:, None]
    out = np.empty((blocks.shape[0], 17), dtype=np.uint8)
    out[:, 0] = e
    out[:, 1:] = codes[:, :16] | (codes[:, 16:] << 4)
    return out.tobytes(), (values + 0.0).reshape(x.shape)  # + 0.0: no negative zeros


def mxfp4_round(arr):
    """arr's values as MXFP4 blocks hold them (exact: writing them again changes nothing)."""
    return mxfp4_encode(arr)[1]


def tiny_weights(seed=0, n_vocab=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2,
                 head_dim=16, n_ff=48, n_expert=1, scale=0.3):
    """Random zero-mean float weights (numpy order) for a tiny model."""
    rng = np.random.default_rng(seed)

    def r(*shape, s=scale):
        return rng.standard_normal(shape) * s

    w = {
        "token_embd.weight": r(n_vocab, n_embd, s=1.0),
        "output_norm.weight": 1.0 + r(n_embd, s=0.1),
        "output.weight": r(n_vocab, n_embd),
    }
    for i in range(n_layer):
        p = "blk.%d." % i
        w[p + "attn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "attn_q.weight"] = r(n_head * head_dim, n_embd)
        w[p + "attn_k.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_v.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_output.weight"] = r(n_embd, n_head * head_dim)
        w[p + "attn_q_norm.weight"] = 1.0 + r(head_dim, s=0.1)
        w[p + "attn_k_norm.weight"] = 1.0 + r(head_dim, s=0.1)
        w[p + "ffn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "ffn_gate_inp.weight"] = r(n_expert, n_embd)
        w[p + "ffn_gate_exps.weight"] = r(n_expert, n_ff, n_embd)
        w[p + "ffn_up_exps.weight"] = r(n_expert, n_ff, n_embd)
        w[p + "ffn_down_exps.weight"] = r(n_expert, n_embd, n_ff)
    hp = dict(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
              n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff, n_expert=n_expert)
    return w, hp


def _header(arch, hp, block_count, rope_base, eps):
    """A Writer holding the metadata every architecture here shares."""
    wr = Writer()
    wr.add("general.architecture", arch)
    wr.add("general.name", "tiny-" + arch)
    wr.add("general.alignment", (G.T_UINT32, 32))
    wr.add(arch + ".block_count", (G.T_UINT32, block_count))
    wr.add(arch + ".context_length", (G.T_UINT32, 256))
    wr.add(arch + ".embedding_length", (G.T_UINT32, hp["n_embd"]))
    wr.add(arch + ".feed_forward_length", (G.T_UINT32, hp["n_ff"]))
    wr.add(arch + ".attention.head_count", (G.T_UINT32, hp["n_head"]))
    wr.add(arch + ".attention.head_count_kv", (G.T_UINT32, hp["n_head_kv"]))
    wr.add(arch + ".attention.key_length", (G.T_UINT32, hp["head_dim"]))
    wr.add(arch + ".attention.value_length", (G.T_UINT32, hp.get("head_dim_v", hp["head_dim"])))
    wr.add(arch + ".rope.freq_base", (G.T_FLOAT32, rope_base))
    wr.add(arch + ".attention.layer_norm_rms_epsilon", (G.T_FLOAT32, eps))
    return wr


def _tokens(wr, hp):
    wr.add("tokenizer.ggml.model", "gpt2")
    wr.add("tokenizer.ggml.tokens", ["t%d" % i for i in range(hp["n_vocab"])])


def write_model(path, arch, weights, hp, n_expert_used=1, rope_base=1e6, eps=1e-6, tied=False):
    """Write `weights` (from tiny_weights) as a qwen3moe or dense qwen3 file.

    For qwen3 the first expert's matrices become ffn_gate/ffn_up/ffn_down.
    """
    wr = _header(arch, hp, hp["n_layer"], rope_base, eps)
    if arch == "qwen3moe":
        wr.add(arch + ".expert_count", (G.T_UINT32, hp["n_expert"]))
        wr.add(arch + ".expert_used_count", (G.T_UINT32, n_expert_used))
        wr.add(arch + ".expert_feed_forward_length", (G.T_UINT32, hp["n_ff"]))
    _tokens(wr, hp)
    for name, arr in weights.items():
        if tied and name == "output.weight":
            continue
        if arch == "qwen3":
            if name.endswith("ffn_gate_inp.weight"):
                continue
            for src, dst in (("ffn_gate_exps", "ffn_gate"), ("ffn_up_exps", "ffn_up"),
                             ("ffn_down_exps", "ffn_down")):
                if name.endswith(src + ".weight"):
                    name = name.replace(src, dst)
                    arr = arr[0]
        wr.add_tensor(name, arr)
    wr.write(path)


def tiny_glm4moe_weights(seed=0, n_vocab=64, n_embd=32, n_layer=2, n_nextn=1, n_dense_lead=1,
                         n_head=4, n_head_kv=2, head_dim=16, n_ff=40, n_ff_exp=24, n_expert=4,
                         n_shared=1, qk_norm=True, scale=0.3):
    """Random weights (numpy order) for a tiny glm4moe model.

    n_layer layers are run (the first n_dense_lead dense, the rest MoE);
    n_nextn NextN layers follow them. hp["rope_dim"] is head_dim / 2 as in
    GLM-4.5 (None leaves the key out of the file).
    """
    rng = np.random.default_rng(seed)

    def r(*shape, s=scale):
        return rng.standard_normal(shape) * s

    n_ff_sh = n_ff_exp * n_shared
    w = {
        "token_embd.weight": r(n_vocab, n_embd, s=1.0),
        "output_norm.weight": 1.0 + r(n_embd, s=0.1),
        "output.weight": r(n_vocab, n_embd),
    }
    for i in range(n_layer + n_nextn):
        p = "blk.%d." % i
        w[p + "attn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "attn_q.weight"] = r(n_head * head_dim, n_embd)
        w[p + "attn_q.bias"] = r(n_head * head_dim)
        w[p + "attn_k.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_k.bias"] = r(n_head_kv * head_dim)
        w[p + "attn_v.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_v.bias"] = r(n_head_kv * head_dim)
        w[p + "attn_output.weight"] = r(n_embd, n_head * head_dim)
        if qk_norm:
            w[p + "attn_q_norm.weight"] = 1.0 + r(head_dim, s=0.1)
            w[p + "attn_k_norm.weight"] = 1.0 + r(head_dim, s=0.1)
        w[p + "post_attention_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        if i < n_dense_lead:
            w[p + "ffn_gate.weight"] = r(n_ff, n_embd)
            w[p + "ffn_up.weight"] = r(n_ff, n_embd)
            w[p + "ffn_down.weight"] = r(n_embd, n_ff)
            continue
        w[p + "ffn_gate_inp.weight"] = r(n_expert, n_embd)
        w[p + "exp_probs_b.bias"] = r(n_expert, s=0.05)
        w[p + "ffn_gate_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_up_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_down_exps.weight"] = r(n_expert, n_embd, n_ff_exp)
        if n_shared:
            w[p + "ffn_gate_shexp.weight"] = r(n_ff_sh, n_embd)
            w[p + "ffn_up_shexp.weight"] = r(n_ff_sh, n_embd)
            w[p + "ffn_down_shexp.weight"] = r(n_embd, n_ff_sh)
        if i >= n_layer:
            w[p + "nextn.eh_proj.weight"] = r(n_embd, 2 * n_embd)
            w[p + "nextn.enorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.hnorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.embed_tokens.weight"] = r(n_vocab, n_embd, s=1.0)
            w[p + "nextn.shared_head_head.weight"] = r(n_vocab, n_embd)
            w[p + "nextn.shared_head_norm.weight"] = 1.0 + r(n_embd, s=0.1)
    hp = dict(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_nextn=n_nextn,
              n_dense_lead=n_dense_lead, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
              rope_dim=head_dim // 2, n_ff=n_ff, n_ff_exp=n_ff_exp, n_expert=n_expert,
              n_shared=n_shared)
    return w, hp


def write_glm4moe(path, weights, hp, n_expert_used=2, expert_scale=1.0, expert_norm=True,
                  gating=2, rope_base=1e6, eps=1e-5, tied=False):
    """Write `weights` (from tiny_glm4moe_weights) as a glm4moe file.

    expert_scale, expert_norm and gating (1 softmax, 2 sigmoid) become
    expert_weights_scale, expert_weights_norm and expert_gating_func; None
    leaves the key out.
    """
    arch = "glm4moe"
    wr = _header(arch, hp, hp["n_layer"] + hp["n_nextn"], rope_base, eps)

    def u32(key, v):
        wr.add(arch + "." + key, (G.T_UINT32, v))

    if hp["rope_dim"] is not None:
        u32("rope.dimension_count", hp["rope_dim"])
    u32("nextn_predict_layers", hp["n_nextn"])
    u32("leading_dense_block_count", hp["n_dense_lead"])
    u32("expert_count", hp["n_expert"])
    u32("expert_used_count", n_expert_used)
    u32("expert_shared_count", hp["n_shared"])
    u32("expert_feed_forward_length", hp["n_ff_exp"])
    if expert_scale is not None:
        wr.add(arch + ".expert_weights_scale", (G.T_FLOAT32, expert_scale))
    if expert_norm is not None:
        wr.add(arch + ".expert_weights_norm", (G.T_BOOL, expert_norm))
    if gating is not None:
        u32("expert_gating_func", gating)
    _tokens(wr, hp)
    for name, arr in weights.items():
        if not (tied and name == "output.weight"):
            wr.add_tensor(name, arr)
    wr.write(path)


def tiny_deepseek2_weights(seed=0, n_vocab=64, n_embd=32, n_layer=2, n_nextn=1, n_dense_lead=1,
                           n_head=4, q_lora=24, kv_lora=16, qk_nope=8, n_rot=8, head_dim_v=12,
                           n_ff=40, n_ff_exp=16, n_expert=8, n_shared=1, probs_bias=True, scale=0.3):
    """Random weights (numpy order) for a tiny deepseek2 model, attention in the
    legacy attn_kv_b form (write_deepseek2 slices attn_k_b / attn_v_b from it).

    n_layer layers are run (the first n_dense_lead dense, the rest MoE);
    n_nextn NextN layers follow them. q_lora 0 gives attn_q instead of
    attn_q_a / attn_q_a_norm / attn_q_b; probs_bias False leaves exp_probs_b out.
    """
    rng = np.random.default_rng(seed)

    def r(*shape, s=scale):
        return rng.standard_normal(shape) * s

    hk = qk_nope + n_rot
    n_ff_sh = n_ff_exp * n_shared
    w = {
        "token_embd.weight": r(n_vocab, n_embd, s=1.0),
        "output_norm.weight": 1.0 + r(n_embd, s=0.1),
        "output.weight": r(n_vocab, n_embd),
    }
    for i in range(n_layer + n_nextn):
        p = "blk.%d." % i
        w[p + "attn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        if q_lora:
            w[p + "attn_q_a.weight"] = r(q_lora, n_embd)
            w[p + "attn_q_a_norm.weight"] = 1.0 + r(q_lora, s=0.1)
            w[p + "attn_q_b.weight"] = r(n_head * hk, q_lora)
        else:
            w[p + "attn_q.weight"] = r(n_head * hk, n_embd)
        w[p + "attn_kv_a_mqa.weight"] = r(kv_lora + n_rot, n_embd)
        w[p + "attn_kv_a_norm.weight"] = 1.0 + r(kv_lora, s=0.1)
        w[p + "attn_kv_b.weight"] = r(n_head * (qk_nope + head_dim_v), kv_lora)
        w[p + "attn_output.weight"] = r(n_embd, n_head * head_dim_v)
        w[p + "ffn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        if i < n_dense_lead:
            w[p + "ffn_gate.weight"] = r(n_ff, n_embd)
            w[p + "ffn_up.weight"] = r(n_ff, n_embd)
            w[p + "ffn_down.weight"] = r(n_embd, n_ff)
            continue
        w[p + "ffn_gate_inp.weight"] = r(n_expert, n_embd)
        if probs_bias:
            w[p + "exp_probs_b.bias"] = r(n_expert, s=0.05)
        w[p + "ffn_gate_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_up_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_down_exps.weight"] = r(n_expert, n_embd, n_ff_exp)
        if n_shared:
            w[p + "ffn_gate_shexp.weight"] = r(n_ff_sh, n_embd)
            w[p + "ffn_up_shexp.weight"] = r(n_ff_sh, n_embd)
            w[p + "ffn_down_shexp.weight"] = r(n_embd, n_ff_sh)
        if i >= n_layer:
            w[p + "nextn.eh_proj.weight"] = r(n_embd, 2 * n_embd)
            w[p + "nextn.enorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.hnorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.shared_head_norm.weight"] = 1.0 + r(n_embd, s=0.1)
    hp = dict(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_nextn=n_nextn,
              n_dense_lead=n_dense_lead, n_head=n_head, q_lora=q_lora, kv_lora=kv_lora,
              qk_nope=qk_nope, n_rot=n_rot, head_dim_v=head_dim_v, n_ff=n_ff, n_ff_exp=n_ff_exp,
              n_expert=n_expert, n_shared=n_shared)
    return w, hp


def split_kv_b(kv_b, n_head, qk_nope, head_dim_v):
    """attn_kv_b (numpy (n_head*(qk_nope+hv), kv_lora)) -> attn_k_b (n_head, kv_lora, qk_nope),
    attn_v_b (n_head, hv, kv_lora) in numpy order, as llama.cpp's converter splits it."""
    kv = np.asarray(kv_b).reshape(n_head, qk_nope + head_dim_v, -1)
    return kv[:, :qk_nope].transpose(0, 2, 1), kv[:, qk_nope:]


def write_deepseek2(path, weights, hp, form="mla", n_expert_used=2, n_group=None, topk_group=None,
                    expert_scale=1.0, expert_norm=True, gating=2, rope_scaling=None,
                    rope_base=1e4, eps=1e-6, tied=False, ctx=256):
    """Write `weights` (from tiny_deepseek2_weights) as a deepseek2 file.

    form "mla": attn_k_b / attn_v_b sliced from attn_kv_b, key_length_mla /
    value_length_mla, key_length kv_lora + n_rot, value_length kv_lora and one
    kv head; form "legacy": attn_kv_b, key_length qk_nope + n_rot, value_length
    hv, n_head kv heads. n_group / topk_group, expert_scale, expert_norm and
    gating (0 none, 1 softmax, 2 sigmoid) become expert_group_count /
    expert_group_used_count, expert_weights_scale, expert_weights_norm and
    expert_gating_func; None leaves the key out. rope_scaling: a dict of
    rope.scaling.* keys (type, factor, original_context_length,
    yarn_log_multiplier (stored as given), attn_factor, yarn_beta_fast,
    yarn_beta_slow) or None for none written.
    """
    arch = "deepseek2"
    if form not in ("mla", "legacy"):
        raise ValueError("form is mla or legacy")
    mla = form == "mla"
    H, nope, rot, hv, kvl = hp["n_head"], hp["qk_nope"], hp["n_rot"], hp["head_dim_v"], hp["kv_lora"]
    head = dict(n_embd=hp["n_embd"], n_ff=hp["n_ff"], n_head=H, n_head_kv=1 if mla else H,
                head_dim=kvl + rot if mla else nope + rot, head_dim_v=kvl if mla else hv)
    wr = _header(arch, head, hp["n_layer"] + hp["n_nextn"], rope_base, eps)
    wr.kv = [k for k in wr.kv if k[0] != arch + ".context_length"]
    wr.add(arch + ".context_length", (G.T_UINT32, ctx))

    def u32(key, v):
        if v is not None:
            wr.add(arch + "." + key, (G.T_UINT32, v))

    def f32(key, v):
        if v is not None:
            wr.add(arch + "." + key, (G.T_FLOAT32, v))

    u32("rope.dimension_count", rot)
    if hp["q_lora"]:
        u32("attention.q_lora_rank", hp["q_lora"])
    u32("attention.kv_lora_rank", kvl)
    if mla:
        u32("attention.key_length_mla", nope + rot)
        u32("attention.value_length_mla", hv)
    u32("nextn_predict_layers", hp["n_nextn"])
    u32("leading_dense_block_count", hp["n_dense_lead"])
    u32("expert_count", hp["n_expert"])
    u32("expert_used_count", n_expert_used)
    u32("expert_shared_count", hp["n_shared"])
    u32("expert_feed_forward_length", hp["n_ff_exp"])
    u32("expert_group_count", n_group)
    u32("expert_group_used_count", topk_group)
    f32("expert_weights_scale", expert_scale)
    if expert_norm is not None:
        wr.add(arch + ".expert_weights_norm", (G.T_BOOL, expert_norm))
    u32("expert_gating_func", gating)
    for key, v in (rope_scaling or {}).items():
        if key == "type":
            wr.add(arch + ".rope.scaling.type", v)
        elif key == "original_context_length":
            u32("rope.scaling.original_context_length", v)
        else:
            f32("rope.scaling." + key, v)
    _tokens(wr, hp)
    for name, arr in weights.items():
        if tied and name == "output.weight":
            continue
        if mla and name.endswith("attn_kv_b.weight"):
            k_b, v_b = split_kv_b(arr, H, nope, hv)
            wr.add_tensor(name.replace("attn_kv_b", "attn_k_b"), k_b)
            wr.add_tensor(name.replace("attn_kv_b", "attn_v_b"), v_b)
            continue
        wr.add_tensor(name, arr)
    wr.write(path)


def tiny_gptoss_weights(seed=0, n_vocab=64, n_embd=32, n_layer=2, n_head=4, n_head_kv=2,
                        head_dim=16, n_ff_exp=32, n_expert=4, scale=0.3, exp_scale=0.8,
                        sink_scale=1.0):
    """Random weights (numpy order) for a tiny gpt-oss model: every tensor of
    gptoss-spec.md, biases included. exp_scale is the experts' gate and up
    weights' (large enough that the swiglu_oai clamps at 7 act), sink_scale
    the sinks'. n_embd and n_ff_exp multiples of 32 let the experts be MXFP4.
    """
    rng = np.random.default_rng(seed)

    def r(*shape, s=scale):
        return rng.standard_normal(shape) * s

    w = {
        "token_embd.weight": r(n_vocab, n_embd, s=1.0),
        "output_norm.weight": 1.0 + r(n_embd, s=0.1),
        "output.weight": r(n_vocab, n_embd),
    }
    for i in range(n_layer):
        p = "blk.%d." % i
        w[p + "attn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "attn_q.weight"] = r(n_head * head_dim, n_embd)
        w[p + "attn_q.bias"] = r(n_head * head_dim)
        w[p + "attn_k.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_k.bias"] = r(n_head_kv * head_dim)
        w[p + "attn_v.weight"] = r(n_head_kv * head_dim, n_embd)
        w[p + "attn_v.bias"] = r(n_head_kv * head_dim)
        w[p + "attn_output.weight"] = r(n_embd, n_head * head_dim)
        w[p + "attn_output.bias"] = r(n_embd)
        w[p + "attn_sinks.weight"] = r(n_head, s=sink_scale)
        w[p + "post_attention_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "ffn_gate_inp.weight"] = r(n_expert, n_embd)
        w[p + "ffn_gate_inp.bias"] = r(n_expert)
        w[p + "ffn_gate_exps.weight"] = r(n_expert, n_ff_exp, n_embd, s=exp_scale)
        w[p + "ffn_gate_exps.bias"] = r(n_expert, n_ff_exp)
        w[p + "ffn_up_exps.weight"] = r(n_expert, n_ff_exp, n_embd, s=exp_scale)
        w[p + "ffn_up_exps.bias"] = r(n_expert, n_ff_exp)
        w[p + "ffn_down_exps.weight"] = r(n_expert, n_embd, n_ff_exp, s=0.1)
        w[p + "ffn_down_exps.bias"] = r(n_expert, n_embd)
    hp = dict(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
              n_head_kv=n_head_kv, head_dim=head_dim, n_ff=n_ff_exp, n_ff_exp=n_ff_exp,
              n_expert=n_expert)
    return w, hp


GPTOSS_EXPERT_TENSORS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def write_gptoss(path, weights, hp, n_expert_used=2, n_swa=4, swa_period=None, expert_scale=None,
                 rope_scaling=None, experts_type="F32", rope_base=150000.0, eps=1e-5, ctx=256,
                 extra=None):
    """Write `weights` (from tiny_gptoss_weights) as a gpt-oss file.

    swa_period and expert_scale become attention.sliding_window_pattern (u32)
    and expert_weights_scale; None leaves the key out. rope_scaling: a dict of
    rope.scaling.* keys (type, factor, original_context_length, attn_factor,
    yarn_beta_fast, yarn_beta_slow, yarn_log_multiplier) or None for none
    written. experts_type "MXFP4" stores the three expert matrices as MXFP4
    (their values rounded as mxfp4_round does). extra: more gpt-oss.* keys
    {key: value} (values as Writer.add takes them).
    """
    arch = "gpt-oss"
    wr = _header(arch, hp, hp["n_layer"], rope_base, eps)
    wr.kv = [k for k in wr.kv if k[0] != arch + ".context_length"]
    wr.add(arch + ".context_length", (G.T_UINT32, ctx))

    def u32(key, v):
        if v is not None:
            wr.add(arch + "." + key, (G.T_UINT32, v))

    u32("rope.dimension_count", hp["head_dim"])
    u32("expert_count", hp["n_expert"])
    u32("expert_used_count", n_expert_used)
    u32("expert_feed_forward_length", hp["n_ff_exp"])
    u32("attention.sliding_window", n_swa)
    u32("attention.sliding_window_pattern", swa_period)
    if expert_scale is not None:
        wr.add(arch + ".expert_weights_scale", (G.T_FLOAT32, expert_scale))
    for key, v in (rope_scaling or {}).items():
        if key == "type":
            wr.add(arch + ".rope.scaling.type", v)
        elif key == "original_context_length":
            u32("rope.scaling.original_context_length", v)
        else:
            wr.add(arch + ".rope.scaling." + key, (G.T_FLOAT32, v))
    for key, v in (extra or {}).items():
        wr.add(arch + "." + key, v)
    _tokens(wr, hp)
    for name, arr in weights.items():
        mx = experts_type == "MXFP4" and name.endswith(GPTOSS_EXPERT_TENSORS)
        wr.add_tensor(name, arr, "MXFP4" if mx else "F32")
    wr.write(path)


def tiny_qwen3next_weights(seed=0, n_vocab=64, n_embd=32, n_layer=4, n_nextn=0, n_head=4,
                           n_head_kv=2, head_dim=16, n_rot=8, n_ff_exp=16, n_ff_shexp=24, n_expert=4,
                           conv_kernel=4, state=8, n_k_heads=2, n_v_heads=4, recurrent=None,
                           scale=0.3):
    """Random weights (numpy order) for a tiny qwen3next / qwen35moe model.

    recurrent (a bool a run layer; None: every fourth layer attention, as the
    interval's default) says which layers get DeltaNet weights; n_nextn NextN
    layers (full attention, the nextn.* tensors) follow the n_layer run ones.
    beta's and alpha's matrices are kept apart in v head order as
    ssm_beta / ssm_alpha; write_qwen3next packs them into ssm_ba for qwen3next,
    so one set of weights serves both architectures. ssm_a is -exp(A_log),
    A_log uniform in [-2, 0.5], and alpha's rows and the dt bias small, so the
    state keeps between e^-1.7 and e^-0.1 of itself a position at softplus 1
    and carries several positions.
    """
    rng = np.random.default_rng(seed)

    def r(*shape, s=scale):
        return rng.standard_normal(shape) * s

    if recurrent is None:
        recurrent = [(i + 1) % 4 != 0 for i in range(n_layer)]
    if len(recurrent) != n_layer:
        raise ValueError("recurrent has %d values for %d layers" % (len(recurrent), n_layer))
    S, Hk, Hv = state, n_k_heads, n_v_heads
    channels = 2 * S * Hk + S * Hv
    w = {
        "token_embd.weight": r(n_vocab, n_embd, s=1.0),
        "output_norm.weight": 1.0 + r(n_embd, s=0.1),
        "output.weight": r(n_vocab, n_embd),
    }
    for i in range(n_layer + n_nextn):
        p = "blk.%d." % i
        w[p + "attn_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        if i < n_layer and recurrent[i]:
            w[p + "attn_qkv.weight"] = r(channels, n_embd)
            w[p + "attn_gate.weight"] = r(S * Hv, n_embd)
            w[p + "ssm_conv1d.weight"] = r(channels, conv_kernel, s=0.5)
            w[p + "ssm_beta.weight"] = r(Hv, n_embd)
            w[p + "ssm_alpha.weight"] = r(Hv, n_embd, s=0.1)
            w[p + "ssm_dt.bias"] = r(Hv, s=0.1)
            w[p + "ssm_a"] = -np.exp(rng.uniform(-2.0, 0.5, Hv))
            w[p + "ssm_norm.weight"] = 1.0 + r(S, s=0.1)
            w[p + "ssm_out.weight"] = r(n_embd, S * Hv)
        else:
            w[p + "attn_q.weight"] = r(n_head * 2 * head_dim, n_embd)
            w[p + "attn_k.weight"] = r(n_head_kv * head_dim, n_embd)
            w[p + "attn_v.weight"] = r(n_head_kv * head_dim, n_embd)
            w[p + "attn_output.weight"] = r(n_embd, n_head * head_dim)
            w[p + "attn_q_norm.weight"] = 1.0 + r(head_dim, s=0.1)
            w[p + "attn_k_norm.weight"] = 1.0 + r(head_dim, s=0.1)
        w[p + "post_attention_norm.weight"] = 1.0 + r(n_embd, s=0.1)
        w[p + "ffn_gate_inp.weight"] = r(n_expert, n_embd)
        w[p + "ffn_gate_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_up_exps.weight"] = r(n_expert, n_ff_exp, n_embd)
        w[p + "ffn_down_exps.weight"] = r(n_expert, n_embd, n_ff_exp)
        w[p + "ffn_gate_inp_shexp.weight"] = r(n_embd)
        w[p + "ffn_gate_shexp.weight"] = r(n_ff_shexp, n_embd)
        w[p + "ffn_up_shexp.weight"] = r(n_ff_shexp, n_embd)
        w[p + "ffn_down_shexp.weight"] = r(n_embd, n_ff_shexp)
        if i >= n_layer:
            w[p + "nextn.eh_proj.weight"] = r(n_embd, 2 * n_embd)
            w[p + "nextn.enorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.hnorm.weight"] = 1.0 + r(n_embd, s=0.1)
            w[p + "nextn.shared_head_norm.weight"] = 1.0 + r(n_embd, s=0.1)
    hp = dict(n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_nextn=n_nextn, n_head=n_head,
              n_head_kv=n_head_kv, head_dim=head_dim, n_rot=n_rot, n_ff=n_ff_exp, n_ff_exp=n_ff_exp,
              n_ff_shexp=n_ff_shexp, n_expert=n_expert, conv_kernel=conv_kernel, state=S,
              n_k_heads=Hk, n_v_heads=Hv, recurrent=list(recurrent))
    return w, hp


def pack_ssm_ba(beta, alpha, n_k_heads):
    """qwen3next's ssm_ba (2 Hv rows) from beta's and alpha's rows (Hv each, v
    head order): per k head kh, the r rows of b of v heads kh r .. kh r + r - 1,
    then their r rows of a."""
    Hv, E = beta.shape
    r = Hv // n_k_heads
    return np.concatenate([np.asarray(beta).reshape(n_k_heads, 1, r, E),
                           np.asarray(alpha).reshape(n_k_heads, 1, r, E)], axis=1).reshape(2 * Hv, E)


# Qwen3.5's IMRoPE sections at 64 rotated dims: every pair in the three text sections
QWEN35_SECTIONS = [11, 11, 10, 0]


def write_qwen3next(path, weights, hp, arch="qwen3next", n_expert_used=2, expert_scale=None,
                    recurrent_key=False, interval=None, sections=QWEN35_SECTIONS, rope_base=1e4,
                    eps=1e-6, tied=False, ctx=256, extra=None):
    """Write `weights` (from tiny_qwen3next_weights) as a qwen3next or qwen35moe file.

    qwen3next: beta's and alpha's rows become one ssm_ba (pack_ssm_ba);
    qwen35moe: kept as ssm_beta / ssm_alpha, with nextn_predict_layers and
    rope.dimension_sections (sections; None leaves the key out); qwen3next has
    no NextN layers. recurrent_key writes hp["recurrent"] (plus False for each NextN layer)
    as attention.recurrent_layers; interval becomes full_attention_interval
    (None leaves it out, 4 by default). expert_scale: expert_weights_scale
    (None leaves it out). extra: more ARCH.* keys {key: value} (values as
    Writer.add takes them).
    """
    if arch not in ("qwen3next", "qwen35moe"):
        raise ValueError("arch is qwen3next or qwen35moe")
    if arch == "qwen3next" and hp["n_nextn"]:
        raise ValueError("qwen3next files have no NextN layers")
    S, Hk, Hv = hp["state"], hp["n_k_heads"], hp["n_v_heads"]
    n_file = hp["n_layer"] + hp["n_nextn"]
    wr = _header(arch, hp, n_file, rope_base, eps)
    wr.kv = [k for k in wr.kv if k[0] != arch + ".context_length"]
    wr.add(arch + ".context_length", (G.T_UINT32, ctx))

    def u32(key, v):
        if v is not None:
            wr.add(arch + "." + key, (G.T_UINT32, v))

    u32("rope.dimension_count", hp["n_rot"])
    u32("expert_count", hp["n_expert"])
    u32("expert_used_count", n_expert_used)
    u32("expert_feed_forward_length", hp["n_ff_exp"])
    u32("expert_shared_feed_forward_length", hp["n_ff_shexp"])
    if expert_scale is not None:
        wr.add(arch + ".expert_weights_scale", (G.T_FLOAT32, expert_scale))
    u32("ssm.conv_kernel", hp["conv_kernel"])
    u32("ssm.state_size", S)
    u32("ssm.group_count", Hk)
    u32("ssm.time_step_rank", Hv)
    u32("ssm.inner_size", S * Hv)
    u32("full_attention_interval", interval)
    if recurrent_key:
        flags = [bool(v) for v in hp["recurrent"]] + [False] * hp["n_nextn"]
        wr.add(arch + ".attention.recurrent_layers", (G.T_ARRAY, flags), elem_type=G.T_BOOL)
    if arch == "qwen35moe":
        u32("nextn_predict_layers", hp["n_nextn"])
        if sections is not None:
            wr.add(arch + ".rope.dimension_sections", (G.T_ARRAY, list(sections)), elem_type=G.T_INT32)
    for key, v in (extra or {}).items():
        wr.add(arch + "." + key, v)
    _tokens(wr, hp)
    for name, arr in weights.items():
        if tied and name == "output.weight":
            continue
        if arch == "qwen3next" and name.endswith(".ssm_alpha.weight"):
            continue
        if arch == "qwen3next" and name.endswith(".ssm_beta.weight"):
            alpha = weights[name.replace("ssm_beta", "ssm_alpha")]
            wr.add_tensor(name.replace("ssm_beta", "ssm_ba"), pack_ssm_ba(arr, alpha, Hk))
            continue
        wr.add_tensor(name, arr)
    wr.write(path)
