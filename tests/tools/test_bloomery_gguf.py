"""Tests of the bloomery-gguf tool: info and check on good, broken and split files,
and its exit codes (0 good, 1 bad file, 2 usage). The binary is found in $BLOOMERY_BIN
(a folder) or build/bin under the repository root. Files are made with the builder in
tests/fuzz/make_corpus.py.

  /usr/bin/python3 -m pytest tests/tools/test_bloomery_gguf.py
"""
import importlib.util
import os
import re
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin"), "bloomery-gguf")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(ROOT, "..", "shared")
TINY = os.path.join(SHARED, "models", "qwen3moe-tiny-q4k.gguf")

_spec = importlib.util.spec_from_file_location("make_corpus", os.path.join(ROOT, "tests", "fuzz", "make_corpus.py"))
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)


def run(*args):
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"{BIN} is missing: build it, or set BLOOMERY_BIN to the folder holding it")
    p = subprocess.run([BIN, *args], capture_output=True, text=True, errors="replace", timeout=60)
    assert p.returncode >= 0, f"killed by signal {-p.returncode}: {p.stderr}"
    return p


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_help_exits_0():
    p = run("--help")
    assert p.returncode == 0
    assert "info FILE" in p.stdout and "check FILE" in p.stdout and "fingerprint FILE" in p.stdout


@pytest.mark.parametrize("args", [[], ["info"], ["check"], ["fingerprint"], ["frobnicate", "x.gguf"],
                                  ["info", "a", "b"]])
def test_usage_errors_exit_2(args):
    p = run(*args)
    assert p.returncode == 2
    assert "usage:" in p.stderr


