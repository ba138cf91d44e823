"""ListAvailable and `minferctl ls`: the files of --models-dir as a load would see them, from
their headers alone, a refused file saying why without hiding the others; and a request naming
one of those files loads it on demand."""
from __future__ import annotations

import json
import subprocess
import sys

from minferd._proto import pb2
from minferd.model.synth import write_model
from minferd.pool.estimator import estimate
from minferd.model.loader import open_model_file
from minferd.devices import cpu_traits
from tests.e2e.daemon import Daemon


def test_the_models_directory_as_a_load_would_see_it(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    write_model(models / "qwen2.gguf", "qwen2", "tiny", "q8_0", seed=1)
    write_model(models / "llama.gguf", "llama", "tiny", "q4_0", seed=1)
    (models / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 64)
    (models / "notes.txt").write_text("not a model")
    d = Daemon(tmp_path, "--device", "cpu", "--models-dir", models, "--budget", "512MiB", "--threads", "2")
    try:
        d.load("qwen2.gguf", "qwen2")
        got = d.stub().ListAvailable(pb2.ListAvailableRequest()).models
        assert [m.name for m in got] == ["broken", "llama", "qwen2"]
        broken, llama, qwen2 = got
        assert broken.error and not broken.architecture and not broken.fits
        assert (llama.architecture, llama.loaded, qwen2.loaded) == ("llama", False, True)
        assert llama.fits and llama.plan == "mmq" and dict(llama.type_mix)["Q4_0"] > 0
        est = estimate(open_model_file(models / "llama.gguf"), cpu_traits(2), 2048)
        assert (llama.bytes.weights, llama.bytes.kv, llama.bytes.scratch) == (est.weights, est.kv, est.scratch)
        assert llama.file_bytes == (models / "llama.gguf").stat().st_size

        p = subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", d.address, "ls"],
                           capture_output=True, text=True, timeout=60)
        lines = p.stdout.splitlines()
        assert p.returncode == 0 and lines[0].split()[:4] == ["NAME", "SIZE", "ARCH", "PLAN"]
        assert any(line.startswith("broken") and "refused:" in line for line in lines)
        rows = json.loads(subprocess.run([sys.executable, "-m", "minferd.ctl", "--address", d.address, "ls", "--json"],
                                         capture_output=True, text=True, timeout=60).stdout)
        assert {r["name"]: r.get("loaded") for r in rows} == {"broken": False, "llama": False, "qwen2": True}
        assert [m.name for m in d.status().models] == ["qwen2"]  # listing loaded nothing

        # A Generate naming a file of --models-dir loads it on demand (as Ollama does).
        events = list(d.stub().Generate(pb2.GenerateRequest(model="llama", text="hello",
                                                            sampling=pb2.SamplingParams(max_tokens=3))))
        assert events[-1].finish_reason in ("length", "stop")
        assert sorted(m.name for m in d.status().models) == ["llama", "qwen2"]
    finally:
        d.stop()
