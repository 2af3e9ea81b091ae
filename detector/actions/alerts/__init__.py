"""Alert delivery: structured log, Slack, webhook, and the dispatcher that keeps them off the detection path."""
