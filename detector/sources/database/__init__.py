"""The database source: incremental reads of new runs and events, and earlier decisions from run notes."""
