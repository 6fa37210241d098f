"""What the command-line tools share: a user error type, a request checked as the page checks it, a progress bar on
stderr, and loading a pair with one."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..comparison.request import Request, build_request, pair_for_task, request_settings
from ..comparison.tasks import InputError
from ..models.availability import pair_availability
from ..models.catalog import Catalog, PairSpec
from ..models.loading import LoadError
from ..models.pool import ModelPool


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def named(names: dict[str, str], what: str):
    """An argparse type: a name (the page's, or the id: `choices.TASK_NAMES`, `DRAFT_SOURCE_NAMES`) to its id."""
    def parse(text: str) -> str:
        try:
            return names[text.strip().lower()]
        except KeyError:
            raise argparse.ArgumentTypeError(f"unknown {what} {text!r}; choose from {', '.join(names)}") from None
    parse.__name__ = what
    return parse


def named_list(names: dict[str, str], what: str):
    """An argparse type: comma-separated names to their ids, each once."""
    one = named(names, what)

    def parse(text: str) -> list[str]:
        values = [one(v) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"name at least one {what}")
        return list(dict.fromkeys(values))
    parse.__name__ = what
    return parse


def output_folder(path: str) -> Path:
    """`--out`, made now (before minutes of loading and running) or refused as one line: a file, or not writable."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CliError(f"--out {path}: a file is in the way; name a folder") from None
    except OSError as exc:
        raise CliError(f"--out {path}: cannot make the folder ({exc.strerror})") from None
    return out


def pair_for(catalog: Catalog, name: str, task: str, audio) -> PairSpec:
    """The catalog's pair `name`, checked for `task` (`request.pair_for_task`) and its input: --audio for speech,
    --text otherwise."""
    try:
        spec = pair_for_task(catalog, name, task)
    except InputError as exc:
        raise CliError(str(exc)) from None
    if (task == "asr") != (audio is not None):
        raise CliError("--task asr needs --audio FILE; the other tasks need --text TEXT")
    return spec


# a setting's name in the messages the page and the API share, and the option that sets it here
FLAGS = {"max_new_tokens": "--max-new-tokens", "num_assistant_tokens": "--num-assistant-tokens",
         "initial window": "--num-assistant-tokens", "temperature": "--temperature", "seed": "--seed"}


def as_flags(message: str) -> str:
    """A refusal that names a setting, naming the command line's option instead."""
    for name, flag in FLAGS.items():
        if message.startswith(name + " "):
            return flag + message[len(name):]
    return message


def checked_request(spec: PairSpec, args) -> Request:
    """The request the options of `compare` or `sweep` make for `spec` (`request.build_request`): what is not given
    is the pair's own; no time limit on a run."""
    try:
        settings = request_settings(spec, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    top_p=getattr(args, "top_p", 1.0),
                                    draft_source=args.draft_source, num_assistant_tokens=args.num_assistant_tokens,
                                    schedule=args.schedule, seed=getattr(args, "seed", 0))
        return build_request(spec, args.task, settings, text=args.text, audio=args.audio,
                             target_language=args.target_language, language=args.language)
    except InputError as exc:
        raise CliError(as_flags(str(exc))) from None


def progress_bar(min_interval_s: float = 0.5):
    """A tqdm bar on stderr and the `report(fraction, message)` callback that drives it, redrawn at most every
    `min_interval_s` (a conversion reports every tensor: thousands of lines in a log that is not a terminal)."""
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
