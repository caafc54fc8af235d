"""The router's own API and page, as llama-swap's clients know them: `/running`, `/api/*`, logs,
captures and events (`llamaswap`), `/v1/models` (`listing`), `/api/performance` (`performance`)
and the web page (`ui`, `static/`). Nothing here is on a model request's way.

Imports `path` (names, peers, profiles), `watch` and `door`; never `ollama`, its neighbour.
"""
