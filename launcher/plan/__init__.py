"""The plan stage: gather the inputs once, plan through the engine adapter, search and fit."""
