"""bloomery-serve's flags: llama-server's spellings in --help, an unknown flag (exit 2
naming it), a model that cannot load (a quick non-zero exit with the reason),
--config FILE (the command line wins), LLAMA_ARG_* variables, and placement flags
whose effect does not exist yet (refused by name)."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests

import serverctl
from sse import get, post

FAST = ["-np", "1", "-c", "512", "-t", "1"]


def run_serve(args, timeout=30, env=None):
    """Runs bloomery-serve to its end: (status, output, seconds). One that is still
    running after timeout is killed with everything below it, and the test fails."""
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.monotonic()
    p = subprocess.Popen([serverctl.program("bloomery-serve")] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", env=e,
                         stdin=subprocess.DEVNULL)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid, _, _ in serverctl.descendants(p.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        p.kill()
        out, _ = p.communicate()
        pytest.fail("bloomery-serve %s was still running after %d s:\n%s" % (" ".join(args), timeout, out))
    return p.returncode, out, time.monotonic() - t0


# every flag the issue lists, in llama-server's spelling
HELP_FLAGS = ["--experts-vram", "--experts-ram", "--no-residency", "-m", "--model", "-a", "--alias", "--host", "--port", "-c", "--ctx-size", "-np",
              "--parallel", "-n", "-t", "--threads", "-tb", "--threads-batch", "-b",
              "--batch-size", "-ub", "--ubatch-size", "--chat-template", "--chat-template-file",
              "--jinja", "--api-key", "--api-key-file", "--timeout", "--log-disable", "-v",
              "-ngl", "-ts", "-dev", "--cpu-moe", "--n-cpu-moe", "-ot", "--fit", "--config",
              "--workers"]


def test_help_lists_the_flags():
    rc, out, _ = run_serve(["--help"])
    assert rc == 0, out
    for f in HELP_FLAGS:
        assert any(tok.strip(",") == f for tok in out.replace("=", " ").split()), \
            "--help does not list %s" % f
    for env in ("LLAMA_ARG_MODEL", "LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_PORT",
                "LLAMA_API_KEY", "LLAMA_ARG_ALIAS"):
        assert env in out, "--help does not name %s" % env


@pytest.mark.parametrize("flag", ["--no-such-flag", "-zz", "--port-number"])
def test_unknown_flag(model, flag):
    rc, out, secs = run_serve(["-m", model, "--port", str(serverctl.free_port()), flag, "1"],
                              timeout=15)
    assert rc == 2, "exit %d for %s:\n%s" % (rc, flag, out)
    assert flag in out, "the message does not name %s: %s" % (flag, out)
    assert secs < 10


@pytest.mark.parametrize("args,names", [
    (["--port", "notaport"], ["--port"]),
    (["-c", "-5"], ["-c", "--ctx-size"]),
    (["-np", "0"], ["-np", "--parallel"]),
    (["--sleep-idle-seconds", "0"], ["--sleep-idle-seconds"]),
    (["--sleep-idle-seconds", "-2"], ["--sleep-idle-seconds"]),
    (["--sleep-idle-seconds", "soon"], ["--sleep-idle-seconds"]),
    (["--poll", "101"], ["--poll"]),
    (["--poll", "-1"], ["--poll"]),
    (["--cpu-strict", "2"], ["--cpu-strict"]),
    (["--experts-vram", "-5"], ["--experts-vram"]),
    (["--experts-vram", "12Q"], ["--experts-vram"]),
    (["--experts-vram", "1.5G"], ["--experts-vram"]),
    (["--experts-vram=99999999999G"], ["--experts-vram"]),
    (["--no-residency=1"], ["--no-residency"]),
])
def test_bad_flag_values(model, args, names):
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port())] + args, timeout=15)
    assert rc == 2, "exit %d for %r:\n%s" % (rc, args, out)
    assert any(n in out for n in names), "the message does not name %s: %s" % (args[0], out)


def test_missing_model_file(tmp_path):
    path = str(tmp_path / "no-such-model.gguf")
    rc, out, secs = run_serve(["-m", path, "--port", str(serverctl.free_port())] + FAST)
    assert rc == 1, out
    assert "no-such-model.gguf" in out, out
    assert secs < 15


@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_model_that_cannot_load(model, tmp_path, kind):
    bad = tmp_path / ("bad-%s.gguf" % kind)
    with open(model, "rb") as f:
        data = f.read()
    if kind == "truncated":
        bad.write_bytes(data[:len(data) // 3])
    else:
        bad.write_bytes(b"GGUF" + b"\xff" * 4096)
    srv = serverctl.Server(str(bad), FAST, log_dir=str(tmp_path))
    srv.launch()
    try:
        rc = srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        srv.kill()
        pytest.fail("bloomery-serve did not exit on a bad model within 20 s:\n" + srv.log())
    assert rc == 1, srv.log()
    log = srv.log()
    assert "bad-%s.gguf" % kind in log, "the reason does not name the file:\n" + log
    # nothing left behind by the failed start
    srv.tree = []
    shm = sorted(serverctl.shm_objects() - srv.shm_before)
    assert not shm, "left in /dev/shm: %r" % shm
    assert not serverctl.runtime_dirs(srv.pid, srv.dirs_before), "runtime folder left behind"


def test_config_file_and_command_line_wins(servers, tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"alias": "from-config", "ctx-size": 1024, "parallel": 1,
                               "threads": 1, "n-gpu-layers": 0, "cpu-moe": True, "fit": "on"}))
    # precedence: command line, then the file, then the environment
    srv = servers.start(["--config", str(cfg), "-c", "768"],
                        env={"LLAMA_ARG_ALIAS": "from-env", "LLAMA_ARG_CTX_SIZE": "640"})
    models = get(srv.url, "/v1/models").json()
    assert models["data"][0]["id"] == "from-config"
    slots = get(srv.url, "/slots").json()
    assert len(slots) == 1
    assert slots[0]["n_ctx"] == 768, "the command line's -c must win over the file's ctx-size"


def test_config_file_errors(model, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    port = ["--port", str(serverctl.free_port())]
    rc, out, _ = run_serve(["-m", model, "--config", str(bad)] + port, timeout=15)
    assert rc != 0 and "bad.json" in out, out
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"no-such-option": 1}))
    rc, out, _ = run_serve(["-m", model, "--config", str(unknown)] + port, timeout=15)
    assert rc == 2 and "no-such-option" in out, out
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"ctx-size": "lots"}))
    rc, out, _ = run_serve(["-m", model, "--config", str(typed)] + port, timeout=15)
    assert rc == 2 and "ctx-size" in out, out
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"config": str(typed)}))
    rc, out, _ = run_serve(["-m", model, "--config", str(nested)] + port, timeout=15)
    assert rc == 2 and "config" in out, out
    rc, out, _ = run_serve(["-m", model, "--config", str(tmp_path / "absent.json")] + port, timeout=15)
    assert rc != 0 and "absent.json" in out, out


def test_llama_arg_environment(servers):
    srv = servers.start(FAST + ["-a", "from-flag"], env={"LLAMA_ARG_ALIAS": "from-env",
                                                          "LLAMA_ARG_N_PARALLEL": "2"})
    assert get(srv.url, "/v1/models").json()["data"][0]["id"] == "from-flag"
    # -np 1 on the command line wins over LLAMA_ARG_N_PARALLEL
    assert len(get(srv.url, "/slots").json()) == 1
    srv2 = servers.start(["-c", "512", "-t", "1"], env={"LLAMA_ARG_ALIAS": "from-env",
                                                        "LLAMA_ARG_N_PARALLEL": "2"})
    assert get(srv2.url, "/v1/models").json()["data"][0]["id"] == "from-env"
    assert len(get(srv2.url, "/slots").json()) == 2


@pytest.mark.parametrize("value", ["99", "all"])
def test_gpu_layers_without_a_gpu_warn_and_use_the_cpu(servers, value):
    """As llama-server: a model card's -ngl 99 on a machine without a GPU runs on the
    CPU with a warning."""
    if serverctl.gpu_present():
        pytest.skip("a GPU is present: -ngl takes it")
    srv = servers.start(FAST + ["-ngl", value])
    assert "event=gpu_layers_ignored" in srv.log(), srv.log()
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 1}).status_code == 200


@pytest.mark.parametrize("args,names", [
    (["-ts", "1,1"], ["-ts", "tensor-split"]),
    (["-dev", "CUDA0"], ["-dev", "--device"]),
    (["-ot", "exps=CUDA0"], ["-ot", "override-tensor"]),
    (["-ctk", "q4_0", "-ctv", "q4_0"], ["-ctk", "cache-type-k"]),
    (["-ctk", "f16", "-ctv", "f32"], ["-ctv", "cache-type-v"]),
    (["--chat-template", "no-such-template"], ["no-such-template"]),
    (["--workers", "3"], ["--workers", "workers"]),  # the test model has 2 layers
    (["--samplers", "top_k;warp"], ["--samplers", "warp"]),
    (["--sampling-seq", "kq"], ["--sampling-seq"]),
    (["--samplers", "top_k", "--sampling-seq", "k"], ["--samplers"]),
    (["-fa", "maybe"], ["--flash-attn"]),
    (["--reasoning-format", "magic"], ["--reasoning-format"]),
    (["-nocb"], ["--no-cont-batching"]),
    (["-sm", "row"], ["--split-mode"]),
    (["-sm", "diagonal"], ["--split-mode"]),
    (["--context-shift"], ["--context-shift"]),
    (["--cache-reuse", "256"], ["--cache-reuse"]),
    (["--slots", "--no-slots"], ["--no-slots"]),
    (["--chat-template-kwargs", "[1]"], ["--chat-template-kwargs"]),
    (["--chat-template-kwargs", "{bad"], ["--chat-template-kwargs"]),
    (["--top-p", "1.5"], ["--top-p"]),
    (["--lora", "adapter.gguf"], ["--lora: LoRA"]),
    (["--mmproj", "mmproj.gguf"], ["--mmproj: multimodal"]),
    (["-md", "draft.gguf"], ["-md draft.gguf"]),
    (["--spec-type", "ngram-cache"], ["--spec-type ngram-cache"]),
    (["--embeddings"], ["--embeddings: embeddings"]),
    (["--rerank"], ["--rerank: reranking"]),
    (["--numa", "spread"], ["--numa"]),
    (["--slot-save-path", ""], ["--slot-save-path"]),
    (["--props"], ["--props"]),
    (["-nkvo"], ["--no-kv-offload"]),
    (["--override-kv", "a=int:1"], ["--override-kv"]),
    (["--rope-freq-base", "10000"], ["--rope-freq-base"]),
    (["--rope-scaling", "yarn"], ["--rope-scaling"]),
    (["--pooling", "mean"], ["--pooling"]),
    (["--models-dir", "/tmp"], ["--models-dir"]),
    (["--no-models-autoload"], ["--no-models-autoload"]),
    (["--media-path", "/tmp"], ["--media-path: multimodal"]),
    (["-dio"], ["--direct-io"]),
    (["-C", "zz"], ["--cpu-mask"]),
    (["-C", "0x0"], ["--cpu-mask"]),
    (["-Cr", "5-2"], ["--cpu-range"]),
    (["-Cr", "0-5000"], ["--cpu-range"]),
])
def test_refused_at_start_by_name(model, args, names):
    """Valid flags asking for what this build cannot do: status 1 (2 when the value
    itself does not parse), naming the flag, before anything loads."""
    if serverctl.gpu_present() and args[0] in ("-ngl", "-ts", "-dev", "-ot"):
        pytest.skip("a GPU is present: placement flags may have an effect here")
    rc, out, secs = run_serve(["-m", model, "--port", str(serverctl.free_port())] + FAST + args,
                              timeout=15)
    assert rc in (1, 2), "%r: exit %d:\n%s" % (args, rc, out)
    assert any(n in out for n in names), "the refusal does not name %r:\n%s" % (args[0], out)
    assert secs < 10


@pytest.mark.parametrize("args,says", [
    (["-ot", "exps"], "not REGEX=BUFFER_TYPE"),
    (["-ot", "blk\\.(=CPU"], "does not compile"),
    (["-ot", "no_such_tensor=CPU"], "matches no tensor"),
    (["-ot", "exps=GPU"], "is not CPU, CUDAn or HOSTTIER"),
    (["-ot", "blk\\.0\\.ffn_up_exps=HOSTTIER"], "gate, up and down"),
    (["-ot", "attn_q=HOSTTIER"], "only routed experts"),
    (["--n-cpu-moe", "3"], "the model has 2 layers"),
    (["-dev", "cuda0"], "no such device"),
    (["--fit", "maybe"], "not on or off"),
    (["-fitt", "512,1024"], "--fit-target"),
])
def test_placement_refused_with_the_reason(model, args, says):
    """The placement plan refuses what it cannot place, at start (status 1), with the
    flag and the reason."""
    if serverctl.gpu_present():
        pytest.skip("a GPU is present: the plan differs")
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port())] + args + FAST, timeout=15)
    assert rc == 1 and says in out, out


def test_placement_in_props(servers):
    """The plan is printed at start and shown in /props: -ot puts one layer's routed
    experts in the hosttier beside the CPU worker."""
    srv = servers.start(FAST + ["-ot", "blk\\.1\\.ffn_(gate|up|down)_exps=HOSTTIER"])
    p = get(srv.url, "/props").json()["placement"]
    assert [s["device"] for s in p["stages"]] == ["CPU"] and p["stages"][0]["layers"] == [0, 1], p
    assert p["host_expert_layers"] == [1] and p["hosttier"] is True and p["host_expert_bytes"] > 0, p
    assert "event=plan stage 0: layers 0..1 on the CPU" in srv.log(), srv.log()
    assert post(srv.url, "/completion", {"prompt": "Hello", "n_predict": 2}).status_code == 200


def test_template_flags_exclude_each_other(model, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0].content }}")
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--chat-template",
                            "chatml", "--chat-template-file", str(f)] + FAST, timeout=15)
    assert rc in (1, 2) and "chat-template" in out, out


def test_api_key_file_without_keys(model, tmp_path):
    f = tmp_path / "empty-keys.txt"
    f.write_text("\n\n")
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--api-key-file",
                            str(f)] + FAST, timeout=15)
    assert rc in (1, 2) and "empty-keys.txt" in out, out


def test_accepted_placement_flags(servers):
    """The placement flags whose effect is what the CPU build does anyway."""
    srv = servers.start(FAST + ["-ngl", "0", "-dev", "none", "--cpu-moe", "--n-cpu-moe", "2",
                                "-ot", "exps=CPU", "--fit", "on", "--jinja", "--metrics",
                                "-ctk", "q8_0", "-ctv", "q8_0"])
    r = post(srv.url, "/completion", {"prompt": "Hello", "n_predict": 2})
    assert r.status_code == 200, r.text


def test_sampling_flags_are_the_requests_defaults(servers):
    """--temp, --top-k, ... set what a request gets when it does not say; its own
    fields win. -fa, --no-mmap and --mlock are accepted (the CPU path computes the same;
    the weights are copied and locked, a refused lock only logged)."""
    srv = servers.start(FAST + ["--temp", "0", "--top-k", "7", "--top-p", "0.5", "--min-p",
                                "0.01", "--repeat-penalty", "1.1", "--repeat-last-n", "32",
                                "--presence-penalty", "0.25", "-s", "42",
                                "--samplers", "penalties;top_k;top_p;temperature",
                                "-fa", "on", "--no-mmap", "--mlock"])
    params = get(srv.url, "/props").json()["default_generation_settings"]["params"]
    assert params["temperature"] == 0 and params["top_k"] == 7 and params["seed"] == 42
    assert abs(params["top_p"] - 0.5) < 1e-6 and abs(params["min_p"] - 0.01) < 1e-6
    assert abs(params["repeat_penalty"] - 1.1) < 1e-6 and params["repeat_last_n"] == 32
    assert abs(params["presence_penalty"] - 0.25) < 1e-6
    assert params["samplers"] == ["penalties", "top_k", "top_p", "temperature"]
    body = {"prompt": "Once upon a time", "n_predict": 6, "ignore_eos": True,
            "cache_prompt": False}
    a = post(srv.url, "/completion", body).json()
    b = post(srv.url, "/completion", body).json()
    gs = a["generation_settings"]
    assert gs["temperature"] == 0 and gs["top_k"] == 7 and gs["seed"] == 42
    assert gs["samplers"] == ["penalties", "top_k", "top_p", "temperature"]
    assert a["content"] == b["content"]  # greedy by the server's default
    own = post(srv.url, "/completion", dict(body, temperature=0.9, top_k=3,
                                            samplers=["top_k"])).json()["generation_settings"]
    assert abs(own["temperature"] - 0.9) < 1e-6 and own["top_k"] == 3
    assert own["samplers"] == ["top_k"]
    assert "event=mlock" in srv.log()  # locked, or the refusal logged


def test_log_file_and_accepted_flags(servers, tmp_path):
    """--log-file takes the server's log and its processes'; -sm layer/none, -mg 0,
    -dt, --swa-full and --no-warmup are accepted; --poll 0 reaches the config line."""
    log = tmp_path / "serve.log"
    srv = servers.start(FAST + ["--log-file", str(log), "-sm", "none", "-mg", "0", "-dt", "0.1",
                                "--swa-full", "--no-warmup", "--poll", "0"])
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200
    text = log.read_text()
    assert "serve" in text and "event=listening" in text
    assert " poll=0 " in text
    assert "worker0" in text  # a child's lines


def test_log_file_that_cannot_open(model, tmp_path):
    bad = str(tmp_path / "no-such-dir" / "x.log")
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--log-file", bad]
                           + FAST, timeout=15)
    assert rc == 1 and "--log-file" in out and "no-such-dir" in out, out


def test_always_and_never_flags(servers):
    """-cb, --no-context-shift and --cache-reuse 0 describe what the server does
    anyway; --no-webui takes the chat page away; --no-slots turns GET /slots into a
    501 as llama-server does; --spm-infill puts the suffix first in FIM prompts."""
    srv = servers.start(FAST + ["-cb", "--no-context-shift", "--cache-reuse", "0", "--no-webui",
                                "--no-slots", "--spm-infill"])
    assert get(srv.url, "/").status_code == 404
    r = get(srv.url, "/slots")
    assert r.status_code == 501, r.text
    assert r.json()["error"]["type"] == "not_supported_error"
    r = post(srv.url, "/infill", {"input_prefix": "A", "input_suffix": "B", "n_predict": 1})
    assert r.status_code == 200, r.text
    p = r.json()["prompt"]
    assert p.index("<|fim_suffix|>B") < p.index("<|fim_prefix|>A") < p.index("<|fim_middle|>")


KW_TEMPLATE = ("{% for m in messages %}{{ m.content }}{% endfor %}"
               "|think={{ enable_thinking | default('unset') }}|x={{ x | default('unset') }}")


def test_chat_template_kwargs_and_reasoning_budget(servers):
    """--chat-template-kwargs and --reasoning-budget 0 reach the template under every
    request's own chat_template_kwargs."""
    srv = servers.start(FAST + ["--chat-template", KW_TEMPLATE, "--chat-template-kwargs",
                                '{"x": 5}', "--reasoning-budget", "0"])
    msgs = [{"role": "user", "content": "Hi"}]
    r = post(srv.url, "/apply-template", {"messages": msgs})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == "Hi|think=False|x=5"
    r = post(srv.url, "/apply-template", {"messages": msgs, "chat_template_kwargs":
                                          {"enable_thinking": True, "x": 6}})
    assert r.json()["prompt"] == "Hi|think=True|x=6"


