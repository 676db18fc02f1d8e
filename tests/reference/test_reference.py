"""Tests of the float64 reference (tests/reference).

Owns:
  1. the reference against the shared exact oracles (both shared models, all
     three prompts; long-prose is marked slow), the CLI's output format, and
     compare.py against the oracle README's llama.cpp figures;
  2. the dequantizers against the shared quant oracles;
  3. internal consistency: GGUF writer/reader round trip, chunked output
     head against a direct computation, a one-expert qwen3moe against the
     dense qwen3 with the same weights, identical experts against dense;
  4. glm4moe on tiny written files: metadata defaults, the forward pass
     against a plain numpy one, NextN layers not run, biased routing, partial
     RoPE, attention biases, optional q/k norms;
  5. deepseek2 on tiny written files (both attention forms, with and without
     q_lora and YaRN): metadata defaults and refusals, YaRN's factors, the
     NORM-form RoPE, the forward pass against a plain numpy one with the
     attention absorbed, absorbed against plain attention, the MLA form against
     the legacy one, grouped top-k routing, NextN layers not run, lazy against
     eager;
  6. gpt-oss on tiny written files (f32 experts and MXFP4 ones): metadata
     defaults and refusals, the MXFP4 block encoder against dq_mxfp4 and a
     by-hand decoder, the forward pass against a plain numpy one (sliding and
     full layers, a prompt longer than the window, YaRN), the window,
     attention sinks, swiglu_oai's clamps, SOFTMAX_WEIGHT routing with the
     router bias, the sliding-window period, shapes checked, lazy against eager;
  7. qwen3next and qwen35moe on tiny written files (Hv = 2 Hk, so their head
     maps differ): metadata defaults, layer kinds by interval and by array,
     refusals (the older ssm_in form among them), the forward pass against a
     plain numpy one position by position and head by head, the two head maps,
     causality, the convolution's window and the state's reach, the shared
     expert's gate, NextN layers not run, tensors checked, lazy against eager;
  8. the reference on models written by bloomery-mkmodel (skipped when the
     tool is not built).
Oracle-dependent tests skip when the shared folder is absent (env
BLOOMERY_SHARED, else <repo>/../shared).
"""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compare  # noqa: E402
import dequant  # noqa: E402
import gguf  # noqa: E402
import gguf_write  # noqa: E402
import model as refmodel  # noqa: E402
import reference  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(REPO), "shared")
ORACLE = os.path.join(SHARED, "oracle")
MODELS = os.path.join(SHARED, "models")

need_shared = pytest.mark.skipif(
    not os.path.isdir(ORACLE),
    reason="shared oracle folder %s absent (set BLOOMERY_SHARED)" % ORACLE)

SHARED_MODELS = ["qwen3moe-tiny-q4k", "qwen3moe-trained-q8"]
PROMPTS = ["chat-short", "chat-code", pytest.param("long-prose", marks=pytest.mark.slow)]

LOGIT_TOL = 1e-6
TIE_TOL = 1e-9

_models = {}


def shared_model(name):
    if name not in _models:
        _models.clear()  # keep one model's float64 head in memory at a time
        _models[name] = refmodel.Model(os.path.join(MODELS, name + ".gguf"))
    return _models[name]


def check_against_exact(ours, exact):
    """Assert ours (oracle-format dict) reproduces exact within LOGIT_TOL."""
    assert ours["prompt_ids"] == exact["prompt_ids"]
    assert ours["n_vocab"] == exact["n_vocab"]
    assert len(ours["positions"]) == len(exact["positions"])
    worst = 0.0
    for i, (p, q) in enumerate(zip(ours["positions"], exact["positions"])):
        assert abs(p["lse"] - q["lse"]) <= LOGIT_TOL, "pos %d lse %r vs %r" % (i, p["lse"], q["lse"])
        n = len(q["ids"])
        assert len(p["ids"]) >= n
        ov = np.array(q["logits"])
        pv = np.array(p["logits"][:n])
        d = np.max(np.abs(pv - ov))
        worst = max(worst, d)
        assert d <= LOGIT_TOL, "pos %d: rank-wise logits differ by %g" % (i, d)
        ours_map = dict(zip(p["ids"], p["logits"]))
        for j in range(n):
            tied = (j > 0 and abs(ov[j] - ov[j - 1]) < TIE_TOL) or \
                   (j + 1 < n and abs(ov[j] - ov[j + 1]) < TIE_TOL)
            if p["ids"][j] != q["ids"][j]:
                assert tied, "pos %d rank %d: id %d, oracle %d" % (i, j, p["ids"][j], q["ids"][j])
            if q["ids"][j] in ours_map:
                assert abs(ours_map[q["ids"][j]] - ov[j]) <= LOGIT_TOL
            else:
                assert tied and j == n - 1, "pos %d: oracle id %d missing" % (i, q["ids"][j])
    return worst


# ---------------------------------------------------------------- 1. oracles

@need_shared
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", SHARED_MODELS)
def test_exact_oracle(name, prompt):
    path = os.path.join(ORACLE, "logits", "%s.%s.exact.json" % (name, prompt))
    if not os.path.exists(path):
        pytest.skip("oracle %s absent" % path)
    with open(path) as f:
        exact = json.load(f)
    t0 = time.time()
    m = shared_model(name)
    t1 = time.time()
    ours = reference.run(os.path.join(MODELS, name + ".gguf"), exact["prompt_ids"], top=32, model=m)
    t2 = time.time()
    worst = check_against_exact(ours, exact)
    res = compare.compare(exact, ours)
    assert res["top1_same"] == res["positions"]
    assert res["max_abs_dlse"] <= LOGIT_TOL
    sys.stderr.write("\n%s %s: %d positions, load %.1fs, run %.1fs, max |dlogit| %.2g\n"
                     % (name, prompt, len(exact["prompt_ids"]), t1 - t0, t2 - t1, worst))


@need_shared
def test_cli_and_compare(tmp_path):
    """The CLI writes the oracle format, greedy included; compare.py reads it."""
    name = "qwen3moe-trained-q8"
    oracle = os.path.join(ORACLE, "logits", name + ".chat-short.json")
    exact = os.path.join(ORACLE, "logits", name + ".chat-short.exact.json")
    out = tmp_path / "out.json"
    rc = subprocess.call([sys.executable, os.path.join(HERE, "reference.py"),
                          os.path.join(MODELS, name + ".gguf"), "--oracle", oracle,
                          "--dump-logits", str(out), "-n", "3", "-q"])
    assert rc == 0
    with open(out) as f:
        doc = json.load(f)
    assert set(doc) == {"model", "n_vocab", "prompt_ids", "positions", "greedy"}
    assert len(doc["greedy"]) == 3
    g0 = doc["greedy"][0]
    assert set(g0) == {"id", "top"} and set(g0["top"]) == {"lse", "ids", "logits"}
    assert g0["id"] == doc["positions"][-1]["ids"][0]
    assert abs(g0["top"]["lse"] - doc["positions"][-1]["lse"]) < 1e-12
    with open(oracle) as f:
        llama = json.load(f)
    # llama.cpp's first greedy steps have large margins: they must agree
    assert [g["id"] for g in llama["greedy"][:3]] == [g["id"] for g in doc["greedy"]]
    rc = subprocess.call([sys.executable, os.path.join(HERE, "compare.py"), exact, str(out),
                          "--max-max", "1e-6", "--max-lse", "1e-6", "--min-top1", "1"],
                         stdout=subprocess.DEVNULL)
    assert rc == 0
    # llama.cpp against exact: the README's figures for this prompt
    res = compare.compare(exact, oracle)
    assert res["top1_same"] == 24 and 0.005 < res["mean_abs_dlogit"] < 0.03
    assert compare.check(res, max_mean=0.001) != []


# llama.cpp CPU against the exact pass, as the oracle README tabulates them:
# (top-1 same, mean |dlogit| rounded, max |dlogit| rounded or None)
README_FIGURES = {
    ("qwen3moe-tiny-q4k", "chat-short"): (23, 0.064, 0.60),
    ("qwen3moe-tiny-q4k", "chat-code"): (203, 0.059, 0.99),
    ("qwen3moe-tiny-q4k", "long-prose"): (1459, 0.042, 1.47),
    ("qwen3moe-trained-q8", "chat-short"): (24, 0.015, None),
    ("qwen3moe-trained-q8", "chat-code"): (215, 0.020, None),
    ("qwen3moe-trained-q8", "long-prose"): (1519, 0.014, None),
}


@need_shared
@pytest.mark.parametrize("case", sorted(README_FIGURES), ids=lambda c: "%s.%s" % c)
def test_compare_reproduces_readme(case):
    name, prompt = case
    base = os.path.join(ORACLE, "logits", "%s.%s" % (name, prompt))
    res = compare.compare(base + ".exact.json", base + ".json")
    top1, mean, mx = README_FIGURES[case]
    assert res["top1_same"] == top1
    assert round(res["mean_abs_dlogit"], 3) == mean
    if mx is not None:
        assert round(res["max_abs_dlogit"], 2) == mx


# ---------------------------------------------------------------- 2. quants

QUANT_TYPES = ["bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
               "iq4_nl", "iq4_xs", "mxfp4"]


@need_shared
@pytest.mark.parametrize("typ", QUANT_TYPES)
def test_dequant_oracle(typ):
    qdir = os.path.join(ORACLE, "quants")
    with open(os.path.join(qdir, "index.json")) as f:
        info = json.load(f)[typ]
    assert gguf.GGML_TYPES[info["ggml_type"]][0].lower() == typ
    assert gguf.GGML_TYPES[info["ggml_type"]][1:] == (info["block_elems"], info["block_bytes"])
    raw = np.fromfile(os.path.join(qdir, typ + ".blocks"), dtype=np.uint8)
    ref = np.fromfile(os.path.join(qdir, typ + ".f32"), dtype="<f4")
    x = dequant.dequantize_raw(raw, typ)
    assert x.dtype == np.float64 and x.shape == ref.shape
    # the exact value, rounded once to float32, is what the C reference gives
    assert np.array_equal(x.astype(np.float32), ref), \
        "max diff %g" % np.max(np.abs(x - ref))


def test_dequant_float_types():
    rng = np.random.default_rng(3)
    v = rng.standard_normal(1000).astype(np.float32)
    assert np.array_equal(dequant.dequantize_raw(v.view(np.uint8), "f32"), v.astype(np.float64))
    h = v.astype("<f2")
    assert np.array_equal(dequant.dequantize_raw(h.view(np.uint8), "f16"), h.astype(np.float64))
    bf = (v.view(np.uint32) >> 16).astype("<u2")
    want = (bf.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.array_equal(dequant.dequantize_raw(bf.view(np.uint8), "bf16"), want)


@need_shared
def test_dequant_rows():
    """Decoding selected rows equals slicing the whole decoded tensor."""
    g = gguf.load(os.path.join(MODELS, "qwen3moe-tiny-q4k.gguf"))
    t = g.tensors["blk.0.attn_v.weight"]  # Q6_K
    full = dequant.dequantize(t)
    rows = [5, 0, 255, 5]
    assert np.array_equal(dequant.dequantize(t, rows=rows), full[rows])
    e = g.tensors["blk.0.ffn_gate_exps.weight"]
    assert dequant.dequantize(e).shape == (16, 256, 256) == e.shape


# ---------------------------------------------------------------- 3. consistency

def test_gguf_roundtrip(tmp_path):
    T = gguf
    w = gguf_write.Writer(alignment=64)
    w.add("a.u8", (T.T_UINT8, 200))
    w.add("a.i8", (T.T_INT8, -5))
    w.add("a.u16", (T.T_UINT16, 65535))
    w.add("a.i16", (T.T_INT16, -300))
    w.add("a.u32", (T.T_UINT32, 4000000000))
    w.add("a.i32", -7)
    w.add("a.f32", 0.5)
    w.add("a.bool", True)
    w.add("a.str", "héllo")
    w.add("a.u64", (T.T_UINT64, 2**63 + 5))
    w.add("a.i64", (T.T_INT64, -2**40))
    w.add("a.f64", (T.T_FLOAT64, 1.0 / 3.0))
    w.add("a.arr_i32", [1, -2, 3])
    w.add("a.arr_str", ["x", "", "zz"])
    w.add("a.arr_nested", [[1, 2], [3], []], elem_type=T.T_ARRAY)
    w.add("a.arr_empty", [], elem_type=T.T_FLOAT32)
    w.add("a.arr_bool", [True, False], elem_type=T.T_BOOL)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-1, 1, 5).astype(np.float32)
    w.add_tensor("t.a", a)
    w.add_tensor("t.b", b, "F16")
    p = tmp_path / "rt.gguf"
    w.write(str(p))
    g = gguf.load(str(p))
    md = g.metadata
    assert g.version == 3 and g.alignment == 64 and g.data_offset % 64 == 0
    assert md["a.u8"] == 200 and md["a.i8"] == -5 and md["a.u16"] == 65535
    assert md["a.i16"] == -300 and md["a.u32"] == 4000000000 and md["a.i32"] == -7
    assert md["a.f32"] == 0.5 and md["a.bool"] is True and md["a.str"] == "héllo"
    assert md["a.u64"] == 2**63 + 5 and md["a.i64"] == -2**40 and md["a.f64"] == 1.0 / 3.0
    assert md["a.arr_i32"] == [1, -2, 3] and md["a.arr_str"] == ["x", "", "zz"]
    assert md["a.arr_nested"] == [[1, 2], [3], []] and md["a.arr_empty"] == []
    assert md["a.arr_bool"] == [True, False]
    assert g.tensors["t.a"].ne == (4, 3) and g.tensors["t.a"].shape == (3, 4)
    assert g.tensors["t.a"].offset % 64 == 0 and g.tensors["t.b"].offset % 64 == 0
    assert np.array_equal(dequant.dequantize(g.tensors["t.a"]), a)
    v = g.tensors["t.a"].view()
    assert v.shape == (3, 4) and v.dtype == np.dtype("<f4") and np.array_equal(v, a)
    assert isinstance(v.base, np.ndarray) and not v.flags.writeable
    assert np.array_equal(dequant.dequantize(g.tensors["t.b"]), b.astype(np.float16).astype(np.float64))
    # truncations are errors, not crashes
    data = p.read_bytes()
    for cut in (3, 10, 40, g.data_offset + g.tensors["t.b"].offset + 5):
        q = tmp_path / ("cut%d.gguf" % cut)
        q.write_bytes(data[:cut])
        with pytest.raises(gguf.GGUFError):
            gguf.load(str(q))


def _tiny(tmp_path, arch, n_expert=1, n_expert_used=1, tied=False, seed=0, weights=None, tag=""):
    if weights is None:
        weights, hp = gguf_write.tiny_weights(seed=seed, n_expert=n_expert)
    else:
        weights, hp = weights
    p = tmp_path / ("%s%s.gguf" % (arch, tag))
    gguf_write.write_model(str(p), arch, weights, hp, n_expert_used=n_expert_used, tied=tied)
    return refmodel.Model(str(p))


IDS = [3, 17, 17, 60, 0, 42, 9, 33, 63, 1, 5, 8]


def test_head_matches_direct(tmp_path):
    m = _tiny(tmp_path, "qwen3")
    h = m.hidden(IDS)
    full = h @ m.output.T
    lse, ids, vals = m.head(h, top=10, vchunk=16, tchunk=5)
    mx = full.max(axis=1)
    want_lse = mx + np.log(np.exp(full - mx[:, None]).sum(axis=1))
    assert np.allclose(lse, want_lse, rtol=0, atol=1e-12)
    want_ids = np.argsort(-full, axis=1, kind="stable")[:, :10]
    assert np.array_equal(ids, want_ids)
    assert np.allclose(vals, np.take_along_axis(full, want_ids, axis=1), rtol=0, atol=1e-12)


def test_moe_one_expert_equals_dense(tmp_path):
    wts = gguf_write.tiny_weights(seed=11, n_expert=1)
    moe = _tiny(tmp_path, "qwen3moe", weights=wts)
    dense = _tiny(tmp_path, "qwen3", weights=wts)
    assert moe.hp.arch == "qwen3moe" and dense.hp.arch == "qwen3"
    a = moe.logits(IDS)
    b = dense.logits(IDS)
    assert np.std(a) > 0.1
    assert np.max(np.abs(a - b)) < 1e-12


