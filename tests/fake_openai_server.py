"""A FAKE OpenAI-compatible server for testing the HTTP engine's mechanics only: error handling (refused,
5xx, cut streams, timeouts, dropped connections) and the stream shapes a real server is hard to make send on
demand (reasoning then an answer, tool calls, the Responses API's events). It is never evidence that the
engine works with a real server; tests/test_openai_engine.py runs a real `vllm serve` for that."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: lets us cut a stream

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        if self.path.endswith("/health") and self.server.health is not None:
            self.server.health_calls += 1
            if self.server.health_calls > 1 and self.server.slow_health > 0:  # too busy to answer at once
                self.server.slow_health -= 1
                time.sleep(self.server.slow_health_s)
            if self.server.health_calls > 1 and self.server.dropped_health > 0:  # closed, no answer
                self.server.dropped_health -= 1  # as a keep-alive connection closed while reused looks
                self.close_connection = True
                return
            self.send_response(self.server.health)  # 503: vLLM's answer once its engine core is dead
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.endswith("/models"):
            self._json({"data": [{"id": "fake", "max_model_len": 2048}]})
        elif self.path in self.server.pages:  # e.g. /metrics text written for a test
            data = self.server.pages[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.send_error(404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.refuse_token_ids and isinstance(body.get("prompt"), list):
            self.send_error(422, "prompt must be a string")  # as TGI's OpenAI endpoint answers token ids
            return
        if isinstance(body.get("prompt"), list) and max(body["prompt"], default=0) >= self.server.vocab_size:
            self.send_error(400, "token id out of vocabulary")  # as vLLM answers ids its model has no row for
            return
        chat, responses = "messages" in body, self.path.endswith("/responses")
        length = (len(body["messages"][-1]["content"].split()) if chat else len(body["input"].split()) if responses
                  else len(body["prompt"]))
        fault = self.server.faults.get(length, "ok")
        self.server.auth.append(self.headers.get("Authorization"))
        self.server.prompts.append(body["messages"][-1]["content"] if chat else body["input"] if responses
                                   else body["prompt"])
        if fault == "drop" or (fault == "drop once" and length not in self.server.dropped):
            self.server.dropped.add(length)  # closed, no answer: as a keep-alive connection
            self.close_connection = True  # the server closed as it was reused looks to the client
            return
        if fault == "500":
            self.send_error(500, "boom")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if fault == "pings":  # queued for 3 s, kept alive by SSE comments every 0.4 s (as TGI's axum server does)
            for _ in range(8):
                time.sleep(0.4)
                try:
                    self.wfile.write(b":\n\n")
                    self.wfile.flush()
                except OSError:  # the client gave up on it
                    return
        if fault == "hold":  # busy for hold_s before its first token: requests that stay in flight a while
            time.sleep(self.server.hold_s)
        if fault == "empty":  # ended at once, no token: as a server that aborted the request answers
            self.wfile.write(b'data: {"choices": [{"index": 0, "text": "", "token_ids": [], "finish_reason": "abort"}]}\n\n')
            self.wfile.write(b"data: [DONE]\n\n")
            return
        if responses:
            self._responses(fault, length, body["max_output_tokens"])
            return
        if chat:  # vLLM's first chat chunk names the role and carries no token
            self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(body["max_tokens"]):
            if fault == "cut" and i == 2:
                return  # connection closes without [DONE]
            if fault == "slow":
                time.sleep(2.0)
            if chat:
                # "reasoning": the first half of the tokens streamed as reasoning, as vLLM with a reasoning
                # parser streams them (`delta.reasoning`); "reasoning only": all of them (max_tokens reached)
                thinking = fault == "reasoning only" or (fault == "reasoning" and i < body["max_tokens"] // 2)
                delta = {"reasoning" if thinking else "content": f"t{i} "}
                if fault == "tool call":  # the arguments of a function call, streamed with no content
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": f"t{i} "}}]}
                time.sleep(0.01)
                self._event({"choices": [{"index": 0, "delta": delta}]})
                continue
            self._event({"choices": [{"index": 0, "text": f"t{i} ", **({} if self.server.bare else {"token_ids": [i]})}]})
        if not self.server.bare:
            usage = {"choices": [], "usage": {"prompt_tokens": length, "completion_tokens": body["max_tokens"]}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def _responses(self, fault, length, n):
        """The Responses API's events as vLLM streams them (`event:` lines, then typed data): the answer's
        text deltas, reasoning first for "reasoning", and the usage in `response.completed`."""
        self._event({"type": "response.created", "response": {"id": "resp_1", "output": []}}, "response.created")
        for i in range(n):
            if fault == "cut" and i == 2:
                return
            if fault == "failed" and i == 1:  # the server gave up after a token, as a failed response says
                error = {"code": "server_error", "message": "boom"}
                self._event({"type": "response.failed", "response": {"id": "resp_1", "error": error}}, "response.failed")
                return
            thinking = fault == "reasoning" and i < n // 2
            kind = "response.reasoning_text.delta" if thinking else "response.output_text.delta"
            time.sleep(0.01)
            self._event({"type": kind, "delta": f" t{i}", "item_id": "x", "output_index": 0}, kind)
        usage = {"input_tokens": length, "output_tokens": n, "input_tokens_details": {"cached_tokens": 0}}
        self._event({"type": "response.completed", "response": {"id": "resp_1", "usage": usage}}, "response.completed")

    def _event(self, obj, name=None):
        if name:
            self.wfile.write(f"event: {name}\n".encode())
        self.wfile.write(f"data: {json.dumps(obj)}\n\n".encode())
        self.wfile.flush()

    def _json(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeServer:
    """`faults` maps a prompt length (a chat prompt's: its words) to "500", "cut", "slow", "empty", "hold" (its
    first token after `hold_s`), "drop" (the connection closed before any answer), "drop once" (so the first
    time only), or for chat "reasoning" (half the tokens streamed as reasoning first), "reasoning only" and
    "tool call" (the Responses API, at /v1/responses, takes "reasoning", "cut" and "failed"); every other
    request succeeds. `/health` answers 404 (a server without one) until `health` is set to a status."""

    def __init__(self, faults: dict[int, str]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.faults = faults
        self.httpd.health = None
        self.httpd.slow_health = 0  # this many /health answers after the first take slow_health_s
        self.httpd.slow_health_s = 0.5
        self.httpd.dropped_health = 0  # this many /health requests after the first get no answer at all
        self.httpd.health_calls = 0
        self.httpd.auth = []
        self.httpd.prompts = []  # every prompt received, in order: token ids, or text (a chat's last message)
        self.httpd.hold_s = 0.5  # how long a "hold" request waits before its first token
        self.httpd.dropped = set()  # prompt lengths whose request was closed without an answer
        self.httpd.pages = {}  # path -> body of a GET answered with 200
        self.httpd.refuse_token_ids = False  # answer token-id prompts with HTTP 422, as TGI does
        self.httpd.vocab_size = 1 << 31  # token ids from here on are refused with HTTP 400, as vLLM does
        self.httpd.bare = False  # stream text only: no token ids, no usage
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def set_health(self, status: int | None, slow: int = 0, dropped: int = 0) -> None:
        self.httpd.health, self.httpd.slow_health, self.httpd.health_calls = status, slow, 0
        self.httpd.dropped_health = dropped

    @property
    def auth_headers(self) -> list:
        return self.httpd.auth

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