def test_check_good_file(tmp_path):
    path = write(tmp_path, "good.gguf", mc.small_model())
    p = run("check", path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1
    assert "ok" in p.stdout and "3 tensors" in p.stdout


def test_info_small_file(tmp_path):
    path = write(tmp_path, "good.gguf", mc.small_model(64))
    p = run("info", path)
    assert p.returncode == 0, p.stderr
    assert "GGUF version 3, alignment 64" in p.stdout
    assert re.search(r"general\.architecture\s+string\s+\"test\"", p.stdout)
    assert re.search(r"tokenizer\.ggml\.tokens\s+array\s+string\[3\]", p.stdout)
    assert re.search(r"token_embd\.weight\s+q8_0\s+64 x 3\s+204", p.stdout)
    assert re.search(r"blk\.0\.ffn_up_exps\.weight\s+q4_K\s+256 x 2 x 2\s+576", p.stdout)
    assert "totals: 3 tensors, 1036 bytes, 1280 parameters" in p.stdout


def test_info_escapes_and_shortens_long_strings(tmp_path):
    template = "{% for m in messages %}\n" * 200
    path = write(tmp_path, "t.gguf", mc.gguf([("tokenizer.chat_template", mc.STRING, template),
                                               ("t.bytes", mc.STRING, b"\x1b[31m\xff")]))
    p = run("info", path)
    assert p.returncode == 0, p.stderr
    line = next(l for l in p.stdout.splitlines() if "chat_template" in l)
    assert len(line) < 200 and "\\n" in line and f"({len(template)} bytes)" in line
    assert "\x1b" not in p.stdout and "\\x1b[31m\\xff" in p.stdout


def test_check_split_model(tmp_path):
    for i in range(3):
        kvs = [("split.no", mc.U16, i), ("split.count", mc.U16, 3), ("split.tensors.count", mc.I32, 3)]
        write(tmp_path, f"m-{i + 1:05d}-of-00003.gguf", mc.gguf(kvs, [(f"t{i}", mc.T_F32, [8])]))
    p = run("check", str(tmp_path / "m-00001-of-00003.gguf"))
    assert p.returncode == 0, p.stderr
    assert "3 parts" in p.stdout and "3 tensors" in p.stdout
    os.remove(tmp_path / "m-00002-of-00003.gguf")
    p = run("check", str(tmp_path / "m-00001-of-00003.gguf"))
    assert p.returncode == 1
    assert "m-00002-of-00003.gguf" in p.stderr and "missing" in p.stderr


def _bad_files():
    good = mc.small_model()
    return {
        "truncated": (good[:20], ["file ends inside the key count", "offset 16"]),
        "bad_magic": (b"GGML" + good[4:], ["magic"]),
        "past_eof": (good[:-64], ["blk.0.ffn_up_exps.weight", "past the end"]),
        "version_1": (good[:4] + struct.pack("<I", 1) + good[8:], ["version 1"]),
        "empty": (b"", ["empty"]),
        "huge_kv_count": (good[:16] + struct.pack("<Q", 1 << 63) + good[24:], ["key count"]),
        "duplicate_key": (mc.gguf([("a.b", mc.U8, 1), ("a.b", mc.U8, 1)]), ["a.b", "duplicate"]),
    }


@pytest.mark.parametrize("name", sorted(_bad_files()))
def test_check_bad_file_exits_1(tmp_path, name):
    data, needles = _bad_files()[name]
    path = write(tmp_path, name + ".gguf", data)
    p = run("check", path)
    assert p.returncode == 1
    assert p.stdout == ""
    assert p.stderr.startswith("bloomery-gguf: ")
    assert name + ".gguf" in p.stderr
    for n in needles:
        assert n in p.stderr
    assert run("info", path).returncode == 1


def test_check_missing_file_and_directory(tmp_path):
    p = run("check", str(tmp_path / "absent.gguf"))
    assert p.returncode == 1 and "absent.gguf" in p.stderr
    p = run("check", str(tmp_path))
    assert p.returncode == 1 and "directory" in p.stderr


def test_info_shared_tiny_model():
    if not os.path.exists(TINY):
        pytest.skip(f"{TINY} is absent")
    p = run("info", TINY)
    assert p.returncode == 0, p.stderr
    assert re.search(r"general\.architecture\s+string\s+\"qwen3moe\"", p.stdout)
    rows = re.findall(r"^\s+(\d+)\s+(\S+)\s+(f32|f16|q4_K|q6_K|q8_0|q5_K|bf16)\s", p.stdout, re.M)
    assert len(rows) == 51
    assert [int(r[0]) for r in rows] == list(range(51))
    assert ("token_embd.weight", "q4_K") in {(r[1], r[2]) for r in rows}
    assert "totals: 51 tensors" in p.stdout
    c = run("check", TINY)
    assert c.returncode == 0 and "51 tensors" in c.stdout


def test_fingerprint(tmp_path):
    """the same bytes give the same fingerprint under any name; a changed data byte
    inside the hashed sample, or a longer file, gives another; the line holds the
    size; a file that is not a model is refused with exit 1"""
    data = mc.small_model()
    a, b = write(tmp_path, "a.gguf", data), write(tmp_path, "b.gguf", data)
    pa, pb = run("fingerprint", a), run("fingerprint", b)
    assert pa.returncode == 0 and pb.returncode == 0, pa.stderr + pb.stderr
    fa, fb = pa.stdout.split()[0], pb.stdout.split()[0]
    assert re.fullmatch(r"[0-9a-f]{64}", fa) and fa == fb
    assert ("%d bytes" % len(data)) in pa.stdout and "fingerprinted in" in pa.stdout
    changed = bytearray(data)
    changed[-1] ^= 0x40  # the data section's last block is always hashed
    c = run("fingerprint", write(tmp_path, "c.gguf", bytes(changed)))
    assert c.returncode == 0 and c.stdout.split()[0] != fa
    bad = run("fingerprint", write(tmp_path, "bad.gguf", b"GGUF" + b"\0" * 8))
    assert bad.returncode == 1 and "bloomery-gguf:" in bad.stderr
    missing = run("fingerprint", str(tmp_path / "none.gguf"))
    assert missing.returncode == 1
