#!/usr/bin/env bash
# On a machine with a CUDA GPU, from the repository root after the README's install (about 14 minutes on one GPU):
# the engine's tests on the device, then pass costs for real model sizes and the speedups they predict, then eager
# against graph-captured passes. Writes bench/results/gpu/ (gpu_costs.json, gpu_costs.md, verify_curve.png,
# gpu_graphs.json, gpu_graphs.md); README's Results quote it.
set -euo pipefail
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
PY=${PYTHON:-.venv/bin/python}
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# The engine against transformers on tiny random models, greedy identity and exact sampling, on the GPU
ASSISTGEN_TEST_DEVICE=cuda timeout 240 $PY -m pytest -q tests/engine -p no:cacheprovider || echo "engine tests on CUDA: FAILED (see above)"
# verify(k) and assistant passes in fp16 for the hub pairs' real sizes; predicted speedups from the CPU's traces
timeout 300 $PY -m bench.scripts.gpu_costs --device cuda --dtype float16 --out bench/results/gpu
# Eager against graph-captured passes (engine/static_steps.py), their capture time, and greedy identity through them
timeout 240 $PY -m bench.scripts.gpu_graphs --device cuda --dtype float16 --out bench/results/gpu
