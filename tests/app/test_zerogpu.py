"""ZeroGPU: each comparison, from the page or the API, is one call of a `spaces.GPU` function whose duration comes from
the pair's estimate, capped; off ZeroGPU that call is a plain one. The real `spaces` package decides whether it is on
ZeroGPU (`SPACES_ZERO_GPU`) and, there, emulates CUDA outside the decorated call (checked in a separate process)."""
import functools
import inspect
import math
import os
import pickle
import queue
import subprocess
import sys
import threading
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from gradio_client import Client

from helpers import ROOT, free_port

import app
from assistgen.app import zerogpu
from assistgen.app.service import Service
from assistgen.comparison.compare import Settings
from assistgen.comparison.request import build_request
from assistgen.comparison.tasks import SAMPLE_RATE
from assistgen.models.catalog import load_catalog
from assistgen.models.devices import hardware_key


class RecordingSpaces:
    """Stands in for the `spaces` package: its GPU decorator records each call of a decorated function, the duration
    asked for (a callable duration is called with the call's arguments, as `spaces` does), the thread and the Gradio
    request the call ran in, and then calls the function."""

    def __init__(self):
        self.calls = []

    def GPU(self, duration=None):
        def decorate(fn):
            @functools.wraps(fn)
            def decorated(*args, **kwargs):
                from gradio.context import LocalContext
                self.calls.append(SimpleNamespace(
                    fn=fn, args=args, duration=duration(*args, **kwargs) if callable(duration) else duration,
                    thread=threading.get_ident(), request=LocalContext.request.get(None)))
                return fn(*args, **kwargs)
            return decorated
        return decorate


class WorkerSpaces:
    """Stands in for `spaces` on ZeroGPU: a decorated generator runs elsewhere (ZeroGPU: a forked worker process;
    here a thread), with its arguments and each item it yields pickled on the way, as ZeroGPU's worker queues do.
    Closing the caller's generator stops the worker's at its next item."""

    def __init__(self):
        self.durations, self.stopped_early, self.ended = [], [], threading.Event()

    def GPU(self, duration=None):
        def decorate(fn):
            assert inspect.isgeneratorfunction(fn)   # on ZeroGPU what comes back streams

            def decorated(*args):
                self.durations.append(duration(*args))
                args = pickle.loads(pickle.dumps(args))
                items, stop = queue.Queue(), threading.Event()

                def worker():
                    events = fn(*args)
                    for item in events:
                        if stop.is_set():
                            events.close()
                            self.stopped_early.append(True)
                            break
                        items.put(pickle.dumps(item))
                    items.put(None)
                    self.ended.set()
                threading.Thread(target=worker, daemon=True).start()
                try:
                    while (item := items.get()) is not None:
                        yield pickle.loads(item)
                except GeneratorExit:
                    stop.set()
                    raise
            return decorated
        return decorate


@pytest.fixture(scope="module")
def recorded(tiny_catalog_path):
    """The app, launched in-process on the tiny models, with `spaces.GPU` recording its calls; yields (url, service,
    the recorder)."""
    spaces = RecordingSpaces()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zerogpu, "spaces", spaces)   # the service decorates its GPU function when it is built
        service = Service(load_catalog(tiny_catalog_path))
    demo = app.build_demo(service)
    app.queue_and_launch(demo, prevent_thread_lock=True, server_port=free_port(), quiet=True)
    yield demo.local_url, service, spaces
    demo.close()


def test_the_apis_comparison_is_one_gpu_call_made_in_the_visitors_request(recorded):
    url, service, spaces = recorded
    before = len(spaces.calls)
    result = Client(url, verbose=False).predict(task="chat", pair="tiny-text", text="hello there", audio=None,
                                                max_new_tokens=6, temperature=0, draft_source="assistant",
                                                api_name="/compare")
    assert result["identical"] and result["assisted"]["new_tokens"] >= 1
    (call,) = spaces.calls[before:]   # baseline and assisted together: one call
    assert call.fn == service._compare
    assert call.args[0].pair.name == "tiny-text" and call.args[0].text == "hello there"
    # ZeroGPU counts the call against the quota of the visitor it finds in Gradio's request context
    assert call.request is not None
    assert call.thread == service.model_thread.call(threading.get_ident)


