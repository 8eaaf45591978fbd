"""`npu-sandbox`: the whole chain told as a story on this machine (`cli`), with the real helm (`helm`)
and a real Prometheus (`prometheus`). The demo sits on top: nothing else in the sandbox imports it."""
