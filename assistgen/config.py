"""The deployment's settings: every ASSISTGEN_* environment variable, read in one place into one frozen value.

`from_env()` parses the variables (README's Configuration table gives each one's default and effect) and checks each
value once, naming the variable when it is wrong; everything else receives the `Config` or asks `from_env()` for it.
The parse is cached per set of ASSISTGEN_* values, so a variable changed later (a test's `monkeypatch.setenv`) is
seen at the next call, and an unchanged environment is never parsed twice. Nothing of the package is imported here:
every layer may read it.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

PREFIX = "ASSISTGEN_"

# What one request may ask of the machine (`choices.Limits`), unless its variable says otherwise.
MAX_INPUT_TOKENS = 2048                                # a text prompt, after the prompt style is applied
MAX_AUDIO_SECONDS = 600.0                              # a recording, transcribed in windows of 30 s
MAX_FILE_SIZE = "25mb"                                 # an upload, refused by the server before it is read
MAX_GENERATION_SECONDS = 300.0                         # each run (the page's and the API's), cut short past it
QUEUE_SIZE = 16                                        # requests waiting beyond the one running


@dataclass(frozen=True)
class Config:
    cache: Path | None = None
    """ASSISTGEN_CACHE: the cache's root; None: ~/.cache/assistgen (`models.packs.cache_dir`)"""
    catalog: Path | None = None
    """ASSISTGEN_CATALOG: the catalog file; None: the repository's models.yaml"""
    memory_budget_gb: float | None = None
    """ASSISTGEN_MEMORY_BUDGET_GB: loaded models' budget; None: chosen from the machine (`models.pool`)"""
    preload: bool = True
    """ASSISTGEN_PRELOAD (0: off): load and warm up the default pairs at start-up"""
    max_input_tokens: int = MAX_INPUT_TOKENS
    """ASSISTGEN_MAX_INPUT_TOKENS"""
    max_audio_s: float = MAX_AUDIO_SECONDS
    """ASSISTGEN_MAX_AUDIO_SECONDS"""
    max_file_size: str = MAX_FILE_SIZE
    """ASSISTGEN_MAX_FILE_SIZE, in Gradio's notation ("25mb", "1gb")"""
    max_generation_s: float = MAX_GENERATION_SECONDS
    """ASSISTGEN_MAX_GENERATION_SECONDS"""
    queue_size: int = QUEUE_SIZE
    """ASSISTGEN_QUEUE_SIZE"""
    update_interval_s: float | None = None
    """ASSISTGEN_UPDATE_INTERVAL_S; None: 1 s, or 2 s when no core is spare (`app.service`)"""
    onednn: bool = True
    """ASSISTGEN_ONEDNN (0: off): oneDNN's packed linear on CPU fp32 models"""
    keep_freed_memory: bool = True
    """ASSISTGEN_KEEP_FREED_MEMORY (0: off): raise glibc's mmap and trim thresholds"""
    packed_store: bool = True
    """ASSISTGEN_PACKED_STORE (0: off): map the stored packed layers rather than pack at each load"""
    schedule_store: bool = True
    """ASSISTGEN_SCHEDULE_STORE (0: off): keep what the adaptive schedule and the payback gate measured in the cache"""
    llama_server: str | None = None
    """ASSISTGEN_LLAMA_SERVER: llama.cpp's server executable, for the benchmark's peer"""
    test_device: str = "cpu"
    """ASSISTGEN_TEST_DEVICE: the device the engine's tests run on"""


def from_env(environ: Mapping[str, str] | None = None) -> Config:
    """The configuration `environ` (default: this process's environment) sets. A variable set to the empty string
    counts as not set; a value that cannot be read is a ValueError naming the variable."""
    env = os.environ if environ is None else environ
    return _parse(tuple(sorted((k, v) for k, v in env.items() if k.startswith(PREFIX) and v != "")))


@functools.lru_cache(maxsize=32)
def _parse(items: tuple[tuple[str, str], ...]) -> Config:
    env = dict(items)

    def number(name: str, kind: type, default):
        text = env.get(PREFIX + name)
        if text is None:
            return default
        try:
            return kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise ValueError(f"{PREFIX}{name} must be {what}, got {text!r}") from None

    def switch(name: str) -> bool:
        return env.get(PREFIX + name, "1") != "0"

    path = {name: Path(env[PREFIX + name]).expanduser() if PREFIX + name in env else None
            for name in ("CACHE", "CATALOG")}
    return Config(cache=path["CACHE"], catalog=path["CATALOG"],
                  memory_budget_gb=number("MEMORY_BUDGET_GB", float, None), preload=switch("PRELOAD"),
                  max_input_tokens=number("MAX_INPUT_TOKENS", int, MAX_INPUT_TOKENS),
                  max_audio_s=number("MAX_AUDIO_SECONDS", float, MAX_AUDIO_SECONDS),
                  max_file_size=env.get(PREFIX + "MAX_FILE_SIZE", MAX_FILE_SIZE),
                  max_generation_s=number("MAX_GENERATION_SECONDS", float, MAX_GENERATION_SECONDS),
                  queue_size=number("QUEUE_SIZE", int, QUEUE_SIZE),
                  update_interval_s=number("UPDATE_INTERVAL_S", float, None),
                  onednn=switch("ONEDNN"), keep_freed_memory=switch("KEEP_FREED_MEMORY"),
                  packed_store=switch("PACKED_STORE"), schedule_store=switch("SCHEDULE_STORE"),
                  llama_server=env.get(PREFIX + "LLAMA_SERVER"), test_device=env.get(PREFIX + "TEST_DEVICE", "cpu"))
