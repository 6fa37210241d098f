"""Speech inputs: long recordings cut at pauses into windows that both runs go through, the spoken language, and an
English-only assistant that stops drafting on other speech."""
import dataclasses
import json

import numpy as np
import pytest
import torch

import helpers as tm
from assistgen.comparison.compare import Settings, compare
from assistgen.comparison.probe import judge
from assistgen.comparison.runtime import runtime
from assistgen.comparison.speech import SpeechWindow, cut_points
from assistgen.models.loading import check_pair


def noise_with_pauses(seconds: float, pauses: list[float], rate: int = 16000) -> np.ndarray:
    """Loud noise everywhere but 300 ms of near-silence centred on each of `pauses` (seconds)."""
    samples = np.random.default_rng(0).normal(0, 0.3, int(seconds * rate)).astype(np.float32)
    for at in pauses:
        samples[int((at - 0.15) * rate):int((at + 0.15) * rate)] *= 0.001
    return samples


def test_a_long_recording_is_cut_at_its_pauses_into_windows_of_at_most_30_s():
    samples = noise_with_pauses(70, pauses=[12.0, 27.0, 52.5])
    spans = cut_points(samples)
    cuts = [end / 16000 for _, end in spans[:-1]]
    assert len(cuts) == 2   # in the pause inside each window's last 5 s: 12.0 is too early to be one
    assert abs(cuts[0] - 27.0) <= 0.15 and abs(cuts[1] - 52.5) <= 0.15
    assert spans[0][0] == 0 and spans[-1][1] == len(samples)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))                # nothing lost, nothing read twice
    assert all(end - start <= 30 * 16000 for start, end in spans)


def test_a_clip_of_30_s_or_less_is_one_window():
    assert cut_points(np.zeros(30 * 16000, np.float32)) == [(0, 30 * 16000)]


def _loaded(name, model, tokenizer):
    from assistgen.models.catalog import ModelSpec
    from assistgen.models.loading import LoadedModel
    return LoadedModel(ModelSpec(name, "local", "-"), model, tokenizer, None, 1, 1, 0.0)


@pytest.fixture
def speech_pair(tiny_catalog_path):
    """A multilingual target (en, de) and an English-only assistant, with the same toy tokenizer."""
    from assistgen.models.catalog import load_catalog
    tokenizer = tm.whisper_tokenizer()
    target = tm.whisper(0)
    target.resize_token_embeddings(len(tokenizer))
    target.generation_config.lang_to_id = {"<|en|>": tokenizer.convert_tokens_to_ids("<|en|>"),
                                           "<|de|>": tokenizer.convert_tokens_to_ids("<|de|>")}
    target.generation_config.is_multilingual = True
    assistant = tm.whisper(0)   # the target itself: it would agree on every token
    assistant.resize_token_embeddings(len(tokenizer))
    assistant.generation_config.is_multilingual = False
    assistant.generation_config.lang_to_id = None
    spec = load_catalog(tiny_catalog_path).pair("tiny-speech")
    return check_pair(spec, _loaded("target", target, tokenizer), _loaded("english-only", assistant, tokenizer)), \
        tokenizer


