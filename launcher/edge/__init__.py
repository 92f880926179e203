"""The edge: the click commands, their hints and presets, and the renderers (tables, JSON)."""
