#!/bin/bash
cd /work/main
for round in 1 2; do
for c in bench/inputs/speech-real/*.flac; do
HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False .venv/bin/python -m assistgen compare --pair whisper-base+decoder-int8 --task asr --audio $c --json > /tmp/w/c.json 2>/tmp/w/c.err
.venv/bin/python -c "
import json; d=json.load(open('/tmp/w/c.json'))
print($round, '$(basename $c)', d['speedup'], d['identical'], d['encoder_dtype'], 'b', d['baseline']['latency_s'], d['baseline']['new_tokens'], 'a', d['assisted']['latency_s'], d['assisted']['target_passes'], d['identical_note'][:80], flush=True)
"
done; done
