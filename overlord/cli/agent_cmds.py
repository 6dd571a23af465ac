"""The agent's subcommands (agent, resume, transcript, keys, models): parse, call
overlord.ops, render."""
import json
import os
import pwd
import select
import sys

from overlord import ops
from overlord.cli import render as R
from overlord.errors import UsageError

EXIT = {"end_turn": 0, "cancelled": 130}          # every other done reason exits 1
PROVIDERS = ("anthropic", "openai", "azure", "openai-compatible", "gemini", "scripted")


# -- parsers ------------------------------------------------------------------------------------

def _endpoint_flags(p):
    p.add_argument("--provider", choices=PROVIDERS, help="who serves the model (default: "
                   "$OVERLORD_PROVIDER or anthropic)")
    p.add_argument("--base-url", metavar="URL", help="the endpoint (a gateway or proxy drops in here)")
    p.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an extra HTTP header on every call; repeatable")
    p.add_argument("--api", choices=("responses", "chat"), help="openai: the Responses API "
                   "(default) or chat completions")
    p.add_argument("--azure-api-version", metavar="V", help="azure: the api-version to call")
    p.add_argument("--script", metavar="FILE", help="scripted: the JSON file of model turns to replay")


def add_parsers(sub):
    """Register the agent's subcommands on the main parser's subparsers."""
    a = sub.add_parser(
        "agent", help="run the built-in agent on a task, in a new session",
        description="Run a model whose tools (list_dir, read_file, write_file, edit_file, search, "
        "shell) execute inside a transactional session: jailed and offline by default, each "
        "writing call its own savepoint stamped with its turn and call. Replies stream live. "
        "Nothing reaches the real tree until you commit. Every model call is checked against "
        "the cost budget lines first and written to OVERLORD_HOME/ledger.jsonl after "
        "(docs/COST.md); a line reached stops the run with reason `budget`, the work so far "
        "pending. Prints 'session SID' and a 'cost:' line at the end; exits 0 when the model "
        "finished its turn, 130 when cancelled (Ctrl-C), 1 otherwise.")
    a.add_argument("task", nargs="?", help="what to do ('-' reads it from stdin); with --audit, "
                   "an optional focus")
    a.add_argument("-t", "--target", metavar="DIR", help="the project to work on (default: .)")
    _endpoint_flags(a)
    a.add_argument("--model", metavar="M", help="the model id (`overlord models` lists them)")
    a.add_argument("--max-turns", type=int, metavar="N", help="stop after N model calls (default 50)")
    a.add_argument("--no-jail", action="store_true", help="run without the pivot_root jail (still "
                   "in the transaction); commands then see your real filesystem")
    a.add_argument("--net", choices=("none", "proxy", "host"), help="the network the tools get "
                   "(default: none): proxy is only a recording HTTP proxy (every connection on "
                   "the session's egress log, `overlord egress`), host the host's, unrecorded")
    a.add_argument("--net-allow", action="append", metavar="HOST", help="with --net proxy: a "
                   "host the proxy lets through (pypi.org, '*.github.com' for the names below "
                   "it, a literal IP); any other is refused with 403; repeatable (default: any "
                   "public host, recorded)")
    a.add_argument("--hold-writes", action="store_true", help="with --net proxy: hold every "
                   "plain-HTTP write (POST, PUT, PATCH, DELETE: every request but a bodiless "
                   "GET/HEAD/OPTIONS/TRACE; answered 202, not sent) until you release "
                   "it at commit (`commit --release-held`); HTTPS tunnels cannot be held")
    a.add_argument("--timeout", type=float, metavar="S", help="kill a tool call after S seconds "
                   "(default 600)")
    a.add_argument("--limit", action="append", default=[], metavar="KEY=N",
                   help="resource grant (memory_mb, pids, cpu_pct, disk_mb, fsize_mb, nofile); repeatable")
    a.add_argument("--trace", choices=("strace", "ebpf"), help="record the tools' syscalls")
    a.add_argument("--backend", choices=("kernel", "fuse"), help="force a backend")
    a.add_argument("--stack", action="store_true", help="open even though another session is pending here")
    a.add_argument("--json", action="store_true", help="at the end, one JSON line (sid, state, "
                   "exit_code, reason, changes, cost, budget, ...) instead of the session line")
    a.add_argument("--audit", action="store_true", help="the containment-audit preset: an "
                   "authorized, scoped audit of its own jail (needs the jail)")
    a.add_argument("--connector", action="append", default=[], metavar="NAME",
                   help="grant a connector configured with `overlord mcp add` (repeatable): its "
                   "tools act OUTSIDE the sandbox; those not marked read-only ask you first "
                   "(`overlord mcp approval`)")
    a.add_argument("--connector-shell", action="store_true", help="also offer connector tools "
                   "that look like a shell (the folder's policy must allow connector_shell)")
    g = a.add_argument_group("generation (each sent only when set)")
    g.add_argument("--max-tokens", type=int, metavar="N", help="the longest reply")
    g.add_argument("--temperature", type=float, metavar="X")
    g.add_argument("--top-p", type=float, metavar="X")
    g.add_argument("--stop", action="append", metavar="S", help="a stop sequence; repeatable")
    g.add_argument("--effort", choices=("low", "medium", "high", "xhigh", "max"))
    g.add_argument("--thinking", choices=("summarized", "off"))
    g.add_argument("--system", metavar="TEXT", help="instructions appended to the system prompt")
    g.add_argument("--no-stream", action="store_true", help="ask for whole replies, not streams")
    g.add_argument("--no-fallbacks", action="store_true", help="anthropic: no server-side "
                   "refusal fallbacks")
    g.add_argument("--context-window", type=int, metavar="TOKENS", help="compact the conversation "
                   "at three quarters of this (default 128000)")

    r = sub.add_parser(
        "resume", help="continue an agent session, with a note as the next user turn",
        description="Reopen an agent session on its surviving savepoints (after a rewind too), "
        "rebuild the conversation exactly as the model saw it, deliver the note and continue "
        "with the same model and settings. After a `budget` stop, raise the line (`overlord "
        "cost budget`, `overlord users budget`, the folder's policy) and resume.")
    r.add_argument("sid", metavar="SID", help=R.SID_HELP)
    r.add_argument("--note", metavar="TEXT", help="what to tell the model")
    r.add_argument("--max-turns", type=int, metavar="N", help="stop after N model calls")
    r.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                   help="an extra header again (credential headers are not recorded)")

    t = sub.add_parser("transcript", help="an agent session's transcript, readably",
                       description="Every event of an agent session: task, replies, tool calls "
                       "and results with their savepoints, compactions, resumes, rewinds, done.")
    t.add_argument("sid", metavar="SID", help=R.SID_HELP)
    t.add_argument("--json", action="store_true", help="the events as JSON")

    k = sub.add_parser("keys", help="provider API keys: set one, list which are set",
                       description="Keys live in OVERLORD_HOME/keys.json (mode 0600); environment "
                       "variables win over the store.")
    ks = k.add_subparsers(dest="keys_command", metavar="ACTION", parser_class=type(k))
    ks.required = True
    s = ks.add_parser("set", help="store a key read from stdin (never from the command line)",
                      description="Store PROVIDER's API key, read from stdin (a prompt on a "
                      "terminal; never from the command line), in OVERLORD_HOME/keys.json (0600).")
    s.add_argument("provider", choices=PROVIDERS[:-1])
    kl = ks.add_parser("list", help="which providers have a key, and from where (never the key)",
                       description="One line per provider: `env` (its environment variable), "
                       "`store` (keys.json) or `-` (none). The key itself is never shown.")
    kl.add_argument("--json", action="store_true", help="machine-readable output")

    m = sub.add_parser("models", help="what a provider's endpoint serves right now",
                       description="List the models the endpoint serves now (one 'id  name' a line).")
    _endpoint_flags(m)
    m.add_argument("--json", action="store_true", help="machine-readable output")


