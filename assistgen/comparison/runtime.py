"""What running a loaded pair teaches the comparison, kept beside the pair rather than in it: its speed probe, the
adaptive schedules its runs measured, the costs that decide when its assistant starts, and which of its models have
run once (warm). `models.loading` holds only what loading produced; this state belongs to the layer that makes it.

Keyed by the loaded object's identity and dropped with it: a pair or model the pool lets go takes its state along.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from ..engine.drafting import PaybackCosts
from ..engine.schedules import AdaptiveSchedule
from ..models.loading import LoadedModel, LoadedPair
from .probe import SpeedProbe


MAX_SCHEDULES = 32   # measured schedules kept per pair, the least recently run dropped first: a key per temperature


def remember(schedules: dict, key, value, limit: int = MAX_SCHEDULES) -> dict:
    """`schedules` with `key` set to `value` as its most recent entry, and at most `limit` entries (in place)."""
    schedules.pop(key, None)
    schedules[key] = value
    while len(schedules) > limit:
        del schedules[next(iter(schedules))]
    return schedules


@dataclass
class PairRuntime:
    probe: SpeedProbe | None = None   # built by the warm-up, once per pair (`compare.warm_up`)
    # (draft source, temperature, top-p) -> the last adaptive schedule run so, whose costs and calibration start the
    # next such run's (`compare.run_generation`)
    schedules: dict[tuple, AdaptiveSchedule] = field(default_factory=dict)
    payback: PaybackCosts | None = None   # when the assistant starts, beside prompt lookup (`compare.payback_costs`)


_pairs: dict[int, PairRuntime] = {}
_warm: dict[int, bool] = {}   # a loaded model -> whether it has run once, so one-time costs are out of timed runs' way


def _entry(table: dict, obj, make):
    """`table`'s entry for `obj`, made by `make()` the first time and removed when `obj` is collected."""
    key = id(obj)
    if key not in table:
        table[key] = make()
        weakref.finalize(obj, table.pop, key, None)
    return table[key]


def runtime(pair: LoadedPair) -> PairRuntime:
    """The pair's run-time state, empty the first time it is asked for."""
    return _entry(_pairs, pair, PairRuntime)


def is_warm(model: LoadedModel) -> bool:
    """Whether the model has run once since it was last marked cold."""
    return _warm.get(id(model), False)


def set_warm(model: LoadedModel, warm: bool) -> None:
    _entry(_warm, model, bool)
    _warm[id(model)] = warm
