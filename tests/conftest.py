"""Shared test fixtures: the tiny random model, the embedded SmolLM2, the embedding judge, and the shared data folder;
one cost-model measurement per model architecture.

The embedded model is converted from its GGUF into the ordinary cache folder (PASTA_CACHE_DIR, else
~/.cache/pasta) at most once per machine, so the first run pays ~25-50 s and later runs load in seconds.
torch runs on PASTA_TEST_THREADS threads (default 1): other processes may share the machine's cores. So do the
processes the tests start (`python -m pasta.*`, the study and demo scripts), through OMP_NUM_THREADS unless it is
set: with two pytest workers on two cores, children on every core fight the other worker's threads.

A test fails when the project's own code (src/pasta, tests, scripts) makes a FutureWarning or a DeprecationWarning:
a deprecated argument, function or module that pasta calls. The frame a warning holds responsible is the one its
`stacklevel` names, past the frames that only forward a call: a deprecated argument to a model's forward names
torch's `Module.__call__`, whose caller is the one to blame. Third-party code that warns about its own calls is left
to pytest's warnings summary.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from pasta.config import compose

TEST_THREADS = int(os.environ.get("PASTA_TEST_THREADS", "1"))
torch.set_num_threads(TEST_THREADS)
os.environ.setdefault("OMP_NUM_THREADS", str(TEST_THREADS))  # inherited by the processes tests start

ROOT = Path(__file__).resolve().parents[1]
# Frames that only pass a call on: a warning's stacklevel may land on them.
_CALL_FORWARDERS = ("torch.nn.modules.module", "torch.utils._contextlib", "functools", "contextlib")


def _is_own(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(str(ROOT) + os.sep) and "site-packages" not in path


def _responsible_file(message: warnings.WarningMessage) -> str:
    """The file of the frame the warning names (its stacklevel), or of its caller past call forwarders."""
    frame = sys._getframe()
    while frame is not None and (frame.f_code.co_filename, frame.f_lineno) != (message.filename, message.lineno):
        frame = frame.f_back
    while frame is not None and frame.f_globals.get("__name__") in _CALL_FORWARDERS:
        frame = frame.f_back
    return message.filename if frame is None else frame.f_code.co_filename


@contextmanager
def own_deprecations() -> Iterator[list[str]]:
    """The FutureWarnings and DeprecationWarnings the project's own code causes in the block, as text.

    Runs inside pytest's warning capture, whose recorder it wraps: the stack is still live when a warning is
    recorded, and pytest still records every warning for its summary."""
    record = warnings._showwarnmsg_impl  # pytest's recorder (warnings.catch_warnings(record=True))
    found: list[str] = []

    def check(message: warnings.WarningMessage) -> None:
        if issubclass(message.category, FutureWarning | DeprecationWarning) and _is_own(_responsible_file(message)):
            found.append(f"{message.category.__name__} at {_responsible_file(message)}: {message.message}")
        record(message)

    warnings._showwarnmsg_impl = check
    try:
        yield found
    finally:
        warnings._showwarnmsg_impl = record


def _fail_on_own_deprecations() -> Iterator[None]:
    with own_deprecations() as found:
        result = yield
    if found:
        pytest.fail("pasta's own call is deprecated:\n" + "\n".join(dict.fromkeys(found)), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _fail_on_own_deprecations())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _fail_on_own_deprecations())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    return (yield from _fail_on_own_deprecations())


def pytest_collection_finish(session):
    """Freeze what is alive once the tests are collected (the imports of torch, transformers, TRL, ...: hundreds of
    thousands of objects): a full garbage collection then skips them. Trainers collect garbage on every run
    (accelerate's free_memory), and Python does now and then; without the freeze each pass walks every import."""
    gc.freeze()


def pytest_collection_modifyitems(items):
    """Slow tests first, in their collection order, so that the minutes-long ones (tests/test_study.py) start
    early and the run ends on short tests. With pyproject's --maxschedchunk=1 pytest-xdist hands the tests out one
    at a time from the front; by default it gives each worker a block of consecutive tests to begin with, and the
    first block held every slow test: one worker ran them all, tests/test_study.py last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="session")
def one_cost_model_per_architecture():
    """Every sequential evaluation run that decodes measures its model's cost model (pasta.decoding.step_costs:
    seconds, even on the tiny model); the suite's dozens of runs of the same few architectures measure each one once
    per worker. What a measurement is keyed by: the model's class and config (not the folder it was loaded from), the
    device and the thread count. A call with arguments of its own (tests/test_decoding_costs.py) is measured."""
    from pasta.decoding import step_costs

    measure = step_costs.measure_step_costs
    measured = {}

    def measure_once(model, **kwargs):
        if kwargs:
            return measure(model, **kwargs)
        config = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
        key = (type(model), json.dumps(config, sort_keys=True, default=str), str(model.device), torch.get_num_threads())
        if key not in measured:
            measured[key] = measure(model)
        return measured[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_costs, "measure_step_costs", measure_once)
        yield


@pytest.fixture
def torch_threads(request):
    """Run the test on `request.param` torch threads (2 unless parametrized with indirect=True), then go back.

    The decoders' CPU multi-row linears (pasta/decoding/linears.py) are on only with two threads or more.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(getattr(request, "param", 2))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def embedded_model_and_tokenizer():
    """(model, tokenizer) of the embedded SmolLM2-135M-Instruct on CPU, float32, eval mode. Do not modify."""
    from pasta.models import load_model

    return load_model(compose("generate").model, device="cpu")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer():
    """(model, tokenizer): a seeded random 2-layer Llama (hidden 64) with the embedded model's tokenizer.

    Shared by the whole session: a test that trains or edits the model must build its own copy with
    `pasta.models.build_tiny_model(tokenizer)`.
    """
    from pasta.models import load_model

    return load_model(compose("generate", ["model=tiny"]).model, device="cpu")


@pytest.fixture(scope="session")
def embedding_judge():
    """The packaged all-MiniLM-L6-v2 embedding judge, loaded once per process (the one evaluation's proxies use)."""
    from pasta.evaluation.proxies import embedding_judge

    return embedding_judge()


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The third-party data beside the checkout (paths.shared_data_dir); the test is skipped where it is absent."""
    path = Path(compose("generate").paths.shared_data_dir).resolve()
    if not (path / "alpaca_eval.jsonl").is_file():
        pytest.skip(f"shared data not found at {path} (set PASTA_SHARED_DATA)")
    return path
