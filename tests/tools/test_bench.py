"""bloomery-bench as a user runs it: llama-bench's table, the roofline line, jsonl
output, and bad flags. Speed itself is never asserted."""
import json
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin")


def tool(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        pytest.fail("%s is not built (set BLOOMERY_BIN to the folder of the programs)" % path)
    return path


def run(args):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "m.gguf"
    p = run([tool("bloomery-mkmodel"), "-o", str(path)])
    assert p.returncode == 0, p.stderr
    return str(path)


def test_bench_with_the_nextn_layer(model, tmp_path):
    """--mtp: the rows of a file whose NextN layer runs say CPU+NextN; a file without
    one exits 1 naming why."""
    glm = str(tmp_path / "glm.gguf")
    p = run([tool("bloomery-mkmodel"), "-o", glm, "--arch", "glm4moe", "--layers", "2"])
    assert p.returncode == 0, p.stderr
    p = run([tool("bloomery-bench"), "-m", glm, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--mtp"])
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines()[2:] if l.startswith("| ")]
    assert [r.split("|")[4].strip().split(" ")[0] for r in rows] == ["CPU+NextN", "CPU+NextN"], p.stdout
    p = run([tool("bloomery-bench"), "-m", model, "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--mtp"])
    assert p.returncode == 1 and "no NextN" in p.stderr, p.stderr


def test_bench_prints_llama_bench_table_and_roofline(model):
    p = run([tool("bloomery-bench"), "-m", model, "-p", "16,32", "-n", "4", "-r", "2", "-t", "1,2"])
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "| model | size | params | backend | threads | test | t/s |"
    rows = [l for l in lines[2:] if l.startswith("| ")]
    assert [(r.split("|")[5].strip(), r.split("|")[6].strip()) for r in rows] == [
        ("1", "pp16"), ("1", "pp32"), ("1", "tg4"), ("2", "pp16"), ("2", "pp32"), ("2", "tg4")]
    for r in rows:
        mean, sd = r.split("|")[7].split("±")
        assert float(mean) > 0 and float(sd) >= 0
    assert any(l.startswith("decode roofline: a token reads") for l in lines)


def test_bench_jsonl(model):
    p = run([tool("bloomery-bench"), "-m", model, "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    recs = [json.loads(l) for l in p.stdout.splitlines()]
    assert [r["test"] for r in recs] == ["pp8", "tg2"]
    assert all(r["avg_ts"] > 0 and r["arch"] == "qwen3moe" for r in recs)


def test_bench_depth(model):
    """-d D starts each test from D cached positions, named as llama-bench names it."""
    p = run([tool("bloomery-bench"), "-m", model, "-p", "8", "-n", "3", "-d", "0,20", "-r", "1", "-t", "1"])
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines()[2:] if l.startswith("| ")]
    assert [r.split("|")[6].strip() for r in rows] == ["pp8", "pp8 @ d20", "tg3", "tg3 @ d20"]
    p = run([tool("bloomery-bench"), "-m", model, "-p", "0", "-n", "2", "-d", "33", "-r", "1", "-o", "jsonl",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    recs = [json.loads(l) for l in p.stdout.splitlines()]
    assert [(r["test"], r["n"], r["n_depth"]) for r in recs] == [("tg2 @ d33", 2, 33)]


def test_bench_parallel_sequences(model):
    """-np P decodes P sequences together: one tg row per P (named "x P" past one),
    prompts once; jsonl says n_parallel; --profile breaks down a step of the
    largest."""
    p = run([tool("bloomery-bench"), "-m", model, "-p", "8", "-n", "3", "-d", "0,5", "-np", "1,3", "-r", "1",
             "-t", "1"])
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines()[2:] if l.startswith("| ")]
    assert [r.split("|")[6].strip() for r in rows] == [
        "pp8", "pp8 @ d5", "tg3", "tg3 x3", "tg3 @ d5", "tg3 @ d5 x3"], p.stdout
    p = run([tool("bloomery-bench"), "-m", model, "-p", "0", "-n", "2", "-np", "4", "-r", "1", "-o", "jsonl",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    recs = [json.loads(l) for l in p.stdout.splitlines()]
    assert [(r["test"], r["n_parallel"]) for r in recs] == [("tg2 x4", 4)]
    assert recs[0]["avg_ts"] > 0
    p = run([tool("bloomery-bench"), "-m", model, "-p", "0", "-n", "1", "-np", "2", "-r", "1", "--profile",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    assert "32 steps of 2 rows" in p.stdout, p.stdout
    assert "context 512," in p.stdout, p.stdout
    # the profile's step follows the deepest -d
    p = run([tool("bloomery-bench"), "-m", model, "-p", "0", "-n", "1", "-d", "0,100", "-r", "1", "--profile",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    assert "context 100, 32 steps of 1 row" in p.stdout, p.stdout


@pytest.mark.parametrize("args,needle", [
    ([], "-m FILE"),
    (["-m", "x.gguf", "-np", "0"], "--parallel"),
    (["-m", "x.gguf", "-np", "257"], "-np"),
    (["-m", "x.gguf", "-np", "8", "-b", "4"], "-np"),
    (["-m", "x.gguf", "-d", "x"], "--n-depth"),
    (["-m", "x.gguf", "-d", ","], "--n-depth"),
    (["-m", "x.gguf", "-p", "abc"], "--n-prompt"),
    (["-m", "x.gguf", "-r", "0"], "--repetitions"),
    (["-m", "x.gguf", "-o", "csv"], "-o"),
    (["-m", "x.gguf", "--gpu"], "--gpu"),
    (["-m", "x.gguf", "--experts-vram", "-5"], "--experts-vram"),
    (["-m", "x.gguf", "--experts-vram", "12Q"], "--experts-vram"),
    (["-m", "x.gguf", "--no-residency=1"], "--no-residency"),
    (["--attention", "--att-heads", "5,2"], "--att-heads"),
    (["--attention", "--att-heads", "32"], "--att-heads"),
    (["--attention", "--att-heads", "32,4,1"], "--att-heads"),
    (["--attention", "--att-head-dim", "96"], "--att-head-dim"),
    (["--attention", "--att-head-dim", "512"], "--att-head-dim"),
    (["--attention", "--att-layers", "0"], "--att-layers"),
    (["--attention", "-np", "65"], "-np"),
    (["--attention", "-c", "0"], "--ctx-size"),
])
def test_bench_bad_flags_exit_2(args, needle):
    p = run([tool("bloomery-bench")] + args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


@pytest.mark.parametrize("args", [
    ["--experts-vram", "512"],
    ["--experts-vram", "2G"],
    ["--experts-vram", "auto", "--no-residency"],
])
def test_bench_takes_the_residency_flags(model, args):
    """Accepted on the CPU, where they change nothing: the table is as without them."""
    p = run([tool("bloomery-bench"), "-m", model, "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl",
             "--no-roofline"] + args)
    assert p.returncode == 0, p.stderr
    assert [json.loads(l)["test"] for l in p.stdout.splitlines()] == ["pp8", "tg2"]


def test_bench_attention_without_a_card_exits_1():
    """--attention needs no model but a CUDA device: without one (or in a build without
    CUDA) it exits 1 and says which; a depth past -c is refused the same way."""
    p = run([tool("bloomery-bench"), "--attention", "-d", "4096", "-r", "1"])
    assert p.returncode == 1 and "--attention" in p.stderr, p.stderr
    assert "CUDA" in p.stderr, p.stderr
    assert p.stdout == ""


def test_bench_bad_model_exits_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    p = run([tool("bloomery-bench"), "-m", str(bad), "-p", "8", "-n", "0"])
    assert p.returncode == 1 and "bad.gguf" in p.stderr


def test_bench_disk_rates(model):
    """--disk: a sequential row and random whole experts at depths 1, 4 and 16, through
    the pager's reader, in both formats; a model that is not there exits 1."""
    p = run([tool("bloomery-bench"), "-m", model, "--disk", "-r", "1"])
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("| ") and not l.startswith(("| disk", "| ---"))]
    assert [r.split("|")[1].strip() for r in rows] == ["sequential"] + ["random experts"] * 3, p.stdout
    assert [int(r.split("|")[3]) for r in rows] == [16, 1, 4, 16]
    assert all(float(r.split("|")[4]) > 0 for r in rows)
    p = run([tool("bloomery-bench"), "-m", model, "--disk", "-r", "1", "-o", "jsonl"])
    assert p.returncode == 0, p.stderr
    objs = [json.loads(l) for l in p.stdout.splitlines()]
    assert [o["depth"] for o in objs] == [16, 1, 4, 16], objs
    assert all(o["backend"] in ("io_uring", "pread") and o["mb_per_s"] > 0 for o in objs)
    p = run([tool("bloomery-bench"), "-m", "/no/such.gguf", "--disk"])
    assert p.returncode == 1 and "/no/such.gguf" in p.stderr


def test_bench_pages_experts_from_disk(model):
    """A budget below the routed experts' bytes pages them from the file in bench's own
    process, and each test says what the pager did; one that holds them all has no pager."""
    p = run([tool("bloomery-bench"), "-m", model, "--experts-ram", "0", "-p", "8", "-n", "4", "-r", "1",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    assert "event=pager" in p.stderr, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("bloomery-bench: pager: ")]
    assert [l.split()[2] for l in lines] == ["pp8", "tg4"], p.stderr
    assert all(" reads, hit rate " in l and " MB/s" in l for l in lines), lines
    assert "MB a token" in lines[1]
    assert "CPU+host" in p.stdout, p.stdout
    p = run([tool("bloomery-bench"), "-m", model, "--experts-ram", "1G", "-p", "0", "-n", "1", "-r", "1",
             "--no-roofline"])
    assert p.returncode == 0, p.stderr
    assert "bloomery-bench: pager:" not in p.stderr and "event=pager" not in p.stderr
