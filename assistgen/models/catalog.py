"""`models.yaml`, loaded once into frozen dataclasses and validated; every error names the file, the entry and the key."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..choices import DRAFT_SOURCES, MAX_NEW_TOKENS_RANGE, SCHEDULE_NAMES, TASKS, WINDOW_RANGE
from ..config import from_env
from .packs import PackFile, PackPart

PROMPT_STYLES = ("chat_template", "instruction", "plain", "asr")
SOURCES = ("pack", "hub", "local", "gguf")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8", "4bit", "dynamic_int8", "w8a8")
TORCH_INT8 = ("dynamic_int8", "w8a8")   # torch's int8 kinds (CPU, `models.quantized`), stored once in the cache
ENCODER_DTYPES = ("bfloat16",)   # models.precision: where the CPU multiplies it in hardware, else the model's dtype
PACK_FORMATS = ("gguf", "ct2_whisper")
DEVICE_TYPES = ("cpu", "cuda")
BY_HARDWARE = ("dtype", "quantization", "encoder_dtype")   # what a model's `cpu:` mapping may set for a CPU
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "models.yaml"


class CatalogError(ValueError):
    """A bad catalog entry. The message names the file, the entry and the key."""


@dataclass(frozen=True)
class Pack:
    name: str
    format: str
    files: tuple[PackFile, ...]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str            # one of SOURCES
    location: str          # pack name, hub id, folder or GGUF path
    dtype: str = "auto"
    quantization: str = "none"
    device_map: str | None = None
    max_memory: tuple[tuple[str, str], ...] = ()   # accelerate's cap per device, e.g. (("cpu", "2GiB"),)
    offload_folder: str | None = None              # in the assistgen cache: where weights over the cap go
    eos_token_ids: tuple[int, ...] = ()
    decoder_only: bool = False      # load only the decoder (a distil-Whisper assistant sharing the target's encoder)
    encoder_dtype: str | None = None   # an encoder-decoder's encoder in bfloat16 on a CPU that computes it natively
    parameters: int | None = None   # the published count (as loaded: a decoder_only model's decoder), for sizes and
                                    # estimates before its weights are downloaded
    languages: tuple[str, ...] = ()   # the only languages it was trained on (distil-Whisper: English), whatever its
                                      # tokenizer knows; empty: what its tokenizer says
    on_cpu: ModelSpec | None = None   # the same model as it runs on a CPU (the entry's `cpu:` keys applied), if other

    def on(self, device) -> ModelSpec:
        """The model as it runs on `device` (a torch.device or its type): its CPU recipe on a CPU, else as written."""
        kind = device if isinstance(device, str) else device.type
        return self.on_cpu if kind == "cpu" and self.on_cpu is not None else self


@dataclass(frozen=True)
class PairSpec:
    name: str
    description: str
    tasks: tuple[str, ...]
    target: ModelSpec
    assistant: ModelSpec | None
    prompt_style: str
    max_new_tokens: int = 128
    num_assistant_tokens: int = 5
    schedule: str = "heuristic"
    draft_source: str = "assistant"
    default_on: tuple[str, ...] = DEVICE_TYPES   # the device types where it may be its tasks' default
    click_s: tuple[tuple[str, float], ...] = ()   # (hardware, estimated seconds a click takes there)


@dataclass(frozen=True)
class Catalog:
    path: Path
    packs: dict[str, Pack] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    pairs: tuple[PairSpec, ...] = ()

    def pair(self, name: str) -> PairSpec:
        for pair in self.pairs:
            if pair.name == name:
                return pair
        raise KeyError(f"unknown pair {name!r}; choose from: {', '.join(p.name for p in self.pairs)}")

    def pairs_for(self, task: str) -> list[PairSpec]:
        return [pair for pair in self.pairs if task in pair.tasks]


class _Where:
    """Builds error messages that point at the file, the entry and the key."""

    def __init__(self, path: Path, entry: str):
        self.path, self.entry = path, entry

    def error(self, key: str | None, problem: str) -> CatalogError:
        at = f"{self.entry}, key {key!r}" if key else self.entry
        return CatalogError(f"{self.path}: {at}: {problem}")

    def mapping(self, value: Any, key: str | None = None) -> dict:
        if not isinstance(value, dict):
            raise self.error(key, f"expected a mapping, got {type(value).__name__}")
        return value

    def get(self, data: dict, key: str, kind: type | tuple, default: Any = ..., choices: tuple | None = None) -> Any:
        if key not in data:
            if default is ...:
                raise self.error(key, "is required")
            return default
        value = data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.error(key, f"expected {names}, got {value!r}")
        if choices is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(map(str, choices))}")
        return value

    def unknown_keys(self, data: dict, allowed: set[str]) -> None:
        extra = sorted(set(data) - allowed)
        if extra:
            raise self.error(extra[0], f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _parts(where: _Where, raw: Any) -> tuple[PackPart, ...]:
    if isinstance(raw, dict):  # a numbered series: {package: "name-part{n}", path: "data/part{n:02d}.bin", count: N}
        where.unknown_keys(raw, {"package", "path", "count"})
        package, path = where.get(raw, "package", str), where.get(raw, "path", str)
        count = where.get(raw, "count", int)
        if count < 1:
            raise where.error("count", f"must be >= 1, got {count}")
        try:
            return tuple(PackPart(package.format(n=n), path.format(n=n)) for n in range(1, count + 1))
        except (KeyError, IndexError, ValueError) as exc:
            raise where.error("parts", f"bad template ({exc}); use {{n}} for the part number") from None
    if not isinstance(raw, list) or not raw:
        raise where.error("parts", "expected a non-empty list of {package, path} or a numbered series")
    parts = []
    for item in raw:
        item = where.mapping(item, "parts")
        where.unknown_keys(item, {"package", "path"})
        parts.append(PackPart(where.get(item, "package", str), where.get(item, "path", str)))
    return tuple(parts)


def _pack(path: Path, name: str, raw: Any) -> Pack:
    where = _Where(path, f"pack {name!r}")
    raw = where.mapping(raw)
    where.unknown_keys(raw, {"format", "files"})
    files = []
    for i, item in enumerate(where.get(raw, "files", list)):
        file_where = _Where(path, f"pack {name!r}, file {i + 1}")
        item = file_where.mapping(item)
        file_where.unknown_keys(item, {"name", "sha256", "parts"})
        sha = file_where.get(item, "sha256", str)
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise file_where.error("sha256", f"expected 64 lowercase hex digits, got {sha!r}")
        files.append(PackFile(file_where.get(item, "name", str), _parts(file_where, item.get("parts")), sha))
    if not files:
        raise where.error("files", "needs at least one file")
    return Pack(name, where.get(raw, "format", str, choices=PACK_FORMATS), tuple(files))


def _model(path: Path, name: str, raw: Any, packs: dict[str, Pack]) -> ModelSpec:
    """A model entry; its `cpu:` mapping (the numerics it runs in on a CPU: `BY_HARDWARE`) is validated as the whole
    entry with those keys replaced, and kept as the spec's `on_cpu`."""
    where = _Where(path, f"model {name!r}")
    raw = where.mapping(raw)
    if "cpu" not in raw:
        return _model_entry(path, name, raw, packs)
    on_cpu = where.mapping(raw["cpu"], "cpu")
    where.unknown_keys(on_cpu, set(BY_HARDWARE))
    base = {key: value for key, value in raw.items() if key != "cpu"}
    cpu = _model_entry(path, name, {**base, **on_cpu}, packs, f"model {name!r} on a CPU (its 'cpu' keys applied)")
    spec = _model_entry(path, name, base, packs)
    return spec if cpu == spec else replace(spec, on_cpu=cpu)


