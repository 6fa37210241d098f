"""The default text pair's assistant run by llama.cpp instead of torch: the same Qwen2.5-Coder 0.5B, from the very
Q4_K_M file its int8 copy is converted from, drafting through llama-cpp-python for the same w8a8 target. Exactness
does not depend on the assistant (the target decides every token), so llama.cpp's numerics are allowed there; the
question is only whether its drafts arrive sooner.

    CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_OPENMP=OFF" pip install llama-cpp-python==0.3.36   # compiles llama.cpp
    .venv/bin/python -m bench.scripts.llamacpp_assistant [--half tuning] [--repeats 2]

Per code prompt and repeat, interleaved: the baseline, assisted generation with the pair's int8 assistant, and with
llama.cpp's; both assisted runs as the pair's default runs (assistant + prompt lookup, the adaptive schedule from
window 5, the payback gate), each carrying its own measured schedule and costs from one run to the next. Prints each
run and the medians: tokens/s, tokens per target pass, seconds drafting, milliseconds per assistant pass, and
whether the output is the baseline's. llama.cpp is built without OpenMP (its own thread pool), so that two OpenMP
runtimes do not spin against each other on a small machine. Run `python -m assistgen prepare` first. A benchmark:
it asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch

from assistgen.engine.decoding import generate, synchronized_clock
from assistgen.engine.drafting import AssistantCandidates, AssistantWithLookupCandidates, PaybackCosts, PaybackGate
from assistgen.engine.prefix_cache import shared_prefix_length
from assistgen.engine.schedules import AdaptiveSchedule
from assistgen.models.catalog import load_catalog
from assistgen.models.pool import ModelPool
from assistgen.tools.bench import HALVES, builtin_items, half, model_inputs
from assistgen.tools.peers import pack_files

PAIR = "qwen2.5-coder-1.5b-w8a8+0.5b-int8"
INPUTS = Path(__file__).resolve().parents[1] / "inputs"
CONFIGS = ("baseline", "int8 assistant (torch)", "Q4_K_M assistant (llama.cpp)")


class LlamaCppDecoder:
    """`kv.CachedDecoder`'s `logits` for a llama.cpp model: its KV cache cropped back to the prefix it shares with
    the sequence asked about, the rest fed in one `eval`, the last position's logits returned."""

    def __init__(self, llm):
        self.llm, self.passes, self._seen = llm, 0, []
        self.vocab = llm.n_vocab()

    def logits(self, tokens: list[int], keep: int = 1) -> torch.Tensor:
        assert keep == 1, "an assistant reads one position's logits"
        reuse = 0
        while reuse < min(len(self._seen), len(tokens) - 1) and self._seen[reuse] == tokens[reuse]:
            reuse += 1
        self.llm._ctx.kv_cache_seq_rm(-1, reuse, -1)
        self.llm.n_tokens = reuse
        self.llm.eval(tokens[reuse:])
        self._seen = list(tokens)
        self.passes += 1
        row = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.vocab,))
        return torch.from_numpy(row.copy()).unsqueeze(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=HALVES, default="tuning")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    import llama_cpp   # only this benchmark needs it

    catalog = load_catalog()
    pair = ModelPool(catalog).pair(PAIR)
    gguf = next(iter(pack_files(pair.spec.assistant, catalog, ("gguf",)).values()))
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=4096, n_batch=512, n_threads=torch.get_num_threads(),
                          n_threads_batch=torch.get_num_threads(), logits_all=False, verbose=False)
    eos = list(pair.target.eos_token_ids)
    clock = synchronized_clock(pair.target.model.device)
    costs = {name: PaybackCosts(1 / pair.parameter_ratio) for name in CONFIGS[1:]}
    measured: dict[str, AdaptiveSchedule | None] = {name: None for name in CONFIGS[1:]}
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    items = half(builtin_items("code", INPUTS), args.half)
    for repeat in range(args.repeats):
        for item in items:
            inputs = model_inputs(pair, item)
            baseline = None
            for name in CONFIGS:
                kwargs = {}
                if name != "baseline":
                    schedule = AdaptiveSchedule(pair.spec.num_assistant_tokens, measured=measured[name])
                    kwargs["num_assistant_tokens_schedule"] = schedule
                    if name.startswith("int8"):
                        kwargs.update(assistant_model=pair.assistant.model,
                                      prompt_lookup_num_tokens=pair.spec.num_assistant_tokens,
                                      assistant_payback=costs[name])
                    else:
                        source = AssistantCandidates(LlamaCppDecoder(llm), set(eos))
                        gate = PaybackGate(source.prefill, costs[name], args.max_new_tokens, clock,
                                           skipped=(shared_prefix_length(inputs), 0))   # llama.cpp reads it whole
                        kwargs["candidate_generator"] = AssistantWithLookupCandidates(source, set(eos), gate=gate)
                result = generate(pair.target.model, inputs, max_new_tokens=args.max_new_tokens, eos_token_id=eos,
                                  num_assistant_tokens=pair.spec.num_assistant_tokens, **kwargs)
                if name == "baseline":
                    baseline = result.new_tokens
                else:
                    measured[name] = schedule if schedule.costs.known else measured[name]
                drafting = sum(step.draft_s for step in result.steps)
                run = {"tokens_per_s": result.tokens_per_second, "tokens_per_pass": result.tokens_per_pass,
                       "drafting_s": drafting, "identical": result.new_tokens == baseline,
                       "ms_per_draft": 1000 * drafting / result.assistant_passes if result.assistant_passes else None}
                runs[name].append(run)
                print(f"{item.name} #{repeat + 1} {name}: {run['tokens_per_s']:.1f} tokens/s, "
                      f"{run['tokens_per_pass']:.2f} a pass, drafting {drafting:.2f} s, "
                      f"identical {run['identical']}", flush=True)
    print("\n| configuration | tokens/s (median, min–max) | tokens a pass | drafting s | ms per assistant pass "
          "| identical |")
    print("|---|---|---|---|---|---|")
    for name, rows in runs.items():
        rate = [r["tokens_per_s"] for r in rows]
        drafts = [r["ms_per_draft"] for r in rows if r["ms_per_draft"] is not None]
        per_draft = f"{statistics.median(drafts):.1f}" if drafts else "–"
        print(f"| {name} | {statistics.median(rate):.1f} ({min(rate):.1f}–{max(rate):.1f}) | "
              f"{statistics.median(r['tokens_per_pass'] for r in rows):.2f} | "
              f"{statistics.median(r['drafting_s'] for r in rows):.2f} | {per_draft} | "
              f"{sum(r['identical'] for r in rows)} of {len(rows)} |")


if __name__ == "__main__":
    main()
