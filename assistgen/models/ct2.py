"""Read CTranslate2 Whisper checkpoints and convert them to Hugging Face Whisper folders.

The reader parses the ``model.bin`` layout written by CTranslate2 (binary version 6) with
``struct`` and ``numpy`` only: the file is treated as untrusted bytes, nothing in it is
executed or unpickled, and every malformed input raises a ``ValueError`` naming the file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken
from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                          WhisperTokenizerFast)

_SUPPORTED_VERSION = 6
# CTranslate2 DataType codes; bfloat16 (5) is read as raw uint16 bits and widened to float32.
_DTYPES = {code: np.dtype(t) for code, t in enumerate(["<f4", "i1", "<i2", "<i4", "<f2", "<u2"])}
_BFLOAT16 = 5
# Scalar flags of CTranslate2's WhisperSpec and the only values Whisper allows (3 is ActivationType::GELU).
_EXPECTED_FLAGS = {"decoder/activation": 3, "decoder/alibi": 0, "decoder/pre_norm": 1,
                   "decoder/scale_embeddings": 0, "decoder/start_from_zero_embedding": 0}
_IGNORED = {"decoder/alignment_heads", "decoder/alignment_layer"}
_MULTILINGUAL_MIN_VOCAB = 51865
_NUM_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>
_REQUIRED_SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>",
                      "<|startofprev|>", "<|notimestamps|>")
_LAYER = re.compile(r"^(encoder|decoder)/layer_(\d+)/")


class _Reader:
    """Bounds-checked little-endian cursor over the bytes of one file."""

    def __init__(self, path: Path, data: memoryview) -> None:
        self.path, self.data, self.pos = path, data, 0

    def fail(self, problem: str) -> ValueError:
        return ValueError(f"{self.path}: {problem}")

    def take(self, n: int, what: str) -> memoryview:
        end = self.pos + n
        if end > len(self.data):
            raise self.fail(f"truncated at byte {len(self.data)} while reading {what} "
                            f"(needs bytes {self.pos}..{end})")
        chunk, self.pos = self.data[self.pos:end], end
        return chunk

    def uint(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = bytes(self.take(self.uint("H", f"length of {what}"), what))
        if not raw or raw[-1] != 0:
            raise self.fail(f"{what} is not NUL-terminated")
        try:
            return raw[:-1].decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(f"{what} is not valid UTF-8") from err


def read_ct2(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Read every variable of a CTranslate2 ``model.bin``, aliases resolved.

    Arrays keep their stored dtype (float32/int8/int16/int32/float16), except bfloat16 which
    is widened to float32; scalars come back as 0-d arrays. An alias maps to the very array
    object of its target.
    """
    path = Path(path)
    buf = bytearray(path.stat().st_size)
    with open(path, "rb") as handle:
        size = handle.readinto(buf)
    r = _Reader(path, memoryview(buf)[:size])
    version = r.uint("I", "binary version")
    if version != _SUPPORTED_VERSION:
        raise r.fail(f"unsupported CTranslate2 binary version {version} (expected {_SUPPORTED_VERSION})")
    r.string("spec name")
    r.uint("I", "spec revision")
    out: dict[str, np.ndarray] = {}
    for index in range(r.uint("I", "variable count")):
        name = r.string(f"name of variable #{index}")
        shape = tuple(r.uint("I", f"dimension of {name!r}") for _ in range(r.uint("B", f"rank of {name!r}")))
        code = r.uint("B", f"dtype of {name!r}")
        if code not in _DTYPES:
            raise r.fail(f"variable {name!r} has unknown dtype code {code}")
        dtype = _DTYPES[code]
        nbytes = r.uint("I", f"byte count of {name!r}")
        if nbytes != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise r.fail(f"variable {name!r}: {nbytes} bytes do not fit shape {shape} of {dtype}")
        if name in out:
            raise r.fail(f"duplicate variable {name!r}")
        array = np.frombuffer(r.take(nbytes, f"data of {name!r}"), dtype=dtype).reshape(shape)
        if code == _BFLOAT16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        out[name] = array
    for index in range(r.uint("I", "alias count")):
        alias = r.string(f"alias #{index}")
        target = r.string(f"target of alias {alias!r}")
        if target not in out or alias in out:
            raise r.fail(f"alias {alias!r} -> {target!r} is dangling or shadows a variable")
        out[alias] = out[target]
    if r.pos != size:
        raise r.fail(f"{size - r.pos} unexpected trailing bytes after the aliases")
    return out


