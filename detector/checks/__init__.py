"""The periodic checks (docs/explanation/checks.md): one package per kind, the machinery they share beside them.

Light on purpose: ``detector.config`` imports ``registry`` (and through it each kind's ``settings``) while
it is built, so nothing here may import a check class, the runner or anything above ``detector.settings``.
"""
