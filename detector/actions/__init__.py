"""Side effects on planned actions: alerts and remediation. Never imports the app wiring."""
