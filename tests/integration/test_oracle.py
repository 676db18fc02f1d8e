"""The server against the in-process path: /completion's n_probs agree with
`bloomery-cli --dump-logits` on the same prompt, and `--workers 2` (the layers split
over two worker processes) gives exactly what one worker gives."""
import json
import math
import os
import subprocess

import pytest

import serverctl
from sse import post

PROMPTS = ["The old lighthouse keeper walked down to the",
           "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"]
# |logprob| difference allowed between the server and bloomery-cli at the first
# generated position: the same kernels on the same rows; a wrong row, position or
# slot moves the values by far more (the logits' spread is several units)
TOL = 2e-3


def cli_dump(model, prompt, out):
    p = subprocess.run([serverctl.program("bloomery-cli"), "-m", model, "-p", prompt, "-n", "0",
                        "-t", "1", "--dump-logits", str(out), "--dump-top", "32"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("k", range(len(PROMPTS)))
def test_n_probs_agree_with_cli(url, model, tmp_path, k):
    dump = cli_dump(model, PROMPTS[k], tmp_path / "dump.json")
    ids = dump["prompt_ids"]
    last = dump["positions"][-1]
    cli_lp = {i: lg - last["lse"] for i, lg in zip(last["ids"], last["logits"])}
    r = post(url, "/completion", {"prompt": ids, "n_predict": 1, "n_probs": 10, "temperature": 0,
                                  "ignore_eos": True, "cache_prompt": False})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["tokens_evaluated"] == len(ids)
    top = b["completion_probabilities"][0]["top_logprobs"]
    assert len(top) == 10
    worst = 0.0
    for t in top:
        assert t["id"] in cli_lp, "server candidate %r is not in the cli's top 32" % t
        worst = max(worst, abs(t["logprob"] - cli_lp[t["id"]]))
    assert worst <= TOL, "server and cli logprobs differ by %.5f (> %g)" % (worst, TOL)
    best = last["ids"][0]
    gap = last["logits"][0] - last["logits"][1]
    if gap > TOL:
        assert top[0]["id"] == best
    # the probabilities add up as a softmax does
    assert sum(math.exp(t["logprob"]) for t in top) <= 1.0 + 1e-4


def test_small_ubatch_agrees_with_cli(servers, model, tmp_path):
    """-ub 8: a prompt of 30+ tokens is evaluated in several steps; the logits at its
    end still agree with the cli's single pass."""
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-ub", "8", "-b", "8"])
    prompt = "A longer prompt, so that it needs several steps of eight rows each: " * 2
    dump = cli_dump(model, prompt, tmp_path / "dump.json")
    last = dump["positions"][-1]
    assert len(dump["prompt_ids"]) > 24
    cli_lp = {i: lg - last["lse"] for i, lg in zip(last["ids"], last["logits"])}
    b = greedy(srv.url, dump["prompt_ids"], 1)
    for t in b["completion_probabilities"][0]["top_logprobs"]:
        assert t["id"] in cli_lp
        assert abs(t["logprob"] - cli_lp[t["id"]]) <= TOL, (t, cli_lp[t["id"]])


def greedy(url, prompt, n=12):
    r = post(url, "/completion", {"prompt": prompt, "n_predict": n, "n_probs": 5, "temperature": 0,
                                  "ignore_eos": True, "cache_prompt": False, "return_tokens": True})
    assert r.status_code == 200, r.text
    return r.json()


def same_answers(url, other):
    for p in PROMPTS:
        one, two = greedy(url, p), greedy(other, p)
        assert two["tokens"] == one["tokens"]
        assert two["content"] == one["content"]
        # bit-identical logits give identical log-probabilities
        for a, b in zip(one["completion_probabilities"], two["completion_probabilities"]):
            assert [(t["id"], t["logprob"]) for t in a["top_logprobs"]] == \
                   [(t["id"], t["logprob"]) for t in b["top_logprobs"]]


def test_two_workers_same_as_one(url, servers):
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "--workers", "2"])
    names = [n for _, n, _ in srv.children()]
    assert names.count("bloomery-worker") == 2, names
    # -ngl 0: the routed experts stay in the workers, no hop to a hosttier
    assert names.count("bloomery-hosttier") == 0, names
    same_answers(url, srv.url)


