"""Where a stream's first token is: the marker of a content event in each dialect's bytes.

TTFT (the activity row, `/metrics`, the page) is the time to the first event that carries
output, never to a stream's first byte: llama.cpp's server writes a ":" comment every
`--sse-ping-interval` seconds (30 by default) all through a long prefill. Pure: the
observation (`observe.RequestObservation`) searches each chunk with these until one matches.
"""

from __future__ import annotations

import re

from swaplab.router.door.dialect import Dialect, dialect_of

NDJSON = "application/x-ndjson"

# What a backend may send before its first token is not content: SSE comments (llama.cpp's
# ":" pings during a long prefill), a role-only chat delta (vLLM's and SGLang's come with the
# first token, but llama.cpp's `return_progress` sends one with each prefill progress event), Anthropic's `message_start`, `content_block_start` and `ping`, and the Responses API's
# `response.created` and `response.in_progress` (vLLM and SGLang send both before the prefill).
# A content event is found by a search of the raw bytes, never a parse: each marker is a quoted
# key or type, which a JSON string cannot hold unescaped, so text inside a value never matches.
_TOKEN_KEYS = rb'"(?:content|text|reasoning_content|reasoning|refusal)"[ \t]*:[ \t]*"[^"]'
_CALLS = rb'|"tool_calls"[ \t]*:[ \t]*\[[ \t]*\{|"function_call"[ \t]*:[ \t]*\{'
CONTENT_EVENTS: dict[Dialect, re.Pattern[bytes]] = {
    # A choice's delta (chat) or text (completions, llama.cpp's /completion) with a character in it, or a tool call.
    Dialect.OPENAI: re.compile(_TOKEN_KEYS + _CALLS),
    # Only `content_block_delta` carries output (text, thinking, a tool call's JSON).
    Dialect.ANTHROPIC: re.compile(rb'"content_block_delta"'),
    # Every `response.*.delta` is output: text, refusal, reasoning, a function call's arguments.
    Dialect.RESPONSES: re.compile(rb'"response\.[a-z_.]+\.delta"'),
    # A line with text in `message.content`, `response` or `thinking`, or a tool call (not the last, empty one).
    Dialect.OLLAMA: re.compile(rb'"(?:content|response|thinking)"[ \t]*:[ \t]*"[^"]' + _CALLS),
}
CONTENT_MARKER_BYTES = 64
"""Bytes kept from one chunk to the next: more than any marker above, so one cut in two is still found."""


def first_content(path: str, content_type: str) -> re.Pattern[bytes]:
    """The marker of a content event in a stream from `path` (the upstream's) of `content_type`."""
    if content_type == NDJSON:
        return CONTENT_EVENTS[Dialect.OLLAMA]
    return CONTENT_EVENTS[dialect_of(path)]
