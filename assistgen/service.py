"""What the app and the API do with a request: validate, load, run baseline then assisted, stream the progress.

Gradio-free, so tests drive it directly; app.py only lays out components and turns UserError into gr.Error.
"""
from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .audio import load_audio, max_audio_seconds
from .catalog import TASKS, Catalog
from .compare import MAX_NEW_TOKENS_LIMIT, Comparison, Settings, compare, warm_up
from .loading import LoadError, LoadedPair, pair_availability
from .pool import ModelPool
from .tasks import DEFAULT_MAX_INPUT_TOKENS, SAMPLE_RATE, InputError, asr_inputs, text_inputs

TASK_LABELS = {"chat": "Chat", "translation": "Translation", "summarization": "Summarization",
               "asr": "Speech recognition"}


PHASE_MESSAGES = {"warm-up": "warming the models up (once per pair)",
                  "probe": "timing a fixed target pass, to check that the machine's speed holds",
                  "baseline": "baseline running (it runs first)",
                  "assisted": "assisted generation running (baseline finished)"}


class UserError(Exception):
    """Something the user can fix; the message says what to do."""


@dataclass
class Progress:
    """One snapshot of a running comparison, for streaming."""
    phase: str                                  # "loading", "warm-up", "probe", "baseline", "assisted", "done"
    message: str = ""
    fraction: float = 0.0
    pair: LoadedPair | None = None
    baseline_tokens: list[int] = field(default_factory=list)
    assisted_steps: list = field(default_factory=list)
    comparison: Comparison | None = None


