"""A sample suite that uses minferd's pytest plugin the way a user's suite would.

tests/e2e/test_plugin.py runs it in a pytest of its own, plain and with `-n 2`, with the plugin
(`-p minferd.testing`, or the installed pytest11 entry point) and MINFERD_PLUGIN_SUITE=1. The main
test run must not collect it: it would need the plugin and would start a daemon of its own. A
conftest below the rootdir may not declare pytest_plugins, so instead its modules are ignored
unless that variable is set (collect_ignore_glob applies to this directory's own files).

Every generate call is appended as a JSON line to MINFERD_SUITE_RECORD, so that test_plugin.py
can add them up against the daemon's final counters (the plugin's --minferd-report).
"""
import json
import os

import pytest

from minferd.model.synth import write_model

collect_ignore_glob = [] if os.environ.get("MINFERD_PLUGIN_SUITE") == "1" else ["test_*.py"]


def synth(arch: str, quant: str):
    """A session fixture: a tiny synthetic model, written once for every worker, loaded once."""
    @pytest.fixture(scope="session")
    def model(minferd_shared_file, minferd_model):
        path = minferd_shared_file(f"{arch}-tiny-{quant}.gguf", lambda p: write_model(p, arch, "tiny", quant))
        return minferd_model(path)
    return model


qwen2 = synth("qwen2", "q8_0")
llama = synth("llama", "q4_0")


class Calls:
    """Generates as a test would, and leaves a line for test_plugin.py."""

    def __init__(self, daemon, nodeid: str):
        self.daemon, self.nodeid = daemon, nodeid

    def generate(self, model, prompt, **sampling) -> dict:
        sampling = {"max_tokens": 4, "temperature": 0.0, **sampling}
        res = model.complete(prompt, **sampling)
        self.note(kind="generate", model=model.name, prompt=prompt, sampling=sampling, text=res["text"],
                  tokens=len(res["token_ids"]))
        return res

    def note(self, **what) -> None:
        out = os.environ.get("MINFERD_SUITE_RECORD")
        if out:
            line = json.dumps({"test": self.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                               "pid": self.daemon.pid, **what})
            with open(out, "a") as f:  # one short O_APPEND write: lines from two workers never interleave
                f.write(line + "\n")


@pytest.fixture
def calls(minferd_daemon, request):
    return Calls(minferd_daemon, request.node.nodeid)
