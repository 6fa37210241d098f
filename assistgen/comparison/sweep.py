"""One setting swept over a few values: at each value, baseline then assisted generation, as `compare` runs them
(the same warm-up, the same speed probes, the same warnings), a few times over.

The runs go repeat by repeat, every value once per repeat, so a machine whose speed drifts touches every value
alike. Each point's figures are medians over its repeats, with the speedup's range. The CLI (`python -m assistgen
sweep`) and the page's Explore tab both run through `run_sweep`.

A sweep stops at the next decoding step once its stop event is set (the page's Stop, Ctrl-C at the command line):
the run under way is dropped, and the finished ones are kept.
"""
from __future__ import annotations

import csv
import io
import statistics
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from ..choices import DRAFT_SOURCE_NAMES, SCHEDULE_NAMES, TEMPERATURE_RULE, WINDOW_RANGE, temperature_allowed
from .breakeven import DISAGREE, BreakEven
from .request import Settings

# what can be swept: the setting's label, and the Settings field it sets (the assistant is a pair sharing the target)
OVER = {"temperature": "temperature", "num_assistant_tokens": "initial window (num_assistant_tokens)",
        "schedule": "window schedule", "draft_source": "draft source", "assistant": "assistant (pair)"}
MAX_VALUES = 8
MAX_REPEATS = 10


def parse_values(over: str, values: str | list) -> list:
    """The values to sweep, checked: numbers for temperature and window, names for the rest (an assistant's pair
    name is checked by the caller, who knows the catalog). A ValueError says what is wrong."""
    if over not in OVER:
        raise ValueError(f"can sweep over {', '.join(OVER)}; got {over!r}")
    items = [v.strip() for v in values.split(",")] if isinstance(values, str) else [str(v).strip() for v in values]
    items = [v for v in items if v]
    if not items:
        raise ValueError("give at least one value to sweep, comma-separated")
    if len(items) > MAX_VALUES:
        raise ValueError(f"at most {MAX_VALUES} values, got {len(items)}")
    parsed = []
    for item in items:
        if over == "temperature":
            try:
                value = float(item)
            except ValueError:
                raise ValueError(f"temperature {item!r} is not a number") from None
            if not temperature_allowed(value):
                raise ValueError(f"temperature must be {TEMPERATURE_RULE}, got {item}")
        elif over == "num_assistant_tokens":
            if not (item.isascii() and item.isdigit()) or not WINDOW_RANGE[0] <= int(item) <= WINDOW_RANGE[1]:
                raise ValueError(f"the window must be a whole number from {WINDOW_RANGE[0]} to {WINDOW_RANGE[1]}, "
                                 f"got {item!r}")
            value = int(item)
        elif over == "schedule" and item not in SCHEDULE_NAMES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULE_NAMES)}, got {item!r}")
        elif over == "draft_source":
            if item.lower() not in DRAFT_SOURCE_NAMES:
                raise ValueError(f"draft source must be one of {', '.join(DRAFT_SOURCE_NAMES)}, got {item!r}")
            value = DRAFT_SOURCE_NAMES[item.lower()]
        else:
            value = item
        parsed.append(value)
    if len(set(parsed)) != len(parsed):
        raise ValueError("each value once, please")
    return parsed


def drafted(run: dict) -> bool:
    """Whether a comparison's assisted run verified any draft: one that did not ran as plain decoding (its reason:
    `assisted.assistant_start`)."""
    return ((run["assisted"].get("acceptance") or {}).get("drafting_passes") or 0) > 0


def point_settings(base: Settings, over: str, value, repeat: int) -> Settings:
    """The settings of one run: the base, with the swept setting at `value` and the repeat as the seed (sampled
    repeats draw differently; greedy ones do not depend on it)."""
    changed = {} if over == "assistant" else {over: value}
    return replace(base, seed=repeat, **changed)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


ACCEPTANCE_KEYS = ("mean_acceptance_length", "draft_acceptance_rate", "zero_accept_share", "alpha")


