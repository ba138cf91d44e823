"""The HTTP front's status page (`/`) in headless Chromium (Debian's chromium) against a real
daemon: it renders the live pool (a segment per model and kind, shared weights drawn once, a
row per model) with the token the link carries, and shows an error, not data, without it.
The screenshot is kept (in the test's tmp dir, and in $MINFERD_TEST_ARTIFACTS where set)."""
from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess

import pytest

from tests.e2e.daemon import Daemon
from tests.e2e.test_http_api import _port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium)")
TOKEN = "status-page-token-0123456789"
SHARER = "<img/src=x/onerror=alert(1)><b>b</b>"


def chromium(url: str, *args: str) -> str:
    """What the page's DOM is once its scripts ran (virtual time: its first fetch has answered)."""
    # No sandbox and no /dev/shm: CI runs as root, in containers whose /dev/shm is small.
    out = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--hide-scrollbars",
                          "--window-size=1280,480", "--virtual-time-budget=3000", *args, url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def rendered(url: str) -> "Page":
    """The page once its first fetch has been drawn (body data-updated): a loaded runner's first
    try may end its virtual time before the daemon answered."""
    for _ in range(3):
        page = Page(chromium(url, "--dump-dom"))
        if page.updated or page.texts.get("error", "").strip():
            break
    return page


class Page(html.parser.HTMLParser):
    def __init__(self, text: str):
        super().__init__()
        self.segments, self.rows, self.texts, self._id, self.bars, self.updated = [], [], {}, None, [], False
        self.tags: set[str] = set()
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.updated |= tag == "body" and "data-updated" in a
        if "bar" in (a.get("class") or "").split():
            self.bars.append(a["data-device"])
        if "seg" in (a.get("class") or "").split():
            width = float(re.search(r"width:\s*([\d.e-]+)%", a["style"]).group(1))
            self.segments.append((a["data-model"], a["data-kind"], width, self.bars[-1]))
        if tag == "tr" and "data-model" in a:
            self.rows.append(a["data-model"])
        self._id = a.get("id")

    def handle_data(self, data):
        if self._id:
            self.texts[self._id] = self.texts.get(self._id, "") + data


@pytest.fixture(scope="module", autouse=True)
def browser_works():
    """A chromium that cannot render a blank page is the machine's problem, not the page's."""
    out = subprocess.run([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--dump-dom", "about:blank"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or "<body" not in out.stdout:
        pytest.skip(f"chromium does not run here: {out.stderr[-300:]}")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synth_model):
    tmp = tmp_path_factory.mktemp("status-page")
    port = _port()
    qwen, lm = synth_model("qwen2"), synth_model("llama", "q4_k")
    d = Daemon(tmp, "--device", "cpu", "--budget", "64MiB", "--w16-min-bytes", "0", "--http", f"127.0.0.1:{port}",
               "--models-dir", qwen.parent, "--models-dir", lm.parent, token=TOKEN)
    d.url = f"http://127.0.0.1:{port}/"
    try:
        # A name is printable without spaces, so it may be markup: the page must show it as text.
        for path, name in ((qwen, "qwen"), (lm, "lm"), (qwen, SHARER)):
            d.load(path, name, ctx=256)
        yield d
    finally:
        d.stop()


def test_the_page_renders_the_live_pool(daemon, tmp_path):
    st = daemon.status()
    page = rendered(daemon.url + "#token=" + TOKEN)
    names = [m.name for m in st.models]
    assert page.rows == names
    assert {m for m, _, _, _ in page.segments} == set(names)
    # SHARER shares qwen's file: its weights and f16 copy are drawn once, under qwen.
    assert {k for m, k, _, _ in page.segments if m == SHARER} == {"kv", "scratch"}
    assert not page.tags & {"img", "b"}, page.tags  # its name stayed text
    drawn = sum(w for _, _, w, _ in page.segments)
    assert abs(drawn - 100 * st.pool.used_bytes / st.pool.capacity_bytes) < 0.01, (drawn, st.pool)
    assert "of 64.0 MiB" in page.texts["pool"] and not page.texts.get("error", "").strip()

    shot = tmp_path / "status-page.png"
    chromium(daemon.url + "#token=" + TOKEN, f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000  # a picture of the page, not a blank one
    if os.environ.get("MINFERD_TEST_ARTIFACTS"):
        shutil.copy(shot, os.environ["MINFERD_TEST_ARTIFACTS"])


def test_without_the_token_it_shows_an_error_not_the_pool(daemon):
    page = rendered(daemon.url)
    assert not page.rows and not page.segments
    assert "missing or wrong bearer token" in page.texts["error"] and "#token=" in page.texts["error"]


def test_several_devices_get_a_bar_each(tmp_path, synth_model):
    qwen, lm = synth_model("qwen2"), synth_model("llama", "q4_k")
    port = _port()
    d = Daemon(tmp_path, "--device", "cpu:0,cpu:1", "--budget", "32MiB", "--w16-min-bytes", "0", "--insecure",
               "--http", f"127.0.0.1:{port}", "--models-dir", qwen.parent, "--models-dir", lm.parent)
    try:
        d.load(qwen, "q", ctx=256, device="cpu:0")
        d.load(lm, "l", ctx=256, device="cpu:1")
        page = rendered(f"http://127.0.0.1:{port}/")
        assert page.bars == ["cpu:0", "cpu:1"]
        assert {(m, dev) for m, _, _, dev in page.segments} == {("q", "cpu:0"), ("l", "cpu:1")}
        for p in d.status().pools:
            drawn = sum(w for _, _, w, dev in page.segments if dev == p.device)
            assert abs(drawn - 100 * p.used_bytes / p.capacity_bytes) < 0.01
    finally:
        d.stop()
