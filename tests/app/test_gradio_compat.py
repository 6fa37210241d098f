"""The page's patches of Gradio's internals hold to the Gradio they were written for: another release stops the page
where a patch keeps it safe, and skips, with a warning, a patch that only saves CPU time."""
import re
from pathlib import Path

import pytest

from assistgen.app import gradio_compat
from assistgen.app.gradio_compat import GradioVersionError, applies, require

ROOT = Path(__file__).resolve().parents[2]


def test_the_patches_are_written_for_the_gradio_requirements_pins_and_installed_here():
    pinned = re.search(r"^gradio==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)
    assert gradio_compat.WRITTEN_FOR == pinned
    assert gradio_compat.same_release(gradio_compat.installed())


@pytest.mark.parametrize("version", ["6.30.0", "7.0.0", "5.31.0"])
def test_another_gradio_stops_the_page_rather_than_serve_audio_urls(version):
    with pytest.raises(GradioVersionError, match=rf"Gradio {re.escape(version)} is installed.*gradio==6\.31\.0"):
        require(gradio_compat.AUDIO_URLS, version)


def test_a_patch_release_counts_as_the_same_gradio():
    require(gradio_compat.AUDIO_URLS, "6.31.4")
    assert applies(gradio_compat.QUEUE_POLLING, "6.31.4")


def test_another_gradio_keeps_its_own_queue_polling_with_a_warning(tiny_catalog_path, monkeypatch):
    import app
    from assistgen.app.service import Service
    from assistgen.models.catalog import load_catalog
    monkeypatch.setattr(gradio_compat, "installed", lambda: "6.32.0")
    with pytest.warns(RuntimeWarning, match="the queue's polling interval .* skipped"):
        demo = app.configure_queue(app.build_demo(Service(load_catalog(tiny_catalog_path))))
    assert demo._queue.sleep_when_free < app.QUEUE_POLL_S   # Gradio's own
