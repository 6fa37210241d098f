"""What the command-line tools share: a user error type, a progress bar on stderr, and loading a pair with one."""
from __future__ import annotations

import sys


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def pair_for(catalog, name: str, task: str, audio) -> object:
    """The catalog's pair `name`, checked for `task` and its input (--audio for speech, --text otherwise)."""
    try:
        spec = catalog.pair(name)
    except KeyError as exc:
        raise CliError(exc.args[0]) from None
    if task not in spec.tasks:
        raise CliError(f"pair {spec.name!r} does not do {task}; it does {', '.join(spec.tasks)}")
    if (task == "asr") != (audio is not None):
        raise CliError("--task asr needs --audio FILE; the other tasks need --text TEXT")
    return spec


def progress_bar(min_interval_s: float = 0.5):
    """A tqdm bar on stderr and the `report(fraction, message)` callback that drives it, redrawn at most every
    `min_interval_s` (a conversion reports every tensor: thousands of lines in a log that is not a terminal)."""
    import time

    from tqdm import tqdm
    bar = tqdm(total=100, file=sys.stderr, bar_format="{l_bar}{bar}| {n:.0f}%", leave=False)
    last = [0.0]

    def report(fraction: float, message: str) -> None:
        bar.set_description(message[:60], refresh=False)
        bar.n = round(100 * fraction)
        now = time.monotonic()
        if now - last[0] >= min_interval_s or fraction >= 1.0:
            last[0] = now
            bar.refresh()
    return bar, report


def load_pair(catalog, spec):
    """The pair, loaded with a progress bar on stderr; CliError when it is unavailable or fails to load."""
    from ..models.availability import pair_availability
    from ..models.loading import LoadError
    from ..models.pool import ModelPool
    ok, why = pair_availability(spec, catalog)
    if not ok:
        raise CliError(f"pair {spec.name!r} is unavailable: {why}")
    bar, report = progress_bar()
    try:
        return ModelPool(catalog).pair(spec, report)
    except LoadError as exc:
        raise CliError(str(exc)) from None
    finally:
        bar.close()
