"""One request pipeline: the page, the API, the command line and bench check a request and build its inputs through
`comparison.request`, against the limits in `choices`."""
import dataclasses

import numpy as np
import pytest
import soundfile as sf

from assistgen.choices import MAX_INPUT_TOKENS, Limits, limits_from_env
from assistgen.comparison.request import build_request, pair_for_task, request_inputs, request_settings
from assistgen.comparison.tasks import InputError, text_inputs
from assistgen.engine.prefix_cache import SHARED_PREFIX
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool


@pytest.fixture(scope="module")
def catalog(tiny_catalog_path):
    return load_catalog(tiny_catalog_path)


@pytest.fixture(scope="module")
def pool(catalog):
    return ModelPool(catalog)


def _wav(path, seconds: float):
    samples = (0.2 * np.sin(np.arange(int(16000 * seconds)) / 5)).astype(np.float32)
    sf.write(str(path), samples, 16000)
    return str(path)


@pytest.mark.parametrize("name,task,needle", [
    ("tiny-text", "poetry", "unknown task 'poetry'; choose from chat, translation, summarization, asr"),
    ("no-such-pair", "chat", "unknown pair 'no-such-pair'; choose from: tiny-text"),
    ("tiny-text", "asr", "pair 'tiny-text' does not do speech recognition; it does chat, translation, "
                         "summarization: pick another pair"),
    ("tiny-missing", "chat", "pair 'tiny-missing' is unavailable"),
])
def test_a_bad_pair_or_task_is_an_input_error_that_says_what_to_do(catalog, name, task, needle):
    with pytest.raises(InputError) as info:
        pair_for_task(catalog, name, task)
    assert needle in str(info.value)


@pytest.mark.parametrize("values,needle", [
    ({"max_new_tokens": 0}, "max_new_tokens must be a whole number from 1 to 1024, got 0"),
    ({"max_new_tokens": 1025}, "max_new_tokens must be a whole number from 1 to 1024, got 1025"),
    ({"max_new_tokens": "2.5"}, "max_new_tokens must be a whole number, got 2.5"),
    ({"temperature": 2.5}, "temperature must be 0 (greedy) or from 0.001 to 2"),
    ({"temperature": 1e-40}, "temperature must be 0 (greedy) or from 0.001 to 2"),   # logits / T would overflow
    ({"temperature": "nan"}, "temperature must be a number, got nan"),
    ({"temperature": 10**400}, "temperature must be a finite number"),
    ({"max_new_tokens": "inf"}, "max_new_tokens must be a finite number, got inf"),
    ({"num_assistant_tokens": "-1e999"}, "initial window must be a finite number, got -inf"),
    ({"num_assistant_tokens": 65}, "num_assistant_tokens must be from 1 to 64"),
    ({"draft_source": "oracle"}, "draft source must be one of assistant, assistant_lookup, prompt_lookup"),
])
def test_settings_outside_the_limits_are_refused(catalog, values, needle):
    with pytest.raises(InputError) as info:
        request_settings(catalog.pair("tiny-text"), **values)
    assert needle in str(info.value)


def test_what_a_request_leaves_out_is_the_pairs_own(catalog):
    spec = catalog.pair("tiny-text")
    settings = request_settings(spec)
    assert (settings.max_new_tokens, settings.draft_source, settings.num_assistant_tokens, settings.schedule) == (
        spec.max_new_tokens, spec.draft_source, spec.num_assistant_tokens, spec.schedule)
    assert settings.temperature == 0.0 and settings.max_time_s is None


def test_speech_needs_a_recording_and_text_needs_text(catalog, tmp_path):
    speech, text = catalog.pair("tiny-speech"), catalog.pair("tiny-text")
    with pytest.raises(InputError, match="no audio: upload a clip"):
        build_request(speech, "asr", request_settings(speech), text="words instead of a recording")
    with pytest.raises(InputError, match="the text is empty"):
        build_request(text, "chat", request_settings(text), text=" \n ")
    with pytest.raises(InputError, match="unknown target language 'Klingon'"):
        build_request(text, "translation", request_settings(text), text="Hello.", target_language="Klingon")
    with pytest.raises(InputError, match=r"does not do speech recognition; it does chat"):
        build_request(text, "asr", request_settings(text), audio=_wav(tmp_path / "a.wav", 1.0))


