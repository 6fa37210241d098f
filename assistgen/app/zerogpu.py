"""ZeroGPU (the shared GPUs of Hugging Face Spaces): a comparison's GPU time as one call of a `spaces.GPU` function.

On ZeroGPU a process has a GPU only inside a function decorated with `spaces.GPU`. Outside one, the `spaces` package
emulates CUDA (`torch.cuda.is_available()` is true and models are placed on "cuda", their weights kept in host memory
or on disk); a call runs the function in a worker process forked from this one, which moves those weights to the GPU
it was given, for at most the call's `duration` seconds. What the call takes and yields is pickled between the two.

Everywhere else (`spaces` not installed, or installed outside ZeroGPU: it reads `SPACES_ZERO_GPU`) the decorator
returns the function unchanged, and `on_gpu` is a plain call.
"""
from __future__ import annotations

import math
import queue
import threading
from typing import Callable, Iterator, TypeVar

from .streaming import Stopped

try:
    import spaces
except ImportError:   # the app runs without it, as it does off ZeroGPU
    spaces = None

R = TypeVar("R")
T = TypeVar("T")
Emit = Callable[[str, object], None]

DEFAULT_DURATION_S = 60   # ZeroGPU's own default, asked for where the pair has no estimate for this hardware
MAX_DURATION_S = 80       # the most a call asks for: with `spaces`' duration factor of 1.5 on ZeroGPU's current GPU,
                          # an unauthenticated visitor's whole daily quota (2 minutes), so one comparison can start
HEADROOM = 1.5            # the estimates time the two runs alone (the least of three repeats), not the warm-up, the
                          # speed probes or a fresh worker's copy of the weights to the GPU


def active() -> bool:
    """Whether this process runs on ZeroGPU, as `spaces` itself decides (`SPACES_ZERO_GPU`)."""
    if spaces is None:
        return False
    from spaces.config import Config
    return Config.zero_gpu


def duration_s(estimate_s: float | None) -> int:
    """The seconds a comparison asks ZeroGPU for: its estimate with `HEADROOM`, or ZeroGPU's default where there is
    none, never over `MAX_DURATION_S`. ZeroGPU may stop a call that runs past it; a shorter one is scheduled sooner
    and fits more visitors' remaining quota."""
    seconds = DEFAULT_DURATION_S if estimate_s is None else math.ceil(estimate_s * HEADROOM)
    return max(1, min(MAX_DURATION_S, seconds))


def emulate_cuda() -> None:
    """Enter ZeroGPU's CUDA emulation on the calling thread. `spaces` enters it on the thread that imports it; it is a
    torch mode, which holds per thread, so another thread that places models on "cuda" (the model thread) enters it
    too. Nothing off ZeroGPU."""
    if active():
        from spaces.zero import torch as zero_torch
        zero_torch.enter_mode()


def on_gpu(job: Callable[[R, Emit], T], duration: Callable[[R], float]) -> Callable[[R, Emit], T]:
    """`job(request, emit) -> result` as one call of a function decorated with `spaces.GPU(duration=...)`, where the
    duration is `duration(request)` seconds.

    Off ZeroGPU the decorated function is `job` itself, called on the caller's thread. On ZeroGPU it runs in ZeroGPU's
    worker process, on a thread of its own there; its events and its result (or exception) come back pickled, and each
    event is handed to the caller's `emit` as it arrives. When that `emit` raises (the run was stopped), the job stops
    at its next event. What `job` emits and returns must pickle: no models."""
    if not active():
        return _decorated(job, lambda request, *_: duration(request))
    remote = _decorated(_in_worker(job), duration)

    def call(request: R, emit: Emit) -> T:
        outcome = []
        events = remote(request)
        try:
            for kind, payload in events:
                if kind == _ERROR:
                    raise payload
                if kind == _RESULT:
                    outcome.append(payload)
                else:
                    emit(kind, payload)
        finally:
            events.close()   # closed early, ZeroGPU tells the worker to stop
        if not outcome:
            raise RuntimeError("the GPU worker ended without a result")
        return outcome[0]
    return call


def _decorated(fn: Callable, duration: Callable) -> Callable:
    """`fn` decorated with `spaces.GPU(duration=duration)`; `fn` itself where `spaces` cannot be imported."""
    if spaces is None:
        return fn
    return spaces.GPU(duration=duration)(fn)


_RESULT, _ERROR = "gpu-result", "gpu-error"   # the last event from the worker: the job's result, or what it raised


def _in_worker(job: Callable[[R, Emit], T]) -> Callable[[R], Iterator[tuple[str, object]]]:
    """`job` as a generator of its events, ending with its result or error, for ZeroGPU's worker process, which sends
    what a generator yields back to the caller as it comes. Closed early (ZeroGPU closes it when the caller stops
    reading), the job's next `emit` raises `Stopped`, and the worker waits for the job to end."""
    def relay(request: R) -> Iterator[tuple[str, object]]:
        events: queue.Queue = queue.Queue()
        closed = threading.Event()

        def emit(kind: str, payload: object) -> None:
            if closed.is_set():
                raise Stopped()
            events.put((kind, payload))

        def run() -> None:
            try:
                events.put((_RESULT, job(request, emit)))
            except BaseException as exc:  # sent to the caller, where it is raised
                events.put((_ERROR, exc))
        worker = threading.Thread(target=run, daemon=True, name="assistgen-gpu-job")
        worker.start()
        try:
            while True:
                kind, payload = events.get()
                yield kind, payload
                if kind in (_RESULT, _ERROR):
                    return
        finally:
            closed.set()
            worker.join()
    return relay
