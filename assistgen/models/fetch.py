"""Downloading a pair's hub models ahead of time (`python -m assistgen fetch`), so that no click waits for one."""
from __future__ import annotations

from pathlib import Path

import huggingface_hub

from .availability import hub_reachable
from .catalog import ModelSpec

# What transformers reads from a model's repository: the configs, the safetensors weights (never pickles) and the
# tokenizer's and feature extractor's files
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]


class FetchError(RuntimeError):
    """A model could not be fetched; the message says why."""


def fetch_model(spec: ModelSpec) -> Path | None:
    """Download a hub model's files into the Hugging Face cache (what is already there is kept); returns the
    snapshot folder, or None for a model that does not come from the hub."""
    if spec.source != "hub":
        return None
    reachable, why = hub_reachable()
    if not reachable:
        raise FetchError(f"cannot fetch {spec.location}: {why}")
    try:
        return Path(huggingface_hub.snapshot_download(spec.location, allow_patterns=HUB_FILES))
    except Exception as exc:  # the network, a gated or missing repository: said as it is
        raise FetchError(f"cannot fetch {spec.location}: {str(exc).splitlines()[0]}") from None
