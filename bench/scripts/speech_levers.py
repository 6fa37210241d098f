"""Levers on the speech pair's assistant, each measured against the same baselines: what it reads of the clip (its own
encoder's input, or, for a decoder reading the target's encoder, the frames its cross-attention attends to: the clip
plus a margin, or Whisper's whole 30 s window), on real clips.

    .venv/bin/python -m bench.scripts.speech_levers [--pair whisper-base+decoder-int8] [--repeats 3]

Every clip of bench/inputs/speech-real runs its baseline, then the assisted run under each lever, `--repeats` times,
in rotating order; prints per lever the median speedup (min-max), tokens per pass and acceptance.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from assistgen.comparison.audio import load_audio
from assistgen.app.validation import request_settings
from assistgen.comparison.compare import run_generation, warm_up
from assistgen.comparison.speech import speech_windows
from assistgen.engine import kv
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

CLIPS = Path(__file__).resolve().parents[1] / "inputs" / "speech-real"
LEVERS = {"assistant encoder over the whole 30 s window": None,
          "... over the clip + 2 s (the default)": 2.0,
          "... over the clip + 0.5 s": 0.5,
          "... over the clip + 5 s": 5.0,
          "... over the clip + 10 s": 10.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="whisper-base+decoder-int8")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    catalog = load_catalog()
    pair = ModelPool(catalog).pair(args.pair)
    spec = catalog.pair(args.pair)
    settings = request_settings(spec)   # the pair's own defaults, as the app takes them
    clips = [speech_windows(pair, load_audio(p), language="en") for p in sorted(CLIPS.glob("*.flac"))]
    warm_up(pair, clips[0][0].inputs)
    rows = {name: [] for name in LEVERS}
    for repeat in range(args.repeats):
        for n, windows in enumerate(clips):
            baseline = run_generation(pair, windows, settings)
            names = list(LEVERS)
            for name in names[(n + repeat) % len(names):] + names[:(n + repeat) % len(names)]:
                kv.ASSISTANT_AUDIO_MARGIN_S = LEVERS[name]
                assisted = run_generation(pair, windows, settings, draft_source="assistant")
                assert assisted.new_tokens == baseline.new_tokens
                rows[name].append((baseline.latency_s / assisted.latency_s, assisted.tokens_per_pass,
                                   assisted.acceptance_rate or 0.0))
    kv.ASSISTANT_AUDIO_MARGIN_S = LEVERS["... over the clip + 2 s (the default)"]
    print(f"{args.pair}, {len(clips)} clips x {args.repeats} repeats, medians (min-max):")
    print("| lever | speedup | tokens/pass | acceptance |\n|---|---|---|---|")
    for name, values in rows.items():
        speedups = [v[0] for v in values]
        print(f"| {name} | {statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}) | "
              f"{statistics.median(v[1] for v in values):.2f} | {statistics.median(v[2] for v in values):.0%} |")


if __name__ == "__main__":
    main()
