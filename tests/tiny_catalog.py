"""A catalog of tiny random models saved as local folders: the app and the service run on it in seconds."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (GenerationConfig, PreTrainedTokenizerFast, WhisperConfig, WhisperFeatureExtractor,
                          WhisperForConditionalGeneration, WhisperProcessor, WhisperTokenizerFast)

import tiny_models as tm

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
    model = tm.qwen2(seed, vocab=320, hidden=32, layers=layers, init=0.2,
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