class _Mapper:
    """Builds the HF state dict (float32) from ct2 variables, recording which variables it used."""

    def __init__(self, variables: dict[str, np.ndarray]) -> None:
        self.vars, self.used, self.sd = variables, set(), {}

    def tensor(self, name: str) -> np.ndarray:
        """A float32 copy of ``name``; integer weights are divided by their ``<name>_scale``."""
        array = self.vars[name]
        self.used.add(name)
        if array.dtype.kind == "f":
            return array.astype(np.float32)
        scale = self.vars[name + "_scale"].astype(np.float32)
        self.used.add(name + "_scale")
        if scale.shape != array.shape[:scale.ndim]:
            raise KeyError(f"{name}_scale (shape {scale.shape} does not fit {array.shape})")
        return array.astype(np.float32) / scale.reshape(scale.shape + (1,) * (array.ndim - scale.ndim))

    def scalar(self, name: str) -> int:
        self.used.add(name)
        if self.vars[name].ndim != 0:
            raise KeyError(f"{name} (expected a scalar)")
        return int(self.vars[name])

    def linear(self, ct2: str, hf: str, names: tuple[str, str] = ("weight", "bias")) -> None:
        self.sd[hf + ".weight"], self.sd[hf + ".bias"] = (self.tensor(f"{ct2}/{n}") for n in names)

    def norm(self, ct2: str, hf: str) -> None:
        self.linear(ct2, hf, ("gamma", "beta"))

    def attention(self, ct2: str, hf: str, cross: bool) -> None:
        """Split fused projections: self-attention linear_0 is [q; k; v], cross-attention linear_1 is [k; v].

        The k bias slot is dropped: HF Whisper has no k bias, and a k bias only adds a per-query
        constant to the attention logits, which softmax ignores.
        """
        parts, fused, out = (["k", "v"], "/linear_1", "/linear_2") if cross else \
            (["q", "k", "v"], "/linear_0", "/linear_1")
        if cross:
            self.linear(ct2 + "/linear_0", hf + ".q_proj")
        weight, bias = self.tensor(ct2 + fused + "/weight"), self.tensor(ct2 + fused + "/bias")
        if weight.shape[0] != len(parts) * weight.shape[1] or bias.shape != weight.shape[:1]:
            raise KeyError(f"{ct2}{fused}/weight (shape {weight.shape} is not {'+'.join(parts)} fused)")
        for part, w, b in zip(parts, np.split(weight, len(parts)), np.split(bias, len(parts))):
            self.sd[f"{hf}.{part}_proj.weight"] = w
            if part != "k":
                self.sd[f"{hf}.{part}_proj.bias"] = b
        self.linear(ct2 + out, hf + ".out_proj")


def _layer_count(variables: dict[str, np.ndarray], side: str, path: Path) -> int:
    found = {int(m.group(2)) for name in variables if (m := _LAYER.match(name)) and m.group(1) == side}
    if not found or found != set(range(len(found))):
        raise ValueError(f"{path}: {side} layers are {sorted(found)}, expected 0..n-1")
    return len(found)


