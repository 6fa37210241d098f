"""Robustness: bad input, faults, load and security, each driven through gradio_client or HTTP against an app
launched in-process on tiny random models (a few cases call the library directly, where the point is what it does
not do: decode a 2-hour file, unpickle weights)."""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import re
import shutil
import statistics
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import soundfile as sf
import torch
from gradio_client import Client, handle_file

import app
import assistgen.models.availability
import assistgen.models.loading
import assistgen.app.service
from assistgen.comparison.audio import load_audio
from assistgen.models.catalog import ModelSpec, load_catalog
from assistgen.models.loading import LoadError, load_model
from assistgen.models.pool import ModelPool
from assistgen.app.service import Service
from assistgen.comparison.tasks import InputError
from helpers import ROOT, RecordedRuns, encode_audio, free_port, runaway, speech_wav, wait_until

ASR = {"task": "asr", "pair": "tiny-speech", "text": None}


@contextlib.contextmanager
def launched(service: Service, **kwargs):
    """The real app on `service`, launched in-process; yields the Blocks (its local_url is the server)."""
    demo = app.build_demo(service)
    kwargs.setdefault("max_file_size", "2mb")
    app.queue_and_launch(demo, prevent_thread_lock=True, server_port=free_port(), quiet=True, **kwargs)
    try:
        yield demo
    finally:
        demo.close()


@pytest.fixture(scope="module")
def served(tiny_catalog_path):
    """(url, service, client): an app of this module's own, so tests may patch its service and pool."""
    service = Service(load_catalog(tiny_catalog_path))
    with launched(service) as demo:
        yield demo.local_url, service, Client(demo.local_url, verbose=False)


def compare(client, task="chat", pair="tiny-text", text="hello there", audio=None, max_new_tokens=8,
            temperature=0, draft_source="assistant"):
    return client.predict(task=task, pair=pair, text=text, audio=audio, max_new_tokens=max_new_tokens,
                          temperature=temperature, draft_source=draft_source, api_name="/compare")


def expect_error(client, needle, **kwargs) -> str:
    with pytest.raises(Exception) as info:
        compare(client, **kwargs)
    assert needle in str(info.value), str(info.value)
    return str(info.value)


def still_serves(client) -> None:
    assert compare(client)["identical"] is True


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("speech") / "speech.wav")


# --- 1. bad input ---------------------------------------------------------------------------------------------------

def test_a_200k_character_text_is_refused_without_a_memory_blow_up(served):
    import psutil
    _, _, client = served
    still_serves(client)  # models loaded: what follows measures the request alone
    process, peak, done = psutil.Process(), [0], threading.Event()
    baseline = process.memory_info().rss

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        message = expect_error(client, "200,000 characters", text=("lorem ipsum dolor sit amet " * 8000)[:200_000])
    finally:
        done.set()
        sampler.join()
    assert "limit" in message and "shorten it" in message
    growth_mb = (peak[0] - baseline) / 2**20
    print(f"\n200,000-character text: peak RSS growth {growth_mb:.0f} MB")
    assert growth_mb < 500
    still_serves(client)


