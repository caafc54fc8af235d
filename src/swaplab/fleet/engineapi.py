"""What the fleet asks of an engine's own HTTP API: is it ready (readiness that means ready),
sleep, wake, save and restore llama.cpp's slots; and what a sleeping process holds in RAM.
The backend's lifecycle task decides when; this says how."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import psutil

from swaplab.config.engines import call_headers
from swaplab.config.model import ModelConfig, SleepCall

GIB = 1024**3
READY_POLL_FIRST = 0.02
READY_POLL_MAX = 0.25
GENERATE_ATTEMPT_TIMEOUT = 30.0


async def poll_ready(http: aiohttp.ClientSession, model: ModelConfig, check: str) -> None:
    """Returns once the model's `checkEndpoint` says it is ready; polls faster at first."""
    interval = READY_POLL_FIRST
    while True:
        if await ready_once(http, model, check):
            return
        await asyncio.sleep(interval)
        interval = min(interval * 2, READY_POLL_MAX)


def check_url(proxy: str, check: str) -> str:
    """Where `checkEndpoint` is asked, joined to `proxy` as llama-swap's reverse proxy joins them (Go's
    `singleJoiningSlash`): `health` and `/health` both mean `<proxy>/health`, a full URL's host is the proxy's."""
    target, endpoint = urlsplit(proxy), urlsplit(check)
    if target.path.endswith("/") and endpoint.path.startswith("/"):
        path = target.path + endpoint.path[1:]
    elif not target.path.endswith("/") and not endpoint.path.startswith("/"):
        path = f"{target.path}/{endpoint.path}"
    else:
        path = target.path + endpoint.path
    query = "&".join(part for part in (target.query, endpoint.query) if part)
    return urlunsplit((target.scheme, target.netloc, path, query, ""))


async def ready_once(http: aiohttp.ClientSession, model: ModelConfig, check: str) -> bool:
    base = model.proxy.rstrip("/")
    try:
        # A server started with its own key (`--api-key`, TabbyAPI's tokens) is asked with it.
        headers = call_headers(model, "/v1/completions" if check == "generate" else urlsplit(check).path or "/")
        if check == "generate":
            # /health can say 200 minutes before the server can serve (the seed's
            # SGLang): only a real one-token completion proves readiness.
            body = {"model": model.use_model_name or model.id, "prompt": "Hi", "max_tokens": 1}
            timeout = aiohttp.ClientTimeout(total=GENERATE_ATTEMPT_TIMEOUT)
            async with http.post(f"{base}/v1/completions", json=body, timeout=timeout, headers=headers) as response:
                if response.status != 200:
                    return False
                payload = await response.json(content_type=None)
                return bool(payload.get("choices"))
        timeout = aiohttp.ClientTimeout(total=5)
        async with http.get(check_url(model.proxy, check), timeout=timeout, headers=headers) as response:
            await response.read()
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return False


async def call_all(
    http: aiohttp.ClientSession,
    model: ModelConfig,
    calls: tuple[SleepCall, ...],
    timeout: float,
    exited: asyncio.Event,
    stopped: asyncio.Event,
) -> str | None:
    """Each call in order, each within `timeout`; why one failed, or None.

    A call is abandoned as soon as the process exits (why: its exit) or a stop is wanted
    (None: the caller sees the stop and ends the run).
    """
    for call in calls:
        request = asyncio.ensure_future(_call(http, model, call, timeout))
        await first_of(request, exited.wait(), stopped.wait())
        if stopped.is_set():
            return None
        if exited.is_set():
            return f"{call}: the process exited"
        failure = request.result()
        if failure is not None:
            return f"{call}: {failure}"
    return None


async def _call(http: aiohttp.ClientSession, model: ModelConfig, call: SleepCall, timeout: float) -> str | None:
    kwargs: dict = {"timeout": aiohttp.ClientTimeout(total=timeout), "headers": call_headers(model, call.path)}
    if call.body is not None:
        kwargs["json"] = call.body
    try:
        async with http.request(call.method, model.proxy.rstrip("/") + call.path, **kwargs) as response:
            text = await response.text(errors="replace")
            if response.status >= 300:
                return f"HTTP {response.status} {text.strip()[:200]}"
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except aiohttp.ClientError as error:
        return str(error) or type(error).__name__


