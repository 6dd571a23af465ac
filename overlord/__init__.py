"""OVERLORD: transactional, attributed, reviewable execution over a directory tree."""

__version__ = "0.1.0"
