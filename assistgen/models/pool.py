"""Loaded models, shared between pairs and kept within a memory budget (least recently used goes first)."""
from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from typing import Callable

from ..config import from_env
from .catalog import Catalog, ModelSpec, PairSpec
from .cpu import release_freed_memory
from .devices import default_device, memory_bytes
from .loading import LoadedModel, LoadedPair, Progress, check_pair
from .prepare import load_prepared
from .sizing import load_bytes

DEFAULT_BUDGET_GB = 14.0
CPU_HEADROOM_GB = 2.0        # of a CPU's memory, left to the interpreter, the server, activations and KV caches


GPU_BUDGET_FRACTION = 0.85   # of a GPU's memory, leaving room for activations and KV caches


def budget_from_env() -> int:
    """$ASSISTGEN_MEMORY_BUDGET_GB; without it, on a CPU 14 GB (the offline chat and speech pairs together, in fp32),
    at most the memory this process may use (its container's limit, where that is less than the machine's) less
    `CPU_HEADROOM_GB`: a 16 GB Space keeps 14 GB, an 8 GB container gets 6. On a GPU, `GPU_BUDGET_FRACTION` of its
    memory."""
    given = from_env().memory_budget_gb
    if given is not None:
        return int(given * 2**30)
    device = default_device()
    if device.type == "cuda":
        return int(memory_bytes(device) * GPU_BUDGET_FRACTION)
    return max(0, min(int(DEFAULT_BUDGET_GB * 2**30), memory_bytes(device) - int(CPU_HEADROOM_GB * 2**30)))


class ModelPool:
    """Never two copies of one model: models are keyed by catalog name and loaded under a per-name lock."""

    def __init__(self, catalog: Catalog, *, budget_bytes: int | None = None,
                 loader: Callable[..., LoadedModel] = load_prepared):
        self.catalog = catalog
        self.budget_bytes = budget_from_env() if budget_bytes is None else budget_bytes
        self._loader = loader
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()
        self._sizes: dict[str, int] = {}            # bytes seen at earlier loads, to evict before loading again
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}
        self._checked: dict[tuple, LoadedPair] = {}

    @property
    def resident_bytes(self) -> int:
        return sum(m.num_bytes for m in self._models.values())

    def resident(self) -> list[str]:
        return list(self._models)

    def _evict(self, need: int, keep: set[str]) -> None:
        evicted = False
        with self._lock:
            for name in list(self._models):
                if self.resident_bytes + need <= self.budget_bytes:
                    break
                if name not in keep:
                    gone = self._models.pop(name)
                    evicted = True
                    # a checked pair holds its models: dropped with them, or the evicted weights stay in memory
                    self._checked = {k: v for k, v in self._checked.items()
                                     if gone not in (v.target, v.assistant)}
        if evicted:  # a full collection walks every live object: a third of a second with a pair loaded
            gc.collect()
            release_freed_memory()

    def model(self, spec: ModelSpec, progress: Progress | None = None, *, keep: set[str] = frozenset()) -> LoadedModel:
        with self._lock:
            lock = self._loading.setdefault(spec.name, threading.Lock())
        with lock:
            with self._lock:
                if spec.name in self._models:
                    self._models.move_to_end(spec.name)
                    return self._models[spec.name]
            # make room first, for the size seen at an earlier load or read from the weights' headers: evicting
            # only afterwards would hold both at once (a 16 GB Space could not)
            need = self._sizes.get(spec.name) or load_bytes(spec, default_device()) or 0
            self._evict(need, keep | {spec.name})
            loaded = self._loader(spec, self.catalog, progress=progress)
            with self._lock:
                self._models[spec.name] = loaded
                self._sizes[spec.name] = loaded.num_bytes
            self._evict(0, keep | {spec.name})
            return loaded

    def pair(self, pair: PairSpec | str, progress: Progress | None = None) -> LoadedPair:
        pair = self.catalog.pair(pair) if isinstance(pair, str) else pair
        report = progress or (lambda fraction, message: None)
        names = {pair.target.name} | ({pair.assistant.name} if pair.assistant else set())
        target = self.model(pair.target, lambda f, m: report(0.6 * f, m), keep=names)
        # One after the other: loading both at once (threads) made the target's load four times slower, as
        # oneDNN's OpenMP threads waited on a core the other load held.
        assistant = (self.model(pair.assistant, lambda f, m: report(0.6 + 0.4 * f, m), keep=names)
                     if pair.assistant else None)
        # The pair check compares whole vocabularies: do it once per loaded pair, not on every request.
        key = (pair.name, id(target), id(assistant))
        with self._lock:
            checked = self._checked.get(key)
        if checked is None:
            checked = check_pair(pair, target, assistant)
            with self._lock:
                self._checked = {k: v for k, v in self._checked.items() if k[0] != pair.name}
                self._checked[key] = checked
        return checked
