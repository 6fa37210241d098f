"""The cache of converted weights: an offline pack assembled, verified and converted once into a transformers
folder, and next to that conversion what later loads map instead of recomputing (a model's int8 weights, its
oneDNN-packed linear layers), each stamped with the conversion it was made from."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch

from . import packed, quantized
from .catalog import TORCH_INT8, Catalog, ModelSpec
from .cpu import onednn_enabled
from .ct2 import ct2_to_hf
from .devices import torch_dtype
from .gguf import MARKER, gguf_to_hf, is_converted
from .packs import _stamped_sha256, assemble, cache_dir, file_lock
from .sizing import hub_snapshot

Progress = Callable[[float, str], None]
CONVERSION_MARKER = MARKER   # in a converted pack's folder (GGUF or CTranslate2): what it was converted from
WEIGHTS = "model.safetensors"                      # a converted pack's float weights, in one file


def pack_dtype(spec: ModelSpec, device: torch.device) -> torch.dtype:
    """The dtype a pack is converted to: the model's own, float16 kept as float32 on disk (cast at load)."""
    dtype = torch_dtype(spec.dtype, device)
    return dtype if dtype != torch.float16 else torch.float32


def conversion_folder(spec: ModelSpec, catalog: Catalog, device: torch.device) -> Path:
    """Where a pack model's conversion lives in the cache (its int8 copies and packed layers beside it)."""
    return _pack_paths(spec, catalog, pack_dtype(spec, device))[1]


def _pack_paths(spec: ModelSpec, catalog: Catalog, dtype: torch.dtype) -> tuple[dict[str, Path], Path]:
    """Where a pack's assembled files and its converted folder live in the cache."""
    pack = catalog.packs[spec.location]
    suffix = "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"
    files = {file.name: cache_dir() / "packs" / pack.name / file.name for file in pack.files}
    return files, cache_dir() / "models" / f"{pack.name}{suffix}"


def _ct2_marker(spec: ModelSpec, catalog: Catalog, dtype: torch.dtype) -> dict:
    return {"model.bin": catalog.packs[spec.location].files[0].sha256, "dtype": str(dtype)}


def _converted(spec: ModelSpec, catalog: Catalog, dtype: torch.dtype, files: dict[str, Path], out_dir: Path) -> bool:
    """Whether `out_dir` holds a finished conversion of these assembled files, by its marker."""
    if catalog.packs[spec.location].format == "gguf":
        return is_converted(next(iter(files.values())), out_dir, dtype)
    try:
        return json.loads((out_dir / CONVERSION_MARKER).read_text()) == _ct2_marker(spec, catalog, dtype)
    except (OSError, ValueError):
        return False


def pack_ready(spec: ModelSpec, catalog: Catalog, device: torch.device) -> bool:
    """Whether a pack model is in the cache as it loads (assembled, verified, converted, and stored in int8 when it
    runs so), so that a load converts nothing. Reads markers and stamps only."""
    dtype = pack_dtype(spec, device)
    files, out_dir = _pack_paths(spec, catalog, dtype)
    for file in catalog.packs[spec.location].files:
        stamp = _stamped_sha256(files[file.name])
        if stamp is None or (file.sha256 is not None and stamp != file.sha256.lower()):
            return False
    if not _converted(spec, catalog, dtype, files, out_dir):
        return False
    # The packed linear layers are not asked for: a cache without them (made before they were stored, or on a full
    # disk) loads by packing at each load, as it did, rather than sending every load to a child to try again.
    if loads_int8_copy(spec, device):
        return int8_stored(out_dir, spec)
    return float_weights_kept(out_dir)


