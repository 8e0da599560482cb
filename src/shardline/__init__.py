"""Shardline: a self-hosted training service for large language models, on Ray and PyTorch.

The package's parts live at the top of the repository (`api/`, `service/`, `workers/`,
`migrations/`); the links beside this file map them under this one name, so that the
installed wheel never shadows a user's own `api` or `service` module.
"""
