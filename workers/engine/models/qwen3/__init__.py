"""The qwen3 model family (registry.py names it; see config.py and family.py)."""
