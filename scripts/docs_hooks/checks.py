"""MkDocs hook: placeholder (filled in by the docstring work)."""
