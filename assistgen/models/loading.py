"""Turning catalog specs into loaded models (offline packs through the cache of conversions, the hub, local
folders), what a loaded model weighs, and how a pair runs."""
from __future__ import annotations

import functools
import hashlib
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForSpeechSeq2Seq,
                          AutoProcessor, AutoTokenizer)
from transformers.utils import logging as hf_logging

from ..config import from_env
from ..engine.attention import use_row_invariant_attention
from ..engine.encoders import module_tensors, same_tensors
from . import packed, precision
from .availability import note_failure
from .catalog import TORCH_INT8, Catalog, ModelSpec, PairSpec
from .conversion import Progress, int8_model, packed_stored, packs_onednn, weights_folder
from .cpu import keep_freed_memory, materialize, onednn_enabled, onednn_for_offloaded, release_freed_memory
from .devices import default_device, torch_dtype
from .gguf import load_cached
from .packs import PackError, cache_dir
from .quantized import Int8Linear, ProductPart
from .sizing import checkpoint_files

SIZE_RATIO_WARNING = 10.0


class LoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do."""


@dataclass(eq=False)   # one object, one model: hashed by identity (run-time state is keyed by it)
class LoadedModel:
    spec: ModelSpec
    model: Any
    tokenizer: Any
    processor: Any | None       # feature extractor + tokenizer, for speech models
    num_parameters: int
    num_bytes: int
    load_s: float
    folder: str | None = None   # what transformers loaded it from (a folder, or a hub id)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        if self.spec.eos_token_ids:
            return self.spec.eos_token_ids
        eos = self.model.generation_config.eos_token_id
        eos = self.model.config.eos_token_id if eos is None else eos
        return () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))


@dataclass(eq=False)
class LoadedPair:
    spec: PairSpec
    target: LoadedModel
    assistant: LoadedModel | None
    mode: str                   # "same-tokenizer", "different-tokenizer" or "no-assistant"
    mode_reason: str
    warnings: list[str] = field(default_factory=list)

    @property
    def parameter_ratio(self) -> float | None:
        if self.assistant is None:
            return None
        return self.target.num_parameters / max(1, self.assistant.num_parameters)

    @property
    def assistant_usable(self) -> bool:
        return self.mode in ("same-tokenizer", "different-tokenizer")


# --- loading --------------------------------------------------------------------------------------------------------

_tokenizers: dict[str, Any] = {}   # sha256 of a folder's tokenizer files -> the tokenizer loaded from them


def _shared_tokenizer(folder: Path, auto) -> Any:
    """One tokenizer object for every folder whose tokenizer files are byte-identical (a target and its sibling
    assistant: loading the Qwen tokenizer costs about a second each time)."""
    digest = hashlib.sha256()
    files = sorted(p for p in folder.glob("*") if p.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))
                   or p.name == "added_tokens.json")
    if not files:
        return auto.from_pretrained(str(folder))
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()
    if key not in _tokenizers:
        _tokenizers[key] = auto.from_pretrained(str(folder))
    return _tokenizers[key]


def _count(model) -> tuple[int, int]:
    """(parameters, bytes held in memory): tied weights once, weights offloaded to disk not held."""
    unique = {(p.device, p.data_ptr()) if p.device.type != "meta" else id(p): p for p in model.parameters()}.values()
    return (sum(p.numel() for p in unique),
            sum(p.numel() * p.element_size() for p in unique if p.device.type != "meta"))


def _linear_weight_size(module, dtype: torch.dtype) -> int | None:
    """Bytes a weight of a linear-like layer takes, whatever its layout (int8, oneDNN-packed or plain); None for a
    module that is not one."""
    if not hasattr(module, "in_features") or not hasattr(module, "out_features") or isinstance(module, ProductPart):
        return None   # a part of a product: the product counts
    if isinstance(module, Int8Linear):
        return 1
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and not weight.is_mkldnn:
        return weight.element_size()
    return torch.finfo(dtype).bits // 8


def _packed_linears(module, dtype: torch.dtype):
    """(weights, bytes per weight, biases, bytes per bias) for each linear layer whose weight is kept outside the
    parameters once packed (oneDNN's layout, int8: its bias packed with it, in float32)."""
    for m in module.modules():
        size = _linear_weight_size(m, dtype)
        if size is None or isinstance(getattr(m, "weight", None), torch.nn.Parameter):
            continue
        bias = getattr(m, "bias", None)
        if isinstance(bias, torch.Tensor):
            yield m.in_features * m.out_features, size, bias.numel(), bias.element_size()
        else:
            yield m.in_features * m.out_features, size, m.out_features if getattr(m, "has_bias", False) else 0, 4


def weight_bytes(module, dtype: torch.dtype) -> int:
    """Bytes of a module's weights as loaded: its parameters (`_count`), and the linear weights and biases kept
    outside them once packed (oneDNN's layout, int8)."""
    return _count(module)[1] + sum(w * w_size + b * b_size for w, w_size, b, b_size in _packed_linears(module, dtype))


def parameter_count(module, dtype: torch.dtype) -> int:
    """A module's parameters as loaded, the packed linear layers' weights and biases included (an int8 model keeps
    its linear weights outside `parameters()`)."""
    return _count(module)[0] + sum(w + b for w, _, b, _ in _packed_linears(module, dtype))


def decoding_pass_bytes(model) -> int:
    """Bytes of linear-layer weights one decoding pass reads (what memory-bound decoding costs): an encoder's are
    read once per input, not per pass, and an input embedding's one row a token."""
    total = 0
    for name, module in model.named_modules():
        size = _linear_weight_size(module, model.dtype)
        if size is not None and "encoder" not in name.split("."):
            total += module.in_features * module.out_features * size
    return total


def offloaded(model) -> bool:
    """Whether accelerate placed part of the model on disk (its weights are read back at every pass)."""
    return "disk" in set((getattr(model, "hf_device_map", None) or {}).values())


def _bnb_config(quantization: str, device: torch.device):
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except Exception as exc:  # bitsandbytes fails in many platform-specific ways
        raise LoadError(f"quantization {quantization!r} needs bitsandbytes, which does not load here ({exc}); "
                        "set quantization: none in models.yaml") from None
    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16 if device.type == "cuda"
                              else torch.float32)


