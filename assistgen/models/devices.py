"""Where a model runs and in which dtype, when the catalog says "auto"."""
from __future__ import annotations

import torch

from .limits import usable_cpus, usable_memory_bytes


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """The catalog's name of a dtype ("float32" for torch.float32), None for None: `torch_dtype`'s inverse."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def memory_bytes(device: torch.device) -> int:
    """The memory models are loaded into: the GPU's, or what this process may use of the machine's (its container's
    limit, where that is less)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).total_memory
    return usable_memory_bytes()


def hardware(device: torch.device) -> str:
    """The hardware in a few words, as the page says what a default pair was chosen for: "CPU, 2 cores, 16 GB"."""
    gigabytes = f"{memory_bytes(device) / 2**30:.0f} GB"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "GPU"
        return f"GPU ({name}), {gigabytes}"
    return f"CPU, {usable_cpus()} cores, {gigabytes}"


def hardware_key(device: torch.device) -> str:
    """The catalog's name for this hardware in a pair's click_s: "cpu-2-cores", or "cuda"."""
    return "cuda" if device.type == "cuda" else f"cpu-{usable_cpus()}-cores"