def test_identical_experts_equal_dense(tmp_path):
    """With every expert the same, normalized top-k weights sum to 1: dense result."""
    w, hp = gguf_write.tiny_weights(seed=12, n_expert=4)
    for k in list(w):
        if k.endswith("_exps.weight"):
            w[k] = np.repeat(w[k][:1], 4, axis=0)
    moe = _tiny(tmp_path, "qwen3moe", n_expert_used=2, weights=(w, hp))
    dense = _tiny(tmp_path, "qwen3", weights=(w, hp))
    assert np.max(np.abs(moe.logits(IDS) - dense.logits(IDS))) < 1e-12


def test_routing_topk(tmp_path):
    """Distinct experts: the chosen ones follow the router's top-k, and matter."""
    w, hp = gguf_write.tiny_weights(seed=13, n_expert=4)
    m2 = _tiny(tmp_path, "qwen3moe", n_expert_used=2, weights=(w, hp), tag="2")
    m4 = _tiny(tmp_path, "qwen3moe", n_expert_used=4, weights=(w, hp), tag="4")
    a, b = m2.logits(IDS), m4.logits(IDS)
    assert np.max(np.abs(a - b)) > 1e-3
    assert m2.last_routing.shape == (len(IDS), 2)
    assert np.all(m2.last_routing[:, 0] != m2.last_routing[:, 1])


def test_lazy_equals_eager(tmp_path):
    """Decoding weights per layer / per expert / per head chunk changes nothing."""
    wts = gguf_write.tiny_weights(seed=15, n_expert=4)
    eager = _tiny(tmp_path, "qwen3moe", n_expert_used=2, weights=wts)
    lazy = refmodel.Model(eager.path, lazy=True)
    assert lazy.lazy and not eager.lazy
    a = eager.head(eager.hidden(IDS), top=8, vchunk=16)
    b = lazy.head(lazy.hidden(IDS), top=8, vchunk=16)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_tied_output(tmp_path):
    wts = gguf_write.tiny_weights(seed=14)
    m = _tiny(tmp_path, "qwen3", tied=True, weights=wts)
    assert m.tied
    assert np.array_equal(m.output, wts[0]["token_embd.weight"].astype(np.float32).astype(np.float64))


def test_causal(tmp_path):
    """Logits at a position do not depend on later tokens."""
    m = _tiny(tmp_path, "qwen3moe", n_expert=4, n_expert_used=2)
    a = m.logits(IDS)
    b = m.logits(IDS[:5] + [7, 7, 7])
    assert np.max(np.abs(a[:5] - b[:5])) < 1e-12
    assert np.max(np.abs(a[5] - b[5])) > 1e-6


# ---------------------------------------------------------------- 4. glm4moe
# The expected values below are computed from the written weights with plain
# numpy, one formula of the spec at a time, not with model.py's helpers.

def _glm(tmp_path, weights, tag="", n_expert_used=2, **kw):
    """Write weights (from tiny_glm4moe_weights) as a glm4moe file and load it."""
    w, hp = weights
    p = tmp_path / ("glm4moe%s.gguf" % tag)
    gguf_write.write_glm4moe(str(p), w, hp, n_expert_used=n_expert_used, **kw)
    return refmodel.Model(str(p))


def _f32(a):
    """A weight as it reads back from an F32 tensor."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _getter(w, i):
    return lambda n: _f32(w["blk.%d.%s.weight" % (i, n)])


def _norm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def _swiglu(x, gate, up, down):
    a = x @ gate.T
    return (a / (1.0 + np.exp(-a)) * (x @ up.T)) @ down.T


def _rope_pairs(x, base, n_rot):
    """x (T, H, D) at positions 0..T-1: each pair (i, i + n_rot/2) turned by pos * base^(-2i/n_rot)."""
    out = x.copy()
    half = n_rot // 2
    for t in range(x.shape[0]):
        for i in range(half):
            a = t * base ** (-2.0 * i / n_rot)
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[t, :, i], x[t, :, i + half]
            out[t, :, i] = x0 * c - x1 * s
            out[t, :, i + half] = x0 * s + x1 * c
    return out


def _glm_attention(w, hp, i, x, eps, base):
    def f(n):
        return _f32(w["blk.%d.%s" % (i, n)])

    T, H, Hkv, D = x.shape[0], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    q = (x @ f("attn_q.weight").T + f("attn_q.bias")).reshape(T, H, D)
    k = (x @ f("attn_k.weight").T + f("attn_k.bias")).reshape(T, Hkv, D)
    v = (x @ f("attn_v.weight").T + f("attn_v.bias")).reshape(T, Hkv, D)
    if "blk.%d.attn_q_norm.weight" % i in w:
        q = _norm(q, f("attn_q_norm.weight"), eps)
        k = _norm(k, f("attn_k_norm.weight"), eps)
    n_rot = hp["rope_dim"] or D
    q, k = _rope_pairs(q, base, n_rot), _rope_pairs(k, base, n_rot)
    out = np.zeros((T, H, D))
    for h in range(H):
        kv = h // (H // Hkv)
        for t in range(T):
            s = k[:t + 1, kv] @ q[t, h] / math.sqrt(D)
            e = np.exp(s - s.max())
            out[t, h] = e / e.sum() @ v[:t + 1, kv]
    return out.reshape(T, H * D) @ f("attn_output.weight").T


def _glm_moe_all(w, hp, i, x, scale, norm, softmax=False):
    """The MoE of layer i with every expert chosen: sum of p_e (over their sum
    when norm) * scale * expert_e, plus the shared expert."""
    f = _getter(w, i)
    lg = x @ f("ffn_gate_inp").T
    if softmax:
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
    else:
        p = 1.0 / (1.0 + np.exp(-lg))
    if norm:
        p = p / p.sum(axis=1, keepdims=True)
    out = _swiglu(x, f("ffn_gate_shexp"), f("ffn_up_shexp"), f("ffn_down_shexp"))
    for e in range(hp["n_expert"]):
        out += (p[:, e] * scale)[:, None] * _swiglu(x, f("ffn_gate_exps")[e], f("ffn_up_exps")[e],
                                                    f("ffn_down_exps")[e])
    return out


def _zero_probs_bias(w, hp):
    for i in range(hp["n_dense_lead"], hp["n_layer"] + hp["n_nextn"]):
        w["blk.%d.exp_probs_b.bias" % i] = np.zeros(hp["n_expert"])


GLM_MD = {
    "general.architecture": "glm4moe", "glm4moe.block_count": 4,
    "glm4moe.nextn_predict_layers": 1, "glm4moe.embedding_length": 32,
    "glm4moe.attention.head_count": 4, "glm4moe.attention.key_length": 16,
    "glm4moe.attention.layer_norm_rms_epsilon": 1e-5, "glm4moe.expert_count": 4,
    "glm4moe.expert_used_count": 2, "glm4moe.expert_shared_count": 1,
    "glm4moe.expert_feed_forward_length": 8,
}


def test_glm4moe_hparams():
    hp = refmodel.Hparams(GLM_MD)
    assert (hp.block_count, hp.n_nextn, hp.n_layer) == (4, 1, 3)
    assert hp.rope_dim == hp.head_dim == 16 and hp.n_layer_dense_lead == 0
    assert hp.expert_weights_scale == 1.0 and hp.expert_weights_norm is False
    assert hp.expert_gating == "sigmoid" and hp.n_expert_shared == 1
    assert refmodel.Hparams(dict(GLM_MD, **{"glm4moe.expert_gating_func": 1})).expert_gating == "softmax"
    assert refmodel.Hparams(dict(GLM_MD, **{"glm4moe.expert_gating_func": 2})).expert_gating == "sigmoid"
    for key, bad in (("expert_gating_func", 3), ("nextn_predict_layers", 4),
                     ("rope.dimension_count", 17), ("expert_used_count", 5)):
        with pytest.raises(ValueError):
            refmodel.Hparams(dict(GLM_MD, **{"glm4moe." + key: bad}))
    md = dict(GLM_MD)
    del md["glm4moe.expert_shared_count"]
    with pytest.raises(ValueError):
        refmodel.Hparams(md)


def _glm_by_hand(w, hp, eps, base, scale):
    """The final-normed hidden states of IDS through the layers run (not the NextN
    ones), every expert used, the weights normalised and scaled by scale."""
    x = _f32(w["token_embd.weight"])[IDS]
    for i in range(hp["n_layer"]):
        f = _getter(w, i)
        x = x + _glm_attention(w, hp, i, _norm(x, f("attn_norm"), eps), eps, base)
        h = _norm(x, f("post_attention_norm"), eps)
        x = x + (_swiglu(h, f("ffn_gate"), f("ffn_up"), f("ffn_down")) if i < hp["n_dense_lead"]
                 else _glm_moe_all(w, hp, i, h, scale, True))
    return _norm(x, _f32(w["output_norm.weight"]), eps)


def test_glm4moe_forward_by_hand(tmp_path):
    """Whole forward pass (dense layer 0, MoE layer 1, NextN layer 2 skipped)
    against plain numpy; every expert used so the routing is known."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=20)
    _zero_probs_bias(w, hp)
    m = _glm(tmp_path, (w, hp), n_expert_used=hp["n_expert"], expert_scale=1.5, expert_norm=True)
    assert m.hp.expert_weights_norm is True and m.hp.expert_weights_scale == 1.5
    assert [m.layer(i).is_moe for i in range(m.hp.n_layer)] == [False, True]
    want = _glm_by_hand(w, hp, m.hp.eps, m.hp.rope_base, 1.5) @ _f32(w["output.weight"]).T
    got = m.logits(IDS)
    assert np.std(got) > 0.1
    assert np.max(np.abs(got - want)) < 1e-10
    assert m.last_routing.shape == (len(IDS), hp["n_expert"])


def test_glm4moe_nextn_not_run(tmp_path):
    """New weights for the NextN layer change nothing; for the last layer run they do."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=21)
    rng = np.random.default_rng(1)

    def redraw(i):
        p = "blk.%d." % i
        return {k: (rng.standard_normal(v.shape) * 0.3 if k.startswith(p) else v) for k, v in w.items()}

    m = _glm(tmp_path, (w, hp))
    assert (m.hp.block_count, m.hp.n_layer) == (3, 2)
    a = m.logits(IDS)
    b = _glm(tmp_path, (redraw(2), hp), tag="nextn").logits(IDS)
    c = _glm(tmp_path, (redraw(1), hp), tag="last").logits(IDS)
    assert np.array_equal(a, b)
    assert np.max(np.abs(a - c)) > 1e-3


def test_glm4moe_nextn_layer_by_hand(tmp_path):
    """The NextN layer's logits (mtp_hidden, mtp_head) against plain numpy: row i
    from the final-normed hidden state at position i and the embedding (the layer's
    own) of the id after it, through eh_proj, a block at positions 0.., its norm and
    its own head; every expert used so the routing is known. A prefix of the ids gives
    the same first rows (the layer is causal)."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=24)
    _zero_probs_bias(w, hp)
    m = _glm(tmp_path, (w, hp), n_expert_used=hp["n_expert"])
    eps, base = m.hp.eps, m.hp.rope_base
    hid = _glm_by_hand(w, hp, eps, base, 1.0)[:-1]
    n = hp["n_layer"]
    f = _getter(w, n)
    e = _f32(w["blk.%d.nextn.embed_tokens.weight" % n])[IDS[1:]]
    y = np.concatenate([_norm(e, f("nextn.enorm"), eps), _norm(hid, f("nextn.hnorm"), eps)], axis=1)
    y = y @ f("nextn.eh_proj").T
    y = y + _glm_attention(w, hp, n, _norm(y, f("attn_norm"), eps), eps, base)
    y = y + _glm_moe_all(w, hp, n, _norm(y, f("post_attention_norm"), eps), 1.0, True)
    want = _norm(y, f("nextn.shared_head_norm"), eps) @ f("nextn.shared_head_head").T
    rows = m.mtp_hidden(IDS)
    lse, ids, vals = m.mtp_head(rows, top=hp["n_vocab"])
    got = np.empty_like(want)
    for t in range(len(rows)):
        got[t, ids[t]] = vals[t]
    assert np.std(got) > 0.1
    assert np.max(np.abs(got - want)) < 1e-10
    assert np.max(np.abs(m.mtp_hidden(IDS[:4]) - rows[:3])) < 1e-12
    with pytest.raises(ValueError, match="at least two ids"):
        m.mtp_hidden(IDS[:1])


@pytest.mark.parametrize("gating", [2, 1], ids=["sigmoid", "softmax"])
def test_glm4moe_moe_all_experts(tmp_path, gating):
    """expert_used_count == expert_count, no norm, scale 2.5, zero bias:
    sum of p_e * 2.5 * expert_e plus the shared expert."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=22)
    _zero_probs_bias(w, hp)
    m = _glm(tmp_path, (w, hp), n_expert_used=hp["n_expert"], expert_scale=2.5,
             expert_norm=False, gating=gating)
    x = np.random.default_rng(2).standard_normal((7, hp["n_embd"]))
    got = m.moe(m.layer(1), x)
    want = _glm_moe_all(w, hp, 1, x, 2.5, False, softmax=gating == 1)
    assert np.std(want) > 0.1
    assert np.max(np.abs(got - want)) < 1e-12


def test_glm4moe_bias_steers_choice_not_weights(tmp_path):
    """A large exp_probs_b on one expert puts it first for every token; the
    weights stay the unbiased sigmoids (normalised over the chosen two)."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=23)
    _zero_probs_bias(w, hp)
    x = np.random.default_rng(3).standard_normal((9, hp["n_embd"]))
    m0 = _glm(tmp_path, (w, hp), tag="0")
    m0.moe(m0.layer(1), x)
    big = 3
    assert not np.all(np.any(m0.last_routing == big, axis=1)), "seed leaves the bias nothing to do"
    w["blk.1.exp_probs_b.bias"][big] = 10.0
    m = _glm(tmp_path, (w, hp), tag="1")
    got = m.moe(m.layer(1), x)
    f = _getter(w, 1)
    p = 1.0 / (1.0 + np.exp(-(x @ f("ffn_gate_inp").T)))
    other = np.argmax(np.where(np.arange(hp["n_expert"]) == big, -np.inf, p), axis=1)
    assert np.array_equal(m.last_routing, np.stack([np.full(len(x), big), other], axis=1))
    want = _swiglu(x, f("ffn_gate_shexp"), f("ffn_up_shexp"), f("ffn_down_shexp"))
    for t in range(len(x)):
        pair = (big, other[t])
        for e in pair:
            we = p[t, e] / (p[t, big] + p[t, other[t]])
            want[t] += we * _swiglu(x[t:t + 1], f("ffn_gate_exps")[e], f("ffn_up_exps")[e],
                                    f("ffn_down_exps")[e])[0]
    assert np.max(np.abs(got - want)) < 1e-12


