"""Every choice and limit a request can name, in one place: the page, the API, the validation, the catalog and the
command line all read them from here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .config import MAX_AUDIO_SECONDS, MAX_FILE_SIZE, MAX_GENERATION_SECONDS, MAX_INPUT_TOKENS, from_env
from .engine.schedules import SCHEDULES

TASK_LABELS = {"chat": "Chat", "translation": "Translation", "summarization": "Summarization",
               "asr": "Speech recognition"}
TASKS = tuple(TASK_LABELS)
TEXT_TASKS = tuple(task for task in TASKS if task != "asr")
SCHEDULE_NAMES = tuple(SCHEDULES)                      # num_assistant_tokens_schedule
DRAFT_SOURCES = {"assistant": "assistant model", "assistant_lookup": "assistant + prompt lookup",
                 "prompt_lookup": "prompt lookup (no model)"}
# The page's names, as the command line takes them ("speech-recognition", "assistant+lookup"), each to its id; the ids
# themselves are names too.
TASK_NAMES = {**{label.lower().replace(" ", "-"): task for task, label in TASK_LABELS.items()},
              **{task: task for task in TASKS}}
DRAFT_SOURCE_NAMES = {"assistant-model": "assistant", "assistant+lookup": "assistant_lookup",
                      "assistant+prompt-lookup": "assistant_lookup", "prompt-lookup": "prompt_lookup",
                      **{name: name for name in DRAFT_SOURCES}}
MODE_LABELS = {"same-tokenizer": "same tokenizer", "different-tokenizer": "different tokenizers",
               "no-assistant": "no assistant"}                  # how a pair's assistant relates to its target
WINDOW_RANGE = (1, 64)                                 # num_assistant_tokens, the initial window
MAX_NEW_TOKENS_RANGE = (1, 1024)
TEMPERATURE_RANGE = (0.0, 2.0)                         # 0 means greedy
TOP_P_RANGE = (0.05, 1.0)                              # the page's top-p slider; 1 keeps every token
MIN_SAMPLING_TEMPERATURE = 0.001   # colder sampling is greedy in all but name; near 1e-37, logits / T overflow


def temperature_allowed(value: float) -> bool:
    """0 (greedy), or a sampling temperature within `TEMPERATURE_RANGE` from `MIN_SAMPLING_TEMPERATURE` up."""
    low, high = TEMPERATURE_RANGE
    return value == low or MIN_SAMPLING_TEMPERATURE <= value <= high


TEMPERATURE_RULE = f"{TEMPERATURE_RANGE[0]:g} (greedy) or from {MIN_SAMPLING_TEMPERATURE:g} to {TEMPERATURE_RANGE[1]:g}"

# What one request may ask of the machine (MAX_INPUT_TOKENS, MAX_AUDIO_SECONDS, MAX_FILE_SIZE,
# MAX_GENERATION_SECONDS, defined with the configuration); each can be lowered or raised for a deployment by its
# environment variable, read by `config.from_env`.

FILE_SIZE_UNITS = {"b": 1, "kb": 2**10, "mb": 2**20, "gb": 2**30, "tb": 2**40}   # Gradio's, in multiples of 1024


def file_size_bytes(size: str | int) -> int:
    """Bytes in a size written in Gradio's notation ("25mb", "1gb", or a whole number of bytes)."""
    if isinstance(size, int):
        return size
    text = size.replace(" ", "").lower()
    digits = len(text) - len(text.lstrip("0123456789"))
    unit = text[digits:] or "b"
    if not digits or unit not in FILE_SIZE_UNITS:
        raise ValueError(f"a file size is a whole number and a unit ({', '.join(FILE_SIZE_UNITS)}), got {size!r}")
    return int(text[:digits]) * FILE_SIZE_UNITS[unit]


@dataclass(frozen=True)
class Limits:
    max_input_tokens: int = MAX_INPUT_TOKENS
    max_audio_s: float = MAX_AUDIO_SECONDS
    max_file_size: str = MAX_FILE_SIZE
    max_generation_s: float = MAX_GENERATION_SECONDS


def limits_from_env(environ: Mapping[str, str] | None = None) -> Limits:
    """The limits, each overridden by its variable where set: ASSISTGEN_MAX_INPUT_TOKENS, ASSISTGEN_MAX_AUDIO_SECONDS,
    ASSISTGEN_MAX_FILE_SIZE (Gradio's notation: "25mb", "1gb") and ASSISTGEN_MAX_GENERATION_SECONDS."""
    config = from_env(environ)
    return Limits(max_input_tokens=config.max_input_tokens, max_audio_s=config.max_audio_s,
                  max_file_size=config.max_file_size, max_generation_s=config.max_generation_s)
