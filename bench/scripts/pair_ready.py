"""How long does a prepared pair take from load to ready? Each run is a fresh process that first imports what the
app imports at start-up (torch, transformers and the model classes: the app has done that before any pair loads),
then the pair's modeling code (timed on its own: once per process and model family; after the app's own imports it
took 0.1 s), then loads the pair from the prepared cache and warms it up, as the app's preload does.

    .venv/bin/python -m bench.scripts.pair_ready [--pair qwen2.5-coder-1.5b-w8a8+0.5b-int8] [--runs 3]

Prints each run's target load, assistant load (tokenizers included), warm-up and total, then the medians. Run
`python -m assistgen prepare` first; the page cache is warm from the second run on. A benchmark: it asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ONE_RUN = r"""
import importlib, json, sys, time
from pathlib import Path
import torch, transformers
from transformers import AutoModelForCausalLM, AutoModelForSpeechSeq2Seq, AutoProcessor, AutoTokenizer  # noqa
from assistgen.models.catalog import load_catalog
from assistgen.models.conversion import weights_folder
from assistgen.models.devices import default_device, torch_dtype
from assistgen.comparison.compare import warm_up
from assistgen.models.pool import ModelPool
from assistgen.app.service import Service
catalog = load_catalog()
pool = ModelPool(catalog)
spec = catalog.pair(sys.argv[1])
started = time.perf_counter()
for model in (spec.target, spec.assistant):
    if model is not None:
        folder = weights_folder(model, catalog, default_device(), torch_dtype(model.dtype, default_device()),
                                 lambda f, m: None)
        kind = json.loads((Path(folder) / "config.json").read_text())["model_type"]
        importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
imported = time.perf_counter()
pair = pool.pair(sys.argv[1])
loaded = time.perf_counter()
warm_up(pair, Service(catalog, pool=pool)._warm_up_inputs(pair))
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "target_s": pair.target.load_s,
                  "assistant_s": pair.assistant.load_s if pair.assistant else 0.0,
                  "load_s": loaded - imported, "warm_up_s": done - loaded, "ready_s": done - imported}))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen2.5-coder-1.5b-w8a8+0.5b-int8")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    rows = []
    for run in range(args.runs):
        out = subprocess.run([sys.executable, "-c", ONE_RUN, args.pair], cwd=ROOT, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        if out.returncode:
            raise SystemExit(out.stderr[-2000:])
        row = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"run {run + 1}: modeling code import {row['import_s']:.1f} s, then target {row['target_s']:.1f} s, "
              f"assistant {row['assistant_s']:.1f} s, warm-up {row['warm_up_s']:.1f} s, "
              f"ready in {row['ready_s']:.1f} s",
              flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{args.pair}, median of {len(rows)}: target {med['target_s']:.1f} s, assistant {med['assistant_s']:.1f} s, "
          f"warm-up {med['warm_up_s']:.1f} s, ready in {med['ready_s']:.1f} s (a process's first pair of its family "
          f"also imports its modeling code first: {med['import_s']:.1f} s)")


if __name__ == "__main__":
    main()