def _auto_class(spec: ModelSpec, config):
    if spec.decoder_only:  # e.g. distil-Whisper's decoder as an assistant that reads the target's encoder
        return AutoModelForCausalLM
    if config.model_type == "whisper":
        return AutoModelForSpeechSeq2Seq
    return AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM


def _model_and_tokenizer(spec: ModelSpec, folder: str, device: torch.device, dtype: torch.dtype,
                         progress: Progress) -> tuple[Any, Any, Any]:
    """(model in eval mode on `device`, tokenizer, processor or None) from `folder`."""
    config = AutoConfig.from_pretrained(folder)
    kwargs: dict[str, Any] = {"dtype": dtype, "use_safetensors": True}  # never unpickle weights
    if spec.quantization in ("int8", "4bit"):
        kwargs["quantization_config"] = _bnb_config(spec.quantization, device)
    if spec.device_map:
        kwargs["device_map"] = spec.device_map
        if spec.max_memory:
            kwargs["max_memory"] = dict(spec.max_memory)
        if spec.offload_folder:
            kwargs["offload_folder"] = str(cache_dir() / spec.offload_folder / spec.name)
    auto = _auto_class(spec, config)
    if spec.quantization in TORCH_INT8 and device.type != "cpu":
        raise LoadError(f"{spec.name}: {spec.quantization} quantization runs on the CPU only; use int8 on CUDA")

    def float_model():
        if (spec.source == "pack" and config.model_type != "whisper" and spec.quantization not in ("int8", "4bit")
                and not spec.device_map):
            return load_cached(Path(folder), dtype, tokenizer=False)[0]
        if not spec.decoder_only:
            return auto.from_pretrained(folder, **kwargs)
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()   # the checkpoint's encoder is left unread on purpose: no report about it
        try:
            return auto.from_pretrained(folder, **kwargs)
        finally:
            hf_logging.set_verbosity(level)

    if spec.quantization in TORCH_INT8:
        model = int8_model(spec, Path(folder), auto._model_mapping[type(config)], float_model, progress)
        if spec.quantization == "w8a8":   # row-invariant products: the attention must be too
            use_row_invariant_attention(model)
    else:
        model = float_model()
    if (getattr(model, "hf_device_map", None) or {}).get("") == "disk":   # accelerate cannot run a model wholly on disk
        raise LoadError(f"{spec.name}: its max_memory cap ({dict(spec.max_memory)}) leaves no layer in memory; raise "
                        "it in models.yaml")
    processor = None
    if config.model_type == "whisper":
        processor = AutoProcessor.from_pretrained(folder)
        tokenizer = processor.tokenizer
    else:
        tokenizer = _shared_tokenizer(Path(folder), AutoTokenizer)
    if not spec.device_map and spec.quantization not in ("int8", "4bit", *TORCH_INT8):
        model = model.to(device=device, dtype=dtype)
    return model.eval(), tokenizer, processor


