"""Engine adapters: one package per engine holds all of that engine's knowledge."""

ENGINES = ("vllm", "sglang")
