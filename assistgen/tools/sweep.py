"""python -m assistgen sweep: one setting over a few values, baseline then assisted at each, a few times over.

  python -m assistgen sweep --pair qwen2.5-coder-1.5b-w8a8+0.5b-int8 --task chat --text "Write a haiku about tea." \
      --over temperature --values 0,0.5,1.0 --repeats 2 --max-new-tokens 64 --out results/

Each run is a full comparison (warm-up, speed probes before, between and after, the same warnings as `compare`).
Writes sweep.json, sweep.csv, sweep.png (speedup, tokens per pass, acceptance, per-position acceptance) and
break_even.png (where each run sits against the break-even line) to --out; --json prints the JSON. Ctrl-C stops
the sweep at its next decoding step and writes the runs that finished (a second Ctrl-C quits at once).
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import threading
from pathlib import Path
from typing import Iterator

from ..choices import DRAFT_SOURCE_NAMES, SCHEDULE_NAMES, TASK_NAMES
from ..comparison.compare import compare
from ..comparison.request import Settings, request_inputs
from ..comparison.sweep import (MAX_REPEATS, OVER, Point, Progress, assistant_choices, drafted, parse_values,
                                run_sweep, sweep_csv, sweep_json)
from ..comparison.tasks import LANGUAGES, InputError
from ..models.availability import pair_availability
from ..models.catalog import load_catalog
from ..models.loading import LoadError
from ..models.pool import ModelPool
from ..views.plots import sweep_break_even_figure, sweep_figure
from .terminal import CliError, checked_request, named, output_folder, pair_for, progress_bar


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m assistgen sweep` (the catalog is the command line's global --catalog)."""
    p.add_argument("--pair", required=True, help="the pair (sweeping the assistant: the pair whose target is kept)")
    p.add_argument("--task", required=True, type=named(TASK_NAMES, "task"), metavar="TASK",
                   help="the task the input is for: chat, translation, summarization or speech-recognition (asr)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the prompt (chat), or the text to translate or summarize")
    source.add_argument("--audio", help="a speech clip (task asr)")
    p.add_argument("--over", required=True, choices=list(OVER), help="the setting to sweep")
    p.add_argument("--values", required=True,
                   help="comma-separated values of --over: temperatures (0 = greedy), windows, schedule names ("
                        + ", ".join(SCHEDULE_NAMES) + "), draft sources (assistant, assistant+lookup, prompt-lookup) "
                        "or pair names sharing --pair's target")
    p.add_argument("--repeats", type=int, default=2, help=f"runs per value, 1 to {MAX_REPEATS} (default 2)")
    p.add_argument("--max-new-tokens", type=int, help="per run (default: the pair's own)")
    p.add_argument("--temperature", type=float, default=0.0, help="when not swept: 0 = greedy (default)")
    p.add_argument("--draft-source", type=named(DRAFT_SOURCE_NAMES, "draft source"), metavar="SOURCE",
                   help="assistant, assistant+lookup or prompt-lookup, when not swept (default: the pair's own)")
    p.add_argument("--num-assistant-tokens", type=int, help="the initial window, when not swept (default: the pair's)")
    p.add_argument("--schedule", choices=SCHEDULE_NAMES, help="when not swept (default: the pair's own)")
    p.add_argument("--target-language", default="French", choices=LANGUAGES,
                   help="translation: into this (default French)")
    p.add_argument("--language", default="auto", help="speech: the spoken language's code, or auto (default)")
    p.add_argument("--json", action="store_true", help="print the sweep's JSON on stdout")
    p.add_argument("--out", metavar="DIR", help="write sweep.json, sweep.csv, sweep.png and break_even.png here")


