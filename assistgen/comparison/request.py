"""One request, from raw values to model inputs: the path the page, the API, the command line and the benchmark all
take. `pair_for_task` and `build_request` check everything that can be checked before a model loads (the task, the
pair, every setting against the limits in `choices`, the text or the recording); `request_inputs` turns a request
into a loaded pair's inputs. Whatever is wrong is an InputError whose message says what to change."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..choices import (DRAFT_SOURCES, MAX_INPUT_TOKENS, MAX_NEW_TOKENS_RANGE, SCHEDULE_NAMES, TASK_LABELS, TASKS,
                       TEMPERATURE_RULE, WINDOW_RANGE, Limits, limits_from_env, temperature_allowed)
from ..models.availability import pair_availability
from ..models.catalog import Catalog, PairSpec
from ..models.loading import LoadedPair
from .audio import load_audio
from .speech import SpeechWindow, detect_language, languages, speech_windows
from .tasks import LANGUAGES, InputError, check_text, text_inputs


Inputs = dict | list[SpeechWindow]   # one prompt or clip, or a recording's windows


@dataclass(frozen=True)
class Settings:
    """How both runs of a comparison decode, checked against the limits of `choices` when built (an InputError
    says what to change): every Settings is a valid one."""
    max_new_tokens: int = 128
    temperature: float = 0.0          # 0 means greedy
    top_p: float = 1.0                # nucleus sampling; below 1 only with a temperature above 0
    draft_source: str = "assistant"   # or "prompt_lookup", "assistant_lookup" (choices.DRAFT_SOURCES)
    num_assistant_tokens: int = 5
    schedule: str = "heuristic"
    seed: int = 0
    max_time_s: float | None = None

    def __post_init__(self) -> None:
        (low, high), (w_low, w_high) = MAX_NEW_TOKENS_RANGE, WINDOW_RANGE
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or \
                not low <= self.max_new_tokens <= high:
            raise InputError(f"max_new_tokens must be a whole number from {low} to {high}, "
                             f"got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not temperature_allowed(self.temperature):
            raise InputError(f"temperature must be {TEMPERATURE_RULE}, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_p < 1 and not self.do_sample:
            raise InputError(f"top_p {self.top_p:g} applies to sampling only: set a temperature above 0, or leave "
                             "top_p at 1")
        if self.draft_source not in DRAFT_SOURCES:
            raise InputError(f"draft source must be one of {', '.join(DRAFT_SOURCES)}, got {self.draft_source!r}")
        if self.schedule not in SCHEDULE_NAMES:
            raise InputError(f"schedule must be one of {', '.join(SCHEDULE_NAMES)}, got {self.schedule!r}")
        if not isinstance(self.num_assistant_tokens, int) or not w_low <= self.num_assistant_tokens <= w_high:
            raise InputError(f"num_assistant_tokens must be from {w_low} to {w_high}, "
                             f"got {self.num_assistant_tokens!r}")

    @property
    def do_sample(self) -> bool:
        return self.temperature > 0


@dataclass(frozen=True)
class Request:
    """A checked request: the pair, the task, the settings, and what the inputs are built from."""
    pair: PairSpec
    task: str
    settings: Settings
    text: str | None = None                 # chat, translation, summarization
    target_language: str = "French"         # translation
    language: str | None = None             # speech: a language code, or None to let the target detect it
    max_input_tokens: int = MAX_INPUT_TOKENS   # a text prompt's limit (`choices.Limits`)
    # speech: the recording, decoded to 16 kHz mono, and the seconds that took
    samples: np.ndarray | None = field(default=None, compare=False, repr=False)
    decode_s: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ModelInputs:
    """A request's inputs for one loaded pair."""
    inputs: Inputs              # a prompt's, or a recording's windows
    language: dict | None       # speech: {"code": ..., "detected": bool, "probability": ...}
    prep: dict | None           # speech: {"audio_decode_s", "features_s"}, shared by both runs


def _check_task(spec: PairSpec, task: str) -> None:
    if task not in spec.tasks:
        raise InputError(f"pair {spec.name!r} does not do {TASK_LABELS.get(task, task).lower()}; it does "
                         f"{', '.join(TASK_LABELS.get(t, t).lower() for t in spec.tasks)}: pick another pair")


