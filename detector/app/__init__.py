"""The wiring on top: CLI, daemon loop, leadership, ledger, health; the only place that knows every implementation."""
