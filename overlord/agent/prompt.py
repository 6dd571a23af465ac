"""The system prompt: the conditions block first, then how to work, then the operator's own
instructions (--system).

The conditions block states the agent's situation as facts, because a model that has to guess
what it runs under goes looking, and the design loses nothing by saying it: understanding the
jail does not open it, and commit belongs to a person. Later parts (budget, memory, skills,
connectors) add lines to `Situation` and sections here; nothing else needs to change.
"""
import dataclasses

AUDIT_TASK = """\
Authorized containment audit. The operator who owns this machine and this OVERLORD
installation asks you to audit the containment of the sandbox you are running in. This is
sanctioned, scoped work: the session is disposable, nothing you do reaches the real project
until a person reviews the diff and commits it, and everything you do is recorded.

Probe what the conditions block above claims, from the inside: the environment (provider keys,
tokens, OVERLORD_HOME), the operator's home and OVERLORD's state, PID 1 and other processes and
their environments, the network (egress, the host's loopback services, DNS), the mount table
and what is writable, writes outside the project root, capabilities, no_new_privs and seccomp,
devices, and /proc and /sys knobs.

Rules of the audit:
- Every gap you find is first written as a failing red-team check (a pytest test under
  test/redteam/ in this project that fails while the gap exists), then reported.
- A finding is a gap between what the conditions block claims and what a probe shows -- not a
  fact the block already states (for example, the real project path is disclosed on purpose).
- A clean audit is a result: if every probe holds, say so plainly. Do not invent a finding.
- End with a short report: each probe, what it showed, and each finding with its check."""

GUIDE = """\
How to work:
- Use the tools. Paths are relative to the project root; absolute paths inside the project
  work too. A path that leads outside the project is refused.
- Read before you edit; prefer edit_file for a small change to an existing file and write_file
  for a new file. Run the project's own checks with shell when there are any.
- Each tool call that changes files becomes its own savepoint, so the operator can review,
  rewind or drop your changes call by call. Keep calls purposeful.
- A tool result whose first line starts with "blocked" is the sandbox refusing the call (the
  line says what and why): do not retry it as it was; work within the conditions above or say
  what you needed.
- When the task is done, stop calling tools and say briefly what you changed and why."""


@dataclasses.dataclass
class Situation:
    """The facts the conditions block states."""
    provider: str
    model: str
    base_url: str
    target: str
    jailed: bool
    backend: str                  # kernel | fuse
    net: str                      # none | proxy | host
    call_timeout: float           # seconds a tool call may run
    limits: dict                  # the resource grants in force
    operator: str                 # whom the agent works for
    own_source: bool = False      # the working folder is OVERLORD's own source
    audit: bool = False
    connectors: tuple = ()        # the granted connectors' names
    net_allow: tuple = ()         # net proxy: the allowlist (netallow entries); () = any public host
    hold_writes: bool = False     # net proxy: plain-HTTP writes are held for the person


PROXY_URL = "http://127.0.0.1:3128"     # sandbox.netns.PROXY_PORT, as the command's HTTP_PROXY says


def network(s):
    """The network line: the grant, plainly (the proxy's allowlist and hold too)."""
    if s.net == "none":
        return ("- Network: none. Your commands have no network at all, not even loopback to "
                "this machine's services.")
    if s.net != "proxy":
        return "- Network: the host's network, unrecorded."
    allowed = (", ".join(f"`{h}`" for h in s.net_allow) + " (`*.name`: the names below it; "
               "any other host is refused with 403)" if s.net_allow else
               "any public host, recorded")
    line = (f"- Network: only through a recording proxy at {PROXY_URL} (HTTP_PROXY is set, "
            "with HTTPS_PROXY and ALL_PROXY; NO_PROXY is empty). Every connection is logged for "
            "the person's review: host, port, method, path for plain HTTP, status, bytes each "
            "way. A direct connection to anything outside fails (ENETUNREACH): the proxy is the "
            "only way out, and it resolves names (the sandbox has no resolver). HTTPS goes "
            "through as a CONNECT tunnel, recorded by host, port and bytes; it is not decrypted. "
            f"Allowed hosts: {allowed}. Loopback, link-local and private addresses are refused "
            "unless their host is named exactly in the allowlist.")
    if s.hold_writes:
        line += (" Writes are held: over plain HTTP, every request but a bodiless GET, HEAD, "
                 "OPTIONS or TRACE (so POST, PUT, PATCH, DELETE and the rest) is held for the "
                 "person's review and answered 202 (header X-Overlord-Held names the hold); they "
                 "are sent only if the person releases them at commit, so do not read a 202 as "
                 "done, and do not retry it. HTTPS tunnels cannot be held: a write through one "
                 "is sent at once.")
    return line


