"""A Hugging Face cache in the hub's own layout, holding small random stand-ins saved under the catalog's exact repo
ids: what a user (or a Space) with those models already downloaded has on disk, minus the size.

Layout, as huggingface_hub writes it: ``models--ORG--NAME/blobs/<sha256>``, ``snapshots/<commit>/<file>`` as a
relative symlink to its blob, and ``refs/main`` holding the commit. Each stand-in has the files its real repository
has for transformers: ``config.json``, ``generation_config.json``, ``model.safetensors`` and the tokenizer's (and, for
Whisper, the processor's) files, built by transformers' own classes of that family from a tokenizer trained here.

The assistants are made to agree with their targets where the real ones do, so that a pair that reads the wrong
input (a decoder-only assistant given some other encoder output, say) shows up as rejected drafts:
- distil-Whisper's stand-in is a full Whisper checkpoint, as the real repository is, whose encoder is the target's
  (the load checks it) and whose decoder is the target's too; loaded as a decoder-only ``WhisperForCausalLM`` it
  agrees with the target only if it reads the target's encoder output. Both keep the hub's dtypes: the teacher's
  file is float32 holding float16 values (OpenAI released Whisper in float16), distil-Whisper's is float16.
- the small Qwen and OPT stand-ins are their target with noise on every weight; FLAN-T5's small one is a model of
  half its target's width, as flan-t5-small (512) is of flan-t5-large (1024), which runs its own encoder.
"""
from __future__ import annotations

import copy
import hashlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
          "The quick brown fox jumps over the lazy dog. Assisted generation is fast.",
          "Translate the following text into French. Summarize the following text.",
          "translate English to German: the house is wonderful. summarize: studies have shown that owning a dog"] * 20
WHISPER_LANGUAGES = ("en", "de", "fr", "es", "it", "pt", "nl", "zh", "ja", "ru")
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


# --- the hub's layout ------------------------------------------------------------------------------------------------

def add_to_cache(cache: Path, repo_id: str, folder: Path) -> Path:
    """Put every file of `folder` into `cache` as the snapshot of `repo_id` at one commit; returns the snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.rglob("*")):
        if not path.is_file():
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


# --- tokenizers of each family, trained here -------------------------------------------------------------------------

def _byte_bpe(vocab_size: int, specials: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab and merges of a byte-level BPE trained on CORPUS (GPT-2's scheme, which Qwen and OPT use)."""
    import json
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    spec = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    return spec["vocab"], merges


def qwen_tokenizer():
    from transformers import Qwen2Tokenizer
    vocab, merges = _byte_bpe(400, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = QWEN_TEMPLATE
    return tokenizer


def opt_tokenizer():
    """OPT's GPT-2 BPE: <s> 0, <pad> 1, </s> 2, <unk> 3, and </s> put before every input, as the real one does."""
    from transformers import GPT2Tokenizer
    vocab, merges = _byte_bpe(400, ["<s>", "<pad>", "</s>", "<unk>"])
    return GPT2Tokenizer(vocab=vocab, merges=merges, bos_token="</s>", eos_token="</s>", pad_token="<pad>",
                         unk_token="<unk>", add_bos_token=True)


def t5_tokenizer(folder: Path):
    """FLAN-T5's: a SentencePiece unigram model (spiece.model, as in the real repository) and the tokenizer that
    transformers builds from its pieces, with T5's 100 sentinel tokens."""
    import sentencepiece as spm
    from transformers import T5Tokenizer
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=80,
                                   hard_vocab_limit=False, model_type="unigram", pad_id=0, eos_id=1, unk_id=2,
                                   bos_id=-1, minloglevel=2)
    (folder / "spiece.model").write_bytes(model.getvalue())
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    pieces[:3] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    return T5Tokenizer(vocab=pieces, extra_ids=100)


def whisper_processor(num_mel_bins: int):
    """Whisper's byte-level tokenizer (no merges here) with its special tokens: start, languages, tasks, the
    no-timestamps token and the 1501 timestamps, in the real order; and the feature extractor."""
    from transformers import WhisperFeatureExtractor, WhisperProcessor, WhisperTokenizer
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    specials = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{lang}|>" for lang in WHISPER_LANGUAGES] +
                ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>",
                 "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    tokenizer = WhisperTokenizer(vocab=vocab, merges=[], unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                 eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    return WhisperProcessor(WhisperFeatureExtractor(feature_size=num_mel_bins), tokenizer)


# --- the stand-ins ----------------------------------------------------------------------------------------------------

def _noisy(model, scale: float, seed: int):
    torch.manual_seed(seed)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.add_(torch.randn_like(p) * scale * p.std().clamp_min(1e-3))
    return clone


