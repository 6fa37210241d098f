"""Speech inputs for Whisper: a recording cut into windows of at most 30 s at its quietest moments, each window's
features and forced decoder prefix, and the spoken language, detected by the target itself.

Long recordings are transcribed window by window, each window on its own (Whisper reads 30 s at a time). Where a
window ends matters: a cut through a word loses it. The cut is placed at the quietest 100 ms of the window's last
5 s, a pause between words in speech, so no text falls between two windows and none is read twice (transformers'
chunked pipeline instead overlaps its windows and merges the two readings of each overlap; OpenAI's sequential
long-form decoding moves each window to the last timestamp it predicted). docs/results.md (long recordings) compares
the three by word error rate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers.models.whisper.tokenization_whisper import LANGUAGES as WHISPER_LANGUAGES

from ..engine.kv import CachedDecoder
from ..models.loading import LoadedPair
from .tasks import SAMPLE_RATE, InputError

WINDOW_S = 30.0          # Whisper's input window
CUT_SEARCH_S = 5.0       # a window longer than the rest of the recording ends in the quietest moment of its last 5 s
QUIET_FRAME_S = 0.1      # ... measured over 100 ms, every 10 ms


def spoken_language_choices() -> list[tuple[str, str]]:
    """(label, code) for the page's spoken-language menu: auto-detect, then Whisper's languages by name."""
    return [("auto-detect", "auto")] + sorted(((f"{name.title()} ({code})", code)
                                               for code, name in WHISPER_LANGUAGES.items()), key=lambda c: c[0])


@dataclass(frozen=True)
class SpeechWindow:
    """One window of a recording: where it lies (seconds) and its model inputs."""
    start_s: float
    end_s: float
    inputs: dict


def cut_points(samples: np.ndarray, rate: int = SAMPLE_RATE, window_s: float = WINDOW_S,
               search_s: float = CUT_SEARCH_S) -> list[tuple[int, int]]:
    """Sample ranges covering the recording, each at most `window_s` long; every one but the last ends in the middle
    of the quietest `QUIET_FRAME_S` of its last `search_s`."""
    window, search, frame, hop = (int(window_s * rate), int(search_s * rate), int(QUIET_FRAME_S * rate),
                                  int(0.01 * rate))
    spans, start = [], 0
    while len(samples) - start > window:
        low = start + window - search
        energy = np.concatenate([[0.0], np.cumsum(samples[low:start + window].astype(np.float64) ** 2)])
        sums = energy[frame:] - energy[:-frame]          # energy of each frame-long stretch, by its first sample
        quietest = int(np.argmin(sums[::hop])) * hop
        cut = low + quietest + frame // 2
        spans.append((start, cut))
        start = cut
    spans.append((start, len(samples)))
    return spans


def asr_inputs(pair: LoadedPair, audio: np.ndarray, *, language: str = "en") -> dict:
    """One window (at most 30 s of 16 kHz mono audio): its log-mel features, padded to 30 s as Whisper reads them,
    the frames that hold the audio itself, and Whisper's forced decoder prefix (start, language, task)."""
    processor = pair.target.processor
    extracted = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True)
    tokenizer = pair.target.tokenizer
    prefix = ["<|startoftranscript|>"]
    if multilingual(pair.target.model):
        prefix += [f"<|{language}|>", "<|transcribe|>"]
    prefix.append("<|notimestamps|>")
    ids = tokenizer.convert_tokens_to_ids(prefix)
    if tokenizer.unk_token_id is not None and tokenizer.unk_token_id in ids:
        raise InputError(f"this Whisper model has no language token for {language!r}")
    # attention_mask marks the clip's own frames among the 30 s window: Whisper's encoder reads the whole window (it
    # takes the mask and ignores it), an assistant's may read only the clip
    # (engine.whisper_decoder.clip_encoder_outputs)
    return {"input_features": extracted.input_features.to(pair.target.model.dtype),
            "decoder_input_ids": torch.tensor([ids]), "attention_mask": extracted.attention_mask}


def speech_windows(pair: LoadedPair, samples: np.ndarray, *, language: str = "en") -> list[SpeechWindow]:
    """The recording in windows (`cut_points`), each with its inputs."""
    return [SpeechWindow(start / SAMPLE_RATE, end / SAMPLE_RATE,
                         asr_inputs(pair, samples[start:end], language=language))
            for start, end in cut_points(samples)]


def multilingual(model) -> bool:
    config = model.generation_config
    return bool(getattr(config, "is_multilingual", False) or getattr(config, "lang_to_id", None))


def languages(model) -> list[str]:
    """The language codes a Whisper model knows (["en"] for an English-only one)."""
    if not multilingual(model):
        return ["en"]
    return [token.strip("<|>") for token in model.generation_config.lang_to_id]


@torch.inference_mode()
def detect_language(pair: LoadedPair, samples: np.ndarray) -> tuple[str, float]:
    """(language code, its probability): the target's own choice of language token after <|startoftranscript|>,
    over the recording's first window, as Whisper does."""
    model = pair.target.model
    if not multilingual(model):
        return "en", 1.0
    start, end = cut_points(samples)[0]
    inputs = asr_inputs(pair, samples[start:end])
    sot = pair.target.tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    logits = CachedDecoder(model, {**inputs, "decoder_input_ids": torch.tensor([[sot]])}, prefix_length=1).logits([sot])
    ids = model.generation_config.lang_to_id
    probs = torch.softmax(logits[0, list(ids.values())], dim=-1)
    best = int(probs.argmax())
    return list(ids)[best].strip("<|>"), float(probs[best])


def window_language(pair: LoadedPair, inputs: dict) -> str:
    """The language a window's forced prefix names ("en" for an English-only target)."""
    names = pair.target.tokenizer.convert_ids_to_tokens(inputs["decoder_input_ids"][0].tolist())
    codes = [name.strip("<|>") for name in names if name.startswith("<|") and name.strip("<|>") in languages(
        pair.target.model)]
    return codes[0] if codes else "en"