def _window(tokenizer, language: str) -> dict:
    return {**tm.whisper_inputs(0), "decoder_input_ids": torch.tensor([tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", f"<|{language}|>", "<|transcribe|>", "<|notimestamps|>"])])}


def test_an_english_only_assistant_drafts_on_english_and_stops_on_other_speech_saying_why(speech_pair):
    pair, tokenizer = speech_pair
    english = compare(pair, "asr", _window(tokenizer, "en"), Settings(max_new_tokens=12))
    assert english.draft_source == "assistant" and english.assisted.assistant_passes > 0
    german = compare(pair, "asr", _window(tokenizer, "de"), Settings(max_new_tokens=12))
    assert german.identical and german.draft_source == "none"
    assert german.assisted.assistant_passes == 0 and german.assisted.target_passes == german.baseline.target_passes
    assert any("drafting is off" in w and "'de'" in w and "english-only" in w for w in german.warnings())


def test_both_runs_go_through_every_window_and_the_json_has_each(speech_pair):
    pair, tokenizer = speech_pair
    windows = [SpeechWindow(0.0, 28.5, _window(tokenizer, "en")), SpeechWindow(28.5, 40.0, _window(tokenizer, "en"))]
    seen = []
    result = compare(pair, "asr", windows, Settings(max_new_tokens=8),
                     on_window=lambda run, i, n, w: seen.append((run, i, n)))
    assert seen == [("baseline", 0, 2), ("baseline", 1, 2), ("assisted", 0, 2), ("assisted", 1, 2)]
    data = result.to_dict()
    assert [(w["start_s"], w["end_s"]) for w in data["windows"]] == [(0.0, 28.5), (28.5, 40.0)]
    for run in ("baseline", "assisted"):
        assert sum(w[run]["new_tokens"] for w in data["windows"]) == data[run]["new_tokens"]
        assert sum(w[run]["target_passes"] for w in data["windows"]) == data[run]["target_passes"]
    # each window's first step reads its prompt: the per-pass figures leave both out
    assert data["baseline"]["time"]["passes_after_prompt"] == data["baseline"]["target_passes"] - 2
    assert result.identical


def test_the_adaptive_schedule_starts_each_run_from_the_costs_the_last_one_measured(speech_pair):
    """A recording's first window drafts blind for its first steps (the heuristic's 5, then 7); its next window, and
    the next run, start from the costs and calibration measured so far, so their first step already drafts by
    them: up to the schedule's cap of 32 while the drafts pay (how far they go depends on this machine's timings,
    so only the window is checked). Both runs stay identical to their baselines."""
    pair, tokenizer = speech_pair
    windows = [SpeechWindow(0.0, 28.5, _window(tokenizer, "en")), SpeechWindow(28.5, 40.0, _window(tokenizer, "en"))]
    heuristic = compare(pair, "asr", windows, Settings(max_new_tokens=24))
    assert runtime(pair).schedules == {} and heuristic.identical   # the other schedules keep no costs
    first = compare(pair, "asr", windows, Settings(max_new_tokens=24, schedule="adaptive"))
    starts = [first.assisted.steps[i] for i in first.assisted.prompt_steps]
    assert [step.window for step in starts] == [5, 32]
    greedy = ("assistant", 0.0, None)
    measured = runtime(pair).schedules[greedy]
    assert measured.costs.known
    second = compare(pair, "asr", windows[:1], Settings(max_new_tokens=24, schedule="adaptive"))
    assert second.assisted.steps[0].window == 32 and runtime(pair).schedules[greedy] is not measured
    assert first.identical and second.identical
    sampled = compare(pair, "asr", windows[:1], Settings(max_new_tokens=24, schedule="adaptive", temperature=0.8,
                                                          seed=0))
    assert sampled.assisted.steps[0].window == 5   # sampled drafts learn their own calibration: blind at first


def test_a_new_process_starts_from_what_the_last_one_measured_with_models_of_the_cache(speech_pair, tmp_path,
                                                                                      monkeypatch):
    """`comparison.schedule_store` keeps the adaptive schedule's measurements beside the cache's models: a pair loaded
    afresh (a new process) drafts by them from its first step. Not for models outside the cache, not under other
    facts (another assistant, other threads), not when turned off, and a damaged file is ignored."""
    from assistgen.comparison import compare as comparing, schedule_store
    pair, tokenizer = speech_pair
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))
    steady = lambda *args: dataclasses.replace(judge(*args), warnings=[])   # noqa: E731  (tiny models' timings jitter)
    monkeypatch.setattr(comparing, "judge", steady)
    window = [SpeechWindow(0.0, 20.0, _window(tokenizer, "en"))]
    adaptive = Settings(max_new_tokens=24, schedule="adaptive")

    def first_window() -> int:   # the same models loaded again (nothing measured in memory): the first step's window
        run = compare(check_pair(pair.spec, pair.target, pair.assistant), "asr", window, adaptive)
        assert run.identical
        return run.assisted.steps[0].window
    assert schedule_store.store_path(pair) is None           # in-memory models: nothing kept
    assert first_window() == 5 and not (tmp_path / "schedules").exists() and first_window() == 5

    for name, loaded in (("target", pair.target), ("assistant", pair.assistant)):
        monkeypatch.setattr(loaded.model.config, "_name_or_path", str(tmp_path / "models" / name))
    assert first_window() == 5 and schedule_store.store_path(pair).is_file()
    assert first_window() == 32
    sampled = compare(check_pair(pair.spec, pair.target, pair.assistant), "asr", window,
                      Settings(max_new_tokens=24, schedule="adaptive", temperature=0.8))
    assert sampled.assisted.steps[0].window == 5       # its own calibration: not lent by greedy runs
    assert first_window() == 32                        # and the greedy one is still kept beside it

    monkeypatch.setenv("ASSISTGEN_SCHEDULE_STORE", "0")
    assert schedule_store.store_path(pair) is None and first_window() == 5
    monkeypatch.delenv("ASSISTGEN_SCHEDULE_STORE")
    with monkeypatch.context() as other:
        other.setattr(torch, "get_num_threads", lambda: 7)   # measured with other threads: not these costs
        assert first_window() == 5
    monkeypatch.setattr(pair.assistant.model.config, "_name_or_path", str(tmp_path / "models" / "another"))
    assert first_window() == 5 and first_window() == 32
    path = schedule_store.store_path(pair)
    kept = json.loads(path.read_text())
    for state in kept["schedules"].values():
        bins = len(state["calibration"]["seen"])   # under the right facts, but no draft seen in any bin
        state["calibration"] = {"hits": [0] * bins, "seen": [0] * bins}
    for damaged in ("{not json", '{"facts": 1, "schedules": []}', "[" * 100000, json.dumps(kept)):
        path.write_text(damaged)
        assert first_window() == 5 and first_window() == 32   # ignored, then written afresh
    cast = {pair.target.model: torch.bfloat16}   # the target's encoder cast to bfloat16 (models.precision)
    monkeypatch.setattr(schedule_store, "encoder_dtype", lambda model: cast.get(model))
    assert first_window() == 5 and first_window() == 32   # measured with the float32 encoder: not these facts

    # a key per temperature: a client sending many keeps at most MAX_SCHEDULES of them, the least recent dropped
    from assistgen.comparison.runtime import MAX_SCHEDULES
    from assistgen.engine.schedules import AdaptiveSchedule
    monkeypatch.setattr(schedule_store, "encoder_dtype", lambda model: None)
    schedule = AdaptiveSchedule.from_dict(next(iter(json.loads(path.read_text())["schedules"].values())))
    temperatures = [round(0.01 * (i + 1), 2) for i in range(MAX_SCHEDULES + 5)]
    for t in temperatures:
        assert schedule_store.save(pair, ("assistant", t, 1.0), schedule)
    kept = json.loads(path.read_text())["schedules"]
    assert len(kept) == MAX_SCHEDULES
    assert json.dumps(["assistant", temperatures[0], 1.0]) not in kept
    assert json.dumps(["assistant", temperatures[-1], 1.0]) in kept


def test_remember_keeps_the_most_recent_entries_up_to_its_limit():
    from assistgen.comparison.runtime import remember
    kept = {}
    for key in "abcab":
        remember(kept, key, key.upper(), limit=2)
    assert kept == {"a": "A", "b": "B"} and list(kept) == ["a", "b"]
    remember(kept, "c", "C", limit=2)
    remember(kept, "b", "b2", limit=2)
    assert list(kept.items()) == [("c", "C"), ("b", "b2")]


def test_a_target_whose_encoder_runs_in_bfloat16_says_so_and_stays_identical(speech_pair):
    from assistgen.models import precision
    pair, tokenizer = speech_pair
    plain = compare(pair, "asr", _window(tokenizer, "en"), Settings(max_new_tokens=12)).to_dict()
    assert plain["encoder_dtype"] is None and plain["identical_note"].endswith("(float32)")
    precision.cast_encoder(pair.target.model, torch.bfloat16)
    result = compare(pair, "asr", _window(tokenizer, "en"), Settings(max_new_tokens=12))
    data = result.to_dict()
    assert result.identical and data["dtype"] == "float32" and data["encoder_dtype"] == "bfloat16"
    assert data["identical_note"] == "identical to baseline, token for token (float32, encoder bfloat16)"
    assert data["assisted"]["new_tokens"] == 12 and data["assisted"]["target_passes"] < 12


def test_only_what_a_steady_machine_measured_is_kept_for_the_next_process(speech_pair, tmp_path, monkeypatch):
    """Costs measured while the machine's speed moved would start every later process from them (and a verification
    size no later run drafts is never measured again): a comparison whose speed probes warn keeps nothing."""
    from assistgen.comparison import compare as comparing, schedule_store
    pair, tokenizer = speech_pair
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))
    for name, loaded in (("target", pair.target), ("assistant", pair.assistant)):
        monkeypatch.setattr(loaded.model.config, "_name_or_path", str(tmp_path / "models" / name))
    window = [SpeechWindow(0.0, 20.0, _window(tokenizer, "en"))]
    adaptive = Settings(max_new_tokens=24, schedule="adaptive")
    moved = lambda *args: dataclasses.replace(judge(*args), warnings=["the machine's speed moved"])   # noqa: E731
    monkeypatch.setattr(comparing, "judge", moved)
    run = compare(check_pair(pair.spec, pair.target, pair.assistant), "asr", window, adaptive)
    assert not run.stability.stable and run.identical
    assert not schedule_store.store_path(pair).exists()
    steady = lambda *args: dataclasses.replace(judge(*args), warnings=[])   # noqa: E731
    monkeypatch.setattr(comparing, "judge", steady)
    compare(check_pair(pair.spec, pair.target, pair.assistant), "asr", window, adaptive)
    assert schedule_store.store_path(pair).is_file()
