/* The workspace: conversations on the left, the chat in the middle, the change on the right.
   One conversation is one transaction: nothing on disk changes until Commit. */
"use strict";

(() => {
  const {h, clear, api, markdown, kindBadge, fileDiff, delta, causeText, ago, stateLabel, metaNotes, privilegeText, SID_RE,
         gateView, countersignPanel} = OV;
  const $ = (id) => document.getElementById(id);
  const app = $("app"), messages = $("messages"), welcome = $("welcome"), prompt = $("prompt");
  const OPEN = ["pending", "timed-out"];
  const DONE_WORDS = {
    end_turn: "Done",
    max_turns: "Stopped at the turn budget: send a message to let it go on",
    max_tokens: "The reply was cut off at max tokens; its tool calls did not run",
    refusal: "The model declined this request",
    cancelled: "Stopped. Send a message to continue where it left off",
    limit: "The session crossed its disk grant and can run nothing more",
    error: "The run failed",
    budget: "Stopped at a budget line: the work so far stays in the session for review",
  };
  const DENIAL_WORDS = {seccomp: "seccomp filter", readonly: "read-only system", outside: "outside the jail",
                        network: "no network", limit: "resource limit", disk: "disk grant", other: "sandbox"};
  const NO_KEY = "no API key yet: add one in Settings, or choose the Demo provider there (no key needed)";
  const APPROVAL_WORDS = {
    ask: "ask: a tool the server does not declare read-only waits for your Allow / Deny",
    auto: "auto: every tool runs without asking",
    readonly: "readonly: only tools the server declares read-only run; every action is refused",
  };

  const state = {settings: null, chats: [], sid: null, chat: null, source: null, running: false,
                 session: null, inspectorTimer: null, listTimer: null, detail: null,
                 egress: null, heldOutcome: null};

  /* a call's input as the approval card prints it: pretty JSON, as text */
  function inputText(value) {
    try { return JSON.stringify(value, null, 2); } catch (e) { return String(value); }
  }

  /* -- the conversation as it is drawn ---------------------------------------------------------- */
  class ChatView {
    constructor(el) {
      this.el = el; this.cards = new Map(); this.live = null; this.frame = 0; this.running = false;
      this.approvals = new Map(); this.readonly = new Map(); this.granted = [];
      this.proposals = new Map();
      this.indicator = h("div", {class: "working", role: "status", "aria-label": "the agent is working"},
                         h("span"), h("span"), h("span"));
    }

    reset() {
      for (const node of [...this.el.children]) if (node !== welcome) node.remove();
      this.cards.clear();
      this.approvals.clear();
      this.readonly.clear();
      this.proposals.clear();
      this.granted = [];
      this.live = null;
      this.lastError = null;
    }

    add(node) {
      const stick = this.el.scrollHeight - this.el.scrollTop - this.el.clientHeight < 80;
      if (this.indicator.parentNode === this.el) this.el.insertBefore(node, this.indicator);
      else this.el.append(node);
      if (stick) this.el.scrollTop = this.el.scrollHeight;
      return node;
    }

    working(on) {
      this.running = on;
      this.showIndicator();
    }

    showIndicator() {
      const want = this.running && !(this.live && (this.live.text || this.live.thought));
      if (want && this.indicator.parentNode !== this.el) { this.el.append(this.indicator); this.follow(); }
      if (!want && this.indicator.parentNode) this.indicator.remove();
    }

    follow() {
      const gap = this.el.scrollHeight - this.el.scrollTop - this.el.clientHeight;
      if (gap < 160) this.el.scrollTop = this.el.scrollHeight;
    }

    user(text, label) {
      return this.add(h("div", {class: "msg msg-user"},
        label ? h("span", {class: "msg-label"}, label) : null,
        h("div", {class: "bubble"}, text)));
    }

    note(text, cls) { return this.add(h("p", {class: `note ${cls || ""}`}, text)); }

    assistant() {
      const body = h("div", {class: "md"});
      const thinkingText = h("div", {class: "thinking-text"});
      const thinking = h("details", {class: "thinking", hidden: true}, h("summary", {}, "Thinking"), thinkingText);
      const bubble = h("div", {class: "bubble"}, thinking, body);
      const wrap = this.add(h("div", {class: "msg msg-assistant"}, bubble));
      return {wrap, bubble, body, thinking, thinkingText, text: "", thought: ""};
    }

    delta(kind, text) {
      if (!this.live) {
        this.live = this.assistant();
        this.live.bubble.classList.add("streaming");
      }
      if (kind === "thinking") this.live.thought += text;
      else this.live.text += text;
      if (!this.frame) this.frame = requestAnimationFrame(() => this.paint());
    }

    restart() {
      if (this.live) { this.live.text = ""; this.live.thought = ""; this.paint(); }
    }

    paint() {
      this.frame = 0;
      const live = this.live;
      if (!live) return;
      clear(live.body).append(markdown(live.text));
      live.thinking.hidden = !live.thought;
      live.thinkingText.textContent = live.thought;
      this.showIndicator();
      this.follow();
    }

    record(r) {
      switch (r.type) {
        case "task":
          if (r.audit) this.user("/audit", "containment audit (authorized, scoped to this session)");
          else this.user(r.text || "");
          break;
        case "resume":
          if (r.note) this.user(r.note);
          break;
        case "assistant": {
          const a = this.live || this.assistant();
          this.live = null;
          if (this.frame) { cancelAnimationFrame(this.frame); this.frame = 0; }
          a.bubble.classList.remove("streaming");
          clear(a.body).append(markdown(r.text || ""));
          a.thinking.hidden = !r.thinking;
          a.thinkingText.textContent = r.thinking || "";
          if (!r.text && !r.thinking) a.wrap.remove();
          this.showIndicator();
          break;
        }
        case "tool_call": this.card(r); break;
        case "tool_result": this.result(r); break;
        case "error":
          this.lastError = {message: r.message || null,
                            node: this.note(r.message ? `Error: ${r.message}` : "An error stopped this step", "error")};
          break;
        case "compaction": this.note("Earlier turns were summarized to fit the context window."); break;
        case "rewind": this.note(`Rewound to savepoint @${r.to}: what came after was undone.`); break;
        case "fork": this.note(`Forked from ${r.from} at savepoint @${r.savepoint}.`); break;
        case "done": this.done(r); break;
        case "budget": this.budget(r); break;
        case "connectors": this.connectors(r); break;
        case "approval_requested": this.approval(r, false); break;
        case "approval": this.resolved(r); break;
        case "memory_proposal": this.proposal(r); break;
        case "memory_accepted": this.accepted(r); break;
        case "skill_load": this.skillLoad(r); break;
        case "connector_error":
          this.note(`Connector ${r.server || "?"} failed${r.message ? `: ${r.message}` : ""}. The agent was told; the run goes on.`, "error");
          break;
        default: break;
      }
    }

    card(r) {
      const full = r.summary || "";
      const inner = full.startsWith(`${r.tool}(`) && full.endsWith(")") ? full.slice(r.tool.length + 1, -1) : full;
      const status = h("span", {class: `tool-status ${r.refused ? "fail" : "run"}`}, r.refused ? "refused" : "running");
      const files = h("span", {class: "tool-files"});
      const body = h("div", {class: "tool-body"});
      if (r.refused) body.append(h("pre", {class: "tool-output error"}, r.refused));
      /* a connector's tool: labelled with the server that serves it (it runs outside the sandbox) */
      const c = r.connector;
      const label = c ? h("span", {class: "tool-name connector-name", title: `${r.tool} on the connector ${c.server}, outside the sandbox`},
                          `${c.server} \u00b7 ${c.tool}`) : h("span", {class: "tool-name"}, r.tool);
      const card = h("details", {class: `tool${c ? " connector-tool" : ""}`, dataset: {call: r.call || ""}},
        h("summary", {}, label, h("span", {class: "tool-summary", title: inner}, inner), files, status),
        body);
      this.cards.set(r.call, {card, status, files, body});
      this.add(card);
    }

    result(r) {
      let c = this.cards.get(r.call);
      if (!c) { this.card({call: r.call, tool: r.tool, summary: r.tool}); c = this.cards.get(r.call); }
      let text, cls;
      if (r.not_run) { text = "not run"; cls = "skip"; }
      else if (r.cancelled) { text = "stopped"; cls = "skip"; }
      else if (r.timed_out) { text = "timed out"; cls = "fail"; }
      else if (r.tool === "shell" && r.exit_code !== null && r.exit_code !== undefined) {
        text = `exit ${r.exit_code}`; cls = r.exit_code === 0 ? "ok" : "fail";
      } else { text = r.is_error ? "error" : "done"; cls = r.is_error ? "fail" : "ok"; }
      const denial = r.denial;
      if (denial) { text = "blocked"; cls = "blocked"; }
      c.status.className = `tool-status ${cls}`;
      c.status.textContent = text;
      if (denial) c.status.title = "blocked by the sandbox"; else c.status.removeAttribute("title");
      /* the sandbox refused it: its own card, the line visible without opening it */
      c.card.classList.toggle("tool-denied", !!denial);
      const old = c.card.querySelector(":scope > summary > .denial-line");
      if (old) old.remove();
      if (denial) {
        c.card.querySelector(":scope > summary").append(h("span", {class: "denial-line", dataset: {cause: denial.cause}},
          h("span", {class: "denial-cause", title: "why the sandbox refused this call"}, DENIAL_WORDS[denial.cause] || denial.cause),
          h("span", {class: "denial-text"}, denial.line)));
      }
      const paths = r.paths || [];
      c.files.textContent = paths.length ? `${paths.length} file${paths.length === 1 ? "" : "s"}` : "";
      clear(c.body);
      if (paths.length) c.body.append(h("div", {class: "tool-paths"}, paths.map((p) => h("span", {}, p))));
      if (r.output) c.body.append(h("pre", {class: `tool-output ${r.is_error ? "error" : ""}`}, r.output + (r.clipped ? "\n[\u2026 shortened here; the transcript keeps it all]" : "")));
      else c.body.append(h("p", {class: "muted small"}, "no output"));
      const k = r.connector;
      if (k && k.sha256) {
        c.body.append(h("p", {class: "muted small connector-record"},
          `Served by ${k.server}, outside the sandbox; recorded in the audit chain: sha256 ${k.sha256.slice(0, 16)}\u2026, ${k.size} bytes.`));
      }
    }

    /* a note the agent proposes for your notes: the model's text (a text node), saved only by a person */
    proposal(r) {
      if (this.proposals.has(r.id)) return;
      const save = h("button", {class: "button primary small", type: "button"}, "Save to your notes");
      const actions = h("div", {class: "proposal-actions"}, save);
      const status = h("p", {class: "proposal-status small", role: "status"});
      const el = h("section", {class: "memory-proposal", dataset: {proposal: String(r.id)}, "aria-label": "a proposed note"},
        h("p", {class: "proposal-head"}, h("strong", {}, "Proposed note"), ` #${r.id} \u00b7 for your notes`,
          h("span", {class: "muted small"}, " (memory.md, read in every folder)")),
        h("p", {class: "proposal-note"}, r.note || ""),
        h("p", {class: "proposal-warn small"}, "The agent cannot write your notes: this is only a proposal until you save it."),
        actions, status);
      const p = {el, save, actions, status, id: r.id, saved: false};
      save.addEventListener("click", () => saveProposal(p));
      this.proposals.set(r.id, p);
      this.add(el);
    }

    /* saved, as recorded (the transcript's memory_accepted), or as the server just answered */
    accepted(r) {
      const who = r.by === "workspace" ? "you, here" : r.by && r.by.startsWith("cli:") ? `${r.by.slice(4)}, at the terminal` : r.by || "?";
      for (const id of r.ids || []) {
        const p = this.proposals.get(id);
        if (!p || p.saved) continue;
        p.saved = true;
        p.el.classList.add("is-saved");
        p.actions.hidden = true;
        p.status.textContent = `Saved to your notes by ${who}.`;
      }
    }

    /* the agent loaded a skill: which, from where, what came with it */
    skillLoad(r) {
      const files = r.files || [];
      const more = r.more_files ? ` and ${r.more_files} more` : "";
      const line = h("div", {class: "skill-load", dataset: {skill: r.name || ""}},
        h("span", {class: "skill-load-label"}, "Skill loaded"),
        h("code", {class: "skill-load-name"}, r.name || "?"),
        h("span", {class: `pill skill-source source-${r.source === "project" ? "project" : "machine"}`},
          r.source === "project" ? "project skill" : "machine skill"),
        files.length ? h("details", {class: "skill-load-files"}, h("summary", {}, `${files.length} file${files.length === 1 ? "" : "s"}${more}`),
                         h("ul", {}, files.map((f) => h("li", {}, f)))) : null);
      this.add(line);
    }

    /* the granted connectors, as the run recorded them; each tool's own read-only claim kept */
    connectors(r) {
      const servers = Object.entries(r.servers || {});
      this.granted = servers.map(([name]) => name);
      const parts = servers.map(([name, s]) => {
        const tools = s.tools || [];
        for (const t of tools) this.readonly.set(`${name}\u0000${t.tool}`, !!t.readonly);
        const withheld = tools.filter((t) => t.withheld).length, offered = tools.length - withheld;
        return `${name} (${offered} tool${offered === 1 ? "" : "s"}${withheld ? `, ${withheld} withheld` : ""})`;
      });
      if (parts.length) this.note(`Connectors: ${parts.join(", ")}. They run outside the sandbox; an action asks you first.`, "connectors");
      const errors = r.errors || [];
      for (const e of Array.isArray(errors) ? errors : Object.entries(errors).map(([server, message]) => ({server, message}))) {
        const line = typeof e === "string" ? e : `${e.server || e.name || "?"}: ${e.message || e.error || ""}`;
        this.note(`Connector unavailable: ${line}`, "error");
      }
    }

    /* a call waiting at the approval gate: the server, the tool, the exact input (text, never markup) */
    approval(r, pending) {
      let a = this.approvals.get(r.call);
      if (a && a.done) return;
      if (!a) {
        const claim = r.readonly_claim !== undefined && r.readonly_claim !== null ? !!r.readonly_claim
          : !!this.readonly.get(`${r.server}\u0000${r.tool}`);
        const input = inputText(r.input === undefined ? {} : r.input);
        const allow = h("button", {class: "button primary small", type: "button"}, "Allow");
        const deny = h("button", {class: "button ghost danger-text small", type: "button"}, "Deny");
        const actions = h("div", {class: "approval-actions", hidden: true}, allow, deny);
        const status = h("p", {class: "approval-status small", role: "status"});
        const el = h("section", {class: "approval", dataset: {call: r.call || ""}, "aria-label": "approval needed"},
          h("p", {class: "approval-head"}, h("strong", {}, "Approval needed"), " \u00b7 ",
            h("span", {class: "approval-server"}, r.server || "?"), " wants to run ",
            h("code", {class: "approval-tool"}, r.tool || "?")),
          h("p", {class: "approval-claim small"}, `The server says this tool is read-only: ${claim ? "yes (but its claim is not trusted here)" : "no"}.`),
          h("pre", {class: "approval-input"}, input),
          h("p", {class: "approval-warn small"}, "It runs on this machine, outside the sandbox: Discard cannot undo what it does."),
          actions, status);
        a = {el, actions, status, allow, deny, r, done: false, pending: null};
        allow.addEventListener("click", () => decide(a, true));
        deny.addEventListener("click", () => decide(a, false));
        this.approvals.set(r.call, a);
        this.add(el);
      }
      const tool = this.cards.get(r.call);
      if (tool && tool.status.textContent === "running") { tool.status.textContent = "asks you"; tool.status.className = "tool-status skip"; }
      if (pending) {
        a.pending = r;
        a.actions.hidden = false;
        a.allow.disabled = a.deny.disabled = false;
        a.status.textContent = "";
        this.follow();
      }
    }

    /* the server answered a decision (or the run stopped before one) */
    decision(d) {
      const a = this.approvals.get(d.call);
      if (!a || a.done) return;
      a.pending = null;
      a.actions.hidden = true;
      a.status.textContent = d.allow === null || d.allow === undefined ? "Stopped before a decision: the call did not run."
        : d.allow ? "Allowed. Running\u2026" : "Denied.";
    }

    /* the decision as recorded: the card becomes one line */
    resolved(r) {
      const a = this.approvals.get(r.call);
      const card = this.cards.get(r.call);
      const server = a ? a.r.server : null, tool = a ? a.r.tool : null;
      const who = r.by === "workspace" ? "you" : r.by === "terminal" ? "the terminal" : r.by || "?";
      const what = server ? `${server} \u00b7 ${tool}` : card ? card.card.querySelector(".tool-name").textContent : "a connector call";
      /* asked: the person's (or the terminal's) answer; unasked: the server's read-only claim or the mode */
      const verdict = a ? `${r.allow ? "allowed" : "denied"} by ${who}` : r.allow ? `ran without asking: ${r.by}` : `refused: ${r.by}`;
      const line = h("div", {class: `approval-line ${r.allow ? "allowed" : "denied"}${a ? " asked" : ""}`, dataset: {call: r.call || ""}},
        h("span", {class: "tool-name connector-name"}, what), " ",
        h("span", {class: "approval-verdict"}, verdict),
        r.note && r.by !== "workspace" ? h("span", {class: "muted small"}, ` \u00b7 ${r.note}`) : null);
      if (a) {
        a.done = true;
        if (a.r.input !== undefined) {
          line.append(h("details", {class: "approval-what"}, h("summary", {}, "the input"),
                        h("pre", {class: "approval-input"}, inputText(a.r.input))));
        }
        a.el.replaceWith(line);
      } else this.add(line);
    }

    done(r) {
      if (r.reason === "error") {
        /* the reason, from the transcript: the provider's or the session's own line */
        const text = `${DONE_WORDS.error}${r.message ? `: ${r.message}` : ""}. Send a message to try again, or check the provider and model in Settings.`;
        const last = this.lastError;
        this.lastError = null;
        if (last && last.message === r.message && last.node.isConnected) last.node.textContent = text;
        else this.note(text, "error");
        return;
      }
      let text = DONE_WORDS[r.reason] || r.reason;
      if (r.reason === "budget" && !this.budgetShown && (r.budget || r.message)) this.budget(r.budget || {message: r.message});
      if (r.reason === "end_turn" && r.usage && !r.cost) {
        const tokens = (r.usage.input_tokens || 0) + (r.usage.output_tokens || 0);
        text += ` \u00b7 ${r.turns} turn${r.turns === 1 ? "" : "s"}${tokens ? ` \u00b7 ${tokens.toLocaleString()} tokens` : ""}`;
      } else if (r.reason === "end_turn" && r.turns) {
        text += ` \u00b7 ${r.turns} turn${r.turns === 1 ? "" : "s"}`;
      }
      if (r.cost) text += ` \u00b7 session so far: ${RUNNING.costText(r.cost)}`;
      this.budgetShown = false;
      this.note(text, "done");
    }

    /* a budget line reached before a model call: the run stops there, and says which line */
    budget(r) {
      const what = r.message || (r.key ? `the ${r.key} budget${r.source ? ` (${r.source})` : ""} is reached` : "a budget line is reached");
      this.budgetShown = true;
      const line = this.note(`Stopped: ${what}.`.replace(/\.\.$/, "."), "budget-stop");
      line.setAttribute("role", "status");
      line.dataset.key = r.key || "";
      line.title = "overlord cost budget shows the lines; raise one to let the agent go on";
      return line;
    }
  }

  const view = new ChatView(messages);

  /* -- conversations ----------------------------------------------------------------------------- */
  async function loadChats() {
    try {
      state.chats = (await api("GET", "/api/chats")).chats;
    } catch (e) { return; }
    const list = clear($("chat-list"));
    if (!state.chats.length) list.append(h("p", {class: "muted small"}, "No conversations yet."));
    for (const c of state.chats) {
      list.append(h("button", {class: "chat-item", type: "button", "aria-current": c.sid === state.sid ? "true" : "false",
                               dataset: {sid: c.sid}, onclick: () => { select(c.sid); closeDrawers(); }},
        h("span", {class: "chat-item-title"}, c.title),
        h("span", {class: "chat-item-meta"}, h("span", {class: `dot state-${c.state}${c.running ? " running" : ""}`}),
          c.running ? "working" : stateLabel(c.state), " \u00b7 ", ago(c.created))));
    }
  }

  function laterList() {
    clearTimeout(state.listTimer);
    state.listTimer = setTimeout(loadChats, 250);
  }

  function select(sid) {
    if (state.source) { state.source.close(); state.source = null; }
    state.sid = sid;
    state.chat = null;
    state.detail = null;
    view.reset();
    welcome.hidden = !!sid;
    hideError();
    if (sid) {
      if (location.hash !== `#${sid}`) history.replaceState(null, "", `#${sid}`);
      listen(sid);
      if (ACCOUNTS.me.accounts) mayWriteOf(sid);
    } else {
      history.replaceState(null, "", "/");
      for (const box of document.querySelectorAll("#connector-boxes input")) box.checked = false;
      setRunning(false);
      header(null);
      composerFor(null);
    }
    for (const b of document.querySelectorAll(".chat-item")) b.setAttribute("aria-current", b.dataset.sid === sid ? "true" : "false");
    refreshInspector();
  }

  /* with accounts on: the chat detail's `may_write` (the server's word on this conversation) */
  async function mayWriteOf(sid) {
    let d;
    try { d = await api("GET", `/api/chats/${sid}`); } catch (e) { return; }
    if (sid !== state.sid) return;
    state.detail = {may_write: typeof d.may_write === "boolean" ? d.may_write
                      : d.chat && typeof d.chat.may_write === "boolean" ? d.chat.may_write : undefined};
    if (state.chat) composerFor(state.chat);
    if (state.session) decidePanel(state.session);
  }

  function listen(sid) {
    const source = new EventSource(`/api/chats/${sid}/events`);
    state.source = source;
    const on = (name, fn) => source.addEventListener(name, (e) => { if (state.source === source) fn(JSON.parse(e.data)); });
    on("snapshot", (s) => {
      view.reset();
      state.chat = s.chat;
      for (const r of s.records) view.record(r);
      if (s.pending) view.approval(s.pending, true);
      header(s.chat);
      if (s.partial) {
        if (s.partial.thinking) view.delta("thinking", s.partial.thinking);
        if (s.partial.text) view.delta("text", s.partial.text);
      }
      setRunning(s.running);
      if (!s.running) RUNNING.refresh();        /* a run that ended before the stream opened */
      composerFor(s.chat);
      messages.scrollTop = messages.scrollHeight;
      laterInspector(0);
    });
    on("record", (r) => {
      view.record(r);
      if (r.type === "done") RUNNING.refresh();
      if (r.type === "connectors" && state.chat) header(state.chat);
      if (r.type === "tool_result" && r.paths && r.paths.length) laterInspector(200);
    });
    on("delta", (d) => view.delta(d.kind, d.text));
    on("approval", (p) => view.approval(p, true));
    on("decision", (d) => view.decision(d));
    on("restart", () => view.restart());
    on("state", (s) => {
      setRunning(s.running);
      if (!s.running) { laterInspector(0); laterList(); RUNNING.refresh(); }
    });
  }

  function header(chat) {
    if (!chat) {
      $("chat-title").textContent = "New conversation";
      const s = state.settings;
      $("chat-sub").textContent = s ? `${modelLine(s)} \u00b7 ${s.folder}` : "";
      return;
    }
    $("chat-title").textContent = chat.title;
    const grants = chat.grants || {};
    const sandbox = sandboxWords(grants);
    const granted = chat.connectors && chat.connectors.length ? chat.connectors : view.granted;
    const connectors = granted.length ? ` \u00b7 connectors: ${granted.join(", ")}` : "";
    $("chat-sub").textContent = `${chat.model || "?"} \u00b7 ${(state.settings && state.settings.labels[chat.provider]) || chat.provider || ""} \u00b7 ${sandbox}${connectors} \u00b7 ${chat.target}`;
  }

  /* the tools' grants in a few words: jailed, and offline / recorded (its list, its hold) / host */
  function sandboxWords(g) {
    const allow = g.net_allow || [];
    const net = g.net === "host" ? "host network"
      : g.net === "proxy" ? `recorded network (${allow.length ? `${allow.length} host${allow.length === 1 ? "" : "s"} allowed` : "every public host"}${g.hold_writes ? ", writes held" : ""})`
      : "offline";
    return [g.jail ? "jailed" : "not jailed", net].join(", ");
  }

  function modelLine(s) {
    const prof = s.profiles[s.provider] || {};
    return `${prof.model || "no model chosen"} \u00b7 ${s.labels[s.provider]}`;
  }

  /* may this person write here? (accounts off: always) */
  function writable(chat) {
    return chat ? ACCOUNTS.mayWrite(state.detail, chat) : ACCOUNTS.mayStart();
  }

  function composerFor(chat) {
    const note = $("composer-note");
    const closed = chat && !OPEN.includes(chat.state);
    const readOnly = !writable(chat);
    prompt.disabled = !!closed || readOnly;
    $("send").disabled = !!closed || readOnly;
    $("composer").classList.toggle("read-only", readOnly);
    app.classList.toggle("read-only", readOnly);            /* no Allow / Deny, no Save on a card */
    note.classList.toggle("read-only-note", readOnly);
    prompt.placeholder = readOnly ? (chat ? "Read-only: you may only read this conversation" : "Read-only: viewers start no conversations")
      : "Message the agent";
    clear(note);
    note.hidden = !closed && !readOnly;
    if (readOnly) {
      const me = ACCOUNTS.me;
      note.append(chat ? `You may only read this conversation: as ${me.role === "viewer" ? "a viewer" : me.name} you can follow it, not write in it, commit or discard it.`
        : "You may only read here: as a viewer you can open every conversation, but not start one.");
      if (closed) note.append(" ", chat.state === "committed" ? h("a", {href: `/console#${chat.sid}`}, "Open its dossier in the console") : "");
      return;
    }
    if (closed) {
      OV.append(note, [chat.state === "committed"
        ? ["This conversation was committed. ", h("a", {href: `/console#${chat.sid}`}, "Open its dossier in the console"), "."]
        : chat.state === "unchanged" ? "This conversation changed nothing; there is nothing to commit."
        : "This conversation was discarded (rolled back); your folder was left exactly as it was."]);
    }
  }

  function setRunning(running) {
    state.running = running;
    view.working(running);
    $("send").hidden = running;
    $("stop").hidden = !running;
    $("stop").disabled = false;
    $("stop").textContent = "Stop";
    $("decide").classList.toggle("busy", running);
    for (const id of ["commit", "discard"]) $(id).disabled = running;
    if (!running && state.session && !state.session.changes.length) $("commit").disabled = true;
  }

  /* -- sending ----------------------------------------------------------------------------------- */
  function showError(message, settingsLink) {
    const el = clear($("composer-error"));
    el.append(message);
    if (settingsLink) el.append(" ", h("button", {class: "button ghost small", type: "button", onclick: openSettings}, "Open Settings"));
    el.hidden = false;
  }

  function hideError() { $("composer-error").hidden = true; }

  async function send(ev) {
    ev.preventDefault();
    const text = prompt.value.trim();
    if (!text || state.running) return;
    hideError();
    $("send").disabled = true;
    try {
      if (!state.sid) {
        welcome.hidden = true;
        const pending = view.user(text);
        setRunning(true);
        let res;
        try {
          const body = {message: text};
          const connectors = [...document.querySelectorAll("#connector-boxes input:checked")].map((x) => x.value);
          if (connectors.length) body.connectors = connectors;
          res = await api("POST", "/api/chats", body);
        } catch (e) {
          pending.remove();
          welcome.hidden = false;
          setRunning(false);
          throw e;
        }
        prompt.value = "";
        select(res.sid);
        laterList();
      } else {
        setRunning(true);
        try {
          await api("POST", `/api/chats/${state.sid}/message`, {message: text});
        } catch (e) { setRunning(false); throw e; }
        prompt.value = "";
      }
    } catch (e) {
      showError(e.message, e.status === 409 || e.status === 400);
    } finally {
      $("send").disabled = false;
    }
  }

  /* Allow / Deny: exactly the call waiting (its id and fingerprint), once */
  async function decide(a, allow) {
    const p = a.pending;
    if (!p || !state.sid) return;
    a.allow.disabled = a.deny.disabled = true;
    a.status.textContent = allow ? "Allowing\u2026" : "Denying\u2026";
    try {
      await api("POST", `/api/chats/${state.sid}/approval`, {call: p.call, fingerprint: p.fingerprint, request: p.request, allow});
    } catch (e) {
      a.status.textContent = e.message;
      if (e.status !== 409) a.allow.disabled = a.deny.disabled = false;
    }
  }

  /* Save on a proposal card: exactly that note, accepted by "workspace" (the run may go on) */
  async function saveProposal(p) {
    if (!state.sid || p.saved) return;
    p.save.disabled = true;
    p.status.textContent = "Saving\u2026";
    try {
      const res = await api("POST", `/api/chats/${state.sid}/memory/accept`, {ids: [p.id]});
      const mine = (res.proposals || []).find((x) => x.id === p.id);
      if (mine && mine.accepted) view.accepted({ids: [p.id], by: mine.by || "workspace"});
      else { p.status.textContent = "Not saved: the server did not record it."; p.save.disabled = false; }
    } catch (e) {
      p.status.textContent = e.message;
      p.save.disabled = false;
    }
  }

  async function stop() {
    if (!state.sid) return;
    $("stop").disabled = true;
    $("stop").textContent = "Stopping\u2026";
    try { await api("POST", `/api/chats/${state.sid}/cancel`, {}); } catch (e) { showError(e.message); }
  }

  /* -- the inspector ----------------------------------------------------------------------------- */
  function laterInspector(ms) {
    clearTimeout(state.inspectorTimer);
    state.inspectorTimer = setTimeout(refreshInspector, ms);
  }

  let inspectorSeq = 0;

  async function refreshInspector() {
    const sid = state.sid;
    const seq = ++inspectorSeq;
    if (!sid) {
      for (const id of ["file-list", "diffs", "steps", "gate", "countersign", "egress", "held"]) clear($(id));
      state.session = null;
      $("inspector-empty").hidden = false;
      for (const id of ["steps-section", "gate-section", "countersign-section", "egress-section", "held-box", "held-outcome"]) $(id).hidden = true;
      state.egress = null;
      $("decide").hidden = true;
      $("session-state").hidden = true;
      RUNNING.inspector(null);
      setCount(0);
      return;
    }
    let d;
    try { d = await api("GET", `/api/session/${sid}`); }
    catch (e) {
      if (seq === inspectorSeq && e.status >= 500) laterInspector(800);   // read mid-change: again
      return;
    }
    if (sid !== state.sid || seq !== inspectorSeq) return;     // a later refresh is under way
    state.session = d;
    RUNNING.inspector(d);
    const files = clear($("file-list")), diffs = clear($("diffs")), steps = clear($("steps"));
    const changes = d.changes;
    setCount(changes.length);
    const pill = $("session-state");
    pill.hidden = false;
    pill.className = `pill state-${d.meta.state}`;
    pill.textContent = stateLabel(d.meta.state);
    $("inspector-empty").hidden = changes.length > 0;
    $("inspector-empty").textContent = d.staged
      ? "No changes yet. The files the agent changes appear here; nothing is written to your folder until you commit."
      : d.dropped && d.dropped.length ? "Nothing was committed: every change was left out."
      : "Nothing was changed.";
    const byPath = new Map(d.diffs.map((x, i) => [x.path, [x, i]]));
    /* git's own files: one line per repository (objects, refs moved, ...), its paths folded */
    const repos = ((d.git && d.git.repos) || []).map((r) => ({r, paths: []}));
    const repoOf = (path) => repos.find((g) => path === g.r.dir || path.startsWith(`${g.r.dir}/`));
    const gitPaths = new Set();
    for (const c of changes) { const g = repoOf(c.path); if (g) { g.paths.push(c); gitPaths.add(c.path); } }
    for (const g of repos) {
      if (!g.paths.length) continue;
      files.append(h("li", {class: "file-row git-row", dataset: {repo: g.r.dir}},
        h("span", {class: "badge git-badge", title: "files under .git/"}, "git"),
        h("details", {class: "git-paths"}, h("summary", {title: g.r.line}, g.r.line || g.r.dir),
          g.r.problem ? h("p", {class: "inline-error"}, g.r.problem) : null,
          h("ul", {}, g.paths.map((c) => h("li", {}, kindBadge(c.kind), h("bdi", {}, c.path)))))));
    }
    changes.filter((c) => !gitPaths.has(c.path)).forEach((c) => {
      const found = byPath.get(c.path);
      files.append(h("li", {class: "file-row"}, kindBadge(c.kind),
        found && found[0].directory ? h("span", {class: "dir-path", title: c.path}, h("bdi", {}, `${c.path}/`)) :
        h("a", {href: `#diff-${found ? found[1] : ""}`, title: c.path, onclick: (e) => {
          e.preventDefault();
          const target = found && $(`diff-${found[1]}`);
          if (target) { target.open = true; target.scrollIntoView({block: "start", behavior: "smooth"}); }
        }}, h("bdi", {}, c.path)), found ? delta(found[0]) : null, metaNotes(c)));
    });
    if (d.dropped && d.dropped.length) {
      /* a partial commit: what it left out is listed apart, never as committed */
      files.append(h("li", {class: "file-row dropped-head"}, `Left out of the commit (${d.dropped.length}):`));
      for (const c of d.dropped) {
        files.append(h("li", {class: "file-row dropped"}, kindBadge(c.kind),
          h("span", {class: "dir-path", title: c.path}, h("bdi", {}, c.path)), h("span", {class: "muted small"}, "dropped")));
      }
    }
    d.diffs.forEach((x, i) => { if (!x.directory && !gitPaths.has(x.path)) diffs.append(fileDiff(x, `diff-${i}`)); });
    externalList(d.external);
    egressPanel(d, seq);
    const points = d.savepoints.filter((p) => !(p.cause && p.cause.event === "open" && !p.paths));
    $("steps-section").hidden = !points.length;
    for (const p of points) {
      steps.append(h("li", {}, h("span", {class: "step-n"}, `@${p.n}`),
        h("span", {class: "step-what"}, causeText(p.cause)),
        h("span", {class: "step-paths"}, `${p.paths} path${p.paths === 1 ? "" : "s"}`)));
    }
    /* before Commit: what the content gate says, and the second model's verdicts */
    const reviewable = d.staged && changes.length > 0;
    $("gate-section").hidden = !reviewable;
    clear($("gate")).append(reviewable ? gateView(d.checks) : []);
    $("countersign-section").hidden = !reviewable && !(d.reviews || []).length;
    clear($("countersign")).append(countersignPanel(d, {where: "workspace", onChange: () => { if (state.sid === sid) refreshInspector(); }}));
    decidePanel(d);
  }

  /* the connector calls, from the audit chain: what acted outside, who let it, what came back */
  function externalList(calls) {
    const list = clear($("external"));
    $("external-section").hidden = !calls || !calls.length;
    for (const c of calls || []) {
      const decided = c.decision === "allow" ? `allowed by ${c.approver}`
        : c.decision === "deny" ? `denied by ${c.approver}` : "stopped at the gate";
      const outcome = c.decision !== "allow" ? "not sent"
        : c.outcome === "result" ? `${c.is_error ? "an error" : "a result"}, ${c.size} bytes`
        : c.outcome === "error" ? `failed: ${c.error}`
        : c.outcome === "cancelled" ? "cancelled while it ran (it may have acted)"
        : "sent; no result recorded";
      list.append(h("li", {class: `external-row ${c.decision === "allow" ? "sent" : "held"}`},
        h("span", {class: "external-tool"}, `${c.server} · ${c.tool}`),
        h("span", {class: "muted small"}, `${decided}; ${outcome}`)));
    }
  }

  /* the recorded network: the egress table, and at Commit the held requests to tick */
  async function egressPanel(d, seq) {
    const sid = d.meta.sid, grants = d.meta.grants || {};
    const r = await EGRESS.load(sid, grants);
    if (sid !== state.sid || seq !== inspectorSeq) return;
    state.egress = r;
    $("egress-section").hidden = !r;
    OV.append(clear($("egress")), r ? EGRESS.table(r) : []);
    const staged = d.staged && ACCOUNTS.mayChange(d.meta) && (!state.chat || writable(state.chat));
    const waiting = r && !r.error && (r.held || []).some((q) => q.state === "held");
    const list = r && !r.error && (r.held || []).length ? EGRESS.held(r, staged) : null;
    /* staged: the held list sits at Commit with its checkboxes; decided: with the log, each one's state */
    $("held-box").hidden = !(staged && waiting);
    clear($("held")).append(staged && waiting ? list : []);
    if (!(staged && waiting) && list) $("egress").append(h("h4", {class: "held-title"}, "Held requests"), list);
    const out = $("held-outcome");
    const shown = state.heldOutcome && state.heldOutcome.sid === sid ? EGRESS.outcome(state.heldOutcome.held) : null;
    out.hidden = !shown;
    OV.append(clear(out), shown ? [h("strong", {}, "Held requests at commit"), shown] : []);
  }

  function setCount(n) {
    $("change-count").textContent = n;
    $("change-count-narrow").textContent = n;
  }

  function decidePanel(d) {
    const state_ = d.meta.state;
    $("decide").hidden = false;
    const decided = $("decided");
    clear(decided);
    decided.className = "decided";
    const mine = ACCOUNTS.mayChange(d.meta) && (!state.chat || writable(state.chat));
    const open = d.staged && mine;
    $("decide-row").hidden = !open;
    $("countersigned-label").hidden = !open;
    $("confirm-discard").hidden = true;
    if (!open) $("refusal").hidden = true;
    decided.hidden = open;
    if (d.staged && !mine) {
      decided.append("Not decided yet. You may only read this session: its owner or an admin commits or discards it.");
    } else if (state_ === "committed") {
      const left = d.dropped && d.dropped.length ? ` ${d.dropped.length} change${d.dropped.length === 1 ? " was" : "s were"} left out.` : "";
      decided.append(`Committed to ${d.meta.target}.${left} `, h("a", {href: `/console#${d.meta.sid}`}, "Open the dossier"));
    } else if (state_ === "rolled-back") {
      decided.classList.add("voided");
      decided.append("Discarded (rolled back). Your folder was left exactly as it was.");
    } else if (state_ === "unchanged") {
      decided.classList.add("voided");
      decided.append("Unchanged: the session changed nothing, so there is nothing to commit.");
    }
    for (const id of ["commit", "discard"]) $(id).disabled = state.running;
    if (!d.changes.length) $("commit").disabled = true;
  }

  async function commit(opts) {
    opts = opts || {};
    const sid = state.sid;
    const refusal = clear($("refusal"));
    refusal.hidden = true;
    $("commit").disabled = true;
    const body = {};
    if (opts.force) body.force = true;
    if (opts.allowPrivileged) body.allow_privileged_modes = true;
    if ($("countersigned").checked) body.countersigned = true;
    if (state.egress && state.egress.sid === sid && !state.egress.error && (state.egress.held || []).some((q) => q.state === "held")) {
      body.release = EGRESS.chosen($("held"));      /* the ticked ones are sent; the rest dropped */
    }
    let res;
    try {
      res = await api("POST", `/api/session/${sid}/commit`, body);
    } catch (e) {
      refusal.append(h("strong", {}, "Commit refused. Nothing was written."));
      const drifts = e.data.drifts || [];
      if (e.data.privileged) {
        /* setuid / setgid bits, file capabilities, ACLs: never committed without a person saying so */
        refusal.append(h("span", {}, privilegeText(e.data)));
        const allow = h("input", {type: "checkbox", id: "allow-privileged"});
        const go = h("button", {class: "button danger small", type: "button", disabled: true,
                                onclick: () => commit(Object.assign({}, opts, {allowPrivileged: true}))}, "Commit with these privileges");
        allow.addEventListener("change", () => { go.disabled = !allow.checked; });
        refusal.append(h("label", {class: "small allow-privileged", for: "allow-privileged"}, allow,
                         " Allow privileged modes: let this commit add setuid/setgid bits, file capabilities and ACLs"),
                       h("div", {}, go));
      } else if (drifts.length) {
        refusal.append(h("ul", {}, drifts.map((x) => h("li", {}, x.words))));
        if (drifts.every((x) => x.forceable)) {
          refusal.append(h("span", {}, "Committing anyway overwrites those outside changes with the agent's."),
            h("div", {}, h("button", {class: "button danger small", type: "button",
                                      onclick: () => commit(Object.assign({}, opts, {force: true}))}, "Commit anyway")));
        } else {
          refusal.append(h("span", {}, "These cannot be overridden: discard this conversation, or start again from the folder as it is now."));
        }
      } else {
        refusal.append(h("span", {class: "refusal-line"}, e.message));
        if (e.data.forceable) {
          /* a fresh rejection by the second model: only a person's explicit override passes it */
          refusal.append(h("div", {}, h("button", {class: "button danger small", type: "button",
                                                   onclick: () => commit(Object.assign({}, opts, {force: true}))}, "Commit over the rejection")));
        }
      }
      refusal.hidden = false;
      $("commit").disabled = false;
      return;
    }
    state.heldOutcome = res && res.held ? {sid, held: res.held} : null;
    await refreshInspector();
    laterList();
  }

  async function discard() {
    $("confirm-discard").hidden = true;
    try {
      await api("POST", `/api/session/${state.sid}/rollback`, {});
    } catch (e) {
      const refusal = clear($("refusal"));
      refusal.append(e.message);
      refusal.hidden = false;
    }
    await refreshInspector();
    laterList();
  }

  /* -- settings ----------------------------------------------------------------------------------- */
  const dialog = $("settings");
  const KNOB_IDS = [...document.querySelectorAll("[data-knob]")];
  const edit = {data: null, profiles: null, provider: null, dirty: new Set(), models: {}};

  async function loadSettings() {
    try { state.settings = await api("GET", "/api/settings"); } catch (e) { return; }
    const s = state.settings;
    $("welcome-folder").textContent = s.folder;
    const sandbox = sandboxWords(s.sandbox);
    const keyNote = s.keys[s.provider] || !s.needs_key.includes(s.provider) ? "" : ` \u00b7 ${NO_KEY}`;
    $("welcome-model").textContent = `${modelLine(s)} \u00b7 tools ${sandbox}${keyNote}`;
    if (!state.sid) header(null);
    loadConnectors();
  }

  /* the configured connectors: one checkbox each on the welcome screen (granted per conversation) */
  async function connectorData() {
    try { state.connectors = await api("GET", "/api/connectors"); state.connectorError = null; }
    catch (e) { state.connectors = null; state.connectorError = e.message; }
    return state.connectors;
  }

  const ADD_HINT = ["No connectors configured. Add one on this machine with ", h("code", {}, "overlord mcp add NAME --command CMD"),
                    " (or ", h("code", {}, "--url URL"), "), then it shows here."];

  async function loadConnectors() {
    const checked = new Set([...document.querySelectorAll("#connector-boxes input:checked")].map((x) => x.value));
    const data = await connectorData();
    const boxes = clear($("connector-boxes"));
    $("welcome-connectors").hidden = false;
    if (!data) { boxes.append(h("p", {class: "muted small"}, `Connectors could not be read: ${state.connectorError}`)); return; }
    if (!data.connectors.length) { boxes.append(h("p", {class: "muted small connector-none"}, ADD_HINT)); return; }
    for (const c of data.connectors) {
      const id = `connector-${c.name}`;
      boxes.append(h("label", {class: "connector-box", for: id},
        h("input", {type: "checkbox", id, value: c.name, checked: checked.has(c.name)}),
        h("span", {class: "connector-box-name"}, c.name),
        h("span", {class: "muted small"}, `${c.transport}${c.approval ? ` \u00b7 approval: ${c.approval}` : ""}`)));
    }
  }

  async function fillConnectors() {
    const data = await connectorData();
    const list = clear($("s-connectors"));
    const mode = $("s-approval");
    if (!data) { list.append(h("li", {class: "muted small"}, `Connectors could not be read: ${state.connectorError}`)); mode.textContent = ""; return; }
    if (!data.servers.length) list.append(h("li", {class: "muted small"}, ADD_HINT));
    for (const c of data.servers) {
      const where = c.transport === "http" ? c.url : [c.command, ...(c.args || [])].filter(Boolean).join(" ");
      list.append(h("li", {class: "connector-row"}, h("span", {class: "connector-box-name"}, c.name),
        h("span", {class: "pill"}, c.transport), h("code", {class: "connector-where", title: where || ""}, where || "")));
    }
    mode.textContent = `Approval mode: ${APPROVAL_WORDS[data.approval] || data.approval}.`;
  }

  async function openSettings() {
    closeDrawers();
    await loadSettings();
    const s = state.settings;
    if (!s) return;
    edit.data = s;
    edit.profiles = JSON.parse(JSON.stringify(s.profiles));
    edit.provider = s.provider;
    edit.dirty = new Set();
    const sel = clear($("s-provider"));
    for (const p of s.providers) sel.append(h("option", {value: p}, s.labels[p]));
    sel.value = s.provider;
    $("s-folder").value = s.folder;
    $("s-jail").checked = !!s.sandbox.jail;
    $("s-net").value = s.sandbox.net;
    $("s-net-allow").value = (s.sandbox.net_allow || []).join("\n");
    $("s-hold-writes").checked = !!s.sandbox.hold_writes;
    proxyFields();
    $("settings-saved").textContent = "";
    clearErrors();
    fillProfile();
    fillCountersign();
    fillConnectors();
    fillMemory();
    fillSkills();
    ACCOUNTS.fillSettings();
    RUNNING.fillNotifications();
    if (!dialog.open) dialog.showModal();
    loadModels();
    loadCsModels();
  }

  /* -- Settings -> Memory: your notes (editable), the folder's notes and journal (read-only) ------------- */
  const memory = {text: null, cap: 0, seq: 0};

  function bytesOf(text) { return new TextEncoder().encode(text).length; }

  function userSize() {
    const n = bytesOf($("m-user").value), cap = memory.cap;
    const el = $("m-user-size");
    el.textContent = !cap ? `${n.toLocaleString()} bytes.`
      : n > cap ? `${n.toLocaleString()} bytes: over the ${cap.toLocaleString()} the agent is told. It is told the newest ${cap.toLocaleString()} bytes, and that older notes were cut.`
      : `${n.toLocaleString()} of the ${cap.toLocaleString()} bytes the agent is told.`;
    el.classList.toggle("over", !!cap && n > cap);
  }

  async function fillMemory() {
    const seq = ++memory.seq;
    memory.typed = false;
    for (const id of ["m-user-error", "m-error", "m-user-saved"]) $(id).textContent = "";
    try {
      const u = await api("GET", "/api/memory/user");
      if (seq !== memory.seq) return;
      memory.text = u.text || "";
      memory.cap = u.cap || 0;
      /* what the person typed while the notes loaded stays (Save then keeps it) */
      if (!memory.typed) $("m-user").value = memory.text;
      userSize();
    } catch (e) {
      if (seq === memory.seq) $("m-user-error").textContent = `Your notes could not be read: ${e.message}`;
    }
    await fillFolderMemory(seq);
  }

  async function fillFolderMemory(seq) {
    let f;
    try { f = await api("GET", "/api/memory"); }
    catch (e) { if (seq === memory.seq) $("m-error").textContent = `The folder's memory could not be read: ${e.message}`; return; }
    if (seq !== memory.seq) return;
    $("m-folder").textContent = f.folder;
    const sources = f.sources || [];
    const project = sources.find((x) => x.name === "project");
    const pre = $("m-project");
    pre.textContent = project && typeof project.text === "string" ? project.text : "";
    pre.hidden = !pre.textContent;
    const size = project ? project.bytes || 0 : 0;
    /* the text itself when the source carries it; otherwise it is in what the agent is told */
    const inTold = size && !pre.textContent ? " Its text is under \u201cExactly what the agent is told\u201d below." : "";
    $("m-project-note").textContent = !project || (!size && !project.warning) ? "No OVERLORD.md in this folder yet."
      : project.warning ? project.warning
      : project.cut ? `${size.toLocaleString()} bytes; the agent is told the newest ${project.shown.toLocaleString()}.${inTold}`
      : `${size.toLocaleString()} bytes.${inTold}`;
    if (inTold) $("m-told").closest("details").open = true;
    journalList(f.journal || []);
    $("m-told").textContent = f.text || "(nothing: no notes and no journal yet)";
    $("m-told-digest").textContent = [f.sha256 ? `sha256 ${f.sha256.slice(0, 16)}\u2026` : null,
      ...sources.map((x) => `${x.name}: ${(x.bytes || 0).toLocaleString()} bytes${x.cut ? `, ${x.cut.toLocaleString()} cut` : ""}`)]
      .filter(Boolean).join(" \u00b7 ");
  }

  /* the journal: OVERLORD's record of each commit; the model's claim labelled as its own */
  function journalList(entries) {
    const list = clear($("m-journal"));
    if (!entries.length) { list.append(h("li", {class: "muted small journal-none"}, "No committed agent work in this folder yet.")); return; }
    for (const e of [...entries].reverse()) {
      const files = e.files || [];
      const when = typeof e.at === "number" ? new Date(e.at * 1000).toLocaleString() : String(e.at || "");
      list.append(h("li", {class: "journal-entry", dataset: {sid: e.sid || ""}},
        h("p", {class: "journal-head small"}, h("a", {href: `/console#${e.sid}`}, e.sid), ` \u00b7 ${when} \u00b7 `,
          `${e.changes} change${e.changes === 1 ? "" : "s"} committed`),
        h("p", {class: "journal-task"}, h("span", {class: "journal-label"}, "Task: "), e.task || ""),
        e.claim ? h("div", {class: "journal-claim"}, h("span", {class: "journal-label claim-label"}, "The model's own claim (not checked):"),
                    h("p", {class: "claim-text"}, e.claim)) : null,
        files.length ? h("p", {class: "journal-files small"}, h("span", {class: "journal-label"}, "Files changed: "),
                         files.join(", "), e.changes > files.length ? ` \u2026 and ${e.changes - files.length} more` : "") : null));
    }
  }

  async function saveUserNotes() {
    const text = $("m-user").value;
    $("m-user-error").textContent = "";
    $("m-user-saved").textContent = "";
    $("m-user-save").disabled = true;
    try {
      const u = await api("PUT", "/api/memory/user", {text});
      memory.text = u.text || "";
      memory.cap = u.cap || memory.cap;
      if ($("m-user").value === text) $("m-user").value = memory.text;
      userSize();
      $("m-user-saved").textContent = `Saved (${(u.bytes || 0).toLocaleString()} bytes).`;
      fillFolderMemory(memory.seq);
      return true;
    } catch (e) {
      $("m-user-error").textContent = e.message;
      return false;
    } finally {
      $("m-user-save").disabled = false;
    }
  }

  /* -- Settings -> Skills: the folder's catalogue; machine skills added and removed here ---------------- */
  async function fillSkills(keepStatus) {
    const list = clear($("k-list")), warnings = clear($("k-warnings"));
    $("k-error").textContent = "";
    if (!keepStatus) $("k-status").textContent = "";
    let data;
    try { data = await api("GET", "/api/skills"); }
    catch (e) { list.append(h("li", {class: "muted small"}, `The skills could not be read: ${e.message}`)); return; }
    if (!data.skills.length) {
      const admin = !ACCOUNTS.me.accounts || ACCOUNTS.me.role === "admin";    /* machine skills: an admin's */
      list.append(h("li", {class: "muted small skill-none"}, [admin ? "No skills yet. Add one below, or " : "No skills yet. An admin adds machine skills (",
        h("code", {}, "overlord skills add PATH"), " / ", h("code", {}, "overlord skills new NAME -t DIR"), admin ? "." : "); a folder brings its own in .overlord/skills/."]));
    }
    for (const k of data.skills) list.append(skillRow(k));
    for (const w of data.warnings || []) warnings.append(h("li", {class: "skill-warning small"}, typeof w === "string" ? w : w.message || JSON.stringify(w)));
  }

  function skillRow(k) {
    const project = k.source === "project";
    const show = h("button", {class: "button ghost small", type: "button"}, "Show");
    const remove = !project ? h("button", {class: "button ghost danger-text small admin-only", type: "button"}, "Remove") : null;
    const confirm = h("span", {class: "skill-confirm small", hidden: true});
    const row = h("li", {class: `skill-row${k.shadowed ? " shadowed" : ""}${k.allowed === false ? " not-allowed" : ""}`,
                         dataset: {skill: k.name, source: project ? "project" : "machine"}},
      h("div", {class: "skill-line"},
        h("code", {class: "skill-name"}, k.name),
        h("span", {class: `pill skill-source source-${project ? "project" : "machine"}`}, project ? "project" : "machine"),
        k.shadowed ? h("span", {class: "pill skill-flag"}, "shadowed by the project's own") : null,
        k.allowed === false ? h("span", {class: "pill skill-flag deny"}, "not allowed here by policy") : null,
        h("span", {class: "skill-actions"}, show, remove)),
      h("p", {class: "skill-desc small"}, k.description || ""),
      k.when ? h("p", {class: "skill-when small"}, h("span", {class: "journal-label"}, "When: "), k.when) : null,
      confirm);
    show.addEventListener("click", () => showSkill(k));
    if (remove) {
      remove.addEventListener("click", () => {
        clear(confirm).append(`Remove the machine skill ${k.name} from this machine? `,
          h("button", {class: "button danger small", type: "button", onclick: () => removeSkill(k.name)}, "Remove"), " ",
          h("button", {class: "button ghost small", type: "button", onclick: () => { confirm.hidden = true; }}, "Keep"));
        confirm.hidden = false;
      });
    }
    return row;
  }

  async function showSkill(k) {
    const box = $("k-shown");
    $("k-error").textContent = "";
    try {
      const s = await api("GET", `/api/skills/${encodeURIComponent(k.name)}`);
      $("k-shown-name").textContent = s.name || k.name;
      $("k-shown-where").textContent = ` ${s.source || k.source} skill${s.path ? ` \u00b7 ${s.path}` : ""}`;
      $("k-shown-text").textContent = s.text || "";
      const files = clear($("k-shown-files"));
      for (const f of s.files || []) files.append(h("li", {}, typeof f === "string" ? f : f.path || JSON.stringify(f)));
      box.hidden = false;
      box.scrollIntoView({block: "nearest"});
    } catch (e) { $("k-error").textContent = e.message; }
  }

  async function removeSkill(name) {
    $("k-error").textContent = "";
    try {
      await api("DELETE", `/api/skills/${encodeURIComponent(name)}`);
      $("k-status").textContent = `Removed ${name}.`;
      if ($("k-shown-name").textContent === name) $("k-shown").hidden = true;
    } catch (e) { $("k-error").textContent = e.message; return; }
    fillSkills(true);
  }

  async function addSkill() {
    const path = $("k-path").value.trim();
    $("k-error").textContent = "";
    $("k-status").textContent = "";
    if (!path) { $("k-error").textContent = "Name the skill's folder first (it holds SKILL.md)."; return; }
    $("k-add").disabled = true;
    try {
      const res = await api("POST", "/api/skills", {path});
      const added = res.added || {};
      $("k-status").textContent = `Added ${added.name || path}.`;
      $("k-path").value = "";
      fillSkills(true);
    } catch (e) {
      $("k-error").textContent = e.message;
    } finally { $("k-add").disabled = false; }
  }

  /* -- Settings -> Countersignature: the second model ----------------------------------------------- */
  function fillCountersign() {
    const cs = edit.data.countersign || {};
    const sel = clear($("cs-provider"));
    sel.append(h("option", {value: ""}, "none (no second model yet)"));
    for (const p of edit.data.providers) sel.append(h("option", {value: p}, edit.data.labels[p]));
    sel.value = cs.provider || "";
    $("cs-base-url").value = cs.base_url || "";
    $("cs-headers").value = headerText(cs.headers);
    $("cs-key").value = "";
    csProviderShown(cs.model);
  }

  function csProviderShown(model) {
    const provider = $("cs-provider").value, demo = provider === edit.data.demo;
    for (const el of dialog.querySelectorAll(".cs-only")) el.hidden = !provider;
    for (const el of dialog.querySelectorAll(".cs-remote")) el.hidden = !provider || demo;
    $("cs-demo-note").hidden = !demo;
    const src = edit.data.keys[provider];
    $("cs-key-status").textContent = !provider ? "" : src === "env" ? "A key comes from the environment."
      : src === "store" ? "A key for this provider is stored (mode 600); the agent's profile shares it. Type a new one to replace it."
      : src === "vault" ? `The key comes from the vault (providers/${provider}); a key typed here would be stored and used instead.`
      : !edit.data.needs_key.includes(provider) ? "Optional for compatible endpoints." : "No key stored for this provider yet.";
    csModelOptions(edit.models[`cs:${provider}`] || [], model);
    $("cs-model-typed").value = "";
  }

  function csModelOptions(list, current) {
    const sel = clear($("cs-model"));
    sel.append(h("option", {value: ""}, list.length ? "choose a model" : "(no list loaded)"));
    for (const m of list) sel.append(h("option", {value: m.id}, m.name && m.name !== m.id ? `${m.name} (${m.id})` : m.id));
    if (current && !list.some((m) => m.id === current)) sel.append(h("option", {value: current}, `${current} (saved)`));
    sel.value = current || (list.length === 1 ? list[0].id : "");
  }

  async function loadCsModels() {
    const provider = $("cs-provider").value;
    const status = $("cs-model-status");
    status.textContent = "";
    if (!provider) return;
    status.textContent = "Loading the endpoint's models\u2026";
    const q = new URLSearchParams({provider, role: "countersign"});
    const base = $("cs-base-url").value.trim();
    if (base && provider !== edit.data.demo) q.set("base_url", base);
    try {
      const res = await api("GET", `/api/models?${q}`);
      if (provider !== $("cs-provider").value) return;
      edit.models[`cs:${provider}`] = res.models;
      csModelOptions(res.models, $("cs-model-typed").value.trim() || $("cs-model").value ||
                     ((edit.data.countersign || {}).provider === provider ? edit.data.countersign.model : ""));
      status.textContent = `${res.models.length} model${res.models.length === 1 ? "" : "s"} served right now.`;
    } catch (e) {
      if (provider !== $("cs-provider").value) return;
      status.textContent = `The list could not be loaded: ${e.message}. You can type a model id.`;
    }
  }

  function collectCountersign() {
    const provider = $("cs-provider").value;
    if (!provider) return {provider: ""};
    return {provider, model: $("cs-model-typed").value.trim() || $("cs-model").value,
            base_url: provider === edit.data.demo ? "" : $("cs-base-url").value.trim(),
            headers: provider === edit.data.demo ? {} : $("cs-headers").value};
  }

  function fillProfile() {
    const p = edit.profiles[edit.provider];
    const demo = edit.provider === edit.data.demo;
    for (const id of ["s-base-url", "s-headers", "s-key"]) $(id).closest(".field").hidden = demo;
    $("s-demo-note").hidden = !demo;
    $("s-base-url").value = p.base_url || "";
    $("s-headers").value = headerText(p.headers);
    $("s-system").value = p.system || "";
    $("s-key").value = "";
    const src = edit.data.keys[edit.provider];
    $("s-key-status").textContent = src === "env" ? "A key comes from the environment; a stored one would be ignored."
      : src === "store" ? "A key is stored (mode 600). It is never shown again; type a new one to replace it."
      : src === "vault" ? `The key comes from the vault (providers/${edit.provider}); a key typed here would be stored and used instead.`
      : !edit.data.needs_key.includes(edit.provider) ? "Optional for compatible endpoints." : "No key stored yet.";
    for (const el of KNOB_IDS) {
      const v = (p.knobs || {})[el.dataset.knob];
      el.value = v === undefined || v === null ? "" : Array.isArray(v) ? v.join("\n") : String(v);
    }
    modelOptions(edit.models[edit.provider] || [], p.model);
    $("s-model-typed").value = "";
  }

  /* headers as typed ("Name: value" lines); the server parses and checks them */
  function headerText(headers) {
    if (typeof headers === "string") return headers;
    return Object.entries(headers || {}).map(([k, v]) => `${k}: ${v}`).join("\n");
  }

  function modelOptions(list, current) {
    const sel = clear($("s-model"));
    sel.append(h("option", {value: ""}, list.length ? "choose a model" : "(no list loaded)"));
    const ids = new Set();
    for (const m of list) {
      ids.add(m.id);
      sel.append(h("option", {value: m.id}, m.name && m.name !== m.id ? `${m.name} (${m.id})` : m.id));
    }
    if (current && !ids.has(current)) sel.append(h("option", {value: current}, `${current} (saved)`));
    /* one model served and none chosen yet: that one */
    sel.value = current || (list.length === 1 ? list[0].id : "");
  }

  function collectProfile() {
    const p = edit.profiles[edit.provider];
    const typed = $("s-model-typed").value.trim();
    const knobs = {};
    for (const el of KNOB_IDS) {
      const v = el.value.trim();
      if (!v) continue;
      knobs[el.dataset.knob] = el.dataset.knob === "stop" ? v.split("\n").map((x) => x.trim()).filter(Boolean)
        : el.dataset.bool ? v === "true" : v;
    }
    const next = {model: typed || $("s-model").value, base_url: $("s-base-url").value.trim(),
                  headers: $("s-headers").value, system: $("s-system").value, knobs};
    const before = JSON.stringify([p.model, p.base_url, p.system, p.knobs, headerText(p.headers)]);
    const after = JSON.stringify([next.model, next.base_url, next.system, next.knobs, next.headers]);
    if (before !== after) edit.dirty.add(edit.provider);
    edit.profiles[edit.provider] = Object.assign({}, p, next);
    return next;
  }

  async function loadModels() {
    const provider = edit.provider;
    const status = $("s-model-status");
    status.textContent = "Loading the endpoint's models\u2026";
    const base = $("s-base-url").value.trim();
    const q = new URLSearchParams({provider});
    if (base) q.set("base_url", base);
    try {
      const res = await api("GET", `/api/models?${q}`);
      if (provider !== edit.provider) return;
      edit.models[provider] = res.models;
      const current = $("s-model-typed").value.trim() || $("s-model").value || edit.profiles[provider].model;
      modelOptions(res.models, current);
      status.textContent = provider === edit.data.demo
        ? "The demo script plays the model: no key, no network. Save, then send any message."
        : `${res.models.length} model${res.models.length === 1 ? "" : "s"} served by the endpoint right now` +
          (res.models.length === 1 && !current ? " (chosen for you)." : ".");
    } catch (e) {
      if (provider !== edit.provider) return;
      status.textContent = `The list could not be loaded: ${e.message}. You can type a model id.`;
    }
  }

  /* the recorded network's own grants show (and are sent) only when it is chosen */
  function proxyFields() { $("s-proxy").hidden = $("s-net").value !== "proxy"; }

  function sandboxBody() {
    const net = $("s-net").value, proxy = net === "proxy";
    return {jail: $("s-jail").checked, net, net_allow: proxy ? $("s-net-allow").value : [],
            hold_writes: proxy && $("s-hold-writes").checked};
  }

  function clearErrors() {
    for (const el of dialog.querySelectorAll(".field-error")) el.textContent = "";
    for (const el of dialog.querySelectorAll(".invalid")) el.classList.remove("invalid");
  }

  const FIELD_IDS = {provider: "s-provider", model: "s-model", base_url: "s-base-url", headers: "s-headers",
                     api_key: "s-key", system: "s-system", folder: "s-folder", jail: "s-jail", net: "s-net",
                     net_allow: "s-net-allow", hold_writes: "s-hold-writes",
                     max_tokens: "s-max-tokens", temperature: "s-temperature", top_p: "s-top-p",
                     effort: "s-effort", thinking: "s-thinking", api: "s-api", stop: "s-stop",
                     stream: "s-stream", fallbacks: "s-fallbacks", azure_api_version: "s-azure-version",
                     cs_provider: "cs-provider", cs_model: "cs-model", cs_base_url: "cs-base-url",
                     cs_headers: "cs-headers", cs_api_key: "cs-key"};

  function fieldError(field, message) {
    const slot = dialog.querySelector(`.field-error[data-for="${field}"]`) ||
                 dialog.querySelector('.field-error[data-for="provider"]');
    slot.textContent = message;
    const input = $(FIELD_IDS[field]);
    if (input) { input.classList.add("invalid"); input.focus(); }
  }

  async function saveSettings(ev) {
    ev.preventDefault();
    clearErrors();
    collectProfile();
    const current = edit.provider;
    const others = [...edit.dirty].filter((p) => p !== current);
    try {
      for (const p of others) {
        edit.provider = p;
        await api("PUT", "/api/settings", {provider: p, profile: edit.profiles[p]});
        edit.dirty.delete(p);
      }
      edit.provider = current;
      const body = {provider: current, profile: edit.profiles[current], folder: $("s-folder").value,
                    sandbox: sandboxBody(),
                    countersign: collectCountersign()};
      const key = $("s-key").value.trim();
      if (key) body.api_key = key;
      const csKey = $("cs-key").value.trim();
      if (csKey) body.countersign_key = csKey;
      edit.data = await api("PUT", "/api/settings", body);
      edit.dirty.clear();
      edit.profiles = JSON.parse(JSON.stringify(edit.data.profiles));
      state.settings = edit.data;
      loadSettings();
      if (!edit.profiles[current].model && current !== edit.data.demo) {
        /* saved (the key too, so the list can load now), but a conversation needs a model */
        fillProfile();
        $("settings-saved").textContent = "Saved, but no model is chosen yet.";
        fieldError("model", "Choose a model from the list (or type its id), then Save again: a conversation needs one.");
        loadModels();
        return;
      }
      if (memory.typed && $("m-user").value !== memory.text && !(await saveUserNotes())) {
        $("m-user").focus();
        return;                                /* your notes were refused: say so, stay open */
      }
      dialog.close();
      flashSaved();
    } catch (e) {
      if (edit.provider !== current) {
        $("s-provider").value = edit.provider;
        fillProfile();
      }
      fieldError(e.data.field || "provider", e.message);
    }
  }

  function flashSaved() {
    const note = $("composer-note");
    if (!note.hidden) return;                  /* a closed conversation's note stays */
    clear(note).append("Settings saved. New conversations use them.");
    note.hidden = false;
    setTimeout(() => { if (note.textContent.startsWith("Settings saved")) note.hidden = true; }, 4000);
  }

  /* -- narrow screens: the list and the change are drawers ------------------------------------------- */
  function closeDrawers() { app.classList.remove("show-rail", "show-inspector"); $("scrim").hidden = true; }
  function openDrawer(cls) { app.classList.add(cls); $("scrim").hidden = false; }

  /* -- wiring ------------------------------------------------------------------------------------- */
  $("composer").addEventListener("submit", send);
  prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => { select(null); closeDrawers(); prompt.focus(); });
  $("commit").addEventListener("click", () => commit({}));
  $("discard").addEventListener("click", () => { $("confirm-discard").hidden = false; $("discard-yes").focus(); });
  $("discard-yes").addEventListener("click", discard);
  $("discard-no").addEventListener("click", () => { $("confirm-discard").hidden = true; });
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", saveSettings);
  $("settings-close").addEventListener("click", () => dialog.close());
  $("settings-cancel").addEventListener("click", () => dialog.close());
  $("s-refresh").addEventListener("click", loadModels);
  $("s-provider").addEventListener("change", () => {
    collectProfile();
    edit.provider = $("s-provider").value;
    clearErrors();
    fillProfile();
    loadModels();
  });
  $("s-base-url").addEventListener("change", loadModels);
  $("s-net").addEventListener("change", proxyFields);
  $("cs-provider").addEventListener("change", () => { csProviderShown(""); loadCsModels(); });
  $("cs-base-url").addEventListener("change", loadCsModels);
  $("cs-refresh").addEventListener("click", loadCsModels);
  for (const b of document.querySelectorAll("#settings-nav [data-goto]")) {
    b.addEventListener("click", () => $(b.dataset.goto).scrollIntoView({block: "start"}));
  }
  $("m-user").addEventListener("input", () => { memory.typed = true; userSize(); $("m-user-saved").textContent = ""; });
  $("m-user-save").addEventListener("click", saveUserNotes);
  $("k-add").addEventListener("click", addSkill);
  $("k-path").addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); addSkill(); } });
  $("k-shown-close").addEventListener("click", () => { $("k-shown").hidden = true; });
  for (const id of ["s-model", "s-model-typed"]) {
    $(id).addEventListener("input", () => {           /* a model chosen: the "no model" note goes */
      $("settings-saved").textContent = "";
      dialog.querySelector('.field-error[data-for="model"]').textContent = "";
      $("s-model").classList.remove("invalid");
    });
  }
  $("rail-open").addEventListener("click", () => openDrawer("show-rail"));
  $("rail-close").addEventListener("click", closeDrawers);
  $("inspector-open").addEventListener("click", () => openDrawer("show-inspector"));
  $("inspector-close").addEventListener("click", closeDrawers);
  $("scrim").addEventListener("click", closeDrawers);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeDrawers(); });
  window.addEventListener("hashchange", () => {
    const sid = location.hash.slice(1);
    if (SID_RE.test(sid) && sid !== state.sid) select(sid);
  });

  ACCOUNTS.load().then(() => { ACCOUNTS.rail(); RUNNING.start(); return loadSettings(); }).then(() => {
    const sid = location.hash.slice(1);
    select(SID_RE.test(sid) ? sid : null);
    loadChats();
  });
})();
