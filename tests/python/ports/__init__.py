"""A corpus of independently written ports of transformers models, with injected porting bugs (issue 15)."""