def _packed_reader(spec: ModelSpec, folder: Path, device: torch.device):
    """What puts the cache's packed linear weights into a model, or None when the cache holds none for it."""
    if not from_env().packed_store:   # to compare: pack at each load, as before the store
        return None
    if spec.source != "pack" or not packs_onednn(spec, device) or not packed_stored(folder):
        return None

    def read(model) -> int:
        try:
            return packed.use_stored(model, packed.packed_folder(folder))
        except (ValueError, RuntimeError, OSError):   # refused before any layer is swapped: packed at load instead
            return 0
    return read


def load_model(spec: ModelSpec, catalog: Catalog, *, device: torch.device | None = None,
               progress: Progress | None = None) -> LoadedModel:
    """Load one model on `device` (default: CUDA if present, else CPU), in the numerics its catalog entry gives for
    that hardware (`ModelSpec.on`); the returned model's `spec` is that one. Raises LoadError with a clear reason.

    A pack not yet in the cache is converted here, in this process. The app and the CLI load through
    `prepare.load_prepared` instead, which converts in a child process first: a conversion churns through
    gigabytes, and a process that did one ran its timed passes at about half speed afterwards, while one that loads
    the finished cache does not.
    """
    hf_logging.disable_progress_bar()  # progress goes through `progress`, for gr.Progress and the CLI bar alike
    progress = progress or (lambda fraction, message: None)
    device = device or default_device()
    spec = spec.on(device)   # the numerics it runs in on this hardware (its `cpu:` recipe on a CPU)
    dtype = torch_dtype(spec.dtype, device)
    if device.type == "cpu":
        keep_freed_memory()   # a long prompt's pass reuses its freed blocks instead of page-faulting new ones
    started = time.perf_counter()
    try:
        folder = weights_folder(spec, catalog, device, dtype, progress)
        progress(0.8, f"{spec.name}: loading weights")
        model, tokenizer, processor = _model_and_tokenizer(spec, folder, device, dtype, progress)
        refusal = precision.apply_encoder_dtype(spec, model, device)   # before packing: a cast layer stays unpacked
        if refusal:
            raise LoadError(refusal)
        params, nbytes = parameter_count(model, dtype), weight_bytes(model, dtype)   # int8 layers' packed weights too
        onednn = dtype == torch.float32 and onednn_enabled()
        if device.type == "cpu" and spec.quantization == "none":
            if not offloaded(model):
                materialize(model, onednn=onednn, packed=_packed_reader(spec, Path(folder), device))
            elif onednn:
                onednn_for_offloaded(model)
    except LoadError as exc:
        note_failure(spec.name, str(exc))
        raise
    except PackError as exc:
        note_failure(spec.name, str(exc))
        raise LoadError(f"{spec.name}: {exc}") from None
    except MemoryError:
        raise LoadError(f"{spec.name}: out of memory while loading; free memory or lower "
                        "ASSISTGEN_MEMORY_BUDGET_GB") from None
    except OSError as exc:
        reason = str(exc).splitlines()[0]
        if "safetensors" in reason:
            reason += " (weights load only from safetensors, GGUF or offline packs, never from pickled .bin files)"
        if spec.source == "hub":
            note_failure(spec.name, f"{spec.location}: cannot be fetched from the hub ({reason})")
        raise LoadError(f"{spec.name}: {reason}") from None
    if device.type == "cpu":
        release_freed_memory()   # the load's own copies (the float model an int8 one is quantized from, say)
    progress(1.0, f"{spec.name}: ready")
    return LoadedModel(spec, model, tokenizer, processor, params, nbytes, time.perf_counter() - started,
                       folder=folder)


# --- pair checks ------------------------------------------------------------------------------------------------

def tokenizer_mode(target_tokenizer, assistant_tokenizer) -> tuple[str, str]:
    """Classify a pair: "same-tokenizer" when vocabularies, special tokens and encodings agree, else why not."""
    if target_tokenizer is assistant_tokenizer:  # loaded once from byte-identical files
        return "same-tokenizer", "identical tokenizers: the assistant's drafts are the target's token ids"
    if target_tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
        a, b = len(target_tokenizer.get_vocab()), len(assistant_tokenizer.get_vocab())
        return "different-tokenizer", f"the vocabularies differ ({a:,} vs {b:,} tokens)"
    if set(target_tokenizer.all_special_tokens) != set(assistant_tokenizer.all_special_tokens):
        return "different-tokenizer", "the special tokens differ"
    probe = "def f(x):\n    return x ** 2  # Grüße, 日本語 <|endoftext|>"
    if target_tokenizer.encode(probe) != assistant_tokenizer.encode(probe):
        return "different-tokenizer", "the same text encodes to different token ids"
    return "same-tokenizer", "identical tokenizers: the assistant's drafts are the target's token ids"


