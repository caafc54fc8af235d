"""The routes whose requests name a model: the lane takes them, the app registers them, the path resolves them."""

from __future__ import annotations

# The routes whose requests name a model and go to its server.
MODEL_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/audio/transcriptions",
    "/v1/audio/speech",
    "/v1/rerank",
    "/rerank",
    "/v1/reranking",
    "/infill",
    "/completion",
    "/reranking",
    "/v1/audio/voices",
    "/v1/images/generations",
    "/v1/images/edits",
    "/sdapi/v1/txt2img",
    "/sdapi/v1/img2img",
    "/audioapi/v1/tasks/run",
    "/v/chat/completions",
    "/v/responses",
    "/v/completions",
    "/v/messages",
    "/v/messages/count_tokens",
    "/v/embeddings",
    "/v/rerank",
    "/v/reranking",
)
# The GET routes that name a model with ?model= (llama-swap's modelGetRoutes); a websocket
# upgrade on one is relayed to the model as under /upstream/.
MODEL_GET_ROUTES = ("/props", "/v1/audio/voices", "/sdapi/v1/loras")