def test_glm4moe_routing_ties(tmp_path):
    """A zero router gives every expert sigmoid(0) = 0.5: ties go to the lower
    id, and a small bias alone decides; the weights stay 0.5 each."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=24)
    w["blk.1.ffn_gate_inp.weight"] = np.zeros_like(w["blk.1.ffn_gate_inp.weight"])
    x = np.random.default_rng(4).standard_normal((5, hp["n_embd"]))
    for bias, want in (([0, 0, 0, 0], [0, 1]), ([0, 1e-3, 0, 1e-3], [1, 3]), ([0, 0, 1e-3, 0], [2, 0])):
        w["blk.1.exp_probs_b.bias"] = np.array(bias, dtype=np.float64)
        m = _glm(tmp_path, (w, hp), expert_norm=False, tag="".join(map(str, want)))
        sel, wsel = m.route(m.layer(1), x)
        assert np.array_equal(sel, np.tile(want, (len(x), 1))), bias
        assert np.array_equal(wsel, np.full(sel.shape, 0.5))


def test_glm4moe_weights_sum_clamped(tmp_path):
    """Chosen sigmoids summing below 6.103515625e-5 are divided by that, not by their sum."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=29)
    _zero_probs_bias(w, hp)
    w["blk.1.ffn_gate_inp.weight"] = -np.ones_like(w["blk.1.ffn_gate_inp.weight"])
    m = _glm(tmp_path, (w, hp), expert_scale=2.0, expert_norm=True)
    x = np.full((3, hp["n_embd"]), 0.5)  # every router logit is -16
    sel, wsel = m.route(m.layer(1), x)
    p = 1.0 / (1.0 + math.exp(16.0))
    assert 2 * p < 6.103515625e-5
    assert np.array_equal(sel, np.tile([0, 1], (3, 1)))
    assert np.allclose(wsel, p / 6.103515625e-5 * 2.0, rtol=1e-14, atol=0)


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_qk_norm"])
def test_glm4moe_attention_by_hand(tmp_path, qk_norm):
    """Biases, optional per-head q/k norm, NEOX RoPE over half of each head, GQA."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=25, qk_norm=qk_norm)
    m = _glm(tmp_path, (w, hp))
    L = m.layer(1)
    assert (L.q_norm is not None, L.k_norm is not None) == (qk_norm, qk_norm)
    assert m.hp.rope_dim == hp["head_dim"] // 2
    x = np.random.default_rng(5).standard_normal((9, hp["n_embd"]))
    got = m.attention(L, x, np.arange(9))
    want = _glm_attention(w, hp, 1, x, m.hp.eps, m.hp.rope_base)
    assert np.std(want) > 0.1
    assert np.max(np.abs(got - want)) < 1e-12


def test_glm4moe_partial_rope(tmp_path):
    """With q and k carried only by the dims past n_rot, the RoPE base changes
    nothing; rotating whole heads (rope.dimension_count absent) it does."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=26)
    D, r = hp["head_dim"], hp["rope_dim"]
    for i in range(hp["n_layer"]):
        for n in ("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"):
            a = w["blk.%d.%s" % (i, n)].copy()
            a.reshape((-1, D) + a.shape[1:])[:, :r] = 0.0
            w["blk.%d.%s" % (i, n)] = a
    lg = {}
    for rot in (r, None):
        for base in (1e4, 1e6):
            m = _glm(tmp_path, (w, dict(hp, rope_dim=rot)), rope_base=base, tag="%s_%g" % (rot, base))
            assert m.hp.rope_dim == (rot or D)
            lg[rot, base] = m.logits(IDS)
    assert np.max(np.abs(lg[r, 1e4] - lg[r, 1e6])) < 1e-12
    assert np.max(np.abs(lg[None, 1e4] - lg[None, 1e6])) > 1e-4