def _target_encoder(target: LoadedModel, files: ExitStack) -> dict[str, Callable[[], torch.Tensor]]:
    """The target's encoder tensors by name, each read when called: from the checkpoint it was loaded from, as the
    file holds them (before any cast or quantization at load), else, where those files cannot be found (a model
    built in memory), from the loaded model."""
    paths = checkpoint_files(target.spec, target.folder) if target.folder else None
    if not paths:
        return {name: (lambda t=t: t) for name, t in module_tensors(target.model).items()
                if "encoder" in name.split(".")}
    tensors = {}
    for path in paths:
        f = files.enter_context(safe_open(str(path), framework="pt"))
        tensors.update({name: functools.partial(f.get_tensor, name) for name in f.keys()
                        if "encoder" in name.split(".")})
    return tensors


def encoder_mismatch(target: LoadedModel, assistant: LoadedModel) -> str | None:
    """Where a decoder-only assistant's checkpoint holds an encoder (distil-Whisper's repositories hold their
    teacher's), how it differs from the target's, or None when it is the target's, weight for weight, or the
    checkpoint holds none. The two checkpoints are compared file against file, one tensor at a time, in the
    target file's dtype (distil-Whisper's float16 values against its teacher's float32 file, which holds float16
    values), so what the target's load does to its encoder (a bfloat16 cast, int8 layers) does not matter. A target
    without files (built in memory) is compared as loaded, in its dtype."""
    files = checkpoint_files(assistant.spec, assistant.folder) if assistant.folder else None
    if not files:
        return None
    with ExitStack() as opened:
        ours = _target_encoder(target, opened)
        seen = 0
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if "encoder" not in name.split("."):
                        continue
                    seen += 1
                    if name not in ours:
                        return f"the target has no tensor {name}"
                    if not same_tensors({name: ours[name]()}, {name: f.get_tensor(name)}):
                        return f"{name} differs"
    if seen and seen != len(ours):
        return f"{seen} encoder tensors against the target's {len(ours)}"
    return None


def check_pair(spec: PairSpec, target: LoadedModel, assistant: LoadedModel | None) -> LoadedPair:
    """Decide how a pair runs, and collect the warnings the user should see."""
    if assistant is None:
        return LoadedPair(spec, target, None, "no-assistant", "this pair has no assistant model")
    warnings = []
    t_cfg, a_cfg = target.model.config, assistant.model.config
    if t_cfg.is_encoder_decoder and not a_cfg.is_encoder_decoder:
        if a_cfg.model_type != "whisper" or a_cfg.d_model != t_cfg.d_model:
            raise LoadError(f"pair {spec.name!r}: the decoder-only assistant cannot read the target's encoder "
                            f"outputs (d_model {getattr(a_cfg, 'd_model', '?')} vs {t_cfg.d_model})")
        mismatch = encoder_mismatch(target, assistant)
        if mismatch:
            raise LoadError(f"pair {spec.name!r}: the decoder-only assistant {assistant.spec.name} was trained on "
                            f"another encoder than the target's ({mismatch}), so it cannot read the target's "
                            "encoder output; pair it with the target whose encoder its checkpoint holds")
    elif a_cfg.is_encoder_decoder != t_cfg.is_encoder_decoder:
        raise LoadError(f"pair {spec.name!r}: an encoder-decoder model cannot assist a decoder-only one, "
                        "or the reverse")
    mode, reason = tokenizer_mode(target.tokenizer, assistant.tokenizer)
    if mode != "same-tokenizer":
        reason = (f"different tokenizers ({reason}): the assistant drafts text in its own vocabulary, which is "
                  "re-tokenized for the target at every step; the target still decides every token")
    target_bytes, assistant_bytes = decoding_pass_bytes(target.model), decoding_pass_bytes(assistant.model)
    ratio = target_bytes / max(1, assistant_bytes)
    if ratio < SIZE_RATIO_WARNING:
        warnings.append(f"an assistant pass reads only {ratio:.1f}x fewer weight bytes than a target pass "
                        f"({assistant_bytes/1e6:,.0f} MB vs {target_bytes/1e6:,.0f} MB); assisted generation pays off "
                        f"best at about {SIZE_RATIO_WARNING:.0f}x or more, or where the drafts are accepted "
                        "almost always")
    return LoadedPair(spec, target, assistant, mode, reason, warnings)