def tree_gib(pid: int | None) -> float | None:
    """RAM (resident set) of a process and all its descendants, in GiB; None when it cannot be read."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / GIB


async def first_of(*awaitables) -> None:
    """Return as soon as one of `awaitables` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


# -- llama.cpp's slots: a KV cache saved on eviction, restored on return -------------------


class SlotCallFailed(Exception):
    """A call to llama.cpp's /slots failed or timed out; the message says how.

    `answered`: the server sent an HTTP answer (it lives); False when it went silent or away.
    `timed_out`: no answer within the time given."""

    def __init__(self, message: str, *, answered: bool = True, timed_out: bool = False):
        super().__init__(message)
        self.answered = answered
        self.timed_out = timed_out


async def slot_holdings(http: aiohttp.ClientSession, model: ModelConfig, timeout: float) -> list[tuple[int, int | None, bool]]:
    """`GET /slots`: each slot's id, the tokens it holds (None when the server does not say) and
    whether it is processing a request now."""
    document = await _slots_call(http, model, "GET", "/slots", None, timeout)
    if not isinstance(document, list):
        raise SlotCallFailed(f"GET /slots: expected a list of slots, got {type(document).__name__}")
    holdings = []
    for slot in document:
        if not isinstance(slot, dict) or not _count(slot.get("id")):
            raise SlotCallFailed("GET /slots: a slot without an id")
        tokens: int | None = None
        if "n_prompt_tokens" in slot or "id_task" in slot:
            # What the slot's cache holds: its prompt, plus what it generated after it.
            decoded = (slot.get("next_token") or [{}])[0]
            tokens = _count_or_zero(slot.get("n_prompt_tokens")) + _count_or_zero(
                decoded.get("n_decoded") if isinstance(decoded, dict) else 0)
        elif "prompt" not in slot:  # a slot that never held a task lists neither
            tokens = 0
        holdings.append((slot["id"], tokens, bool(slot.get("is_processing"))))
    return holdings


async def slot_action(
    http: aiohttp.ClientSession, model: ModelConfig, slot_id: int, action: str, filename: str, timeout: float
) -> dict:
    """`POST /slots/{id}?action=save|restore` with the file name; llama.cpp's answer (n_saved, n_written;
    n_restored, n_read)."""
    document = await _slots_call(http, model, "POST", f"/slots/{slot_id}?action={action}", {"filename": filename}, timeout)
    if not isinstance(document, dict):
        raise SlotCallFailed(f"{action} of slot {slot_id}: expected a JSON object")
    return document


async def _slots_call(http: aiohttp.ClientSession, model: ModelConfig, method: str, path: str, body: dict | None,
                      timeout: float):
    what = f"{method} {urlsplit(path).path}"
    url = model.proxy.rstrip("/") + path
    headers = call_headers(model, path)
    try:
        async with http.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout),
                                headers=headers) as response:
            text = await response.text(errors="replace")
            if response.status != 200:
                raise SlotCallFailed(f"{what}: HTTP {response.status} {_error_text(text)}")
            try:
                return json.loads(text)
            except ValueError:
                raise SlotCallFailed(f"{what}: the answer is not JSON") from None
    except TimeoutError:
        raise SlotCallFailed(f"{what}: no answer within {timeout:.3g} s", answered=False, timed_out=True) from None
    except aiohttp.ClientError as error:
        raise SlotCallFailed(f"{what}: {error or type(error).__name__}", answered=False) from None


def _error_text(text: str) -> str:
    """llama.cpp's `{"error": {"message": ...}}`, else the body's start."""
    try:
        message = json.loads(text)["error"]["message"]
        if isinstance(message, str):
            return message[:200]
    except (ValueError, KeyError, TypeError):
        pass
    return text.strip()[:200]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count_or_zero(value: object) -> int:
    return value if _count(value) else 0  # type: ignore[return-value]
