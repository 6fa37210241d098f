"""What the adaptive schedule measured with a pair (pass costs, calibration), and what the payback gate measured of
the assistant's prompt pass and savings per task, kept in the assistgen cache so that a new process starts from them,
as a later run in the same process does (`runtime.PairRuntime.schedules` and `.payback`). `compare` keeps a
comparison's measurements only when its speed probes found the machine steady.

Kept only for pairs whose models all come from the cache (the offline packs), in one file per pair, with the facts the
costs depend on: the models' folders, dtypes and devices, whether oneDNN runs the fp32 layers, torch, the CPU (its
model and instruction set) and the threads. A file written under other facts is not used, and is replaced by the next
save. A file that cannot be read, parsed or written is ignored: nothing here can fail a run. `ASSISTGEN_SCHEDULE_STORE=0`
turns the store off (each process starts blind, as before).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..config import from_env
from ..engine.drafting import PaybackCosts
from ..engine.schedules import AdaptiveSchedule
from ..models.cpu import onednn_enabled
from ..models.loading import LoadedModel, LoadedPair
from ..models.machine import cpu_model
from ..models.packs import cache_dir, file_lock
from ..models.precision import encoder_dtype
from .runtime import remember

FORMAT_VERSION = 3   # 2: kept only from comparisons whose speed probes held (`compare.compare`); 3: a Whisper
# assistant reading the target's encoder output attends to the whole window, so its drafts, and the calibration of
# their confidence, are not those measured before


def _models(pair: LoadedPair) -> list[LoadedModel]:
    return [pair.target] + ([pair.assistant] if pair.assistant is not None else [])


def _folder(loaded: LoadedModel) -> Path | None:
    name = getattr(getattr(loaded.model, "config", None), "_name_or_path", None)
    return Path(name).resolve() if name else None


def store_path(pair: LoadedPair) -> Path | None:
    """Where this pair's measurements are kept, or None: the store is off, or a model is not from the cache."""
    if not from_env().schedule_store:
        return None
    root = cache_dir().resolve()
    folders = [_folder(m) for m in _models(pair)]
    if any(f is None or not f.is_relative_to(root) for f in folders):
        return None
    return root / "schedules" / f"{pair.spec.name}.json"


def _facts(pair: LoadedPair) -> dict:
    models = []
    for m in _models(pair):
        facts = {"folder": str(_folder(m)), "dtype": str(m.model.dtype), "device": str(m.model.device),
                 "quantization": m.spec.quantization}
        if (encoder := encoder_dtype(m.model)) is not None:   # only where cast: other pairs' stored schedules hold
            facts["encoder_dtype"] = str(encoder)
        models.append(facts)
    gpu = torch.cuda.get_device_name(pair.target.model.device) if pair.target.model.device.type == "cuda" else None
    return {"version": FORMAT_VERSION, "models": models, "onednn": onednn_enabled(),
            "torch": torch.__version__, "cpu": cpu_model(), "isa": torch.backends.cpu.get_cpu_capability(),
            "gpu": gpu, "threads": torch.get_num_threads()}


def _key(key: tuple) -> str:
    return json.dumps(list(key))


def _payback_key(task: str | None) -> str:
    return json.dumps(["payback", task])


def _read(path: Path, facts: dict) -> dict:
    """The stored schedules' states by key, if the file holds them under these facts; else {}."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    schedules = data.get("schedules") if isinstance(data, dict) and data.get("facts") == facts else None
    return schedules if isinstance(schedules, dict) else {}


def load(pair: LoadedPair, key: tuple) -> AdaptiveSchedule | None:
    """The schedule last measured with this pair and `key` (draft source and decoding) on this machine, or None."""
    schedule = _stored(pair, _key(key), AdaptiveSchedule.from_dict)
    return schedule if schedule is not None and schedule.costs.known else None


def load_payback(pair: LoadedPair, task: str | None) -> PaybackCosts | None:
    """The payback costs last measured with this pair on `task` on this machine, or None."""
    costs = _stored(pair, _payback_key(task), PaybackCosts.from_dict)
    return costs if costs is not None and costs.known else None


def _stored(pair: LoadedPair, key: str, from_dict):
    """What is kept under `key` for this pair on this machine, rebuilt by `from_dict`; None when nothing usable is."""
    path = store_path(pair)
    state = None if path is None else _read(path, _facts(pair)).get(key)
    if state is None:
        return None
    try:
        return from_dict(state)
    except (AttributeError, KeyError, TypeError, ValueError):   # not what to_dict writes
        return None


def save(pair: LoadedPair, key: tuple, schedule: AdaptiveSchedule) -> bool:
    """Keep `schedule`'s measurements for this pair and `key`, beside those of its other keys (under a lock, written
    whole then renamed: a reader never sees half a file); False when not kept."""
    if not schedule.costs.known:
        return False
    return _write(pair, _key(key), schedule.to_dict())


def save_payback(pair: LoadedPair, task: str | None, costs: PaybackCosts) -> bool:
    """Keep the payback costs measured on `task` for this pair, as `save` keeps a schedule; False when not kept."""
    return costs.known and _write(pair, _payback_key(task), costs.to_dict())


def _write(pair: LoadedPair, key: str, state: dict) -> bool:
    path = store_path(pair)
    if path is None:
        return False
    facts = _facts(pair)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with file_lock(path.with_name(f"{path.name}.lock")):
            schedules = remember(_read(path, facts), key, state)
            tmp.write_text(json.dumps({"facts": facts, "schedules": schedules}))
            os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True
