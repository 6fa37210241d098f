"""Whether a catalog model can be loaded here, without loading it: its offline pack installed, its hub id in the
local cache or the hub reachable, its folder on disk; and why a model failed to load, remembered for the process."""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import huggingface_hub

from .catalog import Catalog, ModelSpec, PairSpec
from .packs import PackError, package_dir

_failures: dict[str, str] = {}  # model name -> why its last load failed (missing or damaged weights)


def note_failure(name: str, reason: str) -> None:
    """Remember why a model failed to load, so that its pairs are shown as unavailable with that reason."""
    _failures[name] = reason


@functools.lru_cache(maxsize=1)
def hub_reachable() -> tuple[bool, str]:
    """Whether the Hugging Face hub can be reached (asked once per process, with a short timeout)."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False, "the hub is switched off here (HF_HUB_OFFLINE=1)"
    host = urlparse(huggingface_hub.constants.ENDPOINT).hostname
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True, "the hub is reachable"
    except OSError as exc:
        return False, f"the hub cannot be reached ({exc.__class__.__name__})"


def _in_hub_cache(repo_id: str) -> bool:
    return isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str)


def availability(spec: ModelSpec, catalog: Catalog) -> tuple[bool, str]:
    """(available, reason) for one model, without loading it."""
    if spec.name in _failures:
        return False, _failures[spec.name]
    if spec.source == "pack":
        for file in catalog.packs[spec.location].files:
            for part in file.parts:
                try:
                    package_dir(part.package)
                except PackError as exc:
                    return False, str(exc)
        return True, "offline pack (installed packages; sha256-verified as it is assembled)"
    if spec.source == "hub":
        if _in_hub_cache(spec.location):
            return True, f"{spec.location} is in the local hub cache"
        ok, why = hub_reachable()
        return (True, f"{spec.location} from the hub") if ok else (False, f"{spec.location}: {why}, and it is not in "
                                                                          "the local cache")
    path = Path(spec.location).expanduser()
    return (path.exists(), f"{path}" if path.exists() else f"{path} does not exist")


def pair_availability(pair: PairSpec, catalog: Catalog) -> tuple[bool, str]:
    for spec in (pair.target, pair.assistant):
        if spec is not None:
            ok, why = availability(spec, catalog)
            if not ok:
                return False, why
    return True, "available"