def test_reasoning_format_none(servers):
    """--reasoning-format none leaves a <think> span in the content; a request's own
    reasoning_format still wins."""
    srv = servers.start(FAST + ["--reasoning-format", "none"])
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0, "logit_bias": {"<think>": 100}}
    r = post(srv.url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["content"].startswith("<think>") and not msg.get("reasoning_content")
    r = post(srv.url, "/v1/chat/completions", dict(body, reasoning_format="auto"))
    msg = r.json()["choices"][0]["message"]
    assert not msg["content"].startswith("<think>")


TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")
CONV = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
RENDERED = "[system] Be brief.\n[user] Hi there\n[assistant] "


def test_predict_cap_template_and_log_disable(servers):
    srv = servers.start(FAST + ["-n", "3", "--chat-template", TEMPLATE, "--log-disable"])
    r = post(srv.url, "/completion", {"prompt": "Hello", "n_predict": 10, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["timings"]["predicted_n"] == 3, "-n 3 must cap n_predict"
    r = post(srv.url, "/v1/chat/completions", {"messages": CONV, "max_tokens": 10, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    r = post(srv.url, "/apply-template", {"messages": CONV})
    assert r.json()["prompt"] == RENDERED
    assert get(srv.url, "/props").json()["chat_template"] == TEMPLATE
    n = len(post(srv.url, "/tokenize", {"content": RENDERED}).json()["tokens"])
    r = post(srv.url, "/v1/chat/completions/input_tokens", {"messages": CONV})
    assert r.json()["input_tokens"] == n
    log = srv.log()
    assert "event=" not in log, "--log-disable still wrote log lines:\n" + log


def test_api_prefix_moves_every_route(servers):
    srv = servers.start(FAST + ["--api-prefix", "/api/v2"])
    base = srv.url + "/api/v2"
    assert get(base, "/health").status_code == 200
    assert get(srv.url, "/health").status_code == 404
    assert get(srv.url, "/api/v2").status_code == 404
    assert get(srv.url, "/api/v2health").status_code == 404
    r = post(base, "/v1/chat/completions", {"messages": CONV, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert post(srv.url, "/v1/chat/completions", {"messages": CONV}).status_code == 404
    r = get(base, "/completion")
    assert r.status_code == 405 and "/completion" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("value", ["v2", "/v2/", "/a//b", "/a b", "/a?b"])
def test_api_prefix_that_is_no_path(model, value):
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--api-prefix",
                            value] + FAST, timeout=15)
    assert rc == 2 and "--api-prefix" in out, out


def test_log_verbosity_colors_and_threads_http(servers, tmp_path):
    """-lv 2 keeps warnings and errors only, in every process; --log-colors on colours
    the level names; --threads-http is accepted and says why it changes nothing."""
    srv = servers.start(FAST + ["-lv", "2", "--log-colors", "on", "--threads-http", "4"])
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 1}).status_code == 200
    log = srv.log()
    # no INFO line of the server, nor of its children (worker0 event=ready)
    assert "event=listening" not in log and "INFO" not in log, log
    srv2 = servers.start(FAST + ["-lv", "4", "--log-colors", "on", "--threads-http", "4",
                                 "--keep", "16"])
    assert post(srv2.url, "/completion", {"prompt": "Hi", "n_predict": 1}).status_code == 200
    log = srv2.log()
    assert "\033[2mDEBUG\033[0m serve event=task_start" in log, log
    assert "\033[32mINFO \033[0m worker0 event=ready" in log, log
    assert "\033[32mINFO \033[0m serve event=flag_accepted flag=--threads-http" in log, log
    assert "flag=--keep value=16" in log, log
    srv3 = servers.start(FAST + ["-lv", "0"])
    assert srv3.log() == "", srv3.log()


@pytest.mark.parametrize("args,name", [(["--log-colors", "sometimes"], "--log-colors"),
                                       (["-lv", "x"], "--verbosity")])
def test_bad_log_flags(model, args, name):
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port())] + args + FAST,
                           timeout=15)
    assert rc == 2 and name in out, out


