"""The static-cache decoder that a GPU replays as CUDA graphs computes what transformers' modules compute: on the CPU
its padded passes run eagerly (the same function the graphs capture); on a CUDA test device they replay graphs."""
import types

import pytest
import torch

import helpers as tm
from assistgen.engine import static_steps
from assistgen.engine.decoding import generate
from assistgen.engine.kv import CachedDecoder
from assistgen.engine.llama_decoder import LlamaDecoderStep
from assistgen.engine.static_steps import StaticCacheStep, StaticDecoder
from assistgen.models import quantized

FAMILIES = ["qwen2", "llama"]
PROMPT = [3, 17, 9, 41, 5, 22, 8]


def _model(family: str, seed: int = 3):
    return tm.llama(seed) if family == "llama" else tm.qwen2(seed)


def _reference(model) -> CachedDecoder:
    """The dynamic-cache decoder through transformers' modules (its path on the CPU, and a target's on any device
    before this module)."""
    decoder = CachedDecoder(model, tm.decoder_inputs(7), prefix_length=7)
    decoder._step = None
    return decoder


def _static(model, **kwargs) -> CachedDecoder:
    decoder = CachedDecoder(model, tm.decoder_inputs(7), prefix_length=7)
    decoder._step = StaticCacheStep(model, StaticDecoder(model, **kwargs))
    return decoder


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_token_steps_and_padded_verifications_match_the_dynamic_cache(family):
    model = _model(family)
    reference, static = _reference(model), _static(model)
    # (tokens, keep): the prompt, two one-token steps, a verification of 3 drafts (4 rows, no padding), one of 4
    # drafts after a rejection (6 rows fed, padded to 8), a single row after a full acceptance (2 rows fed, keep 1)
    calls = [(PROMPT, 1), (PROMPT + [11], 1), (PROMPT + [11, 30], 1), (PROMPT + [11, 30, 2, 19, 27, 6], 4),
             (PROMPT + [11, 30, 2, 40, 41, 42, 43, 44], 5), (PROMPT + [11, 30, 2, 40, 41, 42, 43, 44, 45, 46], 1)]
    for tokens, keep in calls:
        assert _close(static.logits(tokens, keep), reference.logits(tokens, keep)), (tokens, keep)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_rollback_gives_the_next_logits_of_a_fresh_decoder(family):
    model = _model(family)
    static = _static(model)
    static.logits(PROMPT)
    static.logits(PROMPT + [11, 30, 2, 19, 27], keep=5)      # drafts 30..27 verified; say 30 and 2 are kept
    kept = PROMPT + [11, 30, 2, 50]                           # then the target's own token: 19 and 27 are stale slots
    after_rollback = static.logits(kept + [51, 52], keep=3)
    fresh = _static(model)
    assert _close(after_rollback, fresh.logits(kept + [51, 52], keep=3))
    assert _close(after_rollback, _reference(model).logits(kept + [51, 52], keep=3))


def test_padding_rows_never_change_the_real_rows_or_the_buffers():
    model = tm.qwen2(4)
    outs, buffers = [], []
    for pad in (0, 77):
        decoder = StaticDecoder(model, capacity=32, graphs=tm.DEVICE.type == "cuda")
        decoder.pad_token = pad
        decoder.logits(PROMPT, 0)
        outs.append(decoder.logits([11, 30, 2], len(PROMPT), keep=3))   # 3 rows padded to 4
        buffers.append(torch.stack([k[:, :, :decoder.capacity] for k in decoder.keys]))
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(buffers[0], buffers[1])


def test_passes_longer_than_the_largest_row_count_run_unpadded_and_the_buffers_grow():
    model = tm.qwen2(5)
    reference = _reference(model)
    static = _static(model, capacity=8, rows=(1, 2, 4))
    tokens = [(7 * i) % tm.VOCAB for i in range(1, 21)]
    assert _close(static.logits(tokens[:12], keep=12), reference.logits(tokens[:12], keep=12))   # unpadded, grows
    assert static._step.decoder.capacity == 16
    assert _close(static.logits(tokens[:15], keep=3), reference.logits(tokens[:15], keep=3))    # 3 padded to 4
    assert _close(static.logits(tokens, keep=5), reference.logits(tokens, keep=5))              # grows to 32
    assert static._step.decoder.capacity == 32


def test_a_decoder_reads_its_prefix_again_after_another_wrote_the_shared_buffers():
    model = tm.qwen2(6)
    shared = StaticDecoder(model)
    probe, run = StaticCacheStep(model, shared), StaticCacheStep(model, shared)
    probe.logits(PROMPT[:4], 0)
    run.logits([50, 51, 52, 53, 54], 0)    # the buffers now hold another sequence
    again = probe.logits([11, 12], 4, keep=2)
    assert _close(again, _reference(model).logits(PROMPT[:4] + [11, 12], keep=2))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("window", [1, 4, 10])
