"""Shared test settings: keep every process to one thread on small CI machines."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
