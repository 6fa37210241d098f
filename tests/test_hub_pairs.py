"""Every hub pair of models.yaml, proven without the hub: small random stand-ins saved under the catalog's exact repo
ids in a Hugging Face cache of the hub's own layout (tests/hub_cache.py), run offline (HF_HUB_OFFLINE=1) through the
CLI and the /compare API, as a user whose cache already holds those models runs them. The page runs them in
tests/app/test_space.py, in a simulated Space. The weight packages (requirements-weights.txt) are installed wherever
the tests run, so the test of a Space with them fails without them, unless ASSISTGEN_TEST_WITHOUT_WEIGHTS=1 says this
host has none."""
import json
import os
import subprocess
import sys

import pytest

from assistgen.models.catalog import load_catalog
from helpers import ROOT, free_port, require_weights, speech_wav
from hub_cache import HUB_PAIRS

CATALOG = load_catalog()
HUB = [pair for pair in CATALOG.pairs if pair.target.source == "hub"]


@pytest.fixture(scope="module")
def assistgen_cache(tmp_path_factory):
    """One assistgen cache for this module's runs: the stand-ins' int8 copies are quantized once, at the first load."""
    return tmp_path_factory.mktemp("assistgen-cache")


@pytest.fixture
def offline_hub(hub_cache, assistgen_cache, monkeypatch):
    """This process reads the stand-in cache as its Hugging Face cache, offline."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ASSISTGEN_CACHE", str(assistgen_cache))
    return hub_cache


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return speech_wav(tmp_path_factory.mktemp("speech") / "clip.wav")


def task_args(pair, speech) -> list[str]:
    task = pair.tasks[0]
    return ["--task", task] + (["--audio", str(speech), "--language", "en"] if task == "asr"
                               else ["--text", "The quick brown fox"])


def test_the_stand_ins_cover_every_hub_model_of_the_catalog():
    ids = {repo for pair in HUB_PAIRS for repo in pair}
    assert {(p.target.location, p.assistant.location) for p in HUB} == set(HUB_PAIRS)
    assert {spec.location for spec in CATALOG.models.values() if spec.source == "hub"} <= ids
    assert len(HUB) == 9


def cli(*args, env):
    return subprocess.run([sys.executable, "-m", "assistgen", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env})


def test_every_hub_pair_is_available_offline_from_the_cache_and_says_why_without_it(hub_cache, tmp_path):
    rows = {row["pair"]: row for row in json.loads(cli("models", "--json", env={
        "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}).stdout)}
    for pair in HUB:
        assert rows[pair.name]["available"], rows[pair.name]
    empty = {row["pair"]: row for row in json.loads(cli("models", "--json", env={
        "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}).stdout)}
    for pair in HUB:
        assert not empty[pair.name]["available"]
        assert "HF_HUB_OFFLINE=1" in empty[pair.name]["reason"] and "not in the local cache" in empty[pair.name]["reason"]


@pytest.mark.parametrize("pair", HUB, ids=[p.name for p in HUB])
def test_every_hub_pair_runs_baseline_and_assisted_identically_through_the_cli(offline_hub, pair, speech, capsys):
    from assistgen.tools.cli import main
    # drafting forced at every step (the pair's adaptive schedule would rightly not draft with stand-ins of the
    # target's own size): every verification is exercised
    assert main(["compare", "--pair", pair.name, *task_args(pair, speech), "--max-new-tokens", "12", "--json",
                 "--schedule", "constant", "--draft-source", "assistant"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["identical"] is True, result["identical_note"]
    assert result["mode"] == "same-tokenizer"
    assert result["baseline"]["new_tokens"] >= 1 and result["assisted"]["assistant_passes"] >= 1
    if pair.tasks == ("asr",):
        # distil-Whisper's stand-in decoder is the target's own, here in int8 (the CPU recipe): its drafts agree
        # with the target's tokens nearly always if, loaded decoder-only, it reads the target's encoder output, and
        # almost never otherwise
        assert result["assisted"]["acceptance_rate"] >= 0.75


def test_on_a_cpu_every_hub_pair_runs_the_offline_recipe():
    cpu = "cpu"
    for pair in HUB:
        assert pair.schedule == "adaptive", pair.name
        if pair.target.location != "google/flan-t5-large":   # float32 (models.yaml says why)
            assert pair.assistant.on(cpu).quantization == "dynamic_int8", pair.name   # an int8 assistant
        if pair.target.location.startswith("Qwen/"):   # an exact int8 target; prompt lookup beside the assistant
            assert pair.target.on(cpu).quantization == "w8a8" and pair.draft_source == "assistant_lookup"
        if pair.tasks == ("asr",):
            assert pair.target.on(cpu).encoder_dtype == "bfloat16"
    # on a GPU, as written: half precision (dtype auto)
    assert {pair.target.on("cuda").quantization for pair in HUB} == {"none"}


def test_the_small_qwen_pair_at_its_defaults_names_its_int8_numerics_and_stays_identical(offline_hub, capsys):
    import torch

    from assistgen.models.prepare import ready
    from assistgen.tools.cli import main
    pair = CATALOG.pair("qwen2.5-1.5b+0.5b")
    assert main(["compare", "--pair", pair.name, "--task", "chat", "--text", "The quick brown fox",
                 "--max-new-tokens", "12", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["identical"] is True and result["settings"]["schedule"] == "adaptive"
    assert result["draft_source"] == "assistant_lookup"
    assert result["numerics"] == {"target": "w8a8: int8 weights, int8 inputs per token",
                                  "assistant": "dynamic_int8: int8 weights, int8 inputs per pass"}
    assert "w8a8" in result["identical_note"]
    # quantized once, on the first load, and kept in the cache for the next
    assert ready(pair.target, CATALOG, torch.device("cpu")) and ready(pair.assistant, CATALOG, torch.device("cpu"))


def test_distil_whisper_loads_decoder_only_and_shares_the_targets_encoder(offline_hub):
    from assistgen.models.pool import ModelPool
    pair = ModelPool(CATALOG).pair("whisper-large-v3+distil-large-v3")
    assert type(pair.assistant.model).__name__ == "WhisperForCausalLM"
    assert not any("encoder" in name.split(".") for name, _ in pair.assistant.model.named_parameters())
    assert pair.target.model.config.num_mel_bins == 128 and pair.target.processor.feature_extractor.feature_size == 128


def test_every_hub_pair_runs_through_the_compare_api(offline_hub, speech):
    import app
    from gradio_client import Client, handle_file

    from assistgen.app.service import Service
    service = Service(CATALOG)
    demo = app.build_demo(service)
    app.queue_and_launch(demo, prevent_thread_lock=True, server_port=free_port(), quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        for pair in HUB:
            asr = pair.tasks == ("asr",)
            result = client.predict(task=pair.tasks[0], pair=pair.name, text=None if asr else "The quick brown fox",
                                    audio=handle_file(str(speech)) if asr else None, max_new_tokens=10,
                                    temperature=0, draft_source="assistant", language="en" if asr else "",
                                    api_name="/compare")
            assert result["pair"] == pair.name and result["identical"] is True, result["identical_note"]
            assert result["assisted"]["target_passes"] >= 1
    finally:
        demo.close()


def test_a_pair_over_the_memory_budget_is_offered_but_never_the_default(offline_hub):
    from assistgen.app.service import Service
    from assistgen.models.pool import ModelPool
    from assistgen.models.sizing import load_bytes
    import torch
    opt = CATALOG.pair("opt-6.7b+125m")
    need = load_bytes(opt.target, torch.device("cpu")) + load_bytes(opt.assistant, torch.device("cpu"))
    qwen = CATALOG.pair("qwen2.5-1.5b+0.5b")
    qwen_need = sum(load_bytes(m, torch.device("cpu")) for m in (qwen.target, qwen.assistant))
    assert qwen_need < need    # the stand-ins keep their ordering by size where it matters here
    service = Service(CATALOG, ModelPool(CATALOG, budget_bytes=(need + qwen_need) // 2))
    labels = dict((name, label) for label, name in service.pair_choices("chat"))
    assert "more than the" in labels["opt-6.7b+125m"] and "ASSISTGEN_MEMORY_BUDGET_GB" in labels["opt-6.7b+125m"]
    assert labels["qwen2.5-1.5b+0.5b"] == "qwen2.5-1.5b+0.5b"


def test_a_distil_whisper_checkpoint_whose_encoder_is_not_the_targets_is_refused_with_the_reason(tmp_path):
    from safetensors.torch import load_file, save_file

    from assistgen.models.loading import LoadError
    from assistgen.models.pool import ModelPool
    from hub_cache import whisper_pair
    target, assistant = whisper_pair(tmp_path / "pair", 80)
    weights = load_file(assistant / "model.safetensors")
    weights["model.encoder.layers.0.fc1.weight"] = weights["model.encoder.layers.0.fc1.weight"] + 0.01
    save_file(weights, assistant / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "models.yaml").write_text(f"""
