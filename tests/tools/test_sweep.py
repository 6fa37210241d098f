"""python -m assistgen sweep, and the sweep loop the page's Explore tab shares with it."""
import csv
import json
import os
import subprocess
import sys

import pytest

from assistgen.comparison.compare import Settings
from assistgen.comparison.sweep import parse_values, run_sweep
from helpers import ROOT


def fake_result(settings: Settings, pair: str, speedup: float) -> dict:
    """A comparison's JSON with just the figures a sweep reads."""
    acc = {"drafting_passes": 2, "drafted_tokens": 6, "accepted_tokens": 3, "mean_acceptance_length": 2.5,
           "draft_acceptance_rate": 0.5, "per_position": [1.0, 0.5, 0.0], "per_position_passes": [2, 2, 2],
           "zero_accept_share": 0.0, "alpha": 0.6}
    return {"pair": pair, "speedup": speedup, "identical": True, "settings": {"temperature": settings.temperature,
            "seed": settings.seed}, "assisted": {"tokens_per_pass": 2.0, "latency_s": 1.0, "acceptance": acc},
            "baseline": {"latency_s": speedup}, "cost_ratio": 0.1, "break_even": None, "stability": {"stable": True},
            "draft_source": "assistant", "warnings": []}


def test_a_sweep_runs_repeat_by_repeat_each_value_with_its_own_settings():
    calls = []

    def run_one(settings, pair):
        calls.append((settings.temperature, settings.seed, pair))
        return fake_result(settings, pair, 1.0 + settings.seed)
    progress = list(run_sweep("temperature", [0.0, 1.0], 2, Settings(max_new_tokens=8), "p", run_one))
    assert calls == [(0.0, 0, "p"), (1.0, 0, "p"), (0.0, 1, "p"), (1.0, 1, "p")]
    assert [p.done for p in progress] == [1, 2, 3, 4] and progress[-1].left_s == 0
    summary = progress[-1].points[0].summary()
    assert (summary["speedup"], summary["speedup_min"], summary["speedup_max"]) == (1.5, 1.0, 2.0)
    assert summary["identical"] == [True, True] and progress[-1].points[1].summary()["identical"] is None


def test_an_assistant_sweep_runs_each_pair():
    pairs = []
    list(run_sweep("assistant", ["a", "b"], 1, Settings(), "a",
                   lambda s, pair: pairs.append(pair) or fake_result(s, pair, 1.0)))
    assert pairs == ["a", "b"]


@pytest.mark.parametrize("over,values,needle", [("temperature", "0,3", "from 0 to 2"), ("num_assistant_tokens", "0",
                         "whole number"), ("schedule", "fast", "schedule must be"), ("window", "1", "can sweep over"),
                         ("temperature", "0,0", "each value once")])
def test_bad_sweep_values_are_refused(over, values, needle):
    with pytest.raises(ValueError, match=needle):
        parse_values(over, values)


def test_sweep_cli_writes_json_csv_and_plots_and_greedy_repeats_match_the_baseline(tiny_catalog_path, tmp_path):
    out = subprocess.run([sys.executable, "-m", "assistgen", "--catalog", str(tiny_catalog_path), "sweep", "--pair",
                          "tiny-text", "--task", "chat", "--text", "hello there", "--over", "temperature", "--values",
                          "0,1.0", "--repeats", "2", "--max-new-tokens", "6", "--json", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    greedy, sampled = result["points"]
    assert (greedy["value"], sampled["value"]) == (0.0, 1.0) and greedy["runs"] == sampled["runs"] == 2
    assert greedy["identical"] == [True, True] and sampled["identical"] is None
    for point in result["points"]:
        for key in ("speedup", "speedup_min", "speedup_max", "tokens_per_pass", "mean_acceptance_length",
                    "draft_acceptance_rate", "zero_accept_share"):
            assert point[key] is not None, key
        assert point["per_position"] and all(0 <= v <= 1 for v in point["per_position"])
        assert [r["settings"]["seed"] for r in point["each_run"]] == [0, 1]
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert [r["temperature"] for r in rows] == ["0.0", "1.0"]
    assert (tmp_path / "sweep.png").stat().st_size > 0 and (tmp_path / "break_even.png").stat().st_size > 0


def test_the_sweep_plot_shows_every_point_that_ran():
    from assistgen.comparison.sweep import Point, sweep_figure
    points = [Point(0.0, [fake_result(Settings(), "p", 1.2)]), Point(0.5, [fake_result(Settings(), "p", 1.1)]),
              Point(1.0)]   # not run yet
    fig = sweep_figure("temperature", points)
    speed, passes = fig.axes[0], fig.axes[1]
    assert list(speed.lines[0].get_xdata()) == [0, 1] and list(speed.lines[0].get_ydata()) == [1.2, 1.1]
    assert [t.get_text() for t in speed.get_xticklabels()] == ["0.0", "0.5", "1.0"]
    assert len(passes.lines) == 2 and len(fig.axes[3].lines) == 2   # tokens/pass and acceptance length; 2 curves