def convert_pack(spec: ModelSpec, catalog: Catalog, dtype: torch.dtype, progress: Progress) -> tuple[Path, bool]:
    """Assemble the pack's files (sha256-verified) and convert them once into a transformers folder.

    Returns the folder, and whether it was converted now (False: it was already in the cache).
    """
    pack = catalog.packs[spec.location]
    paths, out_dir = _pack_paths(spec, catalog, dtype)
    files = {}
    for i, file in enumerate(pack.files):
        progress(0.05 + 0.25 * i / len(pack.files), f"{spec.name}: assembling and verifying {file.name}")
        files[file.name] = assemble(file, paths[file.name].parent)
    if _converted(spec, catalog, dtype, files, out_dir):
        if float_weights_kept(out_dir) or not float_weights_needed(spec, out_dir):
            return out_dir, False
        _forget_conversion(out_dir)   # its float weights were dropped and this model loads them: convert again
    if pack.format == "gguf":
        (gguf_path,) = files.values()
        return gguf_to_hf(gguf_path, out_dir, dtype=dtype, progress=lambda f, m: progress(
            0.3 + 0.5 * f, f"{spec.name}: converting ({m})")), True
    with file_lock(out_dir.parent / f"{out_dir.name}.lock"):
        if _converted(spec, catalog, dtype, files, out_dir):  # another process finished it while we waited
            return out_dir, False
        progress(0.4, f"{spec.name}: converting CTranslate2 weights")
        ct2_to_hf(files["model.bin"], files["config.json"], files["tokenizer.json"], out_dir, dtype=dtype)
        (out_dir / CONVERSION_MARKER).write_text(json.dumps(_ct2_marker(spec, catalog, dtype)))
    return out_dir, True


def loads_int8_copy(spec: ModelSpec, device: torch.device) -> bool:
    """Whether `spec` loads from an int8 copy stored beside its conversion (torch's int8 kinds, on a CPU)."""
    return spec.quantization in TORCH_INT8 and device.type == "cpu"


def float_weights_kept(folder: Path) -> bool:
    """Whether a conversion's float weights are on disk (`drop_float_weights` removes them)."""
    return (folder / WEIGHTS).is_file()


def float_weights_needed(spec: ModelSpec, folder: Path) -> bool:
    """Whether loading `spec` reads the float weights of its conversion in `folder`: every model does, but one that
    loads the int8 copy stored beside them."""
    return not (spec.quantization in TORCH_INT8 and int8_stored(folder, spec))


def drop_float_weights(folder: Path) -> int:
    """Remove a conversion's float weights, keeping its config, tokenizer and marker (what its int8 copies are
    stamped with and load beside); returns the bytes freed. A later load that needs them converts again, to the same
    marker, so the int8 copies stay valid."""
    weights = folder / WEIGHTS
    with file_lock(folder.parent / f"{folder.name}.lock"):
        try:
            size = weights.stat().st_size
            weights.unlink()
        except FileNotFoundError:
            return 0
    return size


def _forget_conversion(folder: Path) -> None:
    """Make a conversion whose float weights were dropped look unconverted, so that the converter rebuilds it."""
    with file_lock(folder.parent / f"{folder.name}.lock"):
        if not float_weights_kept(folder):
            (folder / CONVERSION_MARKER).unlink(missing_ok=True)


def packs_onednn(spec: ModelSpec, device: torch.device) -> bool:
    """Whether a model's linear layers are packed into oneDNN's layout at load (fp32 on the CPU, wholly in memory)."""
    return (device.type == "cpu" and spec.quantization == "none" and not spec.device_map
            and torch_dtype(spec.dtype, device) == torch.float32 and onednn_enabled())


