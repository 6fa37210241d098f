"""The Gradio the page's patches were written for, and what each patch does when another one is installed.

app.py reaches into Gradio in three places that Gradio does not offer as settings; each was written against the
release requirements.txt pins and may silently stop working in another. A release with the same major and minor
version counts as the same (patch releases keep internals); any other is decided per patch:

- **refusing audio URLs** (`gr.Audio.async_move_resource_to_block_cache`, replaced): without it an API call could
  make the server fetch a URL whole, past the upload limit. The page is not safe without it, so another Gradio
  stops the page at import (`require`).
- **the queue's polling** (`Blocks._queue`'s sleep intervals, raised to 50 ms): without it the queue polls every
  millisecond during the timed runs, which only slows them; skipped with a warning (`applies`).
- **the status tracker's timer** (`frontend.EarlyScript`, a script matched to Gradio's page): without it an idle page
  asks for a frame at the display's rate, which only costs CPU time; skipped with a warning (`applies`).

Gradio-free: the installed version is read from the package's metadata.
"""
from __future__ import annotations

import importlib.metadata
import warnings

WRITTEN_FOR = "6.31.0"   # requirements.txt's gradio==; tests/app/test_gradio_compat.py holds them equal
AUDIO_URLS = "refusing audio URLs (gr.Audio.async_move_resource_to_block_cache)"
QUEUE_POLLING = "the queue's polling interval (Blocks._queue)"
TIMER_SCRIPT = "the status tracker's timer script (frontend.EarlyScript)"


class GradioVersionError(RuntimeError):
    """The installed Gradio is not the one a patch the page cannot do without was written for."""


def installed() -> str:
    return importlib.metadata.version("gradio")


def same_release(version: str, written_for: str = WRITTEN_FOR) -> bool:
    """Whether `version` has `written_for`'s major and minor version."""
    return version.split(".")[:2] == written_for.split(".")[:2]


def require(patch: str, version: str | None = None) -> None:
    """For a patch the page is unsafe without: GradioVersionError, saying what to do, unless the installed Gradio
    (or `version`) is the release the patch was written for."""
    version = version or installed()
    if not same_release(version):
        raise GradioVersionError(
            f"Gradio {version} is installed, but {patch} was written for Gradio {WRITTEN_FOR} and the page is not "
            f"safe without it: install gradio=={WRITTEN_FOR} (pip install -r requirements.txt), or check the patch "
            "in app.py against this Gradio and update gradio_compat.WRITTEN_FOR and requirements.txt together")


def applies(patch: str, version: str | None = None) -> bool:
    """For a patch the page only runs slower without: whether to apply it; False, with a warning, when the installed
    Gradio (or `version`) is another release than the one the patch was written for."""
    version = version or installed()
    if same_release(version):
        return True
    warnings.warn(f"Gradio {version} is installed, but {patch} was written for Gradio {WRITTEN_FOR}: skipped (the "
                  "page works without it, using a little more CPU time)", RuntimeWarning, stacklevel=2)
    return False
