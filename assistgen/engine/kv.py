"""One model's decoder behind a KV cache that follows whatever token sequence it is asked about."""
from __future__ import annotations

import inspect

import torch

from . import attention, llama_decoder, static_steps, whisper_decoder
from .prefix_cache import prefix_cache, shared_prefix_length


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _as_list(ids) -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


class CachedDecoder:
    """A transformers model's decoder with a KV cache, fed incrementally.

    The caller passes the whole decoder sequence each time (prompt for decoder-only models, decoder prefix for
    encoder-decoder ones, then generated tokens). The cache is cropped back to the longest prefix it shares with that
    sequence and only the rest is fed, so rejected draft tokens disappear without any bookkeeping by the caller.

    The encoder of an encoder-decoder model runs once, here, unless its ``encoder_outputs`` are given (an assistant
    whose encoder ran on part of the input). A decoder-only Whisper (``WhisperForCausalLM``, the distil-Whisper
    assistant layout) takes another model's ``encoder_outputs``.

    A Whisper target computes its cross-attention keys and values here, once, as its first pass would
    (`cross_key_values`), and its cache starts with them (`whisper_decoder.prefilled_cache`).

    `assistant=True` marks a model whose logits only ever choose drafts: a Whisper one then runs through
    `whisper_decoder.WhisperDecoderStep`, its cross-attention over the whole encoder output it reads (with the
    target's keys and values, `target_key_values`, where its projections give them), a Llama or Qwen2 one through
    `llama_decoder.LlamaDecoderStep`: each the same arithmetic without transformers' per-step overhead (which took a
    third of a tiny.en draft pass). A target runs through transformers' own modules, except a row-invariant Llama or
    Qwen2 one (w8a8), which runs through `LlamaDecoderStep` with each continuing row attended as a one-token step. A model with
    row-invariant attention reads its prompt in a pass of its own, before the first drafts
    (`attention.separate_prompt_pass`). On a CUDA device a Llama or Qwen2 model, target or assistant, runs through
    `static_steps.StaticCacheStep` instead: a static cache, each pass replayed as a CUDA graph
    (`static_steps.use_static_steps`).

    `shared_prefix`: the prompt's first tokens that other prompts share (a chat template's, an instruction's). A
    model run through `LlamaDecoderStep` reads them in a pass of their own, or takes their keys and values from the
    last prompt that read them (`prefix_cache`), then the rest of the prompt in one pass; any other model ignores it.
    """

    @torch.inference_mode()   # the encoder runs here: without it, autograd would keep its activations
    def __init__(self, model, inputs: dict, *, prefix_length: int, encoder_outputs=None, assistant: bool = False,
                 target_key_values: whisper_decoder.KeyValues | None = None, shared_prefix: int = 0):
        self.model = model
        self.device = model.device
        self.passes = 0
        self._cache = None
        self._seen: list[int] = []
        self._extra: dict = {}
        self.encoder_outputs = None
        config = model.config
        if config.is_encoder_decoder:
            encoder = model.get_encoder()
            accepted = inspect.signature(encoder.forward).parameters
            enc_inputs = {k: v.to(self.device) for k, v in inputs.items()
                          if k in accepted and k != "decoder_input_ids" and isinstance(v, torch.Tensor)}
            self.encoder_outputs = (encoder_outputs if encoder_outputs is not None
                                    else encoder(**enc_inputs, return_dict=True))
            self._extra["encoder_outputs"] = self.encoder_outputs
            if "attention_mask" in enc_inputs and "input_ids" in enc_inputs:
                self._extra["attention_mask"] = enc_inputs["attention_mask"]
        elif encoder_outputs is not None:
            self._extra["encoder_outputs"] = (encoder_outputs.last_hidden_state.to(self.device),)
        self._input_key = "decoder_input_ids" if config.is_encoder_decoder else "input_ids"
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._prompt_apart = attention.separate_prompt_pass(model)
        gen = getattr(model, "generation_config", None)
        self._suppress = _as_list(getattr(gen, "suppress_tokens", None))
        self._begin_suppress = _as_list(getattr(gen, "begin_suppress_tokens", None))
        self.prefix_length = prefix_length
        self._step = None
        self.cross_key_values: whisper_decoder.KeyValues | None = None
        if whisper_decoder.supports(model) and "encoder_outputs" in self._extra:
            hidden = self._extra["encoder_outputs"]
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden.last_hidden_state
            if assistant:
                self._step = whisper_decoder.WhisperDecoderStep(model, hidden, target_key_values)
            elif config.is_encoder_decoder:
                self.cross_key_values = whisper_decoder.cross_key_values(model, hidden)
                self._cache = whisper_decoder.prefilled_cache(model, self.cross_key_values)
        elif static_steps.use_static_steps(model):   # a GPU: graph-captured passes from a static cache
            self._step = static_steps.StaticCacheStep(model)
        elif (assistant or self._prompt_apart) and llama_decoder.supports(model):
            self._step = llama_decoder.LlamaDecoderStep(model, row_invariant=self._prompt_apart)
        # the tokens of the prompt its first pass takes from `prefix_cache`: 0 where this model keeps no prefix
        self.shared_prefix = shared_prefix if isinstance(self._step, llama_decoder.LlamaDecoderStep) else 0
        self.kept_prefix = 0   # the tokens of it the first pass took from the cache (0: read them itself)

    @property
    def common_vocab(self) -> int | None:
        """How many of the first token ids the output layer scores apart (`LlamaDecoderStep.common_vocab`), for
        `logits(..., extra_ids=...)`; None where it scores every id at once."""
        return getattr(self._step, "common_vocab", None)

    @torch.inference_mode()
    def logits(self, tokens: list[int], keep: int = 1, *, extra_ids: tuple[int, ...] | None = None) -> torch.Tensor:
        """Logits ``(keep, vocab)`` (float32) predicting the tokens after each of the last `keep` positions of `tokens`.

        One forward pass (counted in `passes`) over the part of `tokens` the cache has not seen. `extra_ids`, where
        `common_vocab` is set: the logits of the first `common_vocab` ids, then of `extra_ids`, only (a draft's
        choice among the vocabulary's most frequent ids and a few others).
        """
        reuse = min(common_prefix(self._seen, tokens), len(tokens) - keep)
        logits = self._logits(tokens, reuse, keep, extra_ids if self.common_vocab is not None else None)
        self._seen = list(tokens)
        self.passes += 1
        if self._suppress or self._begin_suppress:
            logits = self._mask(logits, first_position=len(tokens) - keep + 1)
        return logits

    def _logits(self, tokens: list[int], reuse: int, keep: int, extra_ids: tuple[int, ...] | None = None
                ) -> torch.Tensor:
        end = len(tokens) - keep + 1   # on the first pass, the prompt: what the baseline's first pass reads
        if reuse == 0 and 0 < self.shared_prefix < end:   # the shared beginning, then the rest of the prompt
            self._read_shared_prefix(tokens[:self.shared_prefix])
            first = self._step.logits(tokens[self.shared_prefix:end], self.shared_prefix, 1, prompt=True,
                                      extra_ids=extra_ids)
            return first if keep == 1 else torch.cat([first, self._logits(tokens, end, keep - 1, extra_ids)])
        if reuse == 0 and keep > 1 and self._prompt_apart:   # the prompt alone, as the baseline reads it; then the rest
            first = self._logits(tokens[:len(tokens) - keep + 1], 0, 1)
            return torch.cat([first, self._logits(tokens, len(tokens) - keep + 1, keep - 1)])
        if extra_ids is not None:
            return self._step.logits(tokens[reuse:], reuse, keep, extra_ids=extra_ids)
        if self._step is not None:
            return self._step.logits(tokens[reuse:], reuse, keep)
        return self._transformers_logits(tokens, reuse, keep)

    def _read_shared_prefix(self, prefix: list[int]) -> None:
        """Fill the step's buffers with `prefix`'s keys and values: kept ones, or read now (in a pass of its own,
        cached or not, so that they are the same bits either way) and kept."""
        kept = prefix_cache(self.model)
        key_values = kept.get(prefix)
        if key_values is None:
            self._step.logits(prefix, 0, 1)
            kept.put(prefix, self._step.key_values(len(prefix)))
        else:
            self._step.load(key_values)
            self.kept_prefix = len(prefix)

    def _transformers_logits(self, tokens: list[int], reuse: int, keep: int) -> torch.Tensor:
        cached = self._cache.get_seq_length() if self._cache is not None else 0
        if reuse < cached:
            self._cache.crop(reuse - cached)
        new = torch.tensor([tokens[reuse:]], dtype=torch.long, device=self.device)
        kwargs = {self._input_key: new, "cache": self._cache, "use_cache": True, **self._extra}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        out = self.model(**kwargs)
        self._cache = out.cache
        return out.logits[0, -keep:].float()

    def _mask(self, logits: torch.Tensor, first_position: int) -> torch.Tensor:
        """The model's generation_config `suppress_tokens` everywhere, `begin_suppress_tokens` at the first new token."""
        logits = logits.clone()
        if self._suppress:
            logits[:, self._suppress] = -float("inf")
        row = self.prefix_length - first_position
        if self._begin_suppress and 0 <= row < logits.shape[0]:
            logits[row, self._begin_suppress] = -float("inf")
        return logits


@torch.inference_mode()
def keep_shared_prefix(model, inputs: dict, *, assistant: bool = False) -> None:
    """Read the shared beginning of a decoder-only prompt (`prefix_cache.SHARED_PREFIX` of `inputs`) into `model`'s
    prefix cache now, unless it is there: run before a comparison's runs, so that each of them, baseline or assisted,
    takes it from the cache alike (`assistant`: the model drafts, as in `CachedDecoder`)."""
    shared = shared_prefix_length(inputs)
    if not shared or model.config.is_encoder_decoder:
        return
    ids = [int(i) for i in inputs["input_ids"][0]]
    if ids[:shared] in prefix_cache(model):
        return
    decoder = CachedDecoder(model, inputs, prefix_length=len(ids), assistant=assistant, shared_prefix=shared)
    if 0 < decoder.shared_prefix < len(ids):
        decoder._read_shared_prefix(ids[:shared])


def eos_token_ids(model, eos_token_id=None) -> set[int]:
    """The ids that end generation: `eos_token_id` when given, else the model's generation config's, else its
    config's."""
    if eos_token_id is None:
        gen = getattr(model, "generation_config", None)
        eos_token_id = getattr(gen, "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = model.config.eos_token_id
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(e) for e in eos_token_id}
