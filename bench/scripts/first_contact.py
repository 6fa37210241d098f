"""A new user's first contact, timed: prepare on a fresh cache, the app started, the page served, the first click and
later clicks, in headless Chromium, as the README's first command leaves things.

    .venv/bin/python -m bench.scripts.first_contact [--cache DIR] [--keep] [--clicks 3] [--max-new-tokens 128]

Without --cache it prepares into a fresh temporary folder (a minute or two: the default pairs' packs are converted;
about 6 GB, 11 GB while preparing), removed at the end unless --keep. The install itself (the pip part of the first command) is timed by hand:
`time` it on a clean machine. Prints a line per stage; writes only the screenshots of each click, to a small
temporary folder it names. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.scripts.app_vs_cli import CHROMIUM_ARGS, ROOT, start_app

DEFAULT_TEXT = "Write a Python function that returns the n-th Fibonacci number, with a docstring and type hints."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="an ASSISTGEN_CACHE to use as it is (default: a fresh temporary one)")
    parser.add_argument("--clicks", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary cache (about 6 GB; by default it is removed at the end)")
    args = parser.parse_args(argv)
    cache = args.cache or tempfile.mkdtemp(prefix="assistgen-first-contact-")
    shots = Path(tempfile.mkdtemp(prefix="assistgen-first-contact-shots-"))   # a few hundred KB, kept
    try:
        return _run(args, cache, shots)
    finally:
        if not args.cache and not args.keep:   # left behind, a few runs filled this machine's disk
            shutil.rmtree(cache, ignore_errors=True)
        print(f"screenshots: {shots}", flush=True)


def _run(args, cache: str, shots: Path) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "ASSISTGEN_CACHE": cache}

    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "assistgen", "prepare"], cwd=ROOT, env=env, check=True,
                   stderr=subprocess.DEVNULL)
    print(f"prepare (the default pairs' packs, cache {cache}): {time.perf_counter() - started:.1f} s", flush=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "assistgen", "prepare"], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"prepare again (idempotent): {time.perf_counter() - started:.1f} s", flush=True)

    started = time.perf_counter()
    proc, url = start_app(env)
    print(f"page served: {time.perf_counter() - started:.1f} s after starting app.py", flush=True)
    from playwright.sync_api import sync_playwright
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(url)
            print(f"page loaded in the browser: {time.perf_counter() - started:.1f} s after starting app.py",
                  flush=True)
            if args.max_new_tokens != 128:
                page.locator("#settings").get_by_text("Settings", exact=True).click()  # the accordion, not the footer's Settings
                number = page.locator("#max-new-tokens input[type=number]")
                number.wait_for(timeout=300_000)  # the page renders slowly while the preload holds both cores
                number.fill(str(args.max_new_tokens))
                number.press("Tab")   # the slider takes a typed number on blur; Enter alone reverts it
            for click in range(1, args.clicks + 1):
                page.locator("#input-chat textarea").fill(args.text + " " * (click - 1))
                clicked = time.perf_counter()
                page.locator("#run-chat").click()
                # the previous click's result says "done" until the new run clears it
                page.wait_for_function("!document.querySelector('#status').innerText.includes('done')",
                                       timeout=60_000)
                page.wait_for_function("document.querySelector('#status').innerText.includes('done')",
                                       timeout=1_800_000)
                waited = time.perf_counter() - clicked
                summary = page.locator("#summary").inner_text()
                figures = {panel: float(re.search(r"latency\s+([\d.]+) s", page.locator(panel).inner_text()).group(1))
                           for panel in ("#baseline-figures", "#assisted-figures")}
                speedup = re.search(r"([\d.]+)× speedup", summary).group(1)
                print(f"click {click} (after starting app.py: {clicked - started:.0f} s): done in {waited:.1f} s; "
                      f"baseline {figures['#baseline-figures']:.1f} s, assisted {figures['#assisted-figures']:.1f} s, "
                      f"{speedup}×{'; timing flagged as not reliable' if 'Timing not reliable' in summary else ''}",
                      flush=True)
                # the per-pass chart arrives a second or two after the status says done
                page.locator("#steps-plot img:not([src^='data:image/svg'])").first.wait_for(timeout=60_000)
                page.screenshot(path=str(shots / f"click{click}.png"), full_page=True)
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
