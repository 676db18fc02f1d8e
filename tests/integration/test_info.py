"""The GET routes of bloomery-serve against llama-server's shapes: /health, /v1/models,
/models, /props, /slots, /metrics, plus 404/405 for routes that do not exist."""
import re
import time

import pytest

from serverctl import ALIAS
from sse import assert_error, get, post


@pytest.mark.parametrize("path", ["/health", "/v1/health"])
def test_health_ok(url, path):
    r = get(url, path)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}
    assert r.headers.get("Server") == "bloomery"


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_models_list_the_alias(url, path):
    r = get(url, path)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    assert isinstance(body["data"], list) and len(body["data"]) == 1
    m = body["data"][0]
    assert m["id"] == ALIAS
    assert m["object"] == "model"
    assert isinstance(m.get("created"), int)
    assert m["owned_by"] == "llamacpp"
    meta = m["meta"]
    assert meta["n_vocab"] == 151936
    assert meta["n_ctx_train"] == 8192  # the test model's context_length
    assert meta["n_embd"] == 64
    assert meta["vocab_type"] == 2      # byte-level BPE
    assert meta["n_params"] > 0 and meta["size"] > 0
    # llama-server's Ollama-style list beside the OpenAI one
    assert body["models"][0]["model"] == ALIAS


def test_props(url, server):
    r = get(url, "/props")
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["total_slots"] == 2
    assert p["model_alias"] == ALIAS
    assert isinstance(p["build_info"], str) and p["build_info"]
    assert p["model_path"].endswith("test.gguf")
    # the model's own template (Qwen3's), as llama-server reports it
    assert "<|im_start|>" in p["chat_template"]
    dgs = p["default_generation_settings"]
    assert dgs["n_ctx"] == 2048  # per slot: -c 4096 over -np 2
    assert isinstance(dgs["params"], dict)
    for k in ("temperature", "top_k", "top_p", "min_p", "n_predict", "seed"):
        assert k in dgs["params"], "default_generation_settings.params lacks %s" % k


def test_slots(url):
    r = get(url, "/slots")
    assert r.status_code == 200, r.text
    slots = r.json()
    assert isinstance(slots, list) and len(slots) == 2
    assert sorted(s["id"] for s in slots) == [0, 1]
    for s in slots:
        # -c 4096 with -np 2: each slot owns 2048 positions (docs/serving.md)
        assert s["n_ctx"] == 2048, s
        assert s["is_processing"] is False, s
        assert s["id_task"] == -1, s


def test_slot_actions_are_not_supported(url):
    """POST /slots/ID?action=...: llama-server's 501 without --slot-save-path, body
    or not; the route is POST only; /slots itself stays GET."""
    for path, body in (("/slots/0?action=erase", None), ("/slots/1?action=save", {"filename": "x"}),
                       ("/slots/99?action=restore", {"filename": "x"})):
        r = post(url, path, body)
        err = assert_error(r, 501)
        assert "--slot-save-path" in err["message"], err
    r = get(url, "/slots/0")
    assert r.status_code == 405 and "POST" in r.headers.get("Allow", ""), r.text
    assert get(url, "/slots").status_code == 200
    assert post(url, "/slots", {}).status_code == 405


METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url):
    r = get(url, "/metrics")
    assert r.status_code == 200, r.text
    assert r.headers.get("Content-Type", "").startswith("text/plain"), r.headers
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = METRIC.match(line)
        assert m, "not a Prometheus sample line: %r" % line
        out[m.group(1)] = float(m.group(3))
    return out, r.text


# llama-server's metric names (tools/server: metrics of the slots and the decoder)
LLAMA_METRICS = [
    "llamacpp:prompt_tokens_total", "llamacpp:prompt_seconds_total",
    "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total",
    "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode",
    "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds",
    "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:n_tokens_max",
]


def test_metrics_names_and_counting(url):
    before, text = metrics(url)
    for name in LLAMA_METRICS:
        assert name in before, "metric %s missing from /metrics:\n%s" % (name, text)
        assert "# TYPE %s " % name in text, "no # TYPE line for %s" % name
    r = post(url, "/completion", {"prompt": "Counting tokens for the metrics", "n_predict": 5,
                                  "temperature": 0, "ignore_eos": True, "cache_prompt": False})
    assert r.status_code == 200, r.text
    after, _ = metrics(url)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 5
    assert after["llamacpp:prompt_tokens_total"] > before["llamacpp:prompt_tokens_total"]
    assert after["llamacpp:n_decode_total"] >= before["llamacpp:n_decode_total"] + 5
    assert after["llamacpp:requests_processing"] == 0