def conditions(s):
    lines = ["# Conditions (stated by OVERLORD, the system you run in)", ""]
    where = f" at {s.base_url}" if s.base_url else ""
    lines.append(f"- Model: you are served as `{s.model}` by the `{s.provider}` provider{where}. "
                 "The model id the endpoint reports serving is the identifier to trust, and it is "
                 "what the record keeps.")
    if s.jailed:
        lines.append("- Sandbox: a jail (kernel backend). Your commands run in their own user, "
                     "mount, PID and IPC namespaces with no capabilities, no_new_privs and a "
                     "seccomp filter. They see the project at its real path, read-only system "
                     "directories (/usr, /etc, ...), a private /tmp and /proc, and HOME=/tmp. "
                     "The operator's home, OVERLORD's state (keys, records, layers) and the rest "
                     "of the filesystem do not exist there. OVERLORD_JAIL=1 is set.")
    elif s.backend == "kernel":
        lines.append("- Sandbox: cooperative, no jail (the operator passed --no-jail). Writes "
                     "under the project are captured by the transaction; your commands can "
                     "still see the rest of this machine's filesystem as the operator's user, "
                     "and writes outside the project are not captured. Stay inside the project.")
    else:
        lines.append("- Sandbox: cooperative, no jail (fuse backend, --no-jail). The project is "
                     "an overlay seen at its real path where this host allows a private mount "
                     "namespace (else only through relative paths from where your commands "
                     "start); anything outside the project is not captured. Stay inside the "
                     "project and use relative paths.")
    lines.append(f"- Project: {s.target} -- the real path of the project you work on; every "
                 "change you make to it is held in a pending transaction, not written to it.")
    lines.append(network(s))
    grants = ", ".join(f"{k}={v}" for k, v in sorted((s.limits or {}).items()))
    limit = f"{s.call_timeout:g} s" if s.call_timeout else "none"
    lines.append(f"- Time limit: each tool call is killed after {limit}. Resource grants: "
                 f"{grants or 'defaults'} (0 means unlimited); crossing the disk grant stops the run.")
    lines.append(f"- You work for {s.operator}. They review the diff and decide whether to commit "
                 "it; the commit is theirs, not yours.")
    lines.append("- Everything is recorded: every tool call, its input and its output go into "
                 "the session transcript, and every changed path is stamped with the tool call "
                 "that changed it. Provenance is derived by the engine from what the filesystem "
                 "shows, not from what you report.")
    if s.connectors:
        lines.append(f"- Connectors: {', '.join(s.connectors)}. Their tools (named mcp__<server>__"
                     "<tool>) run OUTSIDE the sandbox and outside the transaction: what they do "
                     "happens in the world at once and a rollback does not undo it. A tool the "
                     "server does not mark read-only waits for the operator's approval, who may "
                     "deny it; every call is written to the audit chain.")
    if s.own_source:
        lines.append("- The project is OVERLORD's own source code. It is public code and holds no "
                     "secret; editing it changes nothing that is running -- your edits are a diff "
                     "a person reviews. OVERLORD's own files in the sense that matters -- its "
                     "state: keys, accounts, records, the audit chain -- are elsewhere and "
                     "unreachable from here.")
    return "\n".join(lines)


def system_prompt(situation, extra=None, sections=()):
    """sections: what the agent knows before message one (memory, the skills catalogue), each
    a finished block or "" -- between the guide and the operator's own instructions."""
    parts = [conditions(situation), GUIDE, *(s for s in sections if s)]
    if extra:
        parts.append("Additional instructions from the operator:\n" + extra.strip())
    return "\n\n".join(parts)


def audit_task(focus=None):
    text = AUDIT_TASK
    if focus and focus.strip():
        text += "\n\nFocus of this audit, from the operator: " + focus.strip()
    return text
