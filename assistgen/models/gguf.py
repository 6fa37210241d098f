"""GGUF -> transformers safetensors cache, streamed tensor by tensor with bounded memory.

The GGUF header is parsed here (``gguf.GGUFReader`` spends ~20 s building views over a 150k-token
vocabulary); tensors are dequantized with ``gguf.quants`` and named with transformers' GGUF maps.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
from gguf.quants import dequantize
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, TokenizersBackend
from transformers.integrations import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

from .packs import build_folder
from .skeleton import check_filled, empty_model

Progress = Callable[[float, str], None]
Plan = list[tuple["TensorInfo", str, tuple[int, ...]]]

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
EXTRA_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
MARKER = "assistgen-conversion.json"
FORMAT_VERSION = 1
CHUNK_ELEMENTS = 1 << 22
_SAFETENSORS_DTYPE = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class TensorInfo:
    """One GGUF tensor: ``shape`` in torch order (rows first), ``offset`` absolute in the file."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    offset: int

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return self.shape[-1] // block * size


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        start, self.pos = self.pos, self.pos + length
        if self.pos > len(self.data):
            raise ValueError("GGUF string runs past the end of the file")
        return self.data[start : self.pos].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind != 9:
            raise ValueError(f"unknown GGUF value type {kind}")
        item_kind, count = self.take("<I"), self.take("<Q")
        if count > len(self.data) - self.pos:
            raise ValueError("GGUF array runs past the end of the file")
        if item_kind == 8:
            for _ in range(count):
                self.pos += 8 + self.take("<Q")
            return count
        return [self.value(item_kind) for _ in range(count)]


def read_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """Metadata (string arrays as their length) and tensor table of a GGUF file, no tensor data."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        if bytes(data[:4]) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, n_tensors, n_fields = cursor.take("<4x I"), cursor.take("<Q"), cursor.take("<Q")
        if version not in (2, 3):
            raise ValueError(f"{path}: unsupported GGUF version {version}")
        metadata = {}
        for _ in range(n_fields):
            key = cursor.string()
            metadata[key] = cursor.value(cursor.take("<I"))
        raw = []
        for _ in range(n_tensors):
            name = cursor.string()
            dims = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
            raw.append((name, tuple(reversed(dims)), GGMLQuantizationType(cursor.take("<I")), cursor.take("<Q")))
        alignment = int(metadata.get("general.alignment", 32))
        start = -(-cursor.pos // alignment) * alignment
    return metadata, [TensorInfo(name, shape, qtype, start + offset) for name, shape, qtype, offset in raw]


def config_from_metadata(metadata: dict[str, Any], tensor_names: list[str]) -> Any:
    """transformers config for the GGUF, built as ``load_gguf_checkpoint`` builds it (supported archs)."""
    arch = metadata["general.architecture"]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHITECTURES}")
    values: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in tensor_names}
    values.update(GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}))
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed not in (None, -1):
            values[renamed] = value
    if "vocab_size" not in values and isinstance(metadata.get("tokenizer.ggml.tokens"), int):
        values["vocab_size"] = metadata["tokenizer.ggml.tokens"]
    return AutoConfig.for_model(**values)


def _tokenizer(gguf_path: Path, model_type: str) -> Any:
    """The GGUF's tokenizer, built with the class AutoTokenizer would pick, without its slow config read."""
    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    cls = (tokenizer_class_from_name(name) if name else None) or TokenizersBackend
    return cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def _generation_config(config: Any, tokenizer: Any) -> Any:
    """Greedy defaults; every chat end token (e.g. Qwen's <|im_end|> and <|endoftext|>) stops."""
    eos = [config.eos_token_id] if isinstance(config.eos_token_id, int) else list(config.eos_token_id or [])
    vocab = tokenizer.get_vocab()
    eos += [vocab[token] for token in EXTRA_EOS_TOKENS if token in vocab and vocab[token] not in eos]
    return GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=eos,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else eos[0],
        do_sample=False,
    )


def hf_names(model: torch.nn.Module, arch: str, processor: Any) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, as ``get_gguf_hf_weights_map`` maps top-level names.

    That function rebuilds gguf's name table for every submodule (~15 s); the flat models
    supported here need it once.
    """
    gguf_arch = next(key for key, value in MODEL_ARCH_NAMES.items() if value == arch)
    table = get_tensor_name_map(gguf_arch, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        hf_name = processor.preprocess_name(hf_name)
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = table.get_name(base) if suffix in ("weight", "bias") else None
        if gguf_base is not None:
            names[f"{gguf_base}.{suffix}"] = hf_name
    return names


def _weight_plan(config: Any, arch: str, tensors: list[TensorInfo]) -> tuple[Any, Plan]:
    """Tensor processor and ``(gguf tensor, hf name, hf shape)`` for every tensor the model takes."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    config.architectures = [type(model).__name__]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = hf_names(model, arch, processor)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    plan = [(info, names[info.name], shapes[names[info.name]]) for info in tensors if info.name in names]
    missing = set(shapes) - {hf for _, hf, _ in plan}
    if config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"GGUF lacks tensors for {sorted(missing)}")
    for info, hf, shape in plan:
        if int(np.prod(info.shape)) != int(np.prod(shape)):
            raise ValueError(f"{info.name}: GGUF shape {info.shape} does not fit {hf} {shape}")
    return processor, plan


