"""The early script: first in the served page's <head>, and nothing else changed."""
import asyncio

from assistgen.app.frontend import TIMER_THROTTLE, EarlyScript


def serve(app, path="/"):
    """Run an ASGI app through EarlyScript for one GET; return (status, headers, body)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)
    asyncio.run(EarlyScript(app)({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def responder(content_type: bytes, parts: list[bytes], extra=()):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(sum(map(len, parts))).encode()), *extra]})
        for i, part in enumerate(parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})
    return app


def test_the_script_goes_first_in_the_head_of_an_html_page_sent_in_parts():
    page = [b"<!doctype html><html><head><script type='module' src='gradio.js'>", b"</script></head><body>x</body>",
            b"</html>"]
    status, headers, body = serve(responder(b"text/html; charset=utf-8", page))
    assert status == 200
    assert body.startswith(b"<!doctype html><html><head>" + TIMER_THROTTLE.encode() + b"<script type='module'")
    assert body.endswith(b"<body>x</body></html>")
    assert int(headers[b"content-length"]) == len(body)


def test_other_responses_pass_through_untouched():
    json_body = [b'{"head": "<head>"}']
    assert serve(responder(b"application/json", json_body))[2] == json_body[0]
    compressed = [b"\x1f\x8b<head>"]
    assert serve(responder(b"text/html", compressed, [(b"content-encoding", b"br")]))[2] == compressed[0]


def test_the_served_page_carries_it(tiny_app):
    import urllib.request
    url, _ = tiny_app
    html = urllib.request.urlopen(url).read().decode()
    assert html.index("isTimer") < html.index('type="module"')
