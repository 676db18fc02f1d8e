"""Speculative decoding with a draft model (-md): the trained pair of ../shared (the
MoE model and its dense draft, one vocabulary) answers exactly as the model alone
does, greedily, whole and streamed, with stop strings and token limits; the
timings and /metrics report the proposals and those taken; a draft of another
vocabulary, an unknown --spec-type and --spec-type draft without a draft are
refused at start."""
import os

import pytest
import requests

import serverctl
from sse import data_events, metric, post, stream

SHARED = os.environ.get("BLOOMERY_SHARED") or os.path.join(os.path.dirname(serverctl.ROOT), "shared")
TARGET = os.path.join(SHARED, "models", "qwen3moe-trained-q8.gguf")
DRAFT = os.path.join(SHARED, "models", "qwen3-draft-trained-q8.gguf")

pytestmark = pytest.mark.skipif(not (os.path.isfile(TARGET) and os.path.isfile(DRAFT)),
                                reason="the trained pair of ../shared is absent")

PROMPTS = ["<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
           "This program is free software; you can redistribute it",
           "Return a new sorted list from the items in"]
FLAGS = ["-np", "2", "-c", "2048", "-t", "1", "-tb", "1"]


@pytest.fixture(scope="module")
def pair(module_servers):
    plain = module_servers.start(FLAGS, model=TARGET)
    spec = module_servers.start(FLAGS + ["-md", DRAFT, "--draft-max", "6", "--draft-p-min", "0"],
                                model=TARGET)
    return plain, spec


def test_greedy_text_is_the_models_own(pair):
    plain, spec = pair
    for p in PROMPTS:
        body = {"prompt": p, "n_predict": 64, "temperature": 0}
        a = post(plain.url, "/completion", body).json()
        b = post(spec.url, "/completion", body).json()
        assert b["content"] == a["content"], (p, a["content"], b["content"])
        assert b["tokens_predicted"] == a["tokens_predicted"]
        t = b["timings"]
        assert t["draft_n"] > 0 and 0 <= t["draft_n_accepted"] <= t["draft_n"], t
        assert "draft_n" not in a["timings"]
    assert metric(spec.url, "draft_tokens_total") >= metric(spec.url, "draft_accepted_total") > 0
    assert metric(spec.url, "draft_steps_total") > 0


def test_a_requests_own_draft_limits(pair):
    """llama-server's per-request fields: "speculative.n_max" 0 turns drafting off for
    the request, 2 caps it below the server's 6, a "speculative.p_min" is the request's;
    the text stays the model's whatever they are; the effective limits show in generation_settings and
    the server's in /props; out-of-range values are refused by name."""
    plain, spec = pair
    props = requests.get(spec.url + "/props", timeout=30).json()["default_generation_settings"]["params"]
    assert (props["speculative.n_max"], props["speculative.n_min"], props["speculative.p_min"]) == (6, 0, 0.0)
    want = post(plain.url, "/completion", {"prompt": PROMPTS[1], "n_predict": 32, "temperature": 0}).json()
    for extra, drafted in (({"speculative.n_max": 0}, False), ({"speculative.n_max": 2}, True),
                           ({"speculative.p_min": 0.99}, None)):
        body = dict({"prompt": PROMPTS[1], "n_predict": 32, "temperature": 0}, **extra)
        r = post(spec.url, "/completion", body).json()
        assert r["content"] == want["content"], extra
        if drafted is not None:
            assert (r["timings"].get("draft_n", 0) > 0) == drafted, (extra, r["timings"])
        g = r["generation_settings"]
        assert g["speculative.n_max"] == extra.get("speculative.n_max", 6), g
        assert abs(g["speculative.p_min"] - extra.get("speculative.p_min", 0.0)) < 1e-6, g
    for bad in ({"speculative.n_max": -1}, {"speculative.p_min": 2}, {"speculative.n_min": "one"}):
        r = post(spec.url, "/completion", dict({"prompt": "x", "n_predict": 1}, **bad))
        assert r.status_code == 400 and next(iter(bad)) in r.text, (bad, r.text)


