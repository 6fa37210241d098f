"""What running a loaded pair teaches the comparison, kept beside the pair rather than in it: its speed probe, the
adaptive schedules its runs measured, the costs that decide when its assistant starts, and which of its models have
run once (warm). `models.loading` holds only what loading produced; this state belongs to the layer that makes it.

Held in one registry, keyed by the loaded object itself and held weakly: a pair or model the pool lets go takes its
state along.
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
    # task -> when the assistant starts, beside prompt lookup (`compare.payback_costs`): what drafting saves on code is
    # not what it saves on a translation
    payback: dict[str | None, PaybackCosts] = field(default_factory=dict)


@dataclass
class ModelRuntime:
    warm: bool = False   # whether the model has run once, so one-time costs are out of timed runs' way


# the loaded pair or model -> its run-time state; an entry goes when its object is collected (both are `eq=False`
# dataclasses, hashed by identity)
_registry: "weakref.WeakKeyDictionary[LoadedPair | LoadedModel, PairRuntime | ModelRuntime]" = \
    weakref.WeakKeyDictionary()


def _state(obj, make):
    state = _registry.get(obj)
    if state is None:
        state = _registry[obj] = make()
    return state


def runtime(pair: LoadedPair) -> PairRuntime:
    """The pair's run-time state, empty the first time it is asked for."""
    return _state(pair, PairRuntime)


def is_warm(model: LoadedModel) -> bool:
    """Whether the model has run once since it was last marked cold."""
    return _state(model, ModelRuntime).warm


def set_warm(model: LoadedModel, warm: bool) -> None:
    _state(model, ModelRuntime).warm = warm
