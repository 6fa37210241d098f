"""How to transcribe a recording longer than Whisper's 30 s window, judged by word error rate against the text read.

    .venv/bin/python -m bench.scripts.longform_accuracy [--pair whisper-base+decoder-int8]

Three ways, all greedy, on the same target (Whisper base):
- ours: windows of at most 30 s cut at the quietest 100 ms of each window's last 5 s, each transcribed on its own
  (assistgen.comparison.speech), through our decoding loop;
- transformers' sequential long-form decoding: `generate` on the whole recording with timestamps, each window moved
  to the last timestamp it predicted (OpenAI's algorithm);
- transformers' chunked pipeline: 30 s chunks overlapping by 5 s on each side, the overlaps merged.
The recordings are the LibriVox readings of bench/inputs/speech-long (their texts are there) and the two joined.
"""
from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np
import torch

from assistgen.comparison.audio import load_audio
from assistgen.comparison.compare import Settings, run_generation
from assistgen.comparison.speech import speech_windows
from assistgen.comparison.tasks import decode
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool

LONG = Path(__file__).resolve().parents[1] / "inputs" / "speech-long"
READINGS = {"librivox-sonnet-1": "sonnet-1.txt", "two-cities": "two-cities.txt"}


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: word-level edit distance over the reference's length."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1] / max(1, len(ref))


def ours(pair, samples) -> str:
    windows = speech_windows(pair, samples, language="en")
    return decode(pair, run_generation(pair, windows, Settings(max_new_tokens=224)).new_tokens)


def sequential(pair, samples) -> str:
    processor, model = pair.target.processor, pair.target.model
    features = processor(samples, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
                         return_attention_mask=True)
    with torch.inference_mode():
        out = model.generate(features.input_features, attention_mask=features.attention_mask, language="en",
                             task="transcribe", return_timestamps=True, condition_on_prev_tokens=False)
    return processor.batch_decode(out, skip_special_tokens=True)[0].strip()


def chunked(pair, samples) -> str:
    from transformers import pipeline
    asr = pipeline("automatic-speech-recognition", model=pair.target.model, tokenizer=pair.target.tokenizer,
                   feature_extractor=pair.target.processor.feature_extractor, chunk_length_s=30, device="cpu")
    return asr(samples.copy(), generate_kwargs={"language": "en", "task": "transcribe"})["text"].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="whisper-base+decoder-int8")
    args = parser.parse_args()
    pair = ModelPool(load_catalog()).pair(args.pair)
    recordings = {name: (load_audio(LONG / f"{name}.flac"), (LONG / text).read_text()) for name, text in READINGS.items()}
    joined = [recordings[n] for n in READINGS]
    recordings["both, joined"] = (np.concatenate([a for a, _ in joined]), " ".join(t for _, t in joined))
    print("| recording | length | ours: windows cut at pauses | transformers sequential | transformers chunked |")
    print("|---|---|---|---|---|")
    for name, (samples, text) in recordings.items():
        cells = []
        for method in (ours, sequential, chunked):
            start = time.perf_counter()
            hypothesis = method(pair, samples)
            cells.append(f"{wer(text, hypothesis):.1%} ({time.perf_counter() - start:.1f} s)")
            print(f"  {name} {method.__name__}: {hypothesis}", flush=True)
        print(f"| {name} | {len(samples) / 16000:.0f} s | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