models:
  target: {{local: {target}}}
  distil: {{local: {assistant}, decoder_only: true, languages: [en]}}
pairs:
  - {{name: target+distil, tasks: [asr], target: target, assistant: distil, prompt_style: asr}}
""")
    catalog = load_catalog(tmp_path / "models.yaml")
    with pytest.raises(LoadError, match="trained on another encoder than the target's .*fc1.weight differs"):
        ModelPool(catalog).pair("target+distil")


def test_an_english_only_distil_assistant_switches_drafting_off_for_other_languages_and_says_why(offline_hub, speech):
    from assistgen.app.service import Service
    from assistgen.comparison.compare import Settings
    service = Service(CATALOG)
    pair = service.pool.pair("whisper-large-v3+distil-large-v3")
    assert pair.mode == "same-tokenizer"   # distil-Whisper keeps its teacher's multilingual tokenizer
    german = service.run("asr", pair.spec.name, audio=str(speech), language="de", settings=Settings(max_new_tokens=6))
    assert german.draft_source == "none" and german.assisted.assistant_passes == 0
    assert "knows only en" in german.drafting_off and "'de'" in german.drafting_off
    english = service.run("asr", pair.spec.name, audio=str(speech), language="en", settings=Settings(max_new_tokens=6))
    assert english.drafting_off is None and english.assisted.assistant_passes >= 1


@pytest.fixture
def no_weight_packages(monkeypatch):
    """A Space without the weight packages: every offline pack unavailable."""
    from assistgen.models import availability
    real = availability.availability
    monkeypatch.setattr(availability, "availability", lambda spec, catalog: (
        (False, "weight package not installed") if spec.source == "pack" else real(spec, catalog)))


def test_a_cpu_space_defaults_to_pairs_sized_for_two_cores_and_still_offers_every_pair(offline_hub, no_weight_packages):
    import torch

    from assistgen.app.service import Service
    from assistgen.models.pool import ModelPool
    service = Service(CATALOG, ModelPool(CATALOG, budget_bytes=14 * 2**30), device=torch.device("cpu"))
    defaults = {task: service.default_pair(service.pair_choices(task)) for task in ("chat", "asr")}
    # the pairs whose click docs/space.md estimates within its budget on two threads (bench.scripts.space_estimates)
    assert defaults == {"chat": "qwen2.5-1.5b+0.5b", "asr": "whisper-base-hub+decoder-int8"}
    speech = CATALOG.pair(defaults["asr"])   # Whisper drafting with its own decoder, in int8 here
    assert speech.assistant.decoder_only and speech.assistant.location == speech.target.location
    assert speech.assistant.on("cpu").quantization == "dynamic_int8"
    assert max(speech.target.parameters, speech.assistant.parameters) <= 300e6
    text = CATALOG.pair(defaults["chat"])
    assert text.target.parameters <= 2e9 and text.assistant.parameters <= 2e9
    assert "chosen for: CPU, " in service.pair_info(defaults["asr"])
    assert "chosen for" not in service.pair_info("whisper-large-v3+distil-large-v3")
    labels = {name: label for label, name in service.pair_choices("asr")}
    assert labels.keys() == {p.name for p in CATALOG.pairs_for("asr")}
    assert "meant for a GPU" in labels["whisper-large-v3+distil-large-v3"]
    assert "B parameters" in labels["whisper-large-v3+distil-large-v3"]


def test_a_gpu_space_defaults_to_the_large_pairs(offline_hub, no_weight_packages):
    import torch

    from assistgen.app.service import Service
    from assistgen.models.pool import ModelPool
    service = Service(CATALOG, ModelPool(CATALOG, budget_bytes=20 * 2**30), device=torch.device("cuda"))
    assert {task: service.default_pair(service.pair_choices(task)) for task in ("chat", "asr")} == {
        "chat": "qwen2.5-7b+0.5b", "asr": "whisper-large-v3+distil-large-v3"}
    assert "chosen for: GPU" in service.pair_info("whisper-large-v3+distil-large-v3")
    assert "captures its passes as CUDA graphs" in service.pair_info("qwen2.5-7b+0.5b")   # paid at the warm-up


def test_with_the_weight_packages_a_cpu_space_defaults_to_the_offline_pairs_and_still_runs_the_hub_ones(offline_hub):
    import torch

    from assistgen.app.service import Service
    from assistgen.models.availability import availability
    from assistgen.models.pool import ModelPool
    offline = CATALOG.pair("qwen2.5-coder-1.5b-w8a8+0.5b-int8")
    require_weights(*availability(offline.target, CATALOG))
    service = Service(CATALOG, ModelPool(CATALOG, budget_bytes=14 * 2**30), device=torch.device("cpu"))
    assert service.default_pair(service.pair_choices("chat")) == offline.name
    assert service.default_pair(service.pair_choices("asr")) == "whisper-base+decoder-int8"
    labels = {name: label for label, name in service.pair_choices("chat")}
    assert labels["qwen2.5-1.5b+0.5b"] == "qwen2.5-1.5b+0.5b"   # offered, available, meant for this CPU


def test_prepare_quantizes_a_hub_pairs_int8_copies_once_and_the_page_then_says_it_is_ready(offline_hub, monkeypatch,
                                                                                          tmp_path):
    import torch

    from assistgen.app.service import Service
    from assistgen.models.pool import ModelPool
    from assistgen.models.prepare import prepare
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path))   # a fresh cache: nothing quantized yet
    service = Service(CATALOG, ModelPool(CATALOG), device=torch.device("cpu"))
    assert "not prepared here yet** (qwen2.5-1.5b-instruct, qwen2.5-0.5b-instruct)" in service.pair_info(
        "qwen2.5-1.5b+0.5b")
    assert "here: target exact int8 (w8a8), assistant int8" in service.pair_info("qwen2.5-1.5b+0.5b")
    done = prepare(CATALOG, "qwen2.5-1.5b+0.5b")
    assert [(p.model, p.what) for p in done] == [("qwen2.5-1.5b-instruct", "quantized"),
                                                  ("qwen2.5-0.5b-instruct", "quantized")]
    assert [p.what for p in prepare(CATALOG, "qwen2.5-1.5b+0.5b")] == ["already prepared"] * 2
    assert "not prepared" not in service.pair_info("qwen2.5-1.5b+0.5b")
