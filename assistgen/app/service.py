"""What the app and the API do with a request: validate it, load the pair, run baseline then assisted, stream.

Gradio-free, so tests drive it directly; app.py only lays out components and turns a user error
(`validation.USER_ERRORS`) into gr.Error.
"""
from __future__ import annotations

import contextvars
import math
import threading
from dataclasses import replace
from typing import Callable, Iterator

import numpy as np
import torch

from ..config import from_env
from ..choices import DRAFT_SOURCES, TASKS, Limits, limits_from_env
from ..comparison.compare import Comparison, compare, warm_up
from ..comparison.request import Request, Settings, build_request, pair_for_task, request_inputs, request_settings
from ..comparison.speech import WINDOW_S, asr_inputs
from ..comparison.tasks import SAMPLE_RATE, InputError, text_inputs
from ..models.availability import pair_availability
from ..models.catalog import Catalog, ModelSpec, PairSpec
from ..models.cpu import native_bfloat16
from ..models.devices import default_device, dtype_name, hardware, hardware_key, torch_dtype
from ..models.limits import usable_cpus
from ..models.loading import LoadError, LoadedPair
from ..models.pool import ModelPool
from ..models.prepare import ready
from ..models.sizing import pair_fit, parameters
from . import zerogpu
from .streaming import ModelThread, Snapshot, stream
from .validation import UserError


UPDATE_INTERVAL_S = 1.0          # a running comparison's panels are updated at most this often
UPDATE_INTERVAL_NO_SPARE_S = 2.0   # ... when no core is spare for the updates


def update_interval_s() -> float:
    """How often a running comparison's panels are updated (`ASSISTGEN_UPDATE_INTERVAL_S` sets it).

    Each update costs CPU time outside the timed runs' own work: Gradio's processing of the update in the server, and,
    when the page is open on the same machine, the browser's. With a core to spare (more usable cores than torch's
    threads, or a GPU doing the work) that work takes nothing from the runs, and the panels update every second. With
    none, torch's threads wait for the one the update stole and the runs slow down, so the panels update every two
    seconds."""
    configured = from_env().update_interval_s
    if configured is not None:
        return configured
    spare = default_device().type != "cpu" or usable_cpus() > torch.get_num_threads()
    return UPDATE_INTERVAL_S if spare else UPDATE_INTERVAL_NO_SPARE_S


def numerics_here(spec: ModelSpec, device: torch.device) -> str:
    """How a model computes on `device`, in a few words, before it is loaded: its CPU recipe on a CPU."""
    here = spec.on(device)
    if here.quantization == "w8a8":
        return "exact int8 (w8a8)"
    if here.quantization == "dynamic_int8":
        return "int8"
    if here.quantization in ("int8", "4bit"):
        return f"bitsandbytes {here.quantization}"
    words = dtype_name(torch_dtype(here.dtype, device))
    if here.encoder_dtype and device.type == "cpu" and native_bfloat16():
        words += f", encoder {here.encoder_dtype}"
    return words


