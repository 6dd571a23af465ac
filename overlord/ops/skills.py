"""skills as operations (issue 14: being built; see overlord/agent/skills.py)."""
