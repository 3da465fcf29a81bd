"""The server's pure ASGI middlewares: the response count by status code.

Pure ASGI (a callable around the app, not Starlette's `BaseHTTPMiddleware` / `@app.middleware("http")`): that
kind of middleware hands the route a receive channel of its own, on which `Request.is_disconnected()` never sees the
client leave before the response is sent, so a non-streamed request decoded to its end after its client had gone.
These only watch the messages that pass, and leave the route's receive channel as the server gives it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pasta.serving.metrics import ServingMetrics


class CountResponses:
    """Count the answers of the OpenAI routes (`/v1/...`) by status code, as their response starts."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)
