"""A prompt's shared beginning (`engine.prefix_cache`): read in a pass of its own, kept per model, and taken by the
next prompt that begins with it; what follows is the same bits whether it was kept or read now, and the assisted
run's output is the baseline's."""
import pytest
import torch

import helpers as tm
from assistgen.engine import prefix_cache
from assistgen.engine.decoding import generate, prepare
from assistgen.engine.kv import CachedDecoder, keep_shared_prefix
from assistgen.models import quantized

pytestmark = tm.CPU_ONLY

OPENING = [3, 17, 9, 41, 5, 22]   # a template's system turn and instruction, say
TEXTS = ([11, 30, 2, 19], [40, 12, 7], [27, 6, 14, 33, 8])


def _inputs(text: list[int], shared: int | None = len(OPENING)) -> dict:
    ids = torch.tensor([OPENING + text], device=tm.DEVICE)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return inputs if shared is None else {**inputs, prefix_cache.SHARED_PREFIX: shared}


def _fed(decoder: CachedDecoder) -> list[int]:
    """Spy on the lean step: the length of each run of tokens it is fed."""
    fed, step = [], decoder._step.logits
    decoder._step.logits = lambda new, start, keep=1, **kw: fed.append(len(new)) or step(new, start, keep, **kw)
    return fed


def _continued(model, text: list[int]) -> torch.Tensor:
    """Logits after the prompt and after each of four more tokens, one-token steps."""
    prompt = OPENING + text
    decoder = CachedDecoder(model, _inputs(text), prefix_length=len(prompt), shared_prefix=len(OPENING))
    rows = [decoder.logits(prompt)]
    for token in (13, 29, 4, 36):
        prompt = prompt + [token]
        rows.append(decoder.logits(prompt))
    return torch.cat(rows)


def test_a_kept_beginning_gives_what_follows_the_same_bits_as_one_read_now():
    kept, cold = tm.w8a8_qwen2(1, layers=3), tm.w8a8_qwen2(1, layers=3)   # the same weights, a cache each
    for text in TEXTS[:2]:
        _continued(kept, text)
    assert prefix_cache.prefix_cache(kept).hits == 1 and len(prefix_cache.prefix_cache(kept)) == 1
    assert torch.equal(_continued(kept, TEXTS[2]), _continued(cold, TEXTS[2]))
    assert prefix_cache.prefix_cache(kept).hits == 2 and prefix_cache.prefix_cache(cold).hits == 0


def test_a_prompt_reads_only_what_follows_a_kept_beginning():
    model = tm.w8a8_qwen2(2)
    first = CachedDecoder(model, _inputs(TEXTS[0]), prefix_length=10, shared_prefix=len(OPENING))
    fed = _fed(first)
    first.logits(OPENING + TEXTS[0])
    assert fed == [len(OPENING), len(TEXTS[0])]   # the beginning in a pass of its own, then the rest
    second = CachedDecoder(model, _inputs(TEXTS[1]), prefix_length=9, shared_prefix=len(OPENING))
    fed = _fed(second)
    second.logits(OPENING + TEXTS[1] + [8, 9], keep=3)   # the prompt, then two drafts in a pass of their own
    assert fed == [len(TEXTS[1]), 2] and second.passes == 1
    other = CachedDecoder(model, _inputs(TEXTS[1]), prefix_length=9, shared_prefix=len(OPENING))
    fed = _fed(other)
    other.logits([4] + OPENING[1:] + TEXTS[1])   # another beginning: read and kept beside the first
    assert fed == [len(OPENING), len(TEXTS[1])] and len(prefix_cache.prefix_cache(model)) == 2


@pytest.mark.parametrize("seed", range(3))
def test_assisted_greedy_output_equals_the_baseline_with_both_beginnings_kept(seed):
    target = tm.w8a8_qwen2(seed, layers=3)
    assistant = quantized.quantize(tm.qwen2(seed, layers=3, init=0.2))
    for text in TEXTS:
        baseline = generate(target, _inputs(text), max_new_tokens=30)
        assisted = generate(target, _inputs(text), assistant_model=assistant, max_new_tokens=30,
                            num_assistant_tokens=6)
        assert assisted.new_tokens == baseline.new_tokens and assisted.tokens_per_pass > 1.5
    # each model read the beginning once, before the first run's timed passes, and every prompt took it
    assert prefix_cache.prefix_cache(target).misses == 1 and prefix_cache.prefix_cache(target).hits == 6
    assert prefix_cache.prefix_cache(assistant).misses == 1 and prefix_cache.prefix_cache(assistant).hits == 3


def test_a_beginning_kept_ahead_of_the_runs_is_taken_by_each_of_them():
    """What a comparison does before its runs: the baseline pays no more for the beginning than the assisted run."""
    target = tm.w8a8_qwen2(6)
    keep_shared_prefix(target, _inputs(TEXTS[0]))
    keep_shared_prefix(target, _inputs(TEXTS[0]))   # there already: not read again
    assert prefix_cache.prefix_cache(target).misses == 1 and len(prefix_cache.prefix_cache(target)) == 1
    baseline = generate(target, _inputs(TEXTS[0]), max_new_tokens=5)
    assert baseline.prompt_tokens_kept == len(OPENING)
    assert generate(target, _inputs(TEXTS[0], shared=None), max_new_tokens=5).prompt_tokens_kept == 0


def test_a_model_run_through_transformers_modules_reads_its_whole_prompt():
    model = tm.qwen2(4, layers=2)   # a float target: transformers' own modules
    target = prepare(model, _inputs(TEXTS[0]), 10)
    assert target.decoder._step is None and target.decoder.shared_prefix == 0
    assert (generate(model, _inputs(TEXTS[0]), max_new_tokens=10).new_tokens
            == generate(model, _inputs(TEXTS[0], shared=None), max_new_tokens=10).new_tokens)
    assert len(prefix_cache.prefix_cache(model)) == 0


def test_a_prompt_no_longer_than_its_beginning_is_read_whole():
    model = tm.w8a8_qwen2(5)
    decoder = CachedDecoder(model, _inputs([]), prefix_length=len(OPENING), shared_prefix=len(OPENING))
    fed = _fed(decoder)
    decoder.logits(OPENING)
    assert fed == [len(OPENING)] and len(prefix_cache.prefix_cache(model)) == 0


def test_the_cache_keeps_the_most_recently_used_prefixes():
    cache = prefix_cache.PrefixCache(limit=2)
    for i in range(3):
        cache.put([i], [(torch.zeros(1), torch.zeros(1))])
        if i == 1:
            assert cache.get([0]) is not None   # used: kept over [1]
    assert cache.get([1]) is None and cache.get([0]) is not None and cache.get([2]) is not None
    assert len(cache) == 2


def test_the_shared_length_must_be_a_count():
    with pytest.raises(ValueError, match="non-negative int"):
        prefix_cache.shared_prefix_length({prefix_cache.SHARED_PREFIX: -1})
    assert prefix_cache.shared_prefix_length({}) == 0
