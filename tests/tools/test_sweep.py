"""python -m assistgen sweep, and the sweep loop the page's Explore tab shares with it."""
import csv
import json
import os
import subprocess
import sys
import threading

import pytest

from assistgen.comparison.compare import Settings, compare
from assistgen.comparison.sweep import parse_values, run_sweep, sweep_csv, sweep_json
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

    def run_one(settings, pair, on_step):
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
                   lambda s, pair, on_step: pairs.append(pair) or fake_result(s, pair, 1.0)))
    assert pairs == ["a", "b"]


@pytest.mark.parametrize("over,values,needle", [
    ("temperature", "0,3", "from 0.001 to 2"), ("temperature", "1e-40", "from 0.001 to 2"),
    ("num_assistant_tokens", "0", "whole number"), ("num_assistant_tokens", "\u00b2", "whole number"),
    ("schedule", "fast", "schedule must be"), ("window", "1", "can sweep over"),
    ("draft_source", "guess", "draft source must"), ("temperature", "0,0", "each value once")])
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
    from assistgen.comparison.sweep import Point
    from assistgen.views.plots import sweep_figure
    points = [Point(0.0, [fake_result(Settings(), "p", 1.2)]), Point(0.5, [fake_result(Settings(), "p", 1.1)]),
              Point(1.0)]   # not run yet
    fig = sweep_figure("temperature", points)
    speed, passes = fig.axes[0], fig.axes[1]
    assert list(speed.lines[0].get_xdata()) == [0, 1] and list(speed.lines[0].get_ydata()) == [1.2, 1.1]
    assert [t.get_text() for t in speed.get_xticklabels()] == ["0.0", "0.5", "1.0"]
    assert len(passes.lines) == 2 and len(fig.axes[3].lines) == 2   # tokens/pass and acceptance length; 2 curves


def test_the_explore_figures_leave_the_pages_label_band_free():
    """The page lays each plot's label over the figure's top-left corner: titles and panels start below it."""
    from assistgen.comparison.sweep import Point
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from assistgen.views.plots import LABEL_BAND_IN, sweep_break_even_figure, sweep_figure
    points = [Point(0.0, [fake_result(Settings(), "p", 1.2)]), Point(0.5, [fake_result(Settings(), "p", 1.1)])]
    for fig, title in ((sweep_figure("temperature", points, title="pair, Chat"), "pair, Chat"),
                       (sweep_break_even_figure(points), None)):
        band = 1 - LABEL_BAND_IN / fig.get_figheight()
        canvas = FigureCanvasAgg(fig)   # the figures come closed
        canvas.draw()
        renderer = canvas.get_renderer()
        tops = [ax.get_tightbbox(renderer).y1 / fig.bbox.height for ax in fig.axes]   # panels with their titles
        assert max(tops) <= band
        if title:
            assert fig.get_suptitle() == title and fig._suptitle.get_window_extent(renderer).y1 / fig.bbox.height <= band


@pytest.fixture(scope="module")
def tiny_text(tiny_catalog_path):
    """The tiny text pair, loaded, and a prompt's inputs."""
    from assistgen.comparison.tasks import text_inputs
    from assistgen.models.catalog import load_catalog
    from assistgen.models.pool import ModelPool
    pair = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-text")
    return pair, text_inputs(pair, "chat", "hello there")


def comparing(pair, inputs, around_step=None):
    """A sweep's `run_one` on a loaded pair: a full comparison, each decoding step through `around_step(step,
    on_step)` when given."""
    def run_one(settings, name, on_step):
        step = on_step if around_step is None else (lambda s: around_step(s, on_step))
        return compare(pair, "chat", inputs, settings, on_baseline_step=step, on_assisted_step=step).to_dict()
    return run_one


