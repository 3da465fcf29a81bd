"""The suite's rule on deprecations (tests/conftest.py): a FutureWarning or DeprecationWarning that the project's own
call causes fails the test; one that a library raises about its own calls does not."""

from __future__ import annotations

import warnings

import torch
from transformers import DynamicCache

from conftest import own_deprecations

LIBRARY = "/opt/venv/lib/python3.11/site-packages/some_library.py"  # where a third-party module lives


def library_function(stacklevel: int):
    """A function of a third-party module that warns, naming itself (1) or its caller (2)."""
    namespace: dict = {}
    source = "import warnings\ndef old(level):\n    warnings.warn('old API', FutureWarning, stacklevel=level)\n"
    exec(compile(source, LIBRARY, "exec"), namespace)
    return lambda: namespace["old"](stacklevel)


def caught(call) -> list[str]:
    """What the rule finds in `call` (pytest's own capture set aside, so this test does not fail on purpose)."""
    with warnings.catch_warnings(record=True), own_deprecations() as found:
        warnings.simplefilter("always")
        call()
    return found


def test_a_deprecated_argument_to_a_models_forward_is_pastas_own_call(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    found = caught(lambda: model(input_ids=torch.tensor([[1, 2]]), past_key_values=DynamicCache(), use_cache=True))
    assert len(found) == 1 and "past_key_values" in found[0] and __file__ in found[0]


def test_a_library_warning_about_its_own_call_is_not_pastas():
    assert caught(library_function(stacklevel=1)) == []
    assert len(caught(library_function(stacklevel=2))) == 1  # it names this file: pasta's call
