"""What the agent knows before the first message: project notes, your notes, the journal.

CONTRACT (issue 14; the memory engineer fills this in -- the callers below are wired):
    gather(target) -> Told            the three sources, capped, as the prompt section
    tools(session, record) -> [tools.Extra]   the `remember` tool
    journal_commit(session)           after a commit (ops.decide): the journal line
"""
import dataclasses
import hashlib


@dataclasses.dataclass
class Told:
    text: str                       # the prompt section, "" when there is nothing to tell
    sources: list = dataclasses.field(default_factory=list)   # [{name, path, sha256, bytes, shown, cut}]

    def record(self):
        return {"sha256": hashlib.sha256(self.text.encode()).hexdigest(), "sources": self.sources}


def gather(target):
    return Told("")


def tools(session, record):
    return []


def journal_commit(session):
    return None
