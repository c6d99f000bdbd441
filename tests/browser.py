"""A small Chrome DevTools Protocol client over --remote-debugging-pipe (file descriptors 3
and 4, NUL-terminated JSON messages): no websocket library, no Playwright. Enough to load a
page, evaluate JavaScript, collect console errors and requests, and take a screenshot."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage", "--hide-scrollbars"]


def find_chromium() -> str | None:
    for path in CANDIDATES:
        if os.path.exists(path):
            return path
    return shutil.which("chromium")


class BrowserError(RuntimeError):
    pass


class Chromium:
    """``with Chromium() as b: page = b.open(url)``; one fresh profile per instance."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 900):
        self.binary = binary or find_chromium()
        if not self.binary:
            raise BrowserError("chromium is not installed")
        self.profile = tempfile.mkdtemp(prefix="attattr-chromium-")
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        # move the child's ends above 10 so that dup2 onto 3 and 4 never clobbers one of them; with
        # close_fds=False only the inheritable 3 and 4 (and stdio) reach chromium (PEP 446)
        a = _high(to_child_r)
        b = _high(from_child_w)
        os.close(to_child_r)
        os.close(from_child_w)

        def child():
            os.dup2(a, 3, inheritable=True)
            os.dup2(b, 4, inheritable=True)

        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=child, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(a)
        os.close(b)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("timed out waiting for chromium")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed the pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str | None = None, timeout: float = 30) -> dict:
        for i, e in enumerate(self.events):
            if e.get("method") == method and (session is None or e.get("sessionId") == session):
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            e = self._read_message(deadline)
            if e.get("method") == method and (session is None or e.get("sessionId") == session):
                return e
            self.events.append(e)

    def open(self, url: str) -> "Page":
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session=session)
        return page


def _high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, 10)


class Page:
    def __init__(self, browser: Chromium, session: str):
        self.b = browser
        self.session = session

    def eval(self, expression: str):
        """The value of a JavaScript expression (awaited when it is a promise)."""
        r = self.b.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                        session=self.session)
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression}: {r['exceptionDetails'].get('exception', {}).get('description')}")
        return r["result"].get("value")

    def settle(self, seconds: float = 0.3) -> None:
        """Let pending events arrive (a short evaluate loop)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.eval("1")
            time.sleep(0.05)

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        out = []
        for e in self.b.events:
            if e.get("sessionId") != self.session:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                out.append(str(p.get("exceptionDetails", {}).get("exception", {}).get("description")))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.b.events
                if e.get("sessionId") == self.session and e.get("method") == "Network.requestWillBeSent"]

    def screenshot(self) -> bytes:
        r = self.b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=self.session)
        return base64.b64decode(r["data"])


def strip_scripts(text: str) -> str:
    """The page as a reader without JavaScript gets it (an untrusted notebook, GitHub's preview):
    every <script> element removed."""
    import re

    return re.sub(r"<script\b[^>]*>.*?</script\s*>", "", text, flags=re.S | re.I)


def painted_colours(page: Page, png: bytes, selector: str) -> int:
    """How many distinct colours the screenshot ``png`` has inside the elements ``selector``
    matches (their bounding boxes, page coordinates): a drawn heatmap has many, a blank one 1."""
    import io

    import matplotlib.image as mpimg
    import numpy as np

    boxes = page.eval(f"Array.from(document.querySelectorAll({json.dumps(selector)})).map(e => {{"
                      "var r = e.getBoundingClientRect(); return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })")
    img = mpimg.imread(io.BytesIO(png), format="png")[..., :3]
    seen = set()
    for x, y, w, h in boxes:
        part = img[int(y):int(y + h), int(x):int(x + w)].reshape(-1, 3)
        seen |= {tuple(c) for c in np.round(part * 255).astype(int).tolist()}
    return len(seen)
