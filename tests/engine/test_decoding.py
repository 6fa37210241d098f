"""The engine's contract: assisted greedy output is the target's greedy output, token for token."""
import copy
import functools

import pytest
import torch
from transformers import GenerationMixin

import helpers as tm
from assistgen import generate
from assistgen.engine.drafting import Draft

FAMILIES = {
    "qwen2": (tm.qwen2, tm.decoder_inputs),
    "gpt2": (tm.gpt2, tm.decoder_inputs),
    "t5": (tm.t5, tm.decoder_inputs),
    "whisper": (tm.whisper, tm.whisper_inputs),
}


def transformers_greedy(model, inputs, max_new_tokens):
    """Reference: transformers' own greedy generate (the generic one for Whisper, whose override adds its pipeline)."""
    gen = GenerationMixin.generate if model.config.model_type == "whisper" else type(model).generate
    out = gen(model, **inputs, do_sample=False, max_new_tokens=max_new_tokens, num_beams=1)
    if model.config.is_encoder_decoder:
        prefix = inputs["decoder_input_ids"].shape[1] if "decoder_input_ids" in inputs else 1
    else:
        prefix = inputs["input_ids"].shape[1]
    return out[0, prefix:].tolist()


def make_pair(family, assistant_kind, seed=0, eos=None):
    build, make_inputs = FAMILIES[family]
    target = build(seed, eos=eos)
    assistant = {
        "random": lambda: build(seed + 100, layers=1, eos=eos),
        "self": lambda: target,
        "perturbed": lambda: tm.perturbed(target, 0.5, seed + 7),
    }[assistant_kind]()
    return target, assistant, make_inputs(seed)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("assistant_kind", ["random", "self", "perturbed"])
@pytest.mark.parametrize("window,schedule", [(1, "constant"), (5, "heuristic"), (16, "constant")])
def test_assisted_greedy_matches_baseline_and_transformers(family, assistant_kind, window, schedule):
    target, assistant, inputs = make_pair(family, assistant_kind)
    reference = transformers_greedy(target, inputs, 24)
    baseline = generate(target, inputs, max_new_tokens=24)
    assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=24,
                        num_assistant_tokens=window, num_assistant_tokens_schedule=schedule)
    assert len(reference) == 24
    assert baseline.new_tokens == reference
    assert assisted.new_tokens == reference
    if assistant_kind == "self":
        assert assisted.acceptance_rate == 1.0
        assert assisted.target_passes < baseline.target_passes


def test_random_assistant_is_mostly_rejected_and_self_assistant_always_accepted():
    target, random_assistant, inputs = make_pair("qwen2", "random")
    rejected = generate(target, inputs, assistant_model=random_assistant, max_new_tokens=32)
    accepted = generate(target, inputs, assistant_model=target, max_new_tokens=32)
    assert rejected.acceptance_rate < 0.5
    assert accepted.acceptance_rate == 1.0
    assert rejected.new_tokens == accepted.new_tokens


def test_baseline_is_one_step_per_token():
    target, _, inputs = make_pair("qwen2", "self")
    result = generate(target, inputs, max_new_tokens=10)
    assert result.target_passes == len(result.steps) == 10
    assert all(step.candidates == [] and len(step.emitted) == 1 for step in result.steps)
    assert result.assistant_passes == 0 and result.acceptance_rate is None and result.tokens_per_pass == 1.0


class Oracle:
    """Proposes a known continuation, whatever follows: drafts that run past an EOS."""
    passes = 0

    def __init__(self, prefix, continuation):
        self.prefix, self.continuation = prefix, continuation

    def update(self, emitted, draft_s, verify_s):
        pass

    def get_candidates(self, tokens, num_candidates, sampler, keep_drafting=None):
        done = len(tokens) - self.prefix
        return Draft(self.continuation[done:done + num_candidates])