class PairMenu:
    """The pairs on offer on this hardware: each task's dropdown, its default pair, and the line under the menu."""

    def __init__(self, catalog: Catalog, pool: ModelPool, device: torch.device):
        self.catalog = catalog
        self.device = device   # the hardware the defaults are chosen for
        self.hardware, self.hardware_key = hardware(self.device), hardware_key(self.device)
        self.pool = pool
        self._ready: set[str] = set()             # pairs seen available and within the memory budget
        self._defaults: set[str] | None = None
        self._preloading: set[str] = set()        # pairs the start-up preload has yet to finish

    # --- the pairs on offer -----------------------------------------------------------------------------------------
    def pair_choices(self, task: str) -> list[tuple[str, str]]:
        """(label, pair name) for a task's dropdown: a pair that is unavailable, whose weights exceed the memory
        budget, or that is meant for other hardware says so in its label (the last with its size, and a click's
        estimated time here where the catalog has one)."""
        choices, ready = [], set()
        pairs = self.catalog.pairs_for(task)
        for pair in pairs:
            ok, why = pair_availability(pair, self.catalog)
            if not ok:
                choices.append((f"{pair.name} (unavailable: {why})", pair.name))
                continue
            fits, size = pair_fit(pair, self.pool.budget_bytes, self.device)
            if not fits:
                choices.append((f"{pair.name} ({size})", pair.name))
                continue
            ready.add(pair.name)
            meant = self.device.type in pair.default_on
            choices.append((pair.name if meant else f"{pair.name} ({self.cost_note(pair)})", pair.name))
        # as this check finds them (a pair whose load failed is no longer ready), in one assignment: requests outside
        # the queue read it from other threads
        now = (self._ready - {pair.name for pair in pairs}) | ready
        if now != self._ready:
            self._ready = now
            self._defaults = None   # each task's default is chosen again, for `chosen_for`
        return choices

    def cost_note(self, pair: PairSpec) -> str:
        """What a pair meant for other hardware costs here: its parameters, and a click's estimated seconds."""
        counts = [parameters(spec) for spec in (pair.target, pair.assistant) if spec is not None]
        size = "size unknown" if None in counts else f"{sum(counts) / 1e9:.2f}B parameters"
        where = "a GPU" if self.device.type == "cpu" else "a CPU"
        seconds = self.click_s(pair)
        return f"meant for {where}: {size}" + (f", about {seconds:.0f} s a click here" if seconds else "")

    def click_s(self, pair: PairSpec) -> float | None:
        """A click's estimated seconds on this hardware (the catalog's `click_s`, at the pair's own max new tokens),
        or None where the catalog has none."""
        return dict(pair.click_s).get(self.hardware_key)

    def default_pair(self, choices: list[tuple[str, str]]) -> str | None:
        """The first pair among a dropdown's choices that is available, fits the memory budget and is meant for this
        device; else the first that is available and fits."""
        return next((name for label, name in choices if label == name),
                    next((name for label, name in choices if name in self._ready), None))

    def default_pairs(self) -> list[str]:
        """Each task's default pair, each once."""
        names = [self.default_pair(self.pair_choices(task)) for task in TASKS]
        return list(dict.fromkeys(name for name in names if name))

    def chosen_for(self, pair_name: str) -> str | None:
        """Why a pair is its task's default ("chosen for: CPU, 2 cores, 16 GB"), or None where it is not one."""
        if self._defaults is None:
            self._defaults = set(self.default_pairs())
        return f"chosen for: {self.hardware}" if pair_name in self._defaults else None

    def _spec(self, pair_name: str) -> PairSpec:
        try:
            return self.catalog.pair(pair_name)
        except KeyError as exc:
            raise InputError(exc.args[0]) from None

    def pair_defaults(self, pair_name: str) -> tuple[int, str, int, str]:
        """The pair's max new tokens, draft source, initial window and schedule, from models.yaml."""
        spec = self._spec(pair_name)
        return spec.max_new_tokens, spec.draft_source, spec.num_assistant_tokens, spec.schedule

    def pair_info(self, pair_name: str) -> str:
        """One line under the pair dropdown: what the pair is, its defaults, and whether its weights are still to be
        prepared here (by the start-up preload, or else by its first run), read from the cache's markers at each call:
        when a pair is picked, at a page load, after a run."""
        spec = self._spec(pair_name)
        chosen = self.chosen_for(pair_name)
        unprepared = [m.name for m in (spec.target, spec.assistant)
                      if m is not None and not ready(m, self.catalog, self.device)]
        numerics = ", ".join(f"{role} {numerics_here(m, self.device)}"
                             for role, m in (("target", spec.target), ("assistant", spec.assistant)) if m is not None)
        return (f"{spec.description} · defaults: max new tokens {spec.max_new_tokens}, draft source "
                f"{DRAFT_SOURCES[spec.draft_source]}, initial window {spec.num_assistant_tokens}, "
                f"schedule {spec.schedule}"
                + f" · here: {numerics}"
                + (" (a Llama- or Qwen2-class model's first run on a GPU captures its passes as CUDA graphs, a few "
                   "seconds, once; later runs replay them)" if self.device.type == "cuda" else "")
                + (f" · {chosen}" if chosen else "")
                + ("" if not unprepared else
                   f" · **being prepared here** ({', '.join(unprepared)}): the start-up preload converts the weights "
                   "once, in a separate process; a run waits for it" if pair_name in self._preloading else
                   f" · **not prepared here yet** ({', '.join(unprepared)}): its first run converts or quantizes the "
                   "weights once, "
                   f"in a separate process, before timing anything (ahead of time: `python -m assistgen prepare "
                   f"--pair {pair_name}`)"))


