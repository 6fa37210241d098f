"""A greedy draft reads only the int8 head's first block (the vocabulary's most frequent ids) while the recent tokens
lie there; the target still verifies over its whole vocabulary, so the output stays the baseline's."""
import pytest
import torch

import helpers as tm
from assistgen.engine import drafting
from assistgen.engine.decoding import generate
from assistgen.engine.drafting import AssistantCandidates
from assistgen.engine.kv import CachedDecoder
from assistgen.engine.llama_decoder import LlamaDecoderStep
from assistgen.engine.sampling import Sampler
from assistgen.models import quantized

pytestmark = tm.CPU_ONLY   # fbgemm's int8 products

COMMON = 40   # the first block's rows, in place of 65,536: the 96-id head packs as 40 + 28 + 28


@pytest.fixture
def blocks(monkeypatch):
    monkeypatch.setattr(quantized, "PACK_ROWS", COMMON)


def _assistant(seed: int = 2, eos: int | None = None):
    return quantized.quantize(tm.qwen2(seed, init=0.2, eos=eos))


def test_the_first_block_is_the_first_ids_and_the_rest_about_equal(blocks):
    assert quantized.block_sizes(96) == [40, 28, 28] and quantized.block_sizes(81) == [40, 21, 20]
    assert quantized.block_sizes(40) == [40] and quantized.block_sizes(7) == [7]
    head = _assistant().lm_head
    x = torch.randn(3, head.in_features)
    assert head.first_rows == COMMON
    assert torch.equal(head.first_block(x), head(x)[:, :COMMON])
    qweight, qscale, _ = head.stored()
    later, scales, bias = head.later_rows
    assert torch.equal(later, qweight[COMMON:]) and torch.equal(scales, qscale[COMMON:].float()) and bias is None


def test_a_step_scores_the_common_ids_and_the_extra_ones_alone_and_a_target_never(blocks):
    assistant = _assistant()
    step = LlamaDecoderStep(assistant)
    assert step.common_vocab == COMMON
    step.logits([1, 5, 7], 0)
    full = step.logits([9], 3)
    assert torch.equal(step.logits([9], 3, extra_ids=()), full[:, :COMMON])   # the same pass, written over
    got = step.logits([9], 3, extra_ids=(41, 77, 95))
    assert got.shape == (1, COMMON + 3)
    assert torch.equal(got[:, :COMMON], full[:, :COMMON])
    # the extra rows' product is a float one, on the input before its 8-bit rounding: the same logits, nearly
    assert torch.allclose(got[:, COMMON:], full[:, [41, 77, 95]], atol=0.03)
    target = tm.w8a8_qwen2(0)
    assert target.lm_head.first_rows == tm.VOCAB and target.lm_head.later_rows is None   # nothing kept for drafts
    assert LlamaDecoderStep(target, row_invariant=True).common_vocab is None
    assert CachedDecoder(target, tm.decoder_inputs(0), prefix_length=8).common_vocab is None
    one_block = quantized.quantize(tm.qwen2(2, vocab=COMMON, init=0.2))
    assert LlamaDecoderStep(one_block).common_vocab is None   # nothing to leave out


def test_the_draft_vocabulary_is_the_sequences_ids_unless_the_answer_is_empty_or_just_used_a_new_one():
    prompt = [3, 70, 12, 95, 8]   # 95: a special token (from the first end id up)
    end = {90, 95}
    vocabulary = lambda tokens: drafting.draft_vocabulary(tokens, len(prompt), COMMON, end)
    assert vocabulary(prompt) is None   # the answer is empty
    assert vocabulary(prompt + [5, 70, 9]) == (70, 90, 95)   # 70 was in the prompt
    assert vocabulary(prompt + [5, 61, 9]) is None   # 61 is new: every id for a while
    later = prompt + [5, 61] + [9] * (drafting.NEW_ID_WINDOW - 1)
    assert vocabulary(later) is None and vocabulary(later + [9]) == (61, 70, 90, 95)
    assert vocabulary(prompt + [5, 92, 9]) == (70, 90, 92, 95)   # a special id is never new text


