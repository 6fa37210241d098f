"""The page's Explore tab without Gradio: a sweep request checked, run comparison by comparison through the service
(the same validation, loading, warm-up and speed probes as the main tab), and each step of it rendered."""
from __future__ import annotations

import html
import threading
from typing import Iterator

from ..choices import DRAFT_SOURCES, SCHEDULE_NAMES
from ..comparison.breakeven import DISAGREE
from ..comparison.sweep import (MAX_REPEATS, OVER, Point, Progress, assistant_choices, parse_values, run_sweep,
                                sweep_json)
from ..comparison.request import number, pair_for_task
from ..views.plots import sweep_break_even_figure, sweep_figure
from .validation import UserError

MAX_RUNS = 12                 # values × repeats, checked on the server
DEFAULT_MAX_NEW_TOKENS = 32   # short outputs: the default sweep finishes in about a minute on two cores


def default_values(catalog, over: str, task: str, pair_name: str | None) -> str:
    """What the values box offers for a setting: a few values that show the setting's effect."""
    if over == "assistant":
        return ", ".join(assistant_choices(catalog, pair_name, task)) if pair_name else ""
    return {"temperature": "0, 0.5, 1.0", "num_assistant_tokens": "2, 5, 10",
            "schedule": ", ".join(SCHEDULE_NAMES), "draft_source": ", ".join(DRAFT_SOURCES)}[over]


def explore(service, task: str, pair_name: str, *, over: str, values: str, repeats, max_new_tokens,
            text: str | None = None, audio: str | None = None, language: str | None = None,
            target_language: str = "French", stop: threading.Event | None = None) -> Iterator[Progress]:
    """Check the request, then run the sweep (`comparison.sweep.run_sweep`), each run a `Service.run` comparison;
    yield the progress after each. Settings that are not swept are the pair's own, at temperature 0.

    Setting `stop` (the page's Stop) stops the sweep at the model thread's next decoding step: the comparison under
    way is dropped and the last progress, its `stopped` set, holds the finished ones. Closing the generator stops
    the sweep after the comparison under way."""
    spec = pair_for_task(service.catalog, pair_name, task)
    if over not in OVER:
        raise UserError(f"pick a setting to sweep: {', '.join(OVER)}")
    try:
        parsed = parse_values(over, values or "")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    repeats = number("repeats", repeats, int)
    if not 1 <= repeats <= MAX_REPEATS:
        raise UserError(f"repeats must be from 1 to {MAX_REPEATS}")
    if len(parsed) * repeats > MAX_RUNS:
        raise UserError(f"at most {MAX_RUNS} runs (values × repeats); this asks for {len(parsed) * repeats}")
    if over == "assistant":
        allowed = assistant_choices(service.catalog, spec.name, task)
        bad = [v for v in parsed if v not in allowed]
        if bad:
            raise UserError(f"{', '.join(bad)}: not a pair sharing {spec.name}'s target; pick from "
                            f"{', '.join(allowed)}")
        for name in parsed:
            pair_for_task(service.catalog, name, task)
    base = service.settings(pair_name, max_new_tokens=max_new_tokens)

    def run_one(settings, name: str, on_step) -> dict:
        return service.run(task, name, text=text, audio=audio, settings=settings, language=language,
                           target_language=target_language, on_step=on_step).to_dict()
    yield from run_sweep(over, parsed, repeats, base, spec.name, run_one, stop=stop)


class StopSwitches:
    """The Stop of each open page's sweep (keyed by Gradio's session hash), kept on the server: Run arms a fresh
    event for the page, Stop sets it, and the model thread stops at its next decoding step. The sweep then ends on
    its own and its last update (the finished points, how far it got) reaches the page; a Gradio cancel would close
    the tab's stream instead, and that update would be lost."""

    def __init__(self):
        self._events: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def arm(self, session: str) -> threading.Event:
        """A new, unset event for the page's next sweep."""
        with self._lock:
            self._events[session] = event = threading.Event()
        return event

    def current(self, session: str) -> threading.Event:
        """The page's armed event (one armed now if Run's first step was skipped)."""
        with self._lock:
            return self._events.setdefault(session, threading.Event())

    def press(self, session: str) -> bool:
        """Stop the page's sweep; False if it has none."""
        with self._lock:
            event = self._events.get(session)
        if event is None:
            return False
        event.set()
        return True

    def release(self, session: str, event: threading.Event) -> None:
        """Forget the page's event once its sweep is over (unless a newer one was armed meanwhile)."""
        with self._lock:
            if self._events.get(session) is event:
                del self._events[session]