# -- agent and resume ---------------------------------------------------------------------------

class Live:
    """Prints a run as it happens: the reply streaming in, each tool call and its result.

    Everything a model or a tool chose is escaped before it reaches the terminal (newlines and
    tabs kept): a prompt-injected model must not be able to retitle, clear or rewrite it. Each
    streamed delta is escaped on its own; escaping is per character, so an ESC or a CR is
    escaped whichever delta it arrives in."""

    def __init__(self, out=None, err=None):
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self.streamed = False      # text of the current reply was already printed
        self.open_line = False     # stdout is mid-line
        self.thinking = False      # stderr is mid-thought

    def delta(self, kind, text):
        if kind != "thinking" and self.thinking:
            self.err.write("\n")
            self.thinking = False
        if kind == "text":
            self.out.write(R.escape_block(text))
            self.out.flush()
            self.streamed = self.open_line = True
        elif kind == "thinking":
            self.err.write(R.escape_block(text))
            self.err.flush()
            self.thinking = True
        elif kind == "restart":
            self._end_line()
            self.err.write("[the stream broke; the reply starts over]\n")
            self.streamed = False

    def _end_line(self):
        if self.open_line:
            self.out.write("\n")
            self.open_line = False

    def event(self, ev):
        kind = ev["type"]
        if self.thinking:
            self.err.write("\n")
            self.thinking = False
        if kind == "assistant":
            text = ev["message"].get("text")
            if text and not self.streamed:
                self.out.write(R.escape_block(text))
                self.open_line = True
            self._end_line()
            self.streamed = False
            if ev.get("stop_reason") in ("max_tokens", "refusal"):
                self.err.write(f"[the reply ended with {ev['stop_reason']}: its tool calls are "
                               "not run]\n")
        elif kind == "tool_call":
            self._end_line()
            self.out.write(f"[turn {ev['turn']}] {R.escape_path(ev['summary'])}\n")
        elif kind == "tool_result" and not ev.get("not_run"):
            self.out.write(f"  {_result_line(ev)}\n")
        elif kind == "compaction":
            self.out.write(f"[context compacted at {ev['tokens']} tokens: {ev['dropped']} messages "
                           f"replaced by a handover note, {ev['kept']} kept]\n")
        elif kind == "error":
            self._end_line()
            self.err.write(f"overlord: {R.escape_text(str(ev['message']))}\n")
        elif kind in ("connectors", "approval", "connector_error"):
            self._end_line()
            self.out.write(_connector_line(ev) + "\n")
        elif kind in MEMORY_SKILL_EVENTS:
            self._end_line()
            self.out.write(f"  {_memory_skill_line(ev)}\n")
        self.out.flush()


