"""A minimal W3C WebDriver client (urllib only) for headless Chromium via chromedriver: enough to open a
page, run JavaScript in it and take a screenshot. Selenium is not a dependency of this project."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
]


def find_browser() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths, or None when either is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (chromium, driver) if chromium and driver else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium session with a fresh profile directory; use as a context manager."""

    def __init__(self, chromium: str, driver: str, startup_s: float = 30.0) -> None:
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="fedrepro-chromium-")
        self.proc = subprocess.Popen([driver, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + startup_s
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromedriver did not start on port {self.port}")
            time.sleep(0.2)
        caps = {"browserName": "chrome", "goog:chromeOptions": {
            "binary": chromium, "args": [*CHROMIUM_ARGS, f"--user-data-dir={self.profile}"]}}
        self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})["sessionId"]

    def _call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"webdriver {method} {path}: {err.read().decode()[:2000]}") from err

    def open(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script: str, *args):
        """Run ``script`` (a function body; ``return`` gives the result) in the page."""
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": list(args)})

    def js_async(self, script: str, *args):
        """Run ``script``, whose last argument is the callback that returns its result."""
        return self._call("POST", f"/session/{self.session}/execute/async", {"script": script, "args": list(args)})

    def screenshot(self, path: Path) -> Path:
        png = base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot"))
        Path(path).write_bytes(png)
        return Path(path)

    def close(self) -> None:
        if getattr(self, "session", None):
            with contextlib.suppress(RuntimeError, urllib.error.URLError, ConnectionError):
                self._call("DELETE", f"/session/{self.session}")
            self.session = None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
