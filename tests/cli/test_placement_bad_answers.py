"""Something other than Placement answers at the endpoint (a proxy's HTML
login page, an empty or wrong-shaped 200): ``node-agent --once`` ends with
one error naming the request and what came back, exit 75, no traceback
(issue 28).

A tiny HTTP server on 127.0.0.1 stands in for the proxy; the real CLI runs
against it as ``[placement] endpoint_override``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.cli.runner import run_agent, write_config
from tests.hostdata import HOSTDATA

TEST6 = HOSTDATA / "virhostcpudata" / "linux-test6"
LOGIN_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\n"
    "<body><form action='/login'>" + "x" * 500 + "</form></body></html>"
)
VERSIONS = json.dumps(
    {"versions": [{"id": "v1.0", "min_version": "1.0", "max_version": "1.39", "status": "CURRENT"}]}
)
SECRET = "s3cret-token-value"


NO_PROVIDERS = json.dumps({"resource_providers": []})


def _serve(root: str | None, body: str, kind: str, reads: str | None = None):
    """A server answering 200 with ``body`` to every request, with ``root``
    (when given) to ``GET /`` and with ``reads`` (when given) to the other
    reads."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self):
            text = root if self.path == "/" and root is not None else body
            if self.command == "GET" and self.path != "/" and reads is not None:
                text = reads
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind if text is body else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = _answer

        def log_message(self, format, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "root, body, kind, said, reads",
    [
        (None, LOGIN_PAGE, "text/html", "GET / -> 200", None),  # the proxy answers everything
        (VERSIONS, LOGIN_PAGE, "text/html", "not JSON (text/html)", None),
        (VERSIONS, "", "application/json", "empty answer", None),
        (VERSIONS, "{}", "application/json", "lacks resource_providers", None),
        (VERSIONS, "[]", "application/json", "a JSON list", None),
        # Reads pass (no provider yet), writes get the page: the first write ends the sync.
        (VERSIONS, LOGIN_PAGE, "text/html", "-> 200 from", NO_PROVIDERS),
    ],
    ids=["html-everywhere", "html", "empty", "empty-object", "list", "html-to-writes"],
)
def test_once_against_a_non_placement_answer_exits_75_naming_it(
    tmp_path, root, body, kind, said, reads
):
    server = _serve(root, body, kind, reads)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        config = write_config(
            tmp_path,
            TEST6,
            extra=(
                "[placement]\nauth_type = admin_token\n"
                f"token = {SECRET}\nendpoint_override = {url}\n"
            ),
        )
        result = run_agent("--config-file", str(config), "--once")
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.code == 75, result.stderr
    assert said in result.stderr, result.stderr
    assert SECRET not in result.stderr + result.stdout
    if body == LOGIN_PAGE:
        assert "<title>Sign in</title>" in result.stderr  # the start of what came back
        assert "x" * 300 not in result.stderr  # not all of it
        assert result.stderr.count("not JSON") == 1  # one error, then it stops
