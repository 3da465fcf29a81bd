"""A small OpenAI-compatible chat-completions server for tests (stdlib HTTP, runs as its own process).

Run:
    python tests/helpers/chat_server.py --port 0 --mode scripted --rules rules.json [--fail-first 2 --fail-status 429]
    python tests/helpers/chat_server.py --port 0 --mode tiny

The first stdout line is the bound port. Endpoints: POST /v1/chat/completions (non-streaming; `logprobs: true,
top_logprobs: k` adds `choices[0].logprobs.content[..].top_logprobs`), GET /v1/models, GET /stats (request counts,
so tests can assert that a client retried).

Modes:
- scripted: replies come from a JSON rules file: {"queue": [...], "rules": [...], "default": ...}. A request takes
  the next queue entry while the queue lasts, else the first rule whose "contains" substring (or "regex") matches the
  last user message, else "default"; with none of these it answers 400. An entry is a reply string or an object
  {"reply": str, "top_logprobs": {token: logprob, ...}} whose top_logprobs are given for the reply's first token.
- tiny: a randomly initialised tiny Llama (pasta.models.build_tiny_model) with the embedded model's tokenizer,
  greedy generation over the chat template: proves that a real model answers over HTTP.

Fault injection: the first --fail-first N chat requests answer --fail-status with an OpenAI-style JSON error body
and a `retry-after-ms` header (the openai client honours it, which keeps retry tests fast); --delay S sleeps before
every chat answer; --echo-auth puts the request's Authorization header into every error message, as some servers
do (tests check that the key never reaches pasta's errors, logs or files).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Splits scripted replies into pseudo-tokens (words with their leading space, and punctuation) for logprobs.
_PSEUDO_TOKEN_RE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


class ScriptedReplies:
    """Chooses the reply for a request from a rules file (see the module docstring)."""

    def __init__(self, rules: dict[str, Any]):
        self._queue = list(rules.get("queue", []))
        self._rules = list(rules.get("rules", []))
        self._default = rules.get("default")
        self._lock = threading.Lock()

    def reply(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        with self._lock:
            if self._queue:
                return _as_entry(self._queue.pop(0))
        last_user = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "user"), "")
        for rule in self._rules:
            if "contains" in rule and rule["contains"] in last_user:
                return _as_entry(rule)
            if "regex" in rule and re.search(rule["regex"], last_user, flags=re.DOTALL):
                return _as_entry(rule)
        return None if self._default is None else _as_entry(self._default)


def _as_entry(entry: str | dict[str, Any]) -> dict[str, Any]:
    return {"reply": entry} if isinstance(entry, str) else entry


def scripted_completion(
    entry: dict[str, Any], num_top_logprobs: int
) -> tuple[str, list[dict[str, Any]], int]:
    """Reply text, logprobs content (each pseudo-token certain, unless the entry gives the first one's), tokens."""
    text = entry["reply"]
    tokens = _PSEUDO_TOKEN_RE.findall(text) or [""]
    content = []
    for position, token in enumerate(tokens):
        top = {token: 0.0}
        if position == 0 and "top_logprobs" in entry:
            top = dict(entry["top_logprobs"])
        ranked = sorted(top.items(), key=lambda kv: -kv[1])[:num_top_logprobs]
        content.append(_logprob_entry(token, top.get(token, ranked[0][1] if ranked else 0.0), ranked))
    return text, content, len(tokens)


def _logprob_entry(token: str, logprob: float, ranked: list[tuple[str, float]]) -> dict[str, Any]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in ranked],
    }


class TinyModelReplies:
    """Greedy answers of a tiny random Llama over the embedded tokenizer's chat template."""

    def __init__(self, seed: int):
        import torch

        from pasta.models import build_tiny_model, load_tokenizer

        torch.set_num_threads(1)
        self._torch = torch
        self.tokenizer = load_tokenizer(_tiny_model_cfg())
        self.model = build_tiny_model(self.tokenizer, seed=seed).eval()
        # One forward at a time: the server is threaded, the model is not meant to be shared across threads.
        self._lock = threading.Lock()

    def complete(
        self, messages: list[dict[str, Any]], max_tokens: int, num_top_logprobs: int
    ) -> tuple[str, list[dict[str, Any]], int, int]:
        torch = self._torch
        prompt_ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(prompt_ids, list):  # transformers 5 returns a BatchEncoding
            prompt_ids = prompt_ids["input_ids"]
        input_ids = torch.tensor([prompt_ids])  # [1, S]
        with self._lock, torch.no_grad():
            out = self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=max_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        new_ids = out.sequences[0, input_ids.shape[1] :].tolist()
        content = []
        for token_id, scores in zip(new_ids, out.scores, strict=False):
            logprobs = torch.log_softmax(scores[0].float(), dim=-1)  # [V]
            top = torch.topk(logprobs, k=max(num_top_logprobs, 1))
            ranked = [
                (self.tokenizer.decode([i]), v)
                for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)
            ]
            content.append(
                _logprob_entry(self.tokenizer.decode([token_id]), logprobs[token_id].item(), ranked)
            )
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        return text, content, len(prompt_ids), len(new_ids)


