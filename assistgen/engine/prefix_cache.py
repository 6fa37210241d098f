"""Keys and values of a prompt's shared beginning, kept for the next prompt that begins the same way.

Prompts built from a chat template and a task's instruction share their first tokens: the system turn, the user
turn's opening, "Translate the following text into French. ..." (on the Qwen2.5 pairs 24 tokens of a chat prompt,
37 of a translation prompt's 51-61, 36-37 of a summary prompt's 109-210). A caller that knows how many leading
tokens of a prompt are of that kind says so in its inputs (`SHARED_PREFIX`: `comparison.tasks.text_inputs` does);
each model then reads that beginning in a pass of its own once, keeps its keys and values here, and later prompts
that begin with the same tokens read only the rest.

The beginning is always read apart, cached or not: each of its positions' keys and values are then the same bits
whichever earlier prompt computed them, and a prompt's output does not depend on what was asked before it (a
row-invariant target's baseline and assisted runs make the very same passes; see `attention`). The rest of the
prompt is read in one pass of the fused kernel, as a prompt is.

llama.cpp's server keeps the longest prefix a slot shares with the last prompt in the same spirit (`cache_prompt`);
there the bits may differ with the split.

Only the Llama-style loop (`llama_decoder.LlamaDecoderStep`: an assistant, or a row-invariant w8a8 target, on a CPU)
keeps a prefix; a model run through transformers' own modules, or a CUDA graph's static cache, reads its whole prompt
each time. A model's kept prefixes are tied to the model object: one whose weights are changed in place
(`models.quantized.quantize`, at load only) must not have read a prompt before.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch

SHARED_PREFIX = "shared_prefix_length"   # the inputs' key: leading prompt tokens other prompts may share
MAX_PREFIXES = 8                         # prefixes kept a model (a task and language each), least recently used out

KeyValues = list[tuple[torch.Tensor, torch.Tensor]]   # per layer: keys and values, (1, kv_heads, tokens, head_dim)


class PrefixCache:
    """A model's kept prefixes: token ids to per-layer keys and values, at most `MAX_PREFIXES` of them."""

    def __init__(self, limit: int = MAX_PREFIXES):
        self.limit = limit
        self._kept: OrderedDict[tuple[int, ...], KeyValues] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, prefix: list[int]) -> KeyValues | None:
        with self._lock:
            key_values = self._kept.get(tuple(prefix))
            if key_values is None:
                self.misses += 1
                return None
            self._kept.move_to_end(tuple(prefix))
            self.hits += 1
            return key_values

    def put(self, prefix: list[int], key_values: KeyValues) -> None:
        with self._lock:
            self._kept[tuple(prefix)] = key_values
            self._kept.move_to_end(tuple(prefix))
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)

    def __contains__(self, prefix) -> bool:
        with self._lock:
            return tuple(prefix) in self._kept

    def __len__(self) -> int:
        return len(self._kept)


_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


def prefix_cache(model) -> PrefixCache:
    """`model`'s kept prefixes (made on first use, gone with the model)."""
    with _caches_lock:
        cache = _caches.get(model)
        if cache is None:
            cache = _caches[model] = PrefixCache()
        return cache


def shared_prefix_length(inputs: dict) -> int:
    """The inputs' shared prefix length (`SHARED_PREFIX`), 0 where they give none."""
    value = inputs.get(SHARED_PREFIX, 0)
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{SHARED_PREFIX} must be a non-negative int, got {value!r}")
    return value


def without_shared_prefix(inputs: dict) -> dict:
    """The inputs a model's own forward or generate takes: `SHARED_PREFIX` left out."""
    return {k: v for k, v in inputs.items() if k != SHARED_PREFIX}