def test_a_request_body_past_the_limit_is_refused_unread_and_the_server_keeps_serving(served):
    import httpx

    from assistgen.app.body_limit import body_limit_bytes
    from assistgen.choices import MAX_INPUT_TOKENS
    url, _, client = served
    limit = body_limit_bytes(MAX_INPUT_TOKENS)
    text = "x" * (limit + 1)
    body = {"data": ["chat", "tiny-text", text, None, 8, 0, "assistant", "", None, "", "", 1.0]}
    response = httpx.post(f"{url}gradio_api/call/compare", json=body, timeout=60)
    assert response.status_code == 413 and "shorten the text" in response.json()["error"]

    def chunks():   # sent without a Content-Length
        for _ in range(limit // 2**16 + 2):
            yield b"x" * 2**16
    response = httpx.post(f"{url}gradio_api/call/compare", content=chunks(), timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == 413
    still_serves(client)


def test_a_body_sent_without_its_length_is_refused_once_past_the_limit_and_handed_whole_within_it():
    import asyncio

    from assistgen.app.body_limit import BodyLimit
    seen, sent = [], []

    async def app(scope, receive, send):   # reads the body as an app does
        while (message := await receive())["type"] == "http.request":
            seen.append(len(message["body"]))
            if not message.get("more_body"):
                break

    async def send(message):
        sent.append(message)

    def run(path: str, sizes: list[int]) -> None:
        chunks = [{"type": "http.request", "body": b"x" * n, "more_body": i < len(sizes) - 1}
                  for i, n in enumerate(sizes)]

        async def receive():
            return chunks.pop(0)
        scope = {"type": "http", "path": path, "headers": [(b"transfer-encoding", b"chunked")]}
        seen.clear(), sent.clear()
        asyncio.run(BodyLimit(app, max_bytes=1000)(scope, receive, send))
    run("/gradio_api/queue/join", [400] * 5)
    assert seen == [] and sent[0]["status"] == 413 and b"shorten the text" in sent[1]["body"]
    run("/gradio_api/queue/join", [400, 400])
    assert seen == [800] and sent == []
    run("/gradio_api/run/upload", [400] * 5)   # a route named like the upload route is not it
    assert sent[0]["status"] == 413
    run("/gradio_api/upload", [400] * 4)   # Gradio's own file-size limit covers uploads
    assert seen == [400] * 4 and sent == []


def _mp3(path: Path, seconds: float = 2.0, rate: int = 16000) -> Path:
    t = np.arange(int(seconds * rate)) / rate
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="MP3",
             subtype="MPEG_LAYER_III")
    return path


def test_a_real_mp3_is_accepted_and_corrupt_or_truncated_ones_get_a_clear_error(served, tmp_path):
    _, _, client = served
    good = _mp3(tmp_path / "tone.mp3")
    assert compare(client, audio=handle_file(str(good)), **ASR)["baseline"]["new_tokens"] >= 1
    noise = tmp_path / "noise.mp3"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes())
    expect_error(client, "not audio this app can decode", audio=handle_file(str(noise)), **ASR)
    data = good.read_bytes()
    for fraction in (0.05, 0.5):
        cut = tmp_path / f"cut{int(fraction * 100)}.mp3"
        cut.write_bytes(data[:int(len(data) * fraction)])
        message = expect_error(client, cut.name, audio=handle_file(str(cut)), **ASR)
        assert "can decode" in message or "truncated" in message, message
    still_serves(client)


def test_a_phones_m4a_and_a_browsers_webm_are_transcribed_through_the_api(served, tmp_path, speech):
    _, _, client = served
    samples, rate = sf.read(str(speech), dtype="float32", always_2d=True)
    for name, codec, container in (("memo.m4a", "aac", "mp4"), ("recording.webm", "libopus", "webm")):
        result = compare(client, audio=handle_file(str(encode_audio(samples, rate, tmp_path / name, codec, container))),
                         **ASR)
        assert result["identical"] is True and result["baseline"]["new_tokens"] >= 1
    still_serves(client)


def test_a_truncated_mp3_is_refused_in_process(tmp_path):
    data = _mp3(tmp_path / "tone.mp3").read_bytes()
    cut = tmp_path / "half.mp3"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError, match="damaged or truncated"):
        load_audio(cut)


def _two_hour_flac(path: Path, rate: int = 8000) -> Path:
    """Two hours of 8 kHz audio, a tone then silence: about 200 kB of FLAC, written in about a second."""
    minute = np.zeros(rate * 60, np.int16)
    with sf.SoundFile(str(path), "w", rate, 1, "PCM_16", format="FLAC") as out:
        out.write((3000 * np.sin(np.arange(rate * 60) / 5)).astype(np.int16))
        for _ in range(119):
            out.write(minute)
    return path


