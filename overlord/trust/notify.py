"""Webhooks (issue 16): placeholder until notify lands. after_append(entry) is called by
audit.append after every act; it must stay cheap (a stat when no webhook is configured)."""


def after_append(entry):
    return None
