"""From a user's text to model inputs, per task and prompt style; and from tokens back to text (speech inputs:
`speech`)."""
from __future__ import annotations

from ..choices import MAX_INPUT_TOKENS
from ..engine.decoding import max_positions
from ..engine.kv import common_prefix
from ..engine.prefix_cache import SHARED_PREFIX
from ..models.loading import LoadedPair

LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch", "Chinese", "Japanese", "Russian",
             "English")
SAMPLE_RATE = 16_000


class InputError(ValueError):
    """The user's input cannot be used; the message says what to change."""


def _instruction(task: str, text: str, target_language: str) -> str:
    if task == "translation":
        return f"Translate the following text into {target_language}. Reply with the translation only.\n\n{text}"
    if task == "summarization":
        return f"Summarize the following text in two or three sentences.\n\n{text}"
    return text


def check_text(text, max_input_tokens: int) -> None:
    """What can be said of a text before any model is loaded: it is there, encodable, and not far over the input
    token budget (no tokenizer pass over megabytes of text)."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("the text is empty: type or paste something first")
    if len(text) > 8 * max_input_tokens:
        raise InputError(f"the text is {len(text):,} characters, far over the {max_input_tokens:,}-token input limit; "
                         "shorten it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:   # a lone surrogate, from text cut in the middle of a character
        raise InputError(f"the text holds a broken character at position {exc.start}: paste it again, or retype "
                         "that part") from None


def text_inputs(pair: LoadedPair, task: str, text: str, *, target_language: str = "French",
                max_input_tokens: int = MAX_INPUT_TOKENS) -> dict:
    """Tokenized prompt for chat, translation or summarization, within the input token budget."""
    if task not in pair.spec.tasks:
        raise InputError(f"pair {pair.spec.name!r} does not do {task}; it does {', '.join(pair.spec.tasks)}")
    check_text(text, max_input_tokens)
    if task == "translation" and target_language not in LANGUAGES:
        raise InputError(f"unknown target language {target_language!r}; choose from {', '.join(LANGUAGES)}")
    tokenizer = pair.target.tokenizer
    style = pair.spec.prompt_style
    shared = 0
    if style == "chat_template":
        def rendered(content: str):
            messages = [{"role": "user", "content": _instruction(task, content, target_language)}]
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True,
                                                 return_tensors="pt")
        inputs = rendered(text.strip())
        shared = _shared_prefix(inputs["input_ids"][0].tolist(), rendered("A")["input_ids"][0].tolist(),
                                rendered("B")["input_ids"][0].tolist())
    elif style == "instruction":
        prefix = {"translation": f"translate English to {target_language}: ", "summarization": "summarize: "}
        inputs = tokenizer(prefix.get(task, "") + text.strip(), return_tensors="pt")
    else:
        inputs = tokenizer(text, return_tensors="pt")
    n = inputs["input_ids"].shape[1]
    if n > max_input_tokens:
        raise InputError(f"the text is {n:,} tokens; the limit is {max_input_tokens:,}: shorten it")
    # a decoder-only model reads prompt and answer in one sequence; an encoder-decoder one reads the text apart
    positions = None if pair.target.model.config.is_encoder_decoder else max_positions(pair.target.model)
    if positions is not None and n >= positions:   # no room left for a single new token
        raise InputError(f"the text is {n:,} tokens; {pair.target.spec.name} reads at most {positions:,} positions, "
                         "its answer included: shorten it")
    return {**{k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}, SHARED_PREFIX: shared}


def _shared_prefix(prompt: list[int], one: list[int], other: list[int]) -> int:
    """How many of `prompt`'s first tokens come from the template and the instruction, not from the text: what the
    prompt shares with the same template around a one-letter text (`one`), up to where two such texts part."""
    return min(common_prefix(prompt, one), common_prefix(one, other), len(prompt) - 1)


def decode(pair: LoadedPair, tokens: list[int]) -> str:
    return pair.target.tokenizer.decode(tokens, skip_special_tokens=True).strip()


class Detokenizer:
    """Text of each token as it arrives, such that "".join(pieces) reads as the decoded text (token-by-token views).

    Each new token costs one decode of the sequence so far.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokens: list[int] = []
        self.pieces: list[str] = []
        self._text = ""

    def feed(self, tokens: list[int]) -> list[str]:
        for token in tokens:
            self.tokens.append(token)
            text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
            self.pieces.append(text[len(self._text):] if text.startswith(self._text) else text)
            self._text = text
        return self.pieces