def test_chat_template_file(servers, tmp_path):
    f = tmp_path / "tpl.jinja"
    f.write_text(TEMPLATE)
    srv = servers.start(FAST + ["--chat-template-file", str(f)])
    assert post(srv.url, "/apply-template", {"messages": CONV}).json()["prompt"] == RENDERED


def test_chat_template_that_does_not_parse(model, tmp_path):
    f = tmp_path / "broken.jinja"
    f.write_text("{% for m in messages %}{{ m.content ")
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--chat-template-file",
                            str(f)] + FAST, timeout=15)
    assert rc != 0, out
    assert "broken.jinja" in out or "template" in out.lower(), out


def test_list_devices_version_and_described_flags(servers, model):
    """--list-devices and --version print and exit 0; --no-mmproj, --no-op-offload, -cram 0 and
    -ctxcp describe what happens anyway; --prio -1 lowers the whole set of processes."""
    rc, out, _ = run_serve(["--list-devices"], timeout=15)
    assert rc == 0 and out.startswith("Available devices:"), out
    rc, out, _ = run_serve(["--version"], timeout=15)
    assert rc == 0 and out.startswith("bloomery-serve "), out
    srv = servers.start(FAST + ["--no-mmproj", "--no-op-offload", "-cram", "0", "-ctxcp", "4", "--prio", "-1"])
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 1}).status_code == 200
    for pid, name, _ in [(srv.pid, "bloomery-serve", 0)] + srv.children():
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        assert int(fields[16]) == 5, "%s (pid %d) runs at nice %s" % (name, pid, fields[16])


