"""A stand-in for vLLM's OpenAI-compatible server (tests/test_serve.py): run as ``python -m stand_in_openai_server
--config serve.yaml`` in place of ``vllm.entrypoints.openai.api_server``, it serves ``/health``, ``/metrics`` (vLLM's
spec-decode counters, Prometheus text) and ``/v1/chat/completions`` (JSON, or server-sent events with
``stream: true``) on serve.yaml's port. Each answer is ``STAND_IN_TEXTS``' text for the last user turn (a JSON file:
content -> text), and each request adds ``STAND_IN_DRAFTS`` drafts and ``STAND_IN_ACCEPTED`` accepted tokens to the
counters. ``STAND_IN_FAIL``: print that line to stderr and exit 1 before serving (a server that dies while starting).
"""
from __future__ import annotations

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

COUNTS = {"drafts": 0, "accepted": 0}


def metrics_text() -> str:
    lines = []
    for name, key in (("vllm:spec_decode_num_drafts", "drafts"), ("vllm:spec_decode_num_accepted_tokens", "accepted")):
        lines += [f"# TYPE {name}_total counter", f'{name}_total{{engine="0",model_name="m"}} {COUNTS[key]}.0']
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/metrics":
            self._send(200, metrics_text().encode(), "text/plain")
        else:
            self._send(404, b"{}")

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = [m["content"] for m in req["messages"] if m["role"] == "user"][-1]
        texts = json.loads(open(os.environ["STAND_IN_TEXTS"]).read())
        text = texts.get(user, "?")[: 4 * req.get("max_tokens", 16)]
        drafts, accepted = int(os.environ["STAND_IN_DRAFTS"]), int(os.environ["STAND_IN_ACCEPTED"])
        COUNTS["drafts"] += drafts
        COUNTS["accepted"] += accepted
        usage = {"prompt_tokens": 5, "completion_tokens": len(text.split()), "total_tokens": 5 + len(text.split())}
        spec = {"mean_acceptance_length": 1 + accepted / drafts, "draft_acceptance_rate": accepted / drafts,
                "acceptance_histogram": [drafts - accepted, accepted], "num_spec_steps": drafts,
                "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafts, "num_spec_tokens": 1}
        base = {"id": "x", "created": int(time.time()), "model": req["model"]}
        if not req.get("stream"):
            body = {**base, "object": "chat.completion", "usage": usage, "metrics": {"speculative_decoding": spec},
                    "choices": [{"index": 0, "finish_reason": "length",
                                 "message": {"role": "assistant", "content": text}}]}
            return self._send(200, json.dumps(body).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = {**base, "object": "chat.completion.chunk"}
        events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        half = len(text) // 2
        events += [{**chunk, "choices": [{"index": 0, "delta": {"content": part}}]}
                   for part in (text[:half], text[half:]) if part]
        events.append({**chunk, "choices": [], "usage": usage, "metrics": {"speculative_decoding": spec}})
        for e in events:
            self.wfile.write(f"data: {json.dumps(e)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


if __name__ == "__main__":
    if os.environ.get("STAND_IN_FAIL"):
        print(os.environ["STAND_IN_FAIL"], file=sys.stderr)
        sys.exit(1)
    opts = yaml.safe_load(open(sys.argv[sys.argv.index("--config") + 1]))
    ThreadingHTTPServer(("", int(opts["port"])), Handler).serve_forever()
