"""A request on its way to a backend and its answer on the way back: the upstream connection (`proxy`
on aiohttp's client, `wire` on the router's own), heartbeats while the model loads or thinks
(`keepalive`), an answer reshaped for another API (`reshape`), websockets, and recovering a
request whose server broke before answering (`recovery`).

Imports `watch` (each chunk is observed) and `door` (the lane's responses).
"""
