"""oneDNN-packed linear weights kept in the cache, so that a load reads them instead of packing them again.

Packing a model's linear layers into oneDNN's blocked layout (`cpu.OneDNNLinear`) takes seconds of every load,
CPU-bound, most of it in page faults. The packed bytes depend only on the weights, the layout asked for,
the CPU's instruction set and the torch build; `prepare` stores them once, next to the converted model, with those
facts in a marker. A load whose facts match maps the file and wraps each layer's bytes as the same oneDNN tensor
(`use_stored`); one whose facts differ packs as before. The same bytes, so the same outputs.
"""
from __future__ import annotations

import base64
import ctypes
import ctypes.util
import json
import mmap
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from .cpu import PACKED_FOR_ROWS, OneDNNLinear, blob_tensors_available, mkldnn_tensor_from_blob, onednn_available

FORMAT_VERSION = 1
MARKER = "assistgen-onednn.json"
DATA = "linears.bin"
ALIGN = 4096


def packed_folder(folder: Path) -> Path:
    return Path(folder).with_name(f"{Path(folder).name}-onednn")


def _facts(source: dict) -> dict:
    """What the packed bytes depend on: a store made under other facts is not used."""
    return {"version": FORMAT_VERSION, "source": source, "torch": torch.__version__,
            "cpu": torch.backends.cpu.get_cpu_capability(), "packed_for_rows": PACKED_FOR_ROWS}


def _read_marker(out_dir: Path) -> dict | None:
    try:
        return json.loads((Path(out_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_stored(out_dir: Path, source: dict) -> bool:
    """Whether `out_dir` holds packed weights made from this very conversion, on this kind of CPU and torch."""
    marker = _read_marker(out_dir)
    if marker is None or marker.get("facts") != _facts(source):
        return False
    try:
        return (Path(out_dir) / DATA).stat().st_size == marker["bytes"]
    except (OSError, KeyError):
        return False


def _packed_linears(model: nn.Module) -> dict[str, OneDNNLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, OneDNNLinear)}


def store(model: nn.Module, out_dir: Path, source: dict) -> int:
    """Write every OneDNNLinear's packed weight of `model` to `out_dir`, the marker last; returns how many."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)
    index, offset = {}, 0
    tmp = out_dir / f"{DATA}.tmp"
    with open(tmp, "wb") as f:
        for name, module in _packed_linears(model).items():
            weight = module.weight
            nbytes = torch.ops.mkldnn._nbytes(weight)
            metadata = torch.ops.mkldnn._get_mkldnn_serialized_md(weight).numpy().tobytes()
            f.seek(offset)
            f.write(memoryview((ctypes.c_char * nbytes).from_address(torch.ops.mkldnn.data_ptr(weight))))
            index[name] = {"offset": offset, "nbytes": nbytes, "shape": list(weight.shape),
                           "metadata": base64.b64encode(metadata).decode()}
            offset += -(-nbytes // ALIGN) * ALIGN
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_dir / DATA)
    (out_dir / MARKER).write_text(json.dumps({"facts": _facts(source), "bytes": offset, "layers": index}))
    return len(index)


def use_stored(model: nn.Module, out_dir: Path) -> int:
    """Swap the model's ``nn.Linear`` layers named in the store for OneDNNLinear on the stored bytes; returns how
    many. Call only after `is_stored`. A layer the store names must be a plain ``nn.Linear`` of the stored shape,
    else ValueError, before anything is swapped; one the model keeps in another dtype than float32 is left as it is.

    The file is mapped read-only and private, every page populated at once from the page cache (a small
    fraction of the time a copy or a packing would take), and locked in memory where the system allows it, so
    that no pass waits for a page read back from disk; where it does not, the kernel may drop pages under memory
    pressure and read them back (the speed probe reports a slowed run). Passes run as fast as on packed copies."""
    marker = _read_marker(out_dir)
    layers = marker["layers"]
    with open(Path(out_dir) / DATA, "rb") as f:
        mapped = mmap.mmap(f.fileno(), marker["bytes"], flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # not writable: only ever read
        data = torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the map open as long as a layer uses it
    _lock_in_memory(data)
    swaps = []
    for name, entry in layers.items():
        parent_name, _, child_name = name.rpartition(".")
        child = getattr(model.get_submodule(parent_name), child_name)
        if isinstance(child, nn.Linear) and child.weight.dtype != torch.float32:
            continue   # the model keeps this layer in another precision (`precision.cast_encoder`): not packed
        if type(child) is not nn.Linear or list(child.weight.shape) != entry["shape"]:
            raise ValueError(f"packed store does not fit the model at {name}")
        backing = data[entry["offset"]:entry["offset"] + entry["nbytes"]]
        weight = mkldnn_tensor_from_blob(backing, entry["shape"], base64.b64decode(entry["metadata"]))
        swaps.append((parent_name, child_name, OneDNNLinear(child, weight, backing)))
    for parent_name, child_name, module in swaps:
        setattr(model.get_submodule(parent_name), child_name, module)
    return len(swaps)


def _lock_in_memory(data: torch.Tensor) -> bool:
    """mlock the mapped bytes (best effort: an unprivileged process's limit is usually a few MB)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        return libc.mlock(ctypes.c_void_p(data.data_ptr()), ctypes.c_size_t(data.numel())) == 0
    except (OSError, AttributeError):
        return False


def can_store() -> bool:
    return onednn_available() and blob_tensors_available()
