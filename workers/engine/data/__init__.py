"""The data a job trains on: sources (synthetic, text, token files) as one token stream,
tokenizers, and the loader whose batches depend only on (seed, step) and whose position is
a `state_dict()` every checkpoint holds. Imports no model, trainer or checkpoint code."""
