"""The speech default with its target's encoder in bfloat16 (`encoder_dtype: bfloat16`, models/precision.py) against
the same pair with the encoder in float32: both columns' latency and setup (the encoder's part), the speedup, and
whether the transcript changes.

    .venv/bin/python -m bench.scripts.encoder_precision [--repeats 3] [--sets speech-real speech-long ...] [--out DIR]

Both variants are loaded in one process (the same int8 assistant) and run clip by clip, interleaved (their order
alternates from repeat to repeat), each as `compare` runs it: the baseline, then the assisted run, at the pair's
defaults, with the schedule store off (`ASSISTGEN_SCHEDULE_STORE=0`: the two variants' facts differ). Prints and writes (DIR/results.json, DIR/summary.md) per clip: the medians of both variants' speedups and
latencies, whether each variant's assisted transcript equals its baseline's, whether the two variants' transcripts
are the same, and the word error rate against the reference text where the set has one.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

from assistgen.app.validation import request_settings
from assistgen.comparison.audio import load_audio
from assistgen.comparison.compare import run_generation, target_numerics, warm_up
from assistgen.comparison.speech import detect_language, speech_windows
from assistgen.comparison.tasks import decode
from assistgen.models.catalog import load_catalog
from assistgen.models.loading import check_pair, load_model
from assistgen.models.pool import ModelPool
from bench.scripts.longform_accuracy import READINGS, wer

INPUTS = Path(__file__).resolve().parents[1] / "inputs"
AUDIO = (".flac", ".wav", ".mp3", ".ogg")


def references(folder: Path) -> dict[str, str]:
    """What each clip of a set says, where its transcripts.txt or a reading's text file tells."""
    refs = {}
    if folder.name == "speech-long":
        return {stem + ".flac": (folder / text).read_text() for stem, text in READINGS.items()}
    lines = (folder / "transcripts.txt").read_text().splitlines()
    header = next((line for line in lines if "licence / origin" in line), None)
    for line in lines:
        if line.startswith("#") or not line.strip():
            continue
        name = line.split()[0]
        if header is not None:   # speech-real: the text follows the licence column, 26 characters wide
            refs[name] = line[header.index("licence / origin") + 26:].strip()
        elif folder.name == "speech":   # voice, words per minute, tempo, text
            refs[name] = line.split(None, 4)[4]
        else:                          # language, words per minute, text
            refs[name] = line.split(None, 3)[3]
    return refs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="whisper-base+decoder-int8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sets", nargs="+", default=["speech-real", "speech-long", "speech", "speech-other"])
    parser.add_argument("--out", default="bench/results/whisper-bf16-encoder")
    args = parser.parse_args()
    # the two variants share a pair name but not their facts: kept schedules would overwrite each other's
    os.environ["ASSISTGEN_SCHEDULE_STORE"] = "0"
    catalog = load_catalog()
    spec = catalog.pair(args.pair)
    if spec.target.encoder_dtype is None:
        raise SystemExit(f"{args.pair}: its target has no encoder_dtype in models.yaml; nothing to compare")
    lowered = ModelPool(catalog).pair(spec)
    fp32_spec = dataclasses.replace(spec, target=dataclasses.replace(spec.target, encoder_dtype=None))
    plain = check_pair(fp32_spec, load_model(fp32_spec.target, catalog), lowered.assistant)
    pairs = {"float32 encoder": plain, "bfloat16 encoder": lowered}
    if target_numerics(lowered) == target_numerics(plain):
        raise SystemExit("this CPU does not compute bfloat16 natively: the encoder stays float32, nothing to compare")
    settings = request_settings(spec)
    rows = []
    for set_name in args.sets:
        folder = INPUTS / set_name
        refs = references(folder)
        for clip in sorted(p for p in folder.iterdir() if p.suffix in AUDIO):
            samples = load_audio(str(clip))
            inputs = {}
            for name, pair in pairs.items():
                language = detect_language(pair, samples)[0]
                inputs[name] = (language, speech_windows(pair, samples, language=language))
                warm_up(pair, inputs[name][1][0].inputs)
            runs = {name: [] for name in pairs}
            for repeat in range(args.repeats):
                for name in (list(pairs) if repeat % 2 == 0 else list(reversed(pairs))):
                    pair, windows = pairs[name], inputs[name][1]
                    baseline = run_generation(pair, windows, settings)
                    assisted = run_generation(pair, windows, settings, draft_source="assistant")
                    runs[name].append((baseline, assisted))
            row = {"set": set_name, "clip": clip.name, "seconds": round(len(samples) / 16000, 1)}
            texts = {}
            for name, measured in runs.items():
                baseline, assisted = measured[0]
                texts[name] = decode(pairs[name], baseline.new_tokens)
                row[name] = {
                    "language": inputs[name][0], "tokens": len(baseline.new_tokens),
                    "baseline_s": round(statistics.median(b.latency_s for b, _ in measured), 3),
                    "assisted_s": round(statistics.median(a.latency_s for _, a in measured), 3),
                    # setup: the encoder (each window's) and the caches, the same work in both runs
                    "baseline_setup_s": round(statistics.median(b.setup_s for b, _ in measured), 3),
                    "assisted_setup_s": round(statistics.median(a.setup_s for _, a in measured), 3),
                    "speedup": round(statistics.median(b.latency_s / a.latency_s for b, a in measured), 3),
                    "speedups": [round(b.latency_s / a.latency_s, 3) for b, a in measured],
                    "target_passes": statistics.median(a.target_passes for _, a in measured),
                    "identical": all(a.new_tokens == b.new_tokens for b, a in measured),
                    "text": texts[name],
                    "wer": round(wer(refs[clip.name], texts[name]), 4) if clip.name in refs else None}
            row["same_transcript"] = texts["float32 encoder"] == texts["bfloat16 encoder"]
            rows.append(row)
            f32, b16 = row["float32 encoder"], row["bfloat16 encoder"]
            print(f"{set_name}/{clip.name} {row['seconds']} s, {f32['tokens']}/{b16['tokens']} tokens: "
                  f"fp32 encoder {f32['baseline_s']:.2f}/{f32['assisted_s']:.2f} s {f32['speedup']:.2f}x | "
                  f"bf16 encoder {b16['baseline_s']:.2f}/{b16['assisted_s']:.2f} s {b16['speedup']:.2f}x | "
                  f"transcript {'same' if row['same_transcript'] else 'DIFFERS'}"
                  + (f", WER {f32['wer']:.3f} / {b16['wer']:.3f}" if f32["wer"] is not None else ""), flush=True)
    summary = ["| set | clips | float32 encoder: speedup, median (min–max) | baseline s | bfloat16 encoder: speedup "
               "| baseline s | identical to own baseline | transcripts the same | WER fp32 / bf16 (mean) |",
               "|---|---|---|---|---|---|---|---|---|"]
    for set_name in args.sets:
        chosen = [r for r in rows if r["set"] == set_name]
        if not chosen:
            continue
        cells = []
        for name in pairs:
            every = [s for r in chosen for s in r[name]["speedups"]]
            cells.append(f"{statistics.median(every):.2f}× ({min(every):.2f}–{max(every):.2f}), {len(every)} runs")
            cells.append(f"{statistics.median(r[name]['baseline_s'] for r in chosen):.2f}")
        identical = sum(r[n]["identical"] for r in chosen for n in pairs)
        wers = [r for r in chosen if r["float32 encoder"]["wer"] is not None]
        wer_cell = (f"{statistics.mean(r['float32 encoder']['wer'] for r in wers):.3f} / "
                    f"{statistics.mean(r['bfloat16 encoder']['wer'] for r in wers):.3f} ({len(wers)} clips)"
                    if wers else "–")
        summary.append(f"| {set_name} | {len(chosen)} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
                       f"{identical} of {2 * len(chosen)} | {sum(r['same_transcript'] for r in chosen)} of "
                       f"{len(chosen)} | {wer_cell} |")
    print("\n".join(summary))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python -m bench.scripts.encoder_precision " + " ".join(
                f"--{k} {' '.join(v) if isinstance(v, list) else v}" for k, v in vars(args).items()),
            "date": time.strftime("%Y-%m-%d %H:%M"), "settings": dataclasses.asdict(settings),
            "numerics": {name: target_numerics(pair) for name, pair in pairs.items()}}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, ensure_ascii=False))
    (out / "summary.md").write_text("\n".join(summary) + "\n")


if __name__ == "__main__":
    main()
