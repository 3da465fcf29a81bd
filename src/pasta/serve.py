"""Serve a model behind an OpenAI-compatible endpoint: `python -m pasta.serve [overrides]`.

    python -m pasta.serve model.path=outputs/cpu/sft/final decode=async host=127.0.0.1 port=8000
    python -m pasta.serve model.path=outputs/cpu/sft/final decode=sequential port=8001   # the baseline
    curl http://127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json' \\
        -d '{"model": "final", "messages": [{"role": "user", "content": "Give three tips for sleeping well."}]}'

The served model name (what clients send as `model`) is `served_model_name`, else `model.name`, else the
checkpoint folder's name; GET /v1/models lists it. Settings: conf/serve.yaml (address, admission limits) and the
decode group (each request's defaults). pasta/serving/server.py builds the app; the routes are
pasta/serving/app.py's, the engine and its continuous batching pasta/serving/engine.py's.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from pasta.cli import run_entry
from pasta.serving.server import build_app, listen, served_model_name


def serve(cfg: DictConfig) -> None:
    """Load the model and serve until interrupted (Ctrl-C stops the server; running requests fail cleanly)."""
    import uvicorn

    sock = listen(str(cfg.host), int(cfg.port))
    app = build_app(cfg)
    logging.getLogger("pasta").setLevel(logging.INFO)
    host, port = sock.getsockname()[:2]
    print(f"serving {served_model_name(cfg)!r} ({cfg.decode.kind} decoding) on http://{host}:{port}/v1",
          flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level=str(cfg.log_level))).run(sockets=[sock])


cli = run_entry(serve, "serve")

if __name__ == "__main__":
    cli()