def test_sleep_idle_seconds_unloads_and_the_next_request_reloads(servers):
    """--sleep-idle-seconds N: idle N seconds, the model's processes exit (/props says
    is_sleeping); the next request loads them again and gets the same greedy answer."""
    srv = servers.start(["-np", "1", "--sleep-idle-seconds", "1"])
    body = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0, "cache_prompt": True}
    first = requests.post(srv.url + "/completion", json=body, timeout=60)
    assert first.status_code == 200, first.text
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        props = requests.get(srv.url + "/props", timeout=5).json()
        if props.get("is_sleeping") and srv.child("bloomery-worker") is None and \
                "event=sleeping" in srv.log():
            break
        time.sleep(0.2)
    else:
        pytest.fail("no sleep within 20 s: is_sleeping %r, children %r\n%s"
                    % (props.get("is_sleeping"), srv.children(), srv.log()))
    health = requests.get(srv.url + "/health", timeout=5)
    assert health.status_code == 200, health.text  # asleep is not unhealthy
    again = requests.post(srv.url + "/completion", json=body, timeout=120)
    assert again.status_code == 200, again.text
    assert again.json()["content"] == first.json()["content"]
    assert again.json()["timings"]["cache_n"] == 0  # the caches went with the processes
    assert requests.get(srv.url + "/props", timeout=5).json()["is_sleeping"] is False
    assert srv.child("bloomery-worker") is not None
    assert "event=waking" in srv.log()


