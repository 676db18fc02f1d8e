"""Expert tiers: routed experts on a card that holds no layers of its own (-ot
...exps=CUDA1 beside the layers on CUDA0), computed there by a worker in the tier
role for every stage that holds those layers. On this machine the cards are made up
(bloomery-worker --list-devices answers $FAKE_DEVICES) and the workers run what the
plan puts on a card on the CPU (--cards-as-cpu), so that the plan, the processes, the
rings and the per-layer routing between stages, tier and hosttier are the ones a
two-card host runs; the output is the one-process CPU run's, token for token."""
import os
import re
import signal
import time

import pytest
import requests

import serverctl
from sse import get, post
from test_dry_run import serve

CARDS = "\n".join("cuda %d 85899345920 84825604096 Fake Card %d" % (i, i) for i in range(3))
GREEDY = {"prompt": "Experts on another card", "n_predict": 12, "temperature": 0, "ignore_eos": True,
          "return_tokens": True, "cache_prompt": False, "n_probs": 3}


@pytest.fixture(scope="module")
def model4(tmp_path_factory):
    return serverctl.make_model(str(tmp_path_factory.mktemp("tier") / "layers4.gguf"), "--layers", "4")


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory):
    return serverctl.fake_devices_bin(str(tmp_path_factory.mktemp("tierbin")), "bloomery-serve", cards_as_cpu=True)


class FakeCards(serverctl.Server):
    """bloomery-serve of fake_bin, whose workers see CARDS."""

    def __init__(self, exe, model, args):
        super().__init__(model, ["-t", "1", "-tb", "1", "-c", "1024", "-np", "2"] + list(args),
                         env={"FAKE_DEVICES": CARDS})
        self.exe = exe

    def command(self):
        return [self.exe] + super().command()[1:]


@pytest.fixture
def cards(fake_bin, model4):
    started = []

    def start(args):
        srv = FakeCards(fake_bin, model4, args).start()
        started.append(srv)
        return srv

    yield start
    problems = []
    for srv in started:
        if srv.proc.poll() is None:
            problems += srv.stop()
    assert not problems, problems


def tier_pid(srv, k=0):
    for pid, _, _ in srv.children():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--name" in argv and argv[argv.index(b"--name") + 1] == b"tier%d" % k:
            return pid
    return None


def child_metric(url, name, process):
    """bloomery:NAME{process="PROCESS"} of /metrics, once the child's Stats have told
    something (they come every few seconds), else 0."""
    head = 'bloomery:%s{process="%s"} ' % (name, process)
    deadline, v = time.monotonic() + 10, None
    while time.monotonic() < deadline:
        for line in requests.get(url + "/metrics", timeout=30).text.splitlines():
            if line.startswith(head):
                v = float(line.split()[-1])
        if v:
            return v
        time.sleep(0.25)
    assert v is not None, "no metric " + head
    return v


def answer(srv):
    r = post(srv.url, "/completion", GREEDY)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["tokens"], [[round(p["logprob"], 4) for p in t["top_logprobs"]] for t in j["completion_probabilities"]]


def test_the_dry_run_shows_the_tier(model4, fake_bin):
    """The plan: the stage on CUDA0 without its routed experts, tier 0 on CUDA1 with
    every MoE layer's."""
    rc, out, err, _, _ = serve(["-m", model4, "--dry-run", "-ngl", "99", "-dev", "CUDA0", "-ot", "ffn_.*_exps=CUDA1"],
                               exe=fake_bin, env={"FAKE_DEVICES": CARDS})
    assert rc == 0 and "fits: yes" in out, out + err
    assert re.search(r"expert tier 0 on CUDA1 \(Fake Card 1\): the routed experts of 4 layers, \S+ \S+, scratch",
                     out), out
    row = [l for l in out.splitlines() if re.match(r"\s+0\s+CUDA0\s+0-3\s", l)]
    assert row and re.search(r"\s-\s+-\s", row[0]), out  # no experts in the stage, none in a hosttier