def test_metrics_of_the_processes(servers):
    # the supervisor asks every child for its Stats every 2 s; after a step the
    # worker's and the hosttier's counters show under bloomery:child_*
    url = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-ot", "ffn_.*_exps=HOSTTIER"]).url
    r = post(url, "/completion", {"prompt": "Stats", "n_predict": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    deadline = time.time() + 6
    while True:
        _, text = metrics(url)
        samples = {}
        for line in text.splitlines():
            if line.startswith("bloomery:"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        if samples.get('bloomery:child_steps{process="worker0"}', 0) >= 1 and \
                samples.get('bloomery:child_expert_rows{process="hosttier"}', 0) >= 1:
            break
        assert time.time() < deadline, "no child counters after a step in /metrics:\n" + text
        time.sleep(0.5)
    assert samples["bloomery:process_starts_total"] >= 1
    assert "bloomery:child_deaths_total" in samples
    assert 'bloomery:child_uptime_seconds{process="worker0"}' in samples


def test_unknown_route_is_404(url):
    assert_error(get(url, "/no/such/route"), 404)
    assert_error(post(url, "/v1/no-such-thing", {}), 404)


@pytest.mark.parametrize("path,word", [
    ("/embedding", "embeddings"), ("/embeddings", "embeddings"), ("/v1/embeddings", "embeddings"),
    ("/rerank", "reranking"), ("/reranking", "reranking"), ("/v1/rerank", "reranking"),
    ("/v1/reranking", "reranking"),
])
def test_embeddings_and_rerank_are_501(url, path, word):
    err = assert_error(post(url, path, {"input": "hello", "query": "q", "documents": ["d"]}), 501)
    assert word in err["message"]
    assert err["type"] == "not_supported_error"


def test_lora_adapters(url):
    """No adapters are loaded: the list is empty, [] sets nothing, an id is refused."""
    r = get(url, "/lora-adapters")
    assert r.status_code == 200 and r.json() == []
    r = post(url, "/lora-adapters", [])
    assert r.status_code == 200 and r.json() == {"success": True}
    err = assert_error(post(url, "/lora-adapters", [{"id": 0, "scale": 0.5}]), 400)
    assert "adapter id 0" in err["message"]
    assert_error(post(url, "/lora-adapters", {"id": 0}), 400)


def test_known_route_wrong_method(url):
    # llama-server answers 404 here; bloomery-serve documents 405 with Allow
    err = assert_error(get(url, "/v1/chat/completions"), 405)
    assert "POST" in err["message"]
    assert get(url, "/v1/chat/completions").headers.get("Allow") == "POST"
    assert_error(post(url, "/health", {}), 405)


def test_cors(url):
    r = get(url, "/health", headers={"Origin": "http://example.test"})
    assert r.headers.get("Access-Control-Allow-Origin") == "http://example.test"
    assert get(url, "/health").headers.get("Access-Control-Allow-Origin") == "*"
    import requests
    r = requests.options(url + "/v1/chat/completions", headers={"Origin": "http://example.test"}, timeout=10)
    assert r.status_code == 200
    assert r.headers.get("Access-Control-Allow-Credentials") == "true"
    assert "POST" in r.headers.get("Access-Control-Allow-Methods", "")


def test_metrics_of_the_disk_pager(servers):
    # --experts-ram 0: every expert through one slot; the hosttier's pager counts show
    # as bloomery:child_disk_* once the supervisor has asked for its Stats
    url = servers.start(["-np", "1", "-c", "1024", "-t", "1", "--experts-ram", "0"]).url
    r = post(url, "/completion", {"prompt": "Paging", "n_predict": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    deadline = time.time() + 6
    while True:
        _, text = metrics(url)
        samples = {}
        for line in text.splitlines():
            if line.startswith("bloomery:child_disk"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        if samples.get('bloomery:child_disk_expert_reads{process="hosttier"}', 0) >= 1:
            break
        assert time.time() < deadline, "no pager counters after a step in /metrics:\n" + text
        time.sleep(0.5)
    assert samples['bloomery:child_disk_expert_slots{process="hosttier"}'] == 1
    assert samples['bloomery:child_disk_read_bytes{process="hosttier"}'] > 0
    assert samples['bloomery:child_disk_read_us{process="hosttier"}'] > 0
    assert 'bloomery:child_disk_expert_hits{process="hosttier"}' in samples
