"""Watched peers: a cheap request per listed model on each peer's `probe` interval.

Cloud tags "retire silently": a retired one keeps listing and answers HTTP 410. A model
whose probe fails is marked unavailable in `/v1/models` and `/running`, requests to it
fail fast with a 503 naming the cause, and the next successful probe brings it back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from swaplab.config.model import Config, PeerConfig

log = logging.getLogger("swaplab.peers")

PROBE_BODY_LIMIT = 300
# Rate-limited is alive: the model exists and will answer later.
ALIVE_STATUSES = frozenset({429})


@dataclass(frozen=True)
class PeerModelHealth:
    available: bool
    reason: str = ""
    checked_at: float = 0.0


def peer_credentials(peer: PeerConfig) -> dict[str, str] | None:
    """Headers that carry a peer's `apiKey` (both forms, as llama-swap sends them)."""
    if not peer.api_key:
        return None
    return {"Authorization": f"Bearer {peer.api_key}", "x-api-key": peer.api_key}


def verdict(status: int, body: str) -> PeerModelHealth:
    """What one probe's answer says about the model (pure; table-tested)."""
    now = time.time()
    if 200 <= status < 300 or status in ALIVE_STATUSES:
        return PeerModelHealth(True, "", now)
    excerpt = " ".join(body.split())[:PROBE_BODY_LIMIT]
    label = {404: "HTTP 404 (not found)", 410: "HTTP 410 (gone: retired)"}.get(status, f"HTTP {status}")
    return PeerModelHealth(False, f"{label}: {excerpt}" if excerpt else label, now)


class PeerWatch:
    """Owns the availability of every probed peer model; unprobed ones are always available."""

    def __init__(
        self,
        config: Config,
        session: Callable[[PeerConfig], aiohttp.ClientSession],
        on_change: Callable[[str, str, bool], None] | None = None,
    ):
        self._config = config
        self._session = session
        self._on_change = on_change
        self._health: dict[tuple[str, str], PeerModelHealth] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def health(self, peer_id: str, model: str) -> PeerModelHealth:
        return self._health.get((peer_id, model), PeerModelHealth(True))

    def start(self, config: Config) -> None:
        """(Re)start probing for `config`'s peers; forget models no longer listed."""
        self.stop()
        self._config = config
        listed = {(peer.id, model) for peer in config.peers.values() for model in peer.models}
        self._health = {key: value for key, value in self._health.items() if key in listed}
        loop = asyncio.get_running_loop()
        for peer in config.peers.values():
            if peer.probe > 0:
                self._tasks.append(loop.create_task(self._watch(peer), name=f"probe {peer.id}"))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks = []

    async def _watch(self, peer: PeerConfig) -> None:
        while True:
            await asyncio.gather(*(self.probe(peer, model) for model in peer.models))
            await asyncio.sleep(peer.probe)

    async def probe(self, peer: PeerConfig, model: str) -> PeerModelHealth:
        body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "stream": False}
        timeout = aiohttp.ClientTimeout(total=peer.timeouts.response_header or 60, sock_connect=peer.timeouts.connect)
        try:
            async with self._session(peer).post(
                f"{peer.proxy.rstrip('/')}/v1/chat/completions", json=body, headers=peer_credentials(peer), timeout=timeout
            ) as response:
                health = verdict(response.status, (await response.content.read(4096)).decode(errors="replace"))
        except asyncio.TimeoutError:
            health = PeerModelHealth(False, f"no answer within {timeout.total:g} s", time.time())
        except aiohttp.ClientError as error:
            health = PeerModelHealth(False, f"unreachable: {error}", time.time())
        previous = self._health.get((peer.id, model))
        self._health[(peer.id, model)] = health
        if previous is None or previous.available != health.available:
            if health.available:
                log.info("peer model %s/%s is available", peer.id, model)
            else:
                log.warning("peer model %s/%s is unavailable: %s", peer.id, model, health.reason)
            if self._on_change is not None:
                self._on_change(peer.id, model, health.available)
        return health