def test_glm4moe_attention_bias(tmp_path):
    """Zero q/k/v weights: every value row is v's bias, so attention gives Wo times it."""
    w, hp = gguf_write.tiny_glm4moe_weights(seed=27)
    for n in ("attn_q", "attn_k", "attn_v"):
        w["blk.0.%s.weight" % n] = np.zeros_like(w["blk.0.%s.weight" % n])
    m = _glm(tmp_path, (w, hp))
    x = np.random.default_rng(6).standard_normal((6, hp["n_embd"]))
    got = m.attention(m.layer(0), x, np.arange(6))
    H, Hkv = hp["n_head"], hp["n_head_kv"]
    bv = _f32(w["blk.0.attn_v.bias"]).reshape(Hkv, -1)
    heads = np.concatenate([bv[h // (H // Hkv)] for h in range(H)])
    want = _f32(w["blk.0.attn_output.weight"]) @ heads
    assert np.std(want) > 0.1
    assert np.max(np.abs(got - want[None, :])) < 1e-12


def test_glm4moe_lazy_equals_eager(tmp_path):
    eager = _glm(tmp_path, gguf_write.tiny_glm4moe_weights(seed=28))
    lazy = refmodel.Model(eager.path, lazy=True)
    assert lazy.lazy and not eager.lazy
    a = eager.head(eager.hidden(IDS), top=8, vchunk=16)
    b = lazy.head(lazy.hidden(IDS), top=8, vchunk=16)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


# ---------------------------------------------------------------- 5. deepseek2
# As for glm4moe, the expected values are plain numpy from the written file
# (its metadata and tensors read with gguf.py, ggml's ne order), one formula of
# build-dev/deepseek2-spec.md at a time; attention in the absorbed form.

DS2_ARCH = "deepseek2."


def _ds2(tmp_path, weights, tag="", **kw):
    """Write weights (from tiny_deepseek2_weights) as a deepseek2 file and load it."""
    w, hp = weights
    p = tmp_path / ("deepseek2%s.gguf" % tag)
    gguf_write.write_deepseek2(str(p), w, hp, **kw)
    return refmodel.Model(str(p))


def _file(path):
    """(metadata, tensors as float64 in numpy order) of a written file; MXFP4
    tensors decoded by _mxfp4_by_hand."""
    g = gguf.load(path)
    F = {}
    for n, t in g.tensors.items():
        if t.type_name == "MXFP4":
            F[n] = _mxfp4_by_hand(t.raw, t.shape)
        else:
            F[n] = np.asarray(t.view(), dtype=np.float64)
    return g.metadata, F


def _mxfp4_by_hand(raw, shape):
    """ggml's MXFP4 blocks, one at a time: a byte e (scale 2^(e - 127)), then 16
    bytes whose low nibbles are elements 0..15 and high nibbles 16..31, each
    an E2M1 code: bit 3 the sign, bits 0..2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    out = []
    for blk in np.asarray(raw, dtype=np.uint8).reshape(-1, 17):
        scale = 2.0 ** (int(blk[0]) - 127)
        codes = [int(q) & 15 for q in blk[1:]] + [int(q) >> 4 for q in blk[1:]]
        out += [(-1.0 if c & 8 else 1.0) * e2m1[c & 7] * scale for c in codes]
    return np.array(out).reshape(shape)


def _ds2_yarn_by_hand(md):
    """The spec's RoPE from metadata: (theta(pos, i), m_rope, kq factor mscale^2)."""
    def k(key, default=None):
        return md.get(DS2_ARCH + key, default)

    n_rot, base = k("rope.dimension_count"), k("rope.freq_base")
    F = k("rope.scaling.factor", 1.0)

    def theta_e(pos, i):
        return pos * base ** (-2.0 * i / n_rot)

    if k("rope.scaling.type", "none") != "yarn" or F <= 1.0:
        return theta_e, 1.0, 1.0
    orig = k("rope.scaling.original_context_length", k("context_length"))
    log_mul = float(np.float32(k("rope.scaling.yarn_log_multiplier", 0.0)) / np.float32(0.1))

    def corr_dim(b):
        return n_rot * math.log(orig / (b * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0, math.floor(corr_dim(k("rope.scaling.yarn_beta_fast", 32.0))))
    hi = min(n_rot - 1, math.ceil(corr_dim(k("rope.scaling.yarn_beta_slow", 1.0))))

    def get_mscale(s, m):
        return 1.0 if s <= 1 else 1.0 + 0.1 * m * math.log(s)

    first = get_mscale(F, log_mul) / get_mscale(F, log_mul) if log_mul != 0 else get_mscale(F, 1.0)
    attn_factor = first / (1 + 0.1 * math.log(F)) * k("rope.scaling.attn_factor", 1.0)
    m_rope = attn_factor * (1 + 0.1 * math.log(F))
    mscale = attn_factor * (1 + 0.1 * math.log(F)) * (1 + 0.1 * log_mul * math.log(F))

    def theta(pos, i):
        ramp = 1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
        return (1.0 / F) * theta_e(pos, i) * (1 - ramp) + theta_e(pos, i) * ramp

    return theta, m_rope, mscale * mscale


def _rope_consecutive(x, theta, m, n_rot):
    """x (T, H, D) at positions 0..T-1: pairs (2i, 2i+1), i < n_rot/2, turned by
    theta(pos, i), cos and sin times m."""
    out = x.copy()
    for t in range(x.shape[0]):
        for i in range(n_rot // 2):
            c, s = math.cos(theta(t, i)) * m, math.sin(theta(t, i)) * m
            x0, x1 = x[t, :, 2 * i], x[t, :, 2 * i + 1]
            out[t, :, 2 * i] = x0 * c - x1 * s
            out[t, :, 2 * i + 1] = x0 * s + x1 * c
    return out


def _ds2_attention_by_hand(md, F, i, x, absorbed=True):
    """Layer i's latent attention over rows x at positions 0..T-1. absorbed:
    scores against the cached [kv ; k_pe] with q_abs = Wk_b^T q_nope per head,
    o = Wv_b (p . kv); else per head k_nope and v decompressed."""
    p = "blk.%d." % i
    eps = md[DS2_ARCH + "attention.layer_norm_rms_epsilon"]
    H = md[DS2_ARCH + "attention.head_count"]
    kvl = md[DS2_ARCH + "attention.kv_lora_rank"]
    rot = md[DS2_ARCH + "rope.dimension_count"]
    if DS2_ARCH + "attention.key_length_mla" in md:
        hk, hv = md[DS2_ARCH + "attention.key_length_mla"], md[DS2_ARCH + "attention.value_length_mla"]
        kb = F[p + "attn_k_b.weight"]  # ne [nope, kvl, H]: numpy (H, kvl, nope)
        vb = F[p + "attn_v_b.weight"]  # ne [kvl, hv, H]: numpy (H, hv, kvl)
    else:
        hk, hv = md[DS2_ARCH + "attention.key_length"], md[DS2_ARCH + "attention.value_length"]
        kvb = F[p + "attn_kv_b.weight"].reshape(H, hk - rot + hv, kvl)
        kb = kvb[:, :hk - rot].transpose(0, 2, 1)
        vb = kvb[:, hk - rot:]
    nope = hk - rot
    theta, m_rope, kq = _ds2_yarn_by_hand(md)
    scale = kq / math.sqrt(hk)
    T = x.shape[0]
    if p + "attn_q_a.weight" in F:
        qa = _norm(x @ F[p + "attn_q_a.weight"].T, F[p + "attn_q_a_norm.weight"], eps)
        q = qa @ F[p + "attn_q_b.weight"].T
    else:
        q = x @ F[p + "attn_q.weight"].T
    q = q.reshape(T, H, hk)
    q_nope = q[:, :, :nope]
    q_pe = _rope_consecutive(q[:, :, nope:], theta, m_rope, rot)
    c = x @ F[p + "attn_kv_a_mqa.weight"].T
    kv = _norm(c[:, :kvl], F[p + "attn_kv_a_norm.weight"], eps)
    k_pe = _rope_consecutive(c[:, None, kvl:], theta, m_rope, rot)[:, 0]
    cache = np.concatenate([kv, k_pe], axis=1)  # (T, kvl + rot)
    out = np.zeros((T, H, hv))
    for h in range(H):
        for t in range(T):
            if absorbed:
                qf = np.concatenate([kb[h] @ q_nope[t, h], q_pe[t, h]])
                s = cache[:t + 1] @ qf * scale
            else:
                k_nope = kv[:t + 1] @ kb[h]  # row j: Wk_b kv(j)
                s = (k_nope @ q_nope[t, h] + k_pe[:t + 1] @ q_pe[t, h]) * scale
            e = np.exp(s - s.max())
            pr = e / e.sum()
            if absorbed:
                out[t, h] = vb[h] @ (pr @ kv[:t + 1])
            else:
                out[t, h] = pr @ (kv[:t + 1] @ vb[h].T)
    return out.reshape(T, H * hv) @ F[p + "attn_output.weight"].T


def _ds2_route_by_hand(md, lg, bias):
    """Chosen experts and weights of router logits lg (T, n), token by token."""
    n = md[DS2_ARCH + "expert_count"]
    k = md[DS2_ARCH + "expert_used_count"]
    G = md.get(DS2_ARCH + "expert_group_count", 1)
    topk_group = md.get(DS2_ARCH + "expert_group_used_count", 1)
    sigmoid_gating = md.get(DS2_ARCH + "expert_gating_func", 0) == 2
    scale = md.get(DS2_ARCH + "expert_weights_scale", 1.0) or 1.0
    sel_all, w_all = [], []
    for row in lg:
        if sigmoid_gating:
            pr = 1.0 / (1.0 + np.exp(-row))
        else:
            pr = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        sel = pr + (bias if bias is not None else 0.0)
        if G > 1:
            per = n // G
            gs = [sum(sorted(sel[g * per:(g + 1) * per])[-2:]) for g in range(G)]
            keep = sorted(range(G), key=lambda g: (-gs[g], g))[:topk_group]
            sel = np.array([sel[e] if e // per in keep else -np.inf for e in range(n)])
        chosen = sorted(range(n), key=lambda e: (-sel[e], e))[:k]
        w = pr[chosen]
        if md.get(DS2_ARCH + "expert_weights_norm", False):
            w = w / max(w.sum(), 6.103515625e-5)
        sel_all.append(chosen)
        w_all.append(w * scale)
    return np.array(sel_all), np.array(w_all)


def _ds2_moe_by_hand(md, F, i, x):
    p = "blk.%d." % i
    sel, w = _ds2_route_by_hand(md, x @ F[p + "ffn_gate_inp.weight"].T, F.get(p + "exp_probs_b.bias"))
    out = np.zeros_like(x)
    if p + "ffn_gate_shexp.weight" in F:
        out += _swiglu(x, F[p + "ffn_gate_shexp.weight"], F[p + "ffn_up_shexp.weight"],
                       F[p + "ffn_down_shexp.weight"])
    g, u, d = (F[p + n] for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
    for t in range(len(x)):
        for e, we in zip(sel[t], w[t]):
            out[t] += we * _swiglu(x[t:t + 1], g[e], u[e], d[e])[0]
    return out, sel


def _ds2_logits_by_hand(path, ids):
    md, F = _file(path)
    eps = md[DS2_ARCH + "attention.layer_norm_rms_epsilon"]
    n_layer = md[DS2_ARCH + "block_count"] - md.get(DS2_ARCH + "nextn_predict_layers", 0)
    x = F["token_embd.weight"][ids]
    sel = None
    for i in range(n_layer):
        p = "blk.%d." % i
        x = x + _ds2_attention_by_hand(md, F, i, _norm(x, F[p + "attn_norm.weight"], eps))
        h = _norm(x, F[p + "ffn_norm.weight"], eps)
        if i < md.get(DS2_ARCH + "leading_dense_block_count", 0):
            x = x + _swiglu(h, F[p + "ffn_gate.weight"], F[p + "ffn_up.weight"], F[p + "ffn_down.weight"])
        else:
            y, sel = _ds2_moe_by_hand(md, F, i, h)
            x = x + y
    out = F.get("output.weight", F["token_embd.weight"])
    return _norm(x, F["output_norm.weight"], eps) @ out.T, sel


DS2_MD = {
    "general.architecture": "deepseek2", "deepseek2.block_count": 4,
    "deepseek2.context_length": 4096, "deepseek2.embedding_length": 32,
    "deepseek2.attention.head_count": 4, "deepseek2.attention.head_count_kv": 1,
    "deepseek2.attention.key_length": 72, "deepseek2.attention.value_length": 64,
    "deepseek2.attention.key_length_mla": 24, "deepseek2.attention.value_length_mla": 12,
    "deepseek2.attention.kv_lora_rank": 64, "deepseek2.rope.dimension_count": 8,
    "deepseek2.attention.layer_norm_rms_epsilon": 1e-6, "deepseek2.rope.freq_base": 10000.0,
    "deepseek2.expert_count": 16, "deepseek2.expert_used_count": 4,
    "deepseek2.expert_shared_count": 1, "deepseek2.expert_feed_forward_length": 8,
}

# DeepSeek-V3's RoPE keys as the converter writes them (0.1f is 0.1 * mscale_all_dim 1)
V3_ROPE = {"deepseek2.rope.dimension_count": 64, "deepseek2.attention.key_length_mla": 192,
           "deepseek2.attention.value_length_mla": 128, "deepseek2.attention.kv_lora_rank": 512,
           "deepseek2.attention.key_length": 576, "deepseek2.attention.value_length": 512,
           "deepseek2.rope.scaling.type": "yarn", "deepseek2.rope.scaling.factor": 40.0,
           "deepseek2.rope.scaling.original_context_length": 4096,
           "deepseek2.rope.scaling.yarn_log_multiplier": float(np.float32(0.1))}


def _ds2_md(**kw):
    md = dict(DS2_MD)
    for k, v in kw.items():
        k = DS2_ARCH + k.replace("__", ".")
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    return md


def test_deepseek2_hparams():
    hp = refmodel.Hparams(DS2_MD)
    assert (hp.block_count, hp.n_nextn, hp.n_layer, hp.n_layer_dense_lead) == (4, 0, 4, 0)
    assert hp.mla and (hp.head_dim, hp.head_dim_v, hp.qk_nope, hp.rope_dim) == (24, 12, 16, 8)
    assert (hp.q_lora, hp.kv_lora) == (0, 64)
    assert hp.expert_gating == "softmax" and hp.expert_weights_scale == 1.0
    assert hp.expert_weights_norm is False and (hp.n_group, hp.topk_group) == (1, 1)
    assert hp.rope_yarn is None and hp.kq_scale == 1.0 / math.sqrt(24)
    legacy = _ds2_md(attention__key_length_mla=None, attention__value_length_mla=None,
                     attention__key_length=24, attention__value_length=12, attention__head_count_kv=4)
    hp = refmodel.Hparams(legacy)
    assert not hp.mla and (hp.head_dim, hp.head_dim_v, hp.qk_nope) == (24, 12, 16)
    hp = refmodel.Hparams(_ds2_md(expert_gating_func=0, expert_weights_scale=0.0, nextn_predict_layers=1,
                                  attention__q_lora_rank=48, expert_group_count=4,
                                  expert_group_used_count=2, leading_dense_block_count=1))
    assert hp.expert_gating == "softmax" and hp.expert_weights_scale == 1.0
    assert (hp.n_nextn, hp.n_layer, hp.q_lora, hp.n_group, hp.topk_group) == (1, 3, 48, 4, 2)
    assert refmodel.Hparams(_ds2_md(expert_gating_func=2)).expert_gating == "sigmoid"
    assert refmodel.Hparams(_ds2_md(expert_gating_func=1)).expert_gating == "softmax"
    assert refmodel.Hparams(_ds2_md(expert_weights_scale=2.5)).expert_weights_scale == 2.5
    for bad in (dict(expert_gating_func=3),
                dict(expert_group_count=3),                           # 16 experts
                dict(expert_group_count=4, expert_group_used_count=5),
                dict(expert_group_count=4, expert_group_used_count=0),
                dict(expert_group_count=16),                          # groups of one expert
                dict(expert_group_count=8, expert_group_used_count=1),  # 4 used in 1 group of 2
                dict(rope__scaling__type="linear"),
                dict(attention__value_length_mla=None),
                dict(attention__key_length_mla=None),
                dict(attention__key_length=70),                       # not kv_lora + n_rot
                dict(attention__key_length_mla=8),                     # no dims besides the rotated
                dict(attention__kv_lora_rank=None),
                dict(expert_shared_count=None),
                dict(nextn_predict_layers=4)):
        with pytest.raises(ValueError):
            refmodel.Hparams(_ds2_md(**bad))


def test_deepseek2_yarn_hparams():
    """kq_scale and the rotation's correction dims and magnitude, as the spec's
    formulas give them, for DeepSeek-V3's and V2-Lite's keys and variants."""
    def check(md, lo, hi, m_rope, mscale):
        hp = refmodel.Hparams(md)
        fs, ext, got_lo, got_hi, got_m = hp.rope_yarn
        assert (fs, ext, got_lo, got_hi) == (1.0 / md["deepseek2.rope.scaling.factor"], 1.0, lo, hi)
        assert got_m == pytest.approx(m_rope, rel=1e-14)
        assert hp.kq_scale == pytest.approx(mscale ** 2 / math.sqrt(hp.head_dim), rel=1e-14)
        return hp

    # corr_dim(b) = 64 ln(4096 / (2 pi b)) / (2 ln 10000): 10.5 for b = 32, 22.5 for b = 1
    ln40 = math.log(40.0)
    hp = check(_ds2_md(**{k[len(DS2_ARCH):].replace(".", "__"): v for k, v in V3_ROPE.items()}),
               10.0, 23.0, 1.0, 1.0 + 0.1 * ln40)
    assert hp.yarn_log_mul == 1.0 and hp.head_dim == 192
    v3 = {k[len(DS2_ARCH):].replace(".", "__"): v for k, v in V3_ROPE.items()}
    # V2-Lite: mscale_all_dim 0.707 stored as 0.0707
    lite = dict(v3, rope__scaling__yarn_log_multiplier=float(np.float32(0.0707)))
    m = float(np.float32(0.0707) / np.float32(0.1))
    assert abs(m - 0.707) < 1e-6
    check(_ds2_md(**lite), 10.0, 23.0, 1.0, 1.0 + 0.1 * m * ln40)
    # no log multiplier: cos and sin get 1 + 0.1 ln F, and so does mscale
    check(_ds2_md(**dict(v3, rope__scaling__yarn_log_multiplier=None)), 10.0, 23.0,
          1.0 + 0.1 * ln40, 1.0 + 0.1 * ln40)
    # rope.scaling.attn_factor multiplies both; the betas move the correction dims
    check(_ds2_md(**dict(v3, rope__scaling__attn_factor=1.25)), 10.0, 23.0, 1.25, 1.25 * (1.0 + 0.1 * ln40))
    slow = float(np.float32(1e-6))
    lo = math.floor(64 * math.log(4096 / (2 * math.pi * 16)) / (2 * math.log(10000)))
    hi = math.ceil(64 * math.log(4096 / (2 * math.pi * slow)) / (2 * math.log(10000)))
    assert (lo, hi) == (12, 71)  # hi is clamped to n_rot - 1
    check(_ds2_md(**dict(v3, rope__scaling__yarn_beta_fast=16.0, rope__scaling__yarn_beta_slow=slow)),
          12.0, 63.0, 1.0, 1.0 + 0.1 * ln40)
    # original_context_length defaults to context_length (4096 here)
    check(_ds2_md(**dict(v3, rope__scaling__original_context_length=None)), 10.0, 23.0, 1.0, 1.0 + 0.1 * ln40)
    # a short original context puts corr_dim(32) below 0: lo clamped to 0
    lo = 64 * math.log(100 / (2 * math.pi * 32)) / (2 * math.log(10000))
    hi = math.ceil(64 * math.log(100 / (2 * math.pi)) / (2 * math.log(10000)))
    assert lo < 0 and hi == 10
    check(_ds2_md(**dict(v3, rope__scaling__original_context_length=100)), 0.0, 10.0, 1.0, 1.0 + 0.1 * ln40)
    # no scaling: type none, absent, or a yarn factor <= 1
    assert refmodel.yarn_params(64, 1e4, 1.0, 4096, log_mul=1.0) == (None, 1.0)
    for kw in (dict(rope__scaling__type="none"), dict(rope__scaling__type=None),
               dict(rope__scaling__factor=1.0), dict(rope__scaling__factor=0.5),
               dict(rope__scaling__factor=None)):
        hp = refmodel.Hparams(_ds2_md(**dict(v3, **kw)))
        assert hp.rope_yarn is None and hp.kq_scale == 1.0 / math.sqrt(192)


def test_deepseek2_rope_norm():
    """rope_norm against a per-element rotation of consecutive pairs; the dims
    past n_rot are untouched; without YaRN (or with a factor <= 1) a plain
    rotation by pos * base^(-2i/n_rot)."""
    rng = np.random.default_rng(30)
    x = rng.standard_normal((7, 3, 20))
    pos = np.arange(7)
    n_rot, base = 16, 100.0

    def by_hand(theta, m):
        return _rope_consecutive(x, theta, m, n_rot)

    def plain(t, i):
        return t * base ** (-2.0 * i / n_rot)

    got = refmodel.rope_norm(x, pos, base, n_rot)
    want = by_hand(plain, 1.0)
    assert np.max(np.abs(got - want)) < 1e-13
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])
    # a rotation: each pair keeps its length; position 0 is the identity
    assert np.allclose(got[..., 0:n_rot:2] ** 2 + got[..., 1:n_rot:2] ** 2,
                       x[..., 0:n_rot:2] ** 2 + x[..., 1:n_rot:2] ** 2, rtol=1e-13)
    assert np.array_equal(got[0], x[0])
    lo, hi, fs, m = 2.0, 5.0, 0.25, 1.3

    def yarn(t, i):
        ramp = 1.0 - min(1.0, max(0.0, (i - lo) / (hi - lo)))
        return fs * plain(t, i) * (1 - ramp) + plain(t, i) * ramp

    got = refmodel.rope_norm(x, pos, base, n_rot, (fs, 1.0, lo, hi, m))
    assert np.max(np.abs(got - by_hand(yarn, m))) < 1e-13
    # ext_factor 0: interpolation only
    got = refmodel.rope_norm(x, pos, base, n_rot, (fs, 0.0, lo, hi, 1.0))
    assert np.max(np.abs(got - by_hand(lambda t, i: fs * plain(t, i), 1.0))) < 1e-13
    # no scaling from the metadata: plain rotation
    for kw in (dict(), dict(rope__scaling__type="none", rope__scaling__factor=4.0),
               dict(rope__scaling__type="yarn", rope__scaling__factor=1.0)):
        hp = refmodel.Hparams(_ds2_md(rope__freq_base=base, rope__dimension_count=n_rot,
                                      attention__key_length=64 + n_rot, **kw))
        got = refmodel.rope_norm(x, pos, hp.rope_base, hp.rope_dim, hp.rope_yarn)
        assert np.max(np.abs(got - by_hand(plain, 1.0))) < 1e-13


# a YaRN extension with every kind of pair at n_rot 8: corr dims 0 and 3
# (ramps 1, 2/3, 1/3, 0), V2-Lite's log multiplier and a non-unit attn_factor
DS2_YARN = dict(type="yarn", factor=4.0, original_context_length=64,
                yarn_log_multiplier=0.0707, attn_factor=1.25)
DS2_CASES = {
    # DeepSeek-V3-like: q_lora, sigmoid, selection bias, groups, norm, scale
    "v3": dict(weights=dict(q_lora=24, n_shared=1), form="mla", n_expert_used=3, n_group=4, topk_group=2,
               expert_scale=2.5, expert_norm=True, gating=2,
               rope_scaling=dict(type="yarn", factor=4.0, original_context_length=64,
                                 yarn_log_multiplier=0.1)),
    # V2-Lite-like: no q_lora, legacy attn_kv_b, softmax by default, no bias, two shared experts
    "v2lite": dict(weights=dict(q_lora=0, n_shared=2, probs_bias=False), form="legacy", n_expert_used=2,
                   expert_scale=None, expert_norm=None, gating=None, rope_scaling=DS2_YARN),
    # MLA form, no YaRN, softmax over groups with a bias
    "plain": dict(weights=dict(q_lora=24), form="mla", n_expert_used=2, n_group=2, topk_group=1,
                  expert_scale=1.5, expert_norm=True, gating=1),
}


def _ds2_case(tmp_path, name, seed, tag="", **over):
    kw = dict(DS2_CASES[name], **over)
    weights = gguf_write.tiny_deepseek2_weights(seed=seed, **kw.pop("weights"))
    return _ds2(tmp_path, weights, tag=name + tag, rope_base=100.0, **kw), weights


@pytest.mark.parametrize("case", sorted(DS2_CASES))
def test_deepseek2_forward_by_hand(tmp_path, case):
    """Whole forward pass (dense layer 0, MoE layer 1, NextN layer 2 not run)
    against plain numpy from the file, attention in the absorbed form."""
    m, (w, hp) = _ds2_case(tmp_path, case, seed=40)
    assert [m.layer(i).is_moe for i in range(m.hp.n_layer)] == [False, True]
    assert m.hp.mla == (DS2_CASES[case]["form"] == "mla")
    want, sel = _ds2_logits_by_hand(m.path, IDS)
    got = m.logits(IDS)
    assert np.std(got) > 0.1
    assert np.max(np.abs(got - want)) < 1e-10
    assert np.array_equal(m.last_routing, sel)
    if m.hp.n_group > 1:
        assert len(np.unique(sel)) > 1


@pytest.mark.parametrize("form", ["mla", "legacy"])
def test_deepseek2_attention_absorbed_equals_plain(tmp_path, form):
    """The absorbed and the plain form of the latent attention, both by hand,
    agree with each other and with the reference, with YaRN and q_lora."""
    m, (w, hp) = _ds2_case(tmp_path, "v3", seed=41, form=form, rope_scaling=DS2_YARN)
    md, F = _file(m.path)
    x = np.random.default_rng(7).standard_normal((9, hp["n_embd"]))
    a = _ds2_attention_by_hand(md, F, 1, x, absorbed=True)
    b = _ds2_attention_by_hand(md, F, 1, x, absorbed=False)
    got = m.attention(m.layer(1), x, np.arange(9))
    assert np.std(a) > 0.1
    assert np.max(np.abs(a - b)) < 1e-10
    assert np.max(np.abs(got - a)) < 1e-10


@pytest.mark.parametrize("yarn", [True, False], ids=["yarn", "no_yarn"])
@pytest.mark.parametrize("q_lora", [24, 0], ids=["q_lora", "no_q_lora"])
def test_deepseek2_mla_equals_legacy(tmp_path, q_lora, yarn):
    """attn_k_b / attn_v_b sliced from attn_kv_b give the legacy file's logits;
    the MLA file holds the slices in llama.cpp's converter's layout."""
    wts = gguf_write.tiny_deepseek2_weights(seed=42, q_lora=q_lora)
    w, hp = wts
    kw = dict(n_group=4, topk_group=2, rope_scaling=DS2_YARN if yarn else None)
    mla = _ds2(tmp_path, wts, tag="mla", form="mla", **kw)
    leg = _ds2(tmp_path, wts, tag="legacy", form="legacy", **kw)
    assert mla.hp.mla and not leg.hp.mla
    assert (mla.hp.rope_yarn is not None) == yarn
    g = gguf.load(mla.path)
    H, nope, hv, kvl = hp["n_head"], hp["qk_nope"], hp["head_dim_v"], hp["kv_lora"]
    assert "blk.0.attn_kv_b.weight" not in g.tensors
    kb, vb = g.tensors["blk.1.attn_k_b.weight"], g.tensors["blk.1.attn_v_b.weight"]
    assert kb.ne == (nope, kvl, H) and vb.ne == (kvl, hv, H)
    kvb = _f32(w["blk.1.attn_kv_b.weight"])
    for h in range(H):
        rows = kvb[h * (nope + hv):(h + 1) * (nope + hv)]
        assert np.array_equal(kb.view()[h].T, rows[:nope])
        assert np.array_equal(vb.view()[h], rows[nope:])
    md = g.metadata
    assert (md["deepseek2.attention.key_length"], md["deepseek2.attention.value_length"],
            md["deepseek2.attention.head_count_kv"]) == (kvl + hp["n_rot"], kvl, 1)
    a, b = mla.logits(IDS), leg.logits(IDS)
    assert np.std(a) > 0.1
    assert np.max(np.abs(a - b)) < 1e-12
    assert np.array_equal(mla.last_routing, leg.last_routing)


DS2_GROUP_ROWS = {
    # 8 experts in 4 groups of 2, the 2 best groups kept, 2 experts used
    (4, 2): [
        # group 0 has the best expert, groups 1 and 2 the best pairs
        ([5, -5, 3, 3, 2.5, 2.5, 0, 0], [2, 3], [0, 2]),
        # groups 0..2 tie: the lower ids are kept
        ([1, 1, 1, 1, 1, 1, 4, -9], [0, 1], [6, 0]),
        ([0.5, 0.5, 0.4, 0.4, 0.1, 0.1, 6, -6], [0, 1], [6, 0]),
        # expert 3 is the second best, but its group's pair (0.12 + 0.82) loses to group 2's (0.5 + 0.55)
        ([-1, 2, -2, 1.5, 0, 0.2, -3, -3], [1, 5], [1, 3]),
    ],
    # 8 experts in 2 groups of 4, the best group kept: the two best count, not all four
    (2, 1): [
        ([2, 2, -9, -9, 1.5, 1.5, 1.5, 1.5], [0, 1], [0, 1]),
        ([1.9, 1.9, -9, -9, 1.5, 1.5, 1.5, 2.6], [7, 4], [7, 0]),
    ],
}


@pytest.mark.parametrize("groups", sorted(DS2_GROUP_ROWS), ids=lambda g: "%dof%d" % (g[1], g[0]))
def test_deepseek2_grouped_topk(tmp_path, groups):
    """Router logits chosen per row so that the grouped choice differs from the
    global top-k: experts outside the kept groups are never chosen."""
    n_group, topk_group = groups
    w, hp = gguf_write.tiny_deepseek2_weights(seed=43, n_expert=8, probs_bias=False)
    router = np.zeros((8, hp["n_embd"]))
    router[:, :8] = np.eye(8)
    w["blk.1.ffn_gate_inp.weight"] = router
    m = _ds2(tmp_path, (w, hp), n_expert_used=2, n_group=n_group, topk_group=topk_group,
             expert_scale=1.0, expert_norm=True, gating=2)
    rows = DS2_GROUP_ROWS[groups]
    x = np.zeros((len(rows), hp["n_embd"]))
    x[:, :8] = [r[0] for r in rows]
    sel, wsel = m.route(m.layer(1), x)
    want = np.array([r[1] for r in rows])
    assert np.array_equal(sel, want)
    p = 1.0 / (1.0 + np.exp(-x[:, :8]))
    glob = np.argsort(-p, axis=1, kind="stable")[:, :2]
    assert np.array_equal(glob, np.array([r[2] for r in rows]))
    assert np.any(glob != want)
    pw = np.take_along_axis(p, want, axis=1)
    assert np.allclose(wsel, pw / pw.sum(axis=1, keepdims=True), rtol=1e-14, atol=0)
    # the same file with one group: the global top-k
    m1 = _ds2(tmp_path, (w, hp), tag="1", n_expert_used=2, expert_norm=True, gating=2)
    assert np.array_equal(m1.route(m1.layer(1), x)[0], glob)


def test_deepseek2_grouped_topk_random(tmp_path):
    """Random logits with a selection bias (it counts in the groups' scores too),
    16 experts in 4 groups, 2 kept, 3 used: against the by-hand router."""
    w, hp = gguf_write.tiny_deepseek2_weights(seed=44, n_expert=16)
    w["blk.1.exp_probs_b.bias"] = np.random.default_rng(8).standard_normal(16) * 0.3
    for gating in (1, 2):
        m = _ds2(tmp_path, (w, hp), tag=str(gating), n_expert_used=3, n_group=4, topk_group=2,
                 expert_scale=2.0, gating=gating)
        x = np.random.default_rng(9).standard_normal((40, hp["n_embd"]))
        sel, wsel = m.route(m.layer(1), x)
        md, F = _file(m.path)
        want_sel, want_w = _ds2_route_by_hand(md, x @ F["blk.1.ffn_gate_inp.weight"].T,
                                              F["blk.1.exp_probs_b.bias"])
        assert np.array_equal(sel, want_sel)
        assert np.max(np.abs(wsel - want_w)) < 1e-14
        # every chosen expert lies in one of two groups
        assert np.all([len(set(s // 4)) <= 2 for s in sel])
        # the groups matter for these rows
        md1 = {k: v for k, v in md.items() if not k.startswith(DS2_ARCH + "expert_group")}
        ungrouped, _ = _ds2_route_by_hand(md1, x @ F["blk.1.ffn_gate_inp.weight"].T,
                                          F["blk.1.exp_probs_b.bias"])
        assert np.any(ungrouped != sel)


def test_deepseek2_yarn_files(tmp_path):
    """No rope.scaling keys, type none and a yarn factor of 1 give the same
    logits; YaRN (factor 4) changes them, as by hand."""
    wts = gguf_write.tiny_deepseek2_weights(seed=45)
    base = _ds2(tmp_path, wts, tag="absent").logits(IDS)
    for tag, rs in (("none", dict(type="none")),
                    ("none_orig", dict(type="none", original_context_length=64)),
                    ("factor1", dict(type="yarn", factor=1.0, original_context_length=64))):
        m = _ds2(tmp_path, wts, tag=tag, rope_scaling=rs)
        assert m.hp.rope_yarn is None
        assert np.array_equal(m.logits(IDS), base), tag
    m = _ds2(tmp_path, wts, tag="yarn", rope_scaling=DS2_YARN, rope_base=100.0)
    assert m.hp.rope_yarn[2:4] == (0.0, 3.0)
    got = m.logits(IDS)
    want, _ = _ds2_logits_by_hand(m.path, IDS)
    assert np.max(np.abs(got - want)) < 1e-10
    plain = _ds2(tmp_path, wts, tag="plain100", rope_base=100.0).logits(IDS)
    assert np.max(np.abs(got - plain)) > 1e-3


def test_deepseek2_nextn_not_run(tmp_path):
    """New weights for the NextN layer change nothing; for the last layer run they do."""
    w, hp = gguf_write.tiny_deepseek2_weights(seed=46)
    rng = np.random.default_rng(10)

    def redraw(i):
        p = "blk.%d." % i
        return {k: (rng.standard_normal(v.shape) * 0.3 if k.startswith(p) else v) for k, v in w.items()}

    m = _ds2(tmp_path, (w, hp))
    assert (m.hp.block_count, m.hp.n_nextn, m.hp.n_layer) == (3, 1, 2)
    a = m.logits(IDS)
    b = _ds2(tmp_path, (redraw(2), hp), tag="nextn").logits(IDS)
    c = _ds2(tmp_path, (redraw(1), hp), tag="last").logits(IDS)
    assert np.array_equal(a, b)
    assert np.max(np.abs(a - c)) > 1e-3


@pytest.mark.parametrize("form", ["mla", "legacy"])
def test_deepseek2_lazy_equals_eager(tmp_path, form):
    eager, _ = _ds2_case(tmp_path, "v3", seed=47, form=form, rope_scaling=DS2_YARN)
    lazy = refmodel.Model(eager.path, lazy=True)
    assert lazy.lazy and not eager.lazy
    a = eager.head(eager.hidden(IDS), top=8, vchunk=16)
    b = lazy.head(lazy.hidden(IDS), top=8, vchunk=16)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert np.array_equal(eager.last_routing, lazy.last_routing)


def test_deepseek2_shapes_checked(tmp_path):
    """A kv_b of the wrong width is an error naming the tensor, not a wrong result."""
    w, hp = gguf_write.tiny_deepseek2_weights(seed=48)
    w["blk.0.attn_kv_b.weight"] = w["blk.0.attn_kv_b.weight"][:, :-1]
    with pytest.raises(ValueError, match="attn_k_b"):
        _ds2(tmp_path, (w, hp), form="mla")
    with pytest.raises(ValueError, match="attn_kv_b"):
        _ds2(tmp_path, (w, hp), form="legacy")


# ---------------------------------------------------------------- 6. gpt-oss
# As for deepseek2: plain numpy from the written file (MXFP4 blocks decoded by
# hand), one formula of build-dev/gptoss-spec.md at a time.

OAI = "gpt-oss."
# YaRN with every kind of pair at n_rot 16, base 100: corr dims 0 and 5
OAI_YARN = dict(type="yarn", factor=32.0, original_context_length=64)


def _oai(tmp_path, weights, tag="", rope_base=100.0, **kw):
    """Write weights (from tiny_gptoss_weights) as a gpt-oss file and load it."""
    w, hp = weights
    p = tmp_path / ("gptoss%s.gguf" % tag)
    gguf_write.write_gptoss(str(p), w, hp, rope_base=rope_base, **kw)
    return refmodel.Model(str(p))


def _oai_rope_by_hand(md):
    """The spec's RoPE from metadata: (theta(pos, i), m) with cos and sin times m."""
    n_rot, base = md[OAI + "rope.dimension_count"], md[OAI + "rope.freq_base"]
    F = md.get(OAI + "rope.scaling.factor", 1.0)

    def theta_e(pos, i):
        return pos * base ** (-2.0 * i / n_rot)

    if md.get(OAI + "rope.scaling.type", "none") != "yarn" or F <= 1.0:
        return theta_e, 1.0
    orig = md.get(OAI + "rope.scaling.original_context_length", md[OAI + "context_length"])

    def corr_dim(beta):
        return n_rot * math.log(orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    lo = max(0, math.floor(corr_dim(32.0)))
    hi = min(n_rot - 1, math.ceil(corr_dim(1.0)))

    def theta(pos, i):
        ramp = 1 - min(1.0, max(0.0, (i - lo) / max(0.001, hi - lo)))
        return theta_e(pos, i) / F * (1 - ramp) + theta_e(pos, i) * ramp

    # attn_factor (get_mscale(F, 1) / (1 + 0.1 ln F) times the key) times 1 + 0.1 ln F
    return theta, (1 + 0.1 * math.log(F)) * md.get(OAI + "rope.scaling.attn_factor", 1.0)


def _rope_halves(x, theta, m, n_rot):
    """x (T, H, D) at positions 0..T-1: pairs (i, i + n_rot/2) turned by
    theta(pos, i), cos and sin times m."""
    out = x.copy()
    half = n_rot // 2
    for t in range(x.shape[0]):
        for i in range(half):
            c, s = math.cos(theta(t, i)) * m, math.sin(theta(t, i)) * m
            x0, x1 = x[t, :, i], x[t, :, i + half]
            out[t, :, i] = x0 * c - x1 * s
            out[t, :, i + half] = x0 * s + x1 * c
    return out


def _oai_sliding(md, i):
    period = md.get(OAI + "attention.sliding_window_pattern", 2)
    return i % period < period - 1


def _oai_attention_by_hand(md, F, i, x, sinks=True):
    """Layer i's attention over rows x at positions 0..T-1, token by token."""
    p = "blk.%d." % i
    H, Hkv = md[OAI + "attention.head_count"], md[OAI + "attention.head_count_kv"]
    D = md[OAI + "attention.key_length"]
    n_swa = md[OAI + "attention.sliding_window"]
    sliding = _oai_sliding(md, i)
    T = x.shape[0]
    q = (x @ F[p + "attn_q.weight"].T + F[p + "attn_q.bias"]).reshape(T, H, D)
    k = (x @ F[p + "attn_k.weight"].T + F[p + "attn_k.bias"]).reshape(T, Hkv, D)
    v = (x @ F[p + "attn_v.weight"].T + F[p + "attn_v.bias"]).reshape(T, Hkv, D)
    theta, m = _oai_rope_by_hand(md)
    q, k = _rope_halves(q, theta, m, D), _rope_halves(k, theta, m, D)
    sink = F[p + "attn_sinks.weight"]
    out = np.zeros((T, H, D))
    for h in range(H):
        kv = h // (H // Hkv)
        for t in range(T):
            seen = [u for u in range(t + 1) if not sliding or t - n_swa < u]
            s = np.array([q[t, h] @ k[u, kv] for u in seen]) / math.sqrt(D)
            M = max(s.max(), sink[h]) if sinks else s.max()
            e = np.exp(s - M)
            den = e.sum() + (math.exp(sink[h] - M) if sinks else 0.0)
            for j, u in enumerate(seen):
                out[t, h] += e[j] / den * v[u, kv]
    return out.reshape(T, H * D) @ F[p + "attn_output.weight"].T + F[p + "attn_output.bias"]


def _oai_route_by_hand(md, lg):
    """Chosen experts and weights of router logits lg (T, n) (the bias added), row by row."""
    k = md[OAI + "expert_used_count"]
    scale = 1.0  # expert_weights_scale is not read for gpt-oss (as llama.cpp)
    sel_all, w_all = [], []
    for row in lg:
        chosen = sorted(range(len(row)), key=lambda e: (-row[e], e))[:k]
        z = np.exp(row[chosen] - row[chosen].max())
        sel_all.append(chosen)
        w_all.append(z / z.sum() * scale)
    return np.array(sel_all), np.array(w_all)


def _swiglu_oai_by_hand(g, u, clamp=True):
    if clamp:
        g = np.minimum(g, 7.0)
        u = np.maximum(np.minimum(u, 7.0), -7.0)
    return g / (1.0 + np.exp(-1.702 * g)) * (u + 1.0)


def _oai_moe_by_hand(md, F, i, x, stats=None, clamp=True):
    p = "blk.%d." % i
    sel, w = _oai_route_by_hand(md, x @ F[p + "ffn_gate_inp.weight"].T + F[p + "ffn_gate_inp.bias"])
    out = np.zeros_like(x)
    for t in range(len(x)):
        for e, we in zip(sel[t], w[t]):
            g = F[p + "ffn_gate_exps.weight"][e] @ x[t] + F[p + "ffn_gate_exps.bias"][e]
            u = F[p + "ffn_up_exps.weight"][e] @ x[t] + F[p + "ffn_up_exps.bias"][e]
            if stats is not None:
                stats["g"] = stats.get("g", 0) + int(np.sum(g > 7))
                stats["u"] = stats.get("u", 0) + int(np.sum(np.abs(u) > 7))
            y = F[p + "ffn_down_exps.weight"][e] @ _swiglu_oai_by_hand(g, u, clamp) \
                + F[p + "ffn_down_exps.bias"][e]
            out[t] += we * y
    return out, sel


def _oai_logits_by_hand(path, ids, stats=None):
    md, F = _file(path)
    eps = md[OAI + "attention.layer_norm_rms_epsilon"]
    x = F["token_embd.weight"][ids]
    sel = None
    for i in range(md[OAI + "block_count"]):
        p = "blk.%d." % i
        x = x + _oai_attention_by_hand(md, F, i, _norm(x, F[p + "attn_norm.weight"], eps))
        y, sel = _oai_moe_by_hand(md, F, i, _norm(x, F[p + "post_attention_norm.weight"], eps), stats)
        x = x + y
    return _norm(x, F["output_norm.weight"], eps) @ F["output.weight"].T, sel


OAI_MD = {
    "general.architecture": "gpt-oss", "gpt-oss.block_count": 24, "gpt-oss.context_length": 131072,
    "gpt-oss.embedding_length": 2880, "gpt-oss.feed_forward_length": 2880,
    "gpt-oss.attention.head_count": 64, "gpt-oss.attention.head_count_kv": 8,
    "gpt-oss.attention.key_length": 64, "gpt-oss.attention.value_length": 64,
    "gpt-oss.rope.dimension_count": 64, "gpt-oss.rope.freq_base": 150000.0,
    "gpt-oss.attention.layer_norm_rms_epsilon": 1e-5, "gpt-oss.expert_count": 32,
    "gpt-oss.expert_used_count": 4, "gpt-oss.expert_feed_forward_length": 2880,
    "gpt-oss.attention.sliding_window": 128, "gpt-oss.rope.scaling.type": "yarn",
    "gpt-oss.rope.scaling.factor": 32.0, "gpt-oss.rope.scaling.original_context_length": 4096,
}


def _oai_md(**kw):
    md = dict(OAI_MD)
    for k, v in kw.items():
        k = OAI + k.replace("__", ".")
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    return md


def test_gptoss_hparams():
    """gpt-oss-20b's keys: the defaults, the YaRN factors and the refusals."""
    hp = refmodel.Hparams(OAI_MD)
    assert (hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dim) == (24, 64, 8, 64, 64)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_expert_shared) == (32, 4, 2880, 0)
    assert (hp.n_swa, hp.swa_period, hp.n_layer_dense_lead) == (128, 2, 0)
    assert hp.expert_gating == "softmax_weight" and hp.expert_act == "swiglu_oai"
    assert hp.expert_weights_scale == 1.0 and hp.expert_weights_norm is False
    assert [hp.swa_layer(i) for i in range(4)] == [True, False, True, False]
    # corr_dim(b) = 64 ln(4096 / (2 pi b)) / (2 ln 150000): 8.09 for b = 32, 17.4 for b = 1
    lo = 64 * math.log(4096 / (2 * math.pi * 32)) / (2 * math.log(150000))
    hi = 64 * math.log(4096 / (2 * math.pi)) / (2 * math.log(150000))
    assert (math.floor(lo), math.ceil(hi)) == (8, 18)
    fs, ext, got_lo, got_hi, m = hp.rope_yarn
    assert (fs, ext, got_lo, got_hi) == (1.0 / 32, 1.0, 8.0, 18.0)
    assert m == pytest.approx(1.0 + 0.1 * math.log(32.0), rel=1e-14)
    # rope.scaling.attn_factor multiplies cos and sin; no scaling without yarn
    hp = refmodel.Hparams(_oai_md(rope__scaling__attn_factor=1.25))
    assert hp.rope_yarn[4] == pytest.approx(1.25 * (1.0 + 0.1 * math.log(32.0)), rel=1e-14)
    for kw in (dict(rope__scaling__type=None), dict(rope__scaling__type="none"),
               dict(rope__scaling__factor=1.0)):
        assert refmodel.Hparams(_oai_md(**kw)).rope_yarn is None
    # expert_weights_scale is not read (llama.cpp's gpt-oss graph never scales); the
    # period's key is
    assert refmodel.Hparams(_oai_md(expert_weights_scale=0.0)).expert_weights_scale == 1.0
    assert refmodel.Hparams(_oai_md(expert_weights_scale=2.5)).expert_weights_scale == 1.0
    assert refmodel.Hparams(_oai_md(attention__sliding_window_pattern=3)).swa_period == 3
    # a gating key changes nothing: SOFTMAX_WEIGHT is the architecture's
    assert refmodel.Hparams(_oai_md(expert_gating_func=2)).expert_gating == "softmax_weight"
    assert refmodel.Hparams(_oai_md(rope__freq_base_swa=150000.0)).rope_base == 150000.0
    for bad in (dict(attention__sliding_window=None),
                dict(attention__sliding_window=0),
                dict(attention__sliding_window_pattern=0),
                dict(expert_feed_forward_length=None),
                dict(expert_used_count=33),
                dict(rope__dimension_count=32),                 # part of a head rotated
                dict(attention__value_length=32),
                dict(rope__scaling__type="linear"),
                dict(rope__scaling__yarn_log_multiplier=0.1),   # not gpt-oss's
                dict(rope__freq_base_swa=10000.0)):             # sliding layers' own base
        with pytest.raises(ValueError):
            refmodel.Hparams(_oai_md(**bad))


def test_mxfp4_encoder():
    """gguf_write's MXFP4 blocks: ggml's layout and exponent, nearest rounding,
    decoded back by dq_mxfp4 and by hand to the values the encoder reports."""
    # representable values with max |x| 6 x 2^-3: e = 127 - 3, exact
    k = -3
    vals = np.array([6, -6, 0.5, -0.5, 1, 1.5, 2, 3, 4, -4, 0, -1.5] + [0.0] * 20) * 2.0 ** k
    raw, got = gguf_write.mxfp4_encode(vals)
    b = np.frombuffer(raw, dtype=np.uint8)
    assert b.size == 17 and b[0] == 127 + k
    assert np.array_equal(got, vals)
    # element j: byte 1 + j's low nibble, element j + 16: its high nibble
    v2 = np.zeros(32)
    v2[0], v2[16], v2[15], v2[31] = 1.0, -6.0, 3.0, 0.5
    b2 = np.frombuffer(gguf_write.mxfp4_encode(v2)[0], dtype=np.uint8)
    assert b2[0] == 127 and b2[1] == 0x2 | (0xF << 4) and b2[16] == 0x5 | (0x1 << 4)
    # nearest, ties to the lower code, beyond 6 x scale clipped; all-zero block e 0
    x = np.zeros(64)
    x[:8] = [6.0, 0.7, 1.25, 5.0, -1.25, 2.4, -0.2, 0.3]
    x[32:34] = [7.5, -7.9]
    raw, got = gguf_write.mxfp4_encode(x)
    assert np.array_equal(got[:8], [6.0, 0.5, 1.0, 4.0, -1.0, 2.0, 0.0, 0.5])
    assert np.array_equal(got[32:34], [6.0, -6.0]) and np.all(got[8:32] == 0)
    raw0, got0 = gguf_write.mxfp4_encode(np.zeros(32))
    assert raw0 == bytes(17) and np.array_equal(got0, np.zeros(32))
    # random rows of very different magnitudes: round trip and relative error
    rng = np.random.default_rng(60)
    x = rng.standard_normal((6, 96)) * np.array([1e-4, 1e-2, 1, 10, 300, 2e4])[:, None]
    raw, got = gguf_write.mxfp4_encode(x)
    blocks = np.frombuffer(raw, dtype=np.uint8)
    assert blocks.size == 6 * 3 * 17
    assert np.array_equal(dequant.dequantize_raw(blocks, "mxfp4").reshape(x.shape), got)
    assert np.array_equal(_mxfp4_by_hand(blocks, x.shape), got)
    amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
    assert np.all(np.abs(got - x).reshape(-1, 32) <= amax * 0.25)
    assert np.any(got != x)
    # what the blocks hold is written again unchanged
    assert gguf_write.mxfp4_encode(got)[0] == raw
    assert np.array_equal(gguf_write.mxfp4_round(x), got)
    with pytest.raises(ValueError):
        gguf_write.mxfp4_encode(np.zeros((2, 48)))


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_gptoss_forward_by_hand(tmp_path, experts):
    """Whole forward pass (layer 0 sliding, layer 1 full, window 4, 12
    positions, YaRN) against plain numpy from the file; the swiglu_oai clamps act."""
    w, hp = gguf_write.tiny_gptoss_weights(seed=50)
    m = _oai(tmp_path, (w, hp), experts_type=experts, rope_scaling=OAI_YARN)
    assert [m.layer(i).swa for i in range(m.hp.n_layer)] == [True, False]
    assert m.hp.n_swa == 4 and len(IDS) == 12
    assert m.hp.rope_yarn[2:4] == (0.0, 5.0)
    stats = {}
    want, sel = _oai_logits_by_hand(m.path, IDS, stats)
    got = m.logits(IDS)
    assert np.std(got) > 0.1
    assert np.max(np.abs(got - want)) < 1e-10
    assert np.array_equal(m.last_routing, sel)
    assert len(np.unique(sel)) > 1
    assert stats["g"] > 0 and stats["u"] > 0, stats
    g = gguf.load(m.path)
    for i in range(hp["n_layer"]):
        for n in gguf_write.GPTOSS_EXPERT_TENSORS:
            t = g.tensors["blk.%d.%s" % (i, n)]
            assert t.type_name == experts
            if experts == "MXFP4":
                # the file holds the weights as the encoder rounds them
                held = _mxfp4_by_hand(t.raw, t.shape)
                assert np.array_equal(held, gguf_write.mxfp4_round(w["blk.%d.%s" % (i, n)]))
                assert np.max(np.abs(held - w["blk.%d.%s" % (i, n)])) > 1e-3
    assert g.tensors["blk.0.ffn_gate_exps.bias"].type_name == "F32"


def test_gptoss_window(tmp_path):
    """Window 4 over 12 positions: the first 4 positions see what a full layer
    sees, the later ones less; a window as long as the prompt, or a period of 1
    (no sliding layer), is full attention."""
    wts = gguf_write.tiny_gptoss_weights(seed=51)
    a = _oai(tmp_path, wts, tag="4", n_swa=4).logits(IDS)
    full = _oai(tmp_path, wts, tag="12", n_swa=12).logits(IDS)
    none = _oai(tmp_path, wts, tag="p1", n_swa=4, swa_period=1).logits(IDS)
    assert np.array_equal(full, none)
    assert np.max(np.abs(a[:4] - full[:4])) < 1e-12
    assert np.min(np.max(np.abs(a[4:] - full[4:]), axis=1)) > 1e-3
    # the sliding layer's attention alone, by hand, at windows 1 and 5
    md, F = _file(_oai(tmp_path, wts, tag="1", n_swa=1).path)
    x = np.random.default_rng(11).standard_normal((9, wts[1]["n_embd"]))
    for n_swa in (1, 5):
        m = _oai(tmp_path, wts, tag="w%d" % n_swa, n_swa=n_swa)
        md[OAI + "attention.sliding_window"] = n_swa
        got = m.attention(m.layer(0), x, np.arange(9))
        want = _oai_attention_by_hand(md, F, 0, x)
        assert np.max(np.abs(got - want)) < 1e-12
    # 300 rows: the windows of the second block of query rows reach into the first
    x = np.random.default_rng(15).standard_normal((300, wts[1]["n_embd"]))
    got = m.attention(m.layer(0), x, np.arange(300))
    assert np.max(np.abs(got - _oai_attention_by_hand(md, F, 0, x))) < 1e-12


def test_gptoss_sinks(tmp_path):
    """A huge negative sink is attention without sinks; a huge positive one
    takes all the weight, so the heads give 0 and the layer its output bias;
    with zero scores a sink s leaves each of n keys 1 / (n + e^s) (unscaled)."""
    w, hp = gguf_write.tiny_gptoss_weights(seed=52)
    H, E = hp["n_head"], hp["n_embd"]
    x = np.random.default_rng(12).standard_normal((9, E))
    pos = np.arange(9)
    for i in range(hp["n_layer"]):
        w["blk.%d.attn_sinks.weight" % i] = np.full(H, -1e4)
    m = _oai(tmp_path, (w, hp), tag="neg")
    md, F = _file(m.path)
    for i in range(hp["n_layer"]):  # sliding, then full
        L = m.layer(i)
        got = m.attention(L, x, pos)
        want = _oai_attention_by_hand(md, F, i, x, sinks=False)
        assert np.std(want) > 0.1
        assert np.max(np.abs(got - want)) < 1e-12
        L.sinks = None
        assert np.array_equal(m.attention(L, x, pos), got)
    for i in range(hp["n_layer"]):
        w["blk.%d.attn_sinks.weight" % i] = np.full(H, 1e4)
    m = _oai(tmp_path, (w, hp), tag="pos")
    for i in range(hp["n_layer"]):
        got = m.attention(m.layer(i), x, pos)
        bo = _f32(w["blk.%d.attn_output.bias" % i])
        assert np.max(np.abs(got - bo[None, :])) < 1e-12
    # one head of each kind, two ordinary ones: by hand
    for i in range(hp["n_layer"]):
        w["blk.%d.attn_sinks.weight" % i] = np.array([1e4, -1e4, 0.5, 2.0])
    m = _oai(tmp_path, (w, hp), tag="mixed")
    md, F = _file(m.path)
    for i in range(hp["n_layer"]):
        got = m.attention(m.layer(i), x, pos)
        assert np.max(np.abs(got - _oai_attention_by_hand(md, F, i, x))) < 1e-12
        assert np.max(np.abs(got - _oai_attention_by_hand(md, F, i, x, sinks=False))) > 1e-3
    # zero scores: every visible key weighs 1 / (n + e^s), v is its bias
    s = np.array([math.log(3.0), 0.0, -1.0, 2.5])
    for i in range(hp["n_layer"]):
        p = "blk.%d." % i
        for n in ("attn_q", "attn_k", "attn_v"):
            w[p + n + ".weight"] = np.zeros_like(w[p + n + ".weight"])
        w[p + "attn_q.bias"] = np.zeros_like(w[p + "attn_q.bias"])
        w[p + "attn_k.bias"] = np.zeros_like(w[p + "attn_k.bias"])
        w[p + "attn_sinks.weight"] = s
    m = _oai(tmp_path, (w, hp), tag="flat", n_swa=4)
    D = hp["head_dim"]
    es = np.exp(_f32(s))
    for i in range(hp["n_layer"]):
        p = "blk.%d." % i
        got = m.attention(m.layer(i), x, pos)
        bv = _f32(w[p + "attn_v.bias"]).reshape(hp["n_head_kv"], D)
        for t in range(9):
            n = min(t + 1, 4) if i == 0 else t + 1
            heads = np.concatenate([n / (n + es[h]) * bv[h // (H // hp["n_head_kv"])] for h in range(H)])
            want = _f32(w[p + "attn_output.weight"]) @ heads + _f32(w[p + "attn_output.bias"])
            assert np.max(np.abs(got[t] - want)) < 1e-12


def test_gptoss_swiglu_oai_clamps(tmp_path):
    """swiglu_oai: the gate clamped above at 7 only, up to [-7, 7]; in the
    experts too (MoE inputs large enough to pass the limits)."""
    vals = [-1e6, -50.0, -8.0, -7.0, -1.0, 0.0, 0.5, 6.9, 7.0, 7.5, 50.0, 1e6]
    G, U = np.meshgrid(vals, vals, indexing="ij")
    got = refmodel.swiglu_oai(G, U)
    for a, g in enumerate(vals):
        for b, u in enumerate(vals):
            gc, uc = min(g, 7.0), max(min(u, 7.0), -7.0)
            want = 0.0 if gc < -700 else gc / (1.0 + math.exp(-1.702 * gc)) * (uc + 1.0)
            assert got[a, b] == pytest.approx(want, rel=1e-14, abs=1e-300), (g, u)
    i7, i75, i50 = vals.index(7.0), vals.index(7.5), vals.index(50.0)
    im8, im7 = vals.index(-8.0), vals.index(-7.0)
    assert np.array_equal(got[i75], got[i7]) and np.array_equal(got[i50], got[i7])
    assert np.array_equal(got[:, i75], got[:, i7]) and np.array_equal(got[:, im8], got[:, im7])
    live = np.array(vals) != -1.0  # up + 1 == 0 zeroes both
    assert np.all(got[im8][live] != got[im7][live])  # no clamp below for the gate
    assert np.all(got[:, vals.index(-1.0)] == 0.0)  # up + 1 == 0
    # the experts: rows scaled so that gate and up pass 7 often
    w, hp = gguf_write.tiny_gptoss_weights(seed=53)
    m = _oai(tmp_path, (w, hp))
    md, F = _file(m.path)
    x = np.random.default_rng(13).standard_normal((7, hp["n_embd"])) * 3.0
    stats = {}
    want, sel = _oai_moe_by_hand(md, F, 1, x, stats)
    got = m.moe(m.layer(1), x)
    assert stats["g"] > 10 and stats["u"] > 10, stats
    assert np.max(np.abs(got - want)) < 1e-10
    assert np.array_equal(m.last_routing, sel)
    unclamped, _ = _oai_moe_by_hand(md, F, 1, x, clamp=False)
    assert np.max(np.abs(got - unclamped)) > 1e-2


def test_gptoss_routing(tmp_path):
    """SOFTMAX_WEIGHT: the top k of the router's logits plus its bias (ties:
    lower id), weighted by the softmax over those k (summing to 1, whatever
    expert_weights_scale says); the bias moves the choice and the weights."""
    w, hp = gguf_write.tiny_gptoss_weights(seed=54, n_expert=8)
    router = np.zeros((8, hp["n_embd"]))
    router[:, :8] = np.eye(8)
    w["blk.1.ffn_gate_inp.weight"] = router
    w["blk.1.ffn_gate_inp.bias"] = np.zeros(8)
    rows = [([3, 1, 2, 0, -1, -2, 0.5, 0], [0, 2]),
            ([1, 1, 1, 1, 1, 1, 1, 1], [0, 1]),
            ([-5, -9, -7, -6, -8, -5.5, -9, -9], [0, 5]),
            ([0, 0, 0, 0.25, 0, 0, 0, 0.25], [3, 7])]
    x = np.zeros((len(rows), hp["n_embd"]))
    x[:, :8] = [r[0] for r in rows]
    m = _oai(tmp_path, (w, hp), n_expert_used=2)
    sel, wsel = m.route(m.layer(1), x)
    assert np.array_equal(sel, [r[1] for r in rows])
    lg = x[:, :8]
    for t, (logits, chosen) in enumerate(rows):
        z = np.exp([logits[e] for e in chosen])
        assert np.allclose(wsel[t], z / z.sum(), rtol=1e-14, atol=0)
    assert np.allclose(wsel.sum(axis=1), 1.0, rtol=0, atol=1e-15)
    # not the softmax over all experts
    pall = np.exp(lg) / np.exp(lg).sum(axis=1, keepdims=True)
    assert np.max(np.abs(wsel - np.take_along_axis(pall, sel, axis=1))) > 0.1
    # the router bias: expert 5 first in every row, its weight from the biased logit
    w["blk.1.ffn_gate_inp.bias"] = np.array([0, 0, 0, 0, 0, 10.0, 0, 0])
    mb = _oai(tmp_path, (w, hp), tag="bias", n_expert_used=2)
    selb, wb = mb.route(mb.layer(1), x)
    assert np.all(selb[:, 0] == 5) and np.any(selb != sel)
    lb = lg + w["blk.1.ffn_gate_inp.bias"]
    want_sel, want_w = _oai_route_by_hand({OAI + "expert_used_count": 2}, lb)
    assert np.array_equal(selb, want_sel)
    assert np.allclose(wb, want_w, rtol=1e-14, atol=0)
    assert np.all(wb[:, 0] > 0.99)
    # k = 3: the weights sum to 1 with expert_weights_scale 2.5 or 0 (the key is not read)
    for scale, total in ((2.5, 1.0), (0.0, 1.0)):
        ms = _oai(tmp_path, (w, hp), tag="s%g" % scale, n_expert_used=3, expert_scale=scale)
        s3, w3 = ms.route(ms.layer(1), x)
        assert s3.shape == (len(rows), 3)
        assert np.allclose(w3.sum(axis=1), total, rtol=1e-14, atol=0)
    # random rows with the random bias, against the by-hand router
    w2, hp2 = gguf_write.tiny_gptoss_weights(seed=55, n_expert=8)
    m2 = _oai(tmp_path, (w2, hp2), tag="rand", n_expert_used=3)
    xr = np.random.default_rng(14).standard_normal((40, hp2["n_embd"]))
    md, F = _file(m2.path)
    s_got, w_got = m2.route(m2.layer(0), xr)
    lg = xr @ F["blk.0.ffn_gate_inp.weight"].T + F["blk.0.ffn_gate_inp.bias"]
    s_want, w_want = _oai_route_by_hand(md, lg)
    assert np.array_equal(s_got, s_want)
    assert np.max(np.abs(w_got - w_want)) < 1e-14
    unbiased = np.argsort(-(xr @ F["blk.0.ffn_gate_inp.weight"].T), axis=1, kind="stable")[:, :3]
    assert np.any(unbiased != s_got)


@pytest.mark.parametrize("period,want", [(None, [1, 0, 1, 0]), (2, [1, 0, 1, 0]), (3, [1, 1, 0, 1]),
                                         (4, [1, 1, 1, 0]), (1, [0, 0, 0, 0])],
                         ids=["absent", "2", "3", "4", "1"])
def test_gptoss_sliding_pattern(tmp_path, period, want):
    """Layer i slides when i % period < period - 1, the period from
    attention.sliding_window_pattern (2 when absent); the forward pass by hand."""
    wts = gguf_write.tiny_gptoss_weights(seed=56, n_layer=4)
    m = _oai(tmp_path, wts, swa_period=period, n_swa=3)
    assert m.hp.swa_period == (period or 2)
    assert [int(m.layer(i).swa) for i in range(4)] == want
    got = m.logits(IDS)
    ref, _ = _oai_logits_by_hand(m.path, IDS)
    assert np.max(np.abs(got - ref)) < 1e-10
    if period == 2:
        assert np.array_equal(got, _oai(tmp_path, wts, tag="absent", n_swa=3).logits(IDS))


def test_gptoss_shapes_checked(tmp_path):
    """Wrong or missing tensors are errors naming them, not wrong results."""
    w, hp = gguf_write.tiny_gptoss_weights(seed=57)
    for name, arr in (("blk.1.attn_sinks.weight", np.zeros(3)),
                      ("blk.0.ffn_gate_inp.bias", np.zeros(5)),
                      ("blk.1.ffn_down_exps.bias", np.zeros((4, 31))),
                      ("blk.0.attn_output.bias", np.zeros(33))):
        bad = dict(w)
        bad[name] = arr
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            _oai(tmp_path, (bad, hp), tag="bad").layer(int(name[4]))
    for name in ("blk.0.attn_sinks.weight", "blk.1.ffn_up_exps.bias", "output.weight"):
        bad = {k: v for k, v in w.items() if k != name}
        with pytest.raises(KeyError, match=name.replace(".", r"\.")):
            _oai(tmp_path, (bad, hp), tag="missing").layer(0)


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_gptoss_lazy_equals_eager(tmp_path, experts):
    eager = _oai(tmp_path, gguf_write.tiny_gptoss_weights(seed=58), experts_type=experts,
                 rope_scaling=OAI_YARN)
    lazy = refmodel.Model(eager.path, lazy=True)
    assert lazy.lazy and not eager.lazy
    a = eager.head(eager.hidden(IDS), top=8, vchunk=16)
    b = lazy.head(lazy.hidden(IDS), top=8, vchunk=16)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert np.array_equal(eager.last_routing, lazy.last_routing)


# ---------------------------------------------------------------- 7. qwen3next / qwen35moe
# The expected values below are computed from the written file with plain
# numpy and Python loops, position by position and head by head, one formula
# of docs/models.md at a time, not with model.py's helpers.

def _q3n(tmp_path, weights, arch="qwen3next", tag="", **kw):
    """Write weights (from tiny_qwen3next_weights) as an `arch` file and load it."""
    w, hp = weights
    p = tmp_path / ("%s%s.gguf" % (arch, tag))
    gguf_write.write_qwen3next(str(p), w, hp, arch=arch, **kw)
    return refmodel.Model(str(p))


def _q3n_weights(seed, **kw):
    """Tiny weights with Hv = 2 Hk, so the two architectures' head maps differ."""
    kw.setdefault("n_k_heads", 2)
    kw.setdefault("n_v_heads", 4)
    return gguf_write.tiny_qwen3next_weights(seed=seed, **kw)


def _q3n_kinds_by_hand(md, a, n):
    """Whether each of the n run layers is a DeltaNet layer."""
    flags = md.get(a + "attention.recurrent_layers")
    if flags is not None:
        return [bool(f) for f in flags[:n]]
    every = md.get(a + "full_attention_interval", 4)
    return [(l + 1) % every != 0 for l in range(n)]


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _deltanet_by_hand(md, a, F, i, x):
    """Layer i's gated DeltaNet over rows x at positions 0..T-1."""
    p = "blk.%d." % i
    K, S = md[a + "ssm.conv_kernel"], md[a + "ssm.state_size"]
    Hk, Hv = md[a + "ssm.group_count"], md[a + "ssm.time_step_rank"]
    eps = md[a + "attention.layer_norm_rms_epsilon"]
    r = Hv // Hk
    T = x.shape[0]
    qkv = x @ F[p + "attn_qkv.weight"].T
    z = x @ F[p + "attn_gate.weight"].T
    b = np.zeros((T, Hv))
    al = np.zeros((T, Hv))
    if a == "qwen3next.":
        ba = x @ F[p + "ssm_ba.weight"].T
        for t in range(T):
            for j in range(Hv):
                kh, ii = j // r, j % r
                b[t, j] = ba[t, 2 * r * kh + ii]
                al[t, j] = ba[t, 2 * r * kh + r + ii]
    else:
        b = x @ F[p + "ssm_beta.weight"].T
        al = x @ F[p + "ssm_alpha.weight"].T
    w = F[p + "ssm_conv1d.weight"]
    C = qkv.shape[1]
    u = np.zeros((T, C))
    for t in range(T):
        for c in range(C):
            s = 0.0
            for j in range(K):
                if t - K + 1 + j >= 0:
                    s += w[c, j] * qkv[t - K + 1 + j, c]
            u[t, c] = s / (1.0 + math.exp(-s))
    y = np.zeros((T, S * Hv))
    for j in range(Hv):
        kh = j % Hk if a == "qwen35moe." else j // r
        M = np.zeros((S, S))
        for t in range(T):
            q = u[t, kh * S:(kh + 1) * S]
            k = u[t, S * Hk + kh * S:S * Hk + (kh + 1) * S]
            v = u[t, 2 * S * Hk + j * S:2 * S * Hk + (j + 1) * S]
            q = q / max(math.sqrt(q @ q), eps) / math.sqrt(S)
            k = k / max(math.sqrt(k @ k), eps)
            beta = _sig(b[t, j])
            sp = al[t, j] + F[p + "ssm_dt.bias"][j]
            sp = sp if sp > 20 else math.log(1.0 + math.exp(sp))
            M = math.exp(sp * F[p + "ssm_a"][j]) * M
            d = [beta * (v[jj] - sum(M[ii, jj] * k[ii] for ii in range(S))) for jj in range(S)]
            for ii in range(S):
                for jj in range(S):
                    M[ii, jj] += k[ii] * d[jj]
            o = np.array([sum(M[ii, jj] * q[ii] for ii in range(S)) for jj in range(S)])
            zh = z[t, j * S:(j + 1) * S]
            y[t, j * S:(j + 1) * S] = _norm(o, F[p + "ssm_norm.weight"], eps) * zh / (1.0 + np.exp(-zh))
    return y @ F[p + "ssm_out.weight"].T


def _gated_attention_by_hand(md, a, F, i, x):
    """Layer i's gated full attention over rows x at positions 0..T-1."""
    p = "blk.%d." % i
    H, Hkv = md[a + "attention.head_count"], md[a + "attention.head_count_kv"]
    D, n_rot = md[a + "attention.key_length"], md[a + "rope.dimension_count"]
    eps = md[a + "attention.layer_norm_rms_epsilon"]
    T = x.shape[0]
    qg = (x @ F[p + "attn_q.weight"].T).reshape(T, H, 2 * D)
    q, gate = qg[:, :, :D], qg[:, :, D:]
    k = (x @ F[p + "attn_k.weight"].T).reshape(T, Hkv, D)
    v = (x @ F[p + "attn_v.weight"].T).reshape(T, Hkv, D)
    q = _norm(q, F[p + "attn_q_norm.weight"], eps)
    k = _norm(k, F[p + "attn_k_norm.weight"], eps)
    base = md[a + "rope.freq_base"]
    q, k = _rope_pairs(q, base, n_rot), _rope_pairs(k, base, n_rot)
    out = np.zeros((T, H, D))
    for h in range(H):
        kv = h // (H // Hkv)
        for t in range(T):
            s = np.array([q[t, h] @ k[u, kv] for u in range(t + 1)]) / math.sqrt(D)
            e = np.exp(s - s.max())
            for u in range(t + 1):
                out[t, h] += e[u] / e.sum() * v[u, kv]
            out[t, h] *= 1.0 / (1.0 + np.exp(-gate[t, h]))
    return out.reshape(T, H * D) @ F[p + "attn_output.weight"].T


def _q3n_moe_by_hand(md, a, F, i, x):
    """Layer i's routed experts and gated shared expert, token by token."""
    p = "blk.%d." % i
    k = md[a + "expert_used_count"]
    scale = 1.0  # expert_weights_scale is not read for the hybrids (as llama.cpp)
    out = np.zeros_like(x)
    sel = []
    for t in range(len(x)):
        lg = F[p + "ffn_gate_inp.weight"] @ x[t]
        pr = np.exp(lg - lg.max())
        pr /= pr.sum()
        chosen = sorted(range(len(pr)), key=lambda e: (-pr[e], e))[:k]
        total = sum(pr[e] for e in chosen)
        for e in chosen:
            y = _swiglu(x[t:t + 1], F[p + "ffn_gate_exps.weight"][e], F[p + "ffn_up_exps.weight"][e],
                        F[p + "ffn_down_exps.weight"][e])[0]
            out[t] += pr[e] / total * scale * y
        sh = _swiglu(x[t:t + 1], F[p + "ffn_gate_shexp.weight"], F[p + "ffn_up_shexp.weight"],
                     F[p + "ffn_down_shexp.weight"])[0]
        out[t] += _sig(F[p + "ffn_gate_inp_shexp.weight"] @ x[t]) * sh
        sel.append(chosen)
    return out, np.array(sel)


def _q3n_logits_by_hand(path, ids):
    md, F = _file(path)
    arch = md["general.architecture"]
    a = arch + "."
    eps = md[a + "attention.layer_norm_rms_epsilon"]
    n = md[a + "block_count"] - (md.get(a + "nextn_predict_layers", 0) if arch == "qwen35moe" else 0)
    kinds = _q3n_kinds_by_hand(md, a, n)
    x = F["token_embd.weight"][ids]
    sel = None
    for i in range(n):
        p = "blk.%d." % i
        h = _norm(x, F[p + "attn_norm.weight"], eps)
        x = x + (_deltanet_by_hand(md, a, F, i, h) if kinds[i] else _gated_attention_by_hand(md, a, F, i, h))
        y, sel = _q3n_moe_by_hand(md, a, F, i, _norm(x, F[p + "post_attention_norm.weight"], eps))
        x = x + y
    out = F.get("output.weight", F["token_embd.weight"])
    return _norm(x, F["output_norm.weight"], eps) @ out.T, sel, kinds


# Qwen3-Next-80B-A3B's keys; Qwen3.5's add nextn_predict_layers and the sections
Q3N_MD = {
    "general.architecture": "qwen3next", "qwen3next.block_count": 48,
    "qwen3next.context_length": 262144, "qwen3next.embedding_length": 2048,
    "qwen3next.feed_forward_length": 5120, "qwen3next.attention.head_count": 16,
    "qwen3next.attention.head_count_kv": 2, "qwen3next.attention.key_length": 256,
    "qwen3next.attention.value_length": 256, "qwen3next.rope.dimension_count": 64,
    "qwen3next.rope.freq_base": 10000000.0, "qwen3next.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen3next.expert_count": 512, "qwen3next.expert_used_count": 10,
    "qwen3next.expert_feed_forward_length": 512, "qwen3next.expert_shared_feed_forward_length": 512,
    "qwen3next.ssm.conv_kernel": 4, "qwen3next.ssm.state_size": 128, "qwen3next.ssm.group_count": 16,
    "qwen3next.ssm.time_step_rank": 32, "qwen3next.ssm.inner_size": 4096,
    "qwen3next.full_attention_interval": 4,
}


def _q3n_md(arch="qwen3next", **kw):
    """Q3N_MD under `arch` (qwen35moe: one NextN layer and the sections), keys
    in kw set (a__b for a.b) or, with None, removed."""
    a = arch + "."
    md = {k.replace("qwen3next.", a): v for k, v in Q3N_MD.items()}
    md["general.architecture"] = arch
    if arch == "qwen35moe":
        md[a + "block_count"] = 41
        md[a + "nextn_predict_layers"] = 1
        md[a + "rope.dimension_sections"] = [11, 11, 10, 0]
    for k, v in kw.items():
        k = a + k.replace("__", ".")
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    return md


def test_qwen3next_hparams():
    """The keys' defaults, the layer kinds (interval and array) and the refusals."""
    hp = refmodel.Hparams(_q3n_md())
    assert (hp.n_layer, hp.n_nextn, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dim) == \
        (48, 0, 16, 2, 256, 64)
    assert (hp.ssm_conv, hp.ssm_state, hp.ssm_groups, hp.ssm_heads, hp.ssm_tiled) == (4, 128, 16, 32, False)
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp, hp.n_ff_shexp) == (512, 10, 512, 512)
    assert hp.expert_gating == "softmax" and hp.expert_weights_norm is True
    assert hp.expert_weights_scale == 1.0 and hp.n_layer_dense_lead == 0
    assert hp.recurrent[:8] == [True, True, True, False] * 2 and sum(hp.recurrent) == 36
    # the interval's default is 4; an array overrides the interval
    assert refmodel.Hparams(_q3n_md(full_attention_interval=None)).recurrent == hp.recurrent
    assert refmodel.Hparams(_q3n_md(full_attention_interval=2)).recurrent[:4] == [True, False] * 2
    flags = [i % 3 == 1 for i in range(48)]
    assert refmodel.Hparams(_q3n_md(attention__recurrent_layers=flags)).recurrent == flags
    assert refmodel.Hparams(_q3n_md(expert_weights_scale=0.0)).expert_weights_scale == 1.0
    # as llama.cpp: the key is not read for the hybrids
    assert refmodel.Hparams(_q3n_md(expert_weights_scale=2.5)).expert_weights_scale == 1.0
    # qwen3next has no NextN layers, whatever a key says
    assert refmodel.Hparams(_q3n_md(nextn_predict_layers=1)).n_layer == 48
    # qwen35moe: its NextN layer not run, q/k heads tiled over the v heads
    hp = refmodel.Hparams(_q3n_md("qwen35moe"))
    assert (hp.block_count, hp.n_nextn, hp.n_layer, hp.ssm_tiled) == (41, 1, 40, True)
    assert len(hp.recurrent) == 40 and hp.recurrent[36:] == [True, True, True, False]
    assert hp.rope_sections == [11, 11, 10, 0]
    assert refmodel.Hparams(_q3n_md("qwen35moe", nextn_predict_layers=None)).n_layer == 41
    # each refusal names its key
    bad_both = [dict(ssm__inner_size=4095), dict(ssm__time_step_rank=24), dict(ssm__group_count=0),
                dict(attention__value_length=128), dict(attention__recurrent_layers=[True] * 47),
                dict(full_attention_interval=0), dict(expert_used_count=513),
                dict(expert_shared_feed_forward_length=0)]
    bad_both += [{k: None} for k in ("ssm__conv_kernel", "ssm__state_size", "ssm__group_count",
                                     "ssm__time_step_rank", "ssm__inner_size", "expert_count",
                                     "expert_feed_forward_length",
                                     "expert_shared_feed_forward_length")]
    for arch in ("qwen3next", "qwen35moe"):
        for bad in bad_both:
            key = list(bad)[0].split("__")[-1]
            with pytest.raises(ValueError, match=key):
                refmodel.Hparams(_q3n_md(arch, **bad))
    for bad in (dict(rope__dimension_sections=None),
                dict(rope__dimension_sections=[8, 8, 8, 8]),   # pairs 24.. in the fourth section
                dict(rope__dimension_sections=[11, 11, 10]),
                dict(rope__dimension_sections=[3, 0, 2, 0]),   # pair 6: sector 1, of the empty h section
                dict(rope__dimension_sections=[0, 0, 0, 0]),
                dict(attention__recurrent_layers=[True] * 41)):  # the NextN layer marked
        with pytest.raises(ValueError, match=list(bad)[0].split("__")[-1]):
            refmodel.Hparams(_q3n_md("qwen35moe", **bad))


Q3N_CASES = {
    # arch, weights' keywords, writer's keywords
    "qwen3next": ("qwen3next", {}, dict(interval=4)),
    "qwen3next-tied-interval2": ("qwen3next", dict(recurrent=[True, False, True, False]),
                                 dict(interval=2, tied=True, expert_scale=2.0)),
    "qwen35moe": ("qwen35moe", dict(n_nextn=1), dict(interval=4)),
    "qwen35moe-array": ("qwen35moe", dict(n_nextn=1, recurrent=[True, False, True, True]),
                        dict(recurrent_key=True, expert_scale=1.5)),
}


@pytest.mark.parametrize("case", sorted(Q3N_CASES))
def test_qwen3next_forward_by_hand(tmp_path, case):
    """Whole forward pass (DeltaNet and gated attention layers, Hv = 2 Hk, 12
    positions past the convolution's 4 taps) against plain numpy from the file."""
    arch, wkw, fkw = Q3N_CASES[case]
    w, hp = _q3n_weights(30 + sorted(Q3N_CASES).index(case), **wkw)
    m = _q3n(tmp_path, (w, hp), arch=arch, **fkw)
    assert m.hp.arch == arch and m.hp.n_layer == 4 and m.tied == bool(fkw.get("tied"))
    assert [m.layer(i).recurrent for i in range(4)] == hp["recurrent"]
    assert m.hp.ssm_heads == 2 * m.hp.ssm_groups and m.hp.ssm_conv < len(IDS)
    want, sel, kinds = _q3n_logits_by_hand(m.path, IDS)
    assert kinds == hp["recurrent"]
    got = m.logits(IDS)
    assert np.min(np.std(got, axis=1)) > 0.5
    assert np.max(np.abs(got - want)) < 1e-10
    assert np.array_equal(m.last_routing, sel)
    assert len(np.unique(sel)) > 1


def test_qwen3next_head_maps(tmp_path):
    """The same weights as qwen3next (v head j reads q/k head j / r) and
    qwen35moe (j % Hk) give other logits when Hv = 2 Hk, the same when Hv = Hk."""
    wts = _q3n_weights(40)
    a = _q3n(tmp_path, wts, arch="qwen3next").logits(IDS)
    b = _q3n(tmp_path, wts, arch="qwen35moe").logits(IDS)
    assert np.max(np.abs(a - b)) > 1e-3
    wts = _q3n_weights(40, n_k_heads=2, n_v_heads=2)
    a = _q3n(tmp_path, wts, arch="qwen3next", tag="r1").logits(IDS)
    b = _q3n(tmp_path, wts, arch="qwen35moe", tag="r1").logits(IDS)
    assert np.max(np.abs(a - b)) < 1e-12


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_qwen3next_causal(tmp_path, arch):
    """A prefix's logits are the first rows of a longer prompt's; later tokens
    change only later rows."""
    m = _q3n(tmp_path, _q3n_weights(41), arch=arch)
    a = m.logits(IDS)
    assert np.max(np.abs(m.logits(IDS[:5]) - a[:5])) < 1e-12
    b = m.logits(IDS[:5] + [7, 7, 7])
    assert np.max(np.abs(a[:5] - b[:5])) < 1e-12
    assert np.min(np.max(np.abs(a[5:8] - b[5:8]), axis=1)) > 1e-6


def test_qwen3next_conv_window(tmp_path):
    """One DeltaNet layer (K = 4): with the state wiped at every position
    (softplus above 20 times ssm_a -1000: e^g is 0) a token reaches exactly
    the rows of the K positions from its own; with the state kept, every
    later row."""
    w, hp = _q3n_weights(42, n_layer=1, recurrent=[True])
    ids = [5, 9, 2, 33, 17, 40, 8, 61, 3, 12]
    s = 3
    other = list(ids)
    other[s] = 50

    def changed(m):
        a, b = m.logits(ids), m.logits(other)
        return [t for t in range(len(ids)) if np.max(np.abs(a[t] - b[t])) > 0]

    kept = _q3n(tmp_path, (w, hp), recurrent_key=True, tag="kept")
    assert changed(kept) == list(range(s, len(ids)))
    w = dict(w)
    w["blk.0.ssm_dt.bias"] = np.full(4, 30.0)
    w["blk.0.ssm_a"] = np.full(4, -1000.0)
    wiped = _q3n(tmp_path, (w, hp), recurrent_key=True, tag="wiped")
    assert changed(wiped) == list(range(s, s + 4))
    want, _, _ = _q3n_logits_by_hand(wiped.path, ids)
    assert np.max(np.abs(wiped.logits(ids) - want)) < 1e-10
    # softplus is x itself above 20 (the branch the wiped state takes), log(1 + e^x) below
    sp = refmodel.softplus(np.array([30.5, 20.5, 20.0, 1.0, -30.0]))
    assert sp[0] == 30.5 and sp[1] == 20.5
    assert np.array_equal(sp[2:], np.log1p(np.exp([20.0, 1.0, -30.0])))


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_qwen3next_lazy_equals_eager(tmp_path, arch):
    eager = _q3n(tmp_path, _q3n_weights(43, n_nextn=arch == "qwen35moe"), arch=arch)
    lazy = refmodel.Model(eager.path, lazy=True)
    assert lazy.lazy and not eager.lazy
    a = eager.head(eager.hidden(IDS), top=8, vchunk=16)
    b = lazy.head(lazy.hidden(IDS), top=8, vchunk=16)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    assert np.array_equal(eager.last_routing, lazy.last_routing)


def test_qwen3next_tied_output(tmp_path):
    w, hp = _q3n_weights(44)
    m = _q3n(tmp_path, (w, hp), tied=True)
    assert m.tied
    assert np.array_equal(m.output, _f32(w["token_embd.weight"]))


def test_qwen3next_shared_expert_gate(tmp_path):
    """sigmoid(ffn_gate_inp_shexp . xn) scales the shared expert: every row's
    first dim is large and positive, so a gate vector of -1e4 there shuts the
    shared expert (as zero down weights do), 0 halves it (as halved down
    weights do), and +1e4 lets it through whole."""
    w, hp = _q3n_weights(45, n_layer=2, recurrent=[True, False])
    w["token_embd.weight"][:, 0] += 40.0

    def run(tag, gate, down_factor=1.0):
        v = dict(w)
        for i in range(2):
            e0 = np.zeros(hp["n_embd"])
            e0[0] = gate
            v["blk.%d.ffn_gate_inp_shexp.weight" % i] = e0
            v["blk.%d.ffn_down_shexp.weight" % i] = w["blk.%d.ffn_down_shexp.weight" % i] * down_factor
        return _q3n(tmp_path, (v, hp), tag=tag, recurrent_key=True).logits(IDS)

    off = run("off", -1e4)
    assert np.max(np.abs(off - run("zero", -1e4, 0.0))) < 1e-12
    assert np.max(np.abs(off - run("nodown", 1e4, 0.0))) < 1e-12
    assert np.max(np.abs(run("half", 0.0) - run("halfdown", 1e4, 0.5))) < 1e-12
    assert np.max(np.abs(run("on", 1e4) - off)) > 1e-3


def test_qwen35moe_nextn_not_run(tmp_path):
    """New weights for the NextN layer change nothing; for the last layer run they do."""
    w, hp = _q3n_weights(46, n_nextn=1)
    rng = np.random.default_rng(2)
    assert any(k.startswith("blk.4.nextn.") for k in w)

    def redraw(i):
        p = "blk.%d." % i
        return {k: (v + rng.standard_normal(v.shape) * 0.3 if k.startswith(p) else v) for k, v in w.items()}

    m = _q3n(tmp_path, (w, hp), arch="qwen35moe")
    assert (m.hp.block_count, m.hp.n_layer, m.hp.n_nextn) == (5, 4, 1)
    a = m.logits(IDS)
    b = _q3n(tmp_path, (redraw(4), hp), arch="qwen35moe", tag="nextn").logits(IDS)
    assert np.array_equal(a, b)
    c = _q3n(tmp_path, (redraw(3), hp), arch="qwen35moe", tag="last").logits(IDS)
    assert np.max(np.abs(a - c)) > 1e-3


def test_qwen3next_tensors_checked(tmp_path):
    """The older ssm_in form is refused by name; wrong or missing tensors are
    errors naming them, not wrong results."""
    w, hp = _q3n_weights(47)
    S, Hk, Hv, E = hp["state"], hp["n_k_heads"], hp["n_v_heads"], hp["n_embd"]
    old = {k: v for k, v in w.items() if k not in ("blk.0.attn_qkv.weight", "blk.0.attn_gate.weight")}
    old["blk.0.ssm_in.weight"] = np.zeros((2 * S * Hk + 2 * S * Hv, E))
    for arch in ("qwen3next", "qwen35moe"):
        with pytest.raises(ValueError, match="ssm_in"):
            _q3n(tmp_path, (old, hp), arch=arch, tag="old")
    for name, arr in (("blk.0.ssm_conv1d.weight", np.zeros((2 * S * Hk + S * Hv, 3))),
                      ("blk.1.ssm_a", np.zeros(Hv + 1)),
                      ("blk.2.ssm_norm.weight", np.zeros(S * Hv)),
                      ("blk.3.attn_q.weight", np.zeros((4 * 16, E))),
                      ("blk.0.ffn_gate_inp_shexp.weight", np.zeros((1, E)))):
        bad = dict(w)
        bad[name] = arr
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            _q3n(tmp_path, (bad, hp), tag="bad").layer(int(name[4]))
    for name, arch in (("blk.1.ssm_a", "qwen3next"), ("blk.2.ssm_dt.bias", "qwen35moe"),
                       ("blk.0.ssm_alpha.weight", "qwen35moe"), ("blk.3.attn_k_norm.weight", "qwen3next"),
                       ("blk.0.ffn_up_shexp.weight", "qwen3next")):
        bad = {k: v for k, v in w.items() if k != name}
        with pytest.raises(KeyError, match=name.replace(".", r"\.")):
            _q3n(tmp_path, (bad, hp), arch=arch, tag="missing").layer(int(name[4]))


# ---------------------------------------------------------------- 8. mkmodel

def _mkmodel():
    cands = []
    if os.environ.get("BLOOMERY_BIN"):
        cands.append(os.path.join(os.environ["BLOOMERY_BIN"], "bloomery-mkmodel"))
    cands.append(os.path.join(REPO, "build", "bin", "bloomery-mkmodel"))
    cands.append(os.path.join(REPO, "build", "tools", "bloomery-mkmodel"))
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


MK_CASES = [
    ("qwen3moe", ["--arch", "qwen3moe", "--layers", "2", "--experts", "8", "--experts-used", "2"]),
    ("qwen3", ["--arch", "qwen3", "--layers", "2"]),
    ("qwen3moe", ["--arch", "qwen3moe", "--layers", "2", "--type", "q8_0", "--tied"]),
    ("qwen3", ["--arch", "qwen3", "--layers", "2", "--type", "q5_K"]),
    ("qwen3moe", ["--arch", "qwen3moe", "--layers", "1", "--type", "bf16"]),
    ("qwen3", ["--arch", "qwen3", "--layers", "1", "--type", "f16"]),
    ("glm4moe", ["--arch", "glm4moe", "--layers", "3", "--experts", "8", "--experts-used", "2"]),
    ("deepseek2", ["--arch", "deepseek2", "--layers", "3", "--experts", "8", "--experts-used", "2"]),
    ("gpt-oss", ["--arch", "gpt-oss", "--layers", "2", "--experts", "8", "--experts-used", "2"]),
    ("qwen3next", ["--arch", "qwen3next", "--layers", "4", "--experts", "8", "--experts-used", "2"]),
    ("qwen35moe", ["--arch", "qwen35moe", "--layers", "4", "--experts", "8", "--experts-used", "2"]),
]


@pytest.mark.parametrize("arch,flags", MK_CASES, ids=[" ".join(f[1:]) for _, f in MK_CASES])
def test_mkmodel(tmp_path, arch, flags):
    exe = _mkmodel()
    if exe is None:
        pytest.skip("bloomery-mkmodel not built (looked in $BLOOMERY_BIN and %s/build/bin)" % REPO)
    path = str(tmp_path / "mk.gguf")
    r = subprocess.run([exe, "-o", path, "--seed", "7"] + flags, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m = refmodel.Model(path)
    assert m.hp.arch == arch
    # --layers counts the layers run; glm4moe and qwen35moe files get one NextN
    # layer besides, deepseek2 files may (DeepSeek-V3 has one; llama.cpp's
    # converter drops it)
    assert m.hp.n_layer == int(flags[flags.index("--layers") + 1])
    assert m.hp.n_nextn in {"glm4moe": (1,), "deepseek2": (0, 1), "qwen35moe": (1,)}.get(arch, (0,))
    if arch in refmodel.HYBRID_ARCHS:
        # a hybrid file runs both kinds of layers
        assert any(m.hp.recurrent) and not all(m.hp.recurrent)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, m.n_vocab, size=40).tolist()
    t = time.time()
    lg = m.logits(ids)
    assert lg.shape == (40, m.n_vocab)
    assert np.all(np.isfinite(lg))
    std = np.std(lg, axis=1)
    assert np.min(std) > 0.5, "flat logits: std %g" % np.min(std)
    # positions differ from each other
    d = np.max(np.abs(lg[1:] - lg[:-1]), axis=1)
    assert np.min(d) > 1e-3
    # the chunked head agrees with the direct product
    lse, top_ids, _ = m.head(m.hidden(ids), top=4)
    assert np.array_equal(top_ids[:, 0], np.argmax(lg, axis=1))
    if arch in ("qwen3moe", "glm4moe", "deepseek2", "gpt-oss") + refmodel.HYBRID_ARCHS:
        # routing uses more than one expert across the prompt
        assert len(np.unique(m.last_routing)) > 1
    sys.stderr.write("\nmkmodel %s: %.1fs, logits std %.3f\n" % (" ".join(flags), time.time() - t, float(np.mean(std))))
