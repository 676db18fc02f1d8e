#!/usr/bin/env python3
"""bloomery-serve end to end on a CUDA card: starts the server on the trained oracle
model with the GPU chosen as llama-server would (-ngl default), checks that the worker
runs on the card, that a chat request answers the oracle's greedy fortune (streamed and
not), and that SIGTERM stops everything with exit 0. Python stdlib only (the GPU machine
has no requests). Prints TAP; exit status 1 on a failure.

    tests/gpu/serve_e2e.py BIN_DIR MODEL.gguf
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# ../shared/oracle/README.md: the trained MoE model's greedy answer to this question.
QUESTION = "Tell me a fortune."
ANSWER = "The only thing that is to be done in the world is to be a good idea."

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print("%s %d - %s" % ("ok" if ok else "not ok", len(results), name))
    if not ok and detail:
        for line in str(detail).splitlines()[:20]:
            print("# " + line)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def request(url, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stream(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, done = "", False
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices", []):
                text += ch.get("delta", {}).get("content") or ""
    return text, done


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, model = sys.argv[1], sys.argv[2]
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    log = tempfile.NamedTemporaryFile(prefix="serve-e2e-", suffix=".log", delete=False)
    srv = subprocess.Popen([os.path.join(bin_dir, "bloomery-serve"), "-m", model, "--port",
                            str(port), "-np", "2", "-c", "4096", "-v"],
                           stdout=log, stderr=subprocess.STDOUT)
    print("1..6")
    try:
        deadline = time.time() + 180
        status = 0
        while time.time() < deadline and srv.poll() is None:
            try:
                status, _ = request(url + "/health", timeout=5)
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.5)
        check("the server becomes healthy", status == 200, open(log.name).read()[-3000:])
        if status != 200:
            return 1
        text = open(log.name).read()
        ready = [l for l in text.splitlines() if " worker0 event=ready " in l]
        on_card = bool(ready) and "kernels=avx2" not in ready[0] and "kernels=ref" not in ready[0]
        check("the worker runs on the card and no hosttier starts",
              on_card and "process=hosttier" not in text, text[-3000:])

        body = {"messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
                "max_tokens": 64}
        st, out = request(url + "/v1/chat/completions", body)
        msg = json.loads(out)["choices"][0]["message"] if st == 200 else {}
        check("chat answers the oracle's greedy fortune",
              st == 200 and msg.get("content", "").strip() == ANSWER,
              "status %d: %s" % (st, out[:1000]))
        check("the empty think span is not in the content",
              "<think>" not in msg.get("content", "") and not (msg.get("reasoning_content") or "").strip(),
              json.dumps(msg)[:1000])

        text, done = stream(url + "/v1/chat/completions", dict(body, stream=True))
        check("streamed chat gives the same answer and [DONE]", done and text.strip() == ANSWER,
              repr(text[:500]))
    finally:
        if srv.poll() is None:
            srv.send_signal(signal.SIGTERM)
            try:
                rc = srv.wait(timeout=30)
            except subprocess.TimeoutExpired:
                srv.kill()
                rc = "hung"
        else:
            rc = srv.returncode
    check("SIGTERM: exit 0", rc == 0, "exit %s; log:\n%s" % (rc, open(log.name).read()[-2000:]))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
