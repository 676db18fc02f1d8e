"""pytest setup for tests/integration: the test model and the servers the tests run.

Owns: the session's model (bloomery-mkmodel, small qwen3moe with the real Qwen3
tokenizer), the session's shared server (-np 2), a factory for servers with other
flags (each stopped with SIGTERM at the end of its test or module and checked: exit
0, no child process left, no /dev/shm/bloomery* object left), and a few request
helpers. BLOOMERY_BUILD (default build) or BLOOMERY_BIN says where the programs are.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import serverctl  # noqa: E402

SHARED_FLAGS = serverctl.SHARED_FLAGS


LOGS = None  # a folder of this session for the servers' logs (set by the model fixture)


def _start(model, args, **kw):
    kw.setdefault("log_dir", LOGS)
    try:
        return serverctl.Server(model, args, **kw).start()
    except serverctl.ServerError as e:
        pytest.fail(str(e), pytrace=False)


def _finish(srv):
    problems = srv.stop()
    if problems:
        pytest.fail("server %s stopped badly:\n  %s\nits log:\n%s"
                    % (" ".join(srv.command()), "\n  ".join(problems), srv.log()), pytrace=False)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    global LOGS
    LOGS = str(tmp_path_factory.mktemp("logs"))
    try:
        return serverctl.make_model(str(tmp_path_factory.mktemp("model") / "test.gguf"))
    except serverctl.ServerError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def server(model):
    """The shared server: tests must leave it serving (every slot free at the end)."""
    srv = _start(model, SHARED_FLAGS)
    yield srv
    _finish(srv)


@pytest.fixture
def url(server):
    return server.url


class Factory:
    """Starts servers for one test (or module) and stops them all at its end."""

    def __init__(self, model):
        self.model = model
        self.servers = []

    def start(self, args, model=None, **kw):
        srv = _start(self.model if model is None else model, list(args), **kw)
        self.servers.append(srv)
        return srv

    def launch(self, args, model=None, **kw):
        """Starts the process without waiting for /health (for tests of failures)."""
        kw.setdefault("log_dir", LOGS)
        srv = serverctl.Server(self.model if model is None else model, list(args), **kw).launch()
        self.servers.append(srv)
        return srv

    def close(self):
        failures = []
        for srv in self.servers:
            if srv.proc.poll() is None:
                problems = srv.stop()
                if problems:
                    failures.append("%s: %s\n%s" % (" ".join(srv.command()), "; ".join(problems),
                                                   srv.log(3000)))
        self.servers = []
        if failures:
            pytest.fail("servers stopped badly:\n" + "\n".join(failures), pytrace=False)


@pytest.fixture
def servers(model):
    f = Factory(model)
    yield f
    f.close()


@pytest.fixture(scope="module")
def module_servers(model):
    f = Factory(model)
    yield f
    f.close()


def pytest_configure(config):
    config.addinivalue_line("markers", "lifecycle: tests that kill processes of a server")