def _model_entry(path: Path, name: str, raw: dict, packs: dict[str, Pack], entry: str | None = None) -> ModelSpec:
    where = _Where(path, entry or f"model {name!r}")
    where.unknown_keys(raw, set(SOURCES) | {"dtype", "quantization", "device_map", "max_memory", "offload_folder",
                                           "eos_token_ids", "decoder_only", "encoder_dtype", "parameters",
                                           "languages"})
    sources = [s for s in SOURCES if s in raw]
    if len(sources) != 1:
        raise where.error(None, f"needs exactly one source key out of {', '.join(SOURCES)}; found {sources or 'none'}")
    source = sources[0]
    location = where.get(raw, source, str)
    if source == "pack" and location not in packs:
        raise where.error("pack", f"no pack named {location!r} (packs: {', '.join(packs) or 'none'})")
    max_memory = where.mapping(raw.get("max_memory", {}), "max_memory")
    for device, size in max_memory.items():
        if not isinstance(size, str) or not re.fullmatch(r"\d+(\.\d+)?\s*[KMGT]i?B", size):
            raise where.error("max_memory", f"{device}: expected a size such as '2GiB' or '500MB', got {size!r}")
    if max_memory and not raw.get("device_map"):
        raise where.error("max_memory", "a memory cap needs device_map (e.g. device_map: auto)")
    eos = where.get(raw, "eos_token_ids", list, default=[])
    if not all(isinstance(e, int) and e >= 0 for e in eos):
        raise where.error("eos_token_ids", f"expected a list of token ids, got {eos!r}")
    encoder_dtype = where.get(raw, "encoder_dtype", str, default=None, choices=ENCODER_DTYPES)
    if encoder_dtype and raw.get("decoder_only"):
        raise where.error("encoder_dtype", "a decoder_only model has no encoder to run in another dtype")
    if encoder_dtype and (raw.get("quantization", "none") != "none" or raw.get("device_map")):
        raise where.error("encoder_dtype", "applies to a float model wholly in memory: not with quantization or "
                                           "device_map")
    parameters = where.get(raw, "parameters", int, default=None)
    if parameters is not None and parameters < 1:
        raise where.error("parameters", f"must be a positive count, got {parameters}")
    languages = where.get(raw, "languages", list, default=[])
    if not all(isinstance(code, str) and code for code in languages):
        raise where.error("languages", f"expected a list of language codes such as [en], got {languages!r}")
    return ModelSpec(name=name, source=source, location=location,
                     dtype=where.get(raw, "dtype", str, default="auto", choices=DTYPES),
                     quantization=where.get(raw, "quantization", str, default="none", choices=QUANTIZATIONS),
                     device_map=where.get(raw, "device_map", str, default=None),
                     max_memory=tuple((str(device), size) for device, size in max_memory.items()),
                     offload_folder=where.get(raw, "offload_folder", str, default=None),
                     eos_token_ids=tuple(eos), decoder_only=where.get(raw, "decoder_only", bool, default=False),
                     encoder_dtype=encoder_dtype, parameters=parameters, languages=tuple(languages))