@pytest.mark.parametrize("ot, why", [
    # CUDA1 holds layers of the default split: a tier's card holds none
    (["-ot", "ffn_.*_exps=CUDA1"], "CUDA1 holds layers"),
    (["-dev", "CUDA0", "-ot", "ffn_.*_exps=CUDA7"], "no such device"),
    # a layer's gate, up and down go together
    (["-dev", "CUDA0", "-ot", r"ffn_gate_exps=CUDA1"], "split between two places"),
])
def test_refusals(model4, fake_bin, ot, why):
    rc, out, err, _, _ = serve(["-m", model4, "--dry-run", "-ngl", "99"] + ot, exe=fake_bin,
                               env={"FAKE_DEVICES": CARDS})
    assert rc in (1, 2) and why in out + err, (rc, out, err)


def test_a_tier_gives_the_cpu_runs_tokens(cards, model4, servers):
    """One stage, every routed expert on tier 0; then layers 0-1's on the tier and
    2-3's in the hosttier; then two stages (CUDA0, CUDA1) sending to a tier on CUDA2;
    then a CPU stage (-ngl 0) with its experts on CUDA0: the same tokens and top
    log-probabilities as one CPU process, the tier's calls counted in /metrics, the
    plan in /props."""
    ref = answer(servers.start(["-t", "1", "-c", "1024", "-ngl", "0"], model=model4))
    srv = cards(["-ngl", "99", "-dev", "CUDA0", "-ot", "ffn_.*_exps=CUDA1"])
    assert answer(srv) == ref
    assert child_metric(srv.url, "child_expert_calls", "tier0") > 0
    tiers = get(srv.url, "/props").json()["placement"]["expert_tiers"]
    assert tiers == [{"device": "CUDA1", "expert_layers": [0, 1, 2, 3], "expert_bytes": tiers[0]["expert_bytes"]}]
    assert tiers[0]["expert_bytes"] > 0
    assert srv.stop() == []

    srv = cards(["-ngl", "99", "-dev", "CUDA0", "-ot", r"blk\.[01]\.ffn_.*_exps=CUDA1,blk\.[23]\.ffn_.*_exps=CPU"])
    assert answer(srv) == ref
    assert child_metric(srv.url, "child_expert_calls", "tier0") > 0
    assert child_metric(srv.url, "child_expert_calls", "hosttier") > 0
    assert srv.stop() == []

    srv = cards(["-ngl", "99", "-dev", "CUDA0,CUDA1", "-ot", "ffn_.*_exps=CUDA2"])
    assert answer(srv) == ref
    p = get(srv.url, "/props").json()["placement"]
    assert [s["device"] for s in p["stages"]] == ["CUDA0", "CUDA1"], p
    assert p["expert_tiers"][0]["device"] == "CUDA2", p
    assert srv.stop() == []

    # the layers on the CPU, their routed experts on a card
    srv = cards(["-ngl", "0", "-ot", "ffn_.*_exps=CUDA0"])
    assert answer(srv) == ref
    p = get(srv.url, "/props").json()["placement"]
    assert [s["device"] for s in p["stages"]] == ["CPU"] and p["expert_tiers"][0]["device"] == "CUDA0", p


def test_a_killed_tier_fails_the_request_and_comes_back(cards):
    """kill -9 of the tier: the request in flight ends with an error naming it, the
    set restarts, and the next request gets the same tokens as before."""
    srv = cards(["-ngl", "99", "-dev", "CUDA0", "-ot", "ffn_.*_exps=CUDA1"])
    before = answer(srv)
    pid = tier_pid(srv)
    assert pid, srv.children()
    r = requests.post(srv.url + "/completion", json=dict(GREEDY, n_predict=4000, stream=True), stream=True,
                      timeout=30)
    with r:
        lines = r.iter_lines()
        next(lines)
        os.kill(pid, signal.SIGKILL)
        text = b"\n".join(l for l in lines if l).decode("utf-8", "replace")
    assert "tier" in text.lower() and '"error"' in text, text[-600:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(srv.url + "/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(0.1)
    assert answer(srv) == before
    new = tier_pid(srv)
    assert new and new != pid
