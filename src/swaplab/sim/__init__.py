"""`swaplab sim`: a scriptable OpenAI-compatible server for exact timing and fault injection."""
