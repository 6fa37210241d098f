"""Figures that know when they can't be trusted: a fault hook slows the target during one run only, and the speed
probes around the runs must catch it; with nothing injected, no warning. No wall-clock time is read: the engine and
the probe read a fake clock that only the target's passes advance, by the duration the hook gives each, so the tests
check what the comparison concludes from those durations whatever else the machine does."""
import pytest
import torch

import assistgen.comparison.probe as probe_module
import assistgen.engine.decoding as decoding_module
from assistgen.models.catalog import load_catalog
from assistgen.comparison.compare import Settings, compare
from assistgen.comparison.runtime import is_warm, runtime
from assistgen.models.pool import ModelPool
from assistgen.app.render import LiveView, result_outputs, summary_html
from assistgen.app.streaming import Snapshot
from assistgen.comparison.tasks import text_inputs

PASS_S = 2.0 ** -5   # a target pass on the fake clock: 31.25 ms (a power of two, so sums of passes stay exact)
SLOW = 1.5           # the injected fault: passes in a slow phase take this many times longer


class Pace:
    """A fault hook on a model and the fake clock the comparison reads (`synchronized_clock`, in the engine and the
    probe): each forward pass of the model moves the clock on by `PASS_S`, or `SLOW` times that during the phases
    named in `slow` ("baseline", "assisted", or "probe#2" for the second probe); nothing else moves it."""

    def __init__(self, model, monkeypatch, slow: set[str] = frozenset()):
        self.slow, self.phases, self.passes, self.now = set(slow), [], 0, 0.0
        for module in (decoding_module, probe_module):
            monkeypatch.setattr(module, "synchronized_clock", lambda device: self.clock)
        self._handle = model.register_forward_hook(self._finish)

    def clock(self) -> float:
        return self.now

    def on_phase(self, name: str) -> None:
        self.phases.append(name)

    @property
    def slowed(self) -> bool:
        if not self.phases:
            return False
        name = self.phases[-1]
        return name in self.slow or f"{name}#{self.phases.count(name)}" in self.slow

    def _finish(self, module, args, output):
        self.passes += 1
        self.now += PASS_S * (SLOW if self.slowed else 1.0)

    def remove(self):
        self._handle.remove()


@pytest.fixture(scope="module")
def pair(tiny_catalog_path):
    return ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-text")


SETTINGS = Settings(max_new_tokens=16, schedule="constant", num_assistant_tokens=3)


def run(pair, slow=()):
    inputs = text_inputs(pair, "chat", "The quick brown fox jumps over the lazy dog.")
    with pytest.MonkeyPatch.context() as monkeypatch:
        pace = Pace(pair.target.model, monkeypatch, set(slow))
        try:
            result = compare(pair, "chat", inputs, SETTINGS, on_phase=pace.on_phase)
        finally:
            pace.remove()
    assert pace.passes > 0
    return result


def test_a_clean_comparison_carries_no_speed_warning(pair):
    result = run(pair)
    stability = result.to_dict()["stability"]
    assert stability["stable"] is True, stability["warnings"]
    assert not [w for w in result.warnings() if "speed" in w or "not reliable" in w]
    # every check had something to judge: both runs' passes and all three probes
    assert stability["baseline_pass_s"] is not None and stability["assisted_pass_s"] is not None
    assert stability["assisted_rows"] == 4 and stability["probe_rows_s"] is not None
    assert set(stability["probe_s"]) == {"before", "between", "after"}
    # what was judged is what the hook set: every target pass one `PASS_S` on the fake clock
    assert set(stability["probe_s"].values()) == {PASS_S} and stability["baseline_pass_s"] == PASS_S


def test_a_target_slowed_during_the_baseline_only_is_reported(pair):
    result = run(pair, slow={"baseline"})
    data = result.to_dict()
    assert data["stability"]["stable"] is False
    assert any("baseline's passes ran" in w and "slower" in w for w in data["warnings"]), data["warnings"]
    assert not any("assisted run's passes" in w for w in data["warnings"]), data["warnings"]


def test_a_target_slowed_during_the_assisted_run_only_is_reported(pair):
    data = run(pair, slow={"assisted"}).to_dict()
    assert data["stability"]["stable"] is False
    assert any("assisted run's passes ran" in w for w in data["warnings"]), data["warnings"]
    assert not any("baseline's passes" in w for w in data["warnings"]), data["warnings"]


def test_a_probe_that_moved_is_reported_even_when_the_runs_look_alike(pair):
    data = run(pair, slow={"probe#2"}).to_dict()
    assert any("the machine's speed moved" in w for w in data["warnings"]), data["warnings"]


def test_the_page_marks_an_unreliable_result_and_offers_a_rerun(pair):
    result = run(pair, slow={"baseline"})
    html = summary_html(result.to_dict())
    assert "Timing not reliable" in html and "Run again" in html and "(unreliable)" in html
    live = LiveView().outputs(Snapshot("done", pair=pair, baseline_tokens=result.baseline.new_tokens,
                                       assisted_steps=result.assisted.steps, comparison=result))
    assert result_outputs(live["result"])["unreliable"] is True
    clean = run(pair)
    live = LiveView().outputs(Snapshot("done", pair=pair, baseline_tokens=clean.baseline.new_tokens,
                                       assisted_steps=clean.assisted.steps, comparison=clean))
    out = result_outputs(live["result"])
    assert out["unreliable"] is False and "Timing not reliable" not in out["summary"]


