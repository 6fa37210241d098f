"""A comparison run on the model thread, its events folded into snapshots that are streamed at a bounded rate."""
from __future__ import annotations

import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

from ..comparison.compare import Comparison
from ..models.loading import LoadedPair

T = TypeVar("T")

PHASE_MESSAGES = {"warm-up": "warming the models up (once per pair)",
                  "probe": "timing a fixed target pass, to check that the machine's speed holds",
                  "baseline": "baseline running (it runs first)",
                  "assisted": "assisted generation running (baseline finished)"}


@dataclass
class Snapshot:
    """One snapshot of a running comparison, for streaming."""
    phase: str                                  # "loading", "warm-up", "probe", "baseline", "assisted", "done"
    message: str = ""
    fraction: float = 0.0                       # of the loading
    pair: LoadedPair | None = None
    baseline_tokens: list[int] = field(default_factory=list)
    assisted_steps: list = field(default_factory=list)
    comparison: Comparison | None = None
    language: dict | None = None                # speech: the language transcribed, and whether it was detected


def apply(state: Snapshot, kind: str, payload) -> None:
    """Fold one event into the snapshot."""
    if kind == "loading":
        state.phase, (state.fraction, state.message) = "loading", payload
    elif kind == "pair":
        state.pair, state.phase, state.message = payload, "warm-up", PHASE_MESSAGES["warm-up"]
    elif kind == "phase":
        state.phase, state.message = payload, PHASE_MESSAGES[payload]
    elif kind == "baseline":
        state.baseline_tokens.extend(payload.emitted)
    elif kind == "assisted":
        state.assisted_steps.append(payload)
    elif kind == "window":
        run, index, total, start, end = payload
        if total > 1:
            state.message = (f"{run} running: window {index + 1} of {total} ({start:.0f}–{end:.0f} s)"
                             + (" (baseline finished)" if run == "assisted" else ""))
    elif kind == "language":
        state.language = payload
        state.message = (f"language: {payload['code']}"
                         + (f" (detected, p = {payload['probability']:.2f})" if payload["detected"] else ""))
    elif kind == "done":
        state.phase, state.message, state.comparison = "done", "done", payload


class ModelThread:
    """The one thread that runs a service's model work (loading, warm-up, comparisons) for the life of the process.

    A thread's first heavy passes pay for what the process set up for that thread alone (memory, the OpenMP team
    serving it), and the warm-up only helps the timed runs that come after it in the same thread. With a thread per
    request and the warm-up in a start-up thread, the first comparison after the app started paid for that set-up in
    its baseline and showed a speedup far above later clicks of the same input; on one thread it does not."""

    def __init__(self, name: str = "assistgen-model"):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except BaseException:  # a job reports its own failures; one that could not must not stop the service
                traceback.print_exc()

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` after the jobs before it. A job reports its own failures; one that raises is printed, and the
        thread serves on."""
        self._jobs.put(job)

    def call(self, fn: Callable[..., T], *args) -> T:
        """Run `fn(*args)` on this thread and wait for it: its result, or its exception raised here. Called from the
        model thread itself (a job that calls again), it runs at once: queued behind the caller, it would wait forever."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        outcome: queue.Queue = queue.Queue(maxsize=1)

        def job() -> None:
            try:
                outcome.put((True, fn(*args)))
            except BaseException as exc:  # raised again in the caller's thread
                outcome.put((False, exc))
        self.submit(job)
        ok, value = outcome.get()
        if not ok:
            raise value
        return value


class Stopped(Exception):
    """Raised inside a comparison's work at its next step, phase or window once nobody streams it any more: the
    page's Stop button, a page closed or reloaded, a client gone. The model thread is then free for the next
    request instead of finishing a run that no one will see (up to its time limit: minutes for a long recording)."""


# Events at which a stopped comparison stops: never inside a load ("loading" reports its progress), which is left
# to finish, whole, for whoever asks for that pair next
STOP_POINTS = frozenset({"pair", "language", "phase", "window", "baseline", "assisted"})

# With no event for this long (queued behind another request, a model loading, an encoder pass), the snapshot is
# yielded again, unchanged: a stream can only be closed while it waits at a yield (Gradio retries until then)
IDLE_S = 1.0


def stream(work: Callable[[Callable[[str, object], None]], Comparison], update_interval_s: float,
           model_thread: ModelThread, idle_s: float = IDLE_S) -> Iterator[Snapshot]:
    """Run `work(emit)` on `model_thread` and yield snapshots as its events arrive: steps are coalesced into one
    update per `update_interval_s` (rendering competes with the timed runs for the CPU), every other event is
    yielded at once, and the snapshot again, unchanged, after `idle_s` (at least `update_interval_s`) without any.
    An exception in the work is raised here, in the caller's thread.

    Closing this generator before the work is done (Gradio closes it when the page's Stop is pressed or the page
    goes away) stops the work: its next `emit` at one of the `STOP_POINTS` raises `Stopped`, and a work still
    queued behind another never starts."""
    events: queue.Queue = queue.Queue()
    finished = threading.Event()
    stopped = threading.Event()
    idle_s = max(idle_s, update_interval_s)

    def emit(kind: str, payload) -> None:
        if stopped.is_set() and kind in STOP_POINTS:
            raise Stopped()
        events.put((kind, payload))

    def run() -> None:
        try:
            if not stopped.is_set():
                events.put(("done", work(emit)))
        except BaseException as exc:  # reported to the caller; the server keeps serving
            events.put(("error", exc))
        finally:
            finished.set()

    try:
        state = Snapshot("loading", "waiting for the model worker")
        yield state
        model_thread.submit(run)
        while True:
            try:
                kind, payload = events.get(timeout=idle_s)
            except queue.Empty:
                yield state
                continue
            deadline = time.monotonic() + update_interval_s
            while kind in ("baseline", "assisted"):
                apply(state, kind, payload)
                try:
                    kind, payload = events.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    kind = None
                    break
            if kind is None:
                yield state
                continue
            if kind == "error":
                finished.wait()
                raise payload
            apply(state, kind, payload)
            yield state
            if kind == "done":
                finished.wait()
                return
    finally:
        if not finished.is_set():   # closed early: nobody will read what the work does next
            stopped.set()


def keep_closable(items: Iterator[T], idle_s: float, on_close: Callable[[], None]) -> Iterator[T | None]:
    """Iterate `items` on a helper thread and yield each as it comes, and None after `idle_s` without one: a
    stream can only be closed while it waits at a yield, and an item may take minutes (a sweep's comparison).
    Closed before `items` ended (the page or client gone), it calls `on_close()` (a sweep's stop, which ends the
    work at its next step) and leaves the helper thread to wind down. An exception from `items` is raised here."""
    out: queue.Queue = queue.Queue()
    end = object()

    def pump() -> None:
        try:
            for item in items:
                out.put((True, item))
            out.put((True, end))
        except BaseException as exc:  # raised again in the caller's thread
            out.put((False, exc))
    threading.Thread(target=pump, daemon=True, name="assistgen-keep-closable").start()
    ended = False
    try:
        while True:
            try:
                ok, item = out.get(timeout=idle_s)
            except queue.Empty:
                yield None
                continue
            if not ok:
                ended = True
                raise item
            if item is end:
                ended = True
                return
            yield item
    finally:
        if not ended:
            on_close()
