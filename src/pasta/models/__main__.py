"""Prepare a model and try it: `python -m pasta.models prepare|complete [overrides...]`.

    python -m pasta.models prepare                     # convert the embedded GGUF into the cache (once)
    python -m pasta.models complete --prompt "Give three tips for sleeping well."
    python -m pasta.models complete model=qwen2.5-0.5b device=cuda --max-new-tokens 200
    python -m pasta.models complete --prompt "Name a fruit." model=tiny      # flags and overrides in any order

Overrides are Hydra overrides of the `generate` config (model=..., model.path=..., paths.cache_dir=...).
`complete` decodes greedily with plain `generate` (no PASTA-LANG interpretation): a check that a model loads and
answers, not the asynchronous decoder.
"""

from __future__ import annotations

import sys
import time

from pasta.cli import fail
from pasta.errors import ArgumentParser, PastaError


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m pasta.models", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "complete"])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the generate config, e.g. model=tiny")
    parser.add_argument("--prompt", default="Give me three tips for staying healthy.", help="instruction to answer")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate")
    # Intermixed: the overrides may follow the flags (`complete --prompt "..." model=tiny`).
    args = parser.parse_intermixed_args(argv)
    try:
        if args.max_new_tokens < 1:
            raise PastaError(f"--max-new-tokens: must be >= 1, got {args.max_new_tokens}")
        run(args.command, args.overrides, args.prompt, args.max_new_tokens)
    except (PastaError, FileNotFoundError, KeyboardInterrupt) as exc:
        fail(exc)


def run(command: str, overrides: list[str], prompt: str, max_new_tokens: int) -> None:
    from pasta.config import compose, resolve_device, setup_runtime
    from pasta.data import check_text
    from pasta.models import encode_prompt, load_model, resolve_source
    from pasta.settings import check_settings

    cfg = compose("generate", overrides)
    check_settings(cfg, "generate")
    setup_runtime(cfg)
    if command == "prepare":
        print(resolve_source(cfg.model))
        return
    import torch

    check_text(prompt, "--prompt")
    start = time.perf_counter()
    model, tokenizer = load_model(cfg.model, device=resolve_device(cfg.device), check=False)  # plain generate()
    print(f"loaded {cfg.model.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    prompt_ids = encode_prompt(tokenizer, prompt)
    input_ids = torch.tensor([prompt_ids], device=model.device)  # [1, S]
    start = time.perf_counter()
    output_ids = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                do_sample=False)  # [1, S + T]
    seconds = time.perf_counter() - start
    new_ids = output_ids[0, len(prompt_ids):].tolist()
    print(f"user: {prompt}\nassistant: {tokenizer.decode(new_ids, skip_special_tokens=True).strip()}")
    print(f"{len(new_ids)} tokens in {seconds:.1f} s ({len(new_ids) / seconds:.1f} tokens/s, greedy)", file=sys.stderr)


if __name__ == "__main__":
    main()
