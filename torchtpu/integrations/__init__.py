"""Serving and training engines on tpu (vLLM, SGLang, TorchTitan): optional dependencies.

Each integration is a subpackage entered through its engine's own plugin
entry point; ``import torchtpu`` never imports this package, so torchtpu
works, and imports fast, where no engine is installed.
"""