def point_figures(runs: list[dict]) -> dict:
    """The figures of one point from its runs: medians of speedup, tokens per target pass, latencies, the acceptance
    figures (`comparison.acceptance`, per draft position too) and the cost ratio c, with the speedup's range.

    Each run is a flat record: `speedup`, `tokens_per_pass`, `baseline_latency_s`, `latency_s` (the assisted
    run's), `acceptance` (`Acceptance.to_dict()`), `cost_ratio`; a missing figure counts nowhere. The sweep reads
    its comparisons so (`Point.summary`), and the benchmark its rows, grouped by temperature and configuration
    (`tools.report.summarize`)."""
    acc = [r.get("acceptance") or {} for r in runs]
    speedups = [r["speedup"] for r in runs if r.get("speedup") is not None]
    longest = max((len(a.get("per_position") or []) for a in acc), default=0)
    return {
        "speedup": _median(speedups), "speedup_min": min(speedups, default=None),
        "speedup_max": max(speedups, default=None),
        "tokens_per_pass": _median(r.get("tokens_per_pass") for r in runs),
        "baseline_latency_s": _median(r.get("baseline_latency_s") for r in runs),
        "latency_s": _median(r.get("latency_s") for r in runs),
        **{key: _median(a.get(key) for a in acc) for key in ACCEPTANCE_KEYS},
        "per_position": [_median(a["per_position"][i] for a in acc if len(a.get("per_position") or []) > i)
                         for i in range(longest)],
        "cost_ratio": _median(r.get("cost_ratio") for r in runs),
    }


def _flat(run: dict) -> dict:
    """A comparison's figures (`Comparison.to_dict()`) as the flat record `point_figures` reads."""
    return {"speedup": run["speedup"], "tokens_per_pass": run["assisted"]["tokens_per_pass"],
            "baseline_latency_s": run["baseline"]["latency_s"], "latency_s": run["assisted"]["latency_s"],
            "acceptance": run["assisted"]["acceptance"], "cost_ratio": run["cost_ratio"]}


@dataclass
class Point:
    """One value of the swept setting and its runs (each a `Comparison.to_dict()`)."""
    value: object
    runs: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        """Medians over the repeats, the speedup's range, and at temperature 0 whether every repeat's assisted
        output was identical to its baseline."""
        runs = self.runs
        figures = point_figures([_flat(r) for r in runs])
        readings = [r["break_even"] for r in runs if r.get("break_even")]
        greedy = bool(runs) and all(r["settings"]["temperature"] == 0 for r in runs)
        predicted = _median(b["predicted"] for b in readings)
        measured = figures["speedup"]
        return {
            "value": self.value, "runs": len(runs),
            **{k: figures[k] for k in ("speedup", "speedup_min", "speedup_max", "tokens_per_pass",
                                       "baseline_latency_s")},
            "assisted_latency_s": figures["latency_s"],
            **{k: figures[k] for k in (*ACCEPTANCE_KEYS, "per_position", "cost_ratio")},
            "gamma": _median(b["gamma"] for b in readings),
            "predicted_speedup": predicted,
            "prediction_disagrees": None if predicted is None or measured is None
            else abs(measured - predicted) > DISAGREE * predicted,
            "identical": [r["identical"] for r in runs] if greedy else None,
            "identical_all": all(r["identical"] for r in runs) if greedy else None,
            "reliable": all((r.get("stability") or {}).get("stable", True) for r in runs),
            "drafted": any(drafted(r) for r in runs),
            "draft_source": sorted({r["draft_source"] for r in runs}),
            "pair": sorted({r["pair"] for r in runs}),
            "warnings": sorted({w for r in runs for w in r["warnings"]}),
        }

    def break_even_readings(self) -> list[BreakEven]:
        return [BreakEven(**{k: v for k, v in r["break_even"].items()}) for r in self.runs if r.get("break_even")]


class SweepStopped(Exception):
    """Raised at a run's next decoding step once its sweep's stop event is set; `run_sweep` drops that run."""


@dataclass
class Progress:
    """Where a sweep stands after one more run: `done` of `total` runs (a point each: one value, one repeat), every
    value's runs so far, seconds spent; `stopped` once the sweep was stopped before its end."""
    done: int
    total: int
    points: list[Point]
    elapsed_s: float
    last: tuple | None = None   # (value, repeat) of the run just finished
    stopped: bool = False

    @property
    def left_s(self) -> float | None:
        """Seconds left, at the pace so far."""
        return self.elapsed_s / self.done * (self.total - self.done) if self.done else None

    @property
    def stop_message(self) -> str | None:
        """What a stopped sweep says; None for one that ran (or still runs) to its end."""
        if not self.stopped:
            return None
        return (f"Stopped by the user after {self.done} of {self.total} points; the point under way was dropped, "
                "the finished ones are kept.")

    def state(self) -> dict:
        """How far the sweep got, for its JSON."""
        return {"points_done": self.done, "points_planned": self.total, "stopped": self.stop_message}


