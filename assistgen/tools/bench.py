"""Benchmark: does assisted generation pay off for this pair, task and machine, and by how much?

    python -m assistgen bench --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat \\
        --temperatures 0,0.7 --schedules heuristic,adaptive --repeats 2 --peer --out results/

Every item (prompt or clip) runs its baseline once per repeat and temperature, then each assisted configuration
(draft source x schedule) and, with --peer, transformers' own ``generate(assistant_model=...)``. Each assisted run's
speedup is taken against the baseline run of the same item, repeat and temperature; the order of the runs rotates
from one item to the next, so drift on a shared machine hits every configuration alike.

Writes results.json (every run and the summary), results.md (tables) and PNG plots into --out, and runs.jsonl
line by line while it runs. Timings are figures
to read, never asserts.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..app.render import fmt_value
from ..choices import DRAFT_SOURCES, SCHEDULE_NAMES, TEXT_TASKS
from ..comparison.compare import Settings, cost_ratio, run_generation, warm_up
from ..engine.decoding import GenerationResult, synchronized_clock
from .enginebench import set_assistant_knobs

AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg")
# Built-in suites: name -> (task, prompts file or audio folder in the inputs folder, bench/inputs in this repository)
SUITES = {"code": ("chat", "code_prompts.txt"), "chat": ("chat", "chat_prompts.txt"),
          "translation": ("translation", "translation_prompts.txt"),
          "summarization": ("summarization", "summarization_prompts.txt"), "speech": ("asr", "speech")}


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
    engine: str          # "assistgen" or "transformers"
    draft_source: str | None   # None for the baseline, "assistant" or "prompt_lookup"
    schedule: str | None       # None for the baseline

    @property
    def label(self) -> str:
        if self.draft_source is None:
            return "baseline"
        if self.engine == "transformers":
            return f"transformers {self.schedule}"
        return self.schedule if self.draft_source == "assistant" else f"prompt lookup {self.schedule}"


BASELINE = Config("assistgen", None, None)


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

def _peer(pair, inputs: dict, settings: Settings) -> tuple[list[int], float]:
    """The same run through transformers' generate(assistant_model=...), on the same model objects."""
    import copy
    target, assistant = pair.target.model, pair.assistant.model
    set_assistant_knobs(assistant, settings.num_assistant_tokens, settings.schedule)
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
            kwargs.update(language="en", task="transcribe")
    else:
        prefix = inputs["input_ids"][0].tolist()
        model_inputs = inputs
    torch.manual_seed(settings.seed)
    clock = synchronized_clock(target.device)
    start = clock()
    with torch.inference_mode():
        out = target.generate(**model_inputs, generation_config=config, **kwargs)
    elapsed = clock() - start
    sequence = out[0].tolist()
    return sequence[len(prefix):] if sequence[:len(prefix)] == prefix else sequence, elapsed


def run_once(pair, inputs: dict, settings: Settings, config: Config) -> dict:
    if config.engine == "transformers":
        tokens, latency = _peer(pair, inputs, settings)
        return {"tokens": tokens, "latency_s": latency, "result": None}
    result = run_generation(pair, inputs, settings, draft_source=config.draft_source)
    return {"tokens": result.new_tokens, "latency_s": result.latency_s, "result": result}