def test_assisted_greedy_through_static_steps_matches_the_target_alone(family, window, monkeypatch):
    monkeypatch.setattr(static_steps, "use_static_steps", lambda model: static_steps.supports(model))
    target, assistant = _model(family, 7), tm.perturbed(_model(family, 7), 0.02, seed=8)
    inputs = tm.decoder_inputs(9)
    baseline = generate(target, inputs, max_new_tokens=24)
    assisted = generate(target, inputs, assistant_model=assistant, num_assistant_tokens=window,
                        num_assistant_tokens_schedule="constant", max_new_tokens=24)
    assert assisted.new_tokens == baseline.new_tokens
    assert assisted.target_passes < baseline.target_passes
    assert target in static_steps._shared and assistant in static_steps._shared   # both read through static steps
    monkeypatch.setattr(static_steps, "use_static_steps", lambda model: False)   # transformers' modules
    assert generate(target, inputs, max_new_tokens=24).new_tokens == baseline.new_tokens


def test_the_factory_picks_graphs_only_for_a_supported_model_on_cuda():
    model = tm.qwen2(0)
    on_cuda = lambda m: types.SimpleNamespace(config=m.config, model=getattr(m, "model", None),  # noqa: E731
                                              lm_head=getattr(m, "lm_head", None), device=torch.device("cuda", 0))
    assert static_steps.use_static_steps(on_cuda(model))
    assert static_steps.use_static_steps(on_cuda(tm.llama(0)))
    assert not static_steps.use_static_steps(on_cuda(tm.gpt2(0)))
    assert not static_steps.use_static_steps(on_cuda(tm.whisper(0)))
    if tm.DEVICE.type == "cpu":
        assert not static_steps.use_static_steps(model)
        assert static_steps.prepare_graphs(model) == []
        plain = CachedDecoder(model, tm.decoder_inputs(3), prefix_length=3)
        lean = CachedDecoder(model, tm.decoder_inputs(3), prefix_length=3, assistant=True)
        assert plain._step is None and isinstance(lean._step, LlamaDecoderStep)
        quantized.quantize(model)
        assert not static_steps.use_static_steps(on_cuda(model))   # int8 layers: the CPU's kernels
    else:
        assert isinstance(CachedDecoder(model, tm.decoder_inputs(3), prefix_length=3)._step, StaticCacheStep)


@pytest.mark.skipif(tm.DEVICE.type != "cuda", reason="CUDA graphs need a CUDA device")
def test_graphs_captured_at_warm_up_replay_the_eager_passes():
    model = tm.qwen2(9)
    assert static_steps.prepare_graphs(model) == sorted(static_steps.ROWS, reverse=True)
    assert tuple(sorted(static_steps.shared(model).graphs.captured)) == static_steps.ROWS
    assert static_steps.prepare_graphs(model) == []
    eager = _static(model, graphs=False)
    replayed = CachedDecoder(model, tm.decoder_inputs(7), prefix_length=7)
    for tokens, keep in [(PROMPT, 1), (PROMPT + [11], 1), (PROMPT + [11, 30, 2], 3), (PROMPT + [11, 40, 41], 2)]:
        assert _close(replayed.logits(tokens, keep), eager.logits(tokens, keep))


def test_a_model_whose_weights_moved_gets_a_new_static_decoder():
    """A graph reads the weights where they were at its capture: moved (`model.to`, ZeroGPU), they need new ones."""
    model = tm.qwen2(10)
    first = static_steps.shared(model)
    assert static_steps.shared(model) is first
    with torch.no_grad():
        model.lm_head.weight.data = model.lm_head.weight.data.clone()
    moved = static_steps.shared(model)
    assert moved is not first and static_steps.shared(model) is moved
    assert _close(StaticCacheStep(model).logits(PROMPT, 0, keep=2), _reference(model).logits(PROMPT, keep=2))


def test_the_replay_layer_copies_each_pass_in_and_its_logits_out():
    """Graphs stood in for by their eager pass over the same static tensors: what `logits` does around a replay."""
    model = tm.qwen2(11)
    decoder = StaticDecoder(model, graphs=False)

    class EagerGraphs(static_steps.CapturedPasses):
        def capture(self, rows: int):
            inputs = self.padding(rows).to(self.device)
            logits = torch.empty(rows, tm.VOCAB, device=self.device)
            graph = types.SimpleNamespace(replay=lambda: logits.copy_(self.run(inputs)))
            self.captured[rows] = static_steps._Captured(graph, inputs, logits)
            return self.captured[rows]
    decoder.graphs = EagerGraphs(decoder._padded, decoder._padding, decoder.device)
    replayed, reference = _static(model), _reference(model)
    replayed._step = StaticCacheStep(model, decoder)
    first = replayed.logits(PROMPT + [11, 30, 2], keep=3)    # the prompt and 2 drafts: 10 rows in the 16-row graph
    kept = first.clone()
    for tokens, keep in [(PROMPT + [11, 30, 40], 2), (PROMPT + [11, 30, 40, 41], 1)]:
        assert _close(replayed.logits(tokens, keep), reference.logits(tokens, keep))
    assert torch.equal(first, kept)   # not the graph's output, which later replays write over
    assert sorted(decoder.graphs.captured) == [1, 2, 16]
