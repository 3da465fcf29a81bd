"""Shared test fixtures: the tiny random model, the embedded SmolLM2, the embedding judge, and the shared data folder.

The embedded model is converted from its GGUF into the ordinary cache folder (PASTA_CACHE_DIR, else
~/.cache/pasta) at most once per machine, so the first run pays ~25-50 s and later runs load in seconds.
torch runs on PASTA_TEST_THREADS threads (default 1): other processes may share the machine's cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pasta.config import compose

torch.set_num_threads(int(os.environ.get("PASTA_TEST_THREADS", "1")))


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
