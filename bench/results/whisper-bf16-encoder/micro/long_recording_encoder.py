import dataclasses, time, statistics, torch, functools
from assistgen.app.validation import request_settings
from assistgen.comparison.audio import load_audio
from assistgen.comparison.compare import run_generation, warm_up
from assistgen.comparison.speech import speech_windows
from assistgen.models.catalog import load_catalog
from assistgen.models.loading import check_pair, load_model
from assistgen.models.pool import ModelPool
catalog = load_catalog(); spec = catalog.pair("whisper-base+decoder-int8")
low = ModelPool(catalog).pair(spec)
f32spec = dataclasses.replace(spec, target=dataclasses.replace(spec.target, encoder_dtype=None))
plain = check_pair(f32spec, load_model(f32spec.target, catalog), low.assistant)
settings = request_settings(spec)
samples = load_audio("bench/inputs/speech-long/two-cities.flac")
for name, pair in (("f32", plain), ("bf16", low)):
    enc = pair.target.model.get_encoder()
    orig = enc.forward
    times = []
    @functools.wraps(orig)
    def timed(*a, _o=orig, _t=times, **k):
        s = time.perf_counter(); r = _o(*a, **k); _t.append(time.perf_counter() - s); return r
    enc.forward = timed
    pair._enc_times = times
wins = {n: speech_windows(p, samples, language="en") for n, p in (("f32", plain), ("bf16", low))}
for n, p in (("f32", plain), ("bf16", low)): warm_up(p, wins[n][0].inputs)
for rnd in range(3):
    for name, pair in (("f32", plain), ("bf16", low)):
        pair._enc_times.clear()
        r = run_generation(pair, wins[name], settings)
        steps = [s.verify_s for s in r.steps]
        print(name, f"latency {r.latency_s:.2f}", "encoder", [round(t, 3) for t in pair._enc_times], f"median step {statistics.median(steps)*1000:.1f} ms, sum steps {sum(steps):.2f}, n {len(steps)}")