def _eos_case(family):
    """A target whose greedy output reaches a fresh token at position >= 2; that token becomes its EOS."""
    build, make_inputs = FAMILIES[family]
    inputs = make_inputs(3)
    free_run = generate(build(3), inputs, max_new_tokens=30).new_tokens
    position = next(i for i in range(2, 30) if free_run[i] not in free_run[:i])
    return build(3, eos=free_run[position]), inputs, free_run, position


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_ends_generation_inside_an_assistant_draft(family):
    target, inputs, free_run, position = _eos_case(family)
    reference = transformers_greedy(target, inputs, 30)
    assisted = generate(target, inputs, assistant_model=target, max_new_tokens=30, num_assistant_tokens=12,
                        num_assistant_tokens_schedule="constant")
    assert assisted.new_tokens == reference == free_run[:position + 1]
    assert assisted.stop_reason == "eos"
    last = assisted.steps[-1]
    # The assistant stops drafting at EOS, well inside its window of 12; the target accepted it.
    assert last.candidates[-1] == free_run[position] and len(last.candidates) < 12
    assert last.accepted == len(last.emitted)


@pytest.mark.parametrize("family", FAMILIES)
def test_eos_in_the_middle_of_accepted_candidates_drops_the_rest(family):
    target, inputs, free_run, position = _eos_case(family)
    prefix = len(inputs["decoder_input_ids"][0]) if "decoder_input_ids" in inputs else (
        1 if target.config.is_encoder_decoder else inputs["input_ids"].shape[1])
    oracle = Oracle(prefix, free_run)
    result = generate(target, inputs, candidate_generator=oracle, max_new_tokens=30, num_assistant_tokens=12,
                      num_assistant_tokens_schedule="constant")
    assert result.new_tokens == free_run[:position + 1]
    assert result.stop_reason == "eos"
    last = result.steps[-1]
    assert len(last.candidates) > len(last.emitted)  # candidates beyond the EOS were proposed and dropped
    assert last.accepted == len(last.emitted)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 13])
def test_max_new_tokens_landing_inside_a_draft_is_exact(max_new_tokens):
    target, _, inputs = make_pair("qwen2", "self")
    baseline = generate(target, inputs, max_new_tokens=max_new_tokens)
    assisted = generate(target, inputs, assistant_model=target, max_new_tokens=max_new_tokens,
                        num_assistant_tokens=10, num_assistant_tokens_schedule="constant")
    assert len(assisted.new_tokens) == max_new_tokens
    assert assisted.new_tokens == baseline.new_tokens
    # The window is cut so that drafts never run past the budget.
    produced = 0
    for step in assisted.steps:
        assert len(step.candidates) <= max_new_tokens - produced - 1
        produced += len(step.emitted)


def test_heuristic_window_follows_plus_two_minus_one():
    target, assistant, inputs = make_pair("qwen2", "perturbed")
    result = generate(target, inputs, assistant_model=assistant, max_new_tokens=120, num_assistant_tokens=5)
    assert result.steps[0].window == 5
    seen_both = set()
    for step, following in zip(result.steps, result.steps[1:]):
        all_accepted = step.accepted == len(step.candidates)
        seen_both.add(all_accepted)
        expected = step.window + 2 if all_accepted else max(1, step.window - 1)
        assert following.window == expected
    assert seen_both == {True, False}, "the pair should both fully accept and reject some windows"


def test_constant_window_stays_fixed():
    target, assistant, inputs = make_pair("qwen2", "perturbed")
    result = generate(target, inputs, assistant_model=assistant, max_new_tokens=60, num_assistant_tokens=4,
                      num_assistant_tokens_schedule="constant")
    assert {step.window for step in result.steps} == {4}


@pytest.mark.parametrize("family", FAMILIES)
def test_bookkeeping_adds_up(family):
    target, assistant, inputs = make_pair(family, "perturbed")
    seen = []
    result = generate(target, inputs, assistant_model=assistant, max_new_tokens=40, on_step=seen.append)
    assert seen == result.steps
    assert [t for step in result.steps for t in step.emitted] == result.new_tokens
    assert result.target_passes == len(result.steps)
    # One assistant pass per candidate drafted.
    assert result.assistant_passes == sum(len(step.candidates) for step in result.steps)
    for step in result.steps:
        assert step.emitted[:step.accepted] == step.candidates[:step.accepted]
        assert len(step.emitted) == step.accepted + 1
    drafted = sum(len(s.candidates) for s in result.steps)
    assert result.acceptance_rate == pytest.approx(sum(s.accepted for s in result.steps) / drafted)
    assert result.tokens_per_pass == pytest.approx(40 / result.target_passes)


