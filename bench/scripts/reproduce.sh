#!/usr/bin/env bash
# The figures in README.md's Results section: run from the repository root after the README's install command.
# Each command loads one pair and writes results.json, results.md and PNG plots under bench/results/<name>/.
# About 110 minutes on a 2-core CPU. Nothing else should run meanwhile: the timings are wall-clock.
set -euo pipefail
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-bench/results}
bench() { name=$1; shift; $PY -m assistgen bench --max-new-tokens 64 --out "$OUT/$name" "$@"; }

# Schedules and the peer, greedy, every text task: the int8 assistant at the app's 128 tokens and at 64, and the fp32 one
$PY -m assistgen bench --max-new-tokens 128 --out "$OUT/qwen-int8-128" --pair qwen2.5-coder-1.5b+0.5b-int8 \
    --suite code --suite chat --suite translation --schedules heuristic,adaptive --peer
bench qwen-int8 --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --suite translation \
    --schedules heuristic,adaptive --peer
bench qwen-fp32 --pair qwen2.5-coder-1.5b+0.5b --suite code --suite chat --limit 5 --schedules heuristic,adaptive --peer
# Speech: six espeak-ng clips, several voices and speeds
bench whisper --pair whisper-base+tiny.en --suite speech --schedules heuristic,adaptive --peer
bench whisper-int8 --pair whisper-base+tiny.en-int8 --suite speech --schedules heuristic,adaptive
# A different-tokenizer assistant, 11x smaller
bench qwen-smollm2 --pair qwen2.5-coder-1.5b+smollm2-135m --suite code --suite chat --limit 5 --schedules heuristic,adaptive
# Temperature sweep (speculative sampling)
bench qwen-int8-temperature --pair qwen2.5-coder-1.5b+0.5b-int8 --suite code --suite chat --limit 2 \
    --temperatures 0.3,0.7,1.0 --schedules heuristic,adaptive --peer
