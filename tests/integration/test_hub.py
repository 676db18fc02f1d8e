"""-hf against a stand-in Hugging Face hub on 127.0.0.1: the API calls (branch list,
paginated file list), the choice of file, the cache layout (refs, blobs, snapshot
links), resumed and corrupt downloads, tokens, --offline and the fall-back to the
cache when the hub cannot be reached, and bloomery-serve naming the model after -hf.
"""
import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import urllib.parse

import pytest

import serverctl
from sse import get

COMMIT = "3c5e1f0a9b8d7c6e5f4a3b2c1d0e9f8a7b6c5d4e"
TOKEN = "hf_" + "x" * 34


class Hub:
    """A threaded HTTP server with the hub's routes for one repository per name.
    repos[name] = {path: bytes}; knobs change how it answers."""

    def __init__(self):
        self.repos = {}
        self.files = {}  # /files/NAME, for --model-url
        self.requests = []  # (method, path, headers)
        self.need_token = False
        self.page_size = 1000
        self.cut_first_download = False  # close the first download halfway
        self.corrupt = set()  # paths served with other bytes than listed
        self.extra_tree = []  # raw items added to the file list
        self.tree_body = None  # replaces the file list's body
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send_json(self, status, obj, extra=()):
                body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                hub.requests.append(("GET", self.path, dict(self.headers)))
                if hub.need_token and self.headers.get("Authorization") != "Bearer " + TOKEN:
                    return self.send_json(401, {"error": "Invalid credentials in Authorization header"})
                u = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(u.query)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/refs", u.path)
                if m:
                    if m.group(1) not in hub.repos:
                        return self.send_json(404, {"error": "Repository not found"})
                    return self.send_json(200, {"branches": [
                        {"name": "main", "ref": "refs/heads/main", "targetCommit": COMMIT}],
                        "converts": [], "tags": []})
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([0-9a-f]{40})", u.path)
                if m:
                    if hub.tree_body is not None:
                        return self.send_json(200, hub.tree_body)
                    items = hub.tree(m.group(1))
                    start = int(q.get("cursor", ["0"])[0])
                    page = items[start:start + hub.page_size]
                    extra = []
                    if start + hub.page_size < len(items):
                        nxt = "http://%s/api/models/%s/tree/%s?recursive=true&cursor=%d" % (
                            self.headers["Host"], m.group(1), COMMIT, start + hub.page_size)
                        extra.append(("Link", '<%s>; rel="next"' % nxt))
                    return self.send_json(200, page, extra)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([0-9a-f]{40})/(.+)", u.path)
                if m:  # the hub sends large files elsewhere
                    path = urllib.parse.unquote(m.group(3))
                    data = hub.repos.get(m.group(1), {}).get(path)
                    if data is None:
                        return self.send_json(404, {"error": "Entry not found"})
                    self.send_response(302)
                    self.send_header("Location", "/cdn/%s/%s" % (m.group(1), urllib.parse.quote(path)))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                m = re.fullmatch(r"/files/(.+)", u.path)
                if m:  # plain files, for --model-url
                    data = hub.files.get(urllib.parse.unquote(m.group(1)))
                    if data is None:
                        return self.send_json(404, {"error": "no such file"})
                    return self.send_file(data)
                m = re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", u.path)
                if m:
                    path = urllib.parse.unquote(m.group(2))
                    data = hub.repos[m.group(1)][path]
                    if path in hub.corrupt:
                        data = bytes(b ^ 1 for b in data)
                    return self.send_file(data)
                self.send_json(404, {"error": "no route"})

            def send_file(self, data):
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                body = data[start:]
                if hub.cut_first_download:
                    hub.cut_first_download = False
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def tree(self, repo):
        items = [{"type": "directory", "path": "sub", "oid": "0" * 40, "size": 0}]
        for path, data in sorted(self.repos.get(repo, {}).items()):
            item = {"type": "file", "path": path, "oid": hashlib.sha1(data).hexdigest(),
                    "size": len(data)}
            if path.endswith(".gguf"):
                item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                               "pointerSize": 134}
            items.append(item)
        return items + self.extra_tree

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def hub(model, tmp_path):
    data = open(model, "rb").read()
    h = Hub()
    h.repos["test/tiny-GGUF"] = {
        "README.md": b"# tiny\n",
        "tiny-Q8_0.gguf": data,
        "tiny-Q4_K_M.gguf": data,
        "mmproj-tiny-F16.gguf": b"not a model",
        "split/tiny-Q6_K-00001-of-00002.gguf": data[:1000],
        "split/tiny-Q6_K-00002-of-00002.gguf": data[1000:2000],
    }
    h.cache = str(tmp_path / "cache")
    h.env = dict(os.environ, MODEL_ENDPOINT=h.url, LLAMA_CACHE=h.cache)
    h.env.pop("HF_TOKEN", None)
    yield h
    h.stop()