def test_a_two_hour_recording_is_refused_from_its_metadata_without_decoding(tmp_path, monkeypatch):
    long = _two_hour_flac(tmp_path / "two-hours.flac")
    assert sf.info(str(long)).duration == pytest.approx(7200)

    def no_decode(*args, **kwargs):
        raise AssertionError("the audio was decoded")

    monkeypatch.setattr(sf, "read", no_decode)
    monkeypatch.setattr(sf.SoundFile, "read", no_decode)
    with pytest.raises(InputError) as info:
        load_audio(long, max_seconds=30)
    assert "120 min long" in str(info.value) and "the limit is 30 s" in str(info.value)


def test_a_two_hour_upload_gets_a_clear_error_and_the_server_keeps_serving(served, tmp_path, speech):
    _, _, client = served
    long = _two_hour_flac(tmp_path / "two-hours.flac")
    expect_error(client, "the limit is 10 min", audio=handle_file(str(long)), **ASR)
    assert compare(client, audio=handle_file(str(speech)), **ASR)["identical"] is True


# --- 2. faults ------------------------------------------------------------------------------------------------------

@pytest.fixture
def catalog_with_broken_packs(tiny_catalog_path, tmp_path, monkeypatch):
    """The tiny catalog plus a pair whose pack fails its sha256 check and one whose pack is not installed."""
    site = tmp_path / "site"
    (site / "assistgen_test_damaged_weights" / "data").mkdir(parents=True)
    (site / "assistgen_test_damaged_weights" / "data" / "part01.bin").write_bytes(b"GGUF not the pinned bytes")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(assistgen.models.availability, "_failures", {})  # load failures are remembered per process
    packs = "".join(f"""
  {name}:
    format: gguf
    files:
      - name: {name}.gguf
        sha256: {"ab" * 32}
        parts: [{{package: {package}, path: data/part01.bin}}]""" for name, package in
                    [("damaged", "assistgen-test-damaged-weights"), ("absent", "assistgen-test-absent-weights")])
    text = tiny_catalog_path.read_text().replace("models:\n", f"packs:{packs}\nmodels:\n  damaged: {{pack: damaged}}\n"
                                                 "  absent: {pack: absent}\n", 1)
    for name in ("damaged", "absent"):
        text += (f"  - name: tiny-{name}\n    tasks: [chat]\n    target: {name}\n    assistant: tiny-text-assistant\n"
                 "    prompt_style: chat_template\n")
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