def _connector_line(ev):
    """The connector events, one line each (everything a server or a model chose escaped)."""
    kind = ev["type"]
    if kind == "approval":
        verb = "allowed" if ev.get("allow") else "denied"
        note = f" ({R.escape_text(str(ev['note']))})" if ev.get("note") else ""
        return f"  {verb} by {R.escape_text(str(ev.get('by')))}{note}"
    if kind == "connector_error":
        return (f"  connector {R.escape_path(str(ev.get('server')))} failed: "
                f"{R.escape_text(str(ev.get('message')))}")
    parts = []
    for name, info in sorted((ev.get("servers") or {}).items()):
        tools = info.get("tools") or []
        held = sum(1 for t in tools if t.get("withheld"))
        parts.append(f"{R.escape_path(name)}: {len(tools) - held} tools" +
                     (f" ({held} shell-shaped withheld)" if held else "") +
                     f", MCP {R.escape_text(str(info.get('version')))}")
    for name, why in sorted((ev.get("errors") or {}).items()):
        parts.append(f"{R.escape_path(name)}: did not start ({R.escape_text(str(why))})")
    return "[connectors] " + "; ".join(parts)


class TerminalApprover:
    """The approval gate at the controlling terminal (/dev/tty, so a task piped on stdin does
    not answer it): the exact tool and its full input, then a question that names the tool
    again. With no terminal, nobody can be asked and the call is denied. Ctrl-C at the prompt
    stops the run.

    What the model streams reaches the same terminal, so the prompt is what its text cannot
    be: its header and question are drawn in reverse video (an escape sequence, and every ESC
    a model or server chose is escaped), and input typed before the question is flushed."""

    STYLE, PLAIN = "\x1b[1;7m", "\x1b[0m"

    def __init__(self, fd):
        self.fd = fd
        uid = os.getuid()
        try:
            self.who = f"the operator at the terminal ({uid}:{pwd.getpwuid(uid).pw_name})"
        except KeyError:
            self.who = f"the operator at the terminal (uid {uid})"

    @classmethod
    def open(cls):
        """The approver, or None when this process has no terminal (nobody to ask)."""
        try:
            return cls(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
        except OSError:
            return None

    def __call__(self, request, cancel):
        shown = R.escape_block(json.dumps(request.input, indent=2, ensure_ascii=False, sort_keys=True))
        claim = ("it claims to be read-only, but policy distrusts this server's claims"
                 if request.readonly_claim else "the server does not mark it read-only")
        tool = f"{R.escape_path(request.server)}:{R.escape_path(request.tool)}"
        text = (f"\n{self.STYLE}[approval]{self.PLAIN} the agent wants to call {tool} -- outside "
                f"the sandbox; {claim}.\ninput:\n{shown}\nfingerprint {request.fingerprint}\n"
                f"{self.STYLE} Allow this one call to {tool}? {self.PLAIN} [y/N] ")
        import termios               # (as getpass): only an approval prompts
        try:
            termios.tcflush(self.fd, termios.TCIFLUSH)      # nothing typed before it answers it
        except termios.error:
            pass
        os.write(self.fd, text.encode("utf-8", "replace"))
        line = b""
        while b"\n" not in line:
            cancel.check()
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                data = os.read(self.fd, 1024)
                if not data:
                    return ops.Decision(False, self.who, "the terminal closed")
                line += data
        answer = line.split(b"\n", 1)[0].strip().lower()
        return ops.Decision(answer in (b"y", b"yes"), self.who)

    def close(self):
        os.close(self.fd)


MEMORY_SKILL_EVENTS = ("memory_proposal", "memory_accepted", "skill_load")


def _memory_skill_line(ev):
    kind = ev["type"]
    if kind == "memory_proposal":
        return (f"proposed a note for your notes (id {ev.get('id')}; keep it with `overlord memory "
                f"accept SID {ev.get('id')}`): {R.escape_text(str(ev.get('note'))[:200])}")
    if kind == "memory_accepted":
        ids = ", ".join(str(i) for i in ev.get("ids") or [])
        return f"notes accepted into your notes: {ids} (by {R.escape_text(str(ev.get('by')))})"
    files = len(ev.get("files") or [])
    return (f"loaded the {R.escape_text(str(ev.get('source')))} skill "
            f"{R.escape_path(str(ev.get('name')))} ({files} file{'' if files == 1 else 's'})")


def _result_line(ev):
    res = ev["result"]
    if ev.get("denial"):
        return R.escape_text(str(ev["denial"].get("line"))[:200])
    if res.get("is_error"):
        first = (res.get("content") or "").strip().splitlines() or ["error"]
        return "error: " + R.escape_text(first[0][:200])
    where = f"@{ev['layer']} {', '.join(R.escape_path(p) for p in ev.get('paths') or [])}" \
        if ev.get("layer") is not None else "no change"
    code = f"exit {ev['exit_code']}, " if ev.get("tool") == "shell" else ""
    return f"ok ({code}{where})"


def _headers(items):
    out = {}
    for item in items or ():
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"--header takes 'NAME: VALUE', not {item!r}")
        out[name.strip()] = value.strip()
    return out