def test_decoder_only_whisper_assistant_shares_the_target_encoder():
    target = tm.whisper(0)
    inputs = tm.whisper_inputs(0)
    assistant = tm.whisper_decoder_only(1)
    reference = transformers_greedy(target, inputs, 20)
    assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=20)
    assert assisted.new_tokens == reference
    assert assisted.assistant_passes > 0


def _encoder_runs(model) -> list:
    """Count the calls of a model's encoder."""
    calls, encoder = [], model.get_encoder()
    encoder.forward = functools.wraps(encoder.forward)(
        lambda *args, forward=encoder.forward, **kwargs: calls.append(1) or forward(*args, **kwargs))
    return calls


@pytest.mark.parametrize("family,inputs", [("t5", tm.decoder_inputs), ("whisper", tm.whisper_inputs)])
def test_a_narrower_encoder_decoder_assistant_runs_its_own_encoder_and_keeps_greedy_output(family, inputs):
    # the widths of flan-t5-large (1024) and flan-t5-small (512), or of two Whisper sizes of one vocabulary
    build = getattr(tm, family)
    target, assistant, inputs = build(0, width=64), build(1, layers=1, width=32), inputs(0)
    calls = _encoder_runs(assistant)
    reference = transformers_greedy(target, inputs, 20)
    assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=20)
    assert assisted.new_tokens == reference
    assert assisted.assistant_passes > 0 and len(calls) == 1


@pytest.mark.parametrize("family", ["t5", "whisper"])
def test_an_assistant_reads_the_targets_encoder_output_only_if_its_encoder_has_the_same_weights(family):
    target, _, inputs = make_pair(family, "self")
    same = copy.deepcopy(target)   # the target's encoder, a perturbed decoder (T5's embeddings are the encoder's too)
    same.get_decoder().load_state_dict({name: weight for name, weight in tm.perturbed(target, 0.5, 3).get_decoder(
    ).state_dict().items() if "embed_tokens" not in name}, strict=False)
    other = copy.deepcopy(same)                               # one encoder weight differs
    with torch.no_grad():
        next(other.get_encoder().parameters()).view(-1)[0] += 1.0
    reference = transformers_greedy(target, inputs, 16)
    for assistant, runs in ((target, 0), (same, 0), (other, 1)):
        calls = _encoder_runs(assistant) if assistant is not target else []
        assisted = generate(target, inputs, assistant_model=assistant, max_new_tokens=16)
        assert assisted.new_tokens == reference
        assert len(calls) == runs


def test_suppressed_tokens_are_never_generated_and_match_transformers():
    target = tm.whisper(4)
    inputs = tm.whisper_inputs(4)
    free = generate(target, inputs, max_new_tokens=20).new_tokens
    target.generation_config.suppress_tokens = free[1:4]
    target.generation_config.begin_suppress_tokens = [free[0]]
    reference = transformers_greedy(target, inputs, 20)
    assisted = generate(target, inputs, assistant_model=target, max_new_tokens=20)
    assert assisted.new_tokens == reference
    assert not set(free[1:4]) & set(assisted.new_tokens)
    assert assisted.new_tokens[0] != free[0]


def test_prompt_lookup_drafts_come_from_the_context_and_keep_greedy_output():
    target = tm.qwen2(5)
    phrase = torch.randint(3, tm.VOCAB, (12,), generator=torch.Generator().manual_seed(5))
    ids = torch.cat([phrase, phrase, phrase[:4]]).unsqueeze(0)  # a repetitive prompt, as in code editing
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    baseline = generate(target, inputs, max_new_tokens=40)
    lookup = generate(target, inputs, prompt_lookup_num_tokens=6, max_new_tokens=40)
    assert lookup.new_tokens == baseline.new_tokens
    assert lookup.assistant_passes == 0
    context = ids[0].tolist()
    drafted_any = False
    for step in lookup.steps:
        if step.candidates:
            drafted_any = True
            n = len(step.candidates)
            assert any(context[i:i + n] == step.candidates for i in range(len(context) - n + 1))
        context += step.emitted
    assert drafted_any


