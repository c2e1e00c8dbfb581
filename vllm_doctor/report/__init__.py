"""Renderers: text for terminals, JSON (the one schema), HTML reports. Never touch vLLM."""
