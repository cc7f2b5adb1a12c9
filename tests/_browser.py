"""A headless Chromium driven over the DevTools protocol through a pipe (--remote-debugging-pipe: JSON
messages separated by NUL on file descriptors 3 and 4), so the HTML reports can be opened in a real
browser without a websocket library or the network. Used by tests/test_html_browser.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--no-default-browser-check", "--remote-debugging-pipe"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless browser process; `open(url)` loads a page and reports what went wrong on it."""

    def __init__(self, binary: str, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="taxes-chromium-")
        import fcntl

        r, self._to_browser = os.pipe()
        self._from_browser, w = os.pipe()
        # the child's ends, moved above 4 first so that placing them on 3 and 4 clobbers nothing
        to_browser_r, from_browser_w = fcntl.fcntl(r, fcntl.F_DUPFD, 10), fcntl.fcntl(w, fcntl.F_DUPFD, 10)
        os.close(r)
        os.close(w)

        def fds():  # the child reads commands on fd 3 and writes replies on fd 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=fds, pass_fds=(3, 4, to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict] = []

    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._next

    def _read(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        want = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, session: str) -> dict:
        deadline = time.monotonic() + self.timeout_s
        for i, msg in enumerate(self.events):
            if msg.get("method") == method and msg.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            msg = self._read(deadline)
            if msg.get("method") == method and msg.get("sessionId") == session:
                return msg
            self.events.append(msg)

    def open(self, url: str, checks: dict[str, str]) -> tuple[list[str], dict]:
        """Load `url` in a new tab; returns (problems the page had: uncaught exceptions, console errors
        and warnings, log errors such as a resource that failed to load; {name: value of each JavaScript
        expression in checks, evaluated after the load event})."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=session)
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=session)
        self.wait_for("Page.loadEventFired", session)
        values = {name: self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True},
                                  session=session)["result"].get("value") for name, expr in checks.items()}
        problems = []
        for msg in self.events:
            method, p = msg.get("method"), msg.get("params", {})
            if method == "Runtime.exceptionThrown":
                problems.append("exception: " + p.get("exceptionDetails", {}).get("text", "?"))
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                problems.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                   for a in p.get("args", [])))
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") in ("error", "warning"):
                e = p["entry"]
                problems.append(f"log {e['level']} ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip())
        self.call("Target.closeTarget", {"targetId": target})
        return problems, values

    def close(self) -> None:
        try:
            self._send("Browser.close")
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)