def _dropdown_choices(url: str, elem_id: str) -> dict[str, str]:
    import httpx
    config = httpx.get(url + "config").json()
    (props,) = [c["props"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id]
    return {value: label for label, value in props["choices"]}


def test_pairs_with_missing_or_damaged_weights_are_unavailable_with_the_reason_and_others_work(
        catalog_with_broken_packs, speech):
    service = Service(load_catalog(catalog_with_broken_packs))
    with launched(service) as demo:
        client = Client(demo.local_url, verbose=False)
        labels = _dropdown_choices(demo.local_url, "pair-chat")
        assert labels["tiny-text"] == "tiny-text"
        assert "unavailable" in labels["tiny-missing"] and "does not exist" in labels["tiny-missing"]
        assert "unavailable" in labels["tiny-absent"] and "pip install" in labels["tiny-absent"]
        expect_error(client, "not installed", pair="tiny-absent")
        # The damaged pack is installed, so it is offered until its bytes are checked at load time.
        expect_error(client, "sha256 mismatch", pair="tiny-damaged")
        message = expect_error(client, "unavailable", pair="tiny-damaged")
        assert "sha256 mismatch" in message and "reinstall" in message
        still_serves(client)
        assert compare(client, audio=handle_file(str(speech)), **ASR)["identical"] is True
    labels = dict((value, label) for label, value in service.pair_choices("chat"))
    assert "unavailable" in labels["tiny-damaged"] and "sha256 mismatch" in labels["tiny-damaged"]
    assert labels["tiny-text"] == "tiny-text"


@pytest.mark.parametrize("fault,needle", [(RuntimeError("injected fault"), "RuntimeError: injected fault"),
                                          (MemoryError(), "ran out of memory")])
def test_an_exception_inside_generation_reaches_the_caller_and_the_next_request_succeeds(served, monkeypatch,
                                                                                         fault, needle):
    _, service, client = served
    model = service.pool.pair("tiny-text").target.model
    calls = []

    def broken_forward(*args, **kwargs):
        calls.append(1)
        raise fault

    monkeypatch.setattr(model, "forward", broken_forward)
    message = expect_error(client, needle)
    assert calls, "the fault was not injected inside generation"
    assert "upstream Gradio app has raised an exception" not in message
    monkeypatch.undo()
    still_serves(client)


def test_memory_error_while_loading_says_what_to_do_and_the_next_request_succeeds(tiny_catalog_path, monkeypatch):
    real_count = assistgen.models.loading._count

    def out_of_memory(model):  # called inside load_model, once the weights are in
        raise MemoryError()

    monkeypatch.setattr(assistgen.models.loading, "_count", out_of_memory)
    with launched(Service(load_catalog(tiny_catalog_path))) as demo:
        client = Client(demo.local_url, verbose=False)
        message = expect_error(client, "out of memory while loading")
        assert "ASSISTGEN_MEMORY_BUDGET_GB" in message
        monkeypatch.setattr(assistgen.models.loading, "_count", real_count)
        still_serves(client)  # not remembered as a broken pair: it loads once memory is there


def test_a_runaway_generation_stops_at_the_time_limit_with_its_partial_output_and_a_warning(served, monkeypatch):
    _, service, client = served
    pair = service.pool.pair("tiny-text")
    assert pair.target.eos_token_ids
    monkeypatch.setattr(pair.target.model, "forward", runaway(pair.target.model, pair.target.eos_token_ids, 0.01))
    monkeypatch.setattr(service, "limits", dataclasses.replace(service.limits, max_generation_s=0.4))
    result = compare(client, max_new_tokens=1024)
    for run in ("baseline", "assisted"):  # the time limit, not the token budget, ended both runs
        assert result[run]["stop_reason"] == "max_time"
        assert 1 <= result[run]["new_tokens"] < 1024
    assert any("time limit" in w and "partial" in w for w in result["warnings"]), result["warnings"]
    # Without a time limit, max_new_tokens bounds it exactly.
    monkeypatch.setattr(service, "limits", dataclasses.replace(service.limits, max_generation_s=300.0))
    result = compare(client, max_new_tokens=20)
    assert [result[r]["new_tokens"] for r in ("baseline", "assisted")] == [20, 20]
    assert result["baseline"]["stop_reason"] == "max_new_tokens"
    assert not any("time limit" in w for w in result["warnings"])
    monkeypatch.undo()
    still_serves(client)


def test_a_cancelled_compare_job_stops_its_run_and_the_worker_takes_the_next_job(served, monkeypatch):
    """A /compare client that cancels mid-run: its run stops at its next step (held after its third until then, it
    cannot end on its own first, however slow the machine), and the next job runs at once and completes."""
    _, service, client = served
    pair = service.pool.pair("tiny-text")
    monkeypatch.setattr(pair.target.model, "forward", runaway(pair.target.model, pair.target.eos_token_ids, 0.0))
    runs = RecordedRuns(service, monkeypatch, hold={"a long run": 3})
    long = client.submit(task="chat", pair="tiny-text", text="a long run", audio=None, max_new_tokens=1024,
                         temperature=0, draft_source="assistant", api_name="/compare")
    run = runs.run("a long run", steps=3)
    assert not long.done()
    long.cancel()
    runs.assert_stopped(run)
    result = client.submit(task="chat", pair="tiny-text", text="the next job", audio=None, max_new_tokens=4,
                           temperature=0, draft_source="assistant", api_name="/compare").result(timeout=60)
    assert result["identical"] is True and result["baseline"]["new_tokens"] == 4
    assert runs.run("the next job").steps >= 2   # a baseline and an assisted run of its own
    assert run.steps == run.steps_at_close   # nothing of the cancelled run ran behind it


def test_a_client_that_disconnects_without_cancelling_stops_its_run_and_the_next_job_starts_at_once(served,
                                                                                                   monkeypatch):
    """A raw HTTP client joins Gradio's queue for /compare, reads the job's events until its run is under way, then
    drops the connection without a word (no /cancel): the server notices, the run stops at its next step, and a
    short job submitted right after runs at once and completes."""
    import httpx
    url, service, client = served
    pair = service.pool.pair("tiny-text")
    monkeypatch.setattr(pair.target.model, "forward", runaway(pair.target.model, pair.target.eos_token_ids, 0.0))
    runs = RecordedRuns(service, monkeypatch, hold={"a dropped run": 3})
    with httpx.Client(base_url=url.rstrip("/"), timeout=30) as http:
        config = http.get("/config").raise_for_status().json()
        fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "compare")
        session = uuid.uuid4().hex
        # the endpoint's inputs in order: task, pair, text, audio, max_new_tokens, temperature, draft_source,
        # schedule, num_assistant_tokens, language, target_language, top_p
        data = ["chat", "tiny-text", "a dropped run", None, 1024, 0, "assistant", "", None, "", "", 1.0]
        joined = http.post("/gradio_api/queue/join", json={"data": data, "fn_index": fn_index,
                                                           "session_hash": session, "event_data": None,
                                                           "trigger_id": None})
        assert joined.status_code == 200, joined.text
        deadline = time.monotonic() + 60
        with http.stream("GET", "/gradio_api/queue/data", params={"session_hash": session}) as events:
            lines, messages = events.iter_lines(), []   # kept open (a loop left early would close the response)
            while not any('"process_starts"' in m for m in messages):   # the job's events, until it starts
                messages.append(next(lines))
                assert '"process_completed"' not in messages[-1], messages
                assert time.monotonic() < deadline, f"the job did not start within 60 s: {messages}"
            run = runs.run("a dropped run", steps=3)
            assert not run.closed.is_set()   # the connection still open, the run goes on
        # the response closed unread and the client closed: the connection is gone, nothing else was sent
    runs.assert_stopped(run)
    result = client.submit(task="chat", pair="tiny-text", text="the next job", audio=None, max_new_tokens=4,
                           temperature=0, draft_source="assistant", api_name="/compare").result(timeout=60)
    assert result["identical"] is True and result["baseline"]["new_tokens"] == 4
    assert run.steps == run.steps_at_close   # nothing of the dropped run ran behind it