def _dequantized(fd: int, info: TensorInfo, processor: Any) -> Iterator[np.ndarray]:
    """Float32 values of one tensor in row order: chunks of rows, or the whole tensor if it is processed."""
    rows = int(np.prod(info.shape[:-1]))
    whole = type(processor) is not TensorProcessor
    step = rows if whole else max(1, CHUNK_ELEMENTS // info.shape[-1])
    for first in range(0, rows, step):
        count = min(step, rows - first)
        raw = bytearray(os.pread(fd, count * info.row_bytes, info.offset + first * info.row_bytes))
        if len(raw) != count * info.row_bytes:
            raise ValueError(f"{info.name}: tensor data runs past the end of the file")
        values = dequantize(np.frombuffer(raw, np.uint8).reshape(count, info.row_bytes), info.qtype)
        if whole:
            values = np.asarray(processor.process(weights=values.reshape(info.shape), name=info.name).weights)
        yield np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _write_safetensors(gguf_path: Path, out: Path, plan: Plan, processor: Any, dtype: torch.dtype,
                       progress: Progress) -> None:
    """Stream every planned tensor into one safetensors file, holding at most one tensor in memory."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for _, hf, shape in plan:
        size = int(np.prod(shape)) * itemsize
        header[hf] = {"dtype": _SAFETENSORS_DTYPE[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    total = sum(int(np.prod(shape)) for _, _, shape in plan)
    done = 0
    fd = os.open(gguf_path, os.O_RDONLY)
    try:
        with open(out, "wb") as f:
            f.write(struct.pack("<Q", len(encoded)) + encoded)
            for info, hf, shape in plan:
                progress(done / total, f"dequantizing {hf}")
                for chunk in _dequantized(fd, info, processor):
                    tensor = torch.from_numpy(chunk).to(dtype)
                    f.write(memoryview(tensor.view(torch.uint8).numpy()))
                done += int(np.prod(shape))
    finally:
        os.close(fd)


def _marker(gguf_path: Path, dtype: torch.dtype) -> dict[str, Any]:
    return {"version": FORMAT_VERSION, "gguf": gguf_path.name, "gguf_size": gguf_path.stat().st_size,
            "dtype": str(dtype).removeprefix("torch.")}


def is_converted(gguf_path: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``out_dir`` holds a complete conversion of this GGUF in this dtype."""
    try:
        return json.loads((Path(out_dir) / MARKER).read_text()) == _marker(Path(gguf_path), dtype)
    except (OSError, ValueError):
        return False


def gguf_to_hf(gguf_path: Path, out_dir: Path, *, dtype: torch.dtype = torch.float32,
               progress: Progress | None = None) -> Path:
    """Convert a GGUF into a transformers folder (config, generation config, safetensors, tokenizer).

    Weights are dequantized to ``dtype``. The folder appears atomically; concurrent callers wait
    on a lock and reuse the finished conversion.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    report = progress or (lambda fraction, message: None)
    if dtype not in _SAFETENSORS_DTYPE:
        raise ValueError(f"unsupported dtype {dtype}")

    def write(tmp: Path) -> None:
        report(0.0, "reading GGUF header")
        metadata, tensors = read_header(gguf_path)
        config = config_from_metadata(metadata, [t.name for t in tensors])
        processor, plan = _weight_plan(config, metadata["general.architecture"], tensors)
        config.dtype = dtype
        _write_safetensors(gguf_path, tmp / "model.safetensors", plan, processor, dtype, report)
        report(1.0, "writing tokenizer")
        tokenizer = _tokenizer(gguf_path, config.model_type)
        tokenizer.model_max_length = config.max_position_embeddings
        tokenizer.save_pretrained(tmp)
        config.save_pretrained(tmp)
        _generation_config(config, tokenizer).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(_marker(gguf_path, dtype)))
    build_folder(out_dir, lambda: is_converted(gguf_path, out_dir, dtype), write)
    report(1.0, "done")
    return out_dir


_TORCH_DTYPE = {name: dtype for dtype, name in _SAFETENSORS_DTYPE.items()}


def map_safetensors(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors file as views of a read-only memory map (no copy, no read), in ``dtype``.

    A tensor stored in another dtype is converted, which copies it.
    """
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        header.pop("__metadata__", None)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": the weights are never written in place
        buffer = torch.frombuffer(mapped, dtype=torch.uint8)
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if 8 + length + end > len(mapped):
            raise ValueError(f"{path}: {name} is truncated")
        tensor = buffer[8 + length + begin:8 + length + end].view(_TORCH_DTYPE[entry["dtype"]]).view(entry["shape"])
        tensors[name] = tensor if tensor.dtype == dtype else tensor.to(dtype)
    return tensors


def load_cached(out_dir: Path, dtype: torch.dtype = torch.float32, *, tokenizer: bool = True) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a converted folder, in eval mode, in seconds (the tokenizer None unless asked).

    The weights are views of a memory map: call ``assistgen.cpu.materialize`` (the loader does) to move them into
    process memory, where the page cache cannot evict them mid-generation.
    """
    out_dir = Path(out_dir)
    state_dict: dict[str, torch.Tensor] = {}
    for file in sorted(out_dir.glob("*.safetensors")):
        state_dict.update(map_safetensors(file, dtype))
    config = AutoConfig.from_pretrained(out_dir)
    model = empty_model(MODEL_FOR_CAUSAL_LM_MAPPING[type(config)], config, dtype)  # filled by the mapped tensors
    if config.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)
    model.load_state_dict(state_dict, assign=True, strict=not config.tie_word_embeddings)
    if config.tie_word_embeddings:
        model.tie_weights()
    check_filled(model)
    model.config._name_or_path = model.name_or_path = str(out_dir)
    model.generation_config = GenerationConfig.from_pretrained(out_dir)
    return model.eval(), AutoTokenizer.from_pretrained(out_dir) if tokenizer else None
