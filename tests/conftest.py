import pytest

from cost_model.nouns.hardware import load_gpu
from cost_model.nouns.model_spec import load_model
from cost_model.nouns.workload import Workload
from cost_model.nouns.stack import Stack


# Test files that import torch at module level: every test in them is marked torch. A run that deselects torch
# tests (`make test-fast`) does not collect them (importing torch alone takes seconds, and it may be missing); any
# other run collects them and, without torch, fails loudly on the import rather than skipping the group.
NEEDS_TORCH_TO_IMPORT = ("test_adam_component.py", "test_device_tensors.py", "test_layout_equivalence.py",
                         "test_megatron_gdn.py", "test_megatron_runner.py")


def pytest_ignore_collect(collection_path, config):
    if collection_path.name in NEEDS_TORCH_TO_IMPORT:
        return "not torch" in (config.getoption("markexpr") or "") or None
    return None


@pytest.fixture(scope="session")
def qwen36():
    return load_model("qwen3.6-35b-a3b")


@pytest.fixture(scope="session")
def h200():
    return load_gpu("h200")


@pytest.fixture(scope="session")
def workload():
    return Workload()


@pytest.fixture(scope="session")
def stack():
    return Stack()


def never_scored(*args, **kwargs):
    raise AssertionError("the space was scored before the refusal")


@pytest.fixture
def no_scoring(monkeypatch):
    """`tune` whose space scoring fails the test if called: what must be refused before scoring is checked without
    timing it (a verdict that does not depend on the machine's speed)."""
    from tuner import study_commands

    monkeypatch.setattr(study_commands, "score_space", never_scored)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Ray installs a SIGTERM handler when a test starts it; left in place, a later SIGTERM sent to a test's
    own child would surface in whichever test runs as a SystemExit. Each test leaves the handlers as it
    found them."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        if signal.getsignal(s) is not handler and handler is not None:
            signal.signal(s, handler)
