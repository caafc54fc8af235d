"""The floor for any Python proxy: a minimal aiohttp passthrough, a few dozen lines.

python benchmarks/passthrough.py --port 9001 --upstream http://127.0.0.1:9000
"""

import argparse

import aiohttp
from aiohttp import web

SKIP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def make_app(upstream: str) -> web.Application:
    async def start(app):
        app["session"] = aiohttp.ClientSession(auto_decompress=False)

    async def stop(app):
        await app["session"].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in SKIP}
        session = request.app["session"]
        async with session.request(request.method, upstream + request.path_qs, headers=headers, data=body) as up:
            response = web.StreamResponse(status=up.status)
            response.headers.update({k: v for k, v in up.headers.items() if k.lower() not in SKIP})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    # handler_cancellation: a client that leaves closes the upstream, as in swaplab.
    web.run_app(make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                handler_cancellation=True, access_log=None, print=None)