def test_the_time_breakdown_adds_up_to_each_latency(pair):
    data = run(pair).to_dict()
    for name in ("baseline", "assisted"):
        run_ = data[name]
        t = run_["time"]
        total = t["setup_s"] + t["prompt_s"] + t["drafting_s"] + t["verifying_s"] + t["other_s"]
        assert total == pytest.approx(run_["latency_s"], abs=2e-3)
        assert t["passes_after_prompt"] == run_["target_passes"] - 1
        assert t["verifying_s"] == round(t["passes_after_prompt"] * PASS_S, 4)   # one paced pass each
    steps = data["assisted"]["steps"][1:]
    assert data["assisted"]["time"]["rows_verified"] == sum(len(s["candidates"]) + 1 for s in steps)
    assert data["baseline"]["time"]["drafting_s"] == 0


def test_the_probe_is_built_before_the_warm_up_so_the_warm_up_runs_around_its_memory(tiny_catalog_path, monkeypatch):
    """The probe keeps an encoder output and a KV cache for good: built after the warm-up, the first timed run (the
    baseline) was the first to fit its memory around them, and paid for it."""
    import assistgen.comparison.compare as compare_module
    fresh = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-speech")
    order = []
    real_probe, real_run = compare_module.SpeedProbe, compare_module.run_generation

    def probe(*args, **kwargs):
        order.append("probe")
        return real_probe(*args, **kwargs)

    def run_generation(*args, **kwargs):
        order.append("generation")
        return real_run(*args, **kwargs)

    monkeypatch.setattr(compare_module, "SpeedProbe", probe)
    monkeypatch.setattr(compare_module, "run_generation", run_generation)
    from assistgen.comparison.speech import asr_inputs
    import numpy as np
    inputs = asr_inputs(fresh, np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32))
    compare_module.warm_up(fresh, inputs)
    assert order == ["probe", "generation"] and runtime(fresh).probe is not None and is_warm(fresh.target)
    order.clear()
    compare_module.warm_up(fresh, inputs)   # once per pair
    compare(fresh, "asr", inputs, Settings(max_new_tokens=4))
    assert order == ["generation", "generation"]   # the baseline and the assisted run; no second probe


def test_the_warm_up_captures_both_models_graphs_before_the_probe_and_the_timed_runs(tiny_catalog_path, monkeypatch):
    """On a GPU a pass size's CUDA graph is captured on its first use: the warm-up asks for every size first, so that
    neither the probes nor the timed runs pay for a capture (on a CPU `prepare_graphs` captures nothing)."""
    import assistgen.comparison.compare as compare_module
    fresh = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-text")
    order = []
    real_probe = compare_module.SpeedProbe
    monkeypatch.setattr(compare_module, "prepare_graphs", lambda model: order.append(model) or [])
    monkeypatch.setattr(compare_module, "SpeedProbe", lambda *a, **k: (order.append("probe"), real_probe(*a, **k))[1])
    compare_module.warm_up(fresh, {"input_ids": torch.tensor([[1, 2, 3]])})
    assert order[:3] == [fresh.target.model, fresh.assistant.model, "probe"]


def test_each_task_lends_its_own_payback_costs_to_its_next_run(pair):
    """What drafting saved on code is no guide to a translation: a task's runs share costs with each other only."""
    from assistgen.comparison.compare import payback_costs
    chat, translation = payback_costs(pair, "chat"), payback_costs(pair, "translation")
    assert chat is not translation and payback_costs(pair, "chat") is chat
    compare(pair, "translation", text_inputs(pair, "translation", "Good morning."),
            Settings(max_new_tokens=6, draft_source="assistant_lookup"))
    assert translation.target_prompt_s is not None and chat.target_prompt_s is None


def test_a_new_process_starts_each_task_from_the_payback_costs_the_last_one_kept(pair, tmp_path, monkeypatch):
    """`schedule_store` keeps a task's payback costs beside the adaptive schedules, for pairs whose models come from
    the cache, once a steady comparison measured them: a new process's first run of the task prices the assistant's
    prompt pass from them instead of measuring for two steps. Another task starts afresh, and so does every task
    with the store turned off."""
    import dataclasses

    from assistgen.comparison import compare as comparing, schedule_store
    from assistgen.comparison.compare import payback_costs
    from assistgen.comparison.probe import judge
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))
    for name, loaded in (("target", pair.target), ("assistant", pair.assistant)):
        monkeypatch.setattr(loaded.model.config, "_name_or_path", str(tmp_path / "models" / name))
    monkeypatch.setattr(comparing, "judge", lambda *args: dataclasses.replace(judge(*args), warnings=[]))
    monkeypatch.setattr(runtime(pair), "payback", {})
    compare(pair, "translation", text_inputs(pair, "translation", "Good morning, how are you today?"),
            Settings(max_new_tokens=12, draft_source="assistant_lookup"))
    measured = runtime(pair).payback["translation"]
    assert measured.known and schedule_store.store_path(pair).is_file()

    monkeypatch.setattr(runtime(pair), "payback", {})   # a new process
    kept = payback_costs(pair, "translation")
    assert kept is not measured and kept.to_dict() == measured.to_dict()
    assert not payback_costs(pair, "summarization").known   # never measured: afresh
    monkeypatch.setattr(runtime(pair), "payback", {})
    monkeypatch.setenv("ASSISTGEN_SCHEDULE_STORE", "0")
    assert not payback_costs(pair, "translation").known
