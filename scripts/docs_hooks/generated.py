"""MkDocs hook: placeholder (filled in by the generated-content work)."""
