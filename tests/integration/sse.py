"""HTTP helpers of the integration tests: JSON requests and reading Server-Sent Events.

Owns: parsing an SSE body into events (llama-server sends `data: {...}` lines for
OpenAI and its own routes, `event: NAME` + `data:` pairs for Anthropic's), and
checking llama-server's error JSON {"error": {"code", "message", "type"}}.
"""
import json

import requests

TIMEOUT = 60


class Event:
    def __init__(self, name, data):
        self.name = name      # the `event:` field, or None
        self.data = data      # the joined `data:` lines (text)

    @property
    def done(self):
        return self.data.strip() == "[DONE]"

    def json(self):
        return json.loads(self.data)

    @property
    def error(self):
        """The error object when this event reports one, else None."""
        try:
            d = json.loads(self.data)
        except ValueError:
            return None
        if isinstance(d, dict) and isinstance(d.get("error"), dict):
            return d["error"]
        if self.name == "error" and isinstance(d, dict):
            return d
        return None

    def __repr__(self):
        return "Event(%r, %r)" % (self.name, self.data[:200])


def iter_events(resp):
    """Yields the events of a streamed response as they arrive."""
    name, data = None, []
    for raw in resp.iter_lines(decode_unicode=False):
        line = raw.decode("utf-8")  # a stream must be valid UTF-8: this raises if not
        if line == "":
            if data:
                yield Event(name, "\n".join(data))
            name, data = None, []
            continue
        if line.startswith(":"):
            continue  # comment (keep-alive)
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
        elif field == "error":
            # older llama-server wrote stream errors as `error: {json}`
            name, data = "error", [value]
    if data:
        yield Event(name, "\n".join(data))


def post(base, path, body, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return requests.post(base + path, json=body, **kw)


def metric(base, name):
    """The value of bloomery:NAME in the server's /metrics."""
    for line in requests.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith("bloomery:" + name + " "):
            return float(line.split()[1])
    raise AssertionError("no metric " + name)


def get(base, path, **kw):
    kw.setdefault("timeout", TIMEOUT)
    return requests.get(base + path, **kw)


def stream(base, path, body, **kw):
    """POSTs body with stream on and returns (response, [events]) once the stream ends."""
    kw.setdefault("timeout", TIMEOUT)
    body = dict(body, stream=True)
    with requests.post(base + path, json=body, stream=True, **kw) as r:
        if r.status_code != 200:
            r.content  # read the error body before the connection closes
            return r, []
        assert r.headers.get("Content-Type", "").startswith("text/event-stream"), r.headers
        return r, list(iter_events(r))


def data_events(events):
    """The JSON payloads of the events up to `data: [DONE]` (which must be last if present)."""
    out = []
    for i, ev in enumerate(events):
        if ev.done:
            assert i == len(events) - 1, "data: [DONE] is not the last event: %r" % events[i:]
            break
        out.append(ev.json())
    return out


def assert_error(r, status, *words):
    """r answered status with llama-server's error JSON whose message names every word
    (case-insensitive). Anthropic's own form, {"type": "error", "error": {"type",
    "message"}}, is accepted too (routes under /v1/messages may answer in it)."""
    assert r.status_code == status, "expected %d, got %d: %s" % (status, r.status_code, r.text[:500])
    try:
        body = r.json()
    except ValueError:
        raise AssertionError("error body is not JSON: %r" % r.text[:500])
    err = body.get("error") if isinstance(body, dict) else None
    assert isinstance(err, dict), "no error object: %r" % body
    path = r.request.path_url if r.request is not None else ""
    if not (path.startswith("/v1/messages") and body.get("type") == "error" and "code" not in err):
        assert err.get("code") == status, "error.code %r, status %d: %r" % (err.get("code"), status, body)
    assert isinstance(err.get("message"), str) and err["message"], "error.message empty: %r" % err
    assert isinstance(err.get("type"), str) and err["type"], "error.type empty: %r" % err
    msg = err["message"].lower()
    for w in words:
        assert w.lower() in msg, "error message %r does not name %r" % (err["message"], w)
    return err
