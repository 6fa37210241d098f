"""What the adaptive schedule measured with a pair, kept on disk so that a new process starts from it.

The adaptive schedule prices each draft with pass costs and a calibration it measures (`engine.schedules`). Within a
process, each run starts from the last one's (`LoadedPair.measured_schedules`). A fresh process, such as every
`python -m assistgen compare`, used to start blind: the heuristic's 5, then 7 drafts, until two steps had been timed.
A short speech clip is only one to three steps long, so it paid for the blind steps in verification passes. The
measurements belong to the models and the machine, not to an input, so they are kept here, next to the converted
models they were measured with, and a new process lends them to its first run as an earlier run's would be lent
(its own timings replace the lent costs once it has measured two verification sizes).

Kept only for models in the assistgen cache (the offline packs): the facts the costs depend on (the models' folders,
torch, the CPU's instruction set, threads, device) are written beside them, and a file written under other facts is
not used. A file that cannot be read or written is ignored: nothing here can fail a run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..engine.schedules import AdaptiveSchedule
from ..models.loading import LoadedPair
from ..models.packs import cache_dir

FORMAT_VERSION = 1


def _folder(model) -> Path | None:
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    return Path(name).resolve() if name else None


def store_path(pair: LoadedPair) -> Path | None:
    """Where this pair's measurements are kept, or None: only pairs whose models all come from the cache."""
    root = cache_dir().resolve()
    models = [pair.target] + ([pair.assistant] if pair.assistant is not None else [])
    folders = [_folder(m.model) for m in models]
    if any(f is None or not f.is_relative_to(root) for f in folders):
        return None
    return root / "schedules" / f"{pair.spec.name}.json"


def _facts(pair: LoadedPair) -> dict:
    models = [pair.target] + ([pair.assistant] if pair.assistant is not None else [])
    return {"version": FORMAT_VERSION, "models": [str(_folder(m.model)) for m in models], "torch": torch.__version__,
            "cpu": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "device": str(pair.target.model.device)}


def _key(key: tuple) -> str:
    return json.dumps(list(key))


def _read(path: Path, facts: dict) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("schedules", {}) if isinstance(data, dict) and data.get("facts") == facts else {}


def load(pair: LoadedPair, key: tuple) -> AdaptiveSchedule | None:
    """The schedule last measured with this pair and `key` (draft source and decoding) on this machine, or None."""
    path = store_path(pair)
    if path is None:
        return None
    state = _read(path, _facts(pair)).get(_key(key))
    if state is None:
        return None
    try:
        schedule = AdaptiveSchedule.from_dict(state)
    except (KeyError, TypeError, ValueError):
        return None
    return schedule if schedule.costs.known else None


def save(pair: LoadedPair, key: tuple, schedule: AdaptiveSchedule) -> bool:
    """Keep `schedule`'s measurements for this pair and `key` (atomically); False when not kept."""
    path = store_path(pair)
    if path is None or not schedule.costs.known:
        return False
    facts = _facts(pair)
    schedules = {**_read(path, facts), _key(key): schedule.to_dict()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"facts": facts, "schedules": schedules}))
        os.replace(tmp, path)
    except OSError:
        return False
    return True
