"""A request checked before any work starts: the task and the pair first, then every setting, each against the
limits in `choices`. Whatever is wrong comes back as a UserError whose message says what to do."""
from __future__ import annotations

import math

from ..models.catalog import Catalog, PairSpec
from ..choices import TASK_LABELS, TASKS
from ..comparison.compare import Settings
from ..models.availability import pair_availability


class UserError(Exception):
    """Something the user can fix; the message says what to do."""


def known_pair(catalog: Catalog, pair_name: str) -> PairSpec:
    try:
        return catalog.pair(pair_name)
    except KeyError:
        raise UserError(f"unknown pair {pair_name!r}; pick one from the list") from None


def check_request(catalog: Catalog, task: str, pair_name: str) -> PairSpec:
    """The pair, once the task is known, the pair does it and its weights are there."""
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    spec = known_pair(catalog, pair_name)
    if task not in spec.tasks:
        raise UserError(f"pair {pair_name!r} does not do {TASK_LABELS[task].lower()}; pick another pair")
    ok, why = pair_availability(spec, catalog)
    if not ok:
        raise UserError(f"pair {pair_name!r} is unavailable: {why}. Pick another pair.")
    return spec


def number(name: str, value, kind: type):
    """A number from a form or an API call (a string is parsed), whole when `kind` is int."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UserError(f"{name} must be a number, got {value!r}")
    if kind is int:
        if value != int(value):
            raise UserError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    return value


def request_settings(spec: PairSpec, *, max_new_tokens=None, temperature=0.0, draft_source=None,
                     num_assistant_tokens=None, schedule=None, seed=0, max_time_s: float | None = None) -> Settings:
    """Settings from a request's raw values; what is not given comes from the pair's own defaults (models.yaml)."""
    max_new_tokens = (spec.max_new_tokens if max_new_tokens is None
                      else number("max_new_tokens", max_new_tokens, int))
    window = (spec.num_assistant_tokens if num_assistant_tokens is None
              else number("initial window", num_assistant_tokens, int))
    settings = Settings(max_new_tokens=max_new_tokens, temperature=float(number("temperature", temperature, float)),
                        draft_source=draft_source or spec.draft_source, num_assistant_tokens=window,
                        schedule=schedule or spec.schedule,
                        seed=int(number("seed", seed, int)), max_time_s=max_time_s)
    try:
        return settings.validate()
    except ValueError as exc:
        raise UserError(str(exc)) from None