class Service:
    def __init__(self, catalog: Catalog, pool: ModelPool | None = None, *, max_input_tokens: int | None = None,
                 max_time_s: float | None = None):
        self.catalog = catalog
        self.pool = pool or ModelPool(catalog)
        self.max_input_tokens = max_input_tokens or int(os.environ.get("ASSISTGEN_MAX_INPUT_TOKENS",
                                                                       DEFAULT_MAX_INPUT_TOKENS))
        self.max_time_s = max_time_s or float(os.environ.get("ASSISTGEN_MAX_GENERATION_SECONDS", 300))
        self.max_audio_seconds = max_audio_seconds()
        self._lock = threading.Lock()  # model work runs one request at a time: timings must not mix
        self.update_interval_s = 1.0   # streamed updates at most this often: each one costs the timed run CPU time

    # --- choices -------------------------------------------------------------------------------------------------
    def pair_choices(self, task: str) -> list[tuple[str, str]]:
        """(label, pair name) for a task's dropdown, availability in the label."""
        choices = []
        for pair in self.catalog.pairs_for(task):
            ok, why = pair_availability(pair, self.catalog)
            choices.append((pair.name if ok else f"{pair.name} (unavailable: {why})", pair.name))
        return choices

    @staticmethod
    def default_pair(choices: list[tuple[str, str]]) -> str | None:
        """The first available pair among a dropdown's choices."""
        return next((name for label, name in choices if label == name), None)

    def pair_defaults(self, pair_name: str) -> tuple[int, str]:
        """The pair's initial window and schedule, from models.yaml."""
        spec = self.catalog.pair(pair_name)
        return spec.num_assistant_tokens, spec.schedule

    def pair_info(self, pair_name: str) -> str:
        """One line under the pair dropdown: what the pair is, and its defaults."""
        spec = self.catalog.pair(pair_name)
        return f"{spec.description} · defaults: window {spec.num_assistant_tokens}, schedule {spec.schedule}"

    # --- validation ------------------------------------------------------------------------------------------------
    def settings(self, pair_name: str, *, max_new_tokens=None, temperature=0.0, draft_source="assistant",
                 num_assistant_tokens=None, schedule=None, seed=0) -> Settings:
        spec = self.catalog.pair(pair_name)

        def number(name, value, kind):
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise UserError(f"{name} must be a number, got {value!r}") from None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise UserError(f"{name} must be a number, got {value!r}")
            if kind is int:
                if value != int(value):
                    raise UserError(f"{name} must be a whole number, got {value!r}")
                value = int(value)
            return value

        max_new_tokens = spec.max_new_tokens if max_new_tokens is None else number("max_new_tokens", max_new_tokens,
                                                                                     int)
        window = spec.num_assistant_tokens if num_assistant_tokens is None else number("initial window",
                                                                                      num_assistant_tokens, int)
        settings = Settings(max_new_tokens=max_new_tokens, temperature=float(number("temperature", temperature, float)),
                            draft_source=draft_source, num_assistant_tokens=window, schedule=schedule or spec.schedule,
                            seed=int(number("seed", seed, int)), max_time_s=self.max_time_s)
        try:
            return settings.validate()
        except ValueError as exc:
            raise UserError(str(exc)) from None

    def _check_request(self, task: str, pair_name: str) -> None:
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
        try:
            spec = self.catalog.pair(pair_name)
        except KeyError:
            raise UserError(f"unknown pair {pair_name!r}; pick one from the list") from None
        if task not in spec.tasks:
            raise UserError(f"pair {pair_name!r} does not do {TASK_LABELS[task].lower()}; pick another pair")
        ok, why = pair_availability(spec, self.catalog)
        if not ok:
            raise UserError(f"pair {pair_name!r} is unavailable: {why}. Pick another pair.")

    # --- running -------------------------------------------------------------------------------------------------
    def stream(self, task: str, pair_name: str, *, text: str | None = None, audio: str | None = None,
               target_language: str = "French", settings: Settings) -> Iterator[Progress]:
        """Validate, load (with progress), run baseline then assisted; yield snapshots as steps arrive."""
        self._check_request(task, pair_name)
        samples = None
        if task == "asr":
            try:
                samples = load_audio(audio, max_seconds=self.max_audio_seconds)
            except InputError as exc:
                raise UserError(str(exc)) from None
        elif not isinstance(text, str) or not text.strip():
            raise UserError("the text is empty: type or paste something first")
        events: queue.Queue = queue.Queue()
        state = Progress("loading", "waiting for the model worker")
        yield state

        def work():
            try:
                with self._lock:
                    pair = self.pool.pair(pair_name, lambda f, m: events.put(("loading", f, m)))
                    inputs = asr_inputs(pair, samples) if task == "asr" else text_inputs(
                        pair, task, text, target_language=target_language, max_input_tokens=self.max_input_tokens)
                    events.put(("pair", pair, None))
                    result = compare(pair, task, inputs, settings,
                                     on_baseline_step=lambda s: events.put(("baseline", s, None)),
                                     on_assisted_step=lambda s: events.put(("assisted", s, None)),
                                     on_phase=lambda name: events.put(("phase", name, None)))
                events.put(("done", result, None))
            except InputError as exc:
                events.put(("error", UserError(str(exc)), None))
            except LoadError as exc:
                events.put(("error", UserError(f"could not load pair {pair_name!r}: {exc}"), None))
            except MemoryError:
                events.put(("error", UserError("the server ran out of memory; try a shorter input or fewer "
                                                "max_new_tokens"), None))
            except BaseException as exc:  # reported to the user; the server keeps serving
                events.put(("error", exc, None))

        worker = threading.Thread(target=work, daemon=True, name="assistgen-compare")
        worker.start()
        while True:
            kind, payload, extra = events.get()
            # Coalesce steps into a few updates a second: rendering competes with the timed runs for the CPU.
            deadline = time.monotonic() + self.update_interval_s
            while kind in ("baseline", "assisted"):
                self._apply(state, kind, payload, extra)
                try:
                    kind, payload, extra = events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    kind = None
                    break
            if kind is None:
                yield state
                continue
            if kind == "error":
                worker.join()
                raise payload
            self._apply(state, kind, payload, extra)
            yield state
            if kind == "done":
                worker.join()
                return

    @staticmethod
    def _apply(state: Progress, kind: str, payload, extra) -> None:
        if kind == "loading":
            state.phase, state.fraction, state.message = "loading", payload, extra
        elif kind == "pair":
            state.pair, state.phase, state.message = payload, "warm-up", PHASE_MESSAGES["warm-up"]
        elif kind == "phase":
            state.phase, state.message = payload, PHASE_MESSAGES[payload]
        elif kind == "baseline":
            state.baseline_tokens.extend(payload.emitted)
        elif kind == "assisted":
            state.assisted_steps.append(payload)
        elif kind == "done":
            state.phase, state.message, state.comparison = "done", "done", payload

    def default_pairs(self) -> list[str]:
        """Each task's default pair (its first available one), each once."""
        names = [self.default_pair(self.pair_choices(task)) for task in TASK_LABELS]
        return list(dict.fromkeys(name for name in names if name))

    def preload(self, pair_names: list[str]) -> list[str]:
        """Load and warm up these pairs now, one at a time under the model lock, so no click pays for it (the app
        does this in the background at start-up). Returns the pairs that failed; a failure here is reported again,
        with its reason, to whoever picks that pair."""
        failed = []
        for name in pair_names:
            try:
                with self._lock:
                    pair = self.pool.pair(name)
                    warm_up(pair, self._warm_up_inputs(pair))
            except Exception:  # the pair's own request will show the reason
                failed.append(name)
        return failed

    def _warm_up_inputs(self, pair: LoadedPair) -> dict:
        if "asr" in pair.spec.tasks:
            return asr_inputs(pair, np.zeros(SAMPLE_RATE, dtype=np.float32))   # a second of silence
        return text_inputs(pair, pair.spec.tasks[0], "Hello.", max_input_tokens=self.max_input_tokens)

    def run(self, task: str, pair_name: str, **kwargs) -> Comparison:
        """The whole comparison, without streaming (CLI-like API use)."""
        last = None
        for last in self.stream(task, pair_name, **kwargs):
            pass
        return last.comparison
