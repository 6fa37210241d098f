"""Where a model runs and in which dtype, when the catalog says "auto"."""
from __future__ import annotations

import torch


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def dtype_name(dtype: torch.dtype | None) -> str | None:
    """The catalog's name of a dtype ("float32" for torch.float32), None for None: `torch_dtype`'s inverse."""
    return None if dtype is None else str(dtype).removeprefix("torch.")
