"""The assisted output's colouring and the per-pass chart, from the steps of a comparison."""
from assistgen.app.render import assisted_html, steps_figure

STEPS = [{"candidates": [7, 8], "accepted": 1, "emitted": [7, 9], "window": 5, "withheld": 2},
         {"candidates": [], "accepted": 0, "emitted": [4], "window": 5, "withheld": 1}]
PIECES = ["seven", "nine", "four"]


def test_each_token_is_coloured_by_its_fate_and_titled_with_its_pass():
    html = assisted_html(STEPS, PIECES, lambda t: f"<{t}>")
    assert "class='ag-acc'" in html and "seven" in html  # accepted draft
    assert "class='ag-rej'" in html and "&lt;8&gt;" in html  # the rejected draft, escaped
    assert "pass 1: verified 2 (+2 withheld), accepted 1" in html
    assert "pass 2: verified 0 (+1 withheld), accepted 0" in html


def test_the_chart_says_what_each_line_is_and_shows_withheld_drafts_only_when_there_are_some():
    labels = [t.get_text() for t in steps_figure(STEPS, 3).axes[0].get_legend().get_texts()]
    assert labels == ["window: most drafts the schedule allowed (initial 3)", "drafts verified", "drafted, withheld",
                      "drafts accepted"]
    plain = [{**s, "withheld": 0} for s in STEPS]
    assert "drafted, withheld" not in [t.get_text() for t in steps_figure(plain).axes[0].get_legend().get_texts()]


def test_a_loads_progress_is_in_the_status_line():
    """The page hides Gradio's animated progress overlay (it cost the timed runs CPU), so the status says it."""
    from assistgen.app.render import LiveView
    from assistgen.app.streaming import Snapshot
    view = LiveView()
    assert view.outputs(Snapshot("loading", "waiting for the model worker"))["status"] == \
        "**loading**: waiting for the model worker"
    status = view.outputs(Snapshot("loading", "qwen2.5-coder-1.5b-instruct: packing", fraction=0.42))["status"]
    assert status == "**loading**: qwen2.5-coder-1.5b-instruct: packing (42%)"


def test_a_snapshot_that_comes_again_unchanged_sends_nothing(tiny_catalog_path):
    """The stream yields its snapshot again after a second without events (so that a run can be stopped); during the
    timed runs anything sent makes work for the server and the browser, so an unchanged snapshot sends nothing."""
    from assistgen.app.render import LiveView
    from assistgen.app.streaming import Snapshot
    from assistgen.models.catalog import load_catalog
    from assistgen.models.pool import ModelPool
    pair = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-text")
    view = LiveView()
    waiting = Snapshot("loading", "waiting for the model worker")
    assert set(view.outputs(waiting)) == {"status", "baseline_html", "assisted_html"}   # a new run clears both, once
    assert view.outputs(waiting) == {}
    probing = Snapshot("probe", "timing a fixed target pass", pair=pair)
    assert set(view.outputs(probing)) == {"status", "baseline_html"}   # the baseline's panel shows "…", once
    assert view.outputs(probing) == {}
    probing.baseline_tokens.extend([5, 6])
    assert set(view.outputs(probing)) == {"baseline_html"}
    assert view.outputs(probing) == {}


