"""Shared bits every stage uses: units, errors, vocabulary, paths, the start lock, input checks."""