def sweep_plan(values: list, repeats: int) -> list[tuple[int, object]]:
    """(repeat, value) in the order a sweep runs them: repeat by repeat, every value once per repeat, so a machine
    whose speed drifts touches every value alike. The benchmark runs its temperatures so too."""
    return [(repeat, value) for repeat in range(repeats) for value in values]


def run_sweep(over: str, values: list, repeats: int, base: Settings, pair_name: str,
              run_one: Callable[[Settings, str, Callable[[object], None]], dict],
              clock: Callable[[], float] | None = None, stop: threading.Event | None = None
              ) -> Iterator[Progress]:
    """Run every value `repeats` times (`sweep_plan`) through `run_one(settings, pair_name, on_step)`, which runs one
    comparison, calls `on_step(step)` after each decoding step of either run, and returns the comparison's
    `Comparison.to_dict()`; yield the progress after each run. Sweeping the assistant, each value is the name of a
    pair sharing the target; otherwise every run uses `pair_name`.

    Once `stop` is set, no run starts and the one under way raises `SweepStopped` from its next `on_step`: it is
    dropped, and a last progress with `stopped` set holds the runs that finished."""
    clock = clock or time.perf_counter
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be from 1 to {MAX_REPEATS}, got {repeats}")
    plan = sweep_plan(values, repeats)
    points = {v: Point(v) for v in values}
    done, started = 0, clock()

    def on_step(_step) -> None:
        if stop is not None and stop.is_set():
            raise SweepStopped()

    def snapshot() -> list[Point]:   # each progress its own lists: a reader may render it while the sweep runs on
        return [Point(p.value, list(p.runs)) for p in points.values()]
    for repeat, value in plan:
        settings = point_settings(base, over, value, repeat)
        try:
            on_step(None)
            result = run_one(settings, value if over == "assistant" else pair_name, on_step)
        except SweepStopped:
            yield Progress(done, len(plan), snapshot(), clock() - started, stopped=True)
            return
        points[value].runs.append({k: v for k, v in result.items() if k != "windows"})
        done += 1
        yield Progress(done, len(plan), snapshot(), clock() - started, (value, repeat))


def sweep_json(over: str, points: list[Point], meta: dict) -> dict:
    """The sweep as one JSON object: what ran, each point's summary, and each run's figures (without the per-pass
    trace, which `compare --json` gives). A value that has not run yet (a stopped sweep) has no point."""
    def lean(run: dict) -> dict:
        return {**run, "assisted": {k: v for k, v in run["assisted"].items() if k != "steps"}}
    return {**meta, "over": over, "values": [p.value for p in points],
            "points": [{**p.summary(), "each_run": [lean(r) for r in p.runs]} for p in points if p.runs]}


CSV_COLUMNS = ["value", "runs", "speedup", "speedup_min", "speedup_max", "tokens_per_pass", "mean_acceptance_length",
               "draft_acceptance_rate", "zero_accept_share", "per_position", "alpha", "cost_ratio", "gamma",
               "predicted_speedup", "identical_all", "reliable"]


def sweep_csv(over: str, points: list[Point]) -> str:
    """One row per point that ran; per-position acceptance as position:rate pairs."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([over] + CSV_COLUMNS[1:])
    for point in points:
        if not point.runs:
            continue
        s = point.summary()
        s["per_position"] = " ".join(f"{i + 1}:{v:.3f}" for i, v in enumerate(s["per_position"]))
        writer.writerow([s[c] if not isinstance(s[c], float) else round(s[c], 4) for c in CSV_COLUMNS])
    return out.getvalue()


def sweep_break_even(points: list[Point]) -> tuple[list[BreakEven], float | None]:
    """Every finished run's break-even reading, across all points, and their median window γ: what the break-even
    map (`views.plots.sweep_break_even_figure`) draws."""
    readings = [b for p in points for b in p.break_even_readings()]
    return readings, _median(b.gamma for b in readings)


def assistant_choices(catalog, pair_name: str, task: str) -> list[str]:
    """The pairs that share `pair_name`'s target and do `task`: what an assistant sweep can compare."""
    target = catalog.pair(pair_name).target.name
    return [p.name for p in catalog.pairs if p.target.name == target and task in p.tasks]
