"""Check the built docs site in a real headless browser: nothing overflows at 1280 px.

    python docs/_ext/browser_check.py SITE_DIR [--width 1280] [--json]

Serves ``SITE_DIR`` on a loopback port, opens one Chromium page that loads every page
of the site, several side by side, each in a 1280 x 900 frame, and measures, in each page:

* the page itself: ``scrollWidth`` wider than the frame (a horizontal scroll bar);
* every code block (``pre > code``) and every table wrapper whose content is wider than
  its box (a reader would have to scroll sideways to read a line);
* every other element of the content column that sticks out of the column.

Exit status 0 when nothing overflows, 1 when something does (each finding printed with
its page and the first characters of the element), 2 when Chromium is missing: outside
CI that is a notice, not a failure; with ``CI`` set it is an error, since `python3 dev.py test` installs it
there (as root, with apt-get).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Runs in the checking page: loads the site's pages into FRAMES frames side by side (each
# takes the next page not yet taken when its last one is measured), measures each page,
# and writes the findings into the DOM, in the pages' order, which `--dump-dom` prints
# once every page has been seen. Side by side because the time is Chromium's rendering,
# not waiting (no page loads anything from outside the site): one frame at a time took
# 30 s for 58 pages, 8 frames take 14 s with both cores busy (vmstat).
PROBE = r"""
const PAGES = %(pages)s;
const out = new Array(PAGES.length);
let taken = 0, done = 0;
function measure(doc, page) {
  const win = doc.defaultView;
  const found = [];
  const root = doc.documentElement;
  if (root.scrollWidth > win.innerWidth + 1)
    found.push({what: "page", width: root.scrollWidth, text: ""});
  const col = doc.querySelector(".md-content");
  if (!col) return found;
  const right = col.getBoundingClientRect().right + 1;
  for (const el of col.querySelectorAll("pre > code, .md-typeset__scrollwrap")) {
    if (el.scrollWidth > el.clientWidth + 1)
      found.push({what: el.tagName === "CODE" ? "code block" : "table",
                  width: el.scrollWidth, box: el.clientWidth,
                  text: el.textContent.trim().slice(0, 80)});
  }
  for (const el of col.querySelectorAll("p, li, td, th, h1, h2, h3, h4, code, a, span")) {
    if (el.closest("pre, .md-typeset__scrollwrap")) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > right)
      found.push({what: "element " + el.tagName.toLowerCase(), width: Math.round(r.right),
                  box: Math.round(right), text: el.textContent.trim().slice(0, 80)});
  }
  return found;
}
function next(frame) {
  if (taken >= PAGES.length) return;
  const i = taken++;
  frame.onload = () => {
    setTimeout(() => {
      try { out[i] = {page: PAGES[i], found: measure(frame.contentDocument, PAGES[i])}; }
      catch (e) { out[i] = {page: PAGES[i], error: String(e)}; }
      if (++done === PAGES.length) document.body.setAttribute("data-result", JSON.stringify(out));
      else next(frame);
    }, 50);
  };
  frame.src = PAGES[i];
}
for (const frame of document.querySelectorAll("iframe")) next(frame);
"""

#: Frames loading pages side by side.
FRAMES = 8

CHECK_PAGE = """<!doctype html><html><head><meta charset="utf-8"></head><body style="margin:0">
%(frames)s
<script>%(script)s</script></body></html>"""
FRAME = '<iframe width="%(width)d" height="900" style="border:0;display:block"></iframe>'


def _browser() -> str | None:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _pages(site: Path) -> list[str]:
    pages = []
    for index in sorted(site.rglob("index.html")):
        rel = index.relative_to(site).parent.as_posix()
        if rel.startswith(("assets", "search")):
            continue
        pages.append("/" if rel == "." else f"/{rel}/")
    return pages


@contextlib.contextmanager
def _serve(site: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def check(site: Path, width: int, browser: str) -> list[dict[str, object]]:
    pages = _pages(site)
    if not pages:
        raise SystemExit(f"browser_check: no pages under {site}")
    with tempfile.TemporaryDirectory() as tmp:
        check_page = Path(site, "__browser_check__.html")
        script = PROBE % {"pages": json.dumps(pages)}
        frames = "\n".join([FRAME % {"width": width}] * FRAMES)
        check_page.write_text(CHECK_PAGE % {"frames": frames, "script": script}, encoding="utf-8")
        try:
            with _serve(site) as base:
                done = subprocess.run(
                    [
                        browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp}",
                        f"--window-size={width + 20},{900 * FRAMES + 100}",
                        # Virtual time: the budget is the browser's, not the machine's clock.
                        "--virtual-time-budget=600000", "--dump-dom",
                        f"{base}/__browser_check__.html",
                    ],
                    capture_output=True, text=True, timeout=600, check=False,
                )
        finally:
            check_page.unlink()
    marker = 'data-result="'
    start = done.stdout.find(marker)
    if start < 0:
        raise SystemExit(
            f"browser_check: {browser} returned no result (exit {done.returncode}):\n"
            f"{done.stderr[-2000:]}"
        )
    raw = done.stdout[start + len(marker): done.stdout.index('"', start + len(marker))]
    import html

    results: list[dict[str, object]] = json.loads(html.unescape(raw))
    if len(results) != len(pages):
        raise SystemExit(f"browser_check: measured {len(results)} of {len(pages)} pages")
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    browser = _browser()
    if browser is None:
        message = "browser_check: no Chromium on PATH (apt-get install chromium)"
        if os.environ.get("CI"):
            print(message + "; CI must run this check (dev.py test installs it as root)", file=sys.stderr)
            return 2
        print(message + "; the docs overflow check is skipped")
        return 0
    results = check(args.site, args.width, browser)
    failures = [r for r in results if r.get("found") or r.get("error")]
    if args.json:
        print(json.dumps(results, indent=2))
    for r in failures:
        if r.get("error"):
            print(f"{r['page']}: could not be measured: {r['error']}")
        for f in r.get("found", []):  # type: ignore[union-attr]
            print(f"{r['page']}: {f['what']} {f.get('width')} px wide in {f.get('box', args.width)} px: "
                  f"{f['text']!r}")
    print(f"browser_check: {len(results)} pages at {args.width} px, "
          f"{sum(len(r.get('found', [])) for r in results)} overflowing element(s)")  # type: ignore[arg-type]
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