def test_a_recording_is_decoded_once_and_held_to_the_audio_limit(catalog, tmp_path):
    spec = catalog.pair("tiny-speech")
    request = build_request(spec, "asr", request_settings(spec), audio=_wav(tmp_path / "a.wav", 1.5),
                            language="auto")
    assert request.samples.shape == (24000,) and request.language is None
    with pytest.raises(InputError, match="the limit is 1 s"):
        build_request(spec, "asr", request_settings(spec), audio=_wav(tmp_path / "a.wav", 1.5),
                      limits=Limits(max_audio_s=1.0))
    # the size too, whichever way the file came (an API call's URL bypasses the upload's own limit)
    with pytest.raises(InputError, match=r"the file is 47 KB; the limit is 40 KB \(ASSISTGEN_MAX_FILE_SIZE\)"):
        build_request(spec, "asr", request_settings(spec), audio=_wav(tmp_path / "a.wav", 1.5),
                      limits=Limits(max_file_size="40kb"), served=True)
    # the command line and bench read local files of any size
    assert build_request(spec, "asr", request_settings(spec), audio=_wav(tmp_path / "a.wav", 1.5),
                         limits=Limits(max_file_size="40kb")).samples.shape == (24000,)


def test_text_is_checked_before_any_model_loads(catalog, monkeypatch):
    from assistgen.models import pool as pool_module
    monkeypatch.setattr(pool_module.ModelPool, "pair", lambda *a, **k: pytest.fail("a model was loaded"))
    spec = catalog.pair("tiny-text")
    with pytest.raises(InputError, match="characters, far over the 8-token input limit"):
        build_request(spec, "chat", request_settings(spec), text="x" * 100, limits=Limits(max_input_tokens=8))
    with pytest.raises(InputError, match="broken character at position 3: paste it again"):
        build_request(spec, "chat", request_settings(spec), text="hi \ud800 there")


def test_a_prompt_that_leaves_the_model_no_room_is_refused_with_what_to_do(catalog, pool, monkeypatch):
    spec = catalog.pair("tiny-text")
    loaded = pool.pair("tiny-text")
    positions = loaded.target.model.config.max_position_embeddings
    words = " ".join(["word"] * positions)
    request = build_request(spec, "chat", request_settings(spec), text=words, limits=Limits(max_input_tokens=4096))
    with pytest.raises(InputError, match=f"reads at most {positions:,} positions, its answer included: shorten it"):
        request_inputs(request, loaded)
    # an encoder-decoder model reads the text apart from its answer (T5's n_positions is no such limit)
    monkeypatch.setattr(loaded.target.model.config, "is_encoder_decoder", True)
    assert request_inputs(request, loaded).inputs["input_ids"].shape[1] > positions


def test_the_environment_sets_each_limit_and_only_where_given():
    assert limits_from_env({}) == Limits()
    assert limits_from_env({"ASSISTGEN_MAX_INPUT_TOKENS": ""}).max_input_tokens == MAX_INPUT_TOKENS
    limits = limits_from_env({"ASSISTGEN_MAX_INPUT_TOKENS": "64", "ASSISTGEN_MAX_AUDIO_SECONDS": "30",
                              "ASSISTGEN_MAX_FILE_SIZE": "5mb", "ASSISTGEN_MAX_GENERATION_SECONDS": "12.5"})
    assert limits == Limits(max_input_tokens=64, max_audio_s=30.0, max_file_size="5mb", max_generation_s=12.5)


def test_a_request_holds_the_environments_input_limit_and_its_inputs_keep_to_it(catalog, pool, monkeypatch):
    spec = catalog.pair("tiny-text")
    monkeypatch.setenv("ASSISTGEN_MAX_INPUT_TOKENS", "8")
    # under 8 × 8 characters, so it is the tokenizer that finds it too long
    request = build_request(spec, "chat", request_settings(spec), text="one two three four five")
    assert request.max_input_tokens == 8
    with pytest.raises(InputError, match=r"tokens; the limit is 8: shorten it"):
        request_inputs(request, pool.pair("tiny-text"))


