"""python -m assistgen: listing, comparing, and clear exits on bad input."""
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT


def run(*args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def test_models_lists_every_pair_with_availability(tiny_catalog_path):
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "models", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["pair"]: row for row in json.loads(out.stdout)}
    assert rows["tiny-text"]["available"] is True
    assert rows["tiny-missing"]["available"] is False and "does not exist" in rows["tiny-missing"]["reason"]


def test_compare_prints_one_json_object(tiny_catalog_path):
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "compare", "--pair", "tiny-text", "--task",
              "chat", "--text", "hello there", "--max-new-tokens", "6", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["identical"] is True and result["baseline"]["new_tokens"] >= 1
    for key in ("latency_s", "new_tokens", "target_passes", "tokens_per_pass", "acceptance_rate"):
        assert key in result["assisted"]
    assert "speedup" in result
    assert result["machine"]["cpu"] and result["machine"]["probe_ms_per_target_pass"] > 0   # where it was measured
    acc = result["assisted"]["acceptance"]   # vLLM's vocabulary, from the same steps as the JSON's trace
    drafting = [s for s in result["assisted"]["steps"] if s["candidates"]]
    assert acc["drafting_passes"] == len(drafting)
    assert acc["accepted_tokens"] == sum(s["accepted"] for s in drafting)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["accepted_tokens"] / len(drafting), abs=1e-4)
    assert len(acc["per_position"]) == max(len(s["candidates"]) for s in drafting)
    assert result["baseline"]["acceptance"]["drafting_passes"] == 0
    assert "break_even" in result


def test_compare_json_accounts_for_every_assistant_pass(tiny_catalog_path):
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "compare", "--pair", "tiny-text", "--task",
              "chat", "--text", "def fibonacci(n):", "--max-new-tokens", "40", "--schedule", "adaptive", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    steps = result["assisted"]["steps"]
    # each assistant pass drafted one token, which the target then verified or the schedule withheld
    assert result["assisted"]["assistant_passes"] == sum(len(s["candidates"]) + s["withheld"] for s in steps)
    assert result["identical"] is True and result["settings"]["schedule"] == "adaptive"


@pytest.mark.parametrize("args,needle", [
    (["--pair", "nope", "--task", "chat", "--text", "x"], "unknown pair 'nope'"),
    (["--pair", "tiny-text", "--task", "asr", "--text", "x"], "does not do speech recognition; it does chat"),
    (["--pair", "tiny-text", "--task", "chat", "--text", "x", "--max-new-tokens", "0"], "--max-new-tokens must be"),
    (["--pair", "tiny-text", "--task", "chat", "--text", "x", "--num-assistant-tokens", "0"],
     "--num-assistant-tokens must be from 1 to 64"),
    (["--pair", "tiny-missing", "--task", "chat", "--text", "x"], "unavailable"),
    (["--pair", "tiny-speech", "--task", "asr", "--audio", "/no/such.wav"], "missing"),
])
def test_bad_arguments_exit_2_with_a_message(tiny_catalog_path, args, needle):
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "compare", *args)
    assert out.returncode == 2
    assert needle in out.stderr and "Traceback" not in out.stderr


def test_a_bad_catalog_stops_the_cli_and_the_app_without_a_traceback(tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text("pairs: [{name: x, tasks: [dance]}]\n")
    for args in (["-m", "assistgen", "models"], ["app.py"]):
        out = run(*args, env={"ASSISTGEN_CATALOG": str(bad)})
        assert out.returncode == 2
        assert "key 'tasks'" in out.stderr and "Traceback" not in out.stderr


def test_every_option_of_every_command_has_help_text():
    import argparse

    from assistgen.tools.cli import build_parser
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"models", "prepare", "compare", "bench", "engine-bench"} <= set(commands)
    missing = [f"{name} {' / '.join(action.option_strings) or action.dest}"
               for name, command in [("", parser), *commands.items()] for action in command._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not (action.help or "").strip()]
    assert not missing, f"options without help text: {missing}"


