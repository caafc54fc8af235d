"""A minimal OpenAI-compatible streaming server built for speed: the upstream of benchmarks/ceiling.py.

A proxy's streaming ceiling can only be seen behind an upstream that is faster than it, so
this one is an asyncio Protocol with its own small HTTP/1.1 parser (uvloop's loop when
uvloop is importable), and every event it streams is prebuilt bytes:

  POST /v1/chat/completions  with "stream": true, `max_tokens` token events, one finish event
                             (finish_reason, usage) and `data: [DONE]`: max_tokens + 2
                             `data: ` events, each its own HTTP chunk. Without "stream": one
                             chat.completion with Content-Length.
  GET  /health               200 {"status": "ok"}
  GET  /v1/models            the one model (--model)
  GET  /stats                {"active", "started", "completed", "cancelled", "events"}: streams
                             now open, begun, ended whole, ended by the client; events written

Pacing: a request's `"x_chunks_per_second": R` (R > 0) streams its token events at R per
second, each at its own due time (start + i/R, so a late loop catches up rather than
drifting); absent or 0, the default of `--chunks-per-second` applies (0: unpaced). A paced
event is its own write, as an engine sends each token. An unpaced stream writes as fast as
the connection takes it: 8 events per turn of the event loop, stopping while the
transport's buffer is full, so one stream cannot starve the others and a slow reader holds
back only its own stream. Those 8 events go in one write (`--events-per-write 8`, the
default): written one by one, the upstream spent a system call per event and was itself
the limit of a proxy's ceiling on a 2-core machine (90-100% of a core), which is then not
the proxy's. `--events-per-write 1` writes them one by one.

    .venv/bin/python benchmarks/fastupstream.py --port 9000 [--model fast] [--chunks-per-second 0]
                                                [--events-per-write 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

try:
    import uvloop
except ImportError:  # optional: the stdlib loop is slower, not wrong
    uvloop = None

EVENTS_PER_TURN = 8  # unpaced: events written per stream per turn of the loop
WRITE_BUFFER_HIGH = 64 * 1024  # the transport's buffer above which an unpaced stream waits

STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def http_chunk(payload: bytes) -> bytes:
    """`payload` framed as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def plain_response(status: int, body: bytes, content_type: bytes = b"application/json", close: bool = False) -> bytes:
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}[status]
    return (
        b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n%b\r\n%b"
        % (status, reason, content_type, len(body), b"Connection: close\r\n" if close else b"", body)
    )