def test_sigterm_while_asleep_exits_cleanly(servers):
    """A server whose processes sleep stops as any other: exit 0, nothing left behind
    (the factory checks both when the test ends)."""
    srv = servers.start(["-np", "1", "--sleep-idle-seconds", "1"])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if requests.get(srv.url + "/props", timeout=5).json().get("is_sleeping"):
            break
        time.sleep(0.2)
    else:
        pytest.fail("no sleep within 20 s\n%s" % srv.log())
    problems = srv.stop()
    assert not problems, "%s\n%s" % (problems, srv.log())


def test_cpu_mask_and_strict_reach_every_process(servers):
    """-C (here: the first CPU this test may use) becomes the affinity of the server
    and of every process it starts; --cpu-strict 1 is logged and the server serves."""
    allowed = sorted(os.sched_getaffinity(0))
    first = allowed[0]
    srv = servers.start(FAST + ["-C", "%x" % (1 << first), "--cpu-strict", "1"])
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200
    assert "event=cpu_affinity cpus=%d strict=1" % first in srv.log()
    procs = [srv.pid] + [p for p, _, _ in serverctl.descendants(srv.pid)]
    assert len(procs) >= 2, procs
    for pid in procs:
        assert os.sched_getaffinity(pid) == {first}, (pid, os.sched_getaffinity(pid))


