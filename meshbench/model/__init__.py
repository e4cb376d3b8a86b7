"""The synthetic engine's numpy reference model: a KV-cached dense Llama."""
