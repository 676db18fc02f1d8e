"""API keys: --api-key and --api-key-file; `Authorization: Bearer KEY` or `x-api-key:
KEY`; /health, /v1/models and /models stay public, everything else answers 401."""
import pytest

from sse import assert_error, get, post

KEY = "test-key-5f2c"
BODY = {"prompt": "Hello", "n_predict": 1}


@pytest.fixture(scope="module")
def keyed(module_servers):
    return module_servers.start(["-np", "1", "-c", "512", "-t", "1", "--api-key", KEY])


def test_public_routes(keyed):
    assert get(keyed.url, "/health").status_code == 200
    assert get(keyed.url, "/v1/models").status_code == 200
    assert get(keyed.url, "/models").status_code == 200


@pytest.mark.parametrize("headers", [
    {},
    {"Authorization": "Bearer wrong-key"},
    {"Authorization": "Bearer " + KEY + "x"},
    {"Authorization": KEY},
    {"x-api-key": "wrong-key"},
    {"Authorization": "Bearer "},
])
def test_refused_without_the_key(keyed, headers):
    err = assert_error(post(keyed.url, "/completion", BODY, headers=headers), 401)
    assert err["type"] == "authentication_error"
    assert_error(post(keyed.url, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
                      headers=headers), 401)
    assert_error(get(keyed.url, "/props", headers=headers), 401)
    assert_error(get(keyed.url, "/slots", headers=headers), 401)


def test_bearer_key(keyed):
    r = post(keyed.url, "/completion", BODY, headers={"Authorization": "Bearer " + KEY})
    assert r.status_code == 200, r.text
    assert get(keyed.url, "/props", headers={"Authorization": "Bearer " + KEY}).status_code == 200


def test_x_api_key(keyed):
    r = post(keyed.url, "/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
             headers={"x-api-key": KEY})
    assert r.status_code == 200, r.text


def test_api_key_file(servers, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("first-key\nsecond-key\n")
    srv = servers.start(["-np", "1", "-c", "512", "-t", "1", "--api-key-file", str(keys)])
    for k in ("first-key", "second-key"):
        r = post(srv.url, "/completion", BODY, headers={"Authorization": "Bearer " + k})
        assert r.status_code == 200, (k, r.text)
    assert_error(post(srv.url, "/completion", BODY, headers={"Authorization": "Bearer third-key"}), 401)
    assert_error(post(srv.url, "/completion", BODY), 401)