class Service(PairMenu):
    """What the page and the API run: a request validated, its pair loaded, baseline then assisted, streamed."""

    def __init__(self, catalog: Catalog, pool: ModelPool | None = None, *, limits: Limits | None = None, device=None):
        super().__init__(catalog, pool or ModelPool(catalog), device or default_device())
        self.limits = limits or limits_from_env()
        self._model_thread: ModelThread | None = None   # started on first use (`model_thread`)
        self._thread_lock = threading.Lock()
        self.update_interval_s = update_interval_s()
        # a comparison's GPU part, one call each: on ZeroGPU the only time the process has a GPU
        self._compare_on_gpu = zerogpu.on_gpu(self._compare, self.gpu_duration_s)

    @property
    def model_thread(self) -> ModelThread:
        """The one thread all model work runs on: one request at a time, so timings never mix, on the thread the
        warm-up warmed for every request. Started on first use, so a service built only for its pair choices
        (`fetch --defaults`) starts none."""
        with self._thread_lock:
            if self._model_thread is None:
                thread = ModelThread()
                thread.call(zerogpu.emulate_cuda)   # on ZeroGPU the models are placed on "cuda" on this thread
                self._model_thread = thread
            return self._model_thread

    def estimate_s(self, request: Request) -> float | None:
        """A request's estimated seconds here: the pair's click estimate scaled by the request's max new tokens and,
        for speech, its 30 s windows (each answers up to max new tokens); None without an estimate."""
        click = self.click_s(request.pair)
        if click is None:
            return None
        windows = 1 if request.samples is None else max(1, math.ceil(len(request.samples) / SAMPLE_RATE / WINDOW_S))
        return click * request.settings.max_new_tokens / request.pair.max_new_tokens * windows

    def gpu_duration_s(self, request: Request) -> int:
        """The seconds a comparison asks ZeroGPU for (`zerogpu.duration_s`, from `estimate_s`)."""
        return zerogpu.duration_s(self.estimate_s(request))

    # --- running ----------------------------------------------------------------------------------------------------
    def settings(self, pair_name: str, **values) -> Settings:
        """A request's settings, validated (`request.request_settings`), with the server's time limit for each run;
        an unknown pair or a bad value is an InputError."""
        return request_settings(self._spec(pair_name), max_time_s=self.limits.max_generation_s, **values)

    def stream(self, task: str, pair_name: str, *, text: str | None = None, audio: str | None = None,
               target_language: str = "French", language: str | None = None,
               settings: Settings, on_step: Callable[[object], None] | None = None) -> Iterator[Snapshot]:
        """Validate (`request.build_request`), load (with progress), run baseline then assisted; yield snapshots as
        steps arrive. An InputError or UserError says what the user can change.

        Speech: `language` is a code the target knows, or None / "auto" to let the target detect it; a recording
        longer than 30 s runs window by window. `on_step(step)` is called on the model thread after each decoding
        step of either run; what it raises ends the comparison and is raised here (a sweep's stop).

        The page and the API both come here: the pair is loaded (on ZeroGPU, placed on its emulated CUDA), then the
        rest runs as one `zerogpu.on_gpu` call (`_compare`)."""
        request = build_request(pair_for_task(self.catalog, pair_name, task), task, settings, text=text, audio=audio,
                                target_language=target_language, language=language, limits=self.limits, served=True)

        def work(emit) -> Comparison:
            try:
                pair = self.pool.pair(pair_name, lambda fraction, message: emit("loading", (fraction, message)))

                def forward(kind: str, payload) -> None:   # the GPU part's events, with this process's pair
                    if kind in ("baseline", "assisted") and on_step is not None:
                        on_step(payload)
                    emit(kind, pair if kind == "pair" else payload)
                return replace(self._compare_on_gpu(request, forward), pair=pair)
            except LoadError as exc:
                raise UserError(f"could not load pair {pair_name!r}: {exc}") from None
            except MemoryError:
                raise UserError("the server ran out of memory; try a shorter input or fewer max_new_tokens") from None

        # the model thread runs the work in this request's context: ZeroGPU reads the visitor from it, whose quota
        # the GPU time is counted against
        context = contextvars.copy_context()
        yield from stream(lambda emit: context.run(work, emit), self.update_interval_s, self.model_thread)

    def _compare(self, request: Request, emit: Callable[[str, object], None]) -> Comparison:
        """A comparison's GPU part (`stream` calls it through `zerogpu.on_gpu`): the inputs (a recording's language
        detected), then baseline and assisted. On ZeroGPU it runs in another process and what it emits and returns
        is pickled back, so neither carries the models: "pair" is emitted with None and the comparison returned
        without its pair, and `stream` puts its own in."""
        pair = self.pool.pair(request.pair.name)   # loaded by `stream`; a ZeroGPU worker forked before that loads it
        model_inputs = request_inputs(request, pair, on_language=lambda spoken: emit("language", spoken))
        emit("pair", None)
        comparison = compare(pair, request.task, model_inputs.inputs, request.settings,
                             on_baseline_step=lambda step: emit("baseline", step),
                             on_assisted_step=lambda step: emit("assisted", step),
                             on_phase=lambda name: emit("phase", name),
                             on_window=lambda run, i, n, w: emit("window", (run, i, n, w.start_s, w.end_s)),
                             language=model_inputs.language, prep=model_inputs.prep)
        return replace(comparison, pair=None)

    def run(self, task: str, pair_name: str, **kwargs) -> Comparison:
        """The whole comparison, without streaming (CLI-like API use)."""
        last = None
        for last in self.stream(task, pair_name, **kwargs):
            pass
        return last.comparison

    # --- start-up ---------------------------------------------------------------------------------------------------
    def preload(self, pair_names: list[str]) -> list[str]:
        """Load and warm up these pairs now, one at a time on the model thread, so no click pays for it (the app
        does this in the background at start-up; on ZeroGPU it loads only, before the app launches). Returns the
        pairs that failed; a failure here is reported again, with its reason, to whoever picks that pair."""
        failed = []
        self._preloading.update(pair_names)
        for name in pair_names:
            try:
                self.model_thread.call(self._load_and_warm_up, name)
            except Exception:  # the pair's own request will show the reason
                failed.append(name)
            finally:
                self._preloading.discard(name)
        return failed

    def _load_and_warm_up(self, name: str) -> None:
        pair = self.pool.pair(name)
        if not zerogpu.active():   # on ZeroGPU each GPU worker is a new process, warmed up by its first comparison
            warm_up(pair, self._warm_up_inputs(pair))

    def _warm_up_inputs(self, pair: LoadedPair) -> dict:
        if "asr" in pair.spec.tasks:
            return asr_inputs(pair, np.zeros(SAMPLE_RATE, dtype=np.float32))   # a second of silence
        return text_inputs(pair, pair.spec.tasks[0], "Hello.", max_input_tokens=self.limits.max_input_tokens)
