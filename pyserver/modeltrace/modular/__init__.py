"""transformers modular files (`modular_<name>.py`): their generated twin, and the map of their lines onto it.

Torch-free, shared by the worker (which traces the twin), the CLI and the language server (which show the twin's
hints on the modular lines).
"""
