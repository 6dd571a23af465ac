"""Context compaction: when a call has used three quarters of the context window, the model
writes a handover note, the older turns are dropped, and the note plus the last few messages
become the conversation.

The cut is a `compaction` event (transcript.py) holding the new first message and how many
messages were kept, so a replay -- a resume -- rebuilds exactly the view the model had. The
handover message carries `compacted`: how many model replies it stands for (the dropped ones
and the reply that wrote the note), which is how a provider that counts replies (scripted)
keeps its place.
"""
DEFAULT_WINDOW = 128_000
THRESHOLD = 0.75
KEEP = 4                     # messages kept after the note: about the last two exchanges

REQUEST = """\
[OVERLORD] The conversation is close to the context window. Write a handover note for
yourself: it replaces every turn before the last few, which will be dropped. Include the task
as you understand it, the decisions made and why, every file touched (created, changed,
deleted), what remains to do, and what bit you (errors, surprises, dead ends). Reply with the
note only; do not call tools."""


def due(context_tokens, window):
    return bool(context_tokens) and context_tokens >= THRESHOLD * (window or DEFAULT_WINDOW)


def split(messages):
    """(dropped, kept): kept starts at an assistant message, so every tool result it holds
    follows its call, and roles still alternate after the note. None when nothing would go."""
    start = max(1, len(messages) - KEEP)
    while start < len(messages) and messages[start].get("role") != "assistant":
        start += 1
    if start >= len(messages):
        # no assistant message among the last few: keep from the last one there is
        start = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=0)
    if start <= 1:
        return None
    return messages[:start], messages[start:]


def replies_in(messages):
    """How many model replies a list of messages stands for."""
    return sum(1 if m.get("role") == "assistant" else m.get("compacted", 0) for m in messages)


def handover_message(task, note, dropped):
    text = ("[OVERLORD] Earlier turns were dropped to fit the context window. The original "
            f"task, verbatim:\n\n{task}\n\nYour handover note from before the cut:\n\n{note.strip()}")
    return {"role": "user", "content": text, "compacted": replies_in(dropped) + 1}


def fallback_note(dropped):
    """A note from the record itself, when the model wrote none."""
    calls = [f"- {c['name']}({c.get('input', {}).get('path') or c.get('input', {}).get('command', '')})"
             for m in dropped if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    return "No note was written. Tool calls made before the cut:\n" + "\n".join(calls[-50:] or ["- none"])
