#!/usr/bin/env python3
"""A second opinion on the model families from llama.cpp's llama-server.

For each family, bloomery-mkmodel writes a tiny file; llama-server (a build of
llama.cpp given with --llama-server) and bloomery-serve load it, and both answer the
same prompts (token ids, greedy, one token by default, n_probs 10) through /completion. The
table compares, at every generated position, the chosen token and the log
probabilities of the tokens both list. llama.cpp must load every file (its tensor
names, shapes and keys are the reference for them); the answers must agree on the
chosen tokens except at near ties (both engines rank the two tokens within TIE of
each other), and the log-probability distances are printed for docs/models.md.

    tests/gpu/peer_families.py --llama-server PATH --bin BUILD/bin [--ngl 99]

--ngl is bloomery's (-ngl 0: the CPU worker); llama-server runs on the CPU (-ngl 0)
so its second opinion does not depend on its CUDA kernels. Exit status 1 when a
file does not load or a chosen token differs.

--f32 asks the question without rounding: every matrix of the files in f32 (gpt-oss's
experts too), both caches f32 and llama-server without flash attention (on the CPU
its flash attention gives the same f16 distances over an f32 cache). Both engines
then compute each family's meaning in f32, and any log probability further apart
than F32_LIMIT fails the family.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

FAMILIES = {
    "qwen3moe": ["--layers", "3", "--seed", "5"],
    "glm4moe": ["--arch", "glm4moe", "--layers", "3", "--seed", "7"],
    "deepseek2": ["--arch", "deepseek2", "--layers", "3", "--experts", "8", "--experts-used", "2",
                  "--groups", "4", "--groups-used", "2", "--yarn", "40", "--seed", "4"],
    # llama.cpp reads an uncompressed q (no attention.q_lora_rank) only at 26 or 27
    # layers, DeepSeek-V2-Lite's depth: the file has 27
    "deepseek2-legacy": ["--arch", "deepseek2", "--layers", "27", "--experts", "8", "--experts-used", "2",
                         "--groups", "4", "--groups-used", "2", "--yarn", "40", "--legacy-kv-b",
                         "--q-lora", "0", "--gating", "softmax", "--seed", "8"],
    "gpt-oss": ["--arch", "gpt-oss", "--layers", "3", "--experts", "8", "--experts-used", "2",
                "--swa", "4", "--yarn", "32"],
    # the hybrids: DeltaNet layers 0-2 and 4, gated attention in layer 3
    "qwen3next": ["--arch", "qwen3next", "--layers", "5", "--experts", "8", "--experts-used", "2", "--seed", "7"],
    "qwen35moe": ["--arch", "qwen35moe", "--layers", "5", "--experts", "8", "--experts-used", "2", "--seed", "7"],
}


TIE = 0.25  # log-probability gap under which two engines may pick either token
# --f32: llama.cpp and bloomery met within 2e-5 on every family's f32 file; a
# difference of meaning (a scale, a mask, a routing rule) moves them by far more
F32_LIMIT = 1e-3


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError("%s: HTTP %d: %s" % (url, e.code, e.read()[:400].decode("utf-8", "replace")))


def wait_ready(url, proc, limit=180):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.3)
    return False


def ask(url, prompt, n_predict):
    j = post(url + "/completion", {"prompt": prompt, "n_predict": n_predict, "n_probs": 10, "temperature": 0,
                                   "top_k": 1, "cache_prompt": False, "ignore_eos": True})
    steps = []
    for s in j.get("completion_probabilities", []):
        top = {t["id"]: t["logprob"] for t in s.get("top_logprobs", [])}
        steps.append((s["id"], top))
    return steps


def peer_answers(url, candidates, want, n_predict):
    """llama-server's answers to the first `want` candidate prompts it answers: it
    refuses (HTTP 500, "Content-only format") an answer that ends inside a UTF-8
    character, which a synthetic vocabulary's byte tokens make common."""
    got = []
    for p in candidates:
        try:
            steps = ask(url, p, n_predict)
            if steps:  # an end-of-generation token as the first choice gives none
                got.append((p, steps))
        except RuntimeError as e:
            if "Content-only" not in str(e):
                raise
        if len(got) == want:
            break
    return got