def _without_eos(tokens: list[int], eos: set[int]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


def _row(item: Item, repeat: int, temperature: float, config: Config, run: dict, baseline: dict,
         eos: set[int]) -> dict:
    result: GenerationResult | None = run["result"]
    # transformers' Whisper leaves the final end-of-text token out of what it returns: compare without it
    identical = _without_eos(run["tokens"], eos) == _without_eos(baseline["tokens"], eos)
    row = {"suite": item.suite, "task": item.task, "item": item.name, "repeat": repeat, "temperature": temperature,
           "config": config.label, "engine": config.engine, "draft_source": config.draft_source,
           "schedule": config.schedule, "latency_s": round(run["latency_s"], 4), "new_tokens": len(run["tokens"]),
           "baseline_latency_s": round(baseline["latency_s"], 4),
           "speedup": round(baseline["latency_s"] / run["latency_s"], 4) if run["latency_s"] > 0 else None,
           "identical": identical if temperature == 0 else None}
    if result is not None:
        row.update(target_passes=result.target_passes, tokens_per_pass=round(result.tokens_per_pass, 3),
                   acceptance_rate=None if result.acceptance_rate is None else round(result.acceptance_rate, 4),
                   emitted_per_pass=[len(s.emitted) for s in result.steps],
                   windows=[s.window for s in result.steps])
    if result is not None and config is not BASELINE:
        c = cost_ratio(baseline["result"], result)
        row.update(cost_ratio=None if c is None else round(c, 4))
    if config is BASELINE:
        steps = result.steps[1:]  # after the prefill: the steady per-token cost
        row["ms_per_token"] = round(1000 * statistics.median(s.verify_s for s in steps), 2) if steps else None
    return row


# --- the floor ------------------------------------------------------------------------------------------------------

def memory_bandwidth_gb_s(megabytes: int = 1024, repeats: int = 7) -> float:
    """Read bandwidth: the best of `repeats` sums over a tensor far larger than any cache. Decoding reads each
    weight once per token and writes almost nothing, so reading is what bounds it."""
    data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best / 1e9


def floor(pair, bandwidth_gb_s: float) -> dict:
    """The fastest possible baseline: every weight read once per token, at the machine's read bandwidth."""
    model = pair.target.model
    weight_bytes = pair.target.num_bytes  # counted at load, before linear weights moved into oneDNN's layout
    # The embedding lookup reads one row per token, not the table (unless the output layer shares it).
    embeddings = model.get_input_embeddings()
    output = model.get_output_embeddings()
    tied = output is not None and getattr(output, "weight", None) is embeddings.weight
    if embeddings is not None and not tied:
        weight_bytes -= embeddings.weight.numel() * embeddings.weight.element_size()
    return {"bandwidth_gb_s": round(bandwidth_gb_s, 2), "bytes_per_token": int(weight_bytes),
            "floor_ms_per_token": round(1000 * weight_bytes / (bandwidth_gb_s * 1e9), 2)}


# --- the loop -------------------------------------------------------------------------------------------------------

def configs_for(pair, draft_sources: list[str], schedules: list[str], peer: bool) -> list[Config]:
    configs = [BASELINE]
    for source in draft_sources:
        if source == "assistant" and not pair.assistant_usable:
            continue
        configs += [Config("assistgen", source, schedule) for schedule in schedules]
    if peer and pair.assistant_usable and "assistant" in draft_sources:
        # transformers has no "adaptive" schedule: its peer runs the seed's heuristic (or constant when asked)
        configs += [Config("transformers", "assistant", s) for s in dict.fromkeys(
            "heuristic" if s == "adaptive" else s for s in schedules)]
    return configs


def run_bench(pair, items: list[Item], *, temperatures: list[float], draft_sources: list[str], schedules: list[str],
              repeats: int, max_new_tokens: int, num_assistant_tokens: int = 5, peer: bool = False,
              progress=None, log=None) -> list[dict]:
    from ..comparison.audio import load_audio
    from ..comparison.tasks import asr_inputs, text_inputs
    prepared = []
    for item in items:
        inputs = (asr_inputs(pair, load_audio(item.audio)) if item.task == "asr" else
                  text_inputs(pair, item.task, item.text, target_language=item.target_language))
        prepared.append((item, inputs))
    warm_up(pair, prepared[0][1])
    plan = [(repeat, temperature, item, inputs) for repeat in range(repeats) for temperature in temperatures
            for item, inputs in prepared]
    configs = configs_for(pair, draft_sources, schedules, peer)
    total = len(plan) * len(configs)
    rows, done = [], 0
    for n, (repeat, temperature, item, inputs) in enumerate(plan):
        order = configs[n % len(configs):] + configs[:n % len(configs)]
        runs: dict[Config, dict] = {}
        for config in order:
            settings = Settings(max_new_tokens=max_new_tokens, temperature=temperature, seed=repeat,
                                draft_source=config.draft_source or "assistant",
                                num_assistant_tokens=num_assistant_tokens,
                                schedule=config.schedule or "heuristic").validate()
            try:
                runs[config] = run_once(pair, inputs, settings, config)
            except Exception as exc:  # a peer that cannot run this pair is a finding, not a crash; ours must run
                if config.engine != "transformers":
                    raise
                runs[config] = {"error": f"{type(exc).__name__}: {exc}"}
            done += 1
            if progress:
                progress(done / total, f"{item.name} t={temperature:g} {config.label}")
        baseline = runs[BASELINE]
        for config in configs:
            run = runs[config]
            if "error" in run:
                rows.append({"suite": item.suite, "item": item.name, "repeat": repeat, "temperature": temperature,
                             "config": config.label, "engine": config.engine, "error": run["error"]})
                continue
            rows.append(_row(item, repeat, temperature, config, run, baseline,
                             set(pair.target.eos_token_ids)))
            if log is not None:  # one line per run as it lands: a long benchmark can be followed, and survives a stop
                log.write(json.dumps(rows[-1]) + "\n")
                log.flush()
    return rows


# --- summary, tables and plots --------------------------------------------------------------------------------------

def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _quantile(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def summarize(rows: list[dict]) -> list[dict]:
    """One row per (suite, temperature, configuration): medians over items and repeats, with the speedup's spread."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["suite"], row["temperature"], row["config"]), []).append(row)
    summary = []
    for (suite, temperature, config), group in groups.items():
        speedups = [r["speedup"] for r in group]
        identical = [r["identical"] for r in group if r["identical"] is not None]
        summary.append({
            "suite": suite, "temperature": temperature, "config": config, "runs": len(group),
            "baseline_s": _median(r["baseline_latency_s"] for r in group),
            "latency_s": _median(r["latency_s"] for r in group),
            "speedup": _median(speedups), "speedup_min": min(speedups), "speedup_max": max(speedups),
            "speedup_p10": _quantile(speedups, 0.1), "speedup_p90": _quantile(speedups, 0.9),
            "tokens_per_pass": _median(r.get("tokens_per_pass") for r in group),
            "acceptance_rate": _median(r.get("acceptance_rate") for r in group),
            "cost_ratio": _median(r.get("cost_ratio") for r in group),
            "identical_share": sum(identical) / len(identical) if identical else None,
            "ms_per_token": _median(r.get("ms_per_token") for r in group),
        })
    return summary


def _dash(value, spec=".2f", suffix=""):
    return fmt_value(value, spec, suffix, missing="–")


def markdown(meta: dict, summary: list[dict], rows: list[dict]) -> str:
    lines = [f"# assistgen bench: {meta['pair']}", "",
             f"{meta['machine']}; torch {meta['torch']}, transformers {meta['transformers']}, {meta['threads']} "
             f"threads; {meta['dtype']}; max_new_tokens {meta['max_new_tokens']}; {meta['repeats']} repeat(s); "
             f"{meta['date']}.", "", f"Command: `{meta['command']}`", "",
             "Speedup = baseline latency / assisted latency of the same item, repeat and temperature; medians over "
             "items x repeats, spread min–max. transformers' peer runs the heuristic schedule on the same model "
             "objects and is timed against our baseline. Identical: share of greedy runs whose tokens equal the "
             "baseline's.", "",
             "| suite | temp | configuration | runs | baseline s | assisted s | speedup (min–max) | "
             "tokens/pass | acceptance | c | identical |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in sorted(summary, key=lambda s: (s["suite"], s["temperature"], s["config"] != "baseline", s["config"])):
        if s["config"] == "baseline":
            continue
        lines.append(
            f"| {s['suite']} | {s['temperature']:g} | {s['config']} | {s['runs']} | {_dash(s['baseline_s'])} | "
            f"{_dash(s['latency_s'])} | {_dash(s['speedup'])}× ({_dash(s['speedup_min'])}–{_dash(s['speedup_max'])}) | "
            f"{_dash(s['tokens_per_pass'])} | "
            f"{_dash(s['acceptance_rate'], '.0%')} | {_dash(s['cost_ratio'])} | {_dash(s['identical_share'], '.0%')} |")
    fl = meta.get("floor")
    if fl:
        measured = _median(s["ms_per_token"] for s in summary if s["config"] == "baseline")
        lines += ["", "## The floor", "",
                  f"Memory read bandwidth {fl['bandwidth_gb_s']} GB/s; the target reads {fl['bytes_per_token'] / 1e9:.2f}"
                  f" GB of weights per token, so no baseline can beat {fl['floor_ms_per_token']} ms/token here. "
                  f"Measured baseline: {_dash(measured, '.1f')} ms/token (median per-step time after the prefill)"
                  + (f", {fl['floor_ms_per_token'] / measured:.0%} of the floor's speed." if measured else ".")]
    errors = [r for r in rows if "error" in r]
    if errors:
        lines += ["", "## Runs that failed", ""] + [f"- {r['item']} {r['config']}: {r['error']}" for r in errors[:20]]
    lines += ["", "## Per item (median over repeats)", "", "| suite | item | temp | configuration | speedup | tokens/pass "
              "| identical |", "|---|---|---|---|---|---|---|"]
    per_item: dict[tuple, list[dict]] = {}
    for r in rows:
        if "error" not in r and r["config"] != "baseline":
            per_item.setdefault((r["suite"], r["item"], r["temperature"], r["config"]), []).append(r)
    for (suite, item, temperature, config), group in per_item.items():
        identical = [r["identical"] for r in group if r["identical"] is not None]
        lines.append(f"| {suite} | {item} | {temperature:g} | {config} | {_dash(_median(r['speedup'] for r in group))}×"
                     f" | {_dash(_median(r.get('tokens_per_pass') for r in group))} | "
                     f"{_dash(sum(identical) / len(identical) if identical else None, '.0%')} |")
    return "\n".join(lines) + "\n"


def plots(summary: list[dict], rows: list[dict], out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    assisted = [s for s in summary if s["config"] != "baseline"]
    configs = sorted({s["config"] for s in assisted})
    suites = sorted({s["suite"] for s in assisted})

    temperatures = sorted({s["temperature"] for s in assisted})
    if len(temperatures) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        for suite in suites:
            for config in configs:
                points = sorted((s["temperature"], s["speedup"]) for s in assisted
                                if s["suite"] == suite and s["config"] == config)
                if points:
                    ax.plot(*zip(*points), marker="o", label=f"{suite}: {config}")
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set(xlabel="temperature", ylabel="speedup (median)", title="Speedup vs temperature")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out / "speedup_vs_temperature.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(suites) * max(1, len(configs)) / 2), 4))
    width = 0.8 / max(1, len(configs))
    greedy = min(temperatures) if temperatures else 0
    for i, config in enumerate(configs):
        xs, ys, lo, hi = [], [], [], []
        for j, suite in enumerate(suites):
            match = [s for s in assisted if s["suite"] == suite and s["config"] == config and s["temperature"] == greedy]
            if match:
                s = match[0]
                xs.append(j + i * width)
                ys.append(s["speedup"])
                lo.append(s["speedup"] - s["speedup_min"])
                hi.append(s["speedup_max"] - s["speedup"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=config)
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xticks([j + width * (len(configs) - 1) / 2 for j in range(len(suites))], suites)
    ax.set(ylabel=f"speedup (median, min–max), temperature {greedy:g}", title="Speedup by task and schedule")
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "speedup_by_task.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    ours = sorted({r["config"] for r in rows if r.get("emitted_per_pass") and r["config"] != "baseline"})
    data = [[n for r in rows if r["config"] == c and r.get("emitted_per_pass") for n in r["emitted_per_pass"]]
            for c in ours]
    if data:
        top = max(max(d) for d in data if d)
        ax.hist(data, bins=range(1, top + 2), label=ours, align="left")
        ax.legend(fontsize=8)
    ax.set(xlabel="tokens emitted by one target pass", ylabel="target passes", title="Tokens per pass")
    fig.tight_layout()
    written.append(out / "tokens_per_pass.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


# --- command line ---------------------------------------------------------------------------------------------------

def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 <= v <= 2 for v in values):
        raise argparse.ArgumentTypeError("temperatures must be from 0 to 2")
    return values


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
    p.add_argument("--pair", required=True)
    p.add_argument("--suite", action="append", default=[], choices=list(SUITES),
                   help="a built-in set from --inputs (repeatable): " + ", ".join(SUITES))
    p.add_argument("--inputs", default="bench/inputs", metavar="DIR",
                   help="the folder of the built-in suites (default bench/inputs, from the repository root)")
    p.add_argument("--prompts", action="append", default=[], metavar="FILE",
                   help="your own prompts, .txt (one per line) or .jsonl (repeatable); with --task")
    p.add_argument("--audio-dir", action="append", default=[], metavar="DIR", help="a folder of clips (task asr)")
    p.add_argument("--task", default="chat", choices=TEXT_TASKS,
                   help="task for --prompts (default chat)")
    p.add_argument("--limit", type=int, help="at most this many items per set")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperatures", type=_floats, default=[0.0], help="comma-separated, e.g. 0,0.3,0.7,1.0")
    p.add_argument("--draft-sources", type=_names(list(DRAFT_SOURCES)), default=["assistant"])
    p.add_argument("--schedules", type=_names(SCHEDULE_NAMES), default=["heuristic"])
    p.add_argument("--num-assistant-tokens", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--peer", action="store_true", help="also run transformers' generate(assistant_model=...)")
    p.add_argument("--no-floor", action="store_true", help="skip the memory-bandwidth measurement")
    p.add_argument("--out", default="bench-results", help="output folder (default bench-results/)")


def run(args: argparse.Namespace) -> int:
    """`python -m assistgen bench`, with its parsed arguments."""
    from ..models.catalog import CatalogError, load_catalog
    from .terminal import CliError, load_pair, progress_bar
    try:
        catalog = load_catalog(args.catalog)
        spec = catalog.pair(args.pair)
        items = [i for suite in args.suite for i in builtin_items(suite, Path(args.inputs), args.limit)]
        items += [i for f in args.prompts for i in read_items(Path(f).stem, args.task, Path(f), args.limit)]
        items += [i for d in args.audio_dir for i in read_items(Path(d).name, "asr", Path(d), args.limit)]
        if not items:
            raise ValueError("nothing to run: give --suite, --prompts or --audio-dir")
        wrong = sorted({i.task for i in items} - set(spec.tasks))
        if wrong:
            raise ValueError(f"pair {spec.name!r} does not do {', '.join(wrong)}; it does {', '.join(spec.tasks)}")
        if args.repeats < 1 or not 1 <= args.max_new_tokens <= 1024:
            raise ValueError("--repeats must be at least 1 and --max-new-tokens from 1 to 1024")
        pair = load_pair(catalog, spec)
    except (CatalogError, CliError, KeyError, ValueError, OSError) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers
    meta = {"pair": spec.name, "mode": pair.mode, "command": "python -m assistgen " + " ".join(args.argv),
            "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
                       + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", CPU"),
            "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads(),
            "dtype": str(pair.target.model.dtype).removeprefix("torch."), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"),
            "items": {i.name: i.text or i.audio for i in items}}
    if not args.no_floor and pair.target.model.device.type == "cpu":
        meta["floor"] = floor(pair, memory_bandwidth_gb_s())
    bar, report = progress_bar()
    try:
        with open(out / "runs.jsonl", "w") as log:
            rows = run_bench(pair, items, temperatures=args.temperatures, draft_sources=args.draft_sources,
                             schedules=args.schedules, repeats=args.repeats, max_new_tokens=args.max_new_tokens,
                             num_assistant_tokens=args.num_assistant_tokens, peer=args.peer, progress=report, log=log)
    except Exception as exc:  # an input the pair cannot take: say which
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar.close()
    summary = summarize(rows)
    (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1))
    (out / "results.md").write_text(markdown(meta, summary, rows))
    written = plots(summary, rows, out)
    print(markdown(meta, summary, rows).split("## Per item")[0])
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, " + ", ".join(str(p) for p in written))
    return 0