def test_the_pages_comparison_is_one_gpu_call(recorded):
    _, service, spaces = recorded
    before = len(spaces.calls)
    make_handler, _ = app._handlers(service)
    *_, last = make_handler("chat")("tiny-text", "hello again", None, "tiny-text", 5, 0, 1.0, "assistant", 3,
                                    "heuristic")
    result = last[app.STREAM_KEYS.index("result")]
    assert result["identical"] and result["settings"]["max_new_tokens"] == 5
    (call,) = spaces.calls[before:]
    assert call.fn == service._compare and call.args[0].text == "hello again"


def test_the_duration_asked_for_is_the_pairs_estimate_with_headroom_capped(tiny_catalog_path, recorded, tmp_path):
    assert zerogpu.duration_s(None) == zerogpu.DEFAULT_DURATION_S == 60   # no estimate: ZeroGPU's own default
    assert zerogpu.duration_s(10) == 15 and zerogpu.duration_s(0.1) == 1
    assert zerogpu.duration_s(53.3) == 80 and zerogpu.duration_s(79.9) == zerogpu.MAX_DURATION_S == 80
    assert zerogpu.duration_s(1000) == 80
    # the tiny pairs have no estimate: a comparison asks for the default
    url, _, spaces = recorded
    before = len(spaces.calls)
    Client(url, verbose=False).predict(task="chat", pair="tiny-text", text="hi", audio=None, max_new_tokens=2,
                                       temperature=0, draft_source="assistant", api_name="/compare")
    assert [call.duration for call in spaces.calls[before:]] == [60]

    service = Service(load_catalog(tiny_catalog_path))
    here = hardware_key(service.device)
    text = service.catalog.pair("tiny-text")
    timed = replace(text, click_s=(("elsewhere", 1.0), (here, 20.0)))   # a click at its own max new tokens: 20 s

    def duration(spec, max_new_tokens, **inputs):
        task = "asr" if "audio" in inputs else "chat"
        return service.gpu_duration_s(build_request(spec, task, Settings(max_new_tokens=max_new_tokens), **inputs))
    assert duration(text, text.max_new_tokens, text="hi") == 60
    assert duration(timed, text.max_new_tokens, text="hi") == 30            # 20 s, and half again
    assert duration(timed, text.max_new_tokens // 2, text="hi") == math.ceil(10 * 1.5)
    assert duration(replace(timed, click_s=((here, 200.0),)), text.max_new_tokens, text="hi") == 80   # capped
    speech = service.catalog.pair("tiny-speech")
    wav = tmp_path / "65s.wav"
    sf.write(wav, np.random.default_rng(0).normal(0, 0.1, 65 * SAMPLE_RATE).astype(np.float32), SAMPLE_RATE)
    # speech: each 30 s window answers up to max new tokens; 65 s is 3 windows
    assert duration(replace(speech, click_s=((here, 8.0),)), speech.max_new_tokens, audio=str(wav)) == 36


def test_off_zerogpu_the_decorator_returns_the_function_itself_with_or_without_spaces(monkeypatch):
    import spaces   # installed (requirements.txt), and not on ZeroGPU here

    def job(request, emit):
        return request
    assert zerogpu.spaces is spaces and not zerogpu.active()
    assert zerogpu.on_gpu(job, lambda request: 1) is job
    monkeypatch.setattr(zerogpu, "spaces", None)   # not importable
    assert not zerogpu.active()
    assert zerogpu.on_gpu(job, lambda request: 1) is job
    zerogpu.emulate_cuda()   # nothing to do


@pytest.fixture
def worker_service(tiny_catalog_path, monkeypatch):
    """A service as on ZeroGPU, its GPU calls run by `WorkerSpaces`; yields (service, the stand-in)."""
    spaces = WorkerSpaces()
    monkeypatch.setattr(zerogpu, "spaces", spaces)
    monkeypatch.setattr(zerogpu, "active", lambda: True)
    monkeypatch.setattr(zerogpu, "emulate_cuda", lambda: None)   # the real one is checked in its own process
    yield Service(load_catalog(tiny_catalog_path)), spaces


def test_on_zerogpu_a_comparison_streams_back_from_the_worker_pickled_and_gets_its_pair_back(worker_service):
    service, spaces = worker_service
    seen = []   # a stream yields one snapshot, updated: what it held at each yield
    for snap in service.stream("chat", "tiny-text", text="hello there", settings=Settings(max_new_tokens=6)):
        seen.append((snap.phase, snap.pair, len(snap.baseline_tokens), len(snap.assisted_steps)))
    comparison = snap.comparison
    pair = service.pool.pair("tiny-text")
    assert spaces.durations == [60]
    assert comparison.pair is pair and comparison.identical and comparison.baseline.new_tokens
    assert comparison.to_dict()["pair"] == "tiny-text"
    # the runs stream as they go, with this process's pair (the panels decode with its tokenizer)
    streamed = [(phase, pair_seen) for phase, pair_seen, tokens, steps in seen if tokens or steps]
    assert streamed[0][0] in ("baseline", "probe", "assisted") and all(p is pair for _, p in streamed)
    assert [phase for phase, *_ in seen].index("baseline") < [phase for phase, *_ in seen].index("done")


def test_on_zerogpu_an_error_in_the_worker_comes_back_as_itself(worker_service, monkeypatch):
    import assistgen.app.service as service_module
    from assistgen.comparison.tasks import InputError
    service, _ = worker_service

    def refuse(*args, **kwargs):
        raise InputError("too long: shorten it")
    monkeypatch.setattr(service_module, "request_inputs", refuse)
    with pytest.raises(InputError, match="too long: shorten it"):
        service.run("chat", "tiny-text", text="hello", settings=Settings(max_new_tokens=4))


def test_on_zerogpu_a_stopped_comparison_stops_the_worker_at_its_next_event(worker_service, monkeypatch):
    import assistgen.app.service as service_module
    from assistgen.app.streaming import Stopped
    service, spaces = worker_service
    release, stopped = threading.Event(), []
    real_compare = service_module.compare

    def held(*args, on_baseline_step, **kwargs):   # the baseline waits after its first step
        def step(s):
            on_baseline_step(s)
            release.wait()
        try:
            return real_compare(*args, on_baseline_step=step, **kwargs)
        except Stopped:
            stopped.append("the job")
            raise
    monkeypatch.setattr(service_module, "compare", held)
    snapshots = service.stream("chat", "tiny-text", text="hello there", settings=Settings(max_new_tokens=60))
    for snap in snapshots:
        if snap.baseline_tokens:
            break
    snapshots.close()   # the page's Stop, or the client gone
    release.set()
    assert spaces.ended.wait(60)
    assert spaces.stopped_early == [True] and stopped == ["the job"]


ZEROGPU_SCRIPT = """
import sys, threading
import torch
if torch.version.cuda is None:   # a CPU build of torch: what spaces reads of a CUDA build at import
    torch.version.cuda = "12.8"
    torch._C._cuda_init = lambda: None
    torch.cuda._is_in_bad_fork = bool   # False, as a function spaces can send to a child process
from assistgen.app import zerogpu
from assistgen.app.service import Service
from assistgen.comparison.runtime import is_warm
from assistgen.models.catalog import load_catalog
from assistgen.models.devices import default_device

assert zerogpu.active()
service = Service(load_catalog(sys.argv[1]))
print("device", default_device(), service.device)
assert service.preload(["tiny-text"]) == []
pair = service.pool.pair("tiny-text")
print("weights", next(pair.target.model.parameters()).device, "warm", is_warm(pair.target))
failed = []
def elsewhere():
    try:
        torch.zeros(1).to("cuda")
    except Exception as exc:
        failed.append(type(exc).__name__)
thread = threading.Thread(target=elsewhere)
thread.start(); thread.join()
print("elsewhere", failed)
"""


def test_on_zerogpu_spaces_emulates_cuda_and_the_model_thread_places_the_models_there(tiny_catalog_path):
    """With the real `spaces` told it is on ZeroGPU, in a process of its own (it patches torch at import): the app's
    device is "cuda", the preload places the pair there on the model thread, and warms nothing up (each GPU worker
    is a new process). A thread that has not entered the emulation cannot."""
    env = {**os.environ, "SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": "http://127.0.0.1:9"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", ZEROGPU_SCRIPT, str(tiny_catalog_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert lines["device"] == "cuda cuda"
    assert lines["weights"] == "cuda:0 warm False"
    assert lines["elsewhere"] != "[]"
