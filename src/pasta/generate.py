"""Answer one prompt with a model: `python -m pasta.generate prompt="..." [overrides]`.

    python -m pasta.generate prompt="Give three tips for sleeping well."
    python -m pasta.generate prompt="..." model.path=outputs/sft decode=async format=json
    python -m pasta.generate prompt="..." model=qwen2.5-0.5b decode=sequential max_new_tokens=64 \\
        decode.sampling.temperature=0.7 decode.sampling.top_p=0.9

`decode=async` interprets PASTA-LANG as the model writes it (a model without the tag tokens gets them added; it
simply never writes them); `decode=sequential` is the one-token-per-step baseline. With `format=text` the plain
answer streams to stdout as it becomes final (a chunk once it is spliced in order) and the stats go to stderr;
`format=json` prints one JSON object: text, annotated, token_ids and the stats (num_tokens, num_steps,
theoretical_speedup, wall_s, ...). Settings: conf/generate.yaml and conf/decode/; the work: pasta/answer.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omegaconf import DictConfig

from pasta.answer import answer
from pasta.cli import run_entry

if TYPE_CHECKING:
    from pasta.decoding import DecodeResult


# A function of this module, not answer itself: Hydra names the job (and so the run folder) after the file of the
# function it wraps.
def generate(cfg: DictConfig) -> DecodeResult:
    """Decode `cfg.prompt` with `cfg.model` in mode `cfg.decode.kind`; print it as `cfg.format` says."""
    return answer(cfg)


cli = run_entry(generate, "generate", literal_keys=("prompt", "input"))

if __name__ == "__main__":
    cli()
