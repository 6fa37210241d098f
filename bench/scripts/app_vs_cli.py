"""Do the page's timings equal the CLI's? The running app (its page in headless Chromium, and its /compare API through
gradio_client) against `python -m assistgen compare --json`, interleaved, on the same prompts and pair.

    .venv/bin/python -m bench.scripts.app_vs_cli --pair qwen2.5-coder-1.5b-w8a8+0.5b-int8 \
        --prompts bench/inputs/code_prompts.txt --limit 3 [--rounds 2] --max-new-tokens 64 [--url http://127.0.0.1:7860/] [--no-page] [--out FILE.json]
    .venv/bin/python -m bench.scripts.app_vs_cli --pool FILE.json FILE.json ...

Without --url it starts `app.py` itself on a free port and stops it at the end. Prints, per prompt and path, the
baseline and assisted latency and their ratio to the CLI's, then the medians; a page run whose token counts differ
from the CLI's (its settings did not take) is left out of the ratios, and said so. `--pool` prints the medians over
several runs' files together: one pair's ratio spreads widely on a shared host, so one median of 12 moves too. The
browser shows a blank page while the CLI and the API run, so the page pays for its own browser and they do not. A
benchmark, not a test: it prints figures and asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**env, "GRADIO_SERVER_PORT": str(port)})
    url = f"http://127.0.0.1:{port}/"
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit("app.py exited before serving")
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("app.py did not start serving within 5 minutes")


def via_cli(pair: str, text: str, max_new_tokens: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "assistgen", "compare", "--pair", pair, "--task", "chat", "--text", text,
                          "--max-new-tokens", str(max_new_tokens), "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def via_api(client, pair: str, text: str, max_new_tokens: int) -> dict:
    return client.predict(task="chat", pair=pair, text=text, audio=None, max_new_tokens=max_new_tokens,
                          temperature=0, draft_source="assistant", api_name="/compare")


def via_page(page, url: str, pair: str, text: str, max_new_tokens: int) -> dict:
    """Type the prompt, set the tokens, press Run, and read the latencies and token counts the page shows."""
    import re
    page.goto(url)
    page.locator("#run-chat").wait_for()
    if page.locator("#pair-chat input").input_value() != pair:
        page.locator("#pair-chat input").fill(pair)
        page.locator("#pair-chat input").press("Enter")
    page.locator("#settings").get_by_text("Settings", exact=True).click()  # the accordion, not the footer's Settings
    number = page.locator("#max-new-tokens input[type=number]")
    # Gradio's slider takes a typed number when the box loses focus (Enter alone reverts it): tab out, check that
    # the slider itself holds it, and check the count the run reports below all the same.
    for _ in range(10):
        number.fill(str(max_new_tokens))
        number.press("Tab")
        page.wait_for_timeout(300)
        if page.locator("#max-new-tokens input[type=range]").input_value() == str(max_new_tokens):
            break
    page.locator("#input-chat textarea").fill(text)
    page.locator("#run-chat").click()
    # polled once a second, not at every animation frame: the harness must not take CPU from the run it times
    page.wait_for_function("document.querySelector('#status').innerText.includes('done')", timeout=900_000,
                           polling=1000)

    def figure(panel: str, name: str) -> float:
        return float(re.search(rf"{name}\s+([\d.]+)", page.locator(panel).inner_text()).group(1))
    summary = page.locator("#summary").inner_text()
    return {side: {"latency_s": figure(f"#{side}-figures", "latency"),
                   "new_tokens": int(figure(f"#{side}-figures", "new tokens"))} for side in ("baseline", "assisted")
            } | {"speedup": float(re.search(r"([\d.]+)× speedup", summary).group(1)),
                 "stability": {"stable": "Timing not reliable" not in summary}}


def summarize(runs: list[dict]) -> None:
    """Each path's latency over the CLI's on the same prompt and round (and file, when runs are pooled), medians."""
    key = lambda r: (r.get("file"), r["prompt"], r["round"])
    cli = {key(r): r for r in runs if r["path"] == "cli"}
    for name in sorted({r["path"] for r in runs} - {"cli"}):
        # a latency is compared only with one of as many tokens (a page whose settings did not take ran another count)
        alike = []
        for r in (r for r in runs if r["path"] == name):
            counts = cli[key(r)]["new_tokens"]
            if r["new_tokens"] == counts:
                alike.append(r)
            else:
                print(f"{name:>5}: prompt {r['prompt']} left out: {r['new_tokens']} new tokens against the CLI's "
                      f"{counts}")
        if not alike:
            continue
        ratios = {side: [r[f"{side}_s"] / cli[key(r)][f"{side}_s"] for r in alike] for side in ("baseline", "assisted")}
        print(f"{name:>5}: {len(alike)} runs; baseline ratio median {statistics.median(ratios['baseline']):.3f} "
              f"({', '.join(f'{x:.3f}' for x in ratios['baseline'])}); assisted ratio median "
              f"{statistics.median(ratios['assisted']):.3f} ({', '.join(f'{x:.3f}' for x in ratios['assisted'])})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b-w8a8+0.5b-int8")
    parser.add_argument("--prompts", default=str(ROOT / "bench" / "inputs" / "code_prompts.txt"))
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="go over the prompts this many times")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--url", help="a running app; without it, app.py is started here")
    parser.add_argument("--no-page", action="store_true", help="skip the page (Chromium); API and CLI only")
    parser.add_argument("--out", help="write every run as JSON here")
    parser.add_argument("--pool", nargs="+", metavar="FILE",
                        help="run nothing: the medians over the runs of these --out files together")
    args = parser.parse_args(argv)
    if args.pool:
        runs = [{**r, "file": f} for f in args.pool for r in json.loads(Path(f).read_text())]
        print(f"{len(args.pool)} files pooled; ratio = path / CLI (1.00: the same latency)")
        summarize(runs)
        return 0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    prompts = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()][:args.limit]
    proc, url = (None, args.url) if args.url else start_app(env)
    from gradio_client import Client
    runs = []
    try:
        client = Client(url, verbose=False)
        browser = page = playwright = None
        if not args.no_page:
            from playwright.sync_api import sync_playwright
            playwright = sync_playwright().start()
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
        via_api(client, args.pair, "Say hi.", 2)  # the app's first request loads and warms the pair up
        paths = [("cli", lambda t: via_cli(args.pair, t, args.max_new_tokens, env)),
                 ("api", lambda t: via_api(client, args.pair, t, args.max_new_tokens))]
        if page is not None:
            paths.append(("page", lambda t: via_page(page, url, args.pair, t, args.max_new_tokens)))
        for i, text in enumerate(prompts * args.rounds):
            order = paths[i % len(paths):] + paths[:i % len(paths)]  # rotate, so drift hits every path alike
            for name, run in order:
                if page is not None and name != "page":
                    # an open Gradio page keeps an animation-frame loop running (about a tenth of a core in
                    # headless Chromium, idle): the CLI and the API run without it, as they would without a browser
                    page.goto("about:blank")
                result = run(text)
                runs.append({"prompt": i % len(prompts) + 1, "round": i // len(prompts) + 1, "path": name,
                             "baseline_s": result["baseline"]["latency_s"],
                             "assisted_s": result["assisted"]["latency_s"], "speedup": result["speedup"],
                             "stable": (result.get("stability") or {}).get("stable"),
                             "new_tokens": [result[side]["new_tokens"] for side in ("baseline", "assisted")],
                             "baseline_pass_s": (result["baseline"].get("time") or {}).get("s_per_pass")})
                print(json.dumps(runs[-1]), flush=True)
        if browser is not None:
            browser.close()
            playwright.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"\n{args.pair}, {args.max_new_tokens} new tokens, {len(prompts)} prompts x {args.rounds}; "
          "ratio = path / CLI (1.00: the same latency)")
    summarize(runs)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
