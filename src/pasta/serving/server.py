"""The server `python -m pasta.serve` starts, built from a composed config: the model, the engine, the app, the socket.

The routes, errors and streaming are pasta/serving/app.py's; the engine and its continuous batching
pasta/serving/engine.py's.
"""

from __future__ import annotations

import socket
from pathlib import Path

from omegaconf import DictConfig

from pasta.errors import PastaError


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
    from pasta.lang import ReservationPolicy, add_tag_tokens
    from pasta.models import load_model
    from pasta.serving.app import ServeSettings, create_app
    from pasta.serving.engine import MODES, Engine
    from pasta.serving.scheduler import AdmissionLimits

    if cfg.decode.kind not in MODES:
        raise PastaError(f"decode={cfg.decode.kind} cannot be served; use one of {', '.join(MODES)}")
    limits = cfg.limits
    if int(limits.max_tokens) < 1 or int(limits.max_n) < 1:
        raise PastaError("limits.max_tokens and limits.max_n must be >= 1")
    admission = AdmissionLimits(max_running_requests=int(limits.max_running_requests),
                                max_tokens_in_flight=int(limits.max_tokens_in_flight),
                                max_queued_requests=int(limits.max_queued_requests))
    config = schema_from(cfg.decode, DecodeConfig, "decode")  # each request's defaults; its seed is the request's own
    model, tokenizer = load_model(cfg.model, device=resolve_device(cfg.device))
    policy = None
    if cfg.decode.kind == "async":
        add_tag_tokens(tokenizer, model)  # no-op for a PASTA checkpoint
        policy = ReservationPolicy.from_config(cfg.lang.reservation)
    context_length = limits.context_length or getattr(model.config, "max_position_embeddings", None) or 2048
    engine = Engine(model, tokenizer, mode=cfg.decode.kind, policy=policy, limits=admission,
                    cpu_multirow_linears=config.cpu_multirow_linears)
    settings = ServeSettings(model_name=served_model_name(cfg), decode=config,
                             max_tokens_limit=int(limits.max_tokens), max_n=int(limits.max_n),
                             context_length=int(context_length))
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