def cli(hub, *args, env=None):
    e = dict(hub.env)
    e.update(env or {})
    p = subprocess.run([serverctl.program("bloomery-cli"), "-p", "Hello", "-n", "1", "-t", "1",
                        "--temp", "0"] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       errors="replace", env=e, timeout=120)
    return p.returncode, p.stdout


def repo_dir(hub):
    return os.path.join(hub.cache, "models--test--tiny-GGUF")


def snapshot(hub, path):
    return os.path.join(repo_dir(hub), "snapshots", COMMIT, path)


def downloads(hub):
    return [r for r in hub.requests if "/resolve/" in r[1] or r[1].startswith("/cdn/")]


def test_hf_downloads_the_default_quant_into_the_hub_cache(hub, model):
    rc, out = cli(hub, "-hf", "test/tiny-GGUF")
    assert rc == 0, out
    with open(os.path.join(repo_dir(hub), "refs", "main")) as f:
        assert f.read() == COMMIT
    final = snapshot(hub, "tiny-Q4_K_M.gguf")
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    assert os.readlink(final) == "../../blobs/" + sha
    assert open(final, "rb").read() == open(model, "rb").read()
    assert not os.path.exists(snapshot(hub, "tiny-Q8_0.gguf"))
    assert not [n for n in os.listdir(os.path.join(repo_dir(hub), "blobs")) if n.endswith(".incomplete")]
    # nothing but the chosen file was fetched; no token was sent
    got = [r[1] for r in hub.requests if r[1].startswith("/cdn/")]
    assert got == ["/cdn/test/tiny-GGUF/tiny-Q4_K_M.gguf"], got
    assert not any("Authorization" in r[2] for r in hub.requests)
    assert any(r[2].get("User-Agent", "").startswith("bloomery/") for r in hub.requests)

    # a second run finds the file: the API is asked again, nothing is downloaded
    n = len(downloads(hub))
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:q4_k_m")
    assert rc == 0, out
    assert len(downloads(hub)) == n


def test_hf_quant_tag_and_hf_file_choose_the_file(hub):
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    assert os.path.islink(snapshot(hub, "tiny-Q8_0.gguf"))
    assert not os.path.exists(snapshot(hub, "tiny-Q4_K_M.gguf"))
    rc, out = cli(hub, "-hf", "test/tiny-GGUF", "-hff", "TINY-Q4_K_M.gguf")
    assert rc == 0, out
    assert os.path.islink(snapshot(hub, "tiny-Q4_K_M.gguf"))
    # both files have the same bytes: one blob
    assert len(os.listdir(os.path.join(repo_dir(hub), "blobs"))) == 1


def test_hf_unknown_quant_names_the_files_there(hub):
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q5_K_M")
    assert rc == 1, out
    assert "Q5_K_M" in out and "tiny-Q8_0.gguf" in out, out
    rc, out = cli(hub, "-hf", "test/tiny-GGUF", "-hff", "nope.gguf")
    assert rc == 1 and "nope.gguf" in out, out
    rc, out = cli(hub, "-hf", "test/absent")
    assert rc == 1 and "not found" in out and "test/absent" in out, out


def test_hf_downloads_every_part_of_a_split_model(hub):
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q6_K")
    # the parts are slices of a model, so loading fails; both parts must be there
    files = hub.repos["test/tiny-GGUF"]
    for k in (1, 2):
        p = "split/tiny-Q6_K-0000%d-of-00002.gguf" % k
        assert os.readlink(snapshot(hub, p)) == "../../../blobs/" + hashlib.sha256(files[p]).hexdigest()
        assert open(snapshot(hub, p), "rb").read() == files[p]
    assert rc == 1, out