def _save(folder: Path, model, tokenizer, feature_extractor=None) -> Path:
    """The files of a real repository: the weights in safetensors, the configs, the tokenizer's files and (for
    speech) the feature extractor's preprocessor_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)   # config.json, generation_config.json, model.safetensors
    tokenizer.save_pretrained(folder)
    if feature_extractor is not None:
        feature_extractor.save_pretrained(folder)
    return folder


def whisper_pair(work: Path, num_mel_bins: int, english_only: bool = False) -> tuple[Path, Path]:
    """(target, distil-style assistant): the assistant's checkpoint is a whole Whisper model, as distil-Whisper's
    repositories hold, whose encoder is the target's (distil-Whisper keeps its teacher's) and whose decoder here is
    the target's too. The target is saved in float32 with values that float16 holds exactly, the assistant in
    float16, as on the hub; loaded in float32, the assistant's weights are the target's. An English-only target
    (small.en) has no language or task tokens in its generation config."""
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration
    processor = whisper_processor(num_mel_bins)
    tok = processor.tokenizer
    ids = dict(zip(["eot", "sot", "translate", "transcribe", "prev", "lm", "notimestamps"], tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startofprev|>",
         "<|startoflm|>", "<|notimestamps|>"])))
    config = WhisperConfig(vocab_size=len(tok), num_mel_bins=num_mel_bins, d_model=16, encoder_layers=1,
                           decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=1500, max_target_positions=64,
                           pad_token_id=ids["eot"], bos_token_id=ids["eot"], eos_token_id=ids["eot"],
                           decoder_start_token_id=ids["sot"], init_std=0.5)
    torch.manual_seed(0)
    target = WhisperForConditionalGeneration(config).eval()
    target.generation_config = GenerationConfig(
        decoder_start_token_id=ids["sot"], eos_token_id=ids["eot"], pad_token_id=ids["eot"], bos_token_id=ids["eot"],
        is_multilingual=True, lang_to_id={f"<|{lang}|>": tok.convert_tokens_to_ids(f"<|{lang}|>")
                                          for lang in WHISPER_LANGUAGES},
        task_to_id={"translate": ids["translate"], "transcribe": ids["transcribe"]},
        no_timestamps_token_id=ids["notimestamps"], prev_sot_token_id=ids["prev"], max_initial_timestamp_index=50,
        begin_suppress_tokens=[tok.convert_tokens_to_ids("Ġ"), ids["eot"]], suppress_tokens=[ids["lm"]],
        max_length=64)
    if english_only:
        target.generation_config.is_multilingual = False
        del target.generation_config.lang_to_id, target.generation_config.task_to_id
    with torch.no_grad():   # float16 values in a float32 file, as openai/whisper-* hold
        for tensor in target.state_dict().values():
            tensor.copy_(tensor.half())
    assistant = copy.deepcopy(target).half()   # the teacher's encoder, which a decoder-only load checks and drops
    return (_save(work / "target", target, tok, processor.feature_extractor),
            _save(work / "assistant", assistant, tok, processor.feature_extractor))


def qwen_pair(work: Path, hidden: int = 32) -> tuple[Path, Path]:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    tokenizer = qwen_tokenizer()
    im_end, eot = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=eot, eos_token_id=im_end, tie_word_embeddings=True, initializer_range=0.2)
    torch.manual_seed(0)
    target = Qwen2ForCausalLM(config).eval()
    target.generation_config.eos_token_id = [im_end, eot]   # as Qwen's instruct repositories have it
    target.generation_config.pad_token_id = eot
    return _save(work / "target", target, tokenizer), _save(work / "assistant", _noisy(target, 0.05, 1), tokenizer)


def t5_pair(work: Path) -> tuple[Path, Path]:
    from transformers import T5Config, T5ForConditionalGeneration
    (work / "target").mkdir(parents=True)
    (work / "assistant").mkdir(parents=True)
    tokenizer = t5_tokenizer(work / "target")
    shutil.copyfile(work / "target" / "spiece.model", work / "assistant" / "spiece.model")
    def config(width: int, layers: int) -> T5Config:
        return T5Config(vocab_size=len(tokenizer), d_model=width, d_ff=2 * width, d_kv=8, num_layers=layers,
                        num_heads=4, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=5.0,
                        feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    torch.manual_seed(0)
    target = T5ForConditionalGeneration(config(64, 2)).eval()
    torch.manual_seed(1)   # half the target's width, as flan-t5-small (512) is of flan-t5-large (1024)
    assistant = T5ForConditionalGeneration(config(32, 1)).eval()
    return _save(work / "target", target, tokenizer), _save(work / "assistant", assistant, tokenizer)


def opt_pair(work: Path) -> tuple[Path, Path]:
    from transformers import OPTConfig, OPTForCausalLM
    tokenizer = opt_tokenizer()
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=512, word_embed_proj_dim=32, pad_token_id=1,
                       bos_token_id=2, eos_token_id=2, init_std=0.2)
    torch.manual_seed(0)
    target = OPTForCausalLM(config).eval()
    return _save(work / "target", target, tokenizer), _save(work / "assistant", _noisy(target, 0.05, 1), tokenizer)


# repo ids exactly as models.yaml names them: (target, assistant) -> the stand-in builder
# (an assistant shared by two pairs is saved once, by the first)
HUB_PAIRS = {("openai/whisper-large-v3", "distil-whisper/distil-large-v3"): lambda w: whisper_pair(w, 128),
             ("openai/whisper-large-v2", "distil-whisper/distil-large-v2"): lambda w: whisper_pair(w, 80),
             ("openai/whisper-small.en", "distil-whisper/distil-small.en"): lambda w: whisper_pair(w, 80, True),
             # a Whisper model drafting with its own decoder: the one repository, loaded twice
             ("openai/whisper-small.en", "openai/whisper-small.en"): lambda w: whisper_pair(w, 80, True),
             ("openai/whisper-base", "openai/whisper-base"): lambda w: whisper_pair(w, 80),
             ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"): qwen_pair,
             ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"): lambda w: qwen_pair(w, hidden=64),
             ("google/flan-t5-large", "google/flan-t5-small"): t5_pair,
             ("facebook/opt-6.7b", "facebook/opt-125m"): opt_pair}


def build_hub_cache(cache: Path) -> Path:
    """Every hub pair's stand-ins in `cache` (made if missing), in the hub's layout; returns `cache`."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for n, ((target_id, assistant_id), build) in enumerate(HUB_PAIRS.items()):
            target, assistant = build(Path(tmp) / str(n))
            for repo_id, folder in ((target_id, target), (assistant_id, assistant)):
                if not (cache / f"models--{repo_id.replace('/', '--')}").exists():
                    add_to_cache(cache, repo_id, folder)
    return cache
