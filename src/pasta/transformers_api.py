"""The names of transformers' API that changed between the releases pasta runs on.

transformers renamed a model forward's `past_key_values` argument, and the output field that returns the cache, to
`cache`. The old name still works until transformers 5.40, but every call that uses it warns (a FutureWarning,
once per call site). The GPU machines run an earlier release, which knows only `past_key_values`. So pasta passes
and reads the cache under `CACHE_ARGUMENT`, the name this installation's models take.
"""

from __future__ import annotations

import inspect

from transformers import LlamaForCausalLM

# Every architecture pasta loads (Llama, Qwen2, Gemma) was renamed in the same release; Llama stands for them.
CACHE_ARGUMENT = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


def output_cache(outputs):
    """The cache a forward returned (`use_cache=True`), under this release's name."""
    return getattr(outputs, CACHE_ARGUMENT)