def test_the_panels_update_less_often_when_no_core_is_spare_for_it(monkeypatch):
    """Each streamed update costs CPU outside the runs' own work: with every core running torch's threads, the panels
    update every two seconds; with a core to spare, every second; the environment variable overrides both."""
    import torch

    from assistgen.app import service
    monkeypatch.delenv("ASSISTGEN_UPDATE_INTERVAL_S", raising=False)
    monkeypatch.setattr(service, "default_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(service, "usable_cpus", lambda: 2)
    assert service.update_interval_s() == service.UPDATE_INTERVAL_NO_SPARE_S == 2.0
    monkeypatch.setattr(service, "usable_cpus", lambda: 4)
    assert service.update_interval_s() == service.UPDATE_INTERVAL_S == 1.0
    monkeypatch.setenv("ASSISTGEN_UPDATE_INTERVAL_S", "0.25")
    assert service.update_interval_s() == 0.25


def test_a_run_whose_first_pass_verified_every_draft_is_explained_without_empty_figures():
    """A short clip can come back in one target pass (the schedule drafted it all first): the page says so, instead
    of "0 passes × n/a"; with as many passes as the baseline, the pass costs are still explained."""
    from assistgen.app.render import explanation, figures_markdown
    from assistgen.comparison.compare import run_figures
    from assistgen.engine.decoding import GenerationResult, Step
    plain = GenerationResult([5, 6, 7], [Step([], 0, [t], 0, 0.0, 0.02) for t in (5, 6, 7)], 3, 0, 0.5, "eos", 0.4)
    one = GenerationResult([5, 6, 7], [Step([5, 6], 2, [5, 6, 7], 32, 0.01, 0.03)], 1, 3, 0.45, "eos", 0.4)
    result = {"baseline": run_figures(plain, "x"), "assisted": run_figures(one, "x")}
    text = explanation(result)
    assert "no later pass + " in text and "The target ran 1 pass instead of 3." in text
    assert "n/a" not in text and "0 passes" not in text
    table = figures_markdown(result["assisted"], assisted=True)
    assert "none: every token came from the first target pass" in table and "n/a" not in table
    several = GenerationResult([5, 6, 7], [Step([5], 1, [5, 6], 5, 0.01, 0.03), Step([], 0, [7], 5, 0.0, 0.03)], 2, 1,
                               0.47, "eos", 0.4)
    text = explanation({"baseline": run_figures(plain, "x"), "assisted": run_figures(several, "x")})
    assert "1 pass × 30.0 ms verifying" in text and "The target ran 2 passes instead of 3. A verifying pass" in text
    rejected = GenerationResult([5, 6, 7], [Step([9], 0, [5], 5, 0.01, 0.03), Step([8], 0, [6], 5, 0.01, 0.03),
                                            Step([4], 0, [7], 5, 0.01, 0.03)], 3, 3, 0.6, "eos", 0.4)
    text = explanation({"baseline": run_figures(plain, "x"), "assisted": run_figures(rejected, "x")})
    assert "The target ran" not in text and "A verifying pass cost 1.50× a plain one, and drafting added 0.02 s." in text
    assert "from the cache" not in text
    kept = [GenerationResult(r.new_tokens, r.steps, r.target_passes, r.assistant_passes, r.latency_s, r.stop_reason,
                             r.setup_s, prompt_tokens_kept=37) for r in (plain, rejected)]
    text = explanation({"baseline": run_figures(kept[0], "x"), "assisted": run_figures(kept[1], "x")})
    assert "Both first steps took the prompt's first 37 tokens (the chat template's, and the task's" in text


def test_the_summary_names_draft_source_pair_kind_and_machine_in_words():
    """The summary speaks the page's words ("assistant + prompt lookup", "same tokenizer"), not ids, and names the
    machine the figures were measured on, as the JSON does."""
    from assistgen.app.render import summary_html
    from assistgen.comparison.compare import run_figures
    from assistgen.engine.decoding import GenerationResult, Step
    from assistgen.models.machine import machine
    plain = GenerationResult([5, 6], [Step([], 0, [t], 0, 0.0, 0.02) for t in (5, 6)], 2, 0, 0.5, "eos", 0.4)
    facts = machine({"before": 0.30, "between": 0.32, "after": 0.40})
    assert facts["probe_ms_per_target_pass"] == 320.0 and facts["cores_used"] >= 1 and facts["cpu"]
    result = {"baseline": run_figures(plain, "x"), "assisted": run_figures(plain, "x"), "speedup": 1.0,
              "identical": True, "identical_note": "same tokens", "settings": {"temperature": 0},
              "draft_source": "assistant_lookup", "mode": "same-tokenizer", "stability": None, "machine": facts}
    html = summary_html(result)
    assert "assistant + prompt lookup drafts, same tokenizer" in html
    assert "assistant_lookup" not in html and "same-tokenizer" not in html
    assert f"{facts['cpu']}, {facts['cores_used']} of {facts['cores']} cores" in html and "320 ms" in html


def test_speech_shows_the_whole_path_from_the_file_and_text_does_not():
    from assistgen.app.render import end_to_end_text
    speech = {"prep": {"audio_decode_s": 0.031, "features_s": 0.052}, "end_to_end_s": {"baseline": 1.283,
                                                                                      "assisted": 0.583}}
    line = end_to_end_text(speech)
    assert "decoding 0.03 s and features 0.05 s" in line and "baseline took 1.28 s" in line and "0.58 s" in line
    assert end_to_end_text({"prep": None}) is None


def test_the_page_says_in_words_when_the_assistant_started_late_or_not_at_all():
    from assistgen.app.render import summary_html
    from assistgen.comparison.compare import run_figures
    from assistgen.engine.decoding import GenerationResult, Step
    plain = GenerationResult([5, 6], [Step([], 0, [t], 0, 0.0, 0.02) for t in (5, 6)], 2, 0, 0.5, "eos", 0.4)

    def page(start):
        assisted = GenerationResult([5, 6], [Step([], 0, [t], 5, 0.0, 0.02) for t in (5, 6)], 2, 0, 0.5, "eos", 0.4,
                                    assistant_start=start)
        return summary_html({"baseline": run_figures(plain, "x"), "assisted": run_figures(assisted, "x"),
                             "identical": True, "settings": {"temperature": 0.0}, "speedup": 1.0,
                             "identical_note": "identical", "draft_source": "assistant_lookup",
                             "mode": "same-tokenizer", "warnings": [], "mode_reason": ""})
    from assistgen.engine.drafting import AssistantStart
    refused = AssistantStart(1800, None, 2, estimated_prompt_s=1.9, estimated_prompt_tokens=1800,
                             saving_per_token_s=0.02, expected_tokens=2)
    reason = ("the assistant was not used: its prompt pass (about 1.9 s for 1,800 tokens) against about 20 ms saved "
              "a token pays back only after about 95 tokens, and when last asked the answer could be expected to run "
              "2 tokens more (it ended after 2 tokens); drafts came from the prompt (lookup) alone")
    assert f"<b>Assistant:</b> {reason}." in page(refused)
    assert "ag-assistant-start" not in page(AssistantStart(12, 0, 2, 0.1, 12))
    assert "ag-assistant-start" not in page(None)
