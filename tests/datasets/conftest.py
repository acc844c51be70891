"""The data tests' fixtures: a local HTTP server serving files in the publishers' formats (what it serves, cuts
off and was asked: support.files.FileServer), and downloads that retry without waiting."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.files import FileServer

from fedrepro.data import download


@pytest.fixture
def server() -> Iterator[FileServer]:
    state = FileServer()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the name http.server dispatches to)
            name = self.path.lstrip("/")
            state.requests.append(name)
            body = state.files.get(name)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # A cut-off body: the header promises every byte, the connection closes after half of them.
            self.wfile.write(body[: len(body) // 2] if name in state.cut_off else body)
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture(autouse=True)
def no_retry_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.0)
