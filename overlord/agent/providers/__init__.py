"""The model providers, all behind one contract (base.py).

    get(name)               the module for a provider name; it has complete() and list_models()
    PROVIDERS               every name get() knows
    default_base_url(name)  where a provider is reached when no --base-url is given (None: must be given)
"""
import importlib
import os

from overlord.errors import UsageError

PROVIDERS = ("anthropic", "openai", "azure", "openai-compatible", "gemini", "scripted")
_MODULES = {"anthropic": "anthropic", "openai": "openai", "azure": "azure",
            "openai-compatible": "openai_compatible", "gemini": "gemini", "scripted": "scripted"}


def get(name):
    if name not in _MODULES:
        raise UsageError(f"unknown provider {name!r} (one of: {', '.join(PROVIDERS)})")
    return importlib.import_module(f"overlord.agent.providers.{_MODULES[name]}")


def default_base_url(name):
    if name == "azure":
        return os.environ.get("AZURE_OPENAI_ENDPOINT")   # as the official SDK reads it
    if name == "scripted":
        return None
    mod = get(name)
    return getattr(mod, "BASE", None)
