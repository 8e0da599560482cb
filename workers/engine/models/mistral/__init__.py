"""The mistral model family (registry.py names it; see config.py and family.py)."""
