"""Benchmark: does assisted generation pay off for this pair, task and machine, and by how much?

    python -m assistgen bench --pair qwen2.5-coder-1.5b-w8a8+0.5b-int8 --suite code --suite chat \\
        --temperatures 0,0.7 --schedules heuristic,adaptive --repeats 2 --peer --out results/

Every item (prompt or clip) runs its baseline once per repeat and temperature, then each assisted configuration
(draft source x schedule; without --schedules, the pair's own default from models.yaml, as the app runs it) and,
with --peer, transformers' own ``generate(assistant_model=...)``. Each assisted run's speedup is taken against the
baseline run of the same item, repeat and temperature; the order of the runs rotates from one item to the next, so
drift on a shared machine hits every configuration alike. Several --pair run side by side, item by item, and every
run is also set against the first pair's baseline. --verify-curve times verify(k) for each target. Temperatures run
as a temperature sweep runs them (`comparison.sweep`: the same order, settings and seeds), and each temperature's
figures are the sweep's (`point_figures`, through `report.summarize`).

Defaults are chosen on one half of every set and reported on the other: --half tuning runs each set's 1st, 3rd,
5th... items (results.md then ranks our configurations, every suite counting once), --half held-out its 2nd, 4th...
items; --num-assistant-tokens 3,5,8 adds the initial window to what is compared.

Writes results.json (every run and the summary), results.md (tables) and PNG plots into --out, and runs.jsonl
line by line while it runs. Timings are figures to read, never asserts.
"""
from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers

from ..choices import DRAFT_SOURCE_NAMES, SCHEDULE_NAMES, TEMPERATURE_RULE, TEXT_TASKS, temperature_allowed
from ..comparison.compare import (assistant_start_reason, cost_ratio, effective_draft_source, first_inputs,
                                  run_generation, target_numerics, time_breakdown, warm_up)
from ..comparison import schedule_store
from ..comparison.request import Settings, build_request, request_inputs, request_settings
from ..comparison.acceptance import acceptance
from ..comparison.sweep import point_settings, sweep_plan
from ..comparison.speech import window_language
from ..engine.decoding import GenerationResult, synchronized_clock
from ..engine.prefix_cache import without_shared_prefix
from ..models.catalog import CatalogError, load_catalog
from ..models.devices import dtype_name
from ..models.loading import offloaded
from ..models.machine import cpu_model, vector_extensions
from .enginebench import set_assistant_knobs
from .passcosts import floor, memory_bandwidth_gb_s, plot_curves, verify_curve
from .peers import LLAMA_SERVER_ENV, PEERS, llama_server_path, start_peer
from .report import markdown, plots, summarize
from .terminal import CliError, load_pair, named_list, output_folder, progress_bar

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
HALVES = ("tuning", "held-out")   # each set's odd-numbered items, its even-numbered ones (`half`)
# Built-in suites: name -> (task, prompts file or audio folder in the inputs folder, bench/inputs in this repository)
SUITES = {"code": ("chat", "code_prompts.txt"), "chat": ("chat", "chat_prompts.txt"),
          "context": ("chat", "context_prompts.txt"), "long-context": ("chat", "long_context_prompts.jsonl"),
          "translation": ("translation", "translation_prompts.txt"),
          "summarization": ("summarization", "summarization_prompts.txt"), "speech": ("asr", "speech"),
          "speech-real": ("asr", "speech-real"), "speech-long": ("asr", "speech-long"),
          "speech-other": ("asr", "speech-other")}


@dataclass(frozen=True)
class Item:
    suite: str
    task: str
    name: str
    text: str | None = None
    audio: str | None = None
    target_language: str = "French"


@dataclass(frozen=True)
class Config:
    engine: str          # "assistgen", "transformers", or a peer engine ("llama.cpp", "faster-whisper": tools.peers)
    draft_source: str | None   # None for the baseline, else one of choices.DRAFT_SOURCES
    schedule: str | None       # None for the baseline; a peer engine's variant ("plain", "int8", ...)
    window: int | None = None  # the initial window, where a run compares several (else the run's one window)

    @property
    def label(self) -> str:
        if self.engine not in ("assistgen", "transformers"):
            return f"{self.engine} {self.schedule}"
        if self.draft_source is None:
            return "baseline"
        if self.engine == "transformers":
            return f"transformers {self.schedule}"
        prefix = {"assistant": "", "assistant_lookup": "assistant + lookup ", "prompt_lookup": "prompt lookup "}
        return prefix[self.draft_source] + self.schedule + ("" if self.window is None else f", window {self.window}")


