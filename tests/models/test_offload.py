"""A target mostly offloaded to disk (accelerate's device_map with a memory cap), as a model bigger than the
machine's memory runs: it loads, holds only what the cap allows, and decodes exactly as the same model in memory."""
import pytest

import helpers as tm
from assistgen.engine.decoding import generate
from assistgen.models.catalog import load_catalog
from assistgen.models.loading import load_model, offloaded


def target():
    return tm.qwen2(3, vocab=len(tm.text_tokenizer()), hidden=64, layers=4, init=0.2)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    tokenizer = tm.text_tokenizer()
    target().save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "models.yaml").write_text(f"""
models:
  in-memory: {{local: {root / 'target'}, dtype: float32}}
  offloaded: {{local: {root / 'target'}, dtype: float32, device_map: auto, max_memory: {{cpu: 400KB}},
              offload_folder: offload}}
pairs:
  - {{name: p, tasks: [chat], target: offloaded, prompt_style: chat_template}}
""")
    return load_catalog(root / "models.yaml")


def test_an_offloaded_target_holds_only_its_cap_and_decodes_as_in_memory(catalog, tmp_path, monkeypatch):
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))
    whole = load_model(catalog.models["in-memory"], catalog)
    part = load_model(catalog.models["offloaded"], catalog)
    assert offloaded(part.model) and not offloaded(whole.model)
    assert part.num_parameters == whole.num_parameters
    assert part.num_bytes < whole.num_bytes / 2   # what is on disk is not held
    swapped = [m for m in part.model.modules() if getattr(getattr(m, "_old_forward", None), "__name__", "") == "<lambda>"]
    assert swapped, "the offloaded layers run through oneDNN"
    inputs = tm.decoder_inputs(5, length=10)
    reference = generate(whole.model, inputs, max_new_tokens=24).new_tokens
    assert set(part.model.hf_device_map.values()) == {"cpu", "disk"}
    assert generate(part.model, inputs, max_new_tokens=24).new_tokens == reference
    assistant = tm.perturbed(target(), 0.02, seed=9)   # agrees often: verification passes of many rows
    assisted = generate(part.model, inputs, assistant_model=assistant, max_new_tokens=24)
    assert assisted.new_tokens == reference
    assert max(len(s.candidates) for s in assisted.steps) >= 3   # oneDNN's path, not MKL's, verified them


def test_a_cap_that_leaves_nothing_in_memory_is_a_clear_load_error(catalog, tmp_path, monkeypatch):
    import dataclasses

    from assistgen.models.loading import LoadError
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))
    tiny_cap = dataclasses.replace(catalog.models["offloaded"], max_memory=(("cpu", "1KB"),))
    with pytest.raises(LoadError, match="leaves no layer in memory"):
        load_model(tiny_cap, catalog)