# --- 3. load --------------------------------------------------------------------------------------------------------

def _pair_bytes(catalog, name: str) -> int:
    pair = ModelPool(catalog, budget_bytes=2**40).pair(name)
    return pair.target.num_bytes + pair.assistant.num_bytes


def test_twenty_concurrent_users_complete_or_get_queue_full_and_model_work_is_serialised(
        tiny_catalog_path, monkeypatch, tmp_path, speech):
    monkeypatch.delenv("ASSISTGEN_QUEUE_SIZE", raising=False)  # the default queue
    catalog = load_catalog(tiny_catalog_path)
    budget = max(_pair_bytes(catalog, "tiny-text"), _pair_bytes(catalog, "tiny-speech"))  # room for one pair only
    service = Service(catalog, ModelPool(catalog, budget_bytes=budget))
    intervals, resident, started_at, guard = [], [], {}, threading.Lock()
    real_compare, real_stream = assistgen.app.service.compare, service.stream

    def timed_compare(*args, **kwargs):
        start = time.monotonic()
        resident.append(service.pool.resident_bytes)
        try:
            return real_compare(*args, **kwargs)
        finally:
            resident.append(service.pool.resident_bytes)
            with guard:
                intervals.append((start, time.monotonic()))

    def timed_stream(task, pair_name, **kwargs):
        started_at[kwargs["text"] or Path(kwargs["audio"]).name] = time.monotonic()
        yield from real_stream(task, pair_name, **kwargs)

    monkeypatch.setattr(assistgen.app.service, "compare", timed_compare)
    monkeypatch.setattr(service, "stream", timed_stream)
    users = 20
    audio = {}
    for i in range(3, users, 4):  # every fourth user transcribes speech: the pool must swap pairs under load
        audio[i] = tmp_path / f"user{i:02d}.wav"
        shutil.copy(speech, audio[i])
    with launched(service) as demo:
        clients = [Client(demo.local_url, verbose=False) for _ in range(users)]
        barrier, outcomes = threading.Barrier(users), [None] * users

        def user(i: int):
            if i in audio:
                kwargs = {**ASR, "audio": handle_file(str(audio[i]))}
                key = audio[i].name
            else:
                kwargs = {"text": f"user {i} says hello"}
                key = kwargs["text"]
            barrier.wait()
            submitted = time.monotonic()
            try:
                result = compare(clients[i], max_new_tokens=8, **kwargs)
                outcomes[i] = ("completed", key, submitted, time.monotonic(), result)
            except Exception as exc:  # noqa: BLE001: every failure is classified below
                outcomes[i] = ("refused", key, submitted, time.monotonic(), exc)

        threads = [threading.Thread(target=user, args=(i,)) for i in range(users)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        wall = time.monotonic() - t0
        assert not any(t.is_alive() for t in threads)
        still_serves(clients[0])

    completed = [o for o in outcomes if o[0] == "completed"]
    refused = [o for o in outcomes if o[0] == "refused"]
    for _, key, _, _, exc in refused:
        assert "Queue is full" in str(exc), f"{key}: {type(exc).__name__}: {exc}"
    for _, key, _, _, result in completed:
        assert result["baseline"]["new_tokens"] >= 1 and result["identical"] is True, key
    assert len(completed) + len(refused) == users and completed
    intervals.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(intervals, intervals[1:])), \
        "two comparisons ran at the same time"
    assert max(resident) <= budget, f"resident {max(resident)} B over the {budget} B budget"

    waits = sorted(started_at[key] - submitted for _, key, submitted, _, _ in completed)
    totals = sorted(done - submitted for _, _, submitted, done, _ in completed)
    print(f"\nLOAD {users} concurrent gradio_client users, tiny models, max_new_tokens=8, default queue "
          f"(ASSISTGEN_QUEUE_SIZE={demo._queue.max_size}), memory budget {budget / 2**20:.2f} MiB (one pair):")
    print(f"LOAD completed {len(completed)}, refused with 'Queue is full' {len(refused)}, wall {wall:.1f} s")
    print(f"LOAD queue wait (submit -> handler start): median {statistics.median(waits):.2f} s, "
          f"max {max(waits):.2f} s; submit -> result: median {statistics.median(totals):.2f} s, "
          f"max {max(totals):.2f} s")
    print(f"LOAD model work: {len(intervals)} comparisons, none overlapping; peak resident "
          f"{max(resident) / 2**20:.2f} MiB <= budget")
    print("LOAD per-user waits (s): " + ", ".join(f"{w:.2f}" for w in waits))