def _source(assistant, tokens, prompt_length, eos=frozenset()):
    decoder = CachedDecoder(assistant, {"input_ids": torch.tensor([tokens[:prompt_length]])},
                            prefix_length=prompt_length, assistant=True)
    source = AssistantCandidates(decoder, set(eos))
    widths = []
    logits = decoder.logits

    def spy(seq, keep=1, *, extra_ids=None):
        out = logits(seq, keep, extra_ids=extra_ids)
        widths.append(out.shape[-1])
        return out
    decoder.logits = spy
    return source, widths


def test_greedy_drafts_choose_among_the_draft_vocabulary_and_sampled_ones_among_every_id(blocks):
    assistant = _assistant()
    sequence = [3, 9, 14, 22, 7, 30, 11, 5] + [12, 6]   # a prompt of 8, then 2 answer tokens, all common
    source, widths = _source(assistant, sequence, 8)
    draft = source.get_candidates(sequence, 4, None)
    assert widths == [COMMON] * len(draft.tokens) and all(t < COMMON for t in draft.tokens)
    whole = CachedDecoder(assistant, {"input_ids": torch.tensor([sequence])}, prefix_length=8, assistant=True)
    assert draft.tokens[0] == int(whole.logits(sequence)[0, :COMMON].argmax())

    rare = [3, 9, 14, 22, 7, 30, 11, 80] + [12, 6]   # the prompt used 80: drafts may choose it
    source, widths = _source(assistant, rare, 8)
    draft = source.get_candidates(rare, 3, None)
    assert widths == [COMMON + 1] * len(draft.tokens)
    full = whole.logits(rare)[0]
    expected = int(torch.cat([full[:COMMON], full[[80]]]).argmax())
    assert draft.tokens[0] == (expected if expected < COMMON else 80)

    above = list(range(COMMON + 1, tm.VOCAB, 2))   # a prompt that used every other id above the block
    used = [3, 9, *above, 3, 20]
    source, widths = _source(assistant, used, len(used) - 2)
    draft = source.get_candidates(used, 1, None)
    whole = CachedDecoder(assistant, {"input_ids": torch.tensor([used])}, prefix_length=len(used), assistant=True)
    full = whole.logits(used)[0]
    allowed = [*range(COMMON), *above]
    assert widths == [len(allowed)] and draft.tokens[0] >= COMMON, "the test needs a draft above the block"
    assert draft.tokens[0] == allowed[int(full[allowed].argmax())]   # the id itself, not its place among the logits

    source, widths = _source(assistant, sequence[:8], 8)   # nothing answered yet: every id
    source.get_candidates(sequence[:8], 2, None)
    assert widths[0] == tm.VOCAB
    source, widths = _source(assistant, sequence, 8)   # sampled drafts keep the whole distribution
    source.get_candidates(sequence, 2, Sampler(1.0, seed=0))
    assert widths == [tm.VOCAB] * 2


def test_assisted_output_is_the_baseline_though_drafts_cannot_reach_every_id(blocks, monkeypatch):
    monkeypatch.setattr(drafting, "NEW_ID_WINDOW", 1)   # a random model's answers use new rarer ids all the time
    target, assistant = tm.w8a8_qwen2(0), _assistant(2)
    inputs = {"input_ids": torch.tensor([[3, 9, 14, 22, 7, 30, 11, 5]])}
    baseline = generate(target, inputs, max_new_tokens=40)
    chosen = []
    vocabulary = drafting.draft_vocabulary

    def recorded(*args):
        chosen.append(vocabulary(*args))
        return chosen[-1]
    monkeypatch.setattr(drafting, "draft_vocabulary", recorded)
    assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=40)
    assert assisted.new_tokens == baseline.new_tokens
    assert any(ids is not None for ids in chosen), "no draft chose among the draft vocabulary"
    assert any(t >= COMMON for t in baseline.new_tokens), "the test needs target tokens above the block"
