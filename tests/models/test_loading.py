"""Pair checks and the model pool: tokenizer classification, size-ratio warnings, LRU eviction in a budget."""
import threading
import time

import pytest

import helpers as tm
from assistgen.models.catalog import load_catalog
from assistgen.models.loading import LoadedModel, LoadError, check_pair, tokenizer_mode
from assistgen.models.pool import ModelPool
from helpers import text_tokenizer, whisper_tokenizer


def test_identical_tokenizers_select_same_tokenizer_mode():
    mode, reason = tokenizer_mode(text_tokenizer(), text_tokenizer())
    assert mode == "same-tokenizer" and "identical" in reason


def test_different_vocabularies_are_classified_with_the_reason():
    mode, reason = tokenizer_mode(text_tokenizer(), whisper_tokenizer())
    assert mode == "different-tokenizer" and "vocabularies differ" in reason


def test_same_vocabulary_different_special_tokens_is_different():
    a, b = text_tokenizer(), text_tokenizer()
    b.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    assert tokenizer_mode(a, b)[0] == "different-tokenizer"


def _loaded(name, model, tokenizer, nbytes=100):
    params = sum(p.numel() for p in model.parameters())
    return LoadedModel(spec=type("S", (), {"name": name, "eos_token_ids": ()})(), model=model, tokenizer=tokenizer,
                       processor=None, num_parameters=params, num_bytes=nbytes, load_s=0.0)


def test_pair_check_warns_when_the_assistant_is_not_much_smaller(tiny_catalog_path):
    spec = load_catalog(tiny_catalog_path).pair("tiny-text")
    tok = text_tokenizer()
    pair = check_pair(spec, _loaded("t", tm.qwen2(0, vocab=320), tok), _loaded("a", tm.qwen2(1, vocab=320), tok))
    assert pair.mode == "same-tokenizer" and pair.assistant_usable
    assert pair.parameter_ratio == pytest.approx(1.0)
    assert any("only 1.0x fewer weight bytes" in w for w in pair.warnings)


def test_pair_check_explains_a_different_tokenizer_pair(tiny_catalog_path):
    spec = load_catalog(tiny_catalog_path).pair("tiny-text")
    pair = check_pair(spec, _loaded("t", tm.qwen2(0, vocab=320), text_tokenizer()),
                      _loaded("a", tm.qwen2(1, vocab=320), whisper_tokenizer()))
    assert pair.mode == "different-tokenizer" and pair.assistant_usable
    assert "vocabularies differ" in pair.mode_reason and "re-tokenized" in pair.mode_reason


def test_pair_check_refuses_incompatible_encoder_decoder_shapes(tiny_catalog_path):
    spec = load_catalog(tiny_catalog_path).pair("tiny-speech")
    tok = whisper_tokenizer()
    assistant = tm.whisper_decoder_only(1)
    assistant.config.d_model = 64  # the decoder could not read the target's 32-wide encoder output
    with pytest.raises(LoadError, match="cannot read the target's encoder"):
        check_pair(spec, _loaded("t", tm.whisper(0), tok), _loaded("a", assistant, tok))
    with pytest.raises(LoadError, match="encoder-decoder model cannot assist a decoder-only"):
        check_pair(spec, _loaded("t", tm.qwen2(0), tok), _loaded("a", tm.t5(1), tok))


class FakeLoader:
    """Records loads; every model 'weighs' what the test says."""

    def __init__(self, sizes, delay=0.0):
        self.sizes, self.delay, self.loads = sizes, delay, []

    def __call__(self, spec, catalog, progress=None):
        self.loads.append(spec.name)
        time.sleep(self.delay)
        if progress:
            progress(1.0, f"{spec.name}: ready")
        return LoadedModel(spec, model=tm.qwen2(len(self.loads), vocab=320), tokenizer=text_tokenizer(),
                           processor=None, num_parameters=1, num_bytes=self.sizes[spec.name], load_s=0.0)


@pytest.fixture
def catalog(tiny_catalog_path, monkeypatch):
    from assistgen.models import pool as pool_module
    monkeypatch.setattr(pool_module, "load_bytes", lambda spec, device: None)  # sizes: the loader's
    return load_catalog(tiny_catalog_path)


