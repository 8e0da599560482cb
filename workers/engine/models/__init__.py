"""Model families: one folder per family, each with its module, tensor-parallel plan,
pipeline cut, random initialisation and Hugging Face adapters (registry.py names them).

This package and each family's `config.py` import no torch: the control plane reads a
Hugging Face config.json through them when a job is submitted.
"""