@pytest.mark.parametrize("mode", ["distribute", "isolate", "numactl"])
def test_numa_modes_start_and_serve(servers, mode):
    """--numa takes llama.cpp's three modes: the server logs what it chose (on this
    one-node machine every CPU stays), the processes it starts inherit the CPUs, and
    it serves."""
    allowed = os.sched_getaffinity(0)
    srv = servers.start(FAST + ["--numa", mode])
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200
    assert "event=numa mode=%s" % mode in srv.log()
    for pid in [srv.pid] + [p for p, _, _ in serverctl.descendants(srv.pid)]:
        assert os.sched_getaffinity(pid) <= allowed, pid


@pytest.mark.parametrize("args,env,says", [
    (["--experts-vram", "512"], None, "residency=on experts_vram=536870912"),
    (["--experts-vram", "2G"], None, "residency=on experts_vram=2147483648"),
    (["--experts-vram", "auto"], None, "residency=on experts_vram=auto"),
    (["--experts-vram", "0"], None, "residency=on experts_vram=0"),
    (["--no-residency"], None, "residency=off experts_vram=auto"),
    ([], {"BLOOMERY_EXPERTS_VRAM": "64K", "BLOOMERY_NO_RESIDENCY": "1"}, "residency=off experts_vram=65536"),
])
def test_residency_flags_reach_the_worker(servers, args, env, says):
    """--experts-vram and --no-residency (or their variables) are taken on the CPU,
    where there is no card to hold slots, and reach the worker in its Plan: the
    server's config line and the worker's ready line name them; it serves, and
    /metrics has no slots to show."""
    srv = servers.start(FAST + args, env=env)
    assert post(srv.url, "/completion", {"prompt": "Hi", "n_predict": 2}).status_code == 200
    log = srv.log(20000)
    config = [l for l in log.splitlines() if "event=config " in l]
    ready = [l for l in log.splitlines() if " worker0 event=ready " in l]
    assert config and config[0].endswith(" " + says), log
    assert ready and ready[0].endswith(" " + says), log
    if not serverctl.gpu_present():
        assert "bloomery:child_expert_slots" not in get(srv.url, "/metrics").text


