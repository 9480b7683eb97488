"""The bottom layer: error types, configuration, time parsing, the cache-identity model, number
formatting. Imports nothing else of prefixscope (checked by tests/test_layers.py)."""