def error_body(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()


class Answers:
    """The prebuilt bytes of every answer, for one model name."""

    def __init__(self, model: str):
        self.model = model
        created = int(time.time())
        head = (
            f'data: {{"id":"chatcmpl-fast","object":"chat.completion.chunk","created":{created},'
            f'"model":{json.dumps(model)},"choices":[{{"index":0,'
        ).encode()
        self.token = http_chunk(head + b'"delta":{"content":"tok "},"logprobs":null,"finish_reason":null}]}\n\n')
        self._finish_head = head
        self.done = http_chunk(b"data: [DONE]\n\n") + LAST_CHUNK
        self.models = plain_response(200, json.dumps({
            "object": "list",
            "data": [{"id": model, "object": "model", "created": created, "owned_by": "fastupstream"}],
        }).encode())
        self.health = plain_response(200, b'{"status":"ok"}')

    def finish(self, tokens: int) -> bytes:
        """The finish event (finish_reason and usage), then [DONE] and the last chunk."""
        usage = f'"usage":{{"prompt_tokens":8,"completion_tokens":{tokens},"total_tokens":{tokens + 8}}}'.encode()
        event = self._finish_head + b'"delta":{},"logprobs":null,"finish_reason":"stop"}],%b}\n\n' % usage
        return http_chunk(event) + self.done

    def completion(self, tokens: int, close: bool) -> bytes:
        return plain_response(200, json.dumps({
            "id": "chatcmpl-fast", "object": "chat.completion", "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * tokens},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8},
        }).encode(), close=close)


class Stats:
    """What /stats reports; one instance, owned by the server."""

    def __init__(self) -> None:
        self.active = self.started = self.completed = self.cancelled = self.events = 0

    def as_json(self) -> bytes:
        return json.dumps({
            "active": self.active, "started": self.started, "completed": self.completed,
            "cancelled": self.cancelled, "events": self.events,
        }).encode()


class Stream:
    """One streamed answer on one connection: its token events, then the finish."""

    def __init__(self, connection: Connection, tokens: int, chunks_per_second: float, events_per_write: int):
        self.connection = connection
        self.tokens = tokens
        self.events_per_write = events_per_write
        self.sent = 0
        self.paused = False
        self.rate = chunks_per_second
        self.loop = asyncio.get_running_loop()
        self.started = self.loop.time()
        self.timer: asyncio.TimerHandle | asyncio.Handle | None = None

    def begin(self) -> None:
        self.connection.transport.write(STREAM_HEAD)
        if self.rate > 0:
            self.connection.transport.write(self.connection.answers.token)  # the first token at once, as engines do
            self.sent = 1
            self._next()
        else:
            self.pump()

    def pump(self) -> None:
        """Unpaced: a few events now, the rest on later turns while the transport takes them."""
        self.timer = None
        write = self.connection.transport.write
        token = self.connection.answers.token
        batch = min(EVENTS_PER_TURN, self.tokens - self.sent)
        sent = 0
        while sent < batch:
            events = min(self.events_per_write, batch - sent)
            write(token * events if events > 1 else token)
            sent += events
        self.sent += batch
        if self.sent >= self.tokens:
            self._finish()
        elif not self.paused:
            self.timer = self.loop.call_soon(self.pump)

    def tick(self) -> None:
        """Paced: every token event now due, each its own write."""
        self.timer = None
        # A hair of slack: the loop may run a timer a clock tick before its due time.
        due = min(self.tokens, int((self.loop.time() - self.started) * self.rate + 1e-3) + 1)
        write = self.connection.transport.write
        token = self.connection.answers.token
        while self.sent < due:
            write(token)
            self.sent += 1
        self._next()

    def _next(self) -> None:
        if self.sent >= self.tokens:
            self._finish()
        else:
            self.timer = self.loop.call_at(self.started + self.sent / self.rate, self.tick)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self.rate <= 0 and self.timer is None and self.sent < self.tokens:
            self.pump()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _finish(self) -> None:
        self.connection.transport.write(self.connection.answers.finish(self.tokens))
        self.connection.stream_ended(self, whole=True)


class Connection(asyncio.Protocol):
    """One client connection: requests read one at a time, kept alive unless asked to close."""

    def __init__(self, answers: Answers, stats: Stats, default_rate: float, events_per_write: int):
        self.answers = answers
        self.stats = stats
        self.default_rate = default_rate
        self.events_per_write = events_per_write
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.stream: Stream | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)

    def connection_lost(self, error: Exception | None) -> None:
        if self.stream is not None:
            self.stream.cancel()
            self.stream_ended(self.stream, whole=False)

    def pause_writing(self) -> None:
        if self.stream is not None:
            self.stream.pause()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.stream is None:
            self.serve_buffered()

    def serve_buffered(self) -> None:
        """Answer the requests whole in the buffer, until one starts a stream."""
        while self.stream is None and not self.transport.is_closing():
            request = self.take_request()
            if request is None:
                return
            self.answer(*request)

    def take_request(self) -> tuple[str, str, dict[str, str], bytes] | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            position = start
            while True:
                line_end = self.buffer.find(b"\r\n", position)
                if line_end < 0:
                    return None
                size = int(bytes(self.buffer[position:line_end]).split(b";")[0], 16)
                if size == 0:
                    if len(self.buffer) < line_end + 4:
                        return None
                    consumed = line_end + 4  # no trailers expected
                    break
                if len(self.buffer) < line_end + 2 + size + 2:
                    return None
                body += self.buffer[line_end + 2 : line_end + 2 + size]
                position = line_end + 2 + size + 2
        else:
            length = int(headers.get("content-length", "0"))
            if len(self.buffer) < start + length:
                return None
            body = self.buffer[start : start + length]
            consumed = start + length
        del self.buffer[:consumed]
        if headers.get("connection", "").lower() == "close":
            self.close_after = True
        return method, target.split("?", 1)[0], headers, bytes(body)

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        write = self.transport.write
        if path == "/health":
            write(self.answers.health)
        elif path in ("/v1/models", "/models"):
            write(self.answers.models)
        elif path == "/stats":
            write(plain_response(200, self.stats.as_json()))
        elif path in ("/v1/chat/completions", "/chat/completions"):
            if method != "POST":
                write(plain_response(405, error_body("POST only")))
            else:
                self.chat(body)
                return
        else:
            write(plain_response(404, error_body(f"no route {path}")))
        self.after_response()

    def chat(self, body: bytes) -> None:
        try:
            request = json.loads(body)
            tokens = int(request.get("max_tokens") or request.get("max_completion_tokens") or 16)
            rate = float(request.get("x_chunks_per_second") or self.default_rate)
        except (ValueError, TypeError, AttributeError) as error:
            self.transport.write(plain_response(400, error_body(f"not a chat request: {error}")))
            self.after_response()
            return
        if not request.get("stream"):
            self.transport.write(self.answers.completion(tokens, self.close_after))
            self.after_response()
            return
        self.stats.active += 1
        self.stats.started += 1
        self.stream = Stream(self, max(tokens, 1), rate, self.events_per_write)
        self.stream.begin()

    def stream_ended(self, stream: Stream, whole: bool) -> None:
        if self.stream is not stream:
            return
        self.stream = None
        self.stats.active -= 1
        self.stats.events += stream.sent + (2 if whole else 0)
        if whole:
            self.stats.completed += 1
            self.after_response()
            if not self.transport.is_closing():
                self.serve_buffered()
        else:
            self.stats.cancelled += 1

    def after_response(self) -> None:
        if self.close_after:
            self.transport.close()


async def serve(host: str, port: int, model: str, default_rate: float, events_per_write: int) -> None:
    loop = asyncio.get_running_loop()
    answers, stats = Answers(model), Stats()
    server = await loop.create_server(
        lambda: Connection(answers, stats, default_rate, events_per_write), host, port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="fast", help="the model name it lists and answers as (default: fast)")
    parser.add_argument(
        "--chunks-per-second", type=float, default=0.0,
        help="token events per second per stream when a request does not say (x_chunks_per_second); 0 = unpaced",
    )
    parser.add_argument(
        "--events-per-write", type=int, default=EVENTS_PER_TURN, metavar="N",
        help=f"unpaced: the events of one turn ({EVENTS_PER_TURN}) go in writes of N events each "
        f"(default {EVENTS_PER_TURN}: one write; 1: a write per event)",
    )
    args = parser.parse_args()
    if args.events_per_write < 1:
        parser.error("--events-per-write must be at least 1")
    runner = uvloop.run if uvloop is not None else asyncio.run
    try:
        runner(serve(args.host, args.port, args.model, args.chunks_per_second, args.events_per_write))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