def test_the_page_and_the_command_line_make_the_same_request(catalog, tiny_catalog_path):
    from assistgen.app.service import Service
    from assistgen.tools.cli import build_parser
    from assistgen.tools.terminal import checked_request, pair_for
    spec = pair_for_task(catalog, "tiny-text", "translation")
    # the page's form sends numbers as it holds them (a slider's float, a string through the API)
    page = build_request(spec, "translation",
                         request_settings(spec, max_new_tokens=12.0, temperature="0.5", draft_source="prompt_lookup",
                                          num_assistant_tokens="3", schedule="constant", seed=2),
                         text="Good morning.", target_language="German")
    args = build_parser().parse_args(
        ["compare", "--pair", "tiny-text", "--task", "translation", "--text", "Good morning.", "--target-language",
         "German", "--max-new-tokens", "12", "--temperature", "0.5", "--draft-source", "prompt-lookup",
         "--num-assistant-tokens", "3", "--schedule", "constant", "--seed", "2"])
    cli = checked_request(pair_for(catalog, args.pair, args.task, args.audio), args)
    assert cli == page and cli.settings.max_new_tokens == 12 and cli.settings.draft_source == "prompt_lookup"
    # the server alone bounds each run's time
    service = Service(catalog)
    served = service.settings("tiny-text", max_new_tokens=12.0, temperature="0.5", draft_source="prompt_lookup",
                              num_assistant_tokens="3", schedule="constant", seed=2)
    assert served == dataclasses.replace(cli.settings, max_time_s=service.limits.max_generation_s)


def test_request_inputs_are_the_tasks_own_and_speech_is_in_the_language_asked_for(catalog, pool, tmp_path):
    text_spec, speech_spec = catalog.pair("tiny-text"), catalog.pair("tiny-speech")
    request = build_request(text_spec, "summarization", request_settings(text_spec), text="A short passage.")
    prepared = request_inputs(request, pool.pair("tiny-text"))
    expected = text_inputs(pool.pair("tiny-text"), "summarization", "A short passage.")
    assert prepared.inputs["input_ids"].tolist() == expected["input_ids"].tolist()
    assert prepared.language is None and prepared.prep is None
    speech = pool.pair("tiny-speech")
    audio = _wav(tmp_path / "a.wav", 2.0)
    heard = []
    prepared = request_inputs(build_request(speech_spec, "asr", request_settings(speech_spec), audio=audio,
                                            language="en"), speech, on_language=heard.append)
    assert heard == [prepared.language] == [{"code": "en", "detected": False, "probability": None}]
    assert len(prepared.inputs) == 1 and set(prepared.prep) == {"audio_decode_s", "features_s"}
    with pytest.raises(InputError, match="does not know the language 'xx'"):
        request_inputs(build_request(speech_spec, "asr", request_settings(speech_spec), audio=audio,
                                     language="xx"), speech)


def test_a_prompt_says_how_much_of_it_the_template_and_the_instruction_make(pool):
    """The shared beginning a model may keep (`engine.prefix_cache`): the same tokens for any text of the task, the
    text itself after it."""
    pair = pool.pair("tiny-text")
    tokenizer = pair.target.tokenizer
    for task in ("chat", "translation", "summarization"):
        one = text_inputs(pair, task, "The quick brown fox.")
        other = text_inputs(pair, task, "Assisted generation is fast.")
        shared = one[SHARED_PREFIX]
        assert shared == other[SHARED_PREFIX] > 0
        ids, other_ids = one["input_ids"][0].tolist(), other["input_ids"][0].tolist()
        assert ids[:shared] == other_ids[:shared] and ids[shared] != other_ids[shared]
        assert tokenizer.decode(ids[shared:]).startswith("The")
    assert (text_inputs(pair, "translation", "Hello.")[SHARED_PREFIX]
            > text_inputs(pair, "chat", "Hello.")[SHARED_PREFIX])   # the instruction is shared too
