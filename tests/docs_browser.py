"""The headless Chromium that tests/test_docs_site.py drives: finding it, starting it with its
DevTools port, a small client of the Chrome DevTools protocol (on websocket-client), and what the
tests read back from a page's events: errors, external requests, the document's HTTP status."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1280,1600",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class DevTools:
    """Just enough of the Chrome DevTools protocol: commands, and the events seen meanwhile."""

    def __init__(self, ws_url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not any(e["method"] == method for e in self.events):
            self.ws.settimeout(max(0.1, deadline - time.time()))
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
            if time.time() > deadline:
                raise TimeoutError(method)
        self.ws.settimeout(60)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()


@contextlib.contextmanager
def devtools_session(exe: str) -> Iterator[DevTools]:
    """Chromium started on a blank page with a fresh profile, and a DevTools client on that page
    with the domains the tests read enabled; Chromium is stopped and its profile removed after."""
    profile = tempfile.mkdtemp(prefix="minisgl-docs-chromium-")
    proc = subprocess.Popen(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.time() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            targets = [t for t in json.load(r) if t.get("type") == "page"]
        tools = DevTools(targets[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network", "DOM", "CSS"):
            tools.call(f"{domain}.enable")
        yield tools
        tools.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def page_problems(tools: DevTools, base: str) -> list[str]:
    out = []
    for e in tools.events:
        method, p = e["method"], e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            out.append(f"console.{p['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = p.get("exceptionDetails", {})
            out.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            if p["entry"].get("url", "").endswith("/sitemap.xml"):
                # Material's language switcher looks for a sitemap.xml beside each alternate page
                # (<link rel=alternate>) to keep the reader on the same page; where there is none it
                # just follows the link, so the miss is no fault of the page.
                continue
            out.append(f"log error: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith((base, "data:", "blob:", "about:")):
                out.append(f"external request: {url}")
    return out


def document_status(tools: DevTools) -> int | None:
    for e in tools.events:
        p = e.get("params", {})
        if e["method"] == "Network.responseReceived" and p.get("type") == "Document":
            return p["response"]["status"]
    return None


def screenshot(tools: DevTools, path: Path, bottom_js: str) -> None:
    bottom = tools.evaluate(bottom_js)
    clip = {"x": 0, "y": 0, "width": 1280, "height": min(int(bottom), 4000), "scale": 1}
    shot = tools.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
