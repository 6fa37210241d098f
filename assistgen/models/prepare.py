"""`python -m assistgen prepare`: the offline packs of the pairs the page defaults to on this machine (or of one pair,
or of every pair), assembled, verified and converted ahead of time, so that no click pays for a conversion.
Idempotent: what is already in the cache is checked, not redone.

A float conversion made only to be quantized (the default text pair's int8 target and assistant) is dropped once
its int8 copy is stored: that copy is what loads. Choosing a float pair later converts it again, once.

`--prune` removes what neither the pairs prepared nor the default pairs load (an older cache's float32 conversions
and packed layers, say); without it, `prepare` says how much that is."""
from __future__ import annotations

import multiprocessing
import queue
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..choices import TASKS
from .catalog import Catalog, ModelSpec, PairSpec
from .availability import availability, note_failure
from .conversion import (WEIGHTS, conversion_folder, convert_pack, drop_float_weights, float_weights_kept,
                         float_weights_needed, int8_folder, int8_stored, loads_int8_copy, pack_dtype,
                         pack_ready, packed_stored, packs_onednn, store_packed)
from .devices import default_device
from .loading import LoadedModel, LoadError, load_model
from .packed import can_store, packed_folder
from .packs import PackError, disk_bytes, file_lock


@dataclass(frozen=True)
class Prepared:
    model: str
    seconds: float
    what: str       # what was done ("converted", "quantized", "packed", joined by "and"; or "already prepared"), and
                    # why the packed layers could not be stored, if so


def default_pack_pairs(catalog: Catalog, device) -> list[PairSpec]:
    """Each task's first pair that is meant for `device` and whose models all come from offline packs: what the page
    defaults to where the packs are installed. Each pair once."""
    pairs: list[PairSpec] = []
    for task in TASKS:
        found = next((pair for pair in catalog.pairs_for(task) if device.type in pair.default_on
                      and all(m.source == "pack" for m in (pair.target, pair.assistant) if m is not None)), None)
        if found is not None and found not in pairs:
            pairs.append(found)
    return pairs


def _models_of(pairs: list[PairSpec]) -> list[ModelSpec]:
    """The offline-pack models of `pairs`, each once."""
    models: dict[str, ModelSpec] = {}
    for spec in pairs:
        for model in (spec.target, spec.assistant):
            if model is not None and model.source == "pack":
                models.setdefault(model.name, model)
    return list(models.values())


def _asked(catalog: Catalog, pair: str | None, every: bool) -> list[PairSpec]:
    """The pair named, or every pair, or none (the default pairs, then)."""
    return [catalog.pair(pair)] if pair else list(catalog.pairs) if every else []


def pack_models(catalog: Catalog, pair: str | None = None, every: bool = False) -> list[ModelSpec]:
    """The models with offline-pack weights of the pair named, or of every pair, or else of the pairs the page
    defaults to on this machine, each once."""
    return _models_of(_asked(catalog, pair, every) or default_pack_pairs(catalog, default_device()))


def prepare(catalog: Catalog, pair: str | None = None,
            progress: Callable[[float, str], None] | None = None, every: bool = False) -> list[Prepared]:
    """Assemble, verify and convert the packs of the default pairs (or of `pair`, or of every pair); an int8 model is
    also quantized once and stored, a hub model's too (from the Hugging Face cache) where `pair` is named. Raises
    PackError (saying what to install) for a missing or damaged pack, before any conversion."""
    done = prepare_models(catalog, pack_models(catalog, pair, every), progress)
    return done + [_prepare_hub_int8(catalog, spec, progress) for spec in _hub_int8_models(_asked(catalog, pair, every))]


def _hub_int8_models(pairs: list[PairSpec]) -> list[ModelSpec]:
    """The hub models of `pairs` that run in int8 on this machine, each once."""
    device = default_device()
    models = {m.name: m for pair in pairs for m in (pair.target, pair.assistant)
              if m is not None and m.source == "hub" and loads_int8_copy(m.on(device), device)}
    return list(models.values())


def _prepare_hub_int8(catalog: Catalog, spec: ModelSpec, progress) -> Prepared:
    """A hub model's int8 copy quantized from its snapshot in the Hugging Face cache and stored (once)."""
    started = time.perf_counter()
    if ready(spec, catalog, default_device()):
        return Prepared(spec.name, 0.0, "already prepared")
    load_model(spec, catalog, progress=progress)   # quantizes once, stores
    return Prepared(spec.name, time.perf_counter() - started, "quantized")