def packed_stored(folder: Path) -> bool:
    """Whether the cache holds oneDNN-packed linear weights of this very float conversion, for this CPU and torch."""
    try:
        source = json.loads((folder / CONVERSION_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return packed.is_stored(packed.packed_folder(folder), source)


def store_packed(model, folder: Path) -> int:
    """Store a loaded model's packed linear weights next to its conversion (once; `prepare` does it)."""
    with file_lock(folder.parent / f"{folder.name}-onednn.lock"):
        if packed_stored(folder):
            return 0
        return packed.store(model, packed.packed_folder(folder), json.loads((folder / CONVERSION_MARKER).read_text()))


def int8_folder(folder: Path, spec: ModelSpec) -> Path:
    """Where the int8 weights of `spec`, quantized from the float conversion in `folder`, are stored: a decoder-only
    model (a Whisper's decoder without its encoder) apart from the whole model, each quantization apart."""
    return folder.with_name(f"{folder.name}-{'decoder-' if spec.decoder_only else ''}{spec.quantization}")


def int8_stored(folder: Path, spec: ModelSpec) -> bool:
    """Whether the cache holds `spec`'s int8 weights quantized from this very float conversion (a pack's in
    `folder`) or hub snapshot."""
    try:
        stored = int8_copy(spec, folder)
    except (OSError, ValueError):
        return False
    return stored is not None and quantized.is_stored(*stored)


def int8_model(spec: ModelSpec, folder: Path, model_class, float_model, progress: Progress):
    """The model in one of torch's int8 kinds (`quantized.LAYERS`): from the cache's stored int8 tensors when they
    were made from this very float conversion; else quantized now and stored (a pack's conversion only: other sources
    quantize at each load)."""
    layer = quantized.LAYERS[spec.quantization]
    stored = int8_copy(spec, folder)
    if stored is None:
        return quantized.quantize(float_model(), layer)
    out_dir, source = stored
    if quantized.is_stored(out_dir, source):
        progress(0.85, f"{spec.name}: loading the stored int8 weights")
        return quantized.load(out_dir, model_class, layer)
    progress(0.85, f"{spec.name}: quantizing to int8 (once; stored in the cache)")
    model = quantized.quantize(float_model(), layer)
    quantized.store(model, out_dir, source)
    return model


def int8_copy(spec: ModelSpec, folder: Path | str) -> tuple[Path, dict] | None:
    """(where `spec`'s int8 copy is stored, what it is stamped with) for a model whose float weights are a pack's
    conversion in `folder` or a hub snapshot in the Hugging Face cache (a snapshot's commit names its files for good);
    None for other sources, which quantize at each load."""
    if spec.source == "pack":
        marker = Path(folder) / CONVERSION_MARKER
        return (int8_folder(Path(folder), spec), json.loads(marker.read_text())) if marker.is_file() else None
    if spec.source == "hub":
        snapshot = hub_snapshot(spec.location)
        if snapshot is None:
            return None
        name = f"hub--{spec.location.replace('/', '--')}-{'decoder-' if spec.decoder_only else ''}{spec.quantization}"
        return cache_dir() / "models" / name, {"hub": spec.location, "commit": snapshot.name,
                                               "weights": _content_names(snapshot)}
    return None


def _content_names(snapshot: Path) -> list[str]:
    """What names a snapshot's weights by their content: the hub cache's blob of each safetensors file (its sha256),
    or, for a file that is no link into the blobs, its size and modification time."""
    names = []
    for path in sorted(snapshot.glob("*.safetensors")):
        blob = Path(os.path.realpath(path))
        names.append(blob.name if blob != path.absolute() else f"{path.name}:{path.stat().st_size}:"
                     f"{path.stat().st_mtime_ns}")
    return names


def weights_folder(spec: ModelSpec, catalog: Catalog, device: torch.device, dtype: torch.dtype,
                    progress: Progress) -> str:
    """The folder (or hub id) transformers loads from: a pack or a GGUF file converted into the cache first."""
    if spec.source == "pack":
        return str(convert_pack(spec, catalog, pack_dtype(spec, device), progress)[0])
    if spec.source == "gguf":
        path = Path(spec.location).expanduser()
        return str(gguf_to_hf(path, cache_dir() / "models" / f"{path.stem}-{str(dtype)[6:]}", dtype=dtype))
    return spec.location if spec.source == "hub" else str(Path(spec.location).expanduser())