def test_a_full_queue_refuses_with_a_clear_message_and_the_queued_requests_still_complete(
        tiny_catalog_path, monkeypatch):
    from gradio_client.utils import Status
    monkeypatch.setenv("ASSISTGEN_QUEUE_SIZE", "1")
    service = Service(load_catalog(tiny_catalog_path))
    entered, gate = threading.Event(), threading.Event()
    real_compare = assistgen.app.service.compare

    def held_compare(*args, **kwargs):
        entered.set()
        gate.wait(30)
        return real_compare(*args, **kwargs)

    monkeypatch.setattr(assistgen.app.service, "compare", held_compare)
    with launched(service) as demo:
        first, second, third = (Client(demo.local_url, verbose=False) for _ in range(3))
        running = first.submit(task="chat", pair="tiny-text", text="first", audio=None, max_new_tokens=4,
                               temperature=0, draft_source="assistant", api_name="/compare")
        assert entered.wait(30)
        waiting = second.submit(task="chat", pair="tiny-text", text="second", audio=None, max_new_tokens=4,
                                temperature=0, draft_source="assistant", api_name="/compare")
        wait_until(lambda: waiting.status().code == Status.IN_QUEUE, 30, "the second job to wait in the queue")
        with pytest.raises(Exception, match="Queue is full"):
            compare(third, max_new_tokens=4)
        gate.set()
        assert running.result(timeout=60)["identical"] and waiting.result(timeout=60)["identical"]
        still_serves(third)


