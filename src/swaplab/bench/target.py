"""Getting to know the target before measuring it: who serves the model, how its prompts are counted,
whether it streams usage and accepts forced output lengths, and how long a request may be.

Everything here happens before the first measured (or warm-up) request, and every
problem is a `SwaplabError` with one line that says what to do (the CLI exits 2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from swaplab.bench.prompts import PromptMaker, single_token_words
from swaplab.bench.words import WORDS
from swaplab.client import (
    OpenAIClient,
    RequestResult,
    ServerInfo,
    TokenizeUnavailableError,
)
from swaplab.errors import SwaplabError

PROBE_TOKENS = 16  # content tokens of the probe request
PROBE_OUTPUT_TOKENS = 2
# Without a tokenizer, tokens per word come from two probes this many words apart.
CALIBRATION_WORDS = (32, 256)
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class StreamingUsageMissingError(SwaplabError):
    """The server streams without reporting usage: token counts would have to be guessed."""


class LengthBeyondContextError(SwaplabError):
    """A requested prompt plus answer does not fit the model's context."""


class ProbeFailedError(SwaplabError):
    """The first request to the model failed."""


@dataclass
class Target:
    """A model on a server, ready to be sent prompts of exact lengths with forced answer lengths."""

    client: OpenAIClient
    info: ServerInfo
    endpoint: str  # "chat" | "completions"
    prompts: PromptMaker
    overhead: int = 0  # tokens the server adds around the content: chat template, BOS
    forcing: dict[str, bool] = field(default_factory=lambda: {"ignore_eos": True, "min_tokens": True})
    length_method: str = "tokenize"  # "tokenize" | "calibrated from usage.prompt_tokens"

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]

    def content_tokens(self, prompt_tokens: int) -> int:
        """Content tokens that make a prompt of `prompt_tokens` once the server has wrapped it."""
        content = prompt_tokens - self.overhead
        if content < 1:
            raise LengthBeyondContextError(
                f"a prompt of {prompt_tokens} tokens is no longer than what the server adds around it "
                f"({self.overhead} tokens of chat template); ask for more input tokens"
                + (" or use --endpoint completions" if self.endpoint == "chat" else "")
            )
        return content

    def body(self, content: str, output_tokens: int) -> dict[str, Any]:
        """The request for one prompt, its answer forced to `output_tokens` where the server allows it."""
        body: dict[str, Any] = {"model": self.info.model, "max_tokens": output_tokens}
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": content}]
        else:
            body["prompt"] = content
        if self.forcing.get("ignore_eos"):
            body["ignore_eos"] = True
        if self.forcing.get("min_tokens"):
            body["min_tokens"] = output_tokens
        return body

    def payload(self, content: str, output_tokens: int) -> bytes:
        """`body` as the bytes `OpenAIClient.send` takes, serialised before any clock starts."""
        return self.client.encode(self.body(content, output_tokens))

    async def send(self, content: str, output_tokens: int) -> RequestResult:
        return await self.client.send(self.path, self.payload(content, output_tokens))

    def check_fits(self, prompt_tokens: int, output_tokens: int, *, flag: str = "--input-tokens") -> None:
        """Raise LengthBeyondContextError when a request of this size cannot fit the context the server reports."""
        context = self.info.context_tokens
        if context is not None and prompt_tokens + output_tokens > context:
            raise LengthBeyondContextError(
                f"{flag} {prompt_tokens} + --output-tokens {output_tokens} = {prompt_tokens + output_tokens} tokens, "
                f"beyond {self.info.model}'s context of {context} tokens (as the server reports it)"
            )

    async def check_longest(self, rng: random.Random, prompt_tokens: int) -> None:
        """Where the server doesn't say its context, send the longest prompt once and read its answer."""
        if self.info.context_tokens is not None:
            return
        words = await self.prompts.fit(rng, self.content_tokens(prompt_tokens))
        result = await self.send(" ".join(words), 1)
        if not result.ok:
            raise LengthBeyondContextError(f"a prompt of {prompt_tokens} tokens was refused: {result.error}")


async def reach(
    client: OpenAIClient, model: str | None, *, endpoint: str = "chat", rng: random.Random
) -> Target:
    """Identify the server and model, pick the prompt words, probe streaming usage and forced lengths."""
    info = await client.server_info(model)

    async def tokenize(text: str) -> list[int]:
        return await client.tokenize(text, model=info.model)

    try:
        words = await single_token_words(tokenize)
        prompts = PromptMaker(words or WORDS, tokenize=tokenize if words else None)
    except TokenizeUnavailableError:
        prompts = PromptMaker(WORDS, tokenize=None)
    target = Target(client, info, endpoint, prompts)
    if not prompts.exact:
        target.length_method = "calibrated from usage.prompt_tokens"

    content = await prompts.fit(rng, PROBE_TOKENS)
    first = await _probe(target, " ".join(content))
    if prompts.exact:
        target.overhead = first.prompt_tokens - PROBE_TOKENS
    else:
        # Two points on the line prompt_tokens = overhead + tokens_per_word * words.
        low, high = CALIBRATION_WORDS
        short = await _probe(target, " ".join(prompts.draft(rng, low)))
        long = await _probe(target, " ".join(prompts.draft(rng, high)))
        prompts.tokens_per_word = max(0.1, (long.prompt_tokens - short.prompt_tokens) / (high - low))
        target.overhead = round(short.prompt_tokens - prompts.tokens_per_word * low)
    return target


async def _probe(target: Target, content: str) -> RequestResult:
    """One small streamed request; drops forcing parameters the server refuses; checks usage came back."""
    while True:
        result = await target.send(content, PROBE_OUTPUT_TOKENS)
        refused = _refused_parameter(result, target.forcing)
        if refused is None:
            break
        target.forcing[refused] = False
    name = target.info.model
    if not result.ok:
        raise ProbeFailedError(f"the first request to {name} at {target.info.url} failed: {result.error}")
    if result.usage is None or result.prompt_tokens is None or result.completion_tokens is None:
        raise StreamingUsageMissingError(
            f"{target.info.url} streamed {name}'s answer without usage (stream_options.include_usage): "
            "bench takes token counts from the server, never from counting chunks; use a server that reports them"
        )
    if not result.streamed:
        raise ProbeFailedError(f"{target.info.url} answered {name}'s streaming request with one JSON body: it does not stream")
    return result


def _refused_parameter(result: RequestResult, forcing: dict[str, bool]) -> str | None:
    """The forcing parameter a 400/422 names, if the server refused one it doesn't know."""
    if result.status not in (400, 422) or not result.error:
        return None
    for name in ("min_tokens", "ignore_eos"):
        if forcing.get(name) and name in result.error:
            return name
    return None


def describe_target(target: Target) -> dict[str, Any]:
    """What the run records about how prompts and answers were made."""
    return {
        "endpoint": target.endpoint,
        "length_method": target.length_method,
        "prompt_overhead_tokens": target.overhead,
        "ignore_eos": target.forcing.get("ignore_eos", False),
        "min_tokens": target.forcing.get("min_tokens", False),
        "prompt_words": len(target.prompts.words),
    }
