#!/usr/bin/env python3
"""bloomery-serve end to end on a CUDA card: starts the server on the trained oracle
model with the GPU chosen as llama-server would (-ngl default), then with routed
experts in host RAM beside it (--cpu-moe, -ncmoe 2, --fit with a margin that leaves
too little for every expert), checks each time that the worker runs on the card (and
the hosttier beside it), that a chat request answers the oracle's greedy fortune
(streamed and not), and that SIGTERM stops everything with exit 0. Python stdlib only (the GPU machine
has no requests). Prints TAP; exit status 1 on a failure.

    tests/gpu/serve_e2e.py BIN_DIR MODEL.gguf
"""
import json
import re
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


def run(bin_dir, model, extra, hosttier):
    """One server on the card with extra placement flags: healthy, on the card (with
    or without a hosttier, as the plan says), the oracle's fortune answered plain and
    streamed, exit 0 on SIGTERM."""
    what = " ".join(extra) or "the whole model on the card"
    port = free_port()
    url = "http://127.0.0.1:%d" % port
    log = tempfile.NamedTemporaryFile(prefix="serve-e2e-", suffix=".log", delete=False)
    srv = subprocess.Popen([os.path.join(bin_dir, "bloomery-serve"), "-m", model, "--port",
                            str(port), "-np", "2", "-c", "4096", "-v"] + extra,
                           stdout=log, stderr=subprocess.STDOUT)
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
        check("%s: the server becomes healthy" % what, status == 200, open(log.name).read()[-3000:])
        if status != 200:
            return
        text = open(log.name).read()
        ready = [l for l in text.splitlines() if " worker0 event=ready " in l]
        on_card = bool(ready) and not re.search(r"kernels=(ref|avx2|avx512)\b", ready[0])
        for line in text.splitlines():
            if "event=plan " in line:
                print("# " + line[line.index("event=plan ") + 11:])
        if hosttier is None:  # what --fit chose is printed above
            check("%s: a stage runs on the card" % what, "kernels=NVIDIA" in text or on_card, text[-3000:])
        else:
            check("%s: the worker runs on the card, %s" % (what, "with a hosttier" if hosttier else "no hosttier"),
                  on_card and ("process=hosttier" in text) == hosttier, text[-3000:])

        body = {"messages": [{"role": "user", "content": QUESTION}], "temperature": 0,
                "max_tokens": 64}
        st, out = request(url + "/v1/chat/completions", body)
        msg = json.loads(out)["choices"][0]["message"] if st == 200 else {}
        check("%s: chat answers the oracle's greedy fortune" % what,
              st == 200 and msg.get("content", "").strip() == ANSWER,
              "status %d: %s" % (st, out[:1000]))
        check("%s: the empty think span is not in the content" % what,
              "<think>" not in msg.get("content", "") and not (msg.get("reasoning_content") or "").strip(),
              json.dumps(msg)[:1000])

        text, done = stream(url + "/v1/chat/completions", dict(body, stream=True))
        check("%s: streamed chat gives the same answer and [DONE]" % what, done and text.strip() == ANSWER,
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
    check("%s: SIGTERM: exit 0" % what, rc == 0, "exit %s; log:\n%s" % (rc, open(log.name).read()[-2000:]))
    return open(log.name).read()


def mib(num, unit):
    return float(num) * (1024 if unit == "GiB" else 1)


def card_need(log):
    """From the whole-card run's plan line: (MiB a stage needs on the card without
    its routed experts, MiB of routed experts), or None."""
    m = re.search(r"stage 0: .* weights ([0-9.]+) (MiB|GiB) \(routed experts ([0-9.]+) (MiB|GiB)\), "
                  r"KV ([0-9.]+) (MiB|GiB), scratch ~([0-9.]+) (MiB|GiB)", log or "")
    if not m:
        return None
    w, r, kv, sc = (mib(m.group(i), m.group(i + 1)) for i in (1, 3, 5, 7))
    return w - r + kv + sc, r


def free_mib(bin_dir):
    """CUDA0's free memory in MiB, as bloomery-worker --list-devices reports it."""
    out = subprocess.run([os.path.join(bin_dir, "bloomery-worker"), "--list-devices"], stdout=subprocess.PIPE,
                         text=True, timeout=60).stdout.split()
    return int(out[3]) >> 20 if len(out) >= 4 and out[0] == "cuda" else 0


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, model = sys.argv[1], sys.argv[2]
    print("1..25")
    need = card_need(run(bin_dir, model, [], False))
    run(bin_dir, model, ["--cpu-moe"], True)
    run(bin_dir, model, ["-ncmoe", "2"], True)
    # --fit with a margin that leaves the card what the whole-card plan needs without
    # its routed experts and 90 % of them: a hybrid plan also holds one host layer's
    # experts for the prompt offload, so about half the layers' experts go to host
    # RAM and the rest stay (the plan's choice is printed, the answers must hold)
    leave = need[0] + need[1] * 0.9 if need else 400
    log = run(bin_dir, model, ["--fit", "on", "-fitt", str(max(free_mib(bin_dir) - int(leave), 0))], None)
    m = re.search(r"routed experts in host RAM [0-9.]+ \S+ \(([0-9]+) of ([0-9]+) layers", log or "")
    check("--fit: some layers' experts in host RAM, not all", bool(m) and 0 < int(m.group(1)) < int(m.group(2)),
          m.group(0) if m else "no plan line (whole-card plan: %s)" % (need,))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
