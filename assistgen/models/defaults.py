"""Each task's default pair on this machine: the first of the task's pairs that can load here (`pair_availability`),
fits the memory budget (`sizing.pair_fit`) and is meant for this device (`default_on`); else the first that can load
and fits. What `fetch --defaults` downloads; the page (`app.service.Service`) makes the same choice for its menus."""
from __future__ import annotations

import torch

from ..choices import TASKS
from .availability import pair_availability
from .catalog import Catalog
from .devices import default_device
from .pool import budget_from_env
from .sizing import pair_fit


def default_pair(catalog: Catalog, task: str, device: torch.device, budget_bytes: int) -> str | None:
    fitting = [pair for pair in catalog.pairs_for(task)
               if pair_availability(pair, catalog)[0] and pair_fit(pair, budget_bytes, device)[0]]
    meant = next((pair for pair in fitting if device.type in pair.default_on), None)
    chosen = meant or (fitting[0] if fitting else None)
    return chosen.name if chosen else None


def default_pairs(catalog: Catalog, device: torch.device | None = None, budget_bytes: int | None = None) -> list[str]:
    """Each task's default pair, each once (device: this machine's; budget: `pool.budget_from_env`)."""
    device = device or default_device()
    budget = budget_from_env() if budget_bytes is None else budget_bytes
    names = [default_pair(catalog, task, device, budget) for task in TASKS]
    return list(dict.fromkeys(name for name in names if name))
