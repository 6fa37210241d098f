#!/bin/bash
# usage: cmp.sh CLIP [extra args]
c=$1; shift
cd /work/main
HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False .venv/bin/python -m assistgen compare --pair whisper-base+decoder-int8 --task asr --audio $c --json "$@" > /tmp/c.json 2>/tmp/c.err
.venv/bin/python -c "
import json,sys; d=json.load(open('/tmp/c.json'))
print('$(basename $c)', d['speedup'], d['identical'], 'b', d['baseline']['latency_s'], d['baseline']['new_tokens'], d['baseline']['time']['setup_s'], 'a', d['assisted']['latency_s'], d['assisted']['target_passes'], d['assisted']['time']['setup_s'], [(len(s['candidates']), s['accepted'], s['withheld'], round(s['draft_s']*1000), round(s['verify_s']*1000)) for s in d['assisted']['steps']])
"