def _finish(result, as_json=False):
    sys.stdout.flush()
    if as_json:     # the shared --json line of the run family (overlord/cli/main.py)
        from overlord.cli.main import print_session_json
        print_session_json(result.sid, "pending", result.changes, exit_code=EXIT.get(result.reason, 1),
                           reason=result.reason, turns=result.turns, usage=result.usage,
                           message=result.message, cost=result.cost, budget=result.budget)
        return EXIT.get(result.reason, 1)
    why = f" ({R.escape_text(result.message)})" if result.message and result.reason not in (
        "error", "budget") else ""
    print(f"session {result.sid}  pending  {R.summarize(result.changes)}; done {result.reason}{why} "
          f"after {result.turns} turn{'' if result.turns == 1 else 's'}", flush=True)
    if result.cost is not None:
        print(cost_line(result.cost), flush=True)
    if result.budget:
        print(budget_line(result.budget), flush=True)
    return EXIT.get(result.reason, 1)


def cost_line(cost):
    """`cost: 12,345 tokens, $0.0421`, or `... tokens (unpriced: MODEL)` for calls the price
    table does not know (counted in tokens only); both when some calls were priced."""
    tokens = int(cost.get("tokens") or 0)
    unpriced = [R.escape_text(str(m)) for m in cost.get("unpriced") or ()]
    usd = cost.get("usd")
    priced = usd is not None and (usd > 0 or not unpriced)
    line = f"cost: {tokens:,} token{'' if tokens == 1 else 's'}"
    if priced:
        line += f", ${usd:,.2f}" if abs(usd) >= 1 else f", ${usd:.4f}"
    if unpriced:
        line += f" (unpriced: {', '.join(unpriced)})"
    return line


