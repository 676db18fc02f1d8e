"""Fields and routes llama-server has that clients and scripts use: the chat's
continue_final_message and --no-prefill-assistant, /slots?fail_on_no_slot, and the
Responses API over HTTP."""
import json
import threading
import time

import requests

from sse import metric, post

FAST = ["-np", "1", "-c", "512", "-t", "1"]


def lines_of(r):
    """A stream's lines, split at its line feeds only (random text may hold U+2028,
    which str.splitlines would also split at)."""
    return [l.decode("utf-8") for l in r.iter_lines()]
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
    names = [l[7:] for l in lines_of(r) if l.startswith("event: ")]
    assert names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete"), names
    r = requests.post(srv.url + "/v1/responses/input_tokens", json={"input": "Hi"}, timeout=30)
    assert r.json()["object"] == "response.input_tokens" and r.json()["input_tokens"] > 0
    r = requests.post(srv.url + "/v1/responses", json={"input": "Hi", "previous_response_id": "resp_x"}, timeout=30)
    assert r.status_code == 400 and "previous_response_id" in json.dumps(r.json())


def test_n_choices(servers):
    """n > 1 on the OpenAI routes: the choices one after another, each with its index
    and finish_reason, usage counting all of them; streamed, each choice ends with its
    own finish_reason and the stream with one [DONE]; a fixed seed gives the same
    choices again."""
    srv = servers.start(FAST)
    body = {"prompt": "Once upon a time", "n": 3, "max_tokens": 4, "ignore_eos": True, "seed": 11}
    r = requests.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2], r
    assert all(c["finish_reason"] == "length" for c in r["choices"])
    assert r["usage"]["completion_tokens"] == 12
    again = requests.post(srv.url + "/v1/completions", json=body, timeout=60).json()
    assert [c["text"] for c in again["choices"]] == [c["text"] for c in r["choices"]]
    s = requests.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "n": 2,
                                                               "max_tokens": 3, "stream": True}, stream=True, timeout=60)
    lines = [l for l in lines_of(s) if l.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and sum(l == "data: [DONE]" for l in lines) == 1
    chunks = [json.loads(l[6:]) for l in lines[:-1]]
    ends = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert ends == [0, 1], chunks
    for bad in ({"n": 0}, {"n": 65}, {"n": 2, "n_cmpl": 3}):
        e = requests.post(srv.url + "/v1/completions", json=dict({"prompt": "x", "max_tokens": 1}, **bad), timeout=30)
        assert e.status_code == 400, e.text
    e = requests.post(srv.url + "/completion", json={"prompt": "x", "n": 2}, timeout=30)
    assert e.status_code == 400 and "'n'" in e.text


def test_return_progress(servers):
    """return_progress: while the prompt is evaluated, chunks with prompt_progress
    (total, cache, processed, time_ms) after each step, processed growing to total."""
    srv = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-b", "64", "-ub", "64"])
    prompt = "word " * 200
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 1}),
                       ("/completion", {"prompt": prompt, "n_predict": 1, "cache_prompt": False})):
        r = requests.post(srv.url + path, json=dict(body, stream=True, return_progress=True), stream=True, timeout=60)
        prog = [json.loads(l[6:])["prompt_progress"] for l in lines_of(r)
                if l.startswith("data: ") and "prompt_progress" in l]
        assert len(prog) >= 3, prog
        done = [p["processed"] for p in prog]
        assert done == sorted(done) and done[-1] == prog[-1]["total"], prog
        assert all(p["cache"] == prog[0]["cache"] and p["time_ms"] >= 0 for p in prog)
    r = requests.post(srv.url + "/completion", json={"prompt": prompt, "n_predict": 1, "return_progress": True},
                      timeout=60)
    assert r.status_code == 200 and "prompt_progress" not in r.text  # streams only


