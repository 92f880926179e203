"""The model stage: resolve a name to a checkpoint, read its config, the GPU catalog."""