def _hf_state_dict(variables: dict[str, np.ndarray],
                   path: Path) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Map ct2 variables to HF WhisperForConditionalGeneration names plus layer and head counts."""
    m = _Mapper(variables)
    dims = {f"{side}_layers": _layer_count(variables, side, path) for side in ("encoder", "decoder")}
    try:
        for name, expected in _EXPECTED_FLAGS.items():
            if name in variables and m.scalar(name) != expected:
                raise ValueError(f"{path}: {name} is {int(variables[name])}, Whisper needs {expected}")
        for side in ("encoder", "decoder"):
            dims[f"{side}_attention_heads"] = m.scalar(f"{side}/num_heads")
            m.sd[f"model.{side}.embed_positions.weight"] = m.tensor(f"{side}/position_encodings/encodings")
            m.norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
            for i in range(dims[f"{side}_layers"]):
                ct2, hf = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
                m.norm(ct2 + "/self_attention/layer_norm", hf + ".self_attn_layer_norm")
                m.attention(ct2 + "/self_attention", hf + ".self_attn", cross=False)
                if side == "decoder":
                    m.norm(ct2 + "/attention/layer_norm", hf + ".encoder_attn_layer_norm")
                    m.attention(ct2 + "/attention", hf + ".encoder_attn", cross=True)
                m.norm(ct2 + "/ffn/layer_norm", hf + ".final_layer_norm")
                m.linear(ct2 + "/ffn/linear_0", hf + ".fc1")
                m.linear(ct2 + "/ffn/linear_1", hf + ".fc2")
        m.linear("encoder/conv1", "model.encoder.conv1")
        m.linear("encoder/conv2", "model.encoder.conv2")
        embeddings = m.sd["model.decoder.embed_tokens.weight"] = m.tensor("decoder/embeddings/weight")
        projection = variables.get("decoder/projection/weight")
        if projection is not None and projection is not variables["decoder/embeddings/weight"]:
            projection = m.tensor("decoder/projection/weight")
            if not np.array_equal(projection, embeddings):
                m.sd["proj_out.weight"] = projection
        m.used.add("decoder/projection/weight")
    except KeyError as err:
        raise ValueError(f"{path}: missing or malformed variable {err.args[0]!r}") from None
    unexpected = set(variables) - m.used - _IGNORED
    if unexpected:
        raise ValueError(f"{path}: unexpected variables {sorted(unexpected)[:10]} ({len(unexpected)} in all)")
    return m.sd, dims


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read JSON ({err})") from err


def _build_tokenizer(tokenizer_json: Path, vocab_size: int) -> tuple[Any, dict[str, int]]:
    """WhisperTokenizerFast from a tokenizers BPE file; timestamp tokens appended when the model has them."""
    spec = _load_json(tokenizer_json)
    try:
        model = spec["model"]
        if model["type"] != "BPE" or not isinstance(model["vocab"], dict):
            raise TypeError("not a BPE model with a vocab mapping")
        ids = {t["content"]: int(t["id"]) for t in sorted(spec["added_tokens"], key=lambda t: t["id"])
               if t.get("special")}
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"{tokenizer_json}: not a usable Whisper tokenizer.json ({err})") from None
    tok = WhisperTokenizerFast(vocab=model["vocab"], merges=merges, pad_token="<|endoftext|>",
                               extra_special_tokens=list(ids))
    if tok.convert_tokens_to_ids(list(ids)) != list(ids.values()):
        raise ValueError(f"{tokenizer_json}: special tokens do not directly follow the BPE vocabulary")
    if missing := [t for t in _REQUIRED_SPECIALS if t not in ids]:
        raise ValueError(f"{tokenizer_json}: special tokens {missing} are missing")
    if max(ids.values()) >= vocab_size:
        raise ValueError(f"{tokenizer_json}: special token ids exceed the model vocabulary of {vocab_size}")
    if vocab_size - len(tok) == _NUM_TIMESTAMPS and ids["<|notimestamps|>"] == len(tok) - 1:
        tok.add_tokens([AddedToken(f"<|{i * 0.02:.2f}|>", lstrip=False, rstrip=False, normalized=False)
                        for i in range(_NUM_TIMESTAMPS)])
    return tok, ids


def _is_index_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(i) is int and i >= 0 for i in value)


def _ct2_config(config_json: Path, tok: Any, multilingual: bool) -> dict[str, Any]:
    """Generation settings from CTranslate2's config.json, validated against the tokenizer."""
    cfg = _load_json(config_json)
    if not isinstance(cfg, dict):
        raise ValueError(f"{config_json}: expected a JSON object")
    wanted = ["suppress_ids", "suppress_ids_begin"] + (["lang_ids"] if multilingual else [])
    for key in wanted:
        if not _is_index_list(cfg.get(key)):
            raise ValueError(f"{config_json}: {key!r} must be a list of non-negative integers")
    out: dict[str, Any] = {"suppress_tokens": cfg["suppress_ids"],
                           "begin_suppress_tokens": cfg["suppress_ids_begin"]}
    if "alignment_heads" in cfg:
        heads = cfg["alignment_heads"]
        if not isinstance(heads, list) or not all(_is_index_list(p) and len(p) == 2 for p in heads):
            raise ValueError(f"{config_json}: 'alignment_heads' must be a list of [layer, head] pairs")
        out["alignment_heads"] = heads
    if multilingual:
        langs = tok.convert_ids_to_tokens(cfg["lang_ids"])
        if not all(isinstance(t, str) and re.fullmatch(r"<\|[a-z]{2,3}\|>", t) for t in langs):
            raise ValueError(f"{config_json}: 'lang_ids' do not point at language tokens of the tokenizer")
        out["lang_to_id"] = dict(zip(langs, cfg["lang_ids"]))
    return out


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Move ``staging`` to ``out_dir``, swapping out an existing folder (restored if the move fails)."""
    if not out_dir.exists():
        os.replace(staging, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old.", dir=out_dir.parent))
    try:
        os.replace(out_dir, old / "previous")
        try:
            os.replace(staging, out_dir)
        except OSError:
            os.replace(old / "previous", out_dir)
            raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def ct2_to_hf(model_bin: str | os.PathLike, config_json: str | os.PathLike, tokenizer_json: str | os.PathLike,
              out_dir: str | os.PathLike, *, dtype: torch.dtype = torch.float32) -> Path:
    """Convert a CTranslate2 Whisper model into an offline-loadable Hugging Face folder.

    ``out_dir`` gets config.json, model.safetensors (weights in ``dtype``), generation_config.json,
    tokenizer files and preprocessor_config.json. Everything is written into a temporary sibling
    folder first and swapped in with ``os.replace``; an existing ``out_dir`` is replaced.
    Sizes (d_model, layers, ffn width, vocabulary, mel bins, positions) come from tensor shapes;
    the model counts as multilingual when its vocabulary has >= 51865 entries, as in OpenAI's code.
    """

    model_bin, out_dir = Path(model_bin), Path(out_dir)
    sd, dims = _hf_state_dict(read_ct2(model_bin), model_bin)
    d_model, num_mel_bins, _ = sd["model.encoder.conv1.weight"].shape
    vocab_size = sd["model.decoder.embed_tokens.weight"].shape[0]
    for side in ("encoder", "decoder"):
        if (heads := dims[f"{side}_attention_heads"]) <= 0 or d_model % heads:
            raise ValueError(f"{model_bin}: {side}/num_heads={heads} does not divide d_model={d_model}")
    multilingual = vocab_size >= _MULTILINGUAL_MIN_VOCAB
    tok, ids = _build_tokenizer(Path(tokenizer_json), vocab_size)
    settings = _ct2_config(Path(config_json), tok, multilingual)
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    token_ids = dict(decoder_start_token_id=sot, bos_token_id=eot, eos_token_id=eot, pad_token_id=eot)
    config = WhisperConfig(
        vocab_size=vocab_size, num_mel_bins=num_mel_bins, d_model=d_model, **dims, **token_ids,
        encoder_ffn_dim=sd["model.encoder.layers.0.fc1.weight"].shape[0],
        decoder_ffn_dim=sd["model.decoder.layers.0.fc1.weight"].shape[0],
        max_source_positions=sd["model.encoder.embed_positions.weight"].shape[0],
        max_target_positions=sd["model.decoder.embed_positions.weight"].shape[0],
        tie_word_embeddings="proj_out.weight" not in sd, suppress_tokens=settings["suppress_tokens"],
        begin_suppress_tokens=settings["begin_suppress_tokens"],
        architectures=["WhisperForConditionalGeneration"], dtype=dtype,
    )
    with torch.device("meta"):
        expected = WhisperForConditionalGeneration(config).state_dict()
    if config.tie_word_embeddings:
        expected.pop("proj_out.weight")
    for name in expected.keys() | sd.keys():
        if name not in sd or name not in expected or tuple(expected[name].shape) != sd[name].shape:
            raise ValueError(f"{model_bin}: tensor {name} does not fit the inferred WhisperConfig")
    if multilingual:
        # task="transcribe" replaces OpenAI's forced_decoder_ids: detect the language, then transcribe.
        settings |= {"task": "transcribe",
                     "task_to_id": {"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]}}
    generation = GenerationConfig(
        **token_ids, **settings, is_multilingual=multilingual, max_length=min(448, config.max_target_positions),
        no_timestamps_token_id=ids["<|notimestamps|>"], prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=50, return_timestamps=False,
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file({k: torch.from_numpy(v).to(dtype).contiguous() for k, v in sd.items()},
                  str(staging / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(staging)
        generation.save_pretrained(staging)
        tok.save_pretrained(staging)
        WhisperFeatureExtractor(feature_size=num_mel_bins).save_pretrained(staging)
        for written in [staging, *staging.iterdir()]:
            written.chmod(0o755 if written.is_dir() else 0o644)
        _replace_dir(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
