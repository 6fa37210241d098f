"""The page in headless Chromium: run a chat comparison and see both panels and the figures."""
import shutil

import pytest

from helpers import RecordedRuns, runaway

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")   # every test here drives the browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if not shutil.which("chromium") and not shutil.os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def test_chat_comparison_fills_both_panels_and_shows_the_figures(browser, tiny_app, tmp_path):
    url, _ = tiny_app
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.goto(url)
    page.locator("#input-chat textarea").fill("def fibonacci(n):")
    page.locator("#run-chat").click()
    page.wait_for_function("document.querySelector('#summary') && "
                           "document.querySelector('#summary').innerText.includes('speedup')", timeout=60_000)
    baseline = page.locator("#baseline-output .ag-out").inner_text()
    assisted = page.locator("#assisted-output .ag-out")
    assert baseline.strip() and baseline.strip() != "…"
    assert assisted.locator(".ag-acc, .ag-own").count() > 0
    assert "tokens / pass" in page.locator("#assisted-figures").inner_text()
    assert "latency" in page.locator("#baseline-figures").inner_text()
    assert "identical to baseline" in page.locator("#summary").inner_text()
    # the per-pass chart: a rendered image (the empty plot shows only an svg icon), a moment after the summary
    page.locator("#steps-plot img:not([src^='data:image/svg'])").first.wait_for(timeout=30_000)
    page.screenshot(path=str(tmp_path / "chat.png"), full_page=True)
    assert (tmp_path / "chat.png").stat().st_size > 10_000


def test_bad_input_shows_an_error_and_keeps_the_input(browser, tiny_app):
    url, _ = tiny_app
    page = browser.new_page()
    page.goto(url)
    page.locator("#input-chat textarea").fill("   ")
    page.locator("#run-chat").click()
    page.get_by_text("the text is empty").first.wait_for(timeout=30_000)
    assert page.locator("#input-chat textarea").input_value() == "   "
    # the run is over: Stop goes, and Run can be pressed again for the corrected input
    page.locator("#stop-chat").wait_for(state="hidden", timeout=10_000)
    assert page.locator("#run-chat").is_enabled()
    page.locator("#input-chat textarea").fill("def fibonacci(n):")
    page.locator("#run-chat").click()
    page.wait_for_function("document.querySelector('#summary') && "
                           "document.querySelector('#summary').innerText.includes('speedup')", timeout=60_000)


def test_a_tab_brings_its_pairs_own_settings(browser, tiny_app):
    url, service = tiny_app
    page = browser.new_page()
    page.goto(url)
    page.locator("#settings > button, #settings .label-wrap").first.click()
    box = page.locator("#max-new-tokens input[type=number]")
    assert box.input_value() == str(service.pair_defaults("tiny-text")[0])
    page.get_by_role("tab", name="Speech recognition").click()
    page.wait_for_function("(want) => document.querySelector('#max-new-tokens input[type=number]').value == want",
                           arg=str(service.pair_defaults("tiny-speech")[0]), timeout=10_000)


def test_an_open_page_asks_for_no_frames_for_status_timers(browser, tiny_app):
    """Gradio 6.31 leaves its loading screen's status-tracker timer asking for an animation frame at every frame
    after the screen is gone, taking CPU from the timed runs when the browser shares the machine: the app's early
    script (assistgen/app/frontend.py) makes such a timer tick once a second. Counted here: timer callbacks that
    reach the browser's own requestAnimationFrame while the page sits open (about 60 a second without the script)."""
    url, _ = tiny_app
    page = browser.new_page()
    page.add_init_script("window.__timers = 0; window.__frames = 0; const f = window.requestAnimationFrame.bind(window);"
                         "window.requestAnimationFrame = (cb) => { window.__frames += 1;"
                         "  if (String(cb).includes('performance.now()')) window.__timers += 1; return f(cb); };")
    page.goto(url)
    page.locator("#run-chat").wait_for()
    page.wait_for_timeout(1000)
    frames, timers = page.evaluate("[window.__frames, window.__timers]")
    page.wait_for_timeout(1000)
    assert page.evaluate("window.__frames") > frames   # the count works: Gradio's other animations still run
    assert page.evaluate("window.__timers") == timers == 0


