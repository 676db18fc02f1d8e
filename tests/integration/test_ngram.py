"""N-gram speculation (--spec-type ngram-simple, ngram-map-k, ngram-mod): proposals from the text a
slot has seen, verified by the model as a draft model's are, so the text is the
model's own, greedy and seeded, one slot or two, one stage or two in a pipeline; the
timings and /metrics count the proposals and those taken; a request's
speculative.n_max 0 turns them off; the types llama.cpp has and this server does not
are refused at start by name, and so are limits out of range."""
import concurrent.futures
import os

import pytest
import requests

import serverctl
from sse import data_events, metric, post, stream

SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(serverctl.ROOT), "shared")
TARGET = os.path.join(SHARED, "models", "qwen3moe-trained-q8.gguf")

pytestmark = pytest.mark.skipif(not os.path.isfile(TARGET), reason="the trained model of ../shared is absent")

# The licence text repeats itself, so the n-grams of the prompt find what follows.
GPL = ("This program is free software; you can redistribute it and/or modify it under the terms of the GNU "
       "General Public License as published by the Free Software Foundation; either version 2 of the License, "
       "or (at your option) any later version. This program is free software; you can redistribute it")
PROMPTS = [GPL, "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
           "Return a new sorted list from the items in"]
FLAGS = ["-np", "2", "-c", "2048", "-t", "1", "-tb", "1"]
SIMPLE = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
MAPK = ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "8"]
MOD = ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1",
       "--spec-ngram-mod-n-max", "8"]


@pytest.fixture(scope="module")
def trio(module_servers):
    plain = module_servers.start(FLAGS, model=TARGET)
    simple = module_servers.start(FLAGS + SIMPLE, model=TARGET)
    mod = module_servers.start(FLAGS + MOD, model=TARGET)
    mapk = module_servers.start(FLAGS + MAPK, model=TARGET)
    return plain, simple, mod, mapk


def complete(srv, prompt, **kw):
    return post(srv.url, "/completion", dict({"prompt": prompt, "n_predict": 64, "temperature": 0}, **kw)).json()


def test_greedy_text_is_the_models_own(trio):
    plain, simple, mod, mapk = trio
    for p in PROMPTS:
        want = complete(plain, p)
        for srv in (simple, mod, mapk):
            got = complete(srv, p)
            assert (got["content"], got["tokens_predicted"]) == (want["content"], want["tokens_predicted"]), p
    for srv, name in ((simple, "ngram-simple"), (mod, "ngram-mod"), (mapk, "ngram-map-k")):
        t = complete(srv, GPL)["timings"]
        assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], (name, t)
        assert metric(srv.url, "draft_tokens_total") >= metric(srv.url, "draft_accepted_total") > 0, name
        assert "event=draft kind=%s" % name in srv.log(200000)


def test_seeded_sampling_and_stop_strings_are_the_models_own(trio):
    plain, simple, mod, mapk = trio
    for extra in ({"temperature": 0.8, "seed": 7}, {"stop": ["Library"]}, {"n_predict": 5}):
        want = complete(plain, GPL, **extra)
        for srv in (simple, mod, mapk):
            got = complete(srv, GPL, **extra)
            assert (got["content"], got["stop_type"]) == (want["content"], want["stop_type"]), extra


def test_streamed_and_two_slots_at_once(trio):
    plain, simple, mod, mapk = trio
    want = [complete(plain, p)["content"] for p in PROMPTS[:2]]
    for srv in (simple, mod, mapk):
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            got = list(ex.map(lambda p: complete(srv, p)["content"], PROMPTS[:2]))
        assert got == want
        r, events = stream(srv.url, "/completion", {"prompt": GPL, "n_predict": 64, "temperature": 0,
                                                    "stream": True})
        assert r.status_code == 200
        assert "".join(e.get("content", "") for e in data_events(events)) == want[0]


def test_a_requests_n_max_and_the_servers_limits(trio):
    plain, simple, mod, mapk = trio
    props = requests.get(simple.url + "/props", timeout=30).json()["default_generation_settings"]["params"]
    assert (props["speculative.n_max"], props["speculative.n_min"]) == (8, 0)
    props = requests.get(mod.url + "/props", timeout=30).json()["default_generation_settings"]["params"]
    assert (props["speculative.n_max"], props["speculative.n_min"]) == (8, 1)
    want = complete(plain, GPL)["content"]
    r = complete(simple, GPL, **{"speculative.n_max": 0})
    assert r["content"] == want and r["timings"].get("draft_n", 0) == 0, r["timings"]


def test_two_stages_in_a_pipeline(module_servers, trio):
    """two CPU workers, steps of different slots in flight at once: the proposals of
    a slot wait for its own step's answer"""
    plain = trio[0]
    srv = module_servers.start(FLAGS + ["--workers", "2"] + SIMPLE, model=TARGET)
    assert "event=pipeline steps_in_flight=2" in srv.log(200000)
    want = [complete(plain, p)["content"] for p in PROMPTS[:2]]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda p: complete(srv, p)["content"], PROMPTS[:2]))
    assert got == want
    assert metric(srv.url, "draft_accepted_total") > 0


@pytest.mark.parametrize("flags,needle", [
    (["--spec-type", "ngram-map-k4v"], "--spec-type ngram-map-k4v"),
    (["--spec-type", "ngram-cache"], "--spec-type ngram-cache"),
    (["--spec-type", "ngram-simple,draft-mtp"], "one type, not a list"),
    (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-min", "10", "--spec-ngram-mod-n-max", "4"],
     "--spec-ngram-mod-n-min 10 is above --spec-ngram-mod-n-max 4"),
    (["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "65"], "--spec-ngram-simple-size-m"),
    (["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "0"], "--spec-ngram-mod-n-match"),
])
def test_refused_at_start(flags, needle):
    from test_flags import run_serve
    code, out, _ = run_serve(["-m", TARGET, "--port", "0"] + FLAGS + flags, timeout=60)
    assert code in (1, 2) and needle in out, (code, out)  # 2: a value the flag parser refuses


def test_a_recurrent_model_keeps_its_text(module_servers, tmp_path):
    """qwen3next (a recurrent state beside the cache): a verify step keeps the state
    before it as a checkpoint and goes back to it past the first token the model does
    not take, so the text with proposals is the model's own. N is 1, so proposals
    come; the tiny random file takes few or none of them, so this is the path back to
    the checkpoint (the taken ones are the trained model's tests above)"""
    import subprocess
    path = str(tmp_path / "qwen3next.gguf")
    subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", path, "--threads", "2", "--arch", "qwen3next",
                    "--layers", "5", "--experts", "8", "--experts-used", "2", "--seed", "7"],
                   check=True, stdout=subprocess.DEVNULL, timeout=300)
    flags = ["-np", "1", "-c", "1024", "-t", "1", "-tb", "1"]
    plain = module_servers.start(flags, model=path)
    spec = module_servers.start(flags + ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1",
                                         "--spec-ngram-simple-size-m", "6"], model=path)
    for p in ("a b c a b c a b c a b", "Hello world. Hello world. Hello"):
        want = complete(plain, p, n_predict=48)
        got = complete(spec, p, n_predict=48)
        assert (got["content"], got["tokens_predicted"]) == (want["content"], want["tokens_predicted"]), p
    drafted, taken = metric(spec.url, "draft_tokens_total"), metric(spec.url, "draft_accepted_total")
    assert drafted > 0, spec.log(20000)[-2000:]
    assert taken <= drafted
