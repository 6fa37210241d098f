"""models.yaml validation: every kind of bad entry gets its own clear error naming file, entry and key."""
import copy

import pytest
import yaml

from assistgen.models.catalog import CatalogError, load_catalog

GOOD = {
    "packs": {"p": {"format": "gguf", "files": [
        {"name": "m.gguf", "sha256": "a" * 64, "parts": {"package": "pkg-part{n}", "path": "data/{n:02d}", "count": 2}}]}},
    "models": {"big": {"pack": "p", "dtype": "float32", "eos_token_ids": [2, 3]}, "small": {"hub": "org/small"}},
    "pairs": [{"name": "big+small", "tasks": ["chat"], "target": "big", "assistant": "small",
               "prompt_style": "chat_template", "defaults": {"max_new_tokens": 64}}],
}


def write(tmp_path, data):
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_the_shipped_catalog_is_valid():
    catalog = load_catalog()
    assert catalog.pair("qwen2.5-coder-1.5b+0.5b").assistant.name == "qwen2.5-coder-0.5b-instruct"
    assert {p.name for p in catalog.pairs_for("asr")} >= {"whisper-base+tiny.en"}
    assert all(pair.tasks for pair in catalog.pairs)
    for pair in catalog.pairs:   # distil-Whisper: decoder-only, English-only, and its published size
        if pair.assistant is not None and pair.assistant.location.startswith("distil-whisper/"):
            assert pair.assistant.decoder_only and pair.assistant.languages == ("en",)
    assert all(spec.parameters for spec in catalog.models.values() if spec.source == "hub")


def test_a_good_catalog_loads_into_frozen_dataclasses(tmp_path):
    catalog = load_catalog(write(tmp_path, GOOD))
    pair = catalog.pair("big+small")
    assert pair.target.eos_token_ids == (2, 3) and pair.max_new_tokens == 64 and pair.num_assistant_tokens == 5
    assert [p.package for p in catalog.packs["p"].files[0].parts] == ["pkg-part1", "pkg-part2"]
    assert catalog.packs["p"].files[0].parts[1].path == "data/02"
    with pytest.raises(Exception):
        pair.name = "other"


def mutate(path_keys, value):
    data = copy.deepcopy(GOOD)
    node = data
    for key in path_keys[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path_keys[-1]]
    else:
        node[path_keys[-1]] = value
    return data


