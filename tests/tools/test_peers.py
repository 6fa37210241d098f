"""bench's peer engines (tools.peers) behind their one narrow interface: a fake engine runs on the same items as ours,
interleaved, and is compared token for token; llama.cpp's missing server is refused with how to build it; speech
rows time the file's decoding and features. The real engines are not needed (requirements-peers.txt)."""
import subprocess
import sys
import os

import pytest

from assistgen.comparison.compare import Settings
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool
from assistgen.tools.bench import Item, run_bench
from assistgen.tools.peers import PeerRun, ct2_vocabulary

from helpers import ROOT


class EchoPeer:
    """Answers with the tokens our baseline will give (it runs the target itself), or with one token changed."""
    engine = "echo"
    variants = ("same", "changed")

    def __init__(self, pair):
        self.pair, self.calls = pair, []

    def run(self, variant, item, inputs, settings: Settings) -> PeerRun:
        from assistgen.comparison.compare import run_generation
        from assistgen.tools.bench import window_tokens
        self.calls.append((variant, item.name, settings.max_new_tokens))
        tokens = window_tokens(run_generation(self.pair, inputs, settings))
        if variant == "changed":
            tokens = [[t + 1 for t in w] for w in tokens]
        return PeerRun(tokens, 0.5, {"draft_tokens": 3})


@pytest.fixture(scope="module")
def pool(tiny_catalog_path):
    return ModelPool(load_catalog(tiny_catalog_path))


def test_a_peer_engine_runs_every_item_beside_ours_and_is_compared_token_for_token(pool):
    pair = pool.pair(pool.catalog.pair("tiny-text"))
    peer = EchoPeer(pair)
    items = [Item("mine", "chat", f"p{n}", text=f"count {n} one two three") for n in range(3)]
    rows = run_bench(pair, items, temperatures=[0.0], draft_sources=None, schedules=None, repeats=1,
                     max_new_tokens=8, peers=[{"echo": peer}])
    by_config = {}
    for row in rows:
        by_config.setdefault(row["config"], []).append(row)
    assert set(by_config) >= {"baseline", "echo same", "echo changed"}
    assert all(r["identical"] for r in by_config["echo same"])
    assert not any(r["identical"] for r in by_config["echo changed"])
    assert all(r["engine"] == "echo" and r["tokens_per_s"] == round(r["new_tokens"] / 0.5, 3)
               and r["draft_tokens"] == 3 for r in by_config["echo same"])
    # a warm-up run of each variant first (2 tokens), then one run per item and variant at the bench's budget
    assert peer.calls[:2] == [("same", "p0", 2), ("changed", "p0", 2)]
    assert sorted(peer.calls[2:]) == sorted((v, f"p{n}", 8) for v in peer.variants for n in range(3))


def test_speech_rows_time_the_files_decoding_and_features_shared_by_our_columns(pool):
    pair = pool.pair(pool.catalog.pair("tiny-speech"))
    clip = sorted((ROOT / "bench" / "inputs" / "speech").glob("*.wav"))[0]
    rows = run_bench(pair, [Item("speech", "asr", clip.stem, audio=str(clip))], temperatures=[0.0],
                     draft_sources=None, schedules=None, repeats=1, max_new_tokens=4)
    assert rows
    for row in rows:
        prep = row["audio_decode_s"] + row["features_s"]
        assert row["audio_decode_s"] > 0 and row["features_s"] > 0
        assert row["end_to_end_s"] == pytest.approx(row["latency_s"] + prep, abs=2e-4)
        assert row["baseline_end_to_end_s"] == pytest.approx(row["baseline_latency_s"] + prep, abs=2e-4)


def test_bench_refuses_llama_cpp_without_its_server_and_says_how_to_build_it(tiny_catalog_path, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ASSISTGEN_LLAMA_SERVER"}
    out = subprocess.run([sys.executable, "-m", "assistgen", "--catalog", str(tiny_catalog_path), "bench", "--pair",
                          "tiny-text", "--suite", "code", "--peer", "llama.cpp", "--out", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**env, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 2
    assert "build_llama_server.sh" in out.stderr and "ASSISTGEN_LLAMA_SERVER" in out.stderr


def test_the_ct2_vocabulary_is_the_tokenizers_tokens_then_whispers_timestamps(tmp_path):
    import helpers as tm
    tokenizer = tm.whisper_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    vocabulary = ct2_vocabulary(tmp_path / "tokenizer.json")
    assert vocabulary[:len(tokenizer)] == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    assert vocabulary[len(tokenizer):][:2] == ["<|0.00|>", "<|0.02|>"] and vocabulary[-1] == "<|30.00|>"
    assert len(vocabulary) == len(tokenizer) + 1501