# --- 4. security ----------------------------------------------------------------------------------------------------

def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET `path` exactly as written: no client-side normalisation of `..` or percent-escapes."""
    parsed = urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


SECRET_PATHS = ["/etc/passwd", "%2Fetc%2Fpasswd", "%252Fetc%252Fpasswd", "//etc/passwd", "/etc/./passwd",
                "../../../../../../etc/passwd", "..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd",
                "%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
                "%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
                "....//....//....//....//etc/passwd", "/tmp/../etc/passwd", "file:///etc/passwd", "/proc/self/environ"]


@pytest.mark.parametrize("secret", SECRET_PATHS)
@pytest.mark.parametrize("prefix", ["/gradio_api/file=", "/file=", "/gradio_api/file/"])
def test_files_outside_the_app_cannot_be_read(served, prefix, secret):
    url, _, _ = served
    status, body = _raw_get(url, prefix + secret)
    assert b"root:" not in body and b"PATH=" not in body
    assert status in (403, 404), (status, body[:200])


def test_the_apps_own_files_and_catalog_cannot_be_read(served):
    url, service, _ = served
    for path in [ROOT / "app.py", ROOT / "models.yaml", service.catalog.path,
                 Path(service.catalog.pairs[0].target.location) / "config.json"]:
        for form in (str(path), path.name):
            status, body = _raw_get(url, "/gradio_api/file=" + form)
            assert status in (403, 404), (form, status, body[:200])


def test_an_upload_is_served_only_under_an_unguessable_path_and_folders_are_not_listed(served, tmp_path):
    """Gradio serves an upload back to whoever holds its path (that is how the page plays it back), so the path
    must not be guessable: its folder is sha256(a secret per-install seed + the bytes), not the bytes' own hash."""
    import hashlib

    import httpx
    url, _, _ = served
    secret = tmp_path / "private-note.wav"
    sf.write(str(secret), np.full(1600, 0.1, np.float32), 16000)
    with open(secret, "rb") as f:
        response = httpx.post(url + "gradio_api/upload", files={"files": ("private-note.wav", f)})
    assert response.status_code == 200
    (uploaded,) = response.json()
    folder = Path(uploaded).parent
    assert re.fullmatch(r"[0-9a-f]{64}", folder.name), uploaded
    plain = hashlib.sha256(secret.read_bytes()).hexdigest()
    assert folder.name != plain
    for guess in (folder.parent / plain / secret.name, folder.parent / ("0" * 64) / secret.name,
                  folder.parent / secret.name, folder, folder.parent):
        for form in (str(guess), str(guess) + "/"):
            status, body = _raw_get(url, "/gradio_api/file=" + form)
            assert status in (403, 404) and b"RIFF" not in body, (form, status)
            if guess == folder.parent:  # no listing of what others uploaded
                assert folder.name.encode() not in body


