"""The sim's HTTP server: an OpenAI- and Anthropic-compatible backend with exact timing and faults.

One concept, the simulated backend's HTTP surface (about 530 lines): generation, its
timing and faults, and the engine endpoints clients and harnesses call beside it
(tokenize, embeddings, vLLM's scoring API), which share its readiness and its counters.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from swaplab.sim import chunks, messages, responses
from swaplab.sim.chunks import StreamEncoder, whole_answer
from swaplab.sim.messages import MessagesStreamEncoder, whole_message
from swaplab.sim.responses import ResponsesStreamEncoder, whole_response
from swaplab.sim.request import BadRequest, Kind, Plan, json_body, messages_prompt_tokens, plan_request
from swaplab.sim.personality import Personality
from swaplab.sim.personality import check_settings as check_engine_settings
from swaplab.sim.script import ScriptedReply
from swaplab.sim.settings import SimSettings
from swaplab.sim.sglang import SglangSleeper
from swaplab.sim.sleep import GARBAGE, Sleeper
from swaplab.sim.tabby import TabbySleeper
from swaplab.sim.vllm import VllmSleeper
from swaplab.sim.slots import Slots
from swaplab.sim.tokens import answer_text, prompt_words

# Request bodies can be long prompts; the router forwards at least 64 MiB.
MAX_BODY_BYTES = 256 * 1024 * 1024
# An unpaced stream yields to the event loop this often, so concurrent streams
# interleave and a disconnect is noticed even on a very long answer.
UNPACED_YIELD_EVERY = 16

# Each engine's way to sleep (its own module over sim/sleep.py's `Sleeper`).
SLEEPERS: dict[str, type[Sleeper]] = {"vllm": VllmSleeper, "sglang": SglangSleeper, "tabby": TabbySleeper}

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
ID_PREFIXES: dict[Kind, str] = {
    "chat": "chatcmpl-sim", "completion": "cmpl-sim", "messages": "msg_sim", "responses": "resp_sim",
}


@dataclass
class SimStats:
    """Generation requests the sim accepted (not those refused with 400 or 503)."""

    requests: int = 0
    active: int = 0
    completed: int = 0
    cancelled: int = 0


class Sim:
    """One simulated inference server; owns its stats and its token budget."""

    def __init__(self, settings: SimSettings):
        self.settings = settings
        self.stats = SimStats()
        self._loop = asyncio.get_running_loop()
        self._ready_at = self._loop.time() + settings.load_seconds
        self._ready = settings.load_seconds == 0
        self._ttft = settings.ttft_ms / 1000
        self._interval = 1 / settings.tokens_per_second if settings.tokens_per_second else 0.0
        self._emitted = 0
        self._crash_after = settings.crash_after_tokens or None
        self._ids = itertools.count(1)
        self._last_request: dict[str, Any] | None = None
        # Set while no generation is in flight: what a sleep waits for.
        self._idle = asyncio.Event()
        self._idle.set()
        facts = check_engine_settings(settings)
        self._personality = Personality(settings, facts) if facts is not None else None
        # What the engine writes into a stream that stays silent (llama.cpp's ":" comment); b"": nothing.
        self._ping = facts.stream.ping.event.encode() if facts is not None and facts.stream.ping is not None else b""
        sleeper = SLEEPERS.get(settings.engine)
        self._sleeper: Sleeper | None = (
            sleeper(settings, workload=self, facts=facts)
            if sleeper is not None and facts is not None and self._serves_sleep(facts) else None
        )
        self._abort_epoch = 0  # abort_all() moves it on: a generation begun in an older one ends
        self._slots = Slots(
            parallel=settings.parallel,
            save_path=Path(settings.slot_save_path) if settings.slot_save_path is not None else None,
            fault=settings.slot_fault,
        )
        self._prefill_interval = 1 / settings.prefill_tokens_per_second if settings.prefill_tokens_per_second else 0.0
        # Off by default: a plain sim answers as OpenAI does, and what a router reads of llama.cpp's
        # timings (cached tokens) must not change every test that counts tokens through a sim.
        self._timings = (
            settings.timings or settings.slot_save_path is not None or settings.parallel != 1
            or settings.prefill_tokens_per_second > 0
        )

    def _serves_sleep(self, facts: Any) -> bool:
        """Whether the engine, as started, serves its sleep calls at all (vLLM: only in dev mode)."""
        assert self._personality is not None
        calls = facts.sleep.calls if facts.sleep is not None else {}
        return all(self._personality.has_route(call.method, call.path) for call in calls.values())

    def app(self) -> web.Application:
        """The aiohttp application; serve it with handler_cancellation=True. In an engine's personality,
        only the routes that engine serves, behind its key."""
        personality = self._personality
        app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[personality.auth_middleware] if personality else [])
        routes = [
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completions),
            web.post("/v1/messages", self._messages),
            web.post("/v1/responses", self._responses),
            web.post("/v1/messages/count_tokens", self._count_tokens),
            web.get("/health", self._health),
            web.get("/v1/models", self._models),
            web.post("/tokenize", self._tokenize),
            web.post("/v1/embeddings", self._embeddings),
            web.get("/tokenizer_info", self._tokenizer_info),
            web.post("/detokenize", self._detokenize),
            web.get("/props", self._props),
            *self._slots.routes(),
            *(self._sleeper.routes() if self._sleeper is not None else ()),
        ]
        app.router.add_routes([
            route for route in routes
            if personality is None or route.path.startswith("/sim/") or personality.has_route(route.method, route.path)
        ])
        app.router.add_get("/sim/stats", self._stats)
        app.router.add_get("/sim/last-request", self._last)
        app.router.add_get("/sim/ws", self._websocket)
        return app

    def abort_all(self) -> None:
        """End every generation in flight at its next token, as an engine's abort does."""
        self._abort_epoch += 1

    def is_ready(self) -> bool:
        """Whether the simulated model has finished loading."""
        if not self._ready and self._loop.time() >= self._ready_at:
            self._ready = True
        return self._ready

    def busy(self) -> bool:
        """Whether a generation request is in flight (for the sleeper)."""
        return self.stats.active > 0

    async def until_idle(self) -> None:
        """Return once no generation request is in flight."""
        await self._idle.wait()

    # -- generation --------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await json_body(request)
        except BadRequest:
            body = None  # not JSON (a form, say): _generate records it and answers as it does
        if isinstance(body, dict) and body.get("echo") is True and body.get("logprobs"):
            return self._echo(body)
        return await self._generate(request, "completion")

    def _echo(self, body: dict[str, Any]) -> web.Response:
        """vLLM's `echo` with `logprobs`: every prompt token's logprob (what lm-eval scores multiple choice by),
        in the sim's character tokens, each against one other candidate; the same for the same text."""
        if not self.is_ready():
            return _openai_error(503, self._loading_message())
        prompts = body.get("prompt")
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts:
            return _openai_error(400, "'prompt' must be a string, token ids, or a list of either")
        choices = []
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                tokens = [ord(character) for character in prompt]
            elif isinstance(prompt, list) and all(isinstance(token, int) and 0 <= token < 0x110000 for token in prompt):
                tokens = list(prompt)
            else:
                return _openai_error(400, f"prompt {index}: a string or a list of character token ids")
            tokens.append(ord("."))  # the one token generated after the prompt
            texts = [chr(token) for token in tokens]
            logprobs: list[float | None] = [None]
            top: list[dict[str, float] | None] = [None]
            for position in range(1, len(tokens)):
                own = _logprob(f"{tokens[position - 1]}:{tokens[position]}")
                other = _logprob(f"other:{position}:{tokens[position]}")
                logprobs.append(own)
                top.append({texts[position]: own, "\u2400": other})
            choices.append({
                "index": index, "text": "".join(texts), "finish_reason": "length",
                "logprobs": {"tokens": texts, "token_logprobs": logprobs, "top_logprobs": top,
                             "text_offset": list(range(len(texts)))},
            })
        prompt_tokens = sum(len(choice["logprobs"]["tokens"]) - 1 for choice in choices)
        return web.json_response({
            "id": f"cmpl-sim-{next(self._ids)}", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or self.settings.model, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(choices),
                      "total_tokens": prompt_tokens + len(choices)},
        })

    async def _tokenizer_info(self, request: web.Request) -> web.Response:
        """vLLM's `/tokenizer_info`, for the sim's character tokens (`/tokenize` with `prompt`, `/detokenize`)."""
        return web.json_response({"tokenizer_class": "sim-characters", "eos_token": "\u2403", "bos_token": None,
                                  "pad_token": None, "chat_template": None, "model_max_length": 1 << 20})

    async def _detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _openai_error(400, str(bad))
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < 0x110000 for t in tokens):
            return _openai_error(400, "'tokens' must be a list of the sim's character token ids")
        return web.json_response({"prompt": "".join(chr(token) for token in tokens)})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "messages")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "responses")

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        started = self._loop.time()
        error = partial(_error_answer, kind)
        if not self.is_ready():
            return error(503, self._loading_message())
        try:
            # What a router sent (its filters, its rewritten `model`), for tests to read back:
            # the parsed JSON, or the raw text of a body that is not JSON.
            raw = await request.read()
            self._last_request = {
                "path": request.path_qs, "content_type": request.headers.get("Content-Type", ""),
                "body": raw.decode(errors="replace"),
            }
            body = await json_body(request)
            self._last_request["body"] = body
            plan = plan_request(
                kind,
                body,
                default_model=self.settings.model,
                default_max_tokens=self.settings.default_max_tokens,
                script=self.settings.script,
            )
        except BadRequest as bad:
            return error(400, str(bad), bad.param)
        refused = self._personality.unknown_model(body.get("model")) if self._personality is not None else None
        if refused is not None:
            return refused
        try:
            ping_every = self._personality.ping_interval(body) if self._personality is not None else 0.0
        except ValueError as bad:
            return error(400, str(bad))
        if self._sleeper is not None:
            # vLLM asleep or SGLang paused: the request waits for the scheduler; TabbyAPI unloaded: refused.
            refused = await self._sleeper.admit(body)
            if refused is not None:
                return refused
            if self._sleeper.garbage() and plan.kind == "chat":
                words = " ".join([GARBAGE] * max(1, plan.completion_tokens))
                plan = replace(plan, reply=ScriptedReply(content=words, finish_reason=plan.finish_reason))
        try:
            slot, cached = self._slots.begin(plan.prompt, plan.id_slot)
        except BadRequest as bad:
            return error(400, str(bad))
        plan = replace(plan, cache_tokens=cached, timings=self._timings)
        # Only the prompt tokens the slot did not hold are prefilled; the first token waits for them.
        started += (plan.prompt_tokens - cached) * self._prefill_interval

        request_id = f"{ID_PREFIXES[kind]}{next(self._ids)}"
        created = int(time.time())
        stats = self.stats
        stats.requests += 1
        stats.active += 1
        self._idle.clear()
        finished = False
        # A client that goes away cancels this task (handler_cancellation), or makes
        # a write fail; either way the request ends here as cancelled.
        try:
            if plan.stream:
                response = web.StreamResponse(headers=SSE_HEADERS)
                try:
                    await response.prepare(request)
                    await self._stream(response, plan, request_id, created, started, self._abort_epoch, ping_every)
                    finished = True
                except ConnectionResetError:
                    pass  # aiohttp finishes a response whose client left quietly
                return response
            epoch = self._abort_epoch
            for index in range(plan.completion_tokens):
                if not await self._next_token(started, index, epoch):
                    plan = replace(plan, finish_reason="abort", completion_tokens=index)
                    break
                self._count_token()
            finished = True
            if kind == "messages":
                return web.json_response(whole_message(plan, request_id))
            if kind == "responses":
                return web.json_response(whole_response(plan, request_id, created))
            return web.json_response(whole_answer(plan, request_id, created))
        finally:
            # A slot keeps the answer of a request that finished; of one cut short, only its prompt.
            self._slots.end(slot, _answer_tokens(plan) if finished else ())
            stats.active -= 1
            if stats.active == 0:
                self._idle.set()
            if finished:
                stats.completed += 1
            else:
                stats.cancelled += 1

    async def _stream(
        self, response: web.StreamResponse, plan: Plan, request_id: str, created: int, started: float, epoch: int,
        ping_every: float = 0.0,
    ) -> None:
        def encoder_of(plan: Plan) -> StreamEncoder | MessagesStreamEncoder | ResponsesStreamEncoder:
            if plan.kind == "messages":
                return MessagesStreamEncoder(plan, request_id)
            if plan.kind == "responses":
                return ResponsesStreamEncoder(plan, request_id, created)
            return StreamEncoder(plan, request_id, created)

        encoder = encoder_of(plan)
        if isinstance(encoder, ResponsesStreamEncoder):
            await response.write(encoder.preamble())  # vLLM's response.created and .in_progress: before any token
        opening = encoder.opening()  # goes out with the first token: it is part of TTFT
        # A scripted reply (chat only) has its events built up front, one per word; the usual answer's go on the fly.
        scripted = (
            encoder.scripted(plan.reply, request_id)
            if plan.reply is not None and isinstance(encoder, StreamEncoder)
            else None
        )
        count = len(scripted) if scripted is not None else plan.completion_tokens
        for index in range(count):
            if ping_every > 0:
                await self._ping_until(response, self._due(started, index), ping_every)
            if not await self._next_token(started, index, epoch):
                # Aborted by the engine (a vLLM sleep, a TabbyAPI unload): it ends here, saying so.
                encoder = encoder_of(replace(plan, finish_reason="abort", completion_tokens=index))
                count = index
                break
            event = scripted[index] if scripted is not None else encoder.token(index)
            await response.write(event if index else opening + event)
            self._count_token()
        closing = encoder.closing()
        if count == 0:
            if ping_every > 0:
                await self._ping_until(response, self._due(started, 0), ping_every)
            await self._pace(started, 0)
            closing = opening + closing
        await response.write(closing)
        await response.write_eof()

    async def _next_token(self, started: float, index: int, epoch: int) -> bool:
        """Wait for output token `index`: its pace, and an engine that froze its requests (vLLM's
        `mode=keep`, SGLang's pause); False when the engine aborted the request meanwhile."""
        await self._pace(started, index)
        if self._sleeper is not None:
            while not self._sleeper.flowing.is_set() and self._abort_epoch == epoch:
                await self._sleeper.flowing.wait()
        return self._abort_epoch == epoch

    def _due(self, started: float, index: int) -> float:
        """When output token `index` of a request received at `started` is due (the loop's clock)."""
        return started + self._ttft + index * self._interval

    async def _ping_until(self, response: web.StreamResponse, due: float, every: float) -> None:
        """A ping after every `every` seconds of silence until `due`, as llama.cpp's server writes its
        `sse_ping_interval` comments: during a long prefill, and between tokens slower than that."""
        while due - self._loop.time() > every:
            await asyncio.sleep(every)
            await response.write(self._ping)

    async def _pace(self, started: float, index: int) -> None:
        # Against a deadline, not by cumulative sleeps, so a stream never drifts.
        delay = self._due(started, index) - self._loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif index % UNPACED_YIELD_EVERY == UNPACED_YIELD_EVERY - 1:
            await asyncio.sleep(0)

    def _count_token(self) -> None:
        self._emitted += 1
        if self._emitted == self._crash_after:
            # A backend crash: no clean end of stream, no cleanup, no flush of anything.
            sys.stderr.write(f"sim: crashing after {self._emitted} tokens\n")
            sys.stderr.flush()
            os._exit(1)

    # -- everything else ---------------------------------------------------

    def _loading_message(self) -> str:
        return f"model {self.settings.model} is loading"

    async def _health(self, request: web.Request) -> web.Response:
        if self.settings.health_before_ready or self.is_ready():
            return web.json_response({"status": "ok"})
        return _openai_error(503, "Loading model")

    async def _models(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return _openai_error(503, self._loading_message())
        model = {"id": self.settings.model, "object": "model", "created": 0, "owned_by": "swaplab-sim"}
        return web.json_response({"object": "list", "data": [model]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return _openai_error(503, self._loading_message())
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _openai_error(400, str(bad))
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if isinstance(prompt, str):  # vLLM's shape: a token per character, which /detokenize reverses
            return web.json_response({"tokens": [ord(character) for character in prompt], "count": len(prompt)})
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, str):
            return _openai_error(400, "'content' (llama.cpp's) or 'prompt' (vLLM's) must be a string")
        # One token per word, with a stable id per word.
        tokens = [zlib.crc32(word.encode()) & 0x7FFF for word in content.split()]
        return web.json_response({"tokens": tokens})

    async def _embeddings(self, request: web.Request) -> web.Response:
        """OpenAI's embeddings: a unit vector per input, the same for the same text (`dimensions`, else 8)."""
        if not self.is_ready():
            return _openai_error(503, self._loading_message())
        try:
            body = await json_body(request)
        except BadRequest as bad:
            return _openai_error(400, str(bad))
        self._last_request = {"path": request.path_qs, "content_type": request.headers.get("Content-Type", ""),
                              "body": body}
        inputs = body.get("input") if isinstance(body, dict) else None
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(text, str) for text in inputs):
            return _openai_error(400, "'input' must be a string or a non-empty list of strings")
        dimensions = body.get("dimensions", 8)
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or not 0 < dimensions <= 4096:
            return _openai_error(400, "'dimensions' must be a whole number from 1 to 4096")
        data = [{"object": "embedding", "index": index, "embedding": _unit_vector(text, dimensions)}
                for index, text in enumerate(inputs)]
        words = sum(len(prompt_words(text)) for text in inputs)
        return web.json_response({
            "object": "list", "model": body.get("model") or self.settings.model, "data": data,
            "usage": {"prompt_tokens": words, "total_tokens": words},
        })

    async def _count_tokens(self, request: web.Request) -> web.Response:
        if not self.is_ready():
            return _anthropic_error(503, self._loading_message())
        try:
            input_tokens = messages_prompt_tokens(await json_body(request))
        except BadRequest as bad:
            return _anthropic_error(400, str(bad))
        return web.json_response({"input_tokens": input_tokens})

    async def _stats(self, request: web.Request) -> web.Response:
        sleep_stats = self._sleeper.stats() if self._sleeper is not None else {}
        return web.json_response({**asdict(self.stats), **self._slots.stats(), **sleep_stats})

    async def _last(self, request: web.Request) -> web.Response:
        if self._last_request is None:
            return _openai_error(404, "no generation request yet")
        return web.json_response(self._last_request)

    async def _props(self, request: web.Request) -> web.StreamResponse:
        """`GET /props` as a websocket: the echo of `/sim/ws`, where a router relays llama-swap's
        `GET /props?model=` upgrades. A plain GET stays 404: nothing should take the sim for llama.cpp."""
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return _openai_error(404, "the sim answers /props only as a websocket")
        return await self._websocket(request)

    async def _websocket(self, request: web.Request) -> web.WebSocketResponse:
        """An echo: each text or binary frame comes back as sent; `close CODE` closes with that code."""
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for message in socket:
            if message.type is WSMsgType.TEXT:
                if message.data.startswith("close "):
                    await socket.close(code=int(message.data.split()[1]), message=b"asked to")
                    break
                await socket.send_str(message.data)
            elif message.type is WSMsgType.BINARY:
                await socket.send_bytes(message.data)
        else:  # the client closed: say how, where a router's log shows it
            print(f"sim: websocket closed by the client with code {socket.close_code}", file=sys.stderr, flush=True)
        return socket


def _answer_tokens(plan: Plan) -> list[str]:
    # What a follow-up sends back as the assistant's turn: a scripted reply's content, else the tok words.
    if plan.reply is not None:
        return prompt_words(plan.reply.content)
    return prompt_words(answer_text(plan.completion_tokens))


def _openai_error(status: int, message: str) -> web.Response:
    return web.json_response(chunks.error_body(status, message), status=status)


def _anthropic_error(status: int, message: str) -> web.Response:
    return web.json_response(messages.error_body(status, message), status=status)


def _error_answer(kind: Kind, status: int, message: str, param: str | None = None) -> web.Response:
    """An error in the wire format of the request's kind; `param` where the format names the field (Responses)."""
    if kind == "messages":
        return _anthropic_error(status, message)
    if kind == "responses":
        return web.json_response(responses.error_body(status, message, param), status=status)
    return _openai_error(status, message)


def _unit_vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for `text`: crc32 of the text and each position, scaled to length 1."""
    values = [(zlib.crc32(f"{index}:{text}".encode()) / 0xFFFFFFFF) * 2 - 1 for index in range(dimensions)]
    norm = sum(value * value for value in values) ** 0.5 or 1.0
    return [round(value / norm, 6) for value in values]


def _logprob(key: str) -> float:
    """A deterministic logprob in [-4, 0) for `key`."""
    return -(zlib.crc32(key.encode()) % 1000 + 1) / 250
