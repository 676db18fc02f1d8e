"""Fields and routes llama-server has that clients and scripts use: the chat's
continue_final_message and --no-prefill-assistant, /slots?fail_on_no_slot, and the
Responses API over HTTP."""
import json
import threading
import time

import requests

from sse import post

FAST = ["-np", "1", "-c", "512", "-t", "1"]
CHAT = [{"role": "user", "content": "Name a river."}, {"role": "assistant", "content": "The longest river is"}]


def n_tokens(url, body):
    r = requests.post(url + "/v1/chat/completions/input_tokens", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["input_tokens"]


def test_continue_final_message_and_prefill_assistant(servers):
    """A last assistant message is continued by default (its turn left open) and with
    continue_final_message true; false closes it and opens a new turn, as does
    --no-prefill-assistant; a contradiction or a last message of another role is 400."""
    srv = servers.start(FAST)
    base = n_tokens(srv.url, {"messages": CHAT})
    assert n_tokens(srv.url, {"messages": CHAT, "continue_final_message": True}) == base
    closed = n_tokens(srv.url, {"messages": CHAT, "continue_final_message": False})
    assert closed > base
    for body, says in (({"messages": CHAT[:1], "continue_final_message": True}, "not the assistant's"),
                       ({"messages": CHAT, "continue_final_message": True, "add_generation_prompt": True},
                        "contradict"),
                       ({"messages": CHAT, "continue_final_message": "yes"}, "must be a boolean")):
        r = requests.post(srv.url + "/v1/chat/completions", json=dict(body, max_tokens=1), timeout=30)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    srv2 = servers.start(FAST + ["--no-prefill-assistant"])
    assert n_tokens(srv2.url, {"messages": CHAT}) == closed
    assert n_tokens(srv2.url, {"messages": CHAT, "continue_final_message": True}) == base


def test_slots_fail_on_no_slot(servers):
    """/slots?fail_on_no_slot answers 503 while every slot is busy, 200 otherwise."""
    srv = servers.start(FAST)
    assert requests.get(srv.url + "/slots?fail_on_no_slot=1", timeout=10).status_code == 200
    body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True}
    done = threading.Event()

    def long_request():
        with requests.post(srv.url + "/completion", json=body, stream=True, timeout=120) as r:
            for _ in r.iter_lines():
                pass
        done.set()

    t = threading.Thread(target=long_request)
    t.start()
    saw = None
    for _ in range(200):
        r = requests.get(srv.url + "/slots?fail_on_no_slot=1", timeout=10)
        if r.status_code == 503:
            saw = r
            break
        if done.is_set():
            break
        time.sleep(0.01)
    t.join()
    assert saw is not None, "the only slot was never seen busy"
    assert "no slot available" in saw.json()["error"]["message"]
    assert requests.get(srv.url + "/slots?fail_on_no_slot=1", timeout=10).status_code == 200
    assert requests.get(srv.url + "/slots", timeout=10).status_code == 200


def test_responses_over_http(servers):
    srv = servers.start(FAST)
    r = post(srv.url, "/v1/responses", {"input": "Hi", "max_output_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["object"] == "response" and j["status"] == "incomplete" and j["usage"]["output_tokens"] == 3
    r = requests.post(srv.url + "/v1/responses", json={"input": "Hi", "max_output_tokens": 3, "stream": True},
                      stream=True, timeout=60)
    names = [l[7:] for l in r.iter_lines(decode_unicode=True) if l.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete"), names
    r = requests.post(srv.url + "/v1/responses/input_tokens", json={"input": "Hi"}, timeout=30)
    assert r.json()["object"] == "response.input_tokens" and r.json()["input_tokens"] > 0
    r = requests.post(srv.url + "/v1/responses", json={"input": "Hi", "previous_response_id": "resp_x"}, timeout=30)
    assert r.status_code == 400 and "previous_response_id" in json.dumps(r.json())
