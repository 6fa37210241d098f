"""How much memory a model's weights take once loaded, read before loading it: from the safetensors headers of its
files on disk (a hub cache snapshot, a local folder, a converted pack) or, online, from the hub's own metadata.

The app uses it to default to the pairs that fit the machine (a free CPU Space has 16 GB), and to say what a pair
that does not fit will cost.
"""
from __future__ import annotations

import functools
import json
import math
import struct
from pathlib import Path

import huggingface_hub
import torch

from .availability import hub_reachable
from .catalog import ModelSpec, PairSpec
from .devices import torch_dtype

BYTES_PER_QUANTIZED = {"int8": 1.0, "4bit": 0.5, "dynamic_int8": 1.0, "w8a8": 1.0}


def _header(path: Path) -> dict:
    """The JSON header of a safetensors file: tensor name -> {dtype, shape, data_offsets}."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _in_encoder(name: str) -> bool:
    """Whether a checkpoint tensor belongs to the encoder (``model.encoder.…``; a decoder layer's cross-attention,
    ``…encoder_attn…``, does not)."""
    return "encoder" in name.split(".")


def _counts_from_headers(files: list[Path], decoder_only: bool) -> int:
    return sum(math.prod(info["shape"]) for path in files for name, info in _header(path).items()
               if name != "__metadata__" and not (decoder_only and _in_encoder(name)))


def _local_files(folder: Path) -> list[Path] | None:
    """Every safetensors shard of a folder (all of those its index names, or the single file), or None."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        return files if all(f.is_file() for f in files) else None
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def hub_snapshot(repo_id: str) -> Path | None:
    """The folder of `repo_id`'s weights in the Hugging Face cache (its snapshot, named by commit), or None."""
    for name in ("model.safetensors.index.json", "model.safetensors"):
        found = huggingface_hub.try_to_load_from_cache(repo_id, name)
        if isinstance(found, str):
            return Path(found).parent
    return None


@functools.lru_cache(maxsize=64)
def _hub_parameters(repo_id: str, decoder_only: bool) -> int | None:
    """Parameters of a hub repository not in the cache, from the hub's safetensors metadata (online only)."""
    if not hub_reachable()[0]:
        return None
    try:
        meta = huggingface_hub.get_safetensors_metadata(repo_id)
    except Exception:  # no safetensors, a gated repository, the network: the size is simply unknown
        return None
    return sum(math.prod(info.shape) for f in meta.files_metadata.values() for name, info in f.tensors.items()
               if not (decoder_only and _in_encoder(name)))


def checkpoint_files(spec: ModelSpec, folder: str) -> list[Path] | None:
    """The safetensors files a model was loaded from (`folder`: what transformers loaded, a hub id for the hub)."""
    root = hub_snapshot(spec.location) if spec.source == "hub" else Path(folder)
    return None if root is None else _local_files(root)


def parameters(spec: ModelSpec) -> int | None:
    """The number of parameters a model loads (a decoder-only load of an encoder-decoder checkpoint: its decoder's),
    counted from its weights' headers, else from the hub's metadata or the catalog's published count, else None."""
    folder: Path | None
    if spec.source == "hub":
        folder = hub_snapshot(spec.location)
        if folder is None:
            return _hub_parameters(spec.location, spec.decoder_only) or spec.parameters
    elif spec.source == "local":
        folder = Path(spec.location).expanduser()
    else:   # packs and GGUF files: converted at load; the project's own packs fit by design
        return None
    files = _local_files(folder)
    return spec.parameters if files is None else _counts_from_headers(files, spec.decoder_only)


def load_bytes(spec: ModelSpec, device: torch.device) -> int | None:
    """Bytes the model's weights take once loaded on `device`, at its dtype or quantization there; None when
    unknown."""
    spec = spec.on(device)
    count = parameters(spec)
    if count is None:
        return None
    per = BYTES_PER_QUANTIZED.get(spec.quantization)
    if per is None:
        per = torch.empty((), dtype=torch_dtype(spec.dtype, device)).element_size()
    return int(count * per)


def pair_fit(pair: PairSpec, budget_bytes: int, device: torch.device) -> tuple[bool, str]:
    """(fits, why): whether both models' weights fit in `budget_bytes` together. Unknown sizes fit."""
    sizes = [load_bytes(spec, device) for spec in (pair.target, pair.assistant) if spec is not None]
    if any(size is None for size in sizes):
        return True, "size unknown before loading"
    need = sum(sizes)
    if need <= budget_bytes:
        return True, f"{need / 1e9:.1f} GB of weights"
    offload = " (offloaded to disk: slow)" if pair.target.device_map else ""
    return False, (f"needs {need / 1e9:.1f} GB of weights, more than the {budget_bytes / 1e9:.1f} GB memory budget "
                   f"(ASSISTGEN_MEMORY_BUDGET_GB){offload}")
