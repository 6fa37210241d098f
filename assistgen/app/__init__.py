"""What the web app and its API do with a request: validation, the streamed worker, the HTML. No Gradio here."""