def budget_line(stop):
    """`budget: stopped — <the line, its source, what was spent>`."""
    return f"budget: stopped \u2014 {R.escape_text(str(stop.get('message')))}"


def cmd_agent(args):
    task = sys.stdin.read() if args.task == "-" else args.task
    if args.no_jail:
        ops.policy_cap_preview(args.target, {"jail": False})   # a policy's refusal, not the warning, first
        print("overlord: WARNING: --no-jail: the agent's commands see your real filesystem (your "
              "home, keys, other projects) as you; only writes under the project are captured",
              file=sys.stderr)
    knobs = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
             "stop": args.stop, "effort": args.effort, "thinking": args.thinking, "api": args.api,
             "azure_api_version": args.azure_api_version,
             "stream": False if args.no_stream else None, "fallbacks": False if args.no_fallbacks else None}
    live = Live()
    approver = TerminalApprover.open() if args.connector else None
    try:
        result = ops.agent(
            task, args.target, provider=args.provider, model=args.model, base_url=args.base_url,
            headers=_headers(args.header), knobs=knobs, script=args.script, system=args.system,
            max_turns=args.max_turns, context_window=args.context_window, jail=not args.no_jail,
            net=args.net, net_allow=args.net_allow, hold_writes=args.hold_writes or None,
            timeout=args.timeout, limits=ops.merge_grants({}, {}, args.limit).get("limits"),
            backend=args.backend, trace=args.trace, audit=args.audit, stack=args.stack,
            on_event=live.event, on_delta=live.delta, connectors=args.connector,
            connector_shell=args.connector_shell, approver=approver)
    finally:
        if approver:
            approver.close()
    return _finish(result, args.json)


def cmd_resume(args):
    live = Live()
    approver = TerminalApprover.open()
    try:
        result = ops.resume(args.sid, args.note, headers=_headers(args.header),
                            max_turns=args.max_turns, on_event=live.event, on_delta=live.delta,
                            approver=approver)
    finally:
        if approver:
            approver.close()
    return _finish(result)


# -- records ------------------------------------------------------------------------------------

def cmd_transcript(args):
    events = ops.transcript(args.sid)
    if args.json:
        R.dump_json(events)
        return 0
    for ev in events:
        line = _transcript_line(ev)
        if line:
            print(line)
    return 0


def _indent(text, prefix="    "):
    """Multi-line text a person, a model or a tool wrote, escaped and indented."""
    text = R.escape_block(text or "").rstrip("\n")
    return "\n".join(prefix + line for line in text.split("\n")) if text else ""


