"""A loopback HTTP proxy in front of a real server that injects faults.

Faults, set between or during requests from any thread:

* ``fail_next(n, status)``: answer the next ``n`` requests itself with
  ``status`` (503 by default) and a plain-text body, without forwarding;
* ``delay``: seconds to sleep before forwarding each request;
* ``before_forward``: a callable given the request number (1-based) just
  before it is forwarded, e.g. to SIGKILL the server mid-cycle. When the
  upstream cannot be reached the proxy drops the connection without an
  answer, as a dead server would;
* ``drop_answer``: a callable given (method, path) after the request was
  forwarded and answered upstream; when it returns True the answer is not
  relayed and the connection is closed (a committed write whose response
  is lost).
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import urlsplit

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
}


class FaultProxy:
    def __init__(
        self, upstream: str, host: str = "127.0.0.1", tls: Optional[ssl.SSLContext] = None
    ):
        """``tls``: a server-side context; the proxy then speaks HTTPS."""
        parts = urlsplit(upstream)
        self.scheme = "https" if tls else "http"
        self.upstream = (parts.hostname, parts.port)
        self.delay = 0.0
        self.before_forward: Optional[Callable[[int], None]] = None
        self.drop_answer: Optional[Callable[[str, str], bool]] = None
        self.requests = 0
        self.injected = 0
        self._fail_left = 0
        self._fail_status = 503
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_next(self, count: int, status: int = 503) -> None:
        with self._lock:
            self._fail_left, self._fail_status = count, status

    def _next(self) -> tuple[int, Optional[int]]:
        """(request number, status to inject or None)."""
        with self._lock:
            self.requests += 1
            if self._fail_left > 0:
                self._fail_left -= 1
                self.injected += 1
                return self.requests, self._fail_status
            return self.requests, None

    def _handler_class(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                number, inject = proxy._next()
                if inject is not None:
                    return self._answer(
                        inject, b"injected fault\n", [("Content-Type", "text/plain")]
                    )
                if proxy.delay:
                    time.sleep(proxy.delay)
                if proxy.before_forward is not None:
                    proxy.before_forward(number)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                try:
                    conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    conn.close()
                except OSError:
                    self.close_connection = True
                    self.connection.close()  # no answer: as a dead server
                    return
                if proxy.drop_answer is not None and proxy.drop_answer(self.command, self.path):
                    self.close_connection = True
                    self.connection.close()  # done upstream, the answer is lost
                    return
                self._answer(
                    response.status,
                    data,
                    [
                        (k, v)
                        for k, v in response.getheaders()
                        if k.lower() not in _HOP_BY_HOP | {"content-length"}
                    ],
                )

            def _answer(self, status, data, headers):
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _handle

        return Handler
