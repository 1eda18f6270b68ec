"""End-to-end tests of the language server (pytest-lsp, real server over stdio, real worker)."""
