"""Both models co-resident in one daemon, each loaded once, whichever fixture or worker asked."""
import pytest

from minferd.model.synth import write_model


@pytest.fixture(scope="module")
def qwen2_here(minferd_shared_file, minferd_model):
    # A fixture of this module asking for the same file by itself: it must get the suite's load.
    path = minferd_shared_file("qwen2-tiny-q8_0.gguf", lambda p: write_model(p, "qwen2", "tiny", "q8_0"))
    return minferd_model(path)


def test_module_fixture_shares_the_load(qwen2_here, qwen2):
    assert qwen2_here is qwen2


def test_one_entry_per_model(qwen2, llama, minferd_client, calls):
    st = minferd_client.status()
    names = [m["name"] for m in st["models"]]
    assert names.count(qwen2.name) == 1 and names.count(llama.name) == 1
    for handle in (qwen2, llama):
        now = next(m for m in st["models"] if m["name"] == handle.name)
        assert now["loaded_unix"] == handle.loaded["loaded_unix"]  # never loaded again
        calls.note(kind="loaded", model=handle.name, loaded_unix=now["loaded_unix"])


def test_pool_holds_both(qwen2, llama, minferd_client):
    st = minferd_client.status()
    held = sum(sum(m["bytes"].values()) for m in st["models"] if m["name"] in (qwen2.name, llama.name))
    assert 0 < held <= st["pool"]["used_bytes"] <= st["pool"]["capacity_bytes"]


def test_daemon_serving(minferd_daemon, minferd_client, qwen2, calls):
    assert minferd_daemon.address.startswith("unix://") and minferd_daemon.pid
    assert minferd_client.health("") == "SERVING"
    assert minferd_client.health(f"model/{qwen2.name}") == "SERVING"
    calls.generate(qwen2, "Hello")
