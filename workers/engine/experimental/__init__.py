"""Data-parallel strategies that do not yet reach sync's loss (docs/benchmarks.md): local
SGD (DiLoCo) and asynchronous replicas. The core names them in
workers/engine/dp_strategy.py and imports them only when a job asks for one; nothing in
the core, the checkpoint manager or the models imports this package."""
