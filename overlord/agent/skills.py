"""Skills: SKILL.md folders the agent loads with the `skill` tool when one fits.

CONTRACT (issue 14; the skills engineer fills this in -- the callers below are wired):
    catalogue(target, allowed) -> Offered     allowed: the policy rule's "skills"
    from_record(meta_skills) -> Offered       what a session was offered (for a resume)
    tools(session, record, offered) -> [tools.Extra]   the `skill` tool
"""
import dataclasses


@dataclasses.dataclass
class Offered:
    skills: list = dataclasses.field(default_factory=list)    # [{name, description, when, source, sha256}]
    text: str = ""                  # the catalogue section of the prompt, "" when none
    warnings: list = dataclasses.field(default_factory=list)  # malformed SKILL.md, one line each

    def record(self):
        return {"offered": self.skills, "warnings": self.warnings}


def catalogue(target, allowed):
    return Offered()


def from_record(recorded):
    return Offered()


def tools(session, record, offered):
    return []