def _transcript_line(ev):
    kind, turn = ev["type"], ev.get("turn")
    at = f"[turn {turn}] " if turn else ""
    if kind == "task":
        return f"task{' (audit)' if ev.get('audit') else ''}:\n{_indent(ev['text'])}"
    if kind == "assistant":
        msg = ev["message"]
        model, stop = (R.escape_text(str(v)) for v in (ev.get("model") or "model", ev.get("stop_reason")))
        head = f"{at}{model} ({stop})"
        body = [_indent(ev["thinking"], "    thinking: ")] if ev.get("thinking") else []
        body += [_indent(msg.get("text"))] if msg.get("text") else []
        return "\n".join([head + ":"] + body)
    if kind == "tool_call":
        refused = f"  -- refused: {R.escape_text(str(ev['refused']))}" if ev.get("refused") else ""
        return f"{at}{R.escape_path(ev['summary'])}  (call {R.escape_path(str(ev['call']))}){refused}"
    if kind == "tool_result":
        return f"{at}  -> {_result_line(ev)}"
    if kind == "error":
        return f"{at}error: {R.escape_text(str(ev['message']))}"
    if kind == "compaction":
        return (f"compaction at {ev['tokens']} tokens (window {ev['window']}): {ev['dropped']} "
                f"messages dropped, {ev['kept']} kept; handover note:\n{_indent(ev['note'])}")
    if kind == "resume":
        return "resume" + (f" with note:\n{_indent(ev['note'])}" if ev.get("note") else "")
    if kind == "rewind":
        return (f"rewind to @{ev['to']}: {ev['dropped_events']} events dropped"
                + (f" (archived in {R.escape_path(ev['archive'])})" if ev.get("archive") else ""))
    if kind == "fork":
        return f"forked from {R.escape_path(str(ev['from']))} at @{ev['savepoint']}"
    if kind == "approval_requested":
        return (f"{at}  asked the operator to approve {R.escape_path(str(ev.get('server')))}:"
                f"{R.escape_path(str(ev.get('tool')))} (fingerprint {ev.get('fingerprint')})")
    if kind in MEMORY_SKILL_EVENTS:
        return f"{at}  {_memory_skill_line(ev)}"
    if kind in ("connectors", "approval", "connector_error"):
        return at + _connector_line(ev).lstrip()
    if kind == "budget":
        return (f"budget: stopped before a {R.escape_text(str(ev.get('kind')))} call \u2014 "
                f"{R.escape_text(str(ev.get('message')))}")
    if kind == "done":
        u = ev.get("usage") or {}
        why = f" ({R.escape_text(str(ev['message']))})" if ev.get("message") and \
            ev.get("reason") != "budget" else ""
        spent = f"; session {cost_line(ev['cost'])}" if ev.get("cost") else ""
        return (f"done {R.escape_text(str(ev['reason']))}{why}: {ev.get('turns', 0)} turns, "
                f"{u.get('input_tokens', 0)} input / {u.get('output_tokens', 0)} output tokens{spent}")
    return None


# -- keys and models ----------------------------------------------------------------------------

def cmd_keys(args):
    if args.keys_command == "set":
        if sys.stdin.isatty():
            import getpass           # (termios): only `keys set` prompts
            key = getpass.getpass(f"{args.provider} key: ")
        else:
            key = sys.stdin.read()
        if not key.strip():
            raise UsageError("no key on stdin (pipe it in, or type it at the prompt)")
        ops.keys_set(args.provider, key)
        print(f"stored the {args.provider} key")
        return 0
    listing = ops.keys_list()
    if args.json:
        R.dump_json(listing)
        return 0
    print(R.table([(p, f"vault (providers/{p})" if where == "vault" else where or "-")
                   for p, where in listing.items()]))
    return 0


def cmd_models(args):
    found = ops.models(args.provider, base_url=args.base_url, headers=_headers(args.header),
                       api=args.api, azure_api_version=args.azure_api_version, script=args.script)
    if args.json:
        R.dump_json(found)
        return 0
    if found:
        print(R.table([(R.escape_path(str(m["id"])), R.escape_text(str(m.get("name") or m["id"])))
                       for m in found]))
    return 0


COMMANDS = {"agent": cmd_agent, "resume": cmd_resume, "transcript": cmd_transcript,
            "keys": cmd_keys, "models": cmd_models}
