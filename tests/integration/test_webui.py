"""GET /: the chat page (router/webui/index.html): served as HTML, public beside API
keys, under --api-prefix, and its script is valid JavaScript that calls the routes
relative to the page."""
import os
import re
import shutil
import subprocess

import pytest

from sse import get

FAST = ["-np", "1", "-c", "512", "-t", "1"]


def test_page_is_served(url):
    for path in ("/", "/index.html"):
        r = get(url, path)
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/html")
        assert "<title>bloomery</title>" in r.text
        assert 'fetch("v1/chat/completions"' in r.text  # relative: works under a prefix


def test_page_script_is_valid_javascript(url, tmp_path):
    if not shutil.which("node"):
        pytest.skip("node is not installed")
    html = get(url, "/").text
    script = re.search(r"<script>(.*)</script>", html, re.S).group(1)
    path = tmp_path / "page.js"
    path.write_text(script)
    p = subprocess.run(["node", "--check", str(path)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert p.returncode == 0, p.stdout


def test_page_is_public_with_api_keys_and_moves_with_the_prefix(servers):
    srv = servers.start(FAST + ["--api-key", "k1", "--api-prefix", "/chat"])
    assert get(srv.url, "/chat/").status_code == 200
    assert get(srv.url, "/").status_code == 404
    assert get(srv.url, "/chat/props").status_code == 401
