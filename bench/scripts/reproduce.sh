#!/usr/bin/env bash
# The figures in README.md's Results section: run from the repository root after the README's install command.
# Each bench command loads its pairs and writes results.json, results.md and PNG plots under bench/results/<name>/.
# About 4 hours on a 2-core CPU. Nothing else should run meanwhile: the timings are wall-clock.
set -euo pipefail
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
bench() { name=$1; shift; $PY -m assistgen bench --out "$OUT/$name" "$@"; }

# --- 2026-12-02 -----------------------------------------------------------------------------------------------------
# The default text pair on every task, both draft sources, and transformers at the seed's settings and its defaults
bench qwen-int8-tasks --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --suite context \
    --suite summarization --suite translation --max-new-tokens 128 --draft-sources assistant,assistant_lookup \
    --schedules adaptive --peer
# verify(k): a target pass over k rows against one row (bench/results/verify-curve/results.md: before and after)
bench verify-curve/qwen --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --limit 1 --max-new-tokens 2 --verify-curve \
    --no-floor
bench verify-curve/whisper --pair whisper-base+tiny.en-int8 --audio-dir bench/inputs/speech-real --limit 1 \
    --max-new-tokens 2 --verify-curve --no-floor
$PY -m bench.scripts.linear_packing
# The seed's offload and INT8 claims
bench qwen-offload --pair qwen2.5-coder-1.5b-offload+0.5b-int8 --suite code --max-new-tokens 128
bench qwen-bnb-int8 --pair qwen2.5-coder-1.5b+0.5b-int8 --pair qwen2.5-coder-1.5b-int8+0.5b-int8 --suite code \
    --suite chat --limit 4 --max-new-tokens 128 --draft-sources assistant_lookup --verify-curve
# Speech: real short clips, espeak-ng voices, long recordings, other languages; draft sources; levers; profile
bench whisper-int8-speech --pair whisper-base+tiny.en-int8 --suite speech-real --suite speech --suite speech-other \
    --schedules heuristic,adaptive --repeats 3
bench whisper-int8-long --pair whisper-base+tiny.en-int8 --suite speech-long --schedules heuristic,adaptive --repeats 3
bench whisper-int8-other --pair whisper-base+tiny.en-int8 --suite speech-other --schedules heuristic,adaptive --repeats 3
bench whisper-int8-sources --pair whisper-base+tiny.en-int8 --suite speech-real --suite speech-long \
    --draft-sources assistant,assistant_lookup --schedules heuristic,adaptive --repeats 3
$PY -m bench.scripts.speech_levers --repeats 3
$PY -m bench.scripts.speech_profile --repeats 3 bench/inputs/speech-real/librivox-sense-0870.flac \
    bench/inputs/speech-real/jfk-ask-not.flac bench/inputs/speech-long/two-cities.flac
ASSISTGEN_ONEDNN=0 $PY -m bench.scripts.truncated_decoder
$PY -m bench.scripts.lean_text_step; $PY -m bench.scripts.lean_text_step --model qwen2.5-coder-1.5b-instruct
$PY -m bench.scripts.compiled_steps   # torch.compile against the eager passes (text layers, the speech draft pass)
$PY -m bench.scripts.longform_accuracy
# First contact: a pair's load, and the page against the CLI
$PY -m bench.scripts.pair_ready --runs 5
$PY -m bench.scripts.pair_ready --pair whisper-base+tiny.en-int8 --runs 3
$PY -m bench.scripts.first_contact --clicks 2
$PY -m bench.scripts.app_vs_cli --pair qwen2.5-coder-1.5b+0.5b-int8 --prompts bench/inputs/code_prompts.txt --limit 3 \
    --max-new-tokens 32

# --- earlier (before the packed oneDNN linear; README "Earlier results") ---------------------------------------------
bench qwen-int8-128 --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --suite translation \
    --max-new-tokens 128 --schedules heuristic,adaptive --peer
bench qwen-int8 --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --suite translation \
    --max-new-tokens 64 --schedules heuristic,adaptive --peer
bench qwen-fp32 --pair qwen2.5-coder-1.5b+0.5b --suite code --suite chat --limit 5 --max-new-tokens 64 \
    --schedules heuristic,adaptive --peer
bench whisper --pair whisper-base+tiny.en --suite speech --max-new-tokens 64 --schedules heuristic,adaptive --peer
bench whisper-int8 --pair whisper-base+tiny.en-int8 --suite speech --max-new-tokens 64 --schedules heuristic,adaptive
bench qwen-smollm2 --pair qwen2.5-coder-1.5b+smollm2-135m --suite code --suite chat --limit 5 --max-new-tokens 64 \
    --schedules heuristic,adaptive
bench qwen-int8-temperature --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --limit 2 \
    --max-new-tokens 64 --temperatures 0.3,0.7,1.0 --schedules heuristic,adaptive --peer