def test_compare_sweep_and_bench_take_the_pages_names_and_the_ids(tiny_catalog_path):
    from assistgen.comparison.sweep import parse_values
    from assistgen.tools.cli import build_parser
    parse = build_parser().parse_args
    for task, source, ids in (("speech-recognition", "assistant+lookup", ("asr", "assistant_lookup")),
                              ("asr", "prompt_lookup", ("asr", "prompt_lookup")),
                              ("Chat", "prompt-lookup", ("chat", "prompt_lookup"))):
        for command in ("compare", "sweep"):
            over = ["--over", "temperature", "--values", "0"] if command == "sweep" else []
            args = parse([command, "--pair", "p", "--task", task, "--text", "x", "--draft-source", source, *over])
            assert (args.task, args.draft_source) == ids
    args = parse(["bench", "--pair", "p", "--draft-sources", "assistant+lookup,prompt-lookup,assistant_lookup"])
    assert args.draft_sources == ["assistant_lookup", "prompt_lookup"]
    assert parse_values("draft_source", "assistant+lookup,prompt_lookup") == ["assistant_lookup", "prompt_lookup"]
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "compare", "--pair", "tiny-text", "--task",
              "dance", "--text", "x")
    assert out.returncode == 2 and "unknown task 'dance'" in out.stderr


def test_fetch_downloads_a_pairs_hub_models_and_fails_clearly_offline(monkeypatch, capsys, tmp_path):
    import huggingface_hub

    from assistgen.models import availability, fetch
    from assistgen.tools.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    availability.hub_reachable.cache_clear()
    assert main(["fetch", "--pair", "whisper-small.en+distil-small.en"]) == 2
    assert "cannot fetch openai/whisper-small.en: the hub is switched off here (HF_HUB_OFFLINE=1)" in (
        capsys.readouterr().err)
    fetched = []
    monkeypatch.setattr(fetch, "hub_reachable", lambda: (True, "the hub is reachable"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, allow_patterns: fetched.append(
        (repo, allow_patterns)) or str(tmp_path / repo))
    assert main(["fetch", "--pair", "whisper-small.en+distil-small.en"]) == 0
    assert [repo for repo, _ in fetched] == ["openai/whisper-small.en", "distil-whisper/distil-small.en"]
    assert all("*.safetensors" in patterns and not any("bin" in p for p in patterns) for _, patterns in fetched)
    availability.hub_reachable.cache_clear()


@pytest.mark.parametrize("command", [["sweep", "--pair", "tiny-text", "--task", "chat", "--text", "hi", "--over",
                                      "temperature", "--values", "0"], ["bench", "--pair", "tiny-text",
                                                                        "--prompts", "PROMPTS", "--limit", "1"]])
def test_an_out_folder_that_cannot_be_made_is_refused_before_any_model_runs(tiny_catalog_path, tmp_path, monkeypatch,
                                                                            capsys, command):
    from assistgen.tools.cli import main
    in_the_way = tmp_path / "results"
    in_the_way.write_text("a file")
    (tmp_path / "prompts.txt").write_text("hello\n")
    monkeypatch.setattr("assistgen.tools.bench.load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr("assistgen.tools.sweep.ModelPool", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [str(tmp_path / "prompts.txt") if word == "PROMPTS" else word for word in command]
    assert main(["--catalog", str(tiny_catalog_path), *argv, "--out", str(in_the_way)]) == 2
    assert "a file is in the way; name a folder" in capsys.readouterr().err


def test_compare_and_models_speak_the_pages_words(tiny_catalog_path):
    out = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "compare", "--pair", "tiny-text", "--task",
              "chat", "--text", "hello there", "--max-new-tokens", "3")
    assert out.returncode == 0, out.stderr
    runs = [line for line in out.stdout.splitlines() if "tokens/pass" in line]
    # why each run stopped: at the budget, or at the model's end of sequence before it
    assert len(runs) == 2 and all(line.endswith(("stopped at --max-new-tokens", "ended by the model")) for line in runs)
    listing = run("-m", "assistgen", "--catalog", str(tiny_catalog_path), "models").stdout
    assert "tiny-speech  [speech recognition]  available\n" in listing
    assert "tiny-missing  [chat]  UNAVAILABLE: " in listing and "available: available" not in listing