@pytest.mark.parametrize("kwargs,message", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"num_assistant_tokens_schedule": "sometimes"}, "num_assistant_tokens_schedule"),
    ({"num_assistant_tokens": 0}, "num_assistant_tokens"),
    ({"candidate_generator": object()}, "pass candidate_generator alone"),
    ({"do_sample": True, "temperature": 0.0}, "temperature"),
    ({"do_sample": True, "top_p": 0.0}, "top_p"),
])
def test_rejects_bad_arguments_with_a_clear_message(kwargs, message):
    target, assistant, inputs = make_pair("qwen2", "self")
    with pytest.raises(ValueError, match=message):
        generate(target, inputs, assistant_model=assistant, **kwargs)


def test_rejects_a_batch_of_two():
    target = tm.qwen2(0)
    ids = torch.tensor([[4, 5, 6], [7, 8, 9]])
    with pytest.raises(ValueError, match="batch size must be 1"):
        generate(target, {"input_ids": ids})


def test_max_time_returns_partial_output():
    target, _, inputs = make_pair("qwen2", "self")
    result = generate(target, inputs, max_new_tokens=200, max_time_s=0.0)
    assert result.stop_reason == "max_time"
    assert 1 <= len(result.new_tokens) < 200


def _text_prompt(tokenizer, text="def fibonacci(n):\n    return"):
    ids = tokenizer(text, return_tensors="pt")
    return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"]}


def test_different_tokenizer_assistant_keeps_greedy_output():
    from helpers import permuted_tokenizer, text_tokenizer
    tokenizer = text_tokenizer()
    other, _ = permuted_tokenizer(tokenizer, seed=3)
    target = tm.qwen2(0, vocab=320, init=0.2)
    assistant = tm.qwen2(1, vocab=320, layers=1, init=0.2)
    inputs = _text_prompt(tokenizer)
    baseline = generate(target, inputs, max_new_tokens=30)
    assisted = generate(target, inputs, assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=other,
                        max_new_tokens=30)
    assert assisted.new_tokens == baseline.new_tokens == transformers_greedy(target, inputs, 30)
    assert assisted.assistant_passes > 0


def test_different_tokenizer_assistant_that_knows_the_text_is_accepted():
    """An assistant computing the same function of text as the target, through a shuffled vocabulary: its drafts,
    re-tokenized, are exactly what the target writes. Byte tokens and printable ASCII keep the round trip exact."""
    from helpers import byte_tokenizer, non_ascii_ids, permuted_model, permuted_tokenizer
    tokenizer = byte_tokenizer()
    other, perm = permuted_tokenizer(tokenizer, seed=3)
    target = tm.qwen2(0, vocab=len(tokenizer), init=0.2)
    target.generation_config.suppress_tokens = non_ascii_ids(tokenizer)
    assistant = permuted_model(target, perm)
    assistant.generation_config.suppress_tokens = non_ascii_ids(other)
    inputs = _text_prompt(tokenizer)
    baseline = generate(target, inputs, max_new_tokens=40)
    assisted = generate(target, inputs, assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=other,
                        max_new_tokens=40)
    assert assisted.new_tokens == baseline.new_tokens
    assert assisted.acceptance_rate == 1.0
    assert assisted.tokens_per_pass > 3