def test_seeded_sampling_is_the_models_own(pair):
    """each token is drawn from the model's own distribution, one draw a token, so a
    seed gives the same text with and without the draft"""
    plain, spec = pair
    body = {"prompt": PROMPTS[0], "n_predict": 48, "temperature": 0.8, "seed": 7}
    assert post(spec.url, "/completion", body).json()["content"] == \
        post(plain.url, "/completion", body).json()["content"]


def test_limits_and_stop_strings_cut_where_they_would(pair):
    plain, spec = pair
    for extra in ({"n_predict": 5}, {"n_predict": 64, "stop": ["the"]}, {"n_predict": 64, "stop": ["\n"]}):
        body = dict({"prompt": PROMPTS[1], "temperature": 0}, **extra)
        a = post(plain.url, "/completion", body).json()
        b = post(spec.url, "/completion", body).json()
        assert (b["content"], b["stop_type"], b["tokens_predicted"]) == \
            (a["content"], a["stop_type"], a["tokens_predicted"]), extra


def test_streamed_tokens_are_the_same(pair):
    plain, spec = pair
    body = {"prompt": PROMPTS[2], "n_predict": 40, "temperature": 0, "stream": True}
    texts = []
    for srv in pair:
        r, events = stream(srv.url, "/completion", body)
        assert r.status_code == 200
        texts.append("".join(e.get("content", "") for e in data_events(events)))
    assert texts[0] == texts[1], texts


def test_two_slots_at_once(pair):
    import concurrent.futures
    plain, spec = pair
    body = lambda p: {"prompt": p, "n_predict": 40, "temperature": 0}
    want = [post(plain.url, "/completion", body(p)).json()["content"] for p in PROMPTS[:2]]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda p: post(spec.url, "/completion", body(p)).json()["content"], PROMPTS[:2]))
    assert got == want


def test_proposals_cut_by_the_batch(pair, module_servers):
    """two slots in steps of 16 rows, 14 proposals each: the second slot's do not fit
    the step and are dropped unverified, and the draft's cache forgets them too (its next catch-up starts at
    the pending token, never past it), so no draft step fails and the text is the
    model's own"""
    import concurrent.futures
    plain, _ = pair
    spec = module_servers.start(FLAGS + ["-md", DRAFT, "--draft-max", "14", "--draft-min", "2", "--draft-p-min", "0",
                                         "-b", "16", "-ub", "16"], model=TARGET)
    body = lambda p: {"prompt": p, "n_predict": 40, "temperature": 0}
    want = [post(plain.url, "/completion", body(p)).json()["content"] for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda p: post(spec.url, "/completion", body(p)).json()["content"], PROMPTS))
    assert got == want
    assert metric(spec.url, "draft_accepted_total") > 0
    log = spec.log(200000)
    assert "draft_step_failed" not in log, log[-3000:]


@pytest.mark.parametrize("flags,needle", [
    (["-md", "{model}"], "vocabulary"),
    (["--spec-type", "ngram-mod", "-md", DRAFT], "--spec-type ngram-mod"),
    (["--spec-type", "draft"], "needs a draft model"),
    (["-md", DRAFT, "--draft-min", "8", "--draft-max", "4"], "--draft-min"),
    (["-md", DRAFT, "-devd", "CUDA7"], "-devd"),
])
def test_refused_at_start(flags, needle, tmp_path):
    import subprocess
    from test_flags import run_serve
    other = str(tmp_path / "other-vocab.gguf")  # the built-in vocabulary of 1024 tokens
    subprocess.run([serverctl.program("bloomery-mkmodel"), "-o", other, "--arch", "qwen3", "--layers", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    args = [a.replace("{model}", other) for a in flags]
    code, out, _ = run_serve(["-m", TARGET, "--port", "0"] + FLAGS + args, timeout=60)
    assert code == 1 and needle in out, (code, out)


def test_spec_type_none_loads_no_draft(module_servers):
    srv = module_servers.start(FLAGS + ["-md", DRAFT, "--spec-type", "none"], model=TARGET)
    r = post(srv.url, "/completion", {"prompt": PROMPTS[0], "n_predict": 8, "temperature": 0}).json()
    assert "draft_n" not in r["timings"]
    assert "event=draft " not in srv.log(100000)
