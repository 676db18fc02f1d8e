"""Tests of the float64 reference (tests/reference).

Owns:
  1. the reference against the shared exact oracles (both shared models, all
     three prompts; long-prose is marked slow), the CLI's output format, and
     compare.py against the oracle README's llama.cpp figures;
  2. the dequantizers against the shared quant oracles;
  3. internal consistency: GGUF writer/reader round trip, chunked output
     head against a direct computation, a one-expert qwen3moe against the
     dense qwen3 with the same weights, identical experts against dense;
  4. the reference on models written by bloomery-mkmodel (skipped when the
     tool is not built).
Oracle-dependent tests skip when the shared folder is absent (env
BLOOMERY_SHARED, else <repo>/../shared).
"""

import json
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


# ---------------------------------------------------------------- 4. mkmodel

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
    if arch == "qwen3moe":
        # routing uses more than one expert across the prompt
        assert len(np.unique(m.last_routing)) > 1
    sys.stderr.write("\nmkmodel %s: %.1fs, logits std %.3f\n" % (" ".join(flags), time.time() - t, float(np.mean(std))))
