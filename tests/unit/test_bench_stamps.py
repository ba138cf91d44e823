"""bench/ttft_split.py's daemon stamps methods by name (bench/ttft_split_site/sitecustomize.py): each
must still exist, or the stamped daemon fails to start (session 35 found `_forward` gone)."""
import importlib.util
import inspect
from pathlib import Path

SITE = Path(__file__).resolve().parents[2] / "bench" / "ttft_split_site" / "sitecustomize.py"


def test_every_stamped_method_exists_as_the_kind_it_is_wrapped_as():
    spec = importlib.util.spec_from_file_location("ttft_split_sitecustomize", SITE)
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)  # installs nothing without MINFERD_STAMPS
    targets = site.targets()
    assert len(targets) == len({label for _, _, label, _ in targets})
    for cls, name, label, generator in targets:
        f = getattr(cls, name, None)
        assert callable(f), f"{cls.__name__}.{name} (stamp {label}) is gone"
        assert inspect.isgeneratorfunction(f) == generator, f"{cls.__name__}.{name}: generator={generator}"


def test_what_the_null_forward_and_the_profile_replace_exists():
    """MINFERD_NULL_FORWARD and MINFERD_PROFILE replace these by name (a rename would leave the
    bench timing the real forward, or nothing)."""
    from minferd.backend.base import Backend
    from minferd.backend.cpu import CpuBackend
    from minferd.session_socket import SessionSocket
    assert inspect.signature(CpuBackend.run).parameters.keys() == {"self", "model", "batch", "cache"}
    assert inspect.signature(Backend.runs_anywhere).parameters.keys() == {"self", "model", "batch", "cache"}
    assert CpuBackend.caller_steps is False  # what the null forward turns on, as a device backend has it
    assert inspect.signature(SessionSocket._answer).parameters.keys() == {"self", "conn", "request", "watched"}
