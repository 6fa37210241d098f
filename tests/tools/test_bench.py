"""python -m assistgen bench on tiny random models: every configuration runs, the files are written, and the
summary is computed from the runs (no timing is asserted)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from assistgen.tools.bench import Item, half, read_items
from assistgen.tools.report import ranking, summarize

from helpers import CPU_ONLY, ROOT


def bench(catalog, out, *args):
    return subprocess.run([sys.executable, "-m", "assistgen", "--catalog", str(catalog), "bench", "--pair",
                           "tiny-text", "--out", str(out), "--no-floor", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_bench_writes_results_tables_and_plots(tiny_catalog_path, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"text": "hello there", "name": "hello"}\n{"text": "one two three one two three one"}\n')
    out = bench(tiny_catalog_path, tmp_path / "out", "--prompts", str(prompts), "--suite", "translation",
                "--limit", "2", "--temperatures", "0,0.8", "--schedules", "heuristic,adaptive",
                "--draft-sources", "assistant,prompt_lookup", "--peer", "--max-new-tokens", "8", "--repeats", "2")
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = results["runs"]
    assert not [r for r in runs if "error" in r], [r["error"] for r in runs if "error" in r]
    configs = {r["config"] for r in runs}
    assert configs == {"baseline", "heuristic", "adaptive", "prompt lookup heuristic", "prompt lookup adaptive",
                       "transformers heuristic", "transformers defaults"}
    # 2 sets x 2 items x 2 temperatures x 2 repeats, each with every configuration
    assert len(runs) == 2 * 2 * 2 * 2 * len(configs)
    greedy = [r for r in runs if r["temperature"] == 0]
    assert all(r["identical"] for r in greedy), [r for r in greedy if not r["identical"]]
    assert all(r["identical"] is None for r in runs if r["temperature"] > 0)
    ours = [r for r in runs if r["engine"] == "assistgen" and r["config"] != "baseline"]
    assert all(r["target_passes"] >= 1 and r["tokens_per_pass"] >= 1 for r in ours)
    assert {r["item"] for r in runs} == {"hello", "mine-2", "translation-1", "translation-2"}
    assert all(r["drafting_s"] >= 0 and r["verifying_s"] > 0 for r in ours)
    summary = {(s["suite"], s["temperature"], s["config"]): s for s in results["summary"]}
    assert summary[("mine", 0.0, "heuristic")]["runs"] == 4
    assert summary[("mine", 0.0, "heuristic")]["identical_share"] == 1.0
    acceptance_fields = ("mean_acceptance_length", "draft_acceptance_rate", "per_position", "zero_accept_share")
    for run in ours:   # the acceptance figures, as compare --json and the sweep give them
        assert set(acceptance_fields) <= set(run["acceptance"])
    for s in results["summary"]:
        assert set(acceptance_fields) <= set(s)
        if s["config"] == "heuristic":
            assert s["mean_acceptance_length"] >= 1.0 and s["per_position"], s
    md = (tmp_path / "out" / "results.md").read_text()
    assert "| tiny-text | mine | 0 | heuristic | 4 |" in md and "transformers heuristic" in md
    assert "## Where the time goes" in md
    for png in ("speedup_vs_temperature.png", "speedup_by_task.png", "tokens_per_pass.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_bench_refuses_bad_arguments_with_exit_2(tiny_catalog_path, tmp_path):
    out = bench(tiny_catalog_path, tmp_path, "--suite", "speech")
    assert out.returncode == 2 and "does not do asr" in out.stderr
    out = bench(tiny_catalog_path, tmp_path, "--prompts", str(tmp_path / "none.txt"))
    assert out.returncode == 2 and "none.txt" in out.stderr
    out = bench(tiny_catalog_path, tmp_path)
    assert out.returncode == 2 and "nothing to run" in out.stderr
    out = bench(tiny_catalog_path, tmp_path, "--suite", "chat", "--temperatures", "0,7")
    assert out.returncode == 2 and "each temperature must be 0 (greedy) or from 0.001 to 2" in out.stderr


def test_prompt_files_and_audio_folders(tmp_path):
    txt = tmp_path / "p.txt"
    txt.write_text("first\n\nsecond line\\nwith a newline\n")
    items = read_items("p", "chat", txt)
    assert [i.text for i in items] == ["first", "second line\nwith a newline"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no text key"}\n')
    try:
        read_items("bad", "chat", bad)
    except ValueError as exc:
        assert "bad.jsonl:1" in str(exc)
    else:
        raise AssertionError("a jsonl line without text was accepted")
    clips = read_items("speech", "asr", ROOT / "bench" / "inputs" / "speech")
    assert len(clips) >= 5 and all(Path(c.audio).suffix == ".wav" for c in clips)


def test_a_set_splits_into_a_tuning_half_and_a_held_out_half_that_items_added_later_leave_alone():
    items = [Item("s", "chat", f"s-{n}", text=str(n)) for n in range(1, 6)]
    tuning, held_out = half(items, "tuning"), half(items, "held-out")
    assert [i.name for i in tuning] == ["s-1", "s-3", "s-5"] and [i.name for i in held_out] == ["s-2", "s-4"]
    assert half(items, None) == items
    longer = items + [Item("s", "chat", "s-6", text="6")]
    assert half(longer, "tuning") == tuning and half(longer, "held-out")[:2] == held_out
    with pytest.raises(ValueError, match="half must be one of"):
        half(items, "test")


def test_the_ranking_counts_every_suite_once_and_puts_a_configuration_that_changed_the_output_last():
    def s(suite, config, speedup, identical=1.0, engine="assistgen"):
        return {"pair": "p", "suite": suite, "temperature": 0.0, "config": config, "speedup": speedup,
                "identical_share": identical, "engine": engine}
    summary = [s("code", "baseline", 1.0),
               s("code", "a", 3.0), s("chat", "a", 1.0), s("translation", "a", 1.0),    # one suite carries it
               s("code", "b", 1.6), s("chat", "b", 1.5), s("translation", "b", 1.4),    # every suite gains
               s("code", "c", 9.0, identical=0.5), s("chat", "c", 9.0), s("translation", "c", 9.0),
               s("code", "llama.cpp plain", 2.0, engine="llama.cpp")]
    ranked = ranking(summary)
    assert [r["config"] for r in ranked] == ["b", "a", "c"]
    assert ranked[0]["geomean"] == pytest.approx((1.6 * 1.5 * 1.4) ** (1 / 3))
    assert ranked[1]["worst"] == 1.0 and ranked[1]["by_suite"] == {"code": 3.0, "chat": 1.0, "translation": 1.0}
    assert not ranked[2]["exact"] and ranked[0]["exact"]


def test_bench_runs_a_held_out_half_with_several_windows_and_ranks_them(tiny_catalog_path, tmp_path):
    out = bench(tiny_catalog_path, tmp_path / "out", "--suite", "translation", "--half", "held-out",
                "--num-assistant-tokens", "2,4", "--schedules", "heuristic", "--max-new-tokens", "6")
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["meta"]["half"] == "held-out"
    assert {r["item"] for r in results["runs"]} == {"translation-2", "translation-4", "translation-6"}
    assert {r["config"] for r in results["runs"]} == {"baseline", "heuristic, window 2", "heuristic, window 4"}
    first = [r for r in results["runs"] if r["config"] == "heuristic, window 2"]
    assert all(r["windows"][0] == 2 for r in first)   # the window each configuration names is the one it ran
    assert all(r["windows"][0] == 4 for r in results["runs"] if r["config"] == "heuristic, window 4")
    md = (tmp_path / "out" / "results.md").read_text()
    assert "held-out half of each set" in md and "## Choosing a default" in md
    out = bench(tiny_catalog_path, tmp_path / "out", "--suite", "translation", "--num-assistant-tokens", "2,x")
    assert out.returncode == 2 and "whole numbers" in out.stderr


def test_summary_medians_and_spread():
    def row(item, speedup, identical=True, tpp=2.0):
        return {"suite": "s", "task": "chat", "item": item, "repeat": 0, "temperature": 0.0, "config": "heuristic",
                "latency_s": 1.0 / speedup, "baseline_latency_s": 1.0, "speedup": speedup, "identical": identical,
                "tokens_per_pass": tpp}
    rows = [row("a", 0.9), row("b", 1.5, tpp=4.0), row("c", 1.2, identical=False), row("d", 3.0)]
    rows.append({"suite": "s", "item": "e", "config": "heuristic", "error": "boom"})
    (s,) = summarize(rows)
    assert s["runs"] == 4 and s["speedup"] == 1.35 and (s["speedup_min"], s["speedup_max"]) == (0.9, 3.0)
    assert s["identical_share"] == 0.75 and s["tokens_per_pass"] == 2.0


def test_the_floor_counts_every_weight_once_but_only_one_embedding_row():
    from types import SimpleNamespace

    import helpers as tm
    from assistgen.tools.passcosts import floor
    from assistgen.models.cpu import use_onednn_linears
    from assistgen.models.loading import _count
    model = tm.qwen2(0)
    _, nbytes = _count(model)
    use_onednn_linears(model)  # as loading does on CPU: the linear weights leave parameters()
    embedding = model.get_input_embeddings().weight
    pair = SimpleNamespace(target=SimpleNamespace(model=model, num_bytes=nbytes))
    result = floor(pair, bandwidth_gb_s=10.0)
    assert result["bytes_per_token"] == nbytes - embedding.numel() * 4
    assert result["floor_ms_per_token"] == round(1000 * result["bytes_per_token"] / 10e9, 2)


@CPU_ONLY
def test_the_floor_of_an_int8_target_counts_its_packed_weights_and_no_embedding_table():
    from types import SimpleNamespace

    import helpers as tm
    from assistgen.models import quantized
    from assistgen.models.loading import weight_bytes
    from assistgen.tools.passcosts import floor
    model = tm.llama(0)   # tied: its float output layer reads the whole embedding table at every token
    embedding = model.get_input_embeddings().weight

    def per_token():
        nbytes = weight_bytes(model, torch.float32)   # as loading counts it
        return nbytes, floor(SimpleNamespace(target=SimpleNamespace(model=model, num_bytes=nbytes)), 10.0)
    nbytes, tied = per_token()
    assert tied["bytes_per_token"] == nbytes
    quantized.quantize(model, quantized.RowInt8Linear)   # the output layer gets an int8 copy of the table
    nbytes, result = per_token()
    int8 = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, quantized.Int8Linear))
    assert result["bytes_per_token"] == nbytes - embedding.numel() * 4
    assert int8 < result["bytes_per_token"] < int8 + embedding.numel()   # one byte a weight, norms beside


def test_bench_without_a_token_budget_runs_each_pair_at_its_own(tiny_catalog_path, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("count with me: one two three four five six seven eight\n")
    out = bench(tiny_catalog_path, tmp_path / "out", "--prompts", str(prompts))
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["meta"]["max_new_tokens"] == {"tiny-text": 24}   # the pair's default in its catalog
    assert max(r["new_tokens"] for r in results["runs"]) == 24
    assert "max_new_tokens each pair's own (tiny-text: 24)" in (tmp_path / "out" / "results.md").read_text()


def test_the_floor_of_an_encoder_decoder_model_leaves_its_encoder_out():
    from types import SimpleNamespace

    import helpers as tm
    from assistgen.models.cpu import use_onednn_linears
    from assistgen.models.loading import _count
    from assistgen.tools.passcosts import floor
    model = tm.whisper(0)
    _, nbytes = _count(model)
    encoder = _count(model.get_encoder())[1]
    assert 0 < encoder < nbytes
    use_onednn_linears(model)  # as loading does on CPU: the encoder's linear weights leave parameters() too
    result = floor(SimpleNamespace(target=SimpleNamespace(model=model, num_bytes=nbytes)), bandwidth_gb_s=10.0)
    assert result["bytes_per_token"] == nbytes - encoder   # Whisper's output layer shares the embedding table


def test_a_peer_that_leaves_each_windows_end_of_text_out_gave_the_same_output():
    from assistgen.engine.decoding import GenerationResult, joined
    from assistgen.tools.bench import same_output, window_tokens
    eos = 9
    ours = window_tokens(joined([GenerationResult([5, 6, eos], [], 1, 0, 0.1),
                                 GenerationResult([7, eos], [], 1, 0, 0.1)]))
    assert ours == [[5, 6, eos], [7, eos]]
    assert same_output([[5, 6], [7]], ours, {eos})   # transformers' Whisper returns each window without its EOS
    assert not same_output([[5, 6], [8]], ours, {eos})
    assert not same_output([[5], [6, 7]], ours, {eos})   # the same tokens, split elsewhere
    assert not same_output([[5, 6, 7]], ours, {eos})
    assert window_tokens(GenerationResult([1, 2, eos], [], 1, 0, 0.1)) == [[1, 2, eos]]


def test_the_bench_computes_each_temperatures_figures_as_the_sweep_does(tiny_catalog_path, monkeypatch):
    """A temperature in the benchmark is a point of a temperature sweep: the same order and seeds
    (`sweep_plan`, `point_settings`) and the same figures (`point_figures`). On the same seeded tiny run, the
    bench's per-temperature figures other than timings equal the sweep's."""
    from assistgen.comparison import sweep
    from assistgen.comparison.compare import Settings, compare
    from assistgen.comparison.tasks import text_inputs
    from assistgen.models.catalog import load_catalog
    from assistgen.models.pool import ModelPool
    from assistgen.tools import bench, report
    from assistgen.tools.bench import Item, run_bench
    pair = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-text")
    calls = {"plan": 0, "settings": 0, "figures": 0}

    def counting(name, fn):
        def counted(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return counted
    monkeypatch.setattr(bench, "sweep_plan", counting("plan", sweep.sweep_plan))
    monkeypatch.setattr(bench, "point_settings", counting("settings", sweep.point_settings))
    monkeypatch.setattr(report, "point_figures", counting("figures", sweep.point_figures))
    rows = run_bench(pair, [Item("mine", "chat", "hello", text="hello there")], temperatures=[0.0, 1.0],
                     draft_sources=["assistant"], schedules=["heuristic"], repeats=2, max_new_tokens=8)
    summary = {(s["temperature"], s["config"]): s for s in report.summarize(rows)}
    assert calls["plan"] == 1 and calls["settings"] == len(rows) and calls["figures"] == len(summary) == 4
    assert [(r["repeat"], r["temperature"]) for r in rows if r["config"] == "heuristic"] == [
        (0, 0.0), (0, 1.0), (1, 0.0), (1, 1.0)]   # the sweep's order

    inputs = text_inputs(pair, "chat", "hello there")
    base = Settings(max_new_tokens=8, draft_source="assistant", num_assistant_tokens=pair.spec.num_assistant_tokens,
                    schedule="heuristic")
    *_, last = sweep.run_sweep("temperature", [0.0, 1.0], 2, base, "tiny-text",
                               lambda settings, name, on_step: compare(pair, "chat", inputs, settings).to_dict())
    for point in last.points:
        swept, benched = point.summary(), summary[(point.value, "heuristic")]
        assert benched["runs"] == swept["runs"] == 2
        for key in ("tokens_per_pass", *sweep.ACCEPTANCE_KEYS, "per_position"):
            assert benched[key] == swept[key], (point.value, key)
    assert summary[(1.0, "heuristic")]["per_position"]   # sampled drafts were judged, position by position
