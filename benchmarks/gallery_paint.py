"""How soon a run's gallery shows its first screen in a real browser.

    python benchmarks/gallery_paint.py RUN_DIR [--browser chromium] [--repeat 3]

Starts a headless Chromium (Debian: ``apt-get install chromium``) with its DevTools endpoint on
127.0.0.1, opens ``RUN_DIR/gallery.html`` from disk (as a user double-clicking it would), and reports from
the page's own clock: the first contentful paint, DOMContentLoaded, the load event, and the moment the
first page of rows is in the table (the gallery's rows load lazily from ``gallery/rows-*.js``). Each
repeat is a fresh browser profile (nothing cached). Not a test: nothing is asserted; the figures go to
BENCHMARKS.md by hand."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

FIRST_ROWS = "document.querySelectorAll('table.gallery tbody tr').length"
TIMINGS = """(() => {
  const paint = Object.fromEntries(performance.getEntriesByType('paint').map(e => [e.name, e.startTime]));
  const nav = performance.getEntriesByType('navigation')[0] || {};
  return JSON.stringify({fcp_ms: paint['first-contentful-paint'] ?? null,
                         dom_content_loaded_ms: nav.domContentLoadedEventEnd ?? null,
                         load_ms: nav.loadEventEnd ?? null, now_ms: performance.now()});
})()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(ws_url: str, page: str, timeout: float = 30.0) -> dict:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        ids = iter(range(1, 10**6))

        async def call(method: str, **params):
            i = next(ids)
            await ws.send_json({"id": i, "method": method, "params": params})
            while True:
                msg = json.loads((await ws.receive()).data)
                if msg.get("id") == i:
                    return msg.get("result", {})

        await call("Page.enable")
        await call("Page.navigate", url=page)
        t0 = time.perf_counter()
        rows, first_rows_ms = 0, None
        while time.perf_counter() - t0 < timeout:
            got = await call("Runtime.evaluate", expression=f"[{FIRST_ROWS}, performance.now()]", returnByValue=True)
            value = got.get("result", {}).get("value")
            if value and value[0] > 0:
                rows, first_rows_ms = value
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.5)  # let the load event and paint entries settle
        got = await call("Runtime.evaluate", expression=TIMINGS, returnByValue=True)
        out = json.loads(got["result"]["value"])
        out.update(first_rows=rows, first_rows_ms=first_rows_ms)
        return out


def one(browser: str, page: str) -> dict:
    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1", f"--remote-debugging-port={port}",
             "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                        targets = [t for t in json.load(r) if t.get("type") == "page"]
                    if targets:
                        break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{browser} did not open its DevTools port {port}")
                time.sleep(0.1)
            return asyncio.run(measure(targets[0]["webSocketDebuggerUrl"], page))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--browser", default="chromium")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    page = (args.run_dir / "gallery.html").resolve()
    if not page.is_file():
        raise SystemExit(f"{page}: no gallery (adjcap report --run {args.run_dir} writes it)")
    browser = shutil.which(args.browser) or args.browser
    rows_js = list((args.run_dir / "gallery").glob("rows-*.js"))
    print(f"{page}: {page.stat().st_size / 1024:.0f} KB, {len(rows_js)} row files "
          f"({sum(p.stat().st_size for p in rows_js) / 2**20:.1f} MiB)")
    for i in range(args.repeat):
        r = one(browser, page.as_uri())
        print(f"  run {i + 1}: first contentful paint {r['fcp_ms']:.0f} ms, first {r['first_rows']} rows in the table "
              f"at {r['first_rows_ms']:.0f} ms, DOMContentLoaded {r['dom_content_loaded_ms']:.0f} ms, "
              f"load {r['load_ms']:.0f} ms")


if __name__ == "__main__":
    main()