def _pair(path: Path, index: int, raw: Any, models: dict[str, ModelSpec]) -> PairSpec:
    where = _Where(path, f"pair {index + 1}")
    raw = where.mapping(raw)
    name = where.get(raw, "name", str)
    where = _Where(path, f"pair {name!r}")
    where.unknown_keys(raw, {"name", "description", "tasks", "target", "assistant", "prompt_style", "defaults",
                             "default_on", "click_s"})
    tasks = where.get(raw, "tasks", list)
    if not tasks or any(task not in TASKS for task in tasks):
        raise where.error("tasks", f"expected a non-empty list out of {', '.join(TASKS)}, got {tasks!r}")

    def model(key: str, required: bool) -> ModelSpec | None:
        ref = where.get(raw, key, str, default=... if required else None)
        if ref is None:
            return None
        if ref not in models:
            raise where.error(key, f"no model named {ref!r} in 'models'")
        return models[ref]

    defaults = where.mapping(raw.get("defaults", {}), "defaults")
    where.unknown_keys(defaults, {"max_new_tokens", "num_assistant_tokens", "schedule", "draft_source"})
    max_new = where.get(defaults, "max_new_tokens", int, default=128)
    window = where.get(defaults, "num_assistant_tokens", int, default=5)
    if not MAX_NEW_TOKENS_RANGE[0] <= max_new <= MAX_NEW_TOKENS_RANGE[1]:
        raise where.error("max_new_tokens", f"must be between {MAX_NEW_TOKENS_RANGE[0]} and {MAX_NEW_TOKENS_RANGE[1]}, "
                          f"got {max_new}")
    if not WINDOW_RANGE[0] <= window <= WINDOW_RANGE[1]:
        raise where.error("num_assistant_tokens", f"must be between {WINDOW_RANGE[0]} and {WINDOW_RANGE[1]}, got {window}")
    style = where.get(raw, "prompt_style", str, choices=PROMPT_STYLES)
    if ("asr" in tasks) != (style == "asr") or ("asr" in tasks and len(tasks) > 1):
        raise where.error("prompt_style", "a speech pair has only the task 'asr' and prompt_style 'asr'")
    default_on = where.get(raw, "default_on", list, default=list(DEVICE_TYPES))
    if not default_on or any(device not in DEVICE_TYPES for device in default_on):
        raise where.error("default_on", f"expected a non-empty list out of {', '.join(DEVICE_TYPES)}, got {default_on!r}")
    click_s = where.mapping(raw.get("click_s", {}), "click_s")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in click_s.values()):
        raise where.error("click_s", f"expected seconds by hardware, e.g. {{cpu-2-cores: 12}}, got {click_s!r}")
    return PairSpec(name=name, description=where.get(raw, "description", str, default=""), tasks=tuple(tasks),
                    target=model("target", True), assistant=model("assistant", False), prompt_style=style,
                    max_new_tokens=max_new, num_assistant_tokens=window,
                    schedule=where.get(defaults, "schedule", str, default="heuristic", choices=SCHEDULE_NAMES),
                    draft_source=where.get(defaults, "draft_source", str, default="assistant",
                                           choices=tuple(DRAFT_SOURCES)),
                    default_on=tuple(default_on), click_s=tuple((str(k), float(v)) for k, v in click_s.items()))


def load_catalog(path: str | os.PathLike | None = None) -> Catalog:
    """Parse and validate a catalog file (default: $ASSISTGEN_CATALOG or the repository's models.yaml)."""
    path = Path(path or from_env().catalog or DEFAULT_PATH)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the catalog: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None
    where = _Where(path, "top level")
    raw = where.mapping(raw)
    where.unknown_keys(raw, {"packs", "models", "pairs"})
    packs = {name: _pack(path, name, value) for name, value in where.mapping(raw.get("packs", {}), "packs").items()}
    models = {name: _model(path, name, value, packs)
              for name, value in where.mapping(raw.get("models", {}), "models").items()}
    pair_list = where.get(raw, "pairs", list)
    pairs = tuple(_pair(path, i, item, models) for i, item in enumerate(pair_list))
    names = [p.name for p in pairs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise CatalogError(f"{path}: pair {duplicate!r}: the name is used twice")
    if not pairs:
        raise CatalogError(f"{path}: top level, key 'pairs': needs at least one pair")
    return Catalog(path=path, packs=packs, models=models, pairs=pairs)