@pytest.mark.parametrize("depth", [2, 3])
def test_steps_in_flight_over_two_workers_same_as_one(url, servers, depth):
    """Two stages with steps in flight (--pipeline): six concurrent greedy requests,
    each slot's rows in one step at a time, give the one-process answers bit for bit;
    the stages took several steps at once (more steps than one at a time needs)."""
    import concurrent.futures
    import requests

    def steps(u):
        for line in requests.get(u + "/metrics", timeout=30).text.splitlines():
            if line.startswith("llamacpp:n_decode_total "):
                return float(line.split()[1])
        raise AssertionError("no n_decode_total")

    prompts = ["Once upon a time", "The smith heats the iron", "In the morning the village",
               "A small bird sang", "The river ran past the mill", PROMPTS[0]]

    def answers(u):
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            return list(ex.map(lambda p: greedy(u, p, 16), prompts))

    one = servers.start(["-np", "6", "-c", "6144", "-t", "1", "-tb", "1", "--pipeline", "1"])
    srv = servers.start(["-np", "6", "-c", "6144", "-t", "1", "-tb", "1", "--workers", "2",
                         "--pipeline", str(depth)])
    assert "event=pipeline steps_in_flight=%d stages=2" % depth in srv.log(100000)
    want, got = answers(one.url), answers(srv.url)
    for p, a, b in zip(prompts, want, got):
        assert b["tokens"] == a["tokens"], p
        for x, y in zip(a["completion_probabilities"], b["completion_probabilities"]):
            assert [(t["id"], t["logprob"]) for t in x["top_logprobs"]] == \
                   [(t["id"], t["logprob"]) for t in y["top_logprobs"]], p
    # the slots were split over the steps in flight: fewer busy slots a step
    assert steps(srv.url) > steps(one.url)


@pytest.mark.parametrize("pattern", ["ffn_.*_exps=HOSTTIER", r"blk\.[13]\.ffn_(up|down|gate)_exps=HOSTTIER"])
def test_experts_in_the_hosttier_same_as_in_the_worker(url, servers, pattern):
    """-ot puts the routed experts of the layers it matches in the hosttier: every
    layer's, or two of them beside the worker's own; the answers are the in-worker
    pass's, bit for bit."""
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "--workers", "2", "-ot", pattern])
    names = [n for _, n, _ in srv.children()]
    assert names.count("bloomery-worker") == 2, names
    assert names.count("bloomery-hosttier") == 1, names
    same_answers(url, srv.url)


def test_shared_oracle_model_if_present(servers, tmp_path):
    """The shared tiny oracle model (a 4-layer qwen3moe) through the server and the cli."""
    shared = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(serverctl.ROOT), "shared")
    gguf = os.path.join(shared, "models", "qwen3moe-tiny-q4k.gguf")
    if not os.path.isfile(gguf):
        pytest.skip("%s is absent" % gguf)
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1"], model=gguf)
    dump = cli_dump(gguf, PROMPTS[1], tmp_path / "dump.json")
    last = dump["positions"][-1]
    cli_lp = {i: lg - last["lse"] for i, lg in zip(last["ids"], last["logits"])}
    b = greedy(srv.url, dump["prompt_ids"], 1)
    for t in b["completion_probabilities"][0]["top_logprobs"]:
        assert abs(t["logprob"] - cli_lp[t["id"]]) <= TOL, (t, cli_lp.get(t["id"]))


def test_routing_stats_of_the_trained_model(tmp_path):
    """bloomery-cli --routing-stats on the trained tiny MoE of ../shared, whose routing
    is skewed (38-56 % of its selections go to 4 of its 16 experts): every layer counts
    each token's k choices, and the shares land in that range's neighbourhood."""
    shared = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(serverctl.ROOT), "shared")
    gguf = os.path.join(shared, "models", "qwen3moe-trained-q8.gguf")
    prose = os.path.join(shared, "prompts", "long-prose.txt")
    if not os.path.isfile(gguf) or not os.path.isfile(prose):
        pytest.skip("%s is absent" % gguf)
    p = subprocess.run([serverctl.program("bloomery-cli"), "-m", gguf, "-f", prose, "-n", "8", "-t", "1",
                        "-ngl", "0", "--routing-stats", "4"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if "routing: layer " in l]
    assert len(lines) == 4, p.stderr
    counts = {int(l.split("layer ")[1].split(":")[0]): l for l in lines}
    assert sorted(counts) == [0, 1, 2, 3]
    shares = []
    for l in lines:
        n = int(l.split(": ")[3].split(" selections")[0])
        assert n > 0 and n % 4 == 0, l  # k = 4 choices per token
        shares.append(float(l.split("selections, ")[1].split(" %")[0]))
        assert len(l.split("to experts ")[1].split()) == 4, l
    assert all(25.0 <= s <= 75.0 for s in shares), shares
    assert 38.0 <= sum(shares) / len(shares) <= 60.0, shares
    dense = subprocess.run([serverctl.program("bloomery-cli"), "-m",
                            os.path.join(shared, "models", "qwen3-draft-trained-q8.gguf"), "-p", "Hi", "-n", "1",
                            "-t", "1", "-ngl", "0", "--routing-stats", "4"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    assert dense.returncode == 0 and "routing: no counts" in dense.stderr, dense.stderr
