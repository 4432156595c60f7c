"""The rendered book: `mkdocs build --strict` passes, and every page renders in a browser.

The build runs offline into a temporary folder. The browser test serves that folder on a
free 127.0.0.1 port, drives Debian's headless `chromium` over the Chrome DevTools protocol
(a small client on `websocket-client`), and for every page in the nav checks that:

- each Mermaid diagram became an <svg> (and not Mermaid's "Syntax error" picture);
- the console logged no error and no script threw;
- nothing was fetched from anywhere but the local server (no CDN, no web fonts).

It also writes a screenshot of the ModelRunner chapter to artifacts/docs/model_runner.png.
The browser test skips, saying so, when chromium is not installed
(`apt-get install -y chromium`); the lead's CI script installs it.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCREENSHOT = REPO / "artifacts" / "docs" / "model_runner.png"
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

# The public classes the API reference must document.
API_CLASSES = [
    "minisgl.entrypoints.engine.Engine",
    "minisgl.server_args.ServerArgs",
    "minisgl.configs.model_config.ModelConfig",
    "minisgl.managers.scheduler.Scheduler",
    "minisgl.managers.tp_worker.TpModelWorker",
    "minisgl.model_executor.model_runner.ModelRunner",
    "minisgl.model_executor.forward_batch_info.ForwardBatch",
    "minisgl.mem_cache.memory_pool.ReqToTokenPool",
    "minisgl.mem_cache.memory_pool.MHATokenToKVPool",
    "minisgl.mem_cache.allocator.TokenToKVPoolAllocator",
    "minisgl.layers.radix_attention.RadixAttention",
    "minisgl.layers.logits_processor.LogitsProcessor",
    "minisgl.layers.sampler.Sampler",
    "minisgl.eplb.expert_distribution.ExpertDistributionRecorder",
]

pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def nav_pages() -> list[str]:
    """Every page of the nav, as the .md path mkdocs.yml gives it, in nav order."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = text[text.index("\nnav:") :]
    return re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, flags=re.M)


def page_url(base: str, md: str) -> str:
    # use_directory_urls: chapters/model-runner.md -> chapters/model-runner/
    stem = md[: -len(".md")]
    return f"{base}/" if stem == "index" else f"{base}/{stem}/"


def test_site_builds_strict_and_offline(site):
    pages = nav_pages()
    assert pages, "mkdocs.yml has no nav"
    for md in pages:
        stem = md[: -len(".md")]
        html = site / ("index.html" if stem == "index" else f"{stem}/index.html")
        assert html.is_file(), f"{md} was not rendered"
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis.com" not in index, "theme.font must stay false: no web fonts"
    assert "assets/javascripts/mermaid.min.js" in index, "the vendored Mermaid is not loaded"
    # The hook filled the concordance page from the chapters' tables.
    concordance = (site / "concordance" / "index.html").read_text(encoding="utf-8")
    assert "concordance:generated" not in concordance
    assert concordance.count("python/sglang/srt/") >= 100
    check_links(site)
    api = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in API_CLASSES if f'id="{name}"' not in api]
    assert not missing, f"the API reference lacks {missing}"


def check_links(site: Path) -> None:
    """Every SGLang reference links to its line at the pinned commit; every repository path to its page."""
    commit = json.loads((REPO / "docs" / "reference" / "sglang-index-64bca53.json").read_text())["commit"]
    problems, linked = [], 0
    for page in site.rglob("index.html"):
        if page.relative_to(site).parts[0] in ("source", "assets", "search"):
            continue
        prose = re.sub(r"<pre[\s>].*?</pre>", "", page.read_text(encoding="utf-8"), flags=re.S)
        for m in re.finditer(r'(?:<a href="([^"]*)">)?<code>(python/sglang/srt/[\w/]+\.py(?::(\d+))?)</code>', prose):
            href, text, line = m.groups()
            want = f"https://github.com/sgl-project/sglang/blob/{commit}/{text.split(':')[0]}"
            if not href or not href.startswith(want) or (line and not href.endswith(f"#L{line}")):
                problems.append(f"{page.relative_to(site)}: `{text}` links to {href}")
            linked += 1
        repo_ref = r'(?:<a href="([^"]*)">)?<code>((?:minisgl|tests)/[\w/.]+\.py)(?:(?:::|:)[\w.]+)?</code>'
        for m in re.finditer(repo_ref, prose):
            href, rel = m.groups()
            if (REPO / rel).is_file() and not (href and (page.parent / href.split("#")[0]).is_file()):
                problems.append(f"{page.relative_to(site)}: `{rel}` has no link to its source page ({href})")
    assert linked >= 100, f"only {linked} SGLang references found on the site"
    assert not problems, "\n".join(problems[:20])


# ---------------------------------------------------------------------------------------
# The browser
# ---------------------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(site):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


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


@pytest.fixture(scope="module")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); the browser checks need it")
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install websocket-client)")
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
        for domain in ("Page", "Runtime", "Log", "Network"):
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


_DIAGRAMS = """
(async () => {
  const deadline = Date.now() + 20000;
  const state = () => Array.from(document.querySelectorAll('div.mermaid')).map(d => ({
    svg: d.querySelector('svg') !== null,
    error: /Syntax error|Parse error/i.test(d.textContent),
  }));
  while (Date.now() < deadline && state().some(s => !s.svg)) {
    await new Promise(r => setTimeout(r, 100));
  }
  return state();
})()
"""


def _problems(tools: DevTools, base: str) -> list[str]:
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
            out.append(f"log error: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith((base, "data:", "blob:", "about:")):
                out.append(f"external request: {url}")
    return out


def test_every_page_renders_with_diagrams_and_no_errors(server, browser):
    pages = nav_pages()
    problems = []
    for md in pages:
        browser.events.clear()
        browser.call("Page.navigate", url=page_url(server, md))
        browser.wait_for("Page.loadEventFired")
        states = browser.evaluate(_DIAGRAMS) or []
        source = (REPO / "docs" / md).read_text(encoding="utf-8")
        expected = len(re.findall(r"^\s*```mermaid\s*$", source, flags=re.M))
        if len(states) != expected:
            problems.append(f"{md}: {expected} mermaid blocks in the source, {len(states)} diagrams on the page")
        for i, s in enumerate(states):
            if not s["svg"] or s["error"]:
                problems.append(f"{md}: diagram {i + 1} did not render ({s})")
        problems += [f"{md}: {p}" for p in _problems(browser, server)]
        if md == "chapters/model-runner.md":
            assert states, "the ModelRunner chapter should show its reading-order diagram"
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            import base64

            # From the top of the page to the bottom of the reading-order diagram.
            bottom = browser.evaluate(
                "Math.ceil(document.querySelector('div.mermaid').getBoundingClientRect().bottom + window.scrollY + 24)"
            )
            clip = {"x": 0, "y": 0, "width": 1280, "height": min(int(bottom), 4000), "scale": 1}
            shot = browser.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
            SCREENSHOT.write_bytes(base64.b64decode(shot["data"]))
    assert not problems, "\n".join(problems)
    assert SCREENSHOT.is_file() and SCREENSHOT.stat().st_size > 10_000