def test_a_sweep_stopped_after_its_first_point_keeps_exactly_that_point_and_says_so(tiny_text):
    stop = threading.Event()
    progresses = []
    for progress in run_sweep("temperature", [0.0, 1.0, 0.5], 1, Settings(max_new_tokens=6), "tiny-text",
                              comparing(*tiny_text), stop=stop):
        progresses.append(progress)
        stop.set()   # Stop pressed once the first point is on the plot
    first, last = progresses
    assert (first.done, first.stopped) == (1, False)
    assert (last.done, last.total, last.stopped) == (1, 3, True)
    assert [len(p.runs) for p in last.points] == [1, 0, 0]
    assert "Stopped by the user after 1 of 3 points" in last.stop_message
    result = sweep_json("temperature", last.points, last.state())
    assert [p["value"] for p in result["points"]] == [0.0] and result["values"] == [0.0, 1.0, 0.5]
    assert (result["points_done"], result["points_planned"], result["stopped"]) == (1, 3, last.stop_message)
    assert len(sweep_csv("temperature", last.points).strip().splitlines()) == 2   # the header and the one point


def test_a_stop_takes_effect_at_the_next_decoding_step_inside_a_point(tiny_text):
    """The stop is pressed during the second point's second decoding step: that point stops at its next step and
    is dropped; the first is kept whole."""
    stop = threading.Event()
    steps = []           # decoding steps run, per point started
    after_stop = []

    def around_step(step, on_step):
        if stop.is_set():
            after_stop.append(step)
        steps[-1] += 1
        on_step(step)    # raises once the stop is set
        if len(steps) == 2 and steps[-1] == 2:
            stop.set()
    run_one = comparing(*tiny_text, around_step)

    def counted(settings, name, on_step):
        steps.append(0)
        return run_one(settings, name, on_step)
    progresses = list(run_sweep("temperature", [0.0, 1.0, 0.5], 1, Settings(max_new_tokens=12), "tiny-text",
                                counted, stop=stop))
    assert len(after_stop) <= 1                          # at most the step under way when Stop was pressed
    assert len(steps) == 2 and steps[1] == 3 and steps[0] > 3   # the second point stopped well short of its end
    assert [p.done for p in progresses] == [1, 1] and progresses[-1].stopped
    assert [len(p.runs) for p in progresses[-1].points] == [1, 0, 0]   # the partly-run point is not shown


def test_ctrl_c_stops_the_sweep_cli_at_its_next_step_and_writes_the_finished_runs(tiny_catalog_path, tmp_path):
    import signal
    values = "0,0.2,0.4,0.6,0.8,1.0,1.2,1.4"   # 80 runs: far more than run before the signal lands
    sweep = subprocess.Popen([sys.executable, "-m", "assistgen", "--catalog", str(tiny_catalog_path), "sweep",
                              "--pair", "tiny-text", "--task", "chat", "--text", "hello there", "--over",
                              "temperature", "--values", values, "--repeats", "10", "--max-new-tokens", "24", "--json",
                              "--out", str(tmp_path)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    for line in sweep.stderr:
        if line.startswith("[1/80]"):
            sweep.send_signal(signal.SIGINT)
            break
    out, err = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, err
    result = json.loads(out)
    assert 1 <= result["points_done"] < result["points_planned"] == 80
    assert result["stopped"].startswith(f"Stopped by the user after {result['points_done']} of 80 points")
    assert sum(p["runs"] for p in result["points"]) == result["points_done"]
    assert json.loads((tmp_path / "sweep.json").read_text())["stopped"] == result["stopped"]


def test_a_value_at_which_nothing_was_drafted_says_so_instead_of_a_prediction():
    from assistgen.tools.sweep import sweep_table

    def run_one(settings, pair, on_step):
        result = fake_result(settings, pair, 1.0)
        if settings.temperature > 0:   # the assistant never started: the run was plain decoding
            result["assisted"]["acceptance"] = {**result["assisted"]["acceptance"], "drafting_passes": 0}
        return result
    points = list(run_sweep("temperature", [0.0, 1.0], 1, Settings(max_new_tokens=8), "p", run_one))[-1].points
    summaries = [p.summary() for p in points]
    assert [s["drafted"] for s in summaries] == [True, False]
    rows = sweep_table("temperature", summaries).splitlines()[2:]
    assert "nothing drafted" not in rows[0] and "| nothing drafted |" in rows[1]
