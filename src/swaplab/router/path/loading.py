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


def progress_text(
    model_id: str, state: str, seconds: float, waiting: str | None, phase: str = "", progress: dict | None = None
) -> str:
    """One line of loading state: what it waits for, or the load's stage, percentage and ETA."""
    if waiting:
        return f"[swaplab] {model_id}: {waiting} ({seconds:.0f} s)\n"
    if progress is not None and progress.get("stage") not in (None, "starting"):
        return f"[swaplab] {'waking' if progress.get('kind') == 'wake' else 'loading'} {model_id}: {stage_text(progress)}\n"
    if phase:  # `restoring context`: the server is up, its saved KV cache is being read back (kvCache)
        return f"[swaplab] {model_id}: {phase} ({seconds:.0f} s)\n"
    if state in ("waking", "sleeping"):  # a wake takes seconds, where a load takes minutes: say which it is
        return f"[swaplab] waking {model_id} ({seconds:.0f} s)\n"
    if progress is not None:
        return f"[swaplab] loading {model_id}: {state} ({stage_text(progress)})\n"
    return f"[swaplab] loading {model_id}: {state} ({seconds:.0f} s)\n"


def stage_text(progress: dict) -> str:
    """`capturing CUDA graphs 45% · 61% done · 62 s · about 40 s left (usually 95 s, 3 earlier loads)`."""
    parts = [progress["stage"] if progress["stage"] != "starting" else "starting"]
    if progress.get("fraction") is not None:
        parts[0] += f" {progress['fraction'] * 100:.0f}%"
    if progress.get("percent") is not None:
        parts.append(f"{progress['percent']}% done")
    parts.append(f"{progress['elapsed_seconds']:.0f} s")
    if progress.get("stuck"):
        usual = progress.get("usual_seconds")
        parts.append(f"probably stuck: no output for {progress['silent_seconds']:.0f} s"
                     + (f", past twice its usual {usual:.0f} s" if usual is not None else ", on a first load"))
    elif progress.get("eta_seconds") is not None:
        loads = progress["history"]
        parts.append(f"about {progress['eta_seconds']:.0f} s left (usually {progress['usual_seconds']:.0f} s, "
                     f"{loads} earlier load{'s' if loads != 1 else ''})")
    else:
        parts.append("no earlier load to estimate from")
    return " · ".join(parts)