def ready(spec: ModelSpec, catalog: Catalog, device) -> bool:
    """Whether `spec` loads on `device` without converting or quantizing first: a pack in the cache as it loads
    (`pack_ready`), a hub model that runs in int8 there with its int8 copy stored, any other model (its download is
    not counted: `fetch` and a Space's build do it)."""
    here = spec.on(device)
    if spec.source == "pack":
        return pack_ready(here, catalog, device)
    return spec.source != "hub" or not loads_int8_copy(here, device) or int8_stored(Path(spec.location), here)


def prepare_models(catalog: Catalog, models: list[ModelSpec],
                   progress: Callable[[float, str], None] | None = None) -> list[Prepared]:
    report = progress or (lambda fraction, message: None)
    for spec in models:
        ok, why = availability(spec, catalog)
        if not ok:
            raise PackError(f"{spec.name}: {why}")
    device = default_device()
    keep = _float_weights_loaded(catalog, models, device)
    made: set[Path] = set()   # the float conversions made here
    done = []
    for i, spec in enumerate(models):
        def sub(fraction: float, message: str, i: int = i) -> None:
            report((i + min(1.0, fraction)) / len(models), message)
        started = time.perf_counter()
        folder, converted = convert_pack(spec, catalog, pack_dtype(spec, device), sub)
        if converted:
            made.add(folder)
        quantized = loads_int8_copy(spec, device) and not int8_stored(folder, spec)
        packed = packs_onednn(spec, device) and can_store() and not packed_stored(folder)
        if quantized:
            load_model(spec, catalog, device=device, progress=sub)  # quantizes once, stores
        not_stored = ""
        if packed:
            loaded = load_model(spec, catalog, device=device, progress=sub)  # packs the linear layers
            sub(0.9, f"{spec.name}: storing its packed linear layers (once)")
            try:
                store_packed(loaded.model, folder)
            except OSError as exc:   # a speed-up only: the model still loads, packing at each load
                packed = False
                not_stored = f" (its packed linear layers could not be stored: {exc}; each load packs them)"
            del loaded
        what = " and ".join(w for w, did in (("converted", converted), ("quantized", quantized), ("packed", packed))
                            if did)
        what = (what or "already prepared") + not_stored
        # A conversion made here only to be quantized goes as soon as no later model of this call reads it
        later = {conversion_folder(other, catalog, device) for other in models[i + 1:]}
        if folder in made and folder not in keep and folder not in later:
            freed = drop_float_weights(folder)
            if freed:
                what += f"; its float weights dropped ({freed / 1e9:.1f} GB: the int8 copy loads)"
        done.append(Prepared(spec.name, time.perf_counter() - started, what))
    report(1.0, "ready")
    return done


def _float_weights_loaded(catalog: Catalog, models: list[ModelSpec], device) -> set[Path]:
    """The conversions whose float weights some model loads: one of `models` that runs in float, or a model of a
    default pair that needs them (one not yet stored in int8, or one that runs in float)."""
    float_here = [spec for spec in models if not loads_int8_copy(spec, device)]
    defaults = [spec for spec in _models_of(default_pack_pairs(catalog, device))
                if spec not in models and float_weights_needed(spec, conversion_folder(spec, catalog, device))]
    return {conversion_folder(spec, catalog, device) for spec in [*float_here, *defaults]}


@dataclass(frozen=True)
class Prunable:
    path: Path
    bytes: int
    what: str       # "folder" (all of it) or "float weights" (a conversion's, its config and tokenizer kept)


def kept_models(catalog: Catalog, pair: str | None = None, every: bool = False) -> list[ModelSpec]:
    """What `--prune` keeps loadable: the models `prepare` was asked for, and the default pairs' models."""
    return _models_of([*_asked(catalog, pair, every), *default_pack_pairs(catalog, default_device())])