def pair_for_task(catalog: Catalog, name: str, task: str) -> PairSpec:
    """The catalog's pair `name`, once the task is known, the pair does it and its weights are there."""
    if task not in TASKS:
        raise InputError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    try:
        spec = catalog.pair(name)
    except KeyError as exc:
        raise InputError(exc.args[0]) from None
    _check_task(spec, task)
    ok, why = pair_availability(spec, catalog)
    if not ok:
        raise InputError(f"pair {name!r} is unavailable: {why}. Pick another pair.")
    return spec


def number(name: str, value, kind: type):
    """A number from a form, an API call or a command line (a string is parsed), whole when `kind` is int."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InputError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:   # NaN is not itself
        raise InputError(f"{name} must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)   # an int past float's range raises here
    except OverflowError:
        finite = False
    if not finite:
        raise InputError(f"{name} must be a finite number, got {str(value)[:20]}")
    if kind is int:
        if value != int(value):
            raise InputError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    return value


def request_settings(spec: PairSpec, *, max_new_tokens=None, temperature=0.0, top_p=1.0, draft_source=None,
                     num_assistant_tokens=None, schedule=None, seed=0, max_time_s: float | None = None) -> Settings:
    """Settings from a request's raw values; what is not given comes from the pair's own defaults (models.yaml).
    `max_time_s`: each run's time limit, None for none."""
    max_new_tokens = (spec.max_new_tokens if max_new_tokens is None
                      else number("max_new_tokens", max_new_tokens, int))
    window = (spec.num_assistant_tokens if num_assistant_tokens is None
              else number("initial window", num_assistant_tokens, int))
    return Settings(max_new_tokens=max_new_tokens, temperature=float(number("temperature", temperature, float)),
                    top_p=float(number("top_p", top_p, float)), draft_source=draft_source or spec.draft_source,
                    num_assistant_tokens=window, schedule=schedule or spec.schedule,
                    seed=int(number("seed", seed, int)), max_time_s=max_time_s)


def build_request(spec: PairSpec, task: str, settings: Settings, *, text: str | None = None, audio=None,
                  target_language: str = "French", language: str | None = None,
                  limits: Limits | None = None, served: bool = False) -> Request:
    """A request for `spec` (from `pair_for_task`), checked: the task is the pair's, speech has a recording that
    decodes within the limit (decoded here), a text task has text within the limit and a known target language.
    `served`: the request came to the server (the page, the API), whose file-size limit a recording keeps too; the
    CLI and bench read local files of any size."""
    limits = limits or limits_from_env()
    _check_task(spec, task)
    if task == "asr":
        start = time.perf_counter()
        samples = load_audio(audio, max_seconds=limits.max_audio_s,
                             max_file_size=limits.max_file_size if served else None)
        return Request(spec, task, settings, language=None if language in (None, "", "auto") else language,
                       max_input_tokens=limits.max_input_tokens, samples=samples,
                       decode_s=round(time.perf_counter() - start, 4))
    check_text(text, limits.max_input_tokens)
    if task == "translation" and target_language not in LANGUAGES:
        raise InputError(f"unknown target language {target_language!r}; choose from {', '.join(LANGUAGES)}")
    return Request(spec, task, settings, text=text, target_language=target_language,
                   max_input_tokens=limits.max_input_tokens)


def speech_language(pair: LoadedPair, samples: np.ndarray, language: str | None) -> dict:
    """The language to transcribe in: the one asked for (checked against the target's), or the target's own
    detection over the first 30 s."""
    if language in (None, "", "auto"):
        code, probability = detect_language(pair, samples)
        return {"code": code, "detected": True, "probability": round(probability, 3)}
    known = languages(pair.target.model)
    if language not in known:
        raise InputError(f"{pair.target.spec.name} does not know the language {language!r}; pick auto-detect or "
                         f"one of {', '.join(known)}")
    return {"code": language, "detected": False, "probability": None}


def request_inputs(request: Request, pair: LoadedPair,
                   on_language: Callable[[dict], None] | None = None) -> ModelInputs:
    """The request's inputs for `pair` (loaded from `request.pair`): a tokenized prompt, or a recording's windows
    in the language asked for or detected (`on_language` hears it before the windows' features are computed)."""
    if request.task != "asr":
        return ModelInputs(text_inputs(pair, request.task, request.text, target_language=request.target_language,
                                       max_input_tokens=request.max_input_tokens), None, None)
    spoken = speech_language(pair, request.samples, request.language)
    if on_language is not None:
        on_language(spoken)
    start = time.perf_counter()
    windows = speech_windows(pair, request.samples, language=spoken["code"])
    prep = {"audio_decode_s": request.decode_s, "features_s": round(time.perf_counter() - start, 4)}
    return ModelInputs(windows, spoken, prep)
