"""A request body's size, limited before it is read: a call to the API with hundreds of megabytes of "text" would
otherwise be read and parsed whole before any check of the text could refuse it. Uploads have their own limit
(`choices.MAX_FILE_SIZE`, enforced by Gradio on its upload route), so that route is left to it."""
from __future__ import annotations

import json

UPLOAD_ROUTE = "/gradio_api/upload"   # Gradio's upload route, limited by its max_file_size (after any root path)


def body_limit_bytes(max_input_tokens: int) -> int:
    """Room for the longest text a request may hold (8 characters a token, up to 4 bytes each, doubled for JSON's
    escapes) and the rest of the request, with 1 MB to spare."""
    return 2**20 + 64 * max_input_tokens


class BodyLimit:
    """ASGI middleware: an HTTP request whose body is over `max_bytes` gets 413 before the app reads it: at once by
    its Content-Length, or, sent without one, once the count passes it (such a body is read here, at most `max_bytes`
    of it, and handed to the app whole)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path", "").rstrip("/").endswith(UPLOAD_ROUTE):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        try:
            length = int(headers.get(b"content-length", b"0"))
        except ValueError:
            length = 0
        if length > self.max_bytes:
            await self._refuse(send)
            return
        if b"content-length" in headers or b"chunked" not in headers.get(b"transfer-encoding", b""):
            await self.app(scope, receive, send)
            return
        chunks, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":   # the client left
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            more = message.get("more_body", False)
            if seen > self.max_bytes:
                await self._refuse(send)
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        body = json.dumps({"error": f"the request is larger than {self.max_bytes / 2**20:.1f} MB: shorten the "
                                    "text (audio goes as an uploaded file)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