def test_pool_evicts_least_recently_used_within_the_budget(catalog):
    m = catalog.models
    loader = FakeLoader({"tiny-text-target": 40, "tiny-text-assistant": 20, "tiny-speech-target": 40,
                         "tiny-speech-assistant": 20})
    pool = ModelPool(catalog, budget_bytes=100, loader=loader)
    pool.model(m["tiny-text-target"])
    pool.model(m["tiny-text-assistant"])
    pool.model(m["tiny-speech-target"])
    assert pool.resident() == ["tiny-text-target", "tiny-text-assistant", "tiny-speech-target"]
    pool.model(m["tiny-text-target"])  # a hit refreshes it
    pool.model(m["tiny-speech-assistant"])  # 120 > 100: the least recently used goes
    assert "tiny-text-assistant" not in pool.resident()
    assert pool.resident_bytes <= 100
    assert loader.loads.count("tiny-text-target") == 1


def test_an_evicted_pair_lets_its_models_go(catalog):
    """The pool remembers each checked pair; an evicted model must leave that memory too, or its weights stay."""
    import gc
    import weakref
    loader = FakeLoader({"tiny-text-target": 40, "tiny-text-assistant": 20, "tiny-speech-target": 40,
                         "tiny-speech-assistant": 20})
    pool = ModelPool(catalog, budget_bytes=100, loader=loader)
    text = pool.pair("tiny-text")
    gone = weakref.ref(text.target.model)
    del text
    pool.pair("tiny-speech")
    pool.model(catalog.models["tiny-text-assistant"])   # 120 > 100: the text target, least recently used, goes
    assert "tiny-text-target" not in pool.resident()
    gc.collect()
    assert gone() is None


def test_pool_keeps_the_pair_it_is_loading_even_over_budget(catalog):
    loader = FakeLoader({"tiny-text-target": 80, "tiny-text-assistant": 50})
    pool = ModelPool(catalog, budget_bytes=100, loader=loader)
    pool.model(catalog.models["tiny-text-target"], keep={"tiny-text-target", "tiny-text-assistant"})
    pool.model(catalog.models["tiny-text-assistant"], keep={"tiny-text-target", "tiny-text-assistant"})
    assert set(pool.resident()) == {"tiny-text-target", "tiny-text-assistant"}


def test_pool_never_loads_two_copies_of_one_model_at_once(catalog):
    loader = FakeLoader({"tiny-text-target": 10}, delay=0.2)
    pool = ModelPool(catalog, budget_bytes=100, loader=loader)
    results = []
    threads = [threading.Thread(target=lambda: results.append(pool.model(catalog.models["tiny-text-target"])))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loader.loads == ["tiny-text-target"]
    assert len({id(r) for r in results}) == 1


def test_pool_reports_progress_for_a_pair(catalog):
    loader = FakeLoader({"tiny-text-target": 10, "tiny-text-assistant": 5})
    seen = []
    pair = ModelPool(catalog, budget_bytes=100, loader=loader).pair("tiny-text", lambda f, m: seen.append((f, m)))
    assert [m for _, m in seen] == ["tiny-text-target: ready", "tiny-text-assistant: ready"]
    assert seen[-1][0] == pytest.approx(1.0)
    assert pair.mode == "same-tokenizer"


def test_pool_makes_room_before_a_first_load_by_the_size_its_headers_give(catalog, monkeypatch):
    from assistgen.models import pool as pool_module
    monkeypatch.setattr(pool_module, "load_bytes", lambda spec, device: {"tiny-speech-target": 70}.get(
        spec.name))
    seen = {}
    loader = FakeLoader({"tiny-text-target": 40, "tiny-text-assistant": 20, "tiny-speech-target": 70})
    pool = ModelPool(catalog, budget_bytes=100, loader=loader)

    def load(spec, catalog, progress=None):
        seen[spec.name] = pool.resident()   # what is held while this model loads
        return loader(spec, catalog, progress)
    pool._loader = load
    pool.model(catalog.models["tiny-text-target"])
    pool.model(catalog.models["tiny-text-assistant"])
    pool.model(catalog.models["tiny-speech-target"])
    # the least recently used went first, before the load: 60 held + 70 would not fit in 100, 20 + 70 does
    assert seen["tiny-speech-target"] == ["tiny-text-assistant"]


def test_a_decoding_pass_reads_the_decoders_linear_weights_a_byte_each_in_int8():
    from assistgen.models import quantized
    from assistgen.models.loading import decoding_pass_bytes
    model = tm.whisper(0)   # d_model 32, decoder FFN 64, 2 decoder layers, vocabulary 96; its encoder is not counted
    per_layer = 8 * 32 * 32 + 2 * 32 * 64          # self and cross attention's 4 projections each, then the MLP
    weights = 2 * per_layer + 96 * 32              # and the output layer
    assert decoding_pass_bytes(model) == 4 * weights
    assert decoding_pass_bytes(quantized.quantize(model)) == weights
