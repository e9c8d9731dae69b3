"""What tests/docs/test_site.py needs: the docs build, a local web server, and headless Chromium over DevTools.

The browser is driven over ``--remote-debugging-pipe`` (the DevTools protocol on the browser's fds 3 and 4, JSON
messages separated by NUL bytes): no websocket, no third-party client, one browser for the whole module. The site is
served over HTTP, not opened as file:// pages: Material's search runs in a Web Worker, which file:// pages cannot
start.
"""

import contextlib
import fcntl
import functools
import http.server
import json
import os
import pathlib
import select
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
NO_TOOLS = "the docs tools are not installed: run `make docs` (creates .venv-docs)"
NO_BROWSER = "no Chromium installed: .ci/run installs Debian's chromium package; apt-get install chromium"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
NOT_PAGES = ("search", "assets")  # folders of the built site whose index.html (if any) is no page of the site


def docs_venv():
    """The docs tools' virtual environment: $HVD_SCHED_DOCS_VENV, else the one `make docs` creates."""
    return pathlib.Path(os.environ.get("HVD_SCHED_DOCS_VENV") or ROOT / ".venv-docs")


def build_site(venv, dest, root=ROOT, timeout=600):
    """`mkdocs build --strict` of root's mkdocs.yml (the repository's, or a copy) into dest -> the CompletedProcess
    (output as text)."""
    cmd = [str(venv / "bin" / "mkdocs"), "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(dest)]
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)


def built_pages(site):
    """The URL path of every page of the built site ("/", "/how-to/launching/"): its index.html files."""
    pages = set()
    for index in site.rglob("index.html"):
        rel = index.parent.relative_to(site)
        if not rel.parts or rel.parts[0] not in NOT_PAGES:
            pages.add("/" + "".join(part + "/" for part in rel.parts))
    return pages


def page_path(url, base):
    """The URL path of the page a link leads to, without query and fragment; None for another site or a file."""
    link, origin = urllib.parse.urlsplit(url), urllib.parse.urlsplit(base)
    if (link.scheme, link.netloc) != (origin.scheme, origin.netloc):
        return None
    path = urllib.parse.unquote(link.path or "/")
    if path.endswith("/index.html"):
        path = path[: -len("index.html")]
    return path if path.endswith("/") else None


def page_file(site, path):
    """The built index.html of a page's URL path."""
    return site.joinpath(*path.strip("/").split("/"), "index.html") if path != "/" else site / "index.html"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(directory):
    """Serve a folder on 127.0.0.1 (a free port) from a background thread -> its base URL, ending in '/'."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, name="docs-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def find_chromium():
    return next(filter(None, map(shutil.which, BROWSERS)), None)


class DevToolsError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium, driven over --remote-debugging-pipe; a context manager that closes it."""

    def __init__(self, executable, workdir, window=(1400, 1000)):
        self.log = pathlib.Path(workdir) / "chromium.log"
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()
        # The child's shell (bash: dash takes single-digit fds only) moves the pipe ends to fds 3 and 4; copies at
        # >= 10 first, so that neither is 3 or 4.
        child = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, out_w)]
        os.close(cmd_r), os.close(out_w)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--no-proxy-server", "--disable-extensions", "--disable-sync",
                "--disable-background-networking", "--disable-component-update", "--mute-audio",
                "--hide-scrollbars", f"--window-size={window[0]},{window[1]}",
                f"--user-data-dir={pathlib.Path(workdir) / 'profile'}", "--remote-debugging-pipe", "about:blank"]
        shell = 'exec "$0" "$@" 3<&{0} 4>&{1} {0}<&- {1}>&-'.format(*child)
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(["bash", "-c", shell, executable, *args], pass_fds=child,
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        for fd in child:
            os.close(fd)
        self._buf, self._id, self.events = b"", 0, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._proc.poll() is None:
            with contextlib.suppress(Exception):
                self.send("Browser.close", timeout=10)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(10)
        for fd in (self._cmd_w, self._out_r):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _log_tail(self):
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def _receive(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from Chromium in time; its output:\n{self._log_tail()}")
            if select.select([self._out_r], [], [], left)[0]:
                chunk = os.read(self._out_r, 1 << 20)
                if not chunk:
                    raise DevToolsError(f"Chromium closed the DevTools pipe; its output:\n{self._log_tail()}")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)

    def wait(self, predicate, timeout=30):
        """The first message (kept events first) that satisfies predicate; events read on the way are kept."""
        for i, message in enumerate(self.events):
            if predicate(message):
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(deadline)
            if predicate(message):
                return message
            if "method" in message:
                self.events.append(message)

    def send(self, method, params=None, session=None, timeout=60):
        self._id += 1
        ident, message = self._id, {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        data = memoryview(json.dumps(message).encode() + b"\0")
        while data:
            data = data[os.write(self._cmd_w, data):]
        reply = self.wait(lambda m: m.get("id") == ident, timeout)
        if "error" in reply:
            raise DevToolsError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def new_tab(self):
        return Tab(self)


class Tab:
    """A page of the browser, attached in flat mode (its commands and events carry its sessionId)."""

    def __init__(self, browser):
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def send(self, method, params=None, timeout=60):
        return self.browser.send(method, params, self.session, timeout)

    def _mine(self, method):
        return lambda m: m.get("sessionId") == self.session and m.get("method") == method

    def goto(self, url, timeout=30):
        """Load url and wait for its load event; drops the events of the pages before."""
        self.browser.events = [m for m in self.browser.events if m.get("sessionId") != self.session]
        result = self.send("Page.navigate", {"url": url}, timeout)
        if result.get("errorText"):
            raise DevToolsError(f"{url}: {result['errorText']}")
        self.browser.wait(self._mine("Page.loadEventFired"), timeout)

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (promises awaited), as JSON."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression[:80]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression, timeout=30, poll=0.1):
        """The first truthy value of expression, evaluated every `poll` seconds; None after timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(poll)

    def errors(self):
        """The JavaScript errors, console errors and failed loads the page reported since it was loaded."""
        found = []
        for m in self.browser.events:
            if m.get("sessionId") != self.session:
                continue
            params = m.get("params", {})
            if m["method"] == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(details.get("exception", {}).get("description") or details.get("text"))
            elif m["method"] == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif m["method"] == "Log.entryAdded" and params["entry"].get("level") == "error":
                found.append(f"{params['entry'].get('text')} ({params['entry'].get('url', '')})")
        return found
