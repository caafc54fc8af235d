"""What a model needs in memory before it is loaded: its facts (from a GGUF header or a
Hugging Face folder), the estimate per device (weights, KV cache, compute buffers), and
the largest context that fits. Pure below the readers; nothing here starts a process.
"""
