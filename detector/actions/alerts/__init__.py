"""Alert delivery: the channels (``channels/``: log, Slack, webhook, Alertmanager), what they share,
and the dispatcher that keeps them off the detection path."""
