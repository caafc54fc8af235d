"""`sendLoadingState`: a streaming chat request for a model that is not ready yet gets its
loading progress as `reasoning_content` deltas, so a client shows something instead of
timing out and retrying into the queue (the seed's client did, behind a 64k prefill)."""

from __future__ import annotations

import json
import time

from swaplab.config.model import ModelConfig

INTERVAL_SECONDS = 1.0
CHAT_PATHS = frozenset({"/v1/chat/completions"})


def wants_loading_state(model: ModelConfig, path: str, document: dict | None) -> bool:
    return (
        model.send_loading_state
        and path.split("?", 1)[0] in CHAT_PATHS
        and document is not None
        and document.get("stream") is True
    )


def loading_event(model_id: str, text: str, created: int | None = None) -> bytes:
    """One chat.completion.chunk whose delta is reasoning text, as reasoning models stream it."""
    chunk = {
        "id": f"swaplab-loading-{model_id}",
        "object": "chat.completion.chunk",
        "created": created if created is not None else int(time.time()),
        "model": model_id,
        "choices": [{"index": 0, "delta": {"reasoning_content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def progress_text(model_id: str, state: str, seconds: float, waiting: str | None, phase: str = "") -> str:
    if waiting:
        return f"[swaplab] {model_id}: {waiting} ({seconds:.0f} s)\n"
    if phase:  # `restoring context`: the server is up, its saved KV cache is being read back (kvCache)
        return f"[swaplab] {model_id}: {phase} ({seconds:.0f} s)\n"
    if state in ("waking", "sleeping"):  # a wake takes seconds, where a load takes minutes: say which it is
        return f"[swaplab] waking {model_id} ({seconds:.0f} s)\n"
    return f"[swaplab] loading {model_id}: {state} ({seconds:.0f} s)\n"