def run(args: argparse.Namespace) -> int:
    """`python -m assistgen sweep`, with its parsed arguments."""
    catalog = load_catalog(args.catalog)
    spec = pair_for(catalog, args.pair, args.task, args.audio)
    request = checked_request(spec, args)
    base = request.settings
    values = _values(args, catalog, spec.name)
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise CliError(f"--repeats must be from 1 to {MAX_REPEATS}")
    out = output_folder(args.out) if args.out else None
    pool, pairs, inputs = ModelPool(catalog), {}, {}

    def loaded(name: str):
        """The pair and its inputs, loaded once (pairs sharing a target share it in the pool)."""
        if name not in pairs:
            pair_spec = catalog.pair(name)
            ok, why = pair_availability(pair_spec, catalog)
            if not ok:
                raise CliError(f"pair {name!r} is unavailable: {why}")
            bar, report = progress_bar()
            try:
                pairs[name] = pool.pair(pair_spec, report)
            except LoadError as exc:
                raise CliError(str(exc)) from None
            finally:
                bar.close()
            try:
                inputs[name] = request_inputs(request, pairs[name])
            except InputError as exc:
                raise CliError(str(exc)) from None
        return pairs[name], inputs[name]

    def run_one(settings: Settings, name: str, on_step) -> dict:
        pair, prepared = loaded(name)
        return compare(pair, args.task, prepared.inputs, settings, language=prepared.language,
                       on_baseline_step=on_step, on_assisted_step=on_step).to_dict()

    for name in (values if args.over == "assistant" else [spec.name]):
        loaded(name)   # every pair loaded before the first timed run
    stop = threading.Event()

    def interrupted(signum, frame) -> None:
        """The first Ctrl-C stops the sweep at its next decoding step and keeps what finished; a second quits."""
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("stopping at the next decoding step (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)
    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        progress = list(_report(args, run_sweep(args.over, values, args.repeats, base, spec.name, run_one,
                                                stop=stop)))[-1]
    finally:
        signal.signal(signal.SIGINT, previous)
    if progress.stopped:
        print(progress.stop_message, file=sys.stderr, flush=True)
    points = progress.points
    meta = {"pair": spec.name, "task": args.task, "repeats": args.repeats,
            "base_settings": {"max_new_tokens": base.max_new_tokens, "temperature": base.temperature,
                              "draft_source": base.draft_source, "num_assistant_tokens": base.num_assistant_tokens,
                              "schedule": base.schedule},
            "command": shlex.join(["python", "-m", "assistgen", *(getattr(args, "argv", []) or [])]),
            **progress.state()}
    result = sweep_json(args.over, points, meta)
    if out is not None:
        _write(out, args.over, points, result, f"{spec.name}, {args.task}: {args.repeats} repeat(s)")
    if args.json:
        print(json.dumps(result, indent=1, ensure_ascii=False))
        return 0
    print(sweep_table(args.over, result["points"]))
    return 0


def _values(args: argparse.Namespace, catalog, pair_name: str) -> list:
    """The values to sweep, read for the setting; for the assistant, pairs that share `pair_name`'s target."""
    try:
        values = parse_values(args.over, args.values)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.over == "assistant":
        allowed = assistant_choices(catalog, pair_name, args.task)
        bad = [v for v in values if v not in allowed]
        if bad:
            raise CliError(f"not a pair sharing {pair_name}'s target for {args.task}: {', '.join(bad)}; "
                           f"choose from {', '.join(allowed)}")
    return values


def _write(out: Path, over: str, points: list[Point], result: dict, title: str) -> None:
    """The sweep's JSON, CSV and two charts into the folder `out`."""
    (out / "sweep.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    (out / "sweep.csv").write_text(sweep_csv(over, points))
    sweep_figure(over, points, title).savefig(out / "sweep.png", dpi=110)
    sweep_break_even_figure(points).savefig(out / "break_even.png", dpi=110)
    print(f"wrote {out / 'sweep.json'}, {out / 'sweep.csv'}, {out / 'sweep.png'}, {out / 'break_even.png'}",
          file=sys.stderr)


def _report(args: argparse.Namespace, progresses: Iterator[Progress]) -> Iterator[Progress]:
    """Each finished run's line on stderr, as the sweep goes."""
    for progress in progresses:
        if progress.last is not None:
            value, repeat = progress.last
            s = next(p for p in progress.points if p.value == value).runs[-1]
            idle = not drafted(s)
            why = (s["assisted"].get("assistant_start") or {}).get("reason")
            print(f"[{progress.done}/{progress.total}] {args.over}={value} repeat {repeat + 1}: speedup "
                  f"{s['speedup']:.2f}x, {s['assisted']['tokens_per_pass']:.2f} tokens/pass"
                  + (f", nothing drafted ({why or 'no draft source proposed one'})" if idle else "")
                  + ("" if s["identical"] or s["settings"]["temperature"] > 0 else ", DIFFERS from baseline")
                  + ("" if (s["stability"] or {}).get("stable", True) else " (timing not reliable)"),
                  file=sys.stderr, flush=True)
        yield progress


def sweep_table(over: str, points: list[dict]) -> str:
    """The sweep's points as a Markdown table."""
    def f(value, spec=".2f"):
        return "–" if value is None else format(value, spec)
    lines = [f"| {over} | runs | speedup (min–max) | predicted | tokens/pass | mean acceptance length | draft acceptance "
             "| accepted nothing | per position | identical | reliable |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in points:
        identical = "–" if s["identical_all"] is None else ("all" if s["identical_all"] else "NO")
        predicted = f"{f(s['predicted_speedup'])}×" if s["drafted"] else "nothing drafted"
        lines.append(f"| {s['value']} | {s['runs']} | {f(s['speedup'])}× ({f(s['speedup_min'])}–{f(s['speedup_max'])})"
                     f" | {predicted} | {f(s['tokens_per_pass'])} | {f(s['mean_acceptance_length'])} | "
                     f"{f(s['draft_acceptance_rate'], '.0%')} | {f(s['zero_accept_share'], '.0%')} | "
                     + " ".join(f"{v:.0%}" for v in s["per_position"]) + f" | {identical} | "
                     f"{'yes' if s['reliable'] else 'no'} |")
    return "\n".join(lines)
