"""The deployment's settings: every ASSISTGEN_* variable read in one place, with README's defaults."""
from pathlib import Path

import pytest

from assistgen.config import Config, from_env


def test_an_empty_environment_gives_the_documented_defaults():
    config = from_env({})
    assert config == Config()
    assert (config.max_input_tokens, config.max_audio_s, config.max_file_size, config.max_generation_s) == \
        (2048, 600.0, "25mb", 300.0)
    assert config.queue_size == 16 and config.preload and config.onednn and config.schedule_store
    assert config.cache is None and config.memory_budget_gb is None and config.update_interval_s is None


def test_each_variable_sets_its_field_and_an_empty_one_counts_as_unset():
    config = from_env({"ASSISTGEN_CACHE": "~/c", "ASSISTGEN_MEMORY_BUDGET_GB": "2.5", "ASSISTGEN_PRELOAD": "0",
                       "ASSISTGEN_QUEUE_SIZE": "3", "ASSISTGEN_ONEDNN": "0", "ASSISTGEN_PACKED_STORE": "0",
                       "ASSISTGEN_MAX_INPUT_TOKENS": "", "ASSISTGEN_UPDATE_INTERVAL_S": "0.25", "OTHER": "x"})
    assert config.cache == Path("~/c").expanduser() and config.memory_budget_gb == 2.5
    assert not config.preload and not config.onednn and not config.packed_store and config.keep_freed_memory
    assert config.queue_size == 3 and config.update_interval_s == 0.25 and config.max_input_tokens == 2048


def test_a_value_that_cannot_be_read_names_its_variable():
    with pytest.raises(ValueError, match="ASSISTGEN_QUEUE_SIZE must be a whole number, got 'many'"):
        from_env({"ASSISTGEN_QUEUE_SIZE": "many"})


def test_the_process_environment_is_read_again_when_it_changes(monkeypatch):
    monkeypatch.setenv("ASSISTGEN_SCHEDULE_STORE", "0")
    assert from_env().schedule_store is False
    assert from_env() is from_env()   # parsed once for the same values
    monkeypatch.delenv("ASSISTGEN_SCHEDULE_STORE")
    assert from_env().schedule_store is True


def test_the_environment_is_read_in_one_place():
    """Every ASSISTGEN_* variable is read through `config.from_env`: no module of the package or the app reads one
    from the environment itself."""
    import re
    from helpers import ROOT
    reads = re.compile(r"(os\.environ|os\.getenv|environ\.get)[^\n]*ASSISTGEN_")
    offenders = [str(path.relative_to(ROOT)) for path in [ROOT / "app.py", *(ROOT / "assistgen").rglob("*.py")]
                 if path.name != "config.py" and reads.search(path.read_text())]
    assert offenders == []
