"""bench's peer engines (tools.peers) behind their one narrow interface: a fake engine runs on the same items as ours,
interleaved, and is compared token for token; llama.cpp's missing server is refused with how to build it; speech
rows time the file's decoding and features. The adapters themselves run against stand-ins for the real engines: a
stub llama-server answering in llama.cpp's JSON, and a stub faster-whisper module; they must send what they promise
(our prompt as token ids, greedy, the pack's own files), read the tokens and timings back, and fail clearly. The real
engines are not needed (requirements-peers.txt)."""
import subprocess
import sys
import os
from pathlib import Path

import pytest

from assistgen.comparison.compare import Settings
from assistgen.engine.prefix_cache import SHARED_PREFIX
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


# --- the adapters against stand-ins for the real engines -----------------------------------------------------------
# A stub llama-server: an executable that serves llama.cpp's /health and /completion on the port it is given, with
# canned JSON in llama.cpp's format, and records its command line and every request it is sent. Its /health answers
# 503 "Loading model" once before 200, as the real server does while it loads.
STUB_LLAMA_SERVER = '''#!{python}
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

args = sys.argv[1:]
folder = Path(os.environ["STUB_LLAMA_DIR"])
port = int(args[args.index("--port") + 1])
record = folder / f"{{port}}.jsonl"
if (folder / "exit-at-start").exists():
    sys.exit(3)


def note(entry):
    with open(record, "a") as f:
        f.write(json.dumps(entry) + "\\n")


note({{"argv": args}})
health = []


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/health":
            return self.answer(404, {{"error": {{"code": 404, "message": "File Not Found",
                                                "type": "not_found_error"}}}})
        health.append(1)
        if len(health) == 1 or (folder / "never-ready").exists():
            return self.answer(503, {{"error": {{"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}}}})
        self.answer(200, {{"status": "ok"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        note({{"path": self.path, "content_type": self.headers["Content-Type"], "body": body}})
        reply = json.loads((folder / "reply.json").read_text())
        self.answer(reply["status"], reply["body"])

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''

# llama-server's /completion answer with `return_tokens`, as the speculative server gives it (draft_n, draft_n_accepted)
COMPLETION = {"index": 0, "content": " return a + b", "tokens": [470, 264, 488, 293], "id_slot": 0, "stop": True,
              "model": "target.gguf", "tokens_predicted": 4, "tokens_evaluated": 6, "stop_type": "limit",
              "stopping_word": "", "tokens_cached": 9, "truncated": False,
              "timings": {"cache_n": 0, "prompt_n": 6, "prompt_ms": 25.0, "prompt_per_token_ms": 4.166,
                          "prompt_per_second": 240.0, "predicted_n": 4, "predicted_ms": 160.0,
                          "predicted_per_token_ms": 40.0, "predicted_per_second": 25.0, "draft_n": 6,
                          "draft_n_accepted": 3}}


def _write_pack(site, package: str, files: dict[str, bytes]) -> list[dict]:
    """Files in a stand-in weight package; their catalog entries."""
    import hashlib
    entries = []
    for name, data in files.items():
        path = site / package.replace("-", "_") / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entries.append({"name": name, "sha256": hashlib.sha256(data).hexdigest(),
                        "parts": [{"package": package, "path": f"data/{name}"}]})
    return entries


@pytest.fixture
def stub_catalog(tmp_path, monkeypatch):
    """A catalog whose packs come from stand-in weight packages: a GGUF target and drafter (bytes only: the stub
    server never reads them) and a CTranslate2 Whisper (its real tokenizer.json, for the vocabulary)."""
    import json
    import helpers as tm
    from assistgen.models.catalog import load_catalog as load
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("ASSISTGEN_CACHE", str(tmp_path / "cache"))
    tokenizer_folder = tmp_path / "tokenizer"
    tm.whisper_tokenizer().save_pretrained(tokenizer_folder)
    packs = {
        "stub-target": ("gguf", _write_pack(site, "stub-target-weights", {"target.gguf": b"GGUF target " * 64})),
        "stub-draft": ("gguf", _write_pack(site, "stub-draft-weights", {"draft.gguf": b"GGUF draft " * 64})),
        "stub-whisper": ("ct2_whisper", _write_pack(site, "stub-whisper-weights", {
            "model.bin": b"CTranslate2 model " * 64, "config.json": b'{"suppress_ids": []}',
            "tokenizer.json": (tokenizer_folder / "tokenizer.json").read_bytes()})),
    }
    catalog = {"packs": {name: {"format": fmt, "files": files} for name, (fmt, files) in packs.items()},
               "models": {name: {"pack": name, "dtype": "float32"} for name in packs},
               "pairs": [{"name": "stub-text", "tasks": ["chat"], "target": "stub-target", "assistant": "stub-draft",
                          "prompt_style": "chat_template"},
                         {"name": "stub-speech", "tasks": ["asr"], "target": "stub-whisper",
                          "assistant": "stub-whisper", "prompt_style": "asr"}]}
    path = tmp_path / "models.yaml"
    path.write_text(json.dumps(catalog))   # JSON is YAML
    return load(path)


@pytest.fixture
def llama_stub(tmp_path, monkeypatch):
    """(the stub server's path, its folder: replies in, records out)."""
    folder = tmp_path / "llama-stub"
    folder.mkdir()
    binary = folder / "llama-server"
    binary.write_text(STUB_LLAMA_SERVER.format(python=sys.executable))
    binary.chmod(0o755)
    monkeypatch.setenv("STUB_LLAMA_DIR", str(folder))
    return binary, folder


def _records(folder, server) -> list[dict]:
    import json
    return [json.loads(line) for line in (folder / f"{server.port}.jsonl").read_text().splitlines()]


def _reply(folder, status: int, body: dict) -> None:
    import json
    (folder / "reply.json").write_text(json.dumps({"status": status, "body": body}))


def _text_pair(catalog):
    """What LlamaCppPeer reads of a loaded pair: its catalog entry, whether it has an assistant and of which kind."""
    from types import SimpleNamespace
    return SimpleNamespace(spec=catalog.pair("stub-text"), assistant=object(), mode="same-tokenizer")


@pytest.fixture
def llama_peer(stub_catalog, llama_stub, tmp_path):
    """(a LlamaCppPeer for the stub text pair, on the stub server; the stub's folder), closed afterwards."""
    from assistgen.tools.peers import LlamaCppPeer
    binary, folder = llama_stub
    peer = LlamaCppPeer(_text_pair(stub_catalog), stub_catalog, binary=str(binary), log_dir=tmp_path)
    yield peer, folder
    peer.close()


def test_llama_cpp_starts_a_plain_and_a_speculative_server_on_the_packs_own_files(llama_peer, tmp_path):
    from assistgen.tools.peers import SPEC_DRAFT_N_MAX, THREADS
    peer, folder = llama_peer
    assert peer.variants == ("plain", "speculative")
    packs = tmp_path / "cache" / "packs"
    target, draft = packs / "stub-target" / "target.gguf", packs / "stub-draft" / "draft.gguf"
    assert target.read_bytes() == b"GGUF target " * 64 and draft.read_bytes() == b"GGUF draft " * 64
    for name, server in peer.servers.items():
        argv = _records(folder, server)[0]["argv"]
        assert argv[argv.index("-m") + 1] == str(target)
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == str(server.port)
        assert argv[argv.index("-t") + 1] == argv[argv.index("-tb") + 1] == str(THREADS)
        assert argv[argv.index("-np") + 1] == "1"   # one slot: one request at a time, as ours run
        if name == "plain":
            assert "-md" not in argv and "--spec-draft-n-max" not in argv
        else:
            assert argv[argv.index("-md") + 1] == str(draft)
            assert argv[argv.index("--spec-draft-n-max") + 1] == str(SPEC_DRAFT_N_MAX)
            assert argv[argv.index("-td") + 1] == argv[argv.index("-tbd") + 1] == str(THREADS)
        assert peer.settings[name] == " ".join(argv)
    peer.close()
    assert all(server.process.poll() is not None for server in peer.servers.values())   # stopped


def test_llama_cpp_sends_our_prompt_as_token_ids_greedy_and_reads_its_tokens_and_timings(llama_peer):
    import torch
    peer, folder = llama_peer
    ids = [151644, 872, 198, 750, 912, 2877]
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    item = Item("code", "chat", "add", text="def add(a, b):")
    _reply(folder, 200, COMPLETION)
    run = peer.run("speculative", item, inputs, Settings(max_new_tokens=4, seed=7))
    (request,) = [r for r in _records(folder, peer.servers["speculative"]) if "path" in r]
    assert request["path"] == "/completion" and request["content_type"] == "application/json"
    assert request["body"] == {"prompt": ids, "n_predict": 4, "temperature": 0.0, "top_k": 1,
                               "cache_prompt": False, "return_tokens": True, "stream": False, "seed": 7}
    assert run.window_tokens == [[470, 264, 488, 293]]
    assert run.detail == {"prompt_tokens": 6, "prompt_tokens_per_s": 240.0, "decode_tokens_per_s": 25.0,
                          "draft_tokens": 6, "draft_accepted": 3, "stop_type": "limit"}
    assert run.latency_s > 0
    # the plain server's answer has no draft figures, and the run none either
    plain = {**COMPLETION, "timings": {k: v for k, v in COMPLETION["timings"].items() if not k.startswith("draft")}}
    _reply(folder, 200, plain)
    run = peer.run("plain", item, inputs, Settings(max_new_tokens=4))
    assert run.window_tokens == [[470, 264, 488, 293]] and "draft_tokens" not in run.detail
    assert [r["body"]["prompt"] for r in _records(folder, peer.servers["plain"]) if "path" in r] == [ids]
    # a prompt whose beginning other prompts share: the slot's cache holds that beginning, as ours does, not more
    _reply(folder, 200, plain)
    peer.run("plain", item, {**inputs, SHARED_PREFIX: 3}, Settings(max_new_tokens=4))
    primed, timed = [r["body"] for r in _records(folder, peer.servers["plain"]) if "path" in r][1:]
    assert primed == {"prompt": ids[:3], "n_predict": 1, "temperature": 0.0, "top_k": 1, "cache_prompt": True,
                      "stream": False}
    assert timed["prompt"] == ids and timed["cache_prompt"] is True


def test_llama_cpp_refuses_sampling_and_speech_before_sending_anything(llama_peer):
    import torch
    peer, folder = llama_peer
    text = {"input_ids": torch.tensor([[1, 2, 3]])}
    with pytest.raises(ValueError, match="greedy only"):
        peer.run("plain", Item("chat", "chat", "x", text="x"), text, Settings(max_new_tokens=4, temperature=0.7))
    with pytest.raises(ValueError, match="text prompts only"):
        peer.run("plain", Item("speech", "asr", "x", audio="x.wav"), {"input_features": torch.zeros(1, 80, 30)},
                 Settings(max_new_tokens=4))
    assert not [r for r in _records(folder, peer.servers["plain"]) if "path" in r]


def test_llama_cpp_fails_with_the_servers_own_error_when_a_request_is_refused(llama_peer):
    import torch
    peer, folder = llama_peer
    message = "the request exceeds the available context size, try increasing it"
    _reply(folder, 400, {"error": {"code": 400, "message": message, "type": "exceed_context_size_error"}})
    with pytest.raises(RuntimeError) as refused:
        peer.run("plain", Item("chat", "chat", "x", text="x"), {"input_ids": torch.tensor([[1, 2, 3]])},
                 Settings(max_new_tokens=4))
    assert str(refused.value) == f"llama-server refused /completion (HTTP 400): {message}"   # what bench's row keeps


def test_a_llama_server_that_exits_or_never_gets_ready_fails_with_its_command_and_log(stub_catalog, llama_stub,
                                                                                   tmp_path, monkeypatch):
    from assistgen.tools import peers
    binary, folder = llama_stub
    (folder / "exit-at-start").touch()
    with pytest.raises(RuntimeError, match=r"llama-server exited with 3 while loading \(.*llama-server -m ") as exited:
        peers.LlamaCppPeer(_text_pair(stub_catalog), stub_catalog, binary=str(binary), log_dir=tmp_path)
    assert "llama-server-plain.log" in str(exited.value)
    (folder / "exit-at-start").unlink()
    (folder / "never-ready").touch()   # /health keeps answering 503, as while a model loads
    monkeypatch.setattr(peers, "SERVER_START_S", 1.0)
    with pytest.raises(RuntimeError, match="llama-server did not come up in 1 s"):
        peers.LlamaServer(binary, tmp_path / "model.gguf")


# A stub faster-whisper: the one class the adapter imports, recording how it is built and called; the segments it
# returns are a generator, read (decoded) only as the adapter iterates them, as faster-whisper's are.
class StubWhisperModel:
    built: list = []

    def __init__(self, folder, **options):
        self.folder, self.options, self.calls, self.read = folder, options, [], []
        self.files = sorted(p.name for p in Path(folder).iterdir())
        self.vocabulary = (Path(folder) / "vocabulary.txt").read_text().split("\n")
        StubWhisperModel.built.append(self)

    def transcribe(self, audio, **options):
        from types import SimpleNamespace
        self.calls.append((audio, options))

        def segments():
            for tokens in ([50, 51, 52], [60, 61]):
                self.read.append(tokens)
                yield SimpleNamespace(tokens=tokens, text="...")
        return segments(), SimpleNamespace(language=options.get("language"), language_probability=1.0)


@pytest.fixture
def faster_whisper(monkeypatch):
    from types import ModuleType
    module = ModuleType("faster_whisper")
    module.WhisperModel = StubWhisperModel
    monkeypatch.setitem(sys.modules, "faster_whisper", module)
    monkeypatch.setattr(StubWhisperModel, "built", [])
    return StubWhisperModel


def _speech_pair(catalog, tiny_catalog_path):
    """What FasterWhisperPeer reads of a loaded pair: its catalog entry, and the target's tokenizer and model (which
    languages it knows) from the tiny speech pair, taught German too."""
    from types import SimpleNamespace
    target = ModelPool(load_catalog(tiny_catalog_path)).pair("tiny-speech").target
    tokenizer = target.tokenizer
    config = SimpleNamespace(is_multilingual=True, lang_to_id={t: tokenizer.convert_tokens_to_ids(t)
                                                                 for t in ("<|en|>", "<|de|>")})
    model = SimpleNamespace(generation_config=config)
    return SimpleNamespace(spec=catalog.pair("stub-speech"), target=SimpleNamespace(tokenizer=tokenizer, model=model))


def test_faster_whisper_reads_the_packs_model_bin_greedy_in_the_language_of_our_run(stub_catalog, faster_whisper,
                                                                                   tiny_catalog_path, tmp_path):
    import torch
    from assistgen.tools.peers import THREADS, FasterWhisperPeer
    pair = _speech_pair(stub_catalog, tiny_catalog_path)
    peer = FasterWhisperPeer(pair, stub_catalog)
    try:
        int8, fp32 = faster_whisper.built
        assert [m.options for m in (int8, fp32)] == [{"device": "cpu", "compute_type": c, "cpu_threads": THREADS}
                                                      for c in ("int8", "float32")]
        assert int8.files == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
        assert (peer.folder / "model.bin").resolve() == tmp_path / "cache" / "packs" / "stub-whisper" / "model.bin"
        assert int8.vocabulary[-1] == "<|30.00|>"   # the tokenizer's tokens, then Whisper's timestamps
        tokenizer = pair.target.tokenizer
        prefix = tokenizer.convert_tokens_to_ids(["<|startoftranscript|>", "<|de|>", "<|transcribe|>",
                                                  "<|notimestamps|>"])
        inputs = {"input_features": torch.zeros(1, 80, 3000), "decoder_input_ids": torch.tensor([prefix])}
        item = Item("speech", "asr", "clip", audio=str(tmp_path / "clip.wav"))
        run = peer.run("int8", item, inputs, Settings(max_new_tokens=40))
        ((audio, options),) = int8.calls
        assert audio == item.audio and fp32.calls == []
        assert options == {"language": "de", "task": "transcribe", "beam_size": 1, "best_of": 1, "temperature": 0.0,
                           "without_timestamps": True, "condition_on_previous_text": False, "vad_filter": False,
                           "max_new_tokens": 40}
        assert run.window_tokens == [[50, 51, 52], [60, 61]] == int8.read   # every segment decoded within the run
        assert run.latency_s > 0
        with pytest.raises(ValueError, match="greedy only"):
            peer.run("int8", item, inputs, Settings(max_new_tokens=40, temperature=0.5))
        with pytest.raises(ValueError, match="audio only"):
            peer.run("int8", Item("chat", "chat", "x", text="x"), inputs, Settings(max_new_tokens=40))
        assert len(int8.calls) == 1
    finally:
        peer.close()
    assert not peer.folder.exists()


def test_faster_whisper_missing_is_refused_with_what_to_install(stub_catalog, tiny_catalog_path, monkeypatch):
    from assistgen.tools.peers import FasterWhisperPeer
    monkeypatch.setitem(sys.modules, "faster_whisper", None)   # import faster_whisper raises ImportError
    with pytest.raises(ValueError, match=r"faster-whisper is not installed: pip install -r requirements-peers.txt"):
        FasterWhisperPeer(_speech_pair(stub_catalog, tiny_catalog_path), stub_catalog)
