"""The sim's endpoints for router tests: the last request's body, and a websocket echo."""

from __future__ import annotations

import aiohttp

from procs import Sim, eventually


async def test_last_request_and_websocket_echo(tmp_path):
    sim = Sim(tmp_path, model="demo")
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{sim.url}/sim/last-request") as response:
                assert response.status == 404
                assert (await response.json())["error"]["message"] == "no generation request yet"
            body = {"model": "demo:cold", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.1}
            async with session.post(f"{sim.url}/v1/chat/completions?x=1", json=body) as response:
                assert response.status == 200
            async with session.get(f"{sim.url}/sim/last-request") as response:
                assert await response.json() == {
                    "path": "/v1/chat/completions?x=1", "content_type": "application/json", "body": body,
                }
            async with session.ws_connect(f"{sim.url}/sim/ws") as socket:
                await socket.send_str("echo me")
                assert (await socket.receive()).data == "echo me"
                await socket.send_str("close 4003")
                message = await socket.receive()
                assert message.type is aiohttp.WSMsgType.CLOSE and message.data == 4003
            async with session.ws_connect(f"{sim.url}/sim/ws") as socket:
                await socket.close(code=4004)
        await eventually(lambda: "sim: websocket closed by the client with code 4004" in sim.output(), 10,
                         "the sim to log the close code")
    finally:
        sim.close()