def prunable(catalog: Catalog, kept: list[ModelSpec]) -> list[Prunable]:
    """What the cache holds of the catalog's pack models that none of `kept` loads: the conversions, int8 copies and
    packed layers of other models, and the float weights of a conversion that `kept` reads only as int8 copies. The
    assembled packs are not counted (a pair chosen later converts from them), nor anything the catalog does not name."""
    device = default_device()
    loaded: set[Path] = set()
    float_read: set[Path] = set()      # the kept conversions whose float weights some kept model reads
    for spec in kept:
        folder = conversion_folder(spec, catalog, device)
        loaded.add(folder)
        if float_weights_needed(spec, folder):
            float_read.add(folder)
        if loads_int8_copy(spec, device):
            loaded.add(int8_folder(folder, spec))
        if packs_onednn(spec, device):
            loaded.add(packed_folder(folder))
    found: dict[Path, Prunable] = {}
    for spec in catalog.models.values():
        if spec.source != "pack":
            continue
        folder = conversion_folder(spec, catalog, device)
        for path in (folder, int8_folder(folder, spec), packed_folder(folder)):
            if path not in loaded and path not in found and path.is_dir():
                found[path] = Prunable(path, disk_bytes(path), "folder")
        if folder in loaded and folder not in float_read and float_weights_kept(folder) and folder not in found:
            found[folder] = Prunable(folder, disk_bytes(folder / WEIGHTS), "float weights")
    return list(found.values())


def prune(catalog: Catalog, kept: list[ModelSpec]) -> list[Prunable]:
    """Remove what `prunable` finds, each under the lock its writer takes; returns what was removed. A model whose
    files went converts again when a pair that loads it is chosen (in a child process, as for a fresh cache)."""
    removed = []
    for item in prunable(catalog, kept):
        if item.what == "float weights":
            removed.append(Prunable(item.path, drop_float_weights(item.path), item.what))
            continue
        with file_lock(item.path.parent / f"{item.path.name}.lock"):
            shutil.rmtree(item.path, ignore_errors=True)
        removed.append(item)
    return removed


def _child(catalog: Catalog, name: str, events) -> None:
    try:
        spec = catalog.models[name]
        report = lambda f, m: events.put(("progress", f, m))   # noqa: E731
        if spec.source == "pack":
            prepare_models(catalog, [spec], report)
        else:
            _prepare_hub_int8(catalog, spec, report)
        events.put(("done", None, None))
    except PackError as exc:
        events.put(("pack", str(exc), None))
    except BaseException as exc:  # reported to the parent, which raises it as a LoadError
        events.put(("error", f"{type(exc).__name__}: {exc}", None))


def prepare_in_child(spec: ModelSpec, catalog: Catalog, progress: Callable[[float, str], None] | None = None) -> None:
    """`prepare` for one model, in a fresh child process, with its progress reported here.

    A conversion streams gigabytes through numpy and the allocator; the child returns all of it to the system when
    it exits, so the process that then loads the cache and times its runs starts clean.
    """
    report = progress or (lambda fraction, message: None)
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    child = context.Process(target=_child, args=(catalog, spec.name, events), name=f"prepare {spec.name}")
    report(0.0, f"{spec.name}: preparing its weights (once), in a separate process")
    child.start()
    try:
        while True:
            try:
                kind, payload, extra = events.get(timeout=1.0)
            except queue.Empty:
                if not child.is_alive():
                    raise LoadError(f"{spec.name}: preparing its weights stopped (exit code {child.exitcode}); "
                                    "run python -m assistgen prepare to see why") from None
                continue
            if kind == "progress":
                report(0.8 * payload, extra)
            elif kind == "pack":
                raise PackError(payload)
            elif kind == "error":
                raise LoadError(f"{spec.name}: preparing its weights failed ({payload})")
            else:
                return
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


def load_prepared(spec: ModelSpec, catalog: Catalog, *, device=None, progress: Callable[[float, str], None] | None = None
                  ) -> LoadedModel:
    """`load_model`, after preparing a pack that is not yet in the cache, or a hub model's int8 copy, in a child
    process (`prepare_in_child`), so that this process never converts: the loader of the app's and the CLI's model
    pool."""
    device = device or default_device()
    if not ready(spec, catalog, device):
        try:
            prepare_in_child(spec, catalog, progress)
        except (LoadError, PackError) as exc:
            reason = str(exc) if isinstance(exc, LoadError) else f"{spec.name}: {exc}"
            note_failure(spec.name, reason)
            raise LoadError(reason) from None
    return load_model(spec, catalog, device=device, progress=progress)
