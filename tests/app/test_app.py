"""The app, launched in-process on tiny random models and driven through gradio_client's /compare endpoint."""
import numpy as np
import pytest
import soundfile as sf
from gradio_client import Client, handle_file

from helpers import speech_wav

TEXT_TASKS = ["chat", "translation", "summarization"]


@pytest.fixture(scope="module")
def client(tiny_app):
    url, _ = tiny_app
    return Client(url, verbose=False)


def compare(client, task="chat", pair="tiny-text", text="hello there", audio=None, max_new_tokens=8,
            temperature=0, draft_source="assistant", **extra):
    return client.predict(task=task, pair=pair, text=text, audio=audio, max_new_tokens=max_new_tokens,
                          temperature=temperature, draft_source=draft_source, api_name="/compare", **extra)


def assert_figures(result):
    for run in ("baseline", "assisted"):
        for key in ("text", "latency_s", "new_tokens", "target_passes", "tokens_per_pass", "acceptance_rate"):
            assert key in result[run]
        assert result[run]["new_tokens"] >= 1
        assert result[run]["target_passes"] >= 1
    assert result["speedup"] > 0 and result["ran_first"] == "baseline"


@pytest.mark.parametrize("task", TEXT_TASKS)
def test_compare_endpoint_runs_every_text_task(client, task):
    result = compare(client, task=task, text="The quick brown fox jumps over the lazy dog.")
    assert_figures(result)
    assert result["task"] == task and result["pair"] == "tiny-text"
    assert result["identical"] is True
    assert result["assisted"]["acceptance_rate"] is not None


def test_compare_endpoint_transcribes_speech(client, tmp_path):
    wav = speech_wav(tmp_path / "speech.wav")
    result = compare(client, task="asr", pair="tiny-speech", text=None, audio=handle_file(str(wav)))
    assert_figures(result)
    assert result["identical"] is True
    # the whole path from the file: its decoding and features, once for both runs, added to each run's model time
    prep = result["prep"]
    assert set(prep) == {"audio_decode_s", "features_s"} and all(v > 0 for v in prep.values())
    for run in ("baseline", "assisted"):
        assert result["end_to_end_s"][run] == pytest.approx(result[run]["latency_s"] + sum(prep.values()), abs=2e-4)


def test_prompt_lookup_and_sampling_through_the_api(client):
    result = compare(client, text="def f(x): return x\ndef f(x): return x\ndef f(", draft_source="prompt_lookup")
    assert result["draft_source"] == "prompt_lookup" and result["identical"]
    sampled = compare(client, temperature=0.8)
    assert "sampling" in sampled["identical_note"] and sampled["settings"]["top_p"] == 1.0
    nucleus = compare(client, temperature=0.8, top_p=0.5)
    assert nucleus["settings"]["top_p"] == 0.5 and nucleus["settings"]["temperature"] == 0.8


ACCEPTANCE_FIELDS = ("mean_acceptance_length", "draft_acceptance_rate", "per_position", "zero_accept_share")


def test_the_api_json_carries_the_acceptance_figures(client):
    """Mean acceptance length, draft acceptance rate, acceptance per draft position and the share of passes that
    accepted nothing (`comparison.acceptance`), as `compare --json` gives them."""
    result = compare(client, max_new_tokens=12)
    acc = result["assisted"]["acceptance"]
    assert set(ACCEPTANCE_FIELDS) <= set(acc)
    assert acc["drafting_passes"] >= 1 and acc["mean_acceptance_length"] >= 1.0
    assert 0 <= acc["draft_acceptance_rate"] <= 1 and 0 <= acc["zero_accept_share"] <= 1
    assert acc["per_position"] and all(0 <= v <= 1 for v in acc["per_position"])
    assert result["baseline"]["acceptance"]["drafting_passes"] == 0   # no drafts: every ratio None
    assert result["baseline"]["acceptance"]["mean_acceptance_length"] is None


def expect_error(client, needle, **kwargs):
    with pytest.raises(Exception) as info:
        compare(client, **kwargs)
    assert needle in str(info.value), str(info.value)