def test_experts_ram_pages_from_disk_with_the_same_output(servers):
    """--experts-ram below the routed experts' bytes moves them to the hosttier, which
    keeps that much in RAM and reads the rest from the model file as they are called:
    the plan and /props say how much is on disk, and greedy text is the same as with
    every expert in RAM (the same bytes, the same kernels). BLOOMERY_EXPERTS_RAM is
    the same flag; 0 is one expert at a time."""
    if serverctl.gpu_present():
        pytest.skip("a GPU is present: the plan differs")
    body = {"prompt": "Once upon a time", "n_predict": 12, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False}
    plain = servers.start(FAST)
    want = post(plain.url, "/completion", body).json()["content"]
    p = get(plain.url, "/props").json()["placement"]
    assert p["host_expert_disk_bytes"] == 0 and p["hosttier"] is False, p
    for args, env in ((["--experts-ram", "0"], None), ([], {"BLOOMERY_EXPERTS_RAM": "64K"})):
        srv = servers.start(FAST + args, env=env)
        p = get(srv.url, "/props").json()["placement"]
        assert p["hosttier"] is True and p["host_expert_disk_bytes"] > 0, p
        assert p["host_expert_ram_bytes"] + p["host_expert_disk_bytes"] == p["host_expert_bytes"], p
        assert "on disk" in srv.log() and "event=pager slots=" in srv.log(), srv.log()
        # the first fill of the slots is reported as the hosttier's "fill" stage
        assert re.search(r"event=load_progress process=hosttier stage=fill done=(\d+) total=\1 ", srv.log()), srv.log()
        assert post(srv.url, "/completion", body).json()["content"] == want