def _tiny_model_cfg() -> Any:
    from pasta.config import compose

    return compose("generate", overrides=["model=tiny"]).model


class ChatServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], args: argparse.Namespace):
        super().__init__(address, ChatHandler)
        self.args = args
        self.scripted = None
        self.tiny = None
        if args.mode == "scripted":
            with open(args.rules, encoding="utf-8") as f:
                self.scripted = ScriptedReplies(json.load(f))
        else:
            self.tiny = TinyModelReplies(args.seed)
        self.stats = {"requests": 0, "chat_requests": 0, "failed": 0}
        self.stats_lock = threading.Lock()


class ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def log_message(self, format: str, *args: Any) -> None:  # keep the test output quiet
        pass

    def do_GET(self) -> None:
        self._count("requests")
        if self.path.rstrip("/") == "/v1/models":
            model = {"id": self.server.args.model, "object": "model", "created": 0, "owned_by": "pasta-tests"}
            self._send(200, {"object": "list", "data": [model]})
        elif self.path.rstrip("/") == "/stats":
            with self.server.stats_lock:
                self._send(200, dict(self.server.stats))
        else:
            self._error(404, f"no route GET {self.path}", "not_found_error")

    def do_POST(self) -> None:
        self._count("requests")
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._error(404, f"no route POST {self.path}", "not_found_error")
            return
        length = int(self.headers.get("Content-Length", 0))
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError as e:
            self._error(400, f"invalid JSON body: {e}", "invalid_request_error")
            return
        with self.server.stats_lock:
            self.server.stats["chat_requests"] += 1
            fail = self.server.stats["chat_requests"] <= self.server.args.fail_first
            if fail:
                self.server.stats["failed"] += 1
        if self.server.args.delay:
            time.sleep(self.server.args.delay)
        if fail:
            status = self.server.args.fail_status
            kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "server_error")
            kind = {400: "invalid_request_error"}.get(status, kind)
            self._error(status, f"injected failure ({status})", kind)
            return
        self._answer(body)

    def _answer(self, body: dict[str, Any]) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            self._error(400, "'messages' must be a non-empty list", "invalid_request_error")
            return
        num_top_logprobs = int(body.get("top_logprobs") or 0)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        if self.server.scripted is not None:
            entry = self.server.scripted.reply(messages)
            if entry is None:
                self._error(400, "no scripted rule matched the last user message", "invalid_request_error")
                return
            text, content, num_completion_tokens = scripted_completion(entry, num_top_logprobs)
            num_prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        else:
            text, content, num_prompt_tokens, num_completion_tokens = self.server.tiny.complete(
                messages, max_tokens, num_top_logprobs
            )
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
            "logprobs": {"content": content} if body.get("logprobs") else None,
        }
        self._send(
            200,
            {
                "id": f"chatcmpl-test-{self.server.stats['chat_requests']}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.server.args.model),
                "choices": [choice],
                "usage": {
                    "prompt_tokens": num_prompt_tokens,
                    "completion_tokens": num_completion_tokens,
                    "total_tokens": num_prompt_tokens + num_completion_tokens,
                },
            },
        )

    def _count(self, key: str) -> None:
        with self.server.stats_lock:
            self.server.stats[key] += 1

    def _error(self, status: int, message: str, kind: str) -> None:
        if self.server.args.echo_auth:
            message += f" (request headers: Authorization: {self.headers.get('Authorization')})"
        headers = (
            {"retry-after-ms": str(self.server.args.retry_after_ms)} if status in (429, 500, 503) else {}
        )
        self._send(status, {"error": {"message": message, "type": kind, "code": status}}, headers)

    def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port", type=int, default=0, help="0 picks a free port; the first stdout line is the port"
    )
    p.add_argument("--mode", choices=["scripted", "tiny"], default="scripted")
    p.add_argument("--rules", help="scripted mode: JSON rules file")
    p.add_argument("--model", default="test-model", help="model id listed by GET /v1/models")
    p.add_argument("--seed", type=int, default=0, help="tiny mode: initialisation seed")
    p.add_argument("--fail-first", type=int, default=0, help="the first N chat requests fail")
    p.add_argument("--fail-status", type=int, default=429, choices=[400, 401, 429, 500, 503])
    p.add_argument("--retry-after-ms", type=int, default=20, help="retry-after-ms header sent with failures")
    p.add_argument("--delay", type=float, default=0.0, help="seconds to sleep before each chat answer")
    p.add_argument("--echo-auth", action="store_true", help="echo the Authorization header in error messages")
    args = p.parse_args(argv)
    if args.mode == "scripted" and not args.rules:
        p.error("--mode scripted needs --rules FILE")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    server = ChatServer((args.host, args.port), args)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