def test_launch_allows_no_extra_paths(served):
    assert "allowed_paths" not in (ROOT / "app.py").read_text()
    _, service, _ = served
    with launched(service) as demo:
        assert not demo.allowed_paths


def test_gradio_is_at_least_6_16():
    import gradio
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", gradio.__version__).groups())
    assert (major, minor) >= (6, 16), gradio.__version__
    pins = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if re.match(r"gradio\s*[=<>~]", line)]
    pinned = [re.match(r"gradio\s*==\s*(\d+)\.(\d+)", line) for line in pins]
    assert pinned and all(m and (int(m[1]), int(m[2])) >= (6, 16) for m in pinned), pins


@pytest.mark.parametrize("env,expected", [(None, False), ("True", True)])
def test_analytics_are_off_unless_asked_for(monkeypatch, env, expected):
    import importlib

    import gradio as gr
    if env is None:
        monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    else:
        monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", env)
    importlib.reload(app)  # app.py sets the default when it is imported
    with gr.Blocks() as demo:
        pass
    assert demo.analytics_enabled is expected


def _sources() -> list[Path]:
    """Every Python module of the package, its subpackages' included, the app, and the bench scripts."""
    return sorted((ROOT / "assistgen").rglob("*.py")) + [ROOT / "app.py"] + sorted((ROOT / "bench").rglob("*.py"))


FORBIDDEN = re.compile(r"trust_remote_code\s*=\s*True|\bimport (c?pickle|dill|joblib)\b|\bfrom (c?pickle|dill|joblib) "
                       r"import\b|\b(c?pickle|dill|joblib)\.|allow_pickle\s*=\s*True|weights_only\s*=\s*False|"
                       r"use_safetensors\s*=\s*False")
TORCH_LOAD = re.compile(r"torch\.load\(")


def _violations(text: str) -> list[str]:
    """Lines that run remote code, unpickle, or call torch.load without weights_only=True."""
    return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if FORBIDDEN.search(line) or (TORCH_LOAD.search(line) and "weights_only=True" not in line)]


def test_no_remote_code_and_no_pickles_in_the_sources():
    sources = _sources()
    names = {p.relative_to(ROOT).as_posix() for p in sources}
    # the guard reads every layer, not just the top-level files
    assert {"assistgen/models/loading.py", "assistgen/engine/decoding.py", "assistgen/comparison/compare.py",
            "assistgen/app/service.py", "assistgen/tools/bench.py", "app.py"} <= names
    hits = [f"{path.relative_to(ROOT)}:{hit}" for path in sources for hit in _violations(path.read_text())]
    assert not hits, hits


@pytest.mark.parametrize("line,bad", [
    ("model = AutoModel.from_pretrained(path, trust_remote_code=True)", True),
    ("state = torch.load(path)", True),
    ("state = torch.load(path, weights_only=True)", False),
    ("import pickle", True), ("from pickle import loads", True), ("data = pickle.loads(blob)", True),
    ("np.load(path, allow_pickle=True)", True),
    ("model = AutoModel.from_pretrained(path, use_safetensors=True)", False),
])
def test_the_source_guard_catches_what_it_forbids(line, bad):
    assert bool(_violations(line)) is bad


def test_weights_in_a_pickle_are_refused_and_never_unpickled(tmp_path, tiny_catalog_path, monkeypatch):
    catalog = load_catalog(tiny_catalog_path)
    source = Path(catalog.models["tiny-text-assistant"].location)
    folder = tmp_path / "pickled"
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    state = {}
    from safetensors.torch import load_file
    for file in source.glob("*.safetensors"):
        state.update(load_file(str(file)))
    torch.save(state, folder / "pytorch_model.bin")

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle was loaded")

    monkeypatch.setattr(torch, "load", refuse)
    spec = ModelSpec(name="pickled", source="local", location=str(folder), dtype="float32")
    with pytest.raises(LoadError, match="never from pickled"):
        load_model(spec, catalog)
