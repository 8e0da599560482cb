"""Llama (2, 3): RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention.

`config.py` (no torch) is the args and the config.json adapter; `family.py` is the rest.
"""
