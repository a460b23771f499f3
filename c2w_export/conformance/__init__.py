"""Conformance of a team's own artifacts as pytest tests (plugin.py, suite.py), and the upstream
qwen-tts oracle (upstream.py). Test-time only: nothing below it imports it."""
