"""The data a job trains on: sources (synthetic, text, token files) as one token stream,
records (JSON Lines, Parquet, datasets folders; documents or chats) packed into windows,
tokenizers and chat templates, and the loaders whose batches depend only on (seed, step)
and whose position is a `state_dict()` every checkpoint holds. Imports no model, trainer
or checkpoint code."""
