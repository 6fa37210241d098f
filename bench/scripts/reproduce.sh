#!/usr/bin/env bash
# Every current claim of docs/results.md, from the repository root after the README's install command.
# Each bench command loads its pairs and writes results.json, results.md and plots under $OUT/<name>/.
# About 3 hours on 2 vCPUs. Nothing else should run meanwhile: the timings are wall-clock.
set -euo pipefail
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
bench() { name=$1; shift; $PY -m assistgen bench --out "$OUT/$name" "$@"; }
DEFAULT=qwen2.5-coder-1.5b-w8a8+0.5b-int8
TEXT=qwen2.5-coder-1.5b+0.5b-int8   # the same assistant for the float32 target
SPEECH=whisper-base+decoder-int8

# The defaults: chosen on each set's tuning half (its 1st, 3rd, 5th... items), every suite counting once
TEXT_SETS="--suite code --suite chat --suite context --suite translation --suite summarization"
SPEECH_SETS="--suite speech-real --suite speech --suite speech-other"
bench tuning-text --pair $DEFAULT $TEXT_SETS --half tuning --draft-sources assistant,assistant_lookup,prompt_lookup \
    --schedules adaptive,heuristic
bench tuning-text-windows --pair $DEFAULT $TEXT_SETS --half tuning --draft-sources assistant_lookup \
    --schedules adaptive --num-assistant-tokens 3,5,8 --no-floor
bench tuning-text-windows/repeats-2 --pair $DEFAULT $TEXT_SETS --half tuning --draft-sources assistant_lookup \
    --schedules adaptive --num-assistant-tokens 5,8 --repeats 2 --no-floor
bench tuning-speech --pair $SPEECH $SPEECH_SETS --half tuning --schedules adaptive,heuristic \
    --num-assistant-tokens 3,5,8 --no-floor

# The results table of the README: the default pairs at their defaults on each set's held-out half (2nd, 4th...
# items), with the peers on the same weights
# (pip install -r requirements-peers.txt; bash bench/scripts/build_llama_server.sh; export ASSISTGEN_LLAMA_SERVER=...)
bench held-out-text --pair $DEFAULT $TEXT_SETS --half held-out --peer llama.cpp --repeats 2
bench held-out-speech --pair $SPEECH $SPEECH_SETS --half held-out --peer faster-whisper --repeats 3
bench held-out-speech/every-real-clip --pair $SPEECH --suite speech-real --peer faster-whisper --no-floor --repeats 3

# The same pairs on every item of the sets, the day before the split (docs/results.md)
bench peers-code-w8a8 --pair $DEFAULT --suite code --peer llama.cpp --repeats 2
bench tasks-w8a8 --pair $DEFAULT --suite chat --suite translation --suite summarization --no-floor
bench long-context-w8a8 --pair $DEFAULT --suite long-context --peer --repeats 2 --no-floor
bench peers-speech --pair $SPEECH --suite speech-real --peer faster-whisper

# The float32 target, the same day (docs/results.md)
bench peers-code --pair $TEXT --suite code --peer llama.cpp
bench task-dependence --pair $TEXT --suite chat --suite translation --suite summarization --no-floor
bench long-context --pair $TEXT --suite long-context --peer --repeats 2 --no-floor
$PY -m assistgen sweep --pair $TEXT --task chat --text "Write a Python function that checks whether a number is prime." \
    --over temperature --values 0,0.5,1.0 --repeats 2 --max-new-tokens 64 --out "$OUT/explore-temperature"

# Earlier figures of the same pairs (docs/results.md, below the current ones)
bench qwen-int8-carried-costs --pair $TEXT --suite code --suite translation --max-new-tokens 128
bench qwen-int8-tasks-per-row --pair $TEXT --suite summarization --suite translation --suite code --suite chat \
    --suite context --max-new-tokens 128 --peer
bench qwen-int8-tasks-per-row/second-run --pair $TEXT --suite summarization --suite translation --max-new-tokens 128 \
    --peer
bench whisper-bf16-speech-real --pair $SPEECH --suite speech-real --repeats 3
bench whisper-bf16-speech-long --pair $SPEECH --suite speech-long --repeats 3
# One fresh process per clip, as a CLI user meets it
mkdir -p "$OUT/whisper-bf16-cli"
for round in 1 2; do
  for clip in bench/inputs/speech-real/*.flac; do
    $PY -m assistgen compare --pair $SPEECH --task speech-recognition --audio "$clip" --json \
      | $PY -c "import json, sys; d = json.load(sys.stdin); print($round, '$(basename "$clip")', d['speedup'], d['identical'])"
  done
done | tee "$OUT/whisper-bf16-cli/fresh-processes.txt"

# The other pairs
bench qwen-offload --pair qwen2.5-coder-1.5b-offload+0.5b-int8 --suite code --max-new-tokens 128
bench qwen-bnb-int8 --pair $TEXT --pair qwen2.5-coder-1.5b-int8+0.5b-int8 --suite code --suite chat --limit 4 \
    --max-new-tokens 128 --draft-sources assistant_lookup --verify-curve
bench whisper-int8-per-row-speech --pair whisper-base+tiny.en-int8 --suite speech-real --schedules heuristic,adaptive \
    --repeats 3
bench whisper-int8-per-row-long --pair whisper-base+tiny.en-int8 --suite speech-long --schedules heuristic,adaptive \
    --repeats 3
bench whisper --pair whisper-base+tiny.en --suite speech --max-new-tokens 64 --schedules heuristic,adaptive --peer
bench qwen-fp32 --pair qwen2.5-coder-1.5b+0.5b --suite code --suite chat --limit 5 --max-new-tokens 64 \
    --schedules heuristic,adaptive --peer
bench qwen-smollm2 --pair qwen2.5-coder-1.5b+smollm2-135m --suite code --suite chat --limit 5 --max-new-tokens 64 \
    --schedules heuristic,adaptive
bench qwen-int8-temperature --pair $TEXT --suite code --suite chat --limit 2 --max-new-tokens 64 \
    --temperatures 0.3,0.7,1.0 --schedules heuristic,adaptive --peer

# Mechanisms: verify(k), row padding, int8 agreement, long-form accuracy, load time, the page against the CLI
bench verify-curve/qwen --pair $TEXT --suite code --limit 1 --max-new-tokens 2 --verify-curve --no-floor
bench verify-curve/whisper --pair $SPEECH --audio-dir bench/inputs/speech-real --limit 1 --max-new-tokens 2 \
    --verify-curve --no-floor
$PY -m bench.scripts.linear_packing --model-rows $TEXT
$PY -m bench.scripts.int8_agreement
$PY -m bench.scripts.longform_accuracy
$PY -m bench.scripts.pair_ready --runs 5
$PY -m bench.scripts.app_vs_cli --pair $TEXT --prompts bench/inputs/code_prompts.txt --max-new-tokens 32