def progress_html(progress: Progress | None, total: int | None = None) -> str:
    """A progress bar with the runs done and the time left at the pace so far; a stopped sweep says so."""
    if progress is None:
        return (f"<div id='explore-progress'><progress value='0' max='{total or 1}'></progress> starting: loading "
                "and warming up the pair (once)…</div>")
    done = progress.done == progress.total
    left = progress.left_s
    text = (f"{progress.done} of {progress.total} runs" + ("" if done else
            f", about {left:.0f} s left" if left is not None else "") + f" ({progress.elapsed_s:.0f} s so far)")
    if progress.stopped:
        text = progress.stop_message
    elif done:
        text = f"done: {text}"
    return (f"<div id='explore-progress'><progress value='{progress.done}' max='{progress.total}'></progress> "
            f"{html.escape(text)}</div>")


def _f(value, spec=".2f") -> str:
    return "–" if value is None else format(value, spec)


def points_markdown(over: str, points: list[Point]) -> str:
    """One row per point that has run: speedup (median, range), the formula's prediction, tokens per pass and
    acceptance in vLLM's terms; at temperature 0, whether every repeat matched its baseline."""
    lines = [f"| {OVER[over]} | runs | speedup (min–max) | predicted | tokens / pass | mean acceptance length | "
             "draft acceptance | accepted nothing | per position | identical | timing |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for point in points:
        if not point.runs:
            continue
        s = point.summary()
        identical = "–" if s["identical_all"] is None else ("all" if s["identical_all"] else "**NO**")
        predicted = f"{_f(s['predicted_speedup'])}×" if s["drafted"] else "nothing drafted"
        lines.append(f"| {point.value} | {s['runs']} | {_f(s['speedup'])}× ({_f(s['speedup_min'])}–"
                     f"{_f(s['speedup_max'])}) | {predicted} | {_f(s['tokens_per_pass'])} | "
                     f"{_f(s['mean_acceptance_length'])} | {_f(s['draft_acceptance_rate'], '.0%')} | "
                     f"{_f(s['zero_accept_share'], '.0%')} | "
                     + (" ".join(f"{v:.0%}" for v in s["per_position"][:6]) or "–")
                     + f" | {identical} | {'reliable' if s['reliable'] else '**not reliable**'} |")
    return "\n".join(lines)


def disagreements(points: list[Point]) -> str:
    """Each run whose measured speedup is further from the formula's than `breakeven.DISAGREE`, and why."""
    notes = []
    for point in points:
        for run in point.runs:
            be = run.get("break_even")
            if be and be["disagrees"]:
                notes.append(f"- {point.value}: measured {be['measured']:.2f}×, predicted {be['predicted']:.2f}× "
                             f"(α {be['alpha']:.2f}, c {be['c']:.2f}, γ {be['gamma']:.1f}): {be['why']}")
    if not notes:
        return ""
    return f"**Measured and predicted differ by more than {DISAGREE * 100:.0f} %:**\n" + "\n".join(dict.fromkeys(notes))


def warnings_markdown(points: list[Point]) -> str:
    """Each point's warnings (a time limit that cut a run short, a machine whose speed moved, drafting off)."""
    notes = [f"- {point.value}: {w}" for point in points if point.runs for w in point.summary()["warnings"]]
    return "**Notes:**\n" + "\n".join(notes) if notes else ""


def explore_outputs(over: str, progress: Progress, title: str, meta: dict | None = None) -> dict:
    """The tab's outputs after one more run: progress, the sweep plot so far, the table, the break-even map, and
    the sweep's JSON as the CLI writes it (`meta`: what ran), with how far it got."""
    return {"progress": progress_html(progress), "plot": sweep_figure(over, progress.points, title),
            "table": "\n\n".join([points_markdown(over, progress.points), disagreements(progress.points),
                                    warnings_markdown(progress.points)]),
            "break_even": sweep_break_even_figure(progress.points),
            "json": sweep_json(over, progress.points, {**(meta or {}), **progress.state()})}
