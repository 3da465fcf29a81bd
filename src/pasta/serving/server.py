"""The server `python -m pasta.serve` starts, built from a composed config: the model, the engine, the app, the socket.

The routes, errors and streaming are pasta/serving/app.py's; the engine and its continuous batching
pasta/serving/engine.py's.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from pasta.config import check_ranges
from pasta.errors import PastaError
from pasta.serving.scheduler import AdmissionLimits

# The default cap on a request body, per token of the context: a prompt that fits is far smaller (a token is about
# 4 characters of English, and a JSON escape such as \uXXXX 6 bytes a character), and a 10 MB body is refused
# before it is read, parsed and tokenized.
BODY_BYTES_PER_TOKEN = 64


@dataclass(frozen=True)
class ServeLimits(AdmissionLimits):
    """conf/serve.yaml's `limits`: the scheduler's admission limits, and what one request may ask."""

    max_tokens: int = field(
        default=4096,
        metadata={"help": "the largest max_tokens a request may ask (one that leaves it out gets decode.max_new_tokens)"},
    )
    max_n: int = field(default=8, metadata={"help": "the most choices (n) one request may ask"})
    context_length: int | None = field(
        default=None,
        metadata={"help": "prompt + max_tokens must fit in this many tokens; null = the model's max_position_embeddings"},
    )
    max_body_bytes: int | None = field(
        default=None,
        metadata={"help": f"a larger request body gets 413 before it is parsed or tokenized; null = "
                          f"{BODY_BYTES_PER_TOKEN} bytes per token of the context length (far more than a prompt "
                          "that fits: a token is about 4 characters of English)"},
    )

    def validate(self, where: str) -> None:
        check_ranges(self, where, {
            "max_tokens": (lambda v: v >= 1, ">= 1"),
            "max_n": (lambda v: v >= 1, ">= 1"),
            "context_length": (lambda v: v is None or v >= 1, ">= 1 or null"),
            "max_body_bytes": (lambda v: v is None or v >= 1, ">= 1 or null"),
        })


def served_model_name(cfg: DictConfig) -> str:
    if cfg.get("served_model_name"):
        return str(cfg.served_model_name)
    if cfg.model.get("path"):
        return Path(str(cfg.model.path)).name
    return str(cfg.model.name)


def build_app(cfg: DictConfig):
    """The FastAPI app for `cfg`: the model loaded, the engine built (its thread starts with the app)."""
    from pasta.config import resolve_device, schema_from
    from pasta.decoding import DecodeConfig
    from pasta.lang import add_tag_tokens
    from pasta.models import load_model, max_positions
    from pasta.models.trained_lang import decoding_policy
    from pasta.serving.app import ServeSettings, create_app
    from pasta.serving.engine import MODES, Engine

    if cfg.decode.kind not in MODES:
        raise PastaError(f"decode={cfg.decode.kind} cannot be served; use one of {', '.join(MODES)}")
    limits = schema_from(cfg.limits, ServeLimits, "limits")
    config = schema_from(cfg.decode, DecodeConfig, "decode")  # each request's defaults; its seed is the request's own
    if config.compile:
        raise PastaError("decode.compile=true: pasta.serve does not compile its decode steps (pasta.generate, "
                         "pasta.eval and scripts/bench_decode.py do); serve with decode.compile=false")
    num_positions = max_positions(cfg.model)
    if limits.context_length and num_positions and limits.context_length > num_positions:
        raise PastaError(f"limits.context_length={limits.context_length} is over the model's {num_positions} "
                         "positions (max_position_embeddings): lower it, or leave it null for the model's")
    policy = decoding_policy(cfg.lang.reservation, cfg.model) if cfg.decode.kind == "async" else None
    model, tokenizer = load_model(cfg.model, device=resolve_device(cfg.device))
    if policy is not None:
        add_tag_tokens(tokenizer, model)  # no-op for a PASTA checkpoint
    context_length = limits.context_length or num_positions or 2048
    engine = Engine(model, tokenizer, mode=cfg.decode.kind, policy=policy, limits=limits,
                    cpu_multirow_linears=config.cpu_multirow_linears)
    settings = ServeSettings(model_name=served_model_name(cfg), decode=config,
                             max_tokens_limit=limits.max_tokens, max_n=limits.max_n,
                             context_length=int(context_length),
                             max_body_bytes=limits.max_body_bytes or BODY_BYTES_PER_TOKEN * int(context_length))
    return create_app(engine, settings)


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads, so that a taken port is a one-line error at once."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PastaError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another with port=...") from None
    return sock
