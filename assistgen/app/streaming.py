"""A comparison run in a worker thread, its events folded into snapshots that are streamed at a bounded rate."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..comparison.compare import Comparison
from ..models.loading import LoadedPair

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


def stream(work: Callable[[Callable[[str, object], None]], Comparison], update_interval_s: float
           ) -> Iterator[Snapshot]:
    """Run `work(emit)` in a worker thread and yield snapshots as its events arrive: steps are coalesced into one
    update per `update_interval_s` (rendering competes with the timed runs for the CPU), every other event is
    yielded at once. An exception in the worker is raised here, in the caller's thread."""
    events: queue.Queue = queue.Queue()

    def run() -> None:
        try:
            events.put(("done", work(lambda kind, payload: events.put((kind, payload)))))
        except BaseException as exc:  # reported to the caller; the server keeps serving
            events.put(("error", exc))

    state = Snapshot("loading", "waiting for the model worker")
    yield state
    worker = threading.Thread(target=run, daemon=True, name="assistgen-compare")
    worker.start()
    while True:
        kind, payload = events.get()
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
            worker.join()
            raise payload
        apply(state, kind, payload)
        yield state
        if kind == "done":
            worker.join()
            return
