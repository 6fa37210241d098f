"""Where an assisted speech run's time goes, clip by clip: each encoder, the prefix translation between the two
tokenizers, the re-tokenization of every step, the assistant's passes and the target's.

    .venv/bin/python -m bench.scripts.speech_profile [--pair whisper-base+decoder-int8] [--repeats 3] CLIP...

Each clip runs the baseline and the assisted run `--repeats` times, interleaved; every part is timed inside the real
loop (wrappers around the functions it calls, which add a few microseconds per call), and the medians are printed.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from pathlib import Path

from assistgen.comparison.audio import load_audio
from assistgen.comparison.request import request_settings
from assistgen.comparison.compare import Settings, run_generation, warm_up
from assistgen.comparison.speech import asr_inputs
from assistgen.engine import kv, retokenizing, whisper_decoder
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

PARTS = ("target encoder", "assistant encoder", "assistant setup", "prefix translation", "re-tokenization",
         "assistant passes", "target passes")


class Timers:
    """Seconds spent in each part during one run."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)

    def wrap(self, owner, name: str, part: str, when=lambda *a, **k: True):
        original = getattr(owner, name)

        @functools.wraps(original)   # the loop reads the encoder's signature to pick its inputs
        def timed(*args, **kwargs):
            if not when(*args, **kwargs):
                return original(*args, **kwargs)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start
                self.calls[part] += 1
        setattr(owner, name, timed)
        return original


def instrument(timers: Timers, pair) -> list:
    """Wrap the functions the loop calls; returns what to restore."""
    target = pair.target.model
    restore = []
    original_encoder = target.get_encoder().forward
    restore.append((target.get_encoder(), "forward", original_encoder))
    timers.wrap(target.get_encoder(), "forward", "target encoder")
    if pair.assistant is not None and pair.assistant.model.config.is_encoder_decoder:   # a decoder-only one has none
        encoder = pair.assistant.model.get_encoder()
        restore.append((encoder, "forward", encoder.forward))
        timers.wrap(encoder, "forward", "assistant encoder")
    restore.append((whisper_decoder, "clip_encoder_outputs", whisper_decoder.clip_encoder_outputs))
    timers.wrap(whisper_decoder, "clip_encoder_outputs", "assistant encoder")   # the encoder over the clip's frames
    restore.append((whisper_decoder.WhisperDecoderStep, "__init__", whisper_decoder.WhisperDecoderStep.__init__))
    timers.wrap(whisper_decoder.WhisperDecoderStep, "__init__", "assistant setup")   # its cross-attention keys
    restore.append((retokenizing, "translate_prefix", retokenizing.translate_prefix))
    timers.wrap(retokenizing, "translate_prefix", "prefix translation")
    restore.append((kv.CachedDecoder, "logits", kv.CachedDecoder.logits))
    original_logits = kv.CachedDecoder.logits

    def logits(self, tokens, keep=1):
        part = "target passes" if self.model is target else "assistant passes"
        start = time.perf_counter()
        try:
            return original_logits(self, tokens, keep)
        finally:
            timers.seconds[part] += time.perf_counter() - start
            timers.calls[part] += 1
    kv.CachedDecoder.logits = logits
    for tokenizer in {id(t): t for t in (pair.target.tokenizer, pair.assistant.tokenizer)}.values():
        for method in ("encode", "decode"):
            restore.append((tokenizer, method, getattr(tokenizer, method)))
            timers.wrap(tokenizer, method, "re-tokenization")
    return restore


def undo(restore: list) -> None:
    for owner, name, original in reversed(restore):
        if isinstance(owner, type) or owner is retokenizing:
            setattr(owner, name, original)
        else:
            try:
                delattr(owner, name)   # an instance attribute shadowing the class's method
            except AttributeError:
                setattr(owner, name, original)


def profile(pair, inputs: dict, settings: Settings, draft_source: str | None) -> tuple[float, Timers, object]:
    timers = Timers()
    restore = instrument(timers, pair)
    try:
        result = run_generation(pair, inputs, settings, draft_source=draft_source)
    finally:
        undo(restore)
    return result.latency_s, timers, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="whisper-base+decoder-int8")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("clips", nargs="+")
    args = parser.parse_args()
    catalog = load_catalog()
    pair = ModelPool(catalog).pair(args.pair)
    spec = catalog.pair(args.pair)
    settings = request_settings(spec, max_new_tokens=args.max_new_tokens)   # else the pair's own defaults
    for clip in args.clips:
        audio = load_audio(clip)
        start = time.perf_counter()
        inputs = asr_inputs(pair, audio)
        features_s = time.perf_counter() - start
        warm_up(pair, inputs)
        runs = defaultdict(list)
        for _ in range(args.repeats):
            for source in (None, "assistant"):
                latency, timers, result = profile(pair, inputs, settings, source)
                name = "baseline" if source is None else "assisted"
                runs[name].append((latency, timers, result))
        print(f"\n{Path(clip).name}: {len(audio) / 16000:.1f} s of audio, features {features_s * 1000:.0f} ms, "
              f"{len(runs['baseline'][0][2].new_tokens)} tokens, median of {args.repeats}")
        for name, measured in runs.items():
            latency = statistics.median(m[0] for m in measured)
            parts = {p: statistics.median(m[1].seconds[p] for m in measured) for p in PARTS}
            calls = {p: measured[0][1].calls[p] for p in PARTS}
            other = latency - sum(parts.values())
            result = measured[0][2]
            print(f"  {name}: {latency * 1000:.0f} ms, {result.target_passes} target passes, "
                  f"{result.tokens_per_pass:.2f} tokens/pass")
            for p in PARTS:
                if calls[p]:
                    print(f"    {p:20s} {parts[p] * 1000:7.1f} ms  ({calls[p]} calls)")
            print(f"    {'other':20s} {other * 1000:7.1f} ms")
        speedups = [b[0] / a[0] for b, a in zip(runs["baseline"], runs["assisted"])]
        print(f"  speedup {statistics.median(speedups):.2f}x (runs: {', '.join(f'{s:.2f}' for s in speedups)})")


if __name__ == "__main__":
    main()
