"""bloomery-cli as a user runs it: the correctness gates against the shared oracles
(or, without them, against the float64 reference on bloomery-mkmodel files), chat
through the template, greedy answers of the trained model, sampling flags and bad
input.

Gates (per prompt):
  precise mode (--precise): mean |dlogit| <= 0.005 and max <= 0.05 against the exact
  pass; the default fast path: top-1 agreement and mean |dlogit| no worse than
  llama.cpp's file against the same exact pass.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import compare  # noqa: E402

BIN = os.environ.get("BLOOMERY_BIN") or os.path.join(ROOT, "build", "bin")
SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
PROMPTS = ["chat-short", "chat-code", "long-prose"]
MODELS = ["qwen3moe-tiny-q4k", "qwen3moe-trained-q8"]
THREADS = "2"


def tool(name):
    path = os.path.join(BIN, name)
    if not os.access(path, os.X_OK):
        pytest.fail("%s is not built (set BLOOMERY_BIN to the folder of the programs)" % path)
    return path


def need_shared():
    if not os.path.isdir(os.path.join(SHARED, "oracle")):
        pytest.skip("%s is absent: the shared oracles are not here" % SHARED)


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          errors="replace", timeout=kw.pop("timeout", 600), **kw)


def dump(model, prompt_file, out, *extra):
    p = run([tool("bloomery-cli"), "-m", model, "-f", prompt_file, "-n", "0", "-t", THREADS,
             "-c", "4096", "--dump-logits", str(out)] + list(extra))
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        return json.load(f)


def load(path):
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_cli_gates_against_the_shared_oracle(tmp_path, model, prompt):
    need_shared()
    exact = load(os.path.join(SHARED, "oracle", "logits", "%s.%s.exact.json" % (model, prompt)))
    llama = load(os.path.join(SHARED, "oracle", "logits", "%s.%s.json" % (model, prompt)))
    gguf = os.path.join(SHARED, "models", model + ".gguf")
    text = os.path.join(SHARED, "prompts", prompt + ".txt")

    fast = dump(gguf, text, tmp_path / "fast.json")
    assert fast["prompt_ids"] == exact["prompt_ids"], "the tokenizer disagrees with the oracle"
    ours = compare.compare(exact, fast)
    theirs = compare.compare(exact, llama)
    print("%s %s fast: top1 %d/%d mean %.4f max %.3f; llama.cpp: top1 %d mean %.4f max %.3f" % (
        model, prompt, ours["top1_same"], ours["positions"], ours["mean_abs_dlogit"], ours["max_abs_dlogit"],
        theirs["top1_same"], theirs["mean_abs_dlogit"], theirs["max_abs_dlogit"]))
    assert ours["top1_same"] >= theirs["top1_same"]
    assert ours["mean_abs_dlogit"] <= theirs["mean_abs_dlogit"]

    precise = dump(gguf, text, tmp_path / "precise.json", "--precise")
    ours = compare.compare(exact, precise)
    print("%s %s precise: top1 %d/%d mean %.5f max %.4f" % (
        model, prompt, ours["top1_same"], ours["positions"], ours["mean_abs_dlogit"], ours["max_abs_dlogit"]))
    assert ours["mean_abs_dlogit"] <= 0.005
    assert ours["max_abs_dlogit"] <= 0.05


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3"])
def test_cli_gates_against_the_reference_on_mkmodel_files(tmp_path, arch):
    """The same gates without the shared folder: the judge is the float64 reference."""
    model = tmp_path / "m.gguf"
    p = run([tool("bloomery-mkmodel"), "-o", str(model), "--arch", arch, "--seed", "7"])
    assert p.returncode == 0, p.stderr
    text = tmp_path / "prompt.txt"
    text.write_text("<|im_start|>user\nThe quick brown fox jumps over the lazy dog, "
                    "and then it runs home.<|im_end|>\n<|im_start|>assistant\n")
    fast = dump(model, text, tmp_path / "fast.json")
    precise = dump(model, text, tmp_path / "precise.json", "--precise")
    ref = tmp_path / "ref.json"
    p = run(["/usr/bin/python3", os.path.join(ROOT, "tests", "reference", "reference.py"),
             str(model), "--ids", ",".join(map(str, fast["prompt_ids"])), "--dump-logits",
             str(ref), "-q"])
    assert p.returncode == 0, p.stderr
    exact = load(ref)
    c = compare.compare(exact, precise)
    assert c["mean_abs_dlogit"] <= 0.005 and c["max_abs_dlogit"] <= 0.05, c
    # No llama.cpp file exists for these: the fast path must stay within the
    # distance llama.cpp keeps on the shared files (mean 0.064, top-1 23/24).
    c = compare.compare(exact, fast)
    assert c["mean_abs_dlogit"] <= 0.064, c
    assert c["top1_same"] >= int(0.9 * c["positions"]), c


def test_cli_trained_model_answers_greedily(tmp_path):
    need_shared()
    p = run([tool("bloomery-cli"), "-m", os.path.join(SHARED, "models", "qwen3moe-trained-q8.gguf"),
             "--chat", "-p", "Tell me a fortune.", "--temp", "0", "-n", "64", "-t", THREADS])
    assert p.returncode == 0, p.stderr
    want = ("<think>\n\n</think>\n\nThe only thing that is to be done in the world is to be "
            "a good idea.")
    assert p.stdout.strip() == want


def test_cli_chat_streams_text_through_the_template(tmp_path):
    model = tmp_path / "m.gguf"
    assert run([tool("bloomery-mkmodel"), "-o", str(model)]).returncode == 0
    p = run([tool("bloomery-cli"), "-m", str(model), "--chat", "-p", "Hello", "-n", "16",
             "--seed", "3", "-t", THREADS])
    assert p.returncode == 0, p.stderr
    assert "generated" in p.stderr
    # the same seed gives the same text; another seed, most likely another text
    again = run([tool("bloomery-cli"), "-m", str(model), "--chat", "-p", "Hello", "-n", "16",
                 "--seed", "3", "-t", THREADS])
    assert again.stdout == p.stdout


def test_cli_sampling_flags_are_honoured(tmp_path):
    model = tmp_path / "m.gguf"
    assert run([tool("bloomery-mkmodel"), "-o", str(model)]).returncode == 0
    base = [tool("bloomery-cli"), "-m", str(model), "-p", "abc", "-n", "8", "-t", THREADS,
            "--temp", "0", "--dump-logits"]
    a = run(base + [str(tmp_path / "a.json")])
    assert a.returncode == 0, a.stderr
    first = load(tmp_path / "a.json")["greedy"][0]["id"]
    # banning the greedy choice changes it
    b = run(base + [str(tmp_path / "b.json"), "--logit-bias", "%d-inf" % first])
    assert b.returncode == 0, b.stderr
    assert load(tmp_path / "b.json")["greedy"][0]["id"] != first


@pytest.mark.parametrize("args,needle", [
    (["-p", "x"], "-m FILE"),
    (["-m", "M", "--bogus"], "--bogus"),
    (["-m", "M", "-t", "0"], "--threads"),
    (["-m", "M", "--top-p", "2"], "--top-p"),
    (["-m", "M", "-l", "5*3"], "--logit-bias"),
    (["-m", "M", "-ctk", "q4_1"], "cache-type-k"),
    (["-m", "M", "-p", "a", "-f", "b"], "not both"),
    (["-m", "M", "--experts-vram", "-5"], "--experts-vram"),
    (["-m", "M", "--experts-vram", "12Q"], "--experts-vram"),
    (["-m", "M", "--no-residency=on"], "--no-residency"),
])
def test_cli_bad_flags_exit_2_naming_the_flag(tmp_path, args, needle):
    p = run([tool("bloomery-cli")] + [str(tmp_path / "m.gguf") if a == "M" else a for a in args])
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr


@pytest.mark.parametrize("args,env", [
    (["--experts-vram", "512"], None),
    (["--experts-vram", "2G", "--no-residency"], None),
    (["--experts-vram", "auto"], None),
    ([], {"BLOOMERY_EXPERTS_VRAM": "0", "BLOOMERY_NO_RESIDENCY": "1"}),
])
def test_cli_residency_flags_are_taken_on_the_cpu(tmp_path, args, env):
    """The residency flags and their variables are accepted; on the CPU there is no
    card to hold slots, so the logits are those of a run without them."""
    model = tmp_path / "m.gguf"
    assert run([tool("bloomery-mkmodel"), "-o", str(model)]).returncode == 0
    base = [tool("bloomery-cli"), "-m", str(model), "-p", "abc", "-n", "2", "-t", THREADS, "--temp", "0",
            "--dump-logits"]
    plain = run(base + [str(tmp_path / "plain.json")])
    assert plain.returncode == 0, plain.stderr
    e = dict(os.environ)
    e.update(env or {})
    p = run(base + [str(tmp_path / "resid.json")] + args, env=e)
    assert p.returncode == 0, p.stderr
    assert load(tmp_path / "resid.json") == load(tmp_path / "plain.json")


@pytest.mark.parametrize("budget", ["0", "64K", "256K"])
def test_cli_pages_experts_from_disk_with_the_same_logits(tmp_path, budget):
    """--experts-ram below the routed experts' bytes: the CPU plan moves them to the
    expert store, which pages them from the file; the logits are the all-RAM run's."""
    model = tmp_path / "m.gguf"
    assert run([tool("bloomery-mkmodel"), "-o", str(model)]).returncode == 0
    base = [tool("bloomery-cli"), "-m", str(model), "-p", "abc def", "-n", "3", "-t", THREADS, "--temp", "0",
            "--dump-logits"]
    plain = run(base + [str(tmp_path / "plain.json")])
    assert plain.returncode == 0, plain.stderr
    p = run(base + [str(tmp_path / "paged.json"), "--experts-ram", budget])
    assert p.returncode == 0, p.stderr
    assert "event=pager" in p.stderr and "on disk" in p.stderr, p.stderr
    assert load(tmp_path / "paged.json") == load(tmp_path / "plain.json")


def test_cli_bad_model_and_long_prompt_exit_1(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    p = run([tool("bloomery-cli"), "-m", str(bad), "-p", "x"])
    assert p.returncode == 1 and "bad.gguf" in p.stderr
    model = tmp_path / "m.gguf"
    assert run([tool("bloomery-mkmodel"), "-o", str(model)]).returncode == 0
    p = run([tool("bloomery-cli"), "-m", str(model), "-p", "word " * 200, "-c", "16"])
    assert p.returncode == 1 and "context" in p.stderr