def test_path_serves_a_folder_in_place_of_the_page(servers, tmp_path, model):
    """--path: GET / is the folder's index.html and other files by name, public as the
    built-in page (the API still asks for its key); nothing outside the folder (.., a
    link out), no folder, no missing file; a missing folder stops the start."""
    import os
    import subprocess
    import serverctl
    site = tmp_path / "site"
    (site / "js").mkdir(parents=True)
    (site / "index.html").write_text("<h1>mine</h1>")
    (site / "js" / "app.js").write_text("console.log(1)")
    os.symlink("/etc/hostname", site / "out")
    srv = servers.start(FAST + ["--path", str(site), "--api-key", "k"])
    r = requests.get(srv.url + "/", timeout=10)
    assert r.status_code == 200 and r.text == "<h1>mine</h1>" and r.headers["Content-Type"].startswith("text/html")
    r = requests.get(srv.url + "/js/app.js", timeout=10)
    assert r.status_code == 200 and r.text == "console.log(1)" and "javascript" in r.headers["Content-Type"]
    for p in ("/out", "/js", "/nope.txt", "/js/../../etc/hostname", "/%2e%2e/etc/hostname"):
        assert requests.get(srv.url + p, timeout=10).status_code == 404, p
    assert requests.get(srv.url + "/props", timeout=10).status_code == 401
    assert requests.get(srv.url + "/v1/models", timeout=10).status_code == 200
    p = subprocess.run([serverctl.program("bloomery-serve"), "-m", model, "--port", "0", "--path", str(tmp_path / "no")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1 and "--path" in p.stderr and "not a folder" in p.stderr, p.stderr


def test_verbose_replies_carry_the_completion_object(servers):
    """Under -v (or -lv above 9) llama-server adds "__verbose", its /completion
    object, to the OpenAI completion replies; not otherwise."""
    plain = servers.start(FAST)
    verbose = servers.start(FAST + ["-lv", "10"])
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    cmpl = {"prompt": "The old lighthouse", "max_tokens": 4}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", cmpl)):
        r = post(plain.url, path, body)
        assert r.status_code == 200 and "__verbose" not in r.json(), r.text
        r = post(verbose.url, path, body)
        assert r.status_code == 200, r.text
        v = r.json()["__verbose"]
        assert v["tokens_predicted"] == r.json()["usage"]["completion_tokens"], v
        assert "generation_settings" in v and "stop_type" in v and "content" in v, v


def test_reasoning_format_deepseek_legacy(servers):
    """deepseek-legacy fills reasoning_content and keeps the thought, tags and all, in
    the content; deepseek only splits it out; none leaves it."""
    srv = servers.start(FAST)
    text = "<think>plan it</think>Hello"
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 60,
            "grammar": 'root ::= "%s"' % text}
    want = {"deepseek-legacy": ("plan it", text), "deepseek": ("plan it", "Hello"), "none": (None, text)}
    for fmt, (reason, content) in want.items():
        r = post(srv.url, "/v1/chat/completions", dict(body, reasoning_format=fmt))
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert msg.get("reasoning_content") == reason, (fmt, msg)
        assert msg["content"] == content, (fmt, msg)
    legacy = servers.start(FAST + ["--reasoning-format", "deepseek-legacy"])
    msg = post(legacy.url, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert msg.get("reasoning_content") == "plan it" and msg["content"] == text, msg


def test_kv_unified_with_one_slot(servers):
    """-kvu with one slot is what the slot has anyway: the server starts and serves."""
    srv = servers.start(FAST + ["-kvu"])
    r = post(srv.url, "/completion", {"prompt": "The old lighthouse", "n_predict": 4})
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] == 4, r.text


KVU_PROMPTS = [("Tell me about the lighthouse keepers of the north coast and their long winters. " * k)
               for k in (2, 9, 14, 5, 12, 16)]


def test_kv_unified_slots_share_one_cache(servers):
    """-kvu with four slots: one cache of ctx-size positions that the slots take in
    chunks as they grow, so that each may use all of it. Six concurrent requests on a
    cache too small for them all at once (prompts wait, idle slots give their chunks
    back, caches move and compact) answer exactly as one slot alone does."""
    import concurrent.futures
    body = lambda p: {"prompt": p, "n_predict": 40, "temperature": 0, "cache_prompt": True}
    ref = servers.start(["-np", "1", "-c", "1024", "-t", "1"])
    want = [post(ref.url, "/completion", body(p)).json()["content"] for p in KVU_PROMPTS]
    srv = servers.start(["-np", "4", "-c", "1024", "-t", "1", "-kvu"])
    assert "event=kv_unified positions=1024 slots=4" in srv.log(200000)
    props = requests.get(srv.url + "/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 1024, props
    for _ in range(2):  # the second round meets the first one's cached prompts
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda p: post(srv.url, "/completion", body(p)).json(), KVU_PROMPTS))
        for g, w in zip(got, want):
            assert g.get("content") == w, (g, w)
    # one prompt of most of the cache: every other slot's cache gives way
    long_p = "The sea was calm and the lamp burned through the night. " * 60
    r = post(srv.url, "/completion", {"prompt": long_p, "n_predict": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["tokens_evaluated"] > 512, r.json()
    assert metric(srv.url, "kv_evictions_total") >= 1
    assert metric(srv.url, "kv_preemptions_total") >= 0


def test_prompt_cache_in_host_ram(servers):
    """-cram (on by default): a prompt that another request pushed out of the only slot
    starts again from its saved state, with the same reply; -cram 0 turns it off."""
    long_a = "Tell me about the history of the lighthouse on the northern cape, and its keepers. " * 3
    long_b = "A different request entirely, about rivers, mountains and the sea in winter. " * 3
    body = lambda p: {"prompt": p, "n_predict": 8, "temperature": 0, "cache_prompt": True}
    for flags, on in ((FAST, True), (FAST + ["-cram", "0"], False)):
        srv = servers.start(flags)
        first = post(srv.url, "/completion", body(long_a)).json()
        post(srv.url, "/completion", body(long_b))
        again = post(srv.url, "/completion", body(long_a)).json()
        assert again["content"] == first["content"], (first, again)
        n = again["tokens_evaluated"]
        if on:
            assert again["timings"]["cache_n"] == n - 1, again["timings"]
            assert metric(srv.url, "prompt_cache_hits_total") == 1
            assert metric(srv.url, "prompt_cache_saves_total") >= 2
            assert metric(srv.url, "prompt_cache_bytes") > 0
        else:
            assert again["timings"]["cache_n"] == 0, again["timings"]
            assert metric(srv.url, "prompt_cache_hits_total") == 0


def test_slot_files_save_restore_erase(servers, tmp_path):
    """--slot-save-path: a slot's cache saved to a file and restored into another slot
    (the next prompt there starts from it), erased; names with a path, missing,
    damaged, cut or foreign files refused with 400 and the reason; the folder is
    made if missing."""
    folder = tmp_path / "slots" / "deeper"
    srv = servers.start(["-np", "2", "-c", "2048", "-t", "1", "-cram", "0", "--slot-save-path", str(folder)])
    assert folder.is_dir()
    prompt = "What is the capital of France? Tell me about the lighthouse keepers. " * 4
    body = {"prompt": prompt, "n_predict": 8, "id_slot": 1, "cache_prompt": True, "temperature": 0}
    cold = post(srv.url, "/completion", body).json()
    r = post(srv.url, "/slots/1?action=save", {"filename": "slot1.bin"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 1 and saved["filename"] == "slot1.bin", saved
    assert saved["n_saved"] == cold["tokens_evaluated"] + 7, (saved, cold)
    assert saved["n_written"] == (folder / "slot1.bin").stat().st_size and "save_ms" in saved["timings"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], list(folder.iterdir())
    r = post(srv.url, "/slots/0?action=restore", {"filename": "slot1.bin"})
    assert r.status_code == 200, r.text
    rest = r.json()
    assert rest["n_restored"] == saved["n_saved"] and rest["n_read"] == saved["n_written"], rest
    warm = post(srv.url, "/completion", dict(body, id_slot=0)).json()
    assert warm["content"] == cold["content"], (warm, cold)
    assert warm["timings"]["prompt_n"] == 1 and warm["tokens_cached"] >= cold["tokens_evaluated"] - 1, warm
    r = post(srv.url, "/slots/0?action=erase", None)
    assert r.status_code == 200 and r.json()["n_erased"] >= saved["n_saved"], r.text
    again = post(srv.url, "/completion", dict(body, id_slot=0)).json()
    assert again["timings"]["prompt_n"] == cold["timings"]["prompt_n"], again["timings"]
    data = (folder / "slot1.bin").read_bytes()
    (folder / "cut.bin").write_bytes(data[:-5])
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x10
    (folder / "damaged.bin").write_bytes(bytes(damaged))
    foreign = bytearray(data)
    foreign[0:8] = b"GGUFjunk"
    (folder / "foreign.bin").write_bytes(bytes(foreign))
    for name, needle in (("../slot1.bin", "Invalid filename"), ("a/b", "Invalid filename"),
                         ("", "Invalid filename"), ("missing.bin", "No such file"),
                         ("cut.bin", "cut short"), ("damaged.bin", "damaged"),
                         ("foreign.bin", "not a slot file")):
        r = post(srv.url, "/slots/0?action=restore", {"filename": name})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (name, r.text)
    for path, body_, needle in (("/slots/0?action=save", {}, "filename"),
                                ("/slots/9?action=erase", None, "Invalid slot ID"),
                                ("/slots/x?action=erase", None, "Invalid slot ID"),
                                ("/slots/0?action=fly", None, "Invalid action"),
                                ("/slots/0", None, "Invalid action")):
        r = post(srv.url, path, body_)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (path, r.text)
    # a file of another model is refused by name
    other = servers.start(["-np", "1", "-c", "2048", "-t", "1", "--slot-save-path", str(folder),
                           "-ctk", "f32", "-ctv", "f32"])
    r = post(other.url, "/slots/0?action=restore", {"filename": "slot1.bin"})
    assert r.status_code == 400 and "another type" in r.json()["error"]["message"], r.text


def test_prompt_cache_on_disk_survives_a_restart(servers, tmp_path):
    """--cache-disk: what a finished request leaves in its slot is written to the folder
    (by the stages, after the reply); after a restart the same prompt starts from it
    with the same reply; a damaged part is refused, never loaded: the prompt runs whole
    and a fresh entry replaces it; half-written files and parts without a meta file
    are removed at start; the budget holds the folder down."""
    import glob
    import os
    folder = tmp_path / "pcd"
    flags = ["-np", "1", "-c", "2048", "-t", "1", "--cache-disk", str(folder)]
    prompt = "Tell me about the history of the lighthouse on the northern cape, and its keepers. " * 5
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": True}
    srv = servers.start(flags)
    cold = post(srv.url, "/completion", body).json()
    for _ in range(100):  # the part is written off the request's path
        if glob.glob(str(folder / "pc-*.L*")) and not glob.glob(str(folder / "*.tmp")):
            break
        time.sleep(0.05)
    assert metric(srv.url, "prompt_cache_disk_saves_total") == 1
    srv.stop()
    (folder / "pc-77.L0-2").write_bytes(b"an orphan part")
    (folder / "pc-78.meta.tmp").write_bytes(b"a write cut short")
    srv = servers.start(flags)
    assert not (folder / "pc-77.L0-2").exists() and not (folder / "pc-78.meta.tmp").exists()
    assert metric(srv.url, "prompt_cache_disk_entries") == 1
    warm = post(srv.url, "/completion", body).json()
    assert warm["content"] == cold["content"], (warm, cold)
    assert warm["timings"]["prompt_n"] == 1, warm["timings"]
    assert metric(srv.url, "prompt_cache_disk_hits_total") == 1
    srv.stop()
    for f in glob.glob(str(folder / "pc-*.L*")):
        b = bytearray(open(f, "rb").read())
        b[len(b) - 3] ^= 1
        open(f, "wb").write(bytes(b))
    srv = servers.start(flags)
    again = post(srv.url, "/completion", body).json()
    assert again["content"] == cold["content"], again
    assert again["timings"]["prompt_n"] == cold["timings"]["prompt_n"], again["timings"]
    assert metric(srv.url, "prompt_cache_disk_refused_total") == 1
    srv.stop()
    # a budget smaller than one entry keeps only the newest
    srv = servers.start(flags + ["--cache-disk-size", "0"])
    post(srv.url, "/completion", dict(body, prompt=prompt + " And the sea."))
    time.sleep(0.3)
    assert metric(srv.url, "prompt_cache_disk_entries") == 1
    assert len(glob.glob(str(folder / "pc-*.meta"))) == 1, os.listdir(folder)