def serve(cmd, port, log):
    f = open(log, "w")
    p = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port)], stdout=f, stderr=subprocess.STDOUT)
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--bin", required=True, help="the folder with bloomery-serve and bloomery-mkmodel")
    ap.add_argument("--ngl", default="0")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--n-predict", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=12, help="prompts of random ids, 5 to 278 long")
    ap.add_argument("--verbose", action="store_true", help="each prompt's tokens and distance")
    ap.add_argument("--f32", action="store_true", help="f32 files, f32 caches, no flash attention: the engines' "
                    "meaning without their rounding (fails past F32_LIMIT)")
    ap.add_argument("--dump", help="a folder: each family's mkmodel arguments, prompts and both engines' top 10 "
                    "(FAMILY.json), to compare with the reference elsewhere")
    a = ap.parse_args()
    rng = random.Random(20261205)
    candidates = [[rng.randrange(0, 1000) for _ in range(5 + 7 * i)] for i in range(40)]
    tmp = tempfile.mkdtemp(prefix="bloomery-peer-")
    bad = 0
    rows = []
    for fam in a.families.split(","):
        path = os.path.join(tmp, fam + ".gguf")
        mk_args = FAMILIES[fam]
        if a.f32:
            mk_args = mk_args + ["--type", "f32"] + (["--type-experts", "f32"] if fam == "gpt-oss" else [])
        mk = subprocess.run([os.path.join(a.bin, "bloomery-mkmodel"), "-o", path, "--threads", "4"] + mk_args,
                            capture_output=True, text=True)
        if mk.returncode:
            print("%s: bloomery-mkmodel failed: %s" % (fam, mk.stderr.strip()[-300:]))
            bad += 1
            continue
        # -ngl 0 alone still sends a long prompt's products to a visible card:
        # --no-op-offload keeps llama-server on the CPU
        exact_l = ["-ctk", "f32", "-ctv", "f32", "-fa", "off"] if a.f32 else []
        ll = serve([a.llama_server, "-m", path, "-ngl", "0", "--no-op-offload", "-c", "2048", "-t", "8", "-np", "1",
                    "--chat-template", "chatml", "--no-jinja", "--reasoning-format", "none"] + exact_l,
                   18190, os.path.join(tmp, fam + ".llama.log"))
        bl = serve([os.path.join(a.bin, "bloomery-serve"), "-m", path, "-ngl", a.ngl, "-c", "2048", "-np", "1"] +
                   (["-ctk", "f32", "-ctv", "f32"] if a.f32 else []), 18191, os.path.join(tmp, fam + ".bloomery.log"))
        try:
            ok_l = wait_ready("http://127.0.0.1:18190", ll)
            ok_b = wait_ready("http://127.0.0.1:18191", bl)
            if not ok_l or not ok_b:
                for ok, who in ((ok_l, "llama"), (ok_b, "bloomery")):
                    if not ok:
                        with open(os.path.join(tmp, "%s.%s.log" % (fam, who))) as f:
                            tail = f.read()[-1500:]
                        print("%s: %s-server did not load the file:\n%s" % (fam, who, tail))
                bad += 1
                continue
            got = peer_answers("http://127.0.0.1:18190", candidates, a.prompts, a.n_predict)
            A = [g[1] for g in got]
            B = [ask("http://127.0.0.1:18191", g[0], a.n_predict) for g in got]
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                with open(os.path.join(a.dump, fam + ".json"), "w") as f:
                    json.dump({"mkmodel": mk_args, "prompts": [g[0] for g in got],
                               "llama": [[[t, {str(k): v for k, v in tp.items()}] for t, tp in x] for x in A],
                               "bloomery": [[[t, {str(k): v for k, v in tp.items()}] for t, tp in x] for x in B]},
                              f)
            same = total = ties = 0
            dsum = dmax = 0.0
            dn = 0
            for (pr, _), pa, pb in zip(got, A, B):
                if a.verbose:
                    ds = [abs(ta[t] - tb[t]) for (_, ta), (_, tb) in zip(pa, pb) for t in set(ta) & set(tb)]
                    print("%s: prompt of %d: tokens %s / %s, max |dlogprob| %.4f" % (
                        fam, len(pr), [x[0] for x in pa], [x[0] for x in pb], max(ds) if ds else float("nan")))
                for (ia, ta), (ib, tb) in zip(pa, pb):
                    total += 1
                    same += ia == ib
                    # a different choice where both engines rank the two within
                    # TIE of each other: random weights make near ties common
                    if ia != ib and ia in tb and ib in tb and ia in ta and ib in ta and \
                            abs(ta[ia] - ta[ib]) <= TIE and abs(tb[ia] - tb[ib]) <= TIE:
                        ties += 1
                    for t in set(ta) & set(tb):
                        d = abs(ta[t] - tb[t])
                        dsum += d
                        dmax = max(dmax, d)
                        dn += 1
                    if ia != ib:
                        break  # the continuations differ from here on
            mean = dsum / dn if dn else float("nan")
            rows.append((fam, same, total, ties, mean, dmax, dn))
            if same + ties != total or total == 0 or (a.f32 and dmax > F32_LIMIT):
                bad += 1
        finally:
            for p in (ll, bl):
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
    print("family            | same token | near ties | mean |dlogprob| | max |dlogprob| | pairs")
    for fam, same, total, ties, mean, dmax, dn in rows:
        dist = "%16.2e | %14.2e" if a.f32 else "%16.5f | %14.5f"
        print(("%-17s | %4d/%-5d | %9d | " + dist + " | %d") % (fam, same, total, ties, mean, dmax, dn))
    print("peer_families: %s (bloomery -ngl %s, llama-server -ngl 0%s)" % (
        "FAILED" if bad else "ok", a.ngl, "; f32 files, caches and products" if a.f32 else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
