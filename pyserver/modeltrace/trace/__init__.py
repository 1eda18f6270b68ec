"""The trace: what one forward pass produced, as records (`records`), on disk (`storage`), per line (`lines`)."""