def test_hf_resumes_a_cut_download(hub, model):
    hub.cut_first_download = True
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    assert "hub_retry" in out, out
    ranges = [r[2].get("Range") for r in hub.requests if r[1].startswith("/cdn/")]
    size = len(open(model, "rb").read())
    assert ranges[0] is None and ranges[1] == "bytes=%d-" % (size // 2), ranges
    assert open(snapshot(hub, "tiny-Q8_0.gguf"), "rb").read() == open(model, "rb").read()


def download_lines(out, name):
    return [dict(kv.split("=", 1) for kv in line.split("event=download ", 1)[1].split())
            for line in out.splitlines() if "event=download file=%s " % name in line]


def test_hf_download_progress_lines(hub, model):
    """Away from a terminal a download writes event=download lines: the first at 0, the
    last at the whole size, each with the rate and the time left; a download that a
    previous run left cut says where it resumed."""
    size = len(open(model, "rb").read())
    rc, out = cli(hub, "-hf", "test/tiny-GGUF")
    assert rc == 0, out
    lines = download_lines(out, "tiny-Q4_K_M.gguf")
    assert len(lines) >= 2, out
    assert lines[0]["done"] == "0" and lines[0]["total"] == str(size), lines
    assert lines[-1]["done"] == str(size) and lines[-1]["eta_s"] == "0.0", lines
    for ln in lines:
        float(ln["rate_mib_s"])
        assert ln["eta_s"] == "?" or float(ln["eta_s"]) >= 0
        assert "resumed_from" not in ln
    # another quant, half of it left by an earlier run
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    blobs = os.path.join(repo_dir(hub), "blobs")
    shutil.rmtree(blobs)
    shutil.rmtree(os.path.join(repo_dir(hub), "snapshots"))
    os.makedirs(blobs)
    with open(os.path.join(blobs, sha + ".incomplete"), "wb") as f:
        f.write(open(model, "rb").read()[:size // 2])
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    lines = download_lines(out, "tiny-Q8_0.gguf")
    assert lines and lines[0]["done"] == str(size // 2) and lines[0]["resumed_from"] == str(size // 2), out
    assert lines[-1]["done"] == str(size), lines
    ranges = [r[2].get("Range") for r in hub.requests if r[1] == "/cdn/test/tiny-GGUF/tiny-Q8_0.gguf"]
    assert ranges == ["bytes=%d-" % (size // 2)], ranges


def test_hf_refuses_a_copy_whose_sha256_differs(hub):
    hub.corrupt.add("tiny-Q8_0.gguf")
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 1, out
    assert "SHA-256" in out and "tiny-Q8_0.gguf" in out, out
    assert not os.path.lexists(snapshot(hub, "tiny-Q8_0.gguf"))
    blobs = os.path.join(repo_dir(hub), "blobs")
    assert not os.path.isdir(blobs) or os.listdir(blobs) == []


def test_hf_token_is_sent_and_a_gated_repo_says_so(hub):
    hub.need_token = True
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 1, out
    assert "--hf-token" in out and "401" in out, out
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0", "-hft", TOKEN)
    assert rc == 0, out
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q4_K_M", env={"HF_TOKEN": TOKEN})
    assert rc == 0, out
    assert all(r[2].get("Authorization") == "Bearer " + TOKEN for r in hub.requests[1:])


def test_hf_offline_and_unreachable_hub_use_the_cache(hub):
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0", "--offline")
    assert rc == 1 and "--offline" in out and "not in the cache" in out, out
    assert hub.requests == []
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    n = len(hub.requests)
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0", "--offline")
    assert rc == 0, out
    assert len(hub.requests) == n
    hub.stop()
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    assert "hub_offline" in out and "source=cache" in out, out
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q4_K_M")  # never downloaded
    assert rc == 1 and "the cache: " in out and "the hub: " in out, out
    assert "Q4_K_M" in out and "Couldn't connect" in out, out
    hub.cache += "-empty"  # nothing cached: the hub's failure and the empty cache
    hub.env["LLAMA_CACHE"] = hub.cache
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 1 and "no cached copy" in out, out


def test_hf_file_list_pages_and_unsafe_entries(hub):
    hub.page_size = 2
    hub.extra_tree = [
        {"type": "file", "path": "../../../escape-Q2_K.gguf", "oid": "1" * 40, "size": 4},
        {"type": "file", "path": "/abs-Q3_K.gguf", "oid": "1" * 40, "size": 4},
        {"type": "file", "path": "bad-oid-Q5_0.gguf", "oid": "../../x", "size": 4},
    ]
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 0, out
    pages = [r[1] for r in hub.requests if "/tree/" in r[1]]
    assert len(pages) >= 3, pages
    for tag in ("Q2_K", "Q3_K", "Q5_0"):
        rc, out = cli(hub, "-hf", "test/tiny-GGUF:" + tag)
        assert rc == 1 and "has no GGUF model file" in out, out
    assert not os.path.exists(os.path.join(hub.cache, "escape-Q2_K.gguf"))
    assert "unsafe_path" in out and "bad_oid" in out, out


def test_hf_malformed_replies_are_errors(hub):
    hub.tree_body = b"{not json"
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 1 and "not JSON" in out, out
    hub.tree_body = {"a": 1}
    rc, out = cli(hub, "-hf", "test/tiny-GGUF:Q8_0")
    assert rc == 1 and "not a JSON array" in out, out


@pytest.mark.parametrize("args,needle", [
    (["-hf", "no-slash"], "USER/MODEL"),
    (["-hf", "a/b:Q4 K"], "quant"),
    (["-hf", "a/b", "-m", "x.gguf"], "not both"),
    (["-hff", "x.gguf", "-m", "x.gguf"], "--hf-file needs"),
    (["-hf", "a/b", "-hft", "two words"], "--hf-token"),
])
def test_hf_bad_flags(hub, args, needle):
    rc, out = cli(hub, *args)
    assert rc in (1, 2) and needle in out, out
    assert hub.requests == []


def test_serve_hf_names_the_model_after_the_repository(hub, servers):
    srv = servers.start(["-hf", "test/tiny-GGUF:Q8_0", "-np", "1", "-c", "512", "-t", "1"],
                        model="", env={"MODEL_ENDPOINT": hub.url, "LLAMA_CACHE": hub.cache})
    r = get(srv.url, "/v1/models")
    assert r.status_code == 200, r.text
    assert r.json()["data"][0]["id"] == "test/tiny-GGUF:Q8_0", r.text
    assert "event=hub_model" in srv.log()


def test_serve_hf_download_bar_on_a_terminal(hub, model):
    """On a terminal a download is a bar that ends with the bytes, the time and the
    rate; no event=download line is written there."""
    port = serverctl.free_port()
    text = serverctl.run_on_terminal([serverctl.program("bloomery-serve"), "-hf", "test/tiny-GGUF", "--port",
                                      str(port), "-np", "1", "-c", "512", "-t", "1"], b"ready: open", env=hub.env)
    size = len(open(model, "rb").read())
    assert re.search(r"downloading tiny-Q4_K_M\.gguf \[#+\] 100%  [0-9.]+ [KM]iB in [0-9.]+ s", text), text
    assert "event=download " not in text, text
    assert "ready: open" in text, text
    assert os.path.getsize(snapshot(hub, "tiny-Q4_K_M.gguf")) == size


def test_serve_hf_failure_exits_with_the_reason(hub, servers):
    srv = servers.launch(["-hf", "test/tiny-GGUF:Q5_K_M", "-np", "1", "-c", "512"], model="",
                         env={"MODEL_ENDPOINT": hub.url, "LLAMA_CACHE": hub.cache})
    assert srv.proc.wait(60) == 1
    assert "Q5_K_M" in srv.log(), srv.log()


def test_model_url_downloads_once_to_the_cache_or_to_m(hub, model, tmp_path):
    data = open(model, "rb").read()
    hub.files["tiny.gguf"] = data
    url = hub.url + "/files/tiny.gguf?download=1#frag"
    rc, out = cli(hub, "-mu", url)
    assert rc == 0, out
    assert open(os.path.join(hub.cache, "tiny.gguf"), "rb").read() == data
    n = len(hub.requests)
    rc, out = cli(hub, "-mu", url)  # there already: no request
    assert rc == 0 and len(hub.requests) == n, out
    dest = tmp_path / "sub" / "mine.gguf"
    rc, out = cli(hub, "-mu", url, "-m", str(dest))
    assert rc == 0, out
    assert dest.read_bytes() == data
    rc, out = cli(hub, "-mu", hub.url + "/files/other.gguf", "--offline")
    assert rc == 1 and "--offline" in out, out


def test_model_url_split_parts_and_errors(hub, model):
    data = open(model, "rb").read()
    hub.files["big-00001-of-00002.gguf"] = data[:1000]
    hub.files["big-00002-of-00002.gguf"] = data[1000:3000]
    rc, out = cli(hub, "-mu", hub.url + "/files/big-00001-of-00002.gguf")
    for k, part in ((1, data[:1000]), (2, data[1000:3000])):
        p = os.path.join(hub.cache, "big-0000%d-of-00002.gguf" % k)
        assert open(p, "rb").read() == part, out
    assert rc == 1, out  # slices of a model do not load
    rc, out = cli(hub, "-mu", hub.url + "/files/big-00002-of-00002.gguf")
    assert rc == 1 and "first part" in out, out
    rc, out = cli(hub, "-mu", hub.url + "/files/missing.gguf")
    assert rc == 1 and "404" in out, out
    assert not os.path.exists(os.path.join(hub.cache, "missing.gguf"))
    for bad, needle in (("ftp://x/y.gguf", "http(s)"), (hub.url + "/files/", "names no file"),
                        (hub.url + "/files/a b.gguf", "no spaces")):
        rc, out = cli(hub, "-mu", bad)
        assert rc == 1 and needle in out, out
    rc, out = cli(hub, "-mu", hub.url + "/files/x.gguf", "-hf", "a/b")
    assert rc in (1, 2) and "not both" in out, out
