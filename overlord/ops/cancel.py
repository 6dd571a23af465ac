"""Stopping an operation a face started: the agent's Cancel (a flag, and Cancelled raised out
of a model call it interrupts), for a face that stops an agent from another thread.
Light on purpose: `ops.Cancelled` must not import the agent's providers."""
from overlord.agent.cancel import Cancel, Cancelled

__all__ = ("Cancel", "Cancelled")
