"""The server's pure ASGI middlewares: the response count by status code, and the cap on a request body's size.

Pure ASGI (a callable around the app, not Starlette's `BaseHTTPMiddleware` / `@app.middleware("http")`): that
kind of middleware hands the route a receive channel of its own, on which `Request.is_disconnected()` never sees the
client leave before the response is sent, so a non-streamed request decoded to its end after its client had gone.
These only watch the messages that pass, and leave the route's receive channel as the server gives it.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pasta.serving.errors import error_response
from pasta.serving.metrics import ServingMetrics

# The scope key a streamed answer sets when its client left before the answer was done (see `mark_client_gone`).
_CLIENT_GONE = "pasta.client_gone"


def mark_client_gone(scope: Scope) -> None:
    """Say that this request's client left before its answer was done: it counts as 499, whatever status its
    response started with (a stream starts with 200 before its first event)."""
    scope[_CLIENT_GONE] = True


class CountResponses:
    """Count the answers of the OpenAI routes (`/v1/...`) by status code, once each response has ended.

    A stream's status line is sent with its first event, before anyone knows how it ends: a stream whose client
    left (`mark_client_gone`, or a write into the closed connection) counts as 499, as a non-streamed answer whose
    client left does, and one that broke off on the server's side after its start counts as 500."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except (OSError, ClientDisconnect):  # a write into a connection the client closed
            mark_client_gone(scope)
            raise
        except Exception:
            # Broke off after its start, or before it: Starlette's outermost middleware, outside this one, answers
            # the exception with a 500 that this one never sees.
            status = 500
            raise
        except BaseException:  # cancelled: no answer goes out after it
            if status is not None:
                status = 500
            raise
        finally:
            if status is not None:
                self.metrics.requests.labels("499" if scope.get(_CLIENT_GONE) else str(status)).inc()


class LimitBodySize:
    """Answer 413 (OpenAI's error body) to a request whose body is over `max_body_bytes`, before the app parses it.

    A declared content-length is checked before anything is read; a body sent in chunks without one is read up to
    the cap here, then handed on to the app.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                await self._too_large(scope, receive, send, f"{int(declared)} bytes")
                return
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        num_bytes = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client left: the app sees it as it would have
            num_bytes += len(message.get("body", b""))
            if num_bytes > self.max_body_bytes:
                await self._too_large(scope, receive, send, f"over {self.max_body_bytes} bytes")
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        message = (f"the request body is {size}; this server takes at most {self.max_body_bytes} "
                   "(limits.max_body_bytes)")
        await error_response(413, message, code="request_too_large")(scope, receive, send)
