"""Tests of the bloomery-tokenize tool: the Qwen3 oracle through the command line,
the special-token switch, and its exit codes (0 done, 1 bad model or input,
2 usage). The binary is found in $BLOOMERY_BIN (a folder) or build/bin under the
repository root; the model and oracle in $BLOOMERY_SHARED or ../shared.

  /usr/bin/python3 -m pytest tests/tools/test_tokenize.py
"""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin"),
                   "bloomery-tokenize")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(ROOT, "..", "shared")
TINY = os.path.join(SHARED, "models", "qwen3moe-tiny-q4k.gguf")
ORACLE = os.path.join(SHARED, "oracle", "tokenizer", "qwen3.jsonl")

IM_START = 151644


def run(*args):
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"{BIN} is missing: build it, or set BLOOMERY_BIN to the folder holding it")
    p = subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace", timeout=120)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr}"
    return p


def need_model():
    if not os.path.exists(TINY) or not os.path.exists(ORACLE):
        pytest.skip(f"{TINY} or {ORACLE} is absent")


def ids_of(tmp_path, text, *flags):
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    p = run("-m", TINY, "-f", str(path), "--ids", *flags)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_help_exits_0():
    p = run("--help")
    assert p.returncode == 0
    assert "-m MODEL.gguf" in p.stdout


@pytest.mark.parametrize("args", [[], ["-m", "x.gguf"], ["-p", "hi"], ["-m", "x", "-p", "a", "-f", "b"],
                                  ["--frobnicate"], ["-m"]])
def test_usage_errors_exit_2(args):
    p = run(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr


def test_missing_model_exits_1(tmp_path):
    p = run("-m", str(tmp_path / "none.gguf"), "-p", "hi")
    assert p.returncode == 1
    assert "none.gguf" in p.stderr


def test_not_a_model_exits_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    p = run("-m", str(bad), "-p", "hi")
    assert p.returncode == 1
    assert p.stderr


def test_oracle_through_the_tool(tmp_path):
    need_model()
    # One run over all lines would need a separator the oracle could contain, so
    # each line runs alone (loading the vocabulary takes well under a second).
    n = good = 0
    with open(ORACLE, encoding="utf-8") as f:
        for line in f:
            o = json.loads(line)
            n += 1
            got = ids_of(tmp_path, o["text"])
            good += got == o["ids"]
            assert got == o["ids"], f"line {n}: {o['text']!r}"
    assert n == 88 and good == n


def test_no_parse_special_keeps_control_text(tmp_path):
    need_model()
    assert ids_of(tmp_path, "<|im_start|>user")[0] == IM_START
    ids = ids_of(tmp_path, "<|im_start|>user", "--no-parse-special")
    assert IM_START not in ids and len(ids) > 2


def test_pieces_listing(tmp_path):
    need_model()
    p = run("-m", TINY, "-p", "Hello world")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["  9707 -> 'Hello'", "  1879 -> ' world'"]


def test_stats_on_stderr(tmp_path):
    need_model()
    p = run("-m", TINY, "-p", "Hello world", "--ids", "--stats")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [9707, 1879]
    assert "tokens=2" in p.stderr and "mb_per_s=" in p.stderr


# --- an independent reference -------------------------------------------------------
# A plain Python byte-level BPE (the GPT-2 procedure: merge the best-ranked pair
# everywhere, repeat), with the Qwen2 split regex run by the `regex` module and NFC
# by unicodedata, compared with the tool on text full of what NFC and the split
# regex care about. The vocabulary comes from the model by a small reader here.

def read_tokenizer_keys(path):
    """The tokenizer.ggml.tokens and .merges arrays of a GGUF file (v2/v3)."""
    import struct
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n]
        pos += n
        return s

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(sizes[t])

    assert data[:4] == b"GGUF"
    pos = 8
    take("Q")
    n_kv = take("Q")
    out = {}
    for _ in range(n_kv):
        key = string().decode()
        v = value(take("I"))
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            out[key] = v
    return out["tokenizer.ggml.tokens"], out["tokenizer.ggml.merges"]


def reference_ids(text, tokens, merges):
    import unicodedata
    regex = pytest.importorskip("regex")
    vocab = {t.decode(): i for i, t in enumerate(tokens)}
    ranks = {}
    for i, m in enumerate(merges):
        a, b = m.decode().split(" ", 1)
        ranks.setdefault((a, b), i)
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    byte_char, extra = {}, 0
    for b in range(256):
        if b in printable:
            byte_char[b] = chr(b)
        else:
            byte_char[b] = chr(256 + extra)
            extra += 1
    split = regex.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    cache = {}

    def bpe(word):
        parts = list(word)
        while len(parts) > 1:
            best = min(((ranks.get((parts[i], parts[i + 1]), 1 << 62), i) for i in range(len(parts) - 1)))
            if best[0] == 1 << 62:
                break
            a, b = parts[best[1]], parts[best[1] + 1]
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        return [vocab[p] for p in parts]

    ids = []
    for m in split.finditer(unicodedata.normalize("NFC", text)):
        word = "".join(byte_char[b] for b in m.group().encode())
        if word not in cache:
            cache[word] = bpe(word)
        ids += cache[word]
    return ids


def nasty_text(seed, n):
    """Letters, digits, white space and punctuation of many scripts, combining marks,
    conjoining jamo, NFC singletons and exclusions, emoji; no special token."""
    import random
    rnd = random.Random(seed)
    pools = [
        list("abcdeoAEOuyKS  \n\t\r.,;:!?'\"()[]{}0123456789-_/#$%&*+="),
        [chr(c) for c in range(0x300, 0x370)],
        [chr(c) for c in range(0x1100, 0x1113)] + [chr(c) for c in range(0x1161, 0x1176)]
        + [chr(c) for c in range(0x11A8, 0x11C3)],
        [chr(c) for c in range(0xC0, 0x17F)],
        [chr(c) for c in range(0x591, 0x5C8)],
        [chr(c) for c in range(0x900, 0x97F)],
        [chr(c) for c in range(0x400, 0x460)],
        [chr(c) for c in range(0x4E00, 0x4E80)] + [chr(c) for c in range(0x3041, 0x3097)],
        ["\u212b", "\u2126", "\u0958", "\uf900", "\u1e9b", "\u0344", "\u0f73", "\u30ac", "\u0345",
         "\u00a0", "\u0085", "\u2028", "\u3000", "\u200b", "\u200d", "\u00bd", "\u2163",
         "\U0001f999", "\U0001f44d\U0001f3fd", "\ufffd", "\u017f", "\u212a", "'s", "'LL"],
    ]
    return "".join(rnd.choice(rnd.choice(pools)) for _ in range(n))


def test_matches_independent_bpe_reference(tmp_path):
    need_model()
    pytest.importorskip("regex")
    seed = int(os.environ.get("BLOOMERY_TEST_SEED") or 20261130)
    text = nasty_text(seed, 60000)
    tokens, merges = read_tokenizer_keys(TINY)
    want = reference_ids(text, tokens, merges)
    path = tmp_path / "nasty.txt"
    path.write_bytes(text.encode("utf-8"))
    p = run("-m", TINY, "-f", str(path), "--ids", "--no-parse-special", "--no-bos")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    if got != want:
        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
        pytest.fail(f"seed {seed}: first difference at id {i} of {len(want)}: "
                    f"got {got[max(0, i - 3):i + 5]}, want {want[max(0, i - 3):i + 5]}")
