"""swaplab launch: TOML recipes that bring up vLLM / SGLang / llama.cpp across nodes, as one gang."""
