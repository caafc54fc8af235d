"""Metrics and activity through a real router: what a user scrapes and what `swaplab activity` shows."""

from __future__ import annotations

import subprocess
import sys

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from procs import SIM, wait_until


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_and_activity_record_a_request_that_just_went_through(router_factory):
    router = router_factory(f"""
models:
  a:
    cmd: {SIM} --port ${{PORT}} --model a --ttft-ms 20
    aliases: [alpha]
  b:
    cmd: {SIM} --port ${{PORT}} --model b
""")
    body = {"model": "alpha", "stream": True, "max_tokens": 12, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "three little words"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{router.url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            await response.read()
        async with session.post(f"{router.url}/v1/completions", json={"model": "b", "prompt": "x"}) as response:
            assert response.status == 200  # a swap
        async with session.get(f"{router.url}/metrics") as response:
            assert response.status == 200
            scraped = samples(await response.text())

    a = (("model", "a"),)
    assert scraped[("swaplab:requests_total", (("model", "a"), ("status", "200")))] == 1
    assert scraped[("swaplab:prompt_tokens_total", a)] == 3
    assert scraped[("swaplab:generation_tokens_total", a)] == 12
    assert scraped[("swaplab:time_to_first_token_seconds_count", a)] == 1
    assert scraped[("swaplab:time_to_first_token_seconds_sum", a)] >= 0.02
    assert scraped[("swaplab:backend_starts_total", (("model", "a"), ("outcome", "ok")))] == 1
    assert scraped[("swaplab:swaps_total", ())] == 1
    assert scraped[("swaplab:backend_up", a)] == 0 and scraped[("swaplab:backend_up", (("model", "b"),))] == 1

    def shown() -> str:
        result = subprocess.run(
            [sys.executable, "-m", "swaplab", "activity", "--db", str(router.db), "--model", "alpha"],
            capture_output=True, text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 0, result.stderr
        return result.stdout if "/v1/chat/completions" in result.stdout else ""

    table = wait_until(shown, 20, "the request in `swaplab activity`")  # written off the hot path, in batches
    row = next(line for line in table.splitlines() if "/v1/chat/completions" in line)
    assert "a (alpha)" in row and " 200 " in row and "3/12" in row  # model (as asked), status, tokens in/out
