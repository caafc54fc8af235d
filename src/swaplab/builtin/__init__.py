"""The built-in default config and its models: what `swaplab serve` runs with no `--config`.

`defaults` is the config, `models` finds (and assembles) the demo GGUF files from their
PyPI packages, and `llamacpp` is the llama.cpp server entry point the config starts.
"""
