"""Stopping a confirmed duplicate: the guarded executor, its api and db backends, read-back, dispatch workers."""
