import pytest

from cost_model.hardware import load_gpu
from cost_model.model_spec import load_model
from cost_model.workload import Workload
from cost_model.stack import Stack


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
