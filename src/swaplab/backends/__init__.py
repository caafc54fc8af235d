"""Inference servers swaplab can start itself: the llama.cpp entry point and the demo models."""