@pytest.mark.parametrize("kwargs,needle", [
    ({"text": ""}, "the text is empty"),
    ({"text": "   \n\t "}, "the text is empty"),
    ({"text": "word " * 30000}, "limit"),
    ({"max_new_tokens": 0}, "max_new_tokens must be a whole number from 1 to"),
    ({"max_new_tokens": -3}, "max_new_tokens must be a whole number from 1 to"),
    ({"max_new_tokens": 10**6}, "max_new_tokens must be a whole number from 1 to"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number"),
    ({"temperature": 5}, "temperature must be 0 (greedy) or from 0.001 to 2"),
    ({"temperature": 1e-40}, "temperature must be 0 (greedy) or from 0.001 to 2"),
    ({"max_new_tokens": "1e999"}, "max_new_tokens must be a finite number"),
    ({"temperature": "nan"}, "temperature must be a number"),
    ({"max_new_tokens": "many"}, "max_new_tokens must be a number"),
    ({"pair": "no-such-pair"}, "unknown pair 'no-such-pair'"),
    ({"pair": "tiny-missing"}, "unavailable"),
    ({"task": "poetry"}, "unknown task 'poetry'"),
    ({"task": "asr", "pair": "tiny-text"}, "does not do speech recognition"),
    ({"draft_source": "oracle"}, "draft source must be one of"),
    ({"schedule": "fastest"}, "schedule must be one of heuristic, constant, adaptive"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens must be from 1 to 64"),
    ({"top_p": 0.5}, "top_p 0.5 applies to sampling only: set a temperature above 0"),
    ({"top_p": 1.5, "temperature": 0.8}, "top_p must be in (0, 1]"),
])
def test_bad_text_inputs_get_a_clear_error_and_the_server_keeps_serving(client, kwargs, needle):
    expect_error(client, needle, **kwargs)
    assert compare(client)["identical"] is True


def _write(path, samples, rate, subtype=None):
    sf.write(str(path), samples, rate, subtype=subtype)
    return handle_file(str(path))


def test_audio_errors_are_clear_and_the_server_keeps_serving(client, tmp_path):
    asr = {"task": "asr", "pair": "tiny-speech", "text": None}
    expect_error(client, "no audio", audio=None, **asr)
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio at all")
    expect_error(client, "not audio this app can decode", audio=handle_file(str(fake)), **asr)
    good = speech_wav(tmp_path / "good.wav")
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(good.read_bytes()[:40])
    expect_error(client, "truncated", audio=handle_file(str(truncated)), **asr)
    eleven_minutes = np.zeros(8000 * 660, np.int16)    # over the default 10 minutes; FLAC keeps it small
    eleven_minutes[:8000] = (3000 * np.sin(np.arange(8000) / 5)).astype(np.int16)
    expect_error(client, "the limit is 10 min", audio=_write(tmp_path / "long.flac", eleven_minutes, 8000), **asr)
    expect_error(client, "record at least", audio=_write(tmp_path / "short.wav", np.full(800, 0.1, np.float32),
                                                         16000), **asr)
    expect_error(client, "silent", audio=_write(tmp_path / "zeros.wav", np.zeros(16000, np.float32), 16000), **asr)
    assert compare(client, audio=handle_file(str(good)), **asr)["identical"] is True


def test_stereo_48k_float_and_8_bit_audio_are_converted(client, tmp_path):
    speech = speech_wav(tmp_path / "base.wav")
    samples, rate = sf.read(str(speech), dtype="float32")
    import soxr
    at48 = soxr.resample(samples, rate, 48000)
    stereo = _write(tmp_path / "stereo.wav", np.stack([at48, at48 * 0.5], axis=1), 48000, "FLOAT")
    eight_bit = _write(tmp_path / "u8.wav", samples, rate, "PCM_U8")
    for audio in (stereo, eight_bit):
        result = compare(client, task="asr", pair="tiny-speech", text=None, audio=audio)
        assert result["identical"] is True


def test_uploads_over_max_file_size_are_refused_by_the_server(client, tiny_app, tmp_path):
    import httpx
    url, _ = tiny_app
    big = tmp_path / "big.wav"
    sf.write(str(big), np.full(16000 * 80, 0.1, np.float32), 16000, "FLOAT")  # ~5 MB > the test's 2 MB cap
    with open(big, "rb") as f:  # straight to the server, past the client's own check
        response = httpx.post(url + "gradio_api/upload", files={"files": ("big.wav", f)})
    assert response.status_code == 413
    assert "maximum allowed size" in response.text
    assert compare(client)["identical"] is True


def test_schedule_and_window_through_the_api_default_to_the_pairs_own(client):
    plain = compare(client)
    assert plain["settings"]["schedule"] == "heuristic" and plain["settings"]["num_assistant_tokens"] == 5
    chosen = compare(client, schedule="adaptive", num_assistant_tokens=3)
    assert chosen["settings"]["schedule"] == "adaptive" and chosen["settings"]["num_assistant_tokens"] == 3
    assert chosen["identical"] is True and chosen["assisted"]["steps"][0]["window"] == 3


def test_each_pair_shows_its_description_and_defaults(tiny_app):
    _, service = tiny_app
    assert service.pair_defaults("tiny-text") == (24, "assistant", 5, "heuristic")
    info = service.pair_info("tiny-text")
    assert "window 5" in info and "schedule heuristic" in info


def test_a_recording_over_30_s_is_transcribed_window_by_window_through_the_api(client, tmp_path):
    one = speech_wav(tmp_path / "one.wav", "The quick brown fox jumps over the lazy dog near the river bank. " * 3)
    samples, rate = sf.read(str(one), dtype="float32")
    pause = np.zeros(rate // 2, np.float32)
    long = np.concatenate([samples, pause] * (1 + int(40 * rate / (len(samples) + len(pause)))))[: 42 * rate]
    result = compare(client, task="asr", pair="tiny-speech", text=None, audio=_write(tmp_path / "long.wav", long, rate))
    assert result["identical"] is True and len(result["windows"]) == 2
    assert result["windows"][0]["start_s"] == 0 and result["windows"][-1]["end_s"] == pytest.approx(42, abs=0.01)
    assert result["language"] == {"code": "en", "detected": True, "probability": pytest.approx(1.0)}


def test_a_spoken_language_the_target_does_not_know_is_a_clear_error(client, tmp_path):
    expect_error(client, "does not know the language 'xx'", task="asr", pair="tiny-speech", text=None,
                 audio=handle_file(str(speech_wav(tmp_path / "s.wav"))), language="xx")


def test_a_run_pressed_before_the_tab_brought_its_pairs_settings_runs_that_pairs_own(tiny_app):
    """The Settings are shared by the tabs and follow the picked tab's pair a round trip later; a Run pressed in
    between sends the other pair's settings, which the server replaces by this pair's own."""
    import app
    _, service = tiny_app
    make_handler, _ = app._handlers(service)

    def raw(settings_pair):
        *_, last = make_handler("chat")("tiny-text", "hello there", None, settings_pair, 3, 0, 1.0, "prompt_lookup",
                                        2, "adaptive")
        result = last[app.STREAM_KEYS.index("result")]
        settings = result["settings"]
        return (settings["max_new_tokens"], result["draft_source"], settings["num_assistant_tokens"],
                settings["schedule"])

    assert raw("tiny-text") == (3, "prompt_lookup", 2, "adaptive")   # the Settings on screen are this pair's
    assert raw("tiny-speech") == service.pair_defaults("tiny-text")    # still the speech pair's: this pair's own


def test_the_queue_polls_for_work_twenty_times_a_second_not_a_thousand(tiny_catalog_path, monkeypatch):
    """Gradio's queue loop wakes the server's event loop (and takes the GIL) each time it polls; the app's queue must
    poll at QUEUE_POLL_S, not Gradio's default millisecond, while a timed run goes on."""
    import asyncio

    import gradio.queueing

    import app
    from assistgen.app.service import Service
    from assistgen.models.catalog import load_catalog
    demo = app.configure_queue(app.build_demo(Service(load_catalog(tiny_catalog_path))))
    queue, polls, sleep, ours = demo._queue, [], asyncio.sleep, []

    async def counted_sleep(seconds, *args):
        if asyncio.get_running_loop() in ours:   # not another app's queue, in another thread of this process
            polls.append(seconds)
        await sleep(seconds, *args)
    monkeypatch.setattr(gradio.queueing.asyncio, "sleep", counted_sleep)

    async def idle_for_half_a_second():
        ours.append(asyncio.get_running_loop())
        task = asyncio.ensure_future(queue.start_processing())
        await sleep(0.5)
        ours.clear()
        queue.stopped = True
        await task
    asyncio.run(idle_for_half_a_second())
    assert polls and min(polls) >= app.QUEUE_POLL_S
    assert len(polls) <= 0.5 / app.QUEUE_POLL_S + 2   # Gradio's own default would poll about 500 times here


def test_preload_and_every_comparison_run_on_one_model_thread(tiny_catalog_path, monkeypatch):
    """A thread's first heavy passes pay for what the process sets up for that thread: the warm-up has to run on the
    thread the timed runs use, or the first click's baseline pays what the assisted run then does not."""
    import threading

    import assistgen.app.service as service_module
    from assistgen.comparison.compare import Settings
    from assistgen.models.catalog import load_catalog
    service = service_module.Service(load_catalog(tiny_catalog_path))
    threads = []
    real_warm_up, real_compare = service_module.warm_up, service_module.compare
    monkeypatch.setattr(service_module, "warm_up",
                        lambda *a, **k: (threads.append(threading.get_ident()), real_warm_up(*a, **k))[1])
    monkeypatch.setattr(service_module, "compare",
                        lambda *a, **k: (threads.append(threading.get_ident()), real_compare(*a, **k))[1])
    assert service.preload(["tiny-text"]) == []
    for text in ("hello there", "and again"):
        service.run("chat", "tiny-text", text=text, settings=Settings(max_new_tokens=4))
    assert len(threads) == 3 and len(set(threads)) == 1 and threads[0] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):   # the thread reports a job's failure to its caller, and serves on
        service.model_thread.call(lambda: 1 / 0)
    assert service.model_thread.call(lambda: threading.get_ident()) == threads[0]
    service.model_thread.submit(lambda: 1 / 0)   # a job that raises does not stop the thread
    assert service.model_thread.call(lambda: service.model_thread.call(lambda: "nested")) == "nested"   # no deadlock


def test_a_closed_stream_stops_its_work_at_the_next_step_and_a_queued_one_never_starts():
    """Gradio closes a run's stream when the page's Stop is pressed, or the page or client goes away: the work stops
    at its next step instead of running on, up to its time limit, while the next request waits behind it."""
    import threading

    from assistgen.app.streaming import ModelThread, Stopped, stream
    thread = ModelThread("test-model")
    steps, outcome, release = [], [], threading.Event()

    def work(emit):
        emit("loading", (0.5, "half"))
        release.wait()
        try:
            for i in range(1000):
                steps.append(i)
                emit("baseline", i)
        except Stopped:
            outcome.append("stopped")
            raise
        outcome.append("ran to the end")

    snapshots = stream(work, 0.0, thread, idle_s=0.01)
    assert next(snapshots).phase == "loading"          # before the work is queued
    assert next(snapshots).message == "half"           # the work runs, and waits
    snapshots.close()
    release.set()
    thread.call(lambda: None)                           # the work has ended
    assert outcome == ["stopped"] and len(steps) == 1   # it stopped at its first step after the close

    blocker = threading.Event()
    thread.submit(blocker.wait)                         # a request in progress, and one queued behind it ...
    queued = stream(lambda emit: outcome.append("queued work ran"), 0.0, thread, idle_s=0.01)
    waiting = []
    reader = threading.Thread(target=lambda: waiting.extend([next(queued).phase, next(queued).phase]), daemon=True)
    reader.start()
    reader.join(timeout=30)   # not a timing: without the stream's idle yields, the second next() waits forever
    assert waiting == ["loading", "loading"]            # waiting, and closable meanwhile
    queued.close()                                      # ... whose client leaves
    blocker.set()
    thread.call(lambda: None)
    assert outcome == ["stopped"]                       # the queued work never started


def test_every_control_has_a_hint_and_picking_a_pair_says_it_reset_the_settings(tiny_catalog_path):
    """Each input on the page carries an `info=` hint (the hidden API inputs excepted), and the line under a pair
    says so when picking it, or its tab, set the shared Settings to its own defaults."""
    import gradio as gr

    import app
    from assistgen.app.service import Service
    from assistgen.models.catalog import load_catalog
    demo = app.build_demo(Service(load_catalog(tiny_catalog_path)))
    def shown(block):
        while block is not None:
            if block.visible is False and isinstance(block, gr.Column):
                return False
            block = block.parent
        return True
    controls = [b for b in demo.blocks.values() if isinstance(b, (gr.Slider, gr.Radio, gr.Dropdown, gr.Textbox))
                and shown(b)]
    assert len(controls) >= 9
    assert [b.label for b in controls if not b.info] == []
    picked = [f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == "pair_changed"]
    assert picked and "Settings set to this pair's own defaults" in picked[0]("tiny-text")[-2]


def test_stop_on_the_explore_tab_stops_the_model_thread_at_its_next_step_and_keeps_the_finished_points(
        tiny_catalog_path, monkeypatch):
    """The page's Stop sets the sweep's event on the server: the comparison under way on the model thread stops at
    its next decoding step (not at the end of its point), is dropped, and the finished points stay on screen and in
    the JSON, with the status saying how far the sweep got."""
    import threading

    import assistgen.app.service as service_module
    from assistgen.app.explore import StopSwitches, explore, explore_outputs
    from assistgen.models.catalog import load_catalog
    service = service_module.Service(load_catalog(tiny_catalog_path))
    switches = StopSwitches()
    stop = switches.arm("session")
    real_compare = service_module.compare
    comparisons, after_stop, threads = [], [], set()

    def spying(*args, on_baseline_step, on_assisted_step, **kwargs):
        comparisons.append(0)

        def watched(inner):
            def step(s):
                threads.add(threading.get_ident())
                if stop.is_set():
                    after_stop.append(s)
                comparisons[-1] += 1
                inner(s)
                if len(comparisons) == 2 and comparisons[-1] == 2:
                    assert switches.press("session")   # Stop, pressed during the second point
            return step
        return real_compare(*args, on_baseline_step=watched(on_baseline_step),
                            on_assisted_step=watched(on_assisted_step), **kwargs)
    monkeypatch.setattr(service_module, "compare", spying)
    progresses = list(explore(service, "chat", "tiny-text", over="temperature", values="0, 1.0, 0.5", repeats=1,
                              max_new_tokens=12, text="hello there", stop=switches.current("session")))
    last = progresses[-1]
    assert len(after_stop) <= 1 and comparisons[1] == 3 and comparisons[0] > 3 and len(comparisons) == 2
    assert threads == {service.model_thread.call(threading.get_ident)}   # the steps ran, and stopped, there
    assert (last.stopped, last.done, last.total) == (True, 1, 3)
    out = explore_outputs("temperature", last, "tiny-text", {"pair": "tiny-text"})
    assert "Stopped by the user after 1 of 3 points" in out["progress"]
    assert [p["value"] for p in out["json"]["points"]] == [0.0] and out["json"]["points_done"] == 1
    (point,) = out["json"]["points"]
    assert all(point[key] is not None for key in ACCEPTANCE_FIELDS) and point["per_position"]
    assert set(ACCEPTANCE_FIELDS) <= set(point["each_run"][0]["assisted"]["acceptance"])
    assert out["table"].count("\n| 0.0 |") == 1 and "| 1.0 |" not in out["table"]
    assert service.model_thread.call(lambda: "free") == "free"   # the model thread serves the next request
    switches.release("session", stop)
    assert not switches.press("session")


def test_an_explore_stream_closed_mid_point_stops_the_model_thread_at_its_next_step(tiny_catalog_path, monkeypatch):
    """The page gone (Gradio closes the tab's stream at one of its idle yields): the sweep's stop is set, and the
    comparison under way stops at its next decoding step instead of running to the end of its point."""
    import threading

    import assistgen.app.service as service_module
    from assistgen.app.explore import explore
    from assistgen.app.streaming import keep_closable
    from assistgen.models.catalog import load_catalog
    service = service_module.Service(load_catalog(tiny_catalog_path))
    stop, waiting, closed = threading.Event(), threading.Event(), threading.Event()
    real_compare = service_module.compare
    comparisons, after_stop = [], []

    def spying(*args, on_baseline_step, on_assisted_step, **kwargs):
        comparisons.append(0)

        def watched(inner):
            def step(s):
                if stop.is_set():
                    after_stop.append(s)
                comparisons[-1] += 1
                inner(s)
                if len(comparisons) == 2 and comparisons[-1] == 2:
                    waiting.set()          # the second point is under way ...
                    assert closed.wait(timeout=60)   # ... until the page goes away (not a timing: never reached)
            return step
        return real_compare(*args, on_baseline_step=watched(on_baseline_step),
                            on_assisted_step=watched(on_assisted_step), **kwargs)
    monkeypatch.setattr(service_module, "compare", spying)
    steps = keep_closable(explore(service, "chat", "tiny-text", over="temperature", values="0, 1.0, 0.5", repeats=1,
                                  max_new_tokens=12, text="hello there", stop=stop), 0.01, stop.set)
    seen = []
    for step in steps:
        seen.append(step)
        if step is None and waiting.is_set():
            break                          # an idle yield while the second point runs: where Gradio closes it
    steps.close()
    assert stop.is_set()
    closed.set()
    service.model_thread.call(lambda: None)   # the model thread has finished with the sweep
    assert [s.done for s in seen if s is not None] == [1]
    assert len(comparisons) == 2 and comparisons[1] == 3 and len(after_stop) <= 1


def test_a_pair_that_becomes_unavailable_is_no_longer_anyones_default(tiny_catalog_path, monkeypatch):
    import assistgen.app.service as service_module
    from assistgen.models.catalog import load_catalog
    service = service_module.Service(load_catalog(tiny_catalog_path))
    assert service.default_pair(service.pair_choices("chat")) == "tiny-text"
    assert service.chosen_for("tiny-text") is not None
    real = service_module.pair_availability
    monkeypatch.setattr(service_module, "pair_availability",   # as after its load failed
                        lambda pair, catalog: ((False, "failed to load") if pair.name == "tiny-text"
                                               else real(pair, catalog)))
    choices = service.pair_choices("chat")
    assert ("tiny-text (unavailable: failed to load)", "tiny-text") in choices
    assert service.default_pair(choices) is None and service.chosen_for("tiny-text") is None


def test_an_audio_url_through_the_api_is_refused_before_anything_is_fetched(client, monkeypatch):
    # Gradio would download it whole, past the file-size limit that covers uploads
    from gradio import processing_utils
    fetched = []

    async def download(url, cache_dir):
        fetched.append(url)
        raise RuntimeError("fetched")
    monkeypatch.setattr(processing_utils, "async_ssrf_protected_download", download)
    expect_error(client, "this server does not fetch audio from URLs: send the file itself", task="asr",
                 pair="tiny-speech", text=None, audio=handle_file("https://example.com/speech.wav"))
    assert fetched == []
    assert compare(client)["identical"] is True
    # the copy of an audio input that Gradio makes for a session after an event updates it refuses them too
    import asyncio

    import gradio as gr
    with pytest.raises(gr.Error, match="does not fetch audio from URLs"):
        asyncio.run(gr.Audio(visible=False).async_move_resource_to_block_cache("https://example.com/speech.wav"))
    assert fetched == []


def test_building_the_page_writes_nothing_beside_the_sources(tiny_app):
    # a gr.Component subclass has Gradio write a .pyi stub beside its module, in the repository or a Space's folder
    from helpers import ROOT
    assert not list(ROOT.glob("*.pyi")) and not list((ROOT / "assistgen").rglob("*.pyi"))