def test_different_tokenizer_whisper_assistant_runs_its_own_encoder_once():
    from helpers import whisper_tokenizer
    tokenizer = whisper_tokenizer()
    vocab = len(tokenizer)
    target = tm.whisper(0)
    target.resize_token_embeddings(vocab)
    assistant = tm.whisper(1, layers=1)
    assistant.resize_token_embeddings(vocab)
    sot, en, transcribe, nots = tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])
    inputs = {"input_features": tm.whisper_inputs(0)["input_features"], "decoder_input_ids": torch.tensor([[sot, en,
                                                                                                     transcribe, nots]])}
    baseline = generate(target, inputs, max_new_tokens=20)
    runs = {"target": 0, "assistant": 0}
    # every encoder pass goes through its first convolution, whether the encoder's forward or a clip's layers run it
    for name, model in (("target", target), ("assistant", assistant)):
        model.get_encoder().conv1.register_forward_hook(lambda *_, name=name: runs.__setitem__(name, runs[name] + 1))
    assisted = generate(target, inputs, assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=tokenizer,
                        max_new_tokens=20)
    assert assisted.new_tokens == baseline.new_tokens
    assert assisted.assistant_passes > 1 and assisted.target_passes > 1   # several drafting steps read the encoders
    assert runs == {"target": 1, "assistant": 1}


def test_the_assistants_clip_encoder_is_whispers_own_over_the_whole_window_and_shorter_over_a_clip():
    from assistgen.engine.whisper_decoder import clip_encoder_outputs
    model = tm.whisper(2)
    features = tm.whisper_inputs(2)["input_features"]   # 32 frames: the tiny model's whole window
    with torch.inference_mode():
        whole = model.get_encoder()(features).last_hidden_state
        same = clip_encoder_outputs(model, features, frames=32, margin_s=0.0).last_hidden_state
        clip = clip_encoder_outputs(model, features, frames=9, margin_s=0.04).last_hidden_state
    assert torch.allclose(same, whole, atol=1e-6)
    assert clip.shape[1] == 7   # 9 frames + 4 of margin, made even, halved by the second convolution


def test_a_whisper_assistant_reading_only_the_clip_keeps_the_transcript(monkeypatch):
    from assistgen.engine import whisper_decoder
    from helpers import whisper_tokenizer
    tokenizer = whisper_tokenizer()
    target = tm.whisper(0)
    target.resize_token_embeddings(len(tokenizer))
    assistant = tm.whisper(1, layers=1)
    assistant.resize_token_embeddings(len(tokenizer))
    frames = torch.zeros(1, 32, dtype=torch.long)
    frames[:, :12] = 1   # the clip's own frames; the rest is padding
    inputs = {**tm.whisper_inputs(0), "attention_mask": frames}
    inputs["decoder_input_ids"] = torch.tensor([tokenizer.convert_tokens_to_ids(
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"])])
    seen = []
    original = whisper_decoder.clip_encoder_outputs
    monkeypatch.setattr(whisper_decoder, "clip_encoder_outputs",
                        lambda *a, **k: seen.append(a[2]) or original(*a, **k))
    baseline = generate(target, inputs, max_new_tokens=20)
    assisted = generate(target, inputs, assistant_model=assistant, tokenizer=tokenizer, assistant_tokenizer=tokenizer,
                        max_new_tokens=20, assistant_audio_margin_s=0.02)
    assert seen == [12] and assisted.assistant_passes > 0
    assert assisted.new_tokens == baseline.new_tokens


def test_assistant_with_lookup_drafts_from_the_context_where_it_repeats_and_keeps_greedy_output():
    target = tm.qwen2(5)
    assistant = tm.qwen2(6, layers=1)     # a poor assistant: the lookup drafts are the ones that get accepted
    phrase = torch.randint(3, tm.VOCAB, (12,), generator=torch.Generator().manual_seed(5))
    ids = torch.cat([phrase, phrase, phrase[:4]]).unsqueeze(0)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    baseline = generate(target, inputs, max_new_tokens=40)
    both = generate(target, inputs, assistant_model=assistant, prompt_lookup_num_tokens=6, max_new_tokens=40)
    alone = generate(target, inputs, assistant_model=assistant, max_new_tokens=40)
    assert both.new_tokens == alone.new_tokens == baseline.new_tokens
    drafted = sum(len(s.candidates) + s.withheld for s in both.steps)
    assert both.assistant_passes < drafted      # some drafts cost no assistant pass: they came from the context
    assert both.target_passes < alone.target_passes