@pytest.mark.parametrize("leave", ["stop", "close the page"])
def test_stop_or_leaving_the_page_ends_the_run_and_the_next_run_starts_at_once(browser, tiny_app, monkeypatch,
                                                                                 leave):
    """Each run is held after its third step until its stream is closed, so it cannot end on its own before the Stop
    or the page's close, however slow the machine; once closed, it makes no step but the one in flight."""
    url, service = tiny_app
    pair = service.pool.pair("tiny-text")
    monkeypatch.setattr(pair.target.model, "forward", runaway(pair.target.model, pair.target.eos_token_ids, 0.0))
    settings = service.settings
    monkeypatch.setattr(service, "settings", lambda name, **kw: settings(name, **{**kw, "max_new_tokens": 1024}))
    runs = RecordedRuns(service, monkeypatch, hold={"tell me a long story": 3})
    page = browser.new_page()
    page.goto(url)
    page.locator("#input-chat textarea").fill("tell me a long story")
    page.locator("#run-chat").click()
    page.wait_for_function("document.querySelector('#status').innerText.includes('baseline running') && "
                           "document.querySelector('#baseline-output').innerText.trim().length > 0", timeout=60_000)
    if leave == "stop":
        page.locator("#stop-chat").click()
        page.get_by_text("stopped").first.wait_for(timeout=10_000)
        assert not page.locator("#stop-chat").is_visible()
        assert page.locator("#input-chat textarea").input_value() == "tell me a long story"
        assert page.locator("#baseline-output").inner_text().strip()   # what it had written stays
        # Run at once: while Gradio winds the stopped run down, Run is off, then it starts a new run (it was dropped
        # when pressed in that moment); stopped too
        page.locator("#run-chat").click()
        page.wait_for_function("document.querySelector('#status').innerText.includes('baseline running')",
                               timeout=30_000)
        page.locator("#stop-chat").click()
        page.get_by_text("stopped").first.wait_for(timeout=10_000)
    else:
        page.close()
    assert len(runs.runs) == (2 if leave == "stop" else 1)
    for run in runs.runs:
        runs.assert_stopped(run)
    monkeypatch.undo()
    page = page if leave == "stop" else browser.new_page()
    if leave != "stop":
        page.goto(url)
        page.locator("#input-chat textarea").fill("def fibonacci(n):")
    page.locator("#run-chat").click()
    page.wait_for_function("document.querySelector('#summary') && "
                           "document.querySelector('#summary').innerText.includes('speedup')", timeout=60_000)


def test_explore_runs_a_sweep_and_shows_every_point(browser, tiny_app):
    url, _ = tiny_app
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    page.goto(url)
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-text textarea").fill("hello there")
    page.locator("#explore-values textarea, #explore-values input").first.fill("0, 1.0")
    tokens = page.locator("#explore-max-new-tokens input[type=number]")
    tokens.fill("6")
    tokens.press("Tab")
    page.locator("#explore-run").click()
    page.wait_for_function("document.querySelector('#explore-progress') && "
                           "document.querySelector('#explore-progress').innerText.includes('done')", timeout=120_000)
    assert "2 of 2 runs" in page.locator("#explore-progress").inner_text()
    rows = [line for line in page.locator("#explore-table").inner_text().splitlines() if "\t" in line][1:]   # a table
    assert [row.split()[0] for row in rows] == ["0.0", "1.0"], rows   # every point, in order
    assert "all" in rows[0]   # greedy: the assisted output identical to its baseline
    assert page.locator("#explore-plot img, #explore-plot canvas, #explore-plot svg").count() > 0
    # Stop goes away once the handler has ended, in an update of its own just after the last point
    sync_api.expect(page.locator("#explore-stop")).to_be_hidden(timeout=10_000)
    sync_api.expect(page.locator("#explore-run")).to_be_enabled(timeout=10_000)


def test_explore_stop_ends_the_sweep_at_once_and_keeps_the_finished_points(browser, tiny_app, monkeypatch):
    url, service = tiny_app
    pair = service.pool.pair("tiny-text")
    monkeypatch.setattr(pair.target.model, "forward", runaway(pair.target.model, pair.target.eos_token_ids, 0.01))
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    page.goto(url)
    page.get_by_role("tab", name="Explore").click()
    page.locator("#explore-text textarea").fill("hello there")
    page.locator("#explore-values textarea, #explore-values input").first.fill("0, 1.0, 0.5")
    tokens = page.locator("#explore-max-new-tokens input[type=number]")
    tokens.fill("200")
    tokens.press("Tab")
    page.locator("#explore-run").click()
    page.wait_for_function("document.querySelector('#explore-progress') && "
                           "document.querySelector('#explore-progress').innerText.includes('1 of 3 runs')",
                           timeout=120_000)
    page.locator("#explore-stop").click()
    page.wait_for_function("document.querySelector('#explore-progress') && "
                           "document.querySelector('#explore-progress').innerText.includes('Stopped by the user')",
                           timeout=30_000)
    status = page.locator("#explore-progress").inner_text()
    assert "Stopped by the user after 1 of 3 points" in status or "after 2 of 3 points" in status, status
    done = int(status.split("after ")[1].split(" of")[0])
    rows = [line for line in page.locator("#explore-table").inner_text().splitlines() if "\t" in line][1:]
    assert len(rows) == done, rows   # the finished points, and no partly-run one
    assert not page.locator("#explore-stop").is_visible()
    # Run comes back once the handler has ended, in an update of its own just after the stopped message
    sync_api.expect(page.locator("#explore-run")).to_be_enabled(timeout=10_000)
