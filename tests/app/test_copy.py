"""The page in headless Chromium: what a reader copies from the assisted column is the assisted text, the rejected
drafts the token view shows beside it left out."""
import re
import shutil

import pytest

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

SELECT_ALL = "(el) => { window.getSelection().selectAllChildren(el); return window.getSelection().toString(); }"


@pytest.fixture(scope="module")
def browser():
    if not shutil.os.path.exists(CHROMIUM):
        pytest.skip("Debian chromium is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _copied(page, selector: str) -> tuple[str, str]:
    """Select everything inside `selector`: the selection's text, and what Ctrl+C puts on the clipboard."""
    selected = page.locator(selector).evaluate(SELECT_ALL)
    page.keyboard.press("Control+C")
    return selected, page.evaluate("navigator.clipboard.readText()")


def test_copying_the_assisted_column_copies_the_assisted_text_without_rejected_drafts(browser, tiny_app):
    url, _ = tiny_app
    context = browser.new_context(viewport={"width": 1280, "height": 1400})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url.rstrip("/"))
    page = context.new_page()
    page.goto(url)
    page.get_by_role("tab", name="Translation").click()
    page.locator("#input-translation textarea").fill("The committee postponed the vote until next week.")
    page.locator("#run-translation").click()
    page.wait_for_function("document.querySelector('#summary') && "
                           "document.querySelector('#summary').innerText.includes('speedup')", timeout=60_000)
    assert "identical to baseline" in page.locator("#summary").inner_text()
    # every token's title says its pass: "pass n: verified v, accepted a"; some pass turned a draft down
    titles = page.locator("#assisted-output [title]").evaluate_all("els => els.map(e => e.title)")
    passes = {m.group(1): (int(m.group(2)), int(m.group(3)))
              for m in (re.match(r"pass (\d+): verified (\d+).*accepted (\d+)", t) for t in titles)}
    assert any(verified > accepted for verified, accepted in passes.values()), passes
    # the token view still shows the rejected drafts, on screen (a draft that decodes to nothing takes no room)
    rejected = page.locator("#assisted-output .ag-rej")
    assert any(rejected.nth(i).bounding_box()["width"] > 0 for i in range(rejected.count()))

    baseline_selected, baseline_copied = _copied(page, "#baseline-output")
    assisted_selected, assisted_copied = _copied(page, "#assisted-output")
    assert baseline_selected.strip() and baseline_copied.strip()
    assert assisted_selected == baseline_selected
    assert assisted_copied == baseline_copied
    # the text alone, however the selection is made: inside the output box too
    assert page.locator("#assisted-output .ag-out").evaluate(SELECT_ALL) == \
        page.locator("#baseline-output .ag-out").evaluate(SELECT_ALL)
    context.close()