@pytest.mark.parametrize("data,needle", [
    (mutate(["pairs", 0, "tasks"], ["chat", "dance"]), "pair 'big+small', key 'tasks'"),
    (mutate(["pairs", 0, "target"], "nope"), "pair 'big+small', key 'target': no model named 'nope'"),
    (mutate(["pairs", 0, "target"], KeyError), "pair 'big+small', key 'target': is required"),
    (mutate(["pairs", 0, "name"], KeyError), "pair 1, key 'name': is required"),
    (mutate(["pairs", 0, "prompt_style"], "poetry"), "key 'prompt_style': 'poetry' is not one of"),
    (mutate(["pairs", 0, "defaults"], {"max_new_tokens": 0}), "key 'max_new_tokens': must be between 1 and 1024"),
    (mutate(["pairs", 0, "defaults"], {"max_new_tokens": "many"}), "key 'max_new_tokens': expected int"),
    (mutate(["pairs", 0, "defaults"], {"schedule": "sometimes"}), "key 'schedule'"),
    (mutate(["pairs", 0, "defaults"], {"draft_source": "oracle"}), "key 'draft_source': 'oracle' is not one of"),
    (mutate(["pairs", 0, "colour"], "red"), "pair 'big+small', key 'colour': unknown key"),
    (mutate(["models", "big", "dtype"], "float8"), "model 'big', key 'dtype'"),
    (mutate(["models", "big", "quantization"], "2bit"), "model 'big', key 'quantization'"),
    (mutate(["models", "big", "hub"], "org/x"), "model 'big': needs exactly one source key"),
    (mutate(["models", "big", "pack"], "missing"), "model 'big', key 'pack': no pack named 'missing'"),
    (mutate(["models", "big", "eos_token_ids"], ["x"]), "key 'eos_token_ids'"),
    (mutate(["models", "big", "max_memory"], {"cpu": "2GiB"}), "key 'max_memory': a memory cap needs device_map"),
    (mutate(["models", "big"], {"hub": "org/big", "device_map": "auto", "max_memory": {"cpu": "lots"}}),
     "key 'max_memory': cpu: expected a size such as '2GiB'"),
    (mutate(["models", "small"], "org/small"), "model 'small': expected a mapping"),
    (mutate(["models", "small", "parameters"], 0), "model 'small', key 'parameters': must be a positive count"),
    (mutate(["models", "small", "languages"], "en"), "model 'small', key 'languages': expected list"),
    (mutate(["models", "small", "languages"], [""]), "model 'small', key 'languages': expected a list of language"),
    (mutate(["pairs", 0, "default_on"], ["tpu"]), "pair 'big+small', key 'default_on': expected a non-empty list"),
    (mutate(["pairs", 0, "click_s"], {"cpu-2-cores": "slow"}), "pair 'big+small', key 'click_s': expected seconds"),
    (mutate(["packs", "p", "files", 0, "sha256"], "abc"), "pack 'p', file 1, key 'sha256': expected 64"),
    (mutate(["packs", "p", "files", 0, "parts"], []), "pack 'p', file 1, key 'parts'"),
    (mutate(["packs", "p", "format"], "zip"), "pack 'p', key 'format'"),
    (mutate(["pairs"], []), "key 'pairs': needs at least one pair"),
    (mutate(["pairs"], [GOOD["pairs"][0], GOOD["pairs"][0]]), "pair 'big+small': the name is used twice"),
    ("pairs: [unclosed", "not valid YAML"),
    ("- just\n- a list\n", "top level: expected a mapping"),
])
def test_bad_entries_get_their_own_clear_error(tmp_path, data, needle):
    path = write(tmp_path, data)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_a_missing_catalog_file_is_a_clear_error(tmp_path):
    with pytest.raises(CatalogError, match="cannot read the catalog"):
        load_catalog(tmp_path / "nope.yaml")


def test_speech_pairs_must_be_speech_only(tmp_path):
    data = mutate(["pairs", 0, "tasks"], ["asr", "chat"])
    with pytest.raises(CatalogError, match="speech pair"):
        load_catalog(write(tmp_path, data))


def test_a_models_cpu_keys_give_its_numerics_on_a_cpu_and_the_entry_as_written_elsewhere(tmp_path):
    data = copy.deepcopy(GOOD)
    data["models"]["small"]["cpu"] = {"quantization": "dynamic_int8"}
    catalog = load_catalog(write(tmp_path, data))
    small = catalog.models["small"]
    assert small.quantization == "none" and small.on("cuda") is small
    assert small.on("cpu").quantization == "dynamic_int8" and small.on("cpu").name == "small"
    assert catalog.models["big"].on("cpu") is catalog.models["big"]   # no cpu keys: the entry as written


@pytest.mark.parametrize("cpu, needle", [
    ({"device_map": "auto"}, "model 'small', key 'device_map': unknown key"),
    ({"quantization": "int3"}, "model 'small' on a CPU (its 'cpu' keys applied), key 'quantization'"),
    ({"quantization": "w8a8", "encoder_dtype": "bfloat16"}, "not with quantization"),
    ("int8", "model 'small', key 'cpu': expected a mapping"),
])
def test_bad_cpu_keys_get_a_clear_error(tmp_path, cpu, needle):
    data = copy.deepcopy(GOOD)
    data["models"]["small"]["cpu"] = cpu
    with pytest.raises(CatalogError) as err:
        load_catalog(write(tmp_path, data))
    assert needle in str(err.value), str(err.value)
