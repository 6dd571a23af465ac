"""Explainable denials: when the sandbox refused a tool call, the model is told why.

CONTRACT (issue 14; the denials engineer fills this in -- tools.Toolbox calls it):
    explainer(session) -> explain(tool, args, captures) -> Denial | None
"""
import dataclasses


@dataclasses.dataclass
class Denial:
    cause: str          # seccomp | readonly | outside | network | limit | disk
    line: str           # "blocked by the sandbox: ..." -- the first line of the tool result

    def record(self):
        return {"cause": self.cause, "line": self.line}


def explainer(session):
    return None