BASELINE = Config("assistgen", None, None)
TRANSFORMERS_DEFAULTS = "defaults"   # the peer at transformers' own settings: 20 tokens, constant, threshold 0.4


# --- items --------------------------------------------------------------------------------------------------------

def read_items(suite: str, task: str, source: Path, limit: int | None = None) -> list[Item]:
    """Prompts from a .txt (one per line, "\\n" for a newline) or .jsonl ({"text": ..., "name"?, "target_language"?})
    file, or audio clips from a folder."""
    if source.is_dir():
        clips = sorted(p for p in source.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        if not clips:
            raise ValueError(f"no audio clips ({', '.join(AUDIO_SUFFIXES)}) in {source}")
        items = [Item(suite, task, p.stem, audio=str(p)) for p in clips]
    elif source.suffix == ".jsonl":
        items = []
        for n, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise ValueError(f"{source}:{n}: each line must be a JSON object with a \"text\" string")
                items.append(Item(suite, row.get("task", task), row.get("name", f"{suite}-{len(items) + 1}"),
                                  text=row["text"], target_language=row.get("target_language", "French")))
    else:
        lines = [line.replace("\\n", "\n") for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
        items = [Item(suite, task, f"{suite}-{n}", text=line) for n, line in enumerate(lines, 1)]
    if not items:
        raise ValueError(f"{source} holds no prompts")
    return items[:limit] if limit else items


def half(items: list[Item], which: str | None) -> list[Item]:
    """One set's tuning half (its 1st, 3rd, 5th... items) or held-out half (its 2nd, 4th...), or all of it (None).
    Defaults are chosen on the tuning half and reported on the held-out half, so that a reported figure never comes
    from the items it was tuned on; items added at the end of a set leave the earlier ones in their halves."""
    if which is None:
        return items
    if which not in HALVES:
        raise ValueError(f"half must be one of {', '.join(HALVES)}, got {which!r}")
    return items[HALVES.index(which)::2]


def builtin_items(suite: str, inputs: Path, limit: int | None = None) -> list[Item]:
    """A built-in suite's items, read from the `inputs` folder (bench/inputs in this repository)."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose from {', '.join(SUITES)}")
    task, where = SUITES[suite]
    if not (Path(inputs) / where).exists():
        raise ValueError(f"suite {suite!r}: {Path(inputs) / where} is missing; pass --inputs, the folder of the "
                         "built-in suites (bench/inputs in the repository)")
    return read_items(suite, task, Path(inputs) / where, limit)


# --- one run --------------------------------------------------------------------------------------------------------

def _peer(pair, inputs: dict, settings: Settings, schedule: str) -> tuple[list[int], float]:
    """The same run through transformers' generate(assistant_model=...), on the same model objects, with
    `schedule` (or transformers' own defaults: TRANSFORMERS_DEFAULTS)."""
    target, assistant = pair.target.model, pair.assistant.model
    if schedule == TRANSFORMERS_DEFAULTS:
        set_assistant_knobs(assistant, 20, "constant", confidence_threshold=0.4)
    else:
        set_assistant_knobs(assistant, settings.num_assistant_tokens, schedule)
    config = copy.deepcopy(target.generation_config)  # Whisper keeps its language and task tables there
    config.update(do_sample=settings.do_sample, num_beams=1, max_new_tokens=settings.max_new_tokens,
                  eos_token_id=list(pair.target.eos_token_ids),
                  pad_token_id=pair.target.tokenizer.pad_token_id or pair.target.eos_token_ids[0],
                  **({"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}
                     if settings.do_sample else {}))
    kwargs = {"assistant_model": assistant}
    if pair.mode == "different-tokenizer":
        kwargs.update(tokenizer=pair.target.tokenizer, assistant_tokenizer=pair.assistant.tokenizer)
    if "input_features" in inputs:  # Whisper takes its start tokens as language and task, not decoder_input_ids
        prefix = inputs["decoder_input_ids"][0].tolist()
        model_inputs = {"input_features": inputs["input_features"]}
        if getattr(config, "lang_to_id", None) and getattr(config, "task_to_id", None):
            kwargs.update(language=window_language(pair, inputs), task="transcribe")
    else:
        prefix = inputs["input_ids"][0].tolist()
        model_inputs = without_shared_prefix(inputs)   # transformers reads the whole prompt each time
    torch.manual_seed(settings.seed)
    clock = synchronized_clock(target.device)
    start = clock()
    with torch.inference_mode():
        out = target.generate(**model_inputs, generation_config=config, **kwargs)
    elapsed = clock() - start
    sequence = out[0].tolist()
    return sequence[len(prefix):] if sequence[:len(prefix)] == prefix else sequence, elapsed


def run_once(pair, task: str, inputs, settings: Settings, config: Config, *, item: Item | None = None,
             peers: dict | None = None) -> dict:
    """One run of one configuration, our loop deciding its draft source as the app does (no drafts where the
    assistant cannot help); a peer engine's through its adapter (`peers`, by engine)."""
    if peers and config.engine in peers:
        run = peers[config.engine].run(config.schedule, item, inputs, settings)
        return {"window_tokens": run.window_tokens, "latency_s": run.latency_s, "result": None, "peer": run.detail}
    if config.engine == "transformers":   # a recording's windows one after the other, as ours
        runs = [_peer(pair, window, settings, config.schedule) for window in
                ([inputs] if isinstance(inputs, dict) else [w.inputs for w in inputs])]
        return {"window_tokens": [tokens for tokens, _ in runs], "latency_s": sum(s for _, s in runs),
                "result": None}
    source = config.draft_source and effective_draft_source(pair, task, inputs, config.draft_source)[0]
    result = run_generation(pair, inputs, settings, draft_source=source, task=task)
    return {"window_tokens": window_tokens(result), "latency_s": result.latency_s, "result": result}


def window_tokens(result: GenerationResult) -> list[list[int]]:
    """A run's tokens, window by window (a single input is one window)."""
    if not result.windows:
        return [result.new_tokens]
    counts = [w["new_tokens"] for w in result.windows]
    if sum(counts) != len(result.new_tokens):
        raise ValueError(f"a joined run's windows count {sum(counts)} tokens, its output {len(result.new_tokens)}")
    starts = [sum(counts[:i]) for i in range(len(counts))]
    return [result.new_tokens[start:start + n] for start, n in zip(starts, counts)]


def same_output(a: list[list[int]], b: list[list[int]], eos: set[int]) -> bool:
    """Whether two runs gave the same tokens, window by window, each window without its final end-of-text token
    (transformers' Whisper leaves it out of what it returns, once per window of a long recording)."""
    def strip(tokens: list[int]) -> list[int]:
        return tokens[:-1] if tokens and tokens[-1] in eos else tokens
    return [strip(w) for w in a] == [strip(w) for w in b]


def _row(pair, item: Item, repeat: int, temperature: float, config: Config, run: dict, baseline: dict,
         reference: dict | None, prep: dict | None = None) -> dict:
    result: GenerationResult | None = run["result"]
    identical = same_output(run["window_tokens"], baseline["window_tokens"], set(pair.target.eos_token_ids))
    new_tokens = sum(map(len, run["window_tokens"]))
    row = {"pair": pair.spec.name, "suite": item.suite, "task": item.task, "item": item.name, "repeat": repeat,
           "temperature": temperature, "config": config.label, "engine": config.engine,
           "draft_source": config.draft_source, "schedule": config.schedule, "latency_s": round(run["latency_s"], 4),
           "new_tokens": new_tokens, "baseline_latency_s": round(baseline["latency_s"], 4),
           "tokens_per_s": round(new_tokens / run["latency_s"], 3) if run["latency_s"] > 0 else None,
           "speedup": round(baseline["latency_s"] / run["latency_s"], 4) if run["latency_s"] > 0 else None,
           "identical": identical if temperature == 0 else None}
    if prep is not None:   # speech: the file's decoding and features, shared by our columns; a peer times its own
        row.update(prep)
        row["end_to_end_s"] = round(run["latency_s"] + (0.0 if "peer" in run else sum(prep.values())), 4)
        row["baseline_end_to_end_s"] = round(baseline["latency_s"] + sum(prep.values()), 4)
    if "peer" in run:
        row.update(run["peer"])
    if reference is not None and run["latency_s"] > 0:   # the first pair's baseline on this item
        row["reference_speedup"] = round(reference["latency_s"] / run["latency_s"], 4)
    if result is not None:
        t = time_breakdown(result)
        row.update(target_passes=result.target_passes, tokens_per_pass=round(result.tokens_per_pass, 3),
                   acceptance_rate=None if result.acceptance_rate is None else round(result.acceptance_rate, 4),
                   emitted_per_pass=[len(s.emitted) for s in result.steps],
                   windows=[s.window for s in result.steps], prompt_s=t["prompt_s"], drafting_s=t["drafting_s"],
                   verifying_s=t["verifying_s"], s_per_pass=t["s_per_pass"],
                   acceptance=acceptance(result.steps).to_dict())
        if result.assistant_start is not None:
            row.update(assistant_started_after=result.assistant_start.started_after,
                       assistant_set_aside_after=list(result.assistant_start.set_aside_after),
                       assistant_start_reason=assistant_start_reason(result.assistant_start))
    if result is not None and config is not BASELINE:
        c = cost_ratio(baseline["result"], result)
        row.update(cost_ratio=None if c is None else round(c, 4))
    if config is BASELINE:
        steps = result.later_steps  # after the prefill: the steady per-token cost
        row["ms_per_token"] = round(1000 * statistics.median(s.verify_s for s in steps), 2) if steps else None
    return row


# --- the loop -------------------------------------------------------------------------------------------------------

def configs_for(pair, draft_sources: list[str] | None, schedules: list[str] | None, peer: bool,
                peers: dict | None = None, windows: list[int] | None = None) -> list[Config]:
    """The baseline, then each draft source with each schedule (the pair's own when None) and, where several are
    given, each initial window, transformers' peer, and each variant of each peer engine (`peers`, by engine)."""
    schedules = schedules or [pair.spec.schedule]
    draft_sources = draft_sources or [pair.spec.draft_source]
    windows = windows if windows and len(windows) > 1 else [None]
    configs = [BASELINE]
    for source in draft_sources:
        if source in ("assistant", "assistant_lookup") and not pair.assistant_usable:
            continue
        configs += [Config("assistgen", source, schedule, window) for schedule in schedules for window in windows]
    if peer and pair.assistant_usable and any(s != "prompt_lookup" for s in draft_sources):
        # transformers has no "adaptive" schedule: its peer runs its heuristic one (from 5 tokens) and its own defaults
        # (20 tokens, constant, confidence threshold 0.4)
        configs += [Config("transformers", "assistant", s) for s in dict.fromkeys(
            ["heuristic" if s == "adaptive" else s for s in schedules] + [TRANSFORMERS_DEFAULTS])]
    for engine, adapter in (peers or {}).items():
        configs += [Config(engine, None, variant) for variant in adapter.variants]
    return configs


def model_inputs(pair, item: Item):
    """An item's inputs: a prompt, or a recording's windows in the language the target detects in it."""
    return timed_inputs(pair, item)[0]


def timed_inputs(pair, item: Item) -> tuple:
    """(an item's inputs, for a recording the seconds its preparation took: {"audio_decode_s": the file decoded to
    16 kHz mono, "features_s": its windows' log-mel features and prefixes}, else None), checked and built as the page
    builds them (`request.build_request`, `request.request_inputs`). The spoken language's detection (a target pass)
    is left out: every run, ours and the peers', is given the language it found."""
    request = build_request(pair.spec, item.task, request_settings(pair.spec), text=item.text, audio=item.audio,
                            target_language=item.target_language)
    prepared = request_inputs(request, pair)
    return prepared.inputs, prepared.prep


def run_bench(pairs, items: list[Item], *, temperatures: list[float], draft_sources: list[str] | None,
              schedules: list[str] | None, repeats: int, max_new_tokens: int | None,
              num_assistant_tokens: list[int] | None = None,
              peer: bool = False, peers: list[dict] | None = None, progress=None, log=None) -> list[dict]:
    """Every item under every configuration of every pair (a pair, or a list of them run side by side); one row
    per run. `max_new_tokens` None: each pair's own (models.yaml), as the app runs it. `num_assistant_tokens`: the
    initial windows, several each a configuration of its own; None: each pair's own. `peers`: for each pair, its
    peer engines' adapters by engine (`tools.peers`), run on the same items, interleaved with ours."""
    pairs = pairs if isinstance(pairs, (list, tuple)) else [pairs]
    peers = peers or [{} for _ in pairs]
    timed = [(item, [timed_inputs(pair, item) for pair in pairs]) for item in items]
    prepared = [(item, [inputs for inputs, _ in both]) for item, both in timed]
    preps = {id(item): [prep for _, prep in both] for item, both in timed}
    for i, pair in enumerate(pairs):
        warm_up(pair, first_inputs(prepared[0][1][i]))
        for adapter in peers[i].values():   # a short run of each variant: one-time costs hit no timed run
            for variant in adapter.variants:
                adapter.run(variant, prepared[0][0], prepared[0][1][i], Settings(max_new_tokens=2))
    # the sweep's own order over temperatures (repeat by repeat, each temperature once per repeat), item by item
    plan = [(repeat, temperature, item, inputs) for repeat, temperature in sweep_plan(temperatures, repeats)
            for item, inputs in prepared]
    configs = [configs_for(pair, draft_sources, schedules, peer, peers[p], num_assistant_tokens)
               for p, pair in enumerate(pairs)]
    total = len(plan) * sum(len(c) for c in configs)
    rows, done = [], 0
    for n, (repeat, temperature, item, inputs) in enumerate(plan):
        runs: list[dict[Config, dict]] = [{} for _ in pairs]
        for p in [(n + i) % len(pairs) for i in range(len(pairs))]:   # pairs and configurations rotate by item
            pair, own = pairs[p], configs[p]
            for config in own[n % len(own):] + own[:n % len(own)]:
                base = request_settings(pair.spec, max_new_tokens=max_new_tokens,
                                        draft_source=config.draft_source or "assistant",
                                        num_assistant_tokens=config.window or (num_assistant_tokens or [None])[0],
                                        schedule=config.schedule if config.schedule in SCHEDULE_NAMES else "heuristic")
                settings = point_settings(base, "temperature", temperature, repeat)   # as a temperature sweep sets it
                try:
                    runs[p][config] = run_once(pair, item.task, inputs[p], settings, config, item=item,
                                               peers=peers[p])
                except Exception as exc:  # a peer that cannot run this pair is a finding, not a crash; ours must run
                    if config.engine == "assistgen":
                        raise
                    runs[p][config] = {"error": f"{type(exc).__name__}: {exc}"}
                done += 1
                if progress:
                    progress(done / total, f"{item.name} t={temperature:g} {pair.spec.name} {config.label}")
        reference = runs[0][BASELINE] if len(pairs) > 1 else None
        for p, pair in enumerate(pairs):
            for config in configs[p]:
                run = runs[p][config]
                if "error" in run:
                    rows.append({"pair": pair.spec.name, "suite": item.suite, "item": item.name, "repeat": repeat,
                                 "temperature": temperature, "config": config.label, "engine": config.engine,
                                 "error": run["error"]})
                    continue
                rows.append(_row(pair, item, repeat, temperature, config, run, runs[p][BASELINE], reference,
                                 preps[id(item)][p]))
                if log is not None:  # a line per run as it lands: a long benchmark can be followed, survives a stop
                    log.write(json.dumps(rows[-1]) + "\n")
                    log.flush()
    return rows


# --- command line ---------------------------------------------------------------------------------------------------

def _values(text: str, kind: type, expected: str) -> list:
    """The comma-separated values of an option, each read by `kind`; an argparse error saying `expected` if one is
    not."""
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def _floats(text: str) -> list[float]:
    values = _values(text, float, "comma-separated numbers")
    if not values or not all(temperature_allowed(v) for v in values):
        raise argparse.ArgumentTypeError(f"each temperature must be {TEMPERATURE_RULE}")
    return values


def _ints(text: str) -> list[int]:
    values = _values(text, int, "whole numbers separated by commas")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one whole number")
    return list(dict.fromkeys(values))


def _names(choices):
    def parse(text: str) -> list[str]:
        values = [v.strip() for v in text.split(",") if v.strip()]
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {text!r}")
        return values
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m assistgen bench` (the catalog is the command line's global --catalog)."""
    p.add_argument("--pair", action="append", required=True,
                   help="a pair to run (repeatable: several run side by side, each against the first's baseline too)")
    p.add_argument("--suite", action="append", default=[], choices=list(SUITES),
                   help="a built-in set from --inputs (repeatable): " + ", ".join(SUITES))
    p.add_argument("--inputs", default="bench/inputs", metavar="DIR",
                   help="the folder of the built-in suites (default bench/inputs, from the repository root)")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE",
                   help="your own prompts, .txt (one per line) or .jsonl (repeatable); with --task")
    p.add_argument("--audio-dir", action="append", default=[], metavar="DIR", help="a folder of clips (task asr)")
    p.add_argument("--task", default="chat", choices=TEXT_TASKS,
                   help="task for --prompts (default chat)")
    p.add_argument("--limit", type=int, help="at most this many items per set (of its half, with --half)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="per run (a recording: per 30 s window); default: each pair's own, as in the app")
    p.add_argument("--temperatures", type=_floats, default=[0.0], help="comma-separated, e.g. 0,0.3,0.7,1.0")
    p.add_argument("--draft-sources", type=named_list(DRAFT_SOURCE_NAMES, "draft source"), default=None,
                   help="comma-separated, of assistant, assistant+lookup, prompt-lookup (default: each pair's own)")
    p.add_argument("--schedules", type=_names(SCHEDULE_NAMES), default=None,
                   help="comma-separated (default: each pair's own, from models.yaml, as the app runs it)")
    p.add_argument("--num-assistant-tokens", type=_ints, default=None,
                   help="the initial window, or several comma-separated, each then a configuration of its own "
                        "(default: each pair's own)")
    p.add_argument("--half", choices=HALVES, default=None,
                   help="only each set's tuning half (its 1st, 3rd... items) or held-out half (2nd, 4th...): choose "
                        "defaults on the first, report on the second (default: every item)")
    p.add_argument("--repeats", type=int, default=1, help="runs of every item and configuration (default 1)")
    p.add_argument("--peer", action="append", nargs="?", const="transformers", default=[],
                   choices=("transformers",) + tuple(PEERS), metavar="ENGINE",
                   help="also run a peer (repeatable): transformers' generate(assistant_model=...) (--peer alone), "
                        "llama.cpp on the target's (and the assistant's, as draft) GGUF files, or faster-whisper on "
                        "the Whisper target's model.bin (int8 and float32); the last two need "
                        "requirements-peers.txt and, for llama.cpp, a llama-server build")
    p.add_argument("--llama-server", metavar="PATH", default=None,
                   help=f"llama.cpp's server binary for --peer llama.cpp (default ${LLAMA_SERVER_ENV})")
    p.add_argument("--verify-curve", action="store_true",
                   help="also time verify(k), a target pass over k rows, for k from 1 to 32 (table and plot)")
    p.add_argument("--no-floor", action="store_true", help="skip the memory-bandwidth measurement")
    p.add_argument("--out", default="bench-results", help="output folder (default bench-results/)")


def _items(args, specs) -> list[Item]:
    sets = [builtin_items(suite, Path(args.inputs)) for suite in args.suite]
    sets += [read_items(Path(f).stem, args.task, Path(f)) for f in args.prompts]
    sets += [read_items(Path(d).name, "asr", Path(d)) for d in args.audio_dir]
    items = [i for one in sets for i in half(one, args.half)[:args.limit]]
    if not items:
        raise ValueError("nothing to run: give --suite, --prompts or --audio-dir")
    for spec in specs:
        wrong = sorted({i.task for i in items} - set(spec.tasks))
        if wrong:
            raise ValueError(f"pair {spec.name!r} does not do {', '.join(wrong)}; it does {', '.join(spec.tasks)}")
    if args.repeats < 1:
        raise ValueError("--repeats must be at least 1")
    for spec in specs:   # the settings every run shares, checked as the page checks them
        for window in args.num_assistant_tokens or [None]:
            request_settings(spec, max_new_tokens=args.max_new_tokens, num_assistant_tokens=window)
    return items


def run(args: argparse.Namespace) -> int:
    """`python -m assistgen bench`, with its parsed arguments."""
    engines = [engine for engine in dict.fromkeys(args.peer) if engine != "transformers"]
    started: list = []
    try:
        catalog = load_catalog(args.catalog)
        specs = [catalog.pair(name) for name in dict.fromkeys(args.pair)]
        items = _items(args, specs)
        output_folder(args.out)
        if "llama.cpp" in engines:   # before minutes of loading: how to build it
            llama_server_path(args.llama_server)
        pairs = [load_pair(catalog, spec) for spec in specs]
        peers = []
        logs = Path(tempfile.mkdtemp(prefix="assistgen-peers-")) if engines else None
        for pair in pairs:
            peers.append({})
            for engine in engines:
                peers[-1][engine] = start_peer(engine, pair, catalog, llama_server=args.llama_server, log_dir=logs)
                started.append(peers[-1][engine])
    except (CatalogError, CliError, KeyError, ValueError, OSError, RuntimeError) as exc:
        for adapter in started:
            adapter.close()
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    try:
        return _run(args, out=Path(args.out), specs=specs, items=items, pairs=pairs, peers=peers)
    finally:
        for adapter in started:
            adapter.close()


def _peer_meta(peers: dict) -> dict:
    """Each peer engine's variants, version and settings, for the results."""
    meta = {}
    for engine, adapter in peers.items():
        package = {"faster-whisper": "faster-whisper"}.get(engine)
        meta[engine] = {"variants": list(adapter.variants),
                        "version": importlib.metadata.version(package) if package else None,
                        "settings": getattr(adapter, "settings", None)}
    return meta


def _run(args, *, out: Path, specs, items, pairs, peers) -> int:
    out.mkdir(parents=True, exist_ok=True)
    first = pairs[0]
    meta = {"pairs": [spec.name for spec in specs], "modes": {p.spec.name: p.mode for p in pairs},
            "command": shlex.join(["python", "-m", "assistgen", *args.argv]),
            "machine": f"{cpu_model()} ({', '.join(vector_extensions()) or 'no AVX2'}), {torch.get_num_threads()} "
                       "threads" + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", CPU"),
            "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "dtype": dtype_name(first.target.model.dtype),
            "target_numerics": {p.spec.name: target_numerics(p) for p in pairs},
            "max_new_tokens": args.max_new_tokens or {spec.name: spec.max_new_tokens for spec in specs},
            "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"), "half": args.half,
            "items": {i.name: i.text or i.audio for i in items},
            # whether a first adaptive run starts from what an earlier process measured (comparison.schedule_store)
            "stored_schedules": {p.spec.name: bool((path := schedule_store.store_path(p)) and path.is_file())
                                 for p in pairs},
            "peers": {p.spec.name: _peer_meta(own) for p, own in zip(pairs, peers) if own}}
    if not args.no_floor and first.target.model.device.type == "cpu":
        bandwidth = memory_bandwidth_gb_s()
        # an offloaded target's weights come back from disk at every pass: memory bandwidth does not bound it
        meta["floor"] = {p.spec.name: floor(p, bandwidth) for p in pairs if not offloaded(p.target.model)}
    if args.verify_curve:
        meta["verify_curves"] = {p.spec.name: verify_curve(p.target.model, first_inputs(model_inputs(p, items[0])))
                                 for p in pairs}
    bar, report = progress_bar()
    try:
        with open(out / "runs.jsonl", "w") as log:
            rows = run_bench(pairs, items, temperatures=args.temperatures, draft_sources=args.draft_sources,
                             schedules=args.schedules, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                             num_assistant_tokens=args.num_assistant_tokens, peer="transformers" in args.peer,
                             peers=peers, progress=report, log=log)
    except Exception as exc:  # an input the pair cannot take: say which
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar.close()
    summary = summarize(rows)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1))
    (out / "results.md").write_text(markdown(meta, summary, rows))
    written = plots(summary, rows, out)
    if args.verify_curve:
        written.append(plot_curves(meta["verify_curves"], out))
    print(markdown(meta, summary, rows).split("## Per item")[0])
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))
    return 0
