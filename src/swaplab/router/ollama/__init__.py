"""Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/tags`, `/api/ps`, `/api/show`...) over the fleet.

Requests are translated to the backend's OpenAI routes (`translate`), sent down the same
path as OpenAI's own requests (`Forwarder.forward_reshaped`: admission, heartbeats, loading
state, activity, captures, metrics, cancel on disconnect), and their replies given back in
Ollama's shapes (`replies`). The listings read the config, the fleet and the model files
(`listing`); `handlers` registers the routes. docs/api.md says how each `/api/*` path is decided.
"""