@pytest.mark.parametrize("paged,change", [(False, "touch"), (True, "append"), (True, "replace")])
def test_a_model_file_changed_under_the_server_stops_it(servers, model, tmp_path, paged, change):
    """A model file rewritten (its modification time), grown or replaced since the
    start is noticed within seconds, with the pager or without: the server logs
    event=model_changed naming the file and what changed, and exits with status 1
    rather than go on with weights other than those it loaded."""
    copy = tmp_path / "m.gguf"
    with open(model, "rb") as f:
        data = f.read()
    copy.write_bytes(data)
    srv = servers.start(FAST + (["--experts-ram", "0"] if paged else []), model=str(copy))
    body = {"prompt": "Hi", "n_predict": 2, "cache_prompt": False}
    assert post(srv.url, "/completion", body).status_code == 200
    if change == "touch":
        st = os.stat(copy)
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        says = "was modified"
    elif change == "append":
        with open(copy, "ab") as f:
            f.write(b"\0" * 4096)
        says = "changed size"
    else:
        new = tmp_path / "new.gguf"
        new.write_bytes(data)
        os.replace(new, copy)
        says = "was replaced"
    try:
        rc = srv.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the server went on after its model file changed:\n" + srv.log())
    log = srv.log(20000)
    assert rc == 1, log
    lines = [l for l in log.splitlines() if "event=model_changed" in l]
    assert lines and str(copy) in lines[0] and says in lines[0], log
    assert "start it again" in log, log


@pytest.mark.parametrize("value", ["-1", "12Q", "1.5G"])
def test_experts_ram_refuses_bad_sizes(model, value):
    rc, out, _ = run_serve(["-m", model, "--port", str(serverctl.free_port()), "--experts-ram", value] + FAST,
                           timeout=15)
    assert rc in (1, 2) and "--experts-ram" in out, out
