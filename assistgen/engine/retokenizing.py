"""Drafts from an assistant with its own tokenizer (transformers' "universal assisted generation"): the text is carried
across the two vocabularies at every step, the forced prefix once; a Whisper assistant reads its own encoder's view
of the clip (`whisper_decoder.assistant_encoder_outputs`)."""
from __future__ import annotations

import torch

from . import whisper_decoder
from .drafting import Draft
from .kv import CachedDecoder, eos_token_ids


class DifferentTokenizerCandidates:
    """An assistant with its own tokenizer (transformers' "universal assisted generation").

    Each step: the text the target has generated so far is re-tokenized for the assistant (its KV cache keeps the
    longest prefix that did not change), the assistant drafts greedily in its own vocabulary, and the draft text is
    re-tokenized for the target. Only target tokens beyond the text the two already share become candidates, and the
    last one is dropped when it may be a cut-off word. The target verifies as usual, so greedy output is unchanged;
    with sampling the candidates are treated as deterministic proposals, which keeps sampling exact.
    """

    def __init__(self, assistant: CachedDecoder, assistant_prefix: list[int], target_prefix_length: int,
                 target_tokenizer, assistant_tokenizer, target_eos: set[int], assistant_eos: set[int]):
        self.assistant = assistant
        self.assistant_prefix = assistant_prefix
        self.target_prefix_length = target_prefix_length
        self.target_tokenizer = target_tokenizer
        self.assistant_tokenizer = assistant_tokenizer
        self.target_eos = target_eos
        self.assistant_eos = assistant_eos

    @property
    def passes(self) -> int:
        return self.assistant.passes

    def update(self, emitted, draft_s, verify_s):
        pass

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        generated = tokens[self.target_prefix_length:]
        text = self.target_tokenizer.decode(generated, skip_special_tokens=True)
        assistant_tokens = self.assistant_prefix + self.assistant_tokenizer.encode(text, add_special_tokens=False)
        drafts: list[int] = []
        confidences: list[float] = []   # the assistant's probability of each of its tokens (EOS included)
        ended = False
        for _ in range(num_candidates):
            probs = torch.softmax(self.assistant.logits(assistant_tokens + drafts)[0], dim=-1)
            token = int(probs.argmax())
            confidences.append(float(probs[token]))
            if token in self.assistant_eos:
                ended = True
                break
            drafts.append(token)
            if keep_drafting is not None and not keep_drafting(confidences):
                break
        draft_text = self.assistant_tokenizer.decode(drafts, skip_special_tokens=True)
        full = self.target_tokenizer.encode(text + draft_text, add_special_tokens=False)
        if full[:len(generated)] == generated:
            base, candidates = generated, full[len(generated):]
        else:  # the re-tokenized text no longer splits where the target's tokens do: propose the draft alone
            base, text = [], ""
            candidates = self.target_tokenizer.encode(draft_text, add_special_tokens=False)
        if len(candidates) > 1 and not ended:
            candidates = candidates[:-1]
        candidates = candidates[:num_candidates - 1 if ended else num_candidates]
        kept = self._confidences(base, len(text), candidates, drafts, confidences)
        if ended and self.target_eos:
            candidates, kept = candidates + [min(self.target_eos)], kept + [confidences[-1]]
        return Draft(candidates, None, kept)

    def _confidences(self, base: list[int], offset: int, candidates: list[int], drafts: list[int],
                     confidences: list[float]) -> list[float]:
        """Each target candidate's confidence, given the ones before it: the product of the assistant's confidences
        in the tokens that complete its text (1.0 when the tokens before already covered it)."""
        ends, out, covered = [], [], 0
        for j in range(len(drafts)):
            ends.append(len(self.assistant_tokenizer.decode(drafts[:j + 1], skip_special_tokens=True)))
        for i in range(len(candidates)):
            end = len(self.target_tokenizer.decode(base + candidates[:i + 1], skip_special_tokens=True)) - offset
            needed = next((j + 1 for j, e in enumerate(ends) if e >= end), len(drafts))
            step = 1.0
            for c in confidences[covered:needed]:
                step *= c
            covered = max(covered, needed)
            out.append(step)
        return out


_translated: dict[tuple, tuple] = {}   # (tokenizers' ids, prefix, drop) -> (the tokenizers, the translation)


def translate_prefix(prefix: list[int], target_tokenizer, assistant_tokenizer, *, drop: set[str] = frozenset()) -> list[int]:
    """A prompt or forced decoder prefix in the assistant's vocabulary: special tokens map by name (those in `drop`
    or unknown to the assistant are left out), text is decoded and re-encoded. Remembered: Whisper's forced prefix
    is the same for every clip and window, and translating it reads the assistant's whole vocabulary."""
    key = (id(target_tokenizer), id(assistant_tokenizer), tuple(prefix), frozenset(drop))
    hit = _translated.get(key)
    if hit is not None and hit[0] is target_tokenizer and hit[1] is assistant_tokenizer:
        return list(hit[2])
    out = _translate(prefix, target_tokenizer, assistant_tokenizer, drop)
    if len(_translated) > 256:
        _translated.clear()
    _translated[key] = (target_tokenizer, assistant_tokenizer, tuple(out))
    return out


def _translate(prefix: list[int], target_tokenizer, assistant_tokenizer, drop) -> list[int]:
    out: list[int] = []
    specials = set(target_tokenizer.all_special_ids)
    text: list[int] = []

    def flush():
        if text:
            out.extend(assistant_tokenizer.encode(target_tokenizer.decode(text), add_special_tokens=False))
            text.clear()

    vocab = assistant_tokenizer.get_vocab()
    for token in prefix:
        name = target_tokenizer.convert_ids_to_tokens(token)
        if token in specials or (name in vocab and name.startswith("<|") and name.endswith("|>")):
            flush()
            if name not in drop and name in vocab:
                out.append(vocab[name])
        else:
            text.append(token)
    flush()
    return out


def different_tokenizer_source(model, assistant_model, inputs, prefix, eos, tokenizer, assistant_tokenizer, *,
                               audio_margin_s: float | None = whisper_decoder.AUDIO_MARGIN_S):
    """The assistant reads the same input in its own vocabulary; its own encoder runs once on the same features (a
    Whisper assistant's on the clip's frames plus `audio_margin_s` only, when the inputs say how many)."""
    if model.config.is_encoder_decoder:
        if not assistant_model.config.is_encoder_decoder:
            raise ValueError("a different-tokenizer assistant for an encoder-decoder target must have its own encoder")
        whisper_decoder.check_features(assistant_model, inputs)
        drop = whisper_decoder.prefix_tokens_unknown_to(assistant_model, model)
        assistant_prefix = translate_prefix(prefix, tokenizer, assistant_tokenizer, drop=drop)
        assistant_inputs = {k: v for k, v in inputs.items() if k != "decoder_input_ids"}
        assistant_inputs["decoder_input_ids"] = torch.tensor([assistant_prefix])
        encoder_outputs = whisper_decoder.assistant_encoder_outputs(assistant_model, inputs, audio_margin_s)
    else:
        assistant_prefix = translate_prefix(prefix, tokenizer, assistant_tokenizer)
        assistant_inputs = {"input_ids": torch.tensor([assistant_prefix])}
        encoder_outputs = None
    return DifferentTokenizerCandidates(
        CachedDecoder(assistant_model, assistant_inputs, prefix_length=len(assistant_prefix),
                      encoder_outputs=encoder_outputs, assistant=True),
        assistant_prefix, len(prefix), tokenizer, assistant_tokenizer, eos, eos_token_ids(assistant_model))
