"""What the page's browser runs besides Gradio: one script, put ahead of Gradio's own in the page it serves.

Gradio 6.31's page keeps its initial "Loading..." screen's status tracker alive after the screen is gone: its
elapsed-time timer asks the browser for an animation frame at every frame, for as long as the page is open, and
the loader's four springs keep stepping. An idle page so asks for a frame at the display's rate and takes a share
of a core, where the browser may share the cores with the timed runs (the CLI pays nothing of it). A status
tracker's timer (a frame callback that turns performance.now() into seconds) now ticks once a second instead: a
timer on screen still moves, and the idle page asks for about a third of the frames.
The loader's springs are out of reach from outside Gradio.

Gradio's own `head=` is added to the page by its scripts after they have taken `requestAnimationFrame`, too late to
change what they call; so `EarlyScript` puts this one first in the served HTML.
"""
from __future__ import annotations

TIMER_PERIOD_MS = 1000

TIMER_THROTTLE = f"""<script>
(() => {{
  const frame = window.requestAnimationFrame.bind(window);
  const cancel = window.cancelAnimationFrame.bind(window);
  const isTimer = (callback) => /performance\\.now\\(\\)[\\s\\S]*\\/1e3/.test(String(callback));
  window.requestAnimationFrame = (callback) => isTimer(callback)
    ? -window.setTimeout(() => callback(performance.now()), {TIMER_PERIOD_MS}) : frame(callback);
  window.cancelAnimationFrame = (id) => (id < 0 ? window.clearTimeout(-id) : cancel(id));
}})();
</script>"""


class EarlyScript:
    """ASGI middleware: `script` goes first in the <head> of every HTML page served, before any of the page's own
    scripts. Anything that is not an uncompressed HTML response passes through untouched."""

    def __init__(self, app, script: str = TIMER_THROTTLE):
        self.app = app
        self.script = script.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, chunks = None, []

        async def send_page(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = {key.lower(): value for key, value in message.get("headers", [])}
                if headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers:
                    start = message   # held back until the body is complete
                    return
            elif message["type"] == "http.response.body" and start is not None:
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = b"".join(chunks).replace(b"<head>", b"<head>" + self.script, 1)
                headers = [(key, value) for key, value in start.get("headers", []) if key.lower() != b"content-length"]
                await send({**start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, send_page)
