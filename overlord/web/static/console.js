/* The console: the register of every session and, for the selected one, its dossier -- the
   document a person reads before signing: grants, manifest, savepoints, diff, disposition. */
"use strict";

(() => {
  const {h, clear, api, kindBadge, fileDiff, causeText, short, stateLabel, metaNotes, privilegeText, SID_RE,
         gateView, countersignPanel} = OV;
  const $ = (id) => document.getElementById(id);
  const register = $("register"), paper = $("paper"), blame = $("blame");
  let current = null, dossier = null, openTimer = null, egress = null, heldOutcome = null;

  /* -- the register ------------------------------------------------------------------------------- */
  function rows() { return [...register.querySelectorAll(".reg-row")]; }

  function mark(sid) {
    for (const r of rows()) r.setAttribute("aria-selected", r.dataset.sid === sid ? "true" : "false");
    const row = register.querySelector(`.reg-row[data-sid="${sid}"]`);
    if (row) row.scrollIntoView({block: "nearest"});
  }

  async function reloadRegister() {
    let list;
    try { list = (await api("GET", "/api/sessions")).sessions; } catch (e) { return; }
    clear(register);
    for (const s of list) {
      const when = s.created ? new Date(s.created * 1000) : null;
      const stamp = when ? `${when.getFullYear()}-${String(when.getMonth() + 1).padStart(2, "0")}-${String(when.getDate()).padStart(2, "0")} ${String(when.getHours()).padStart(2, "0")}:${String(when.getMinutes()).padStart(2, "0")}` : "";
      register.append(h("li", {class: "reg-row", dataset: {sid: s.sid, state: s.state}},
        h("a", {class: "reg-link", href: `/console#${s.sid}`},
          h("span", {class: `dot state-${s.state}`, "aria-hidden": "true"}),
          h("span", {class: "reg-main"},
            h("span", {class: "reg-what"}, s.command || "-"),
            h("span", {class: "reg-meta"}, h("span", {class: "mono"}, s.sid), ` \u00b7 ${stateLabel(s.state)} \u00b7 ${s.chat ? "chat" : "command"} \u00b7 ${s.layers} savepoints`),
            h("span", {class: "reg-target mono"}, s.target || "")),
          h("span", {class: "reg-when"}, stamp))));
    }
    $("register-count").textContent = `${list.length} session${list.length === 1 ? "" : "s"}`;
    if (current) mark(current);
  }

  function move(step) {
    const all = rows();
    if (!all.length) return;
    let i = all.findIndex((r) => r.dataset.sid === current);
    i = i < 0 ? 0 : Math.min(all.length - 1, Math.max(0, i + step));
    const sid = all[i].dataset.sid;
    current = sid;
    mark(sid);
    history.replaceState(null, "", `#${sid}`);
    clearTimeout(openTimer);
    openTimer = setTimeout(() => show(sid), 120);
  }

  /* -- the dossier ------------------------------------------------------------------------------- */
  async function show(sid) {
    current = sid;
    mark(sid);
    let d;
    try { d = await api("GET", `/api/session/${sid}`); }
    catch (e) {
      clear(paper).append(h("p", {class: "note error"}, e.message));
      return;
    }
    if (sid !== current) return;
    const eg = await EGRESS.load(sid, d.meta.grants);
    if (sid !== current) return;
    dossier = d;
    egress = eg;
    render(d);
  }

  function section(n, title, ...body) {
    return h("section", {class: "doc-section"}, h("h3", {}, h("span", {class: "sec-n"}, `${n}.`), title), body);
  }

  function render(d) {
    const m = d.meta;
    const staged = d.staged;
    clear(paper);
    paper.append(
      h("header", {class: "doc-head"},
        h("h2", {}, m.command || m.sid),
        h("span", {class: `pill state-${m.state}`}, stateLabel(m.state)),
        h("span", {class: "doc-sid"}, m.sid)),
      h("p", {class: "doc-sub"}, `${m.target} \u00b7 ${m.backend} backend \u00b7 opened ${when(m.created)}`,
        m.forked_from ? ` \u00b7 forked from ${m.forked_from.sid} at @${m.forked_from.at}` : "",
        d.running ? " \u00b7 the agent is working in it now" : ""),
      ...[["Grant envelope", envelope(d)],
          ["Manifest", manifest(d)],
          d.external && d.external.length ? ["External actions", external(d.external)] : null,
          egress ? ["Egress", egressSection(d)] : null,
          ["Savepoint chain", chain(d)],
          ["Per-file diff", diffSection(d)],
          ["Countersignature", countersignPanel(d, {where: "console", onChange: () => { if (current === m.sid) show(m.sid); }})],
          ["Disposition", disposition(d)]]
        .filter(Boolean).map(([title, body], i) => section(i + 1, title, body)));
  }

  /* connector calls, from the audit chain: they acted outside the sandbox and the manifest */
  function external(calls) {
    return h("div", {},
      h("p", {class: "hint"}, "Connector calls run outside the sandbox: they are not in the manifest, and neither Discard nor a rewind undoes them."),
      h("table", {class: "ledger external-ledger"},
        h("thead", {}, h("tr", {}, h("th", {}, "turn"), h("th", {}, "call"), h("th", {}, "input"), h("th", {}, "decision"), h("th", {}, "outcome"))),
        h("tbody", {}, calls.map((c) => h("tr", {},
          h("td", {}, String(c.turn ?? "")),
          h("td", {class: "mono"}, `${c.server} · ${c.tool}`),
          h("td", {class: "mono small"}, c.input === null ? "(not in the transcript)" : c.input.length > 300 ? c.input.slice(0, 300) + "…" : c.input),
          h("td", {}, c.decision ? `${c.decision === "allow" ? "allowed" : "denied"} by ${c.approver}` : "stopped at the gate"),
          h("td", {class: "small"}, c.decision !== "allow" ? "not sent"
            : c.outcome === "result" ? `${c.is_error ? "error result" : "result"} ${c.size} bytes, sha256 ${String(c.sha256).slice(0, 12)}…`
            : c.outcome === "error" ? `failed: ${c.error}` : c.outcome === "cancelled" ? "cancelled while it ran" : "sent; no result recorded"))))));
  }

  /* the recorded network: every connection; the held requests (ticked at Commit, below) */
  function egressSection(d) {
    const eg = egress;
    const out = [h("p", {class: "hint"}, "The tools' only way out was OVERLORD's proxy: every connection is on this log. A tunnel (HTTPS) shows its host, port and bytes; a plain request its method and path.")];
    out.push(EGRESS.table(eg));
    const choosing = d.staged && !d.running && ACCOUNTS.mayChange(d.meta);
    const list = eg.error ? null : EGRESS.held(eg, false);
    if (list) out.push(h("h4", {class: "held-title"}, "Held requests"), choosing ? h("p", {class: "muted small"}, "Choose which to send under Disposition.") : null, list);
    if (heldOutcome && heldOutcome.sid === d.meta.sid) out.push(h("h4", {class: "held-title"}, "At commit"), EGRESS.outcome(heldOutcome.held));
    return out;
  }

  function waitingHeld(sid) {
    return egress && egress.sid === sid && !egress.error && (egress.held || []).some((q) => q.state === "held");
  }

  function diffSection(d) {
    const m = d.meta, files = d.diffs.filter((x) => !x.directory).map((x, i) => fileDiff(x, `diff-${i}`));
    if (d.staged) return files.length ? files : h("p", {class: "muted"}, "No changes.");
    if (m.state === "committed") {
      return [h("p", {class: "muted small kept-note"}, "What the commit wrote, read back from the versions it kept; open a path's blame sheet to see who wrote each line."),
              files.length ? files : h("p", {class: "muted"}, "No file content changed.")];
    }
    return h("p", {class: "muted"}, m.state === "unchanged" ? "The session changed nothing."
      : "The session was discarded (rolled back); nothing of it was written.");
  }

  function when(stamp) { return stamp ? new Date(stamp * 1000).toLocaleString() : "?"; }

  function envelope(d) {
    const m = d.meta, g = m.grants || {}, e = m.enforcement || {};
    const limits = g.limits ? Object.entries(g.limits).filter(([, v]) => v).map(([k, v]) => `${k}=${v}`).join(", ") : "";
    const items = [
      ["Backend", m.backend],
      ["Jail", g.jail ? "pivot_root jail" : "none (the real filesystem, in the transaction)"],
      ["Network", g.net === "none" ? "none (offline)" : g.net === "proxy"
        ? `recorded (proxy): ${g.net_allow && g.net_allow.length ? `allowlist ${g.net_allow.join(", ")}` : "every public host"}${g.hold_writes ? "; side-effecting requests held for review" : ""}`
        : g.net || "host"],
      ["Timeout", g.timeout ? `${g.timeout} s per command` : "none"],
      ["Limits", limits || "none granted"],
      ["Enforced by", [e.rlimits ? "rlimits" : null, e.cgroup ? `cgroup ${e.cgroup}` : null, e.disk_watch ? "disk watch" : null].filter(Boolean).join(", ") || "?"],
      ["Trace", m.trace || "off"],
      ["Merge base", m.merge_base ? "kept" : "no"],
    ];
    if (d.agent) {
      items.push(["Model", `${d.agent.model || "?"} (${d.agent.provider || "?"})`]);
      items.push(["Endpoint", d.agent.endpoint.base_url || "the provider's own"]);
      if (d.agent.audit) items.push(["Preset", "containment audit"]);
      const held = m.connectors;
      items.push(["Connectors", held && held.names.length ? held.names.join(", ") + (held.shell ? " (shell-shaped tools too)" : "") : "none"]);
    }
    return h("dl", {class: "envelope"}, items.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
  }

  function manifest(d) {
    const dropped = d.dropped || [];
    if (!d.changes.length && !dropped.length) return h("p", {class: "muted"}, "No path changed.");
    const committed = d.meta.state === "committed";
    const out = [];
    if (d.changes.length) out.push(ledger(d, d.changes, committed));
    else out.push(h("p", {class: "muted"}, "Nothing was committed: the commit left every change out."));
    if (dropped.length) {
      /* a partial commit: what it left out is not in the folder, so it has no blame sheet */
      out.push(h("h4", {class: "dropped-title"}, `Dropped: left out of the commit (${dropped.length})`),
               h("div", {class: "dropped-ledger"}, ledger(d, dropped, false)));
    }
    return out;
  }

  function ledger(d, list, blameable) {
    const table = h("table", {class: "ledger"},
      h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "Path"), h("th", {}, "Before \u2192 after (sha256)"),
        h("th", {}, "Cause"), h("th", {class: "opt"}, "Savepoint"))),
      h("tbody", {}, list.map((c) => h("tr", {},
        h("td", {}, kindBadge(c.kind)),
        h("td", {class: "path"}, c.path, metaNotes(c), blameable && c.after && isFile(c) ? h("button", {class: "button ghost small blame-link", type: "button",
          "aria-label": `blame sheet of ${c.path}`, onclick: () => openBlame(d.meta.target, c)}, "blame") : null),
        h("td", {class: "hash"}, `${short(c.before)} \u2192 ${short(c.after)}`),
        h("td", {class: "cause"}, causeText(c.cause)),
        h("td", {class: "opt"}, c.layer === null || c.layer === undefined ? "" : `@${c.layer}`)))));
    return h("div", {class: "table-wrap"}, table);
  }

  /* blame reads a file's lines: a link, a fifo or a device has none */
  function isFile(c) { return !c.details || !c.details.type || c.details.type === "file"; }

  function chain(d) {
    const points = d.savepoints;
    if (!points.length) return h("p", {class: "muted"}, "No savepoints.");
    const staged = d.staged && !d.running && ACCOUNTS.mayChange(d.meta);
    const table = h("table", {class: "ledger chain"},
      h("thead", {}, h("tr", {}, staged ? h("th", {}, "Keep") : null, h("th", {}, "@"), h("th", {}, "Cause"),
        h("th", {}, "Changed"), staged ? h("th", {class: "actions"}, "") : null)),
      h("tbody", {}, points.map((p) => {
        const keep = staged ? h("input", {type: "checkbox", checked: true, "aria-label": `keep savepoint @${p.n}`,
          dataset: {n: p.n}, onchange: (e) => { row.classList.toggle("dropped", !e.target.checked); keptNote(); }}) : null;
        const left = d.meta.state === "committed" && d.meta.committed_layers && !d.meta.committed_layers.includes(p.n);
        const row = h("tr", {dataset: {n: p.n}, class: left ? "dropped" : null, title: left ? "left out of the commit" : null},
          staged ? h("td", {}, keep) : null,
          h("td", {class: "hash"}, `@${p.n}`),
          h("td", {class: "cause"}, causeText(p.cause), p.coarse ? ` (+${p.causes.length - 1} more causes)` : "",
            left ? h("span", {class: "visually-hidden"}, " (dropped: left out of the commit)") : null),
          h("td", {}, `${p.paths} path${p.paths === 1 ? "" : "s"}`),
          staged ? h("td", {class: "actions"},
            twoStep("Rewind here", "Confirm rewind", () => rewind(p.n), p.n === points.length - 1),
            h("button", {class: "button ghost small", type: "button", onclick: () => fork(p.n)}, "Fork here")) : null);
        return row;
      })));
    return [h("div", {class: "table-wrap"}, table),
            staged ? h("p", {class: "muted small", id: "kept-note"}, "Untick a savepoint and the commit leaves it out.") : null];
  }

  /* A button that asks once more before it acts (no native dialogs). */
  function twoStep(label, confirmLabel, act, disabled) {
    const b = h("button", {class: "button ghost small", type: "button", disabled});
    b.textContent = label;
    let armed = null;
    b.addEventListener("click", () => {
      if (armed) { clearTimeout(armed); armed = null; act(); return; }
      b.textContent = confirmLabel;
      b.classList.add("danger-text");
      armed = setTimeout(() => { armed = null; b.textContent = label; b.classList.remove("danger-text"); }, 4000);
    });
    return b;
  }

  function dropped() {
    return [...paper.querySelectorAll(".chain input[type=checkbox]")].filter((x) => !x.checked).map((x) => +x.dataset.n);
  }

  function keptNote() {
    const n = dropped().length;
    const note = $("kept-note");
    if (note) note.textContent = n ? `The commit leaves out ${n} savepoint${n === 1 ? "" : "s"}: ${dropped().map((x) => "@" + x).join(", ")}.`
      : "Untick a savepoint and the commit leaves it out.";
  }

  function disposition(d) {
    const m = d.meta;
    if (m.state === "committed") {
      const parts = [`Committed ${when(m.committed)}.`];
      if (m.committed_layers) parts.push(` Savepoints kept: ${m.committed_layers.map((x) => "@" + x).join(", ") || "none"}.`);
      if (d.dropped && d.dropped.length) parts.push(` ${d.dropped.length} change${d.dropped.length === 1 ? "" : "s"} dropped (left out).`);
      if (m.forced) parts.push(" Forced over outside changes.");
      if (m.allowed_privileged) parts.push(" Privileged modes allowed by the person who committed.");
      if (m.merged && m.merged.length) parts.push(` Merged: ${m.merged.join(", ")}.`);
      const signed = m.clearance && m.clearance.countersigned;
      if (signed) parts.push(` Countersigned by review #${signed.review} (${signed.reviewer}).`);
      if (m.clearance && m.clearance.overrode_rejection) parts.push(` Committed over the rejection of review #${m.clearance.overrode_rejection}.`);
      return [h("p", {class: "decided"}, parts.join("")), ACCOUNTS.mayChange(m) ? revertBlock(d) : null];
    }
    if (m.state === "rolled-back") return h("p", {class: "decided voided"}, `Discarded (rolled back) ${when(m.rolled_back)}. Nothing was written.`);
    if (m.state === "unchanged") return h("p", {class: "decided voided"}, "Unchanged: the session changed nothing, so there is nothing to commit or discard.");
    if (d.running) return h("p", {class: "muted"}, "The agent is working in this session; stop it in the workspace first.");
    if (!ACCOUNTS.mayChange(m)) {
      return [h("div", {class: "gate-block"}, h("h4", {class: "gate-title"}, "Content gate"), gateView(d.checks)),
              h("p", {class: "muted read-only-note"}, "Not decided yet. You may only read this session: its owner or an admin commits or discards it.")];
    }
    const message = h("div", {class: "refusal doc-message", role: "alert", hidden: true});
    const force = h("input", {type: "checkbox", id: "force"});
    const forceWords = h("span", {}, " commit over outside changes (--force)");
    const forceLabel = h("label", {class: "small", for: "force", hidden: true}, force, forceWords);
    const signed = h("input", {type: "checkbox", id: "countersigned"});
    const signedLabel = h("label", {class: "small", for: "countersigned"}, signed, " only with a fresh countersignature (--countersigned)");
    const allow = h("input", {type: "checkbox", id: "allow-privileged"});
    const allowLabel = h("label", {class: "small allow-privileged", for: "allow-privileged", hidden: true}, allow,
      " allow privileged modes: let this commit add setuid/setgid bits, file capabilities and ACLs (--allow-privileged-modes)");
    const heldBox = waitingHeld(m.sid) ? h("div", {class: "held-box", id: "held"},
      h("h4", {class: "held-title"}, "Held requests: send at commit?"), EGRESS.held(egress, true)) : null;
    const commitBtn = h("button", {class: "button primary", type: "button", onclick: async () => {
      commitBtn.disabled = true;
      message.hidden = true;
      const body = {};
      const drop = dropped();
      if (drop.length) body.drop = drop.map((n) => `layer:${n}`);
      if (force.checked) body.force = true;
      if (allow.checked) body.allow_privileged_modes = true;
      if (signed.checked) body.countersigned = true;
      if (heldBox) body.release = EGRESS.chosen(heldBox);    /* the ticked ones sent; the rest dropped */
      let res;
      try {
        res = await api("POST", `/api/session/${m.sid}/commit`, body);
      } catch (e) {
        clear(message).append(h("strong", {}, "Commit refused; nothing was written. "));
        if (e.data.privileged) {
          message.append(privilegeText(e.data).trim());
          allowLabel.hidden = false;
        } else {
          message.append(h("span", {class: "refusal-line"}, e.message));
        }
        const drifts = e.data.drifts || [];
        if (drifts.length) message.append(h("ul", {}, drifts.map((x) => h("li", {}, x.words))));
        forceLabel.hidden = !(drifts.length && drifts.every((x) => x.forceable)) && !e.data.forceable;
        forceWords.textContent = e.data.forceable ? " commit over the second model's rejection (--force)" : " commit over outside changes (--force)";
        message.hidden = false;
        commitBtn.disabled = false;
        return;
      }
      heldOutcome = res && res.held ? {sid: m.sid, held: res.held} : null;
      await show(m.sid);
      reloadRegister();
    }}, "Commit");
    const discardBtn = twoStep("Discard", "Confirm discard", async () => {
      try { await api("POST", `/api/session/${m.sid}/rollback`, {}); }
      catch (e) { clear(message).append(e.message); message.hidden = false; return; }
      await show(m.sid);
      reloadRegister();
    });
    return [h("div", {class: "gate-block"}, h("h4", {class: "gate-title"}, "Content gate"), gateView(d.checks)),
            heldBox,
            h("div", {class: "disposition"}, commitBtn, discardBtn, signedLabel, forceLabel, allowLabel,
              h("p", {class: "hint"}, "Commit checks the folder's policy, the content gate and the second model's verdicts, and that the folder did not change under the session; then it writes the kept savepoints, all or nothing. Discard rolls the session back: nothing is written.")),
            message];
  }

  /* A committed session's undo: staged as a new pending session, reviewed and committed like any other. */
  function revertBlock(d) {
    const m = d.meta;
    const note = h("p", {class: "inline-error revert-error", role: "alert", hidden: true});
    const button = h("button", {class: "button small", type: "button", onclick: async () => {
      button.disabled = true;
      let res;
      try { res = await api("POST", `/api/session/${m.sid}/revert`, {}); }
      catch (e) { clear(note).append(e.message); note.hidden = false; button.disabled = false; return; }
      await reloadRegister();
      location.hash = res.sid;
    }}, "Revert");
    return h("div", {class: "disposition revert"}, button,
      h("p", {class: "hint"}, "Revert stages the undo of this commit as a new session, for review: nothing on disk changes until you commit it."), note);
  }

  async function rewind(n) {
    try {
      await api("POST", `/api/session/${current}/rewind`, {to: n});
    } catch (e) { return flash(e.message); }
    await show(current);
    reloadRegister();
  }

  async function fork(n) {
    let res;
    try { res = await api("POST", `/api/session/${current}/fork`, {at: n}); }
    catch (e) { return flash(e.message); }
    await reloadRegister();
    location.hash = res.sid;
  }

  function flash(message) {
    const note = h("p", {class: "note error", role: "alert"}, message);
    paper.prepend(note);
    setTimeout(() => note.remove(), 6000);
  }

  /* -- the blame sheet ------------------------------------------------------------------------------ */
  function ownerKey(o) { return typeof o === "string" ? o : `${o.sid}/${o.layer}`; }

  function ownerLabel(o) {
    if (o === "origin") return "origin (older than the record)";
    if (o === "drift") return "drift (changed outside OVERLORD)";
    if (o === "unknown") return "unknown (bytes not kept)";
    const what = o.kind === "agent" ? [o.turn !== undefined ? `turn ${o.turn}` : null, o.summary || o.tool].filter(Boolean).join(" \u00b7 ") : (o.command || o.kind);
    return `${o.sid} \u00b7 @${o.layer} \u00b7 ${what}`;
  }

  /* base64 of a path's bytes: the target's and the path's exact bytes when either is not UTF-8 */
  function b64bytes(b64, text) { return b64 ? atob(b64) : String.fromCharCode(...new TextEncoder().encode(text)); }

  async function openBlame(target, c) {
    const path = c.path;
    const body = clear($("blame-body"));
    $("blame-title").textContent = `Blame sheet: ${path}`;
    if (!blame.open) blame.showModal();
    const q = dossier && (dossier.meta.target_b64 || c.path_b64)
      ? {path_b64: btoa(b64bytes(dossier.meta.target_b64, target.replace(/\/$/, "")) + "/" + b64bytes(c.path_b64, path))}
      : {path: `${target.replace(/\/$/, "")}/${path}`};
    let data;
    try { data = await api("GET", `/api/blame?${new URLSearchParams(q)}`); }
    catch (e) { body.append(h("p", {class: "note error"}, e.message)); return; }
    const owners = new Map();
    for (const line of data.lines) {
      const key = ownerKey(line.owner);
      if (!owners.has(key)) owners.set(key, {owner: line.owner, n: owners.size});
    }
    body.append(h("ul", {class: "blame-legend"}, [...owners.values()].map(({owner}) => h("li", {},
      h("strong", {}, ownerLabel(owner)), typeof owner === "object" && owner.task ? ` \u2014 task: ${owner.task}` : ""))));
    let last = null;
    const lines = h("div", {class: "blame-lines"});
    for (const line of data.lines) {
      const key = ownerKey(line.owner);
      const info = owners.get(key);
      const cls = typeof line.owner === "string" ? line.owner : `owner-${info.n % 5}`;
      lines.append(h("div", {class: `blame-line ${cls}`},
        h("span", {class: `owner${key !== last ? " first" : ""}`, title: ownerLabel(line.owner)}, key !== last ? ownerLabel(line.owner) : ""),
        h("span", {class: "n"}, line.n), h("span", {class: "text"}, line.text)));
      last = key;
    }
    if (!data.lines.length) lines.append(h("p", {class: "diff-summary"}, "The file is empty."));
    body.append(lines);
  }

  /* -- the audit log: every consequential act, on the keyed chain, with its verify result ------------------- */
  const AUDIT_OWN = new Set(["seq", "ts", "actor", "action", "sid", "target", "mac"]);
  let auditFilters = {since: "", action: ""};

  async function showAudit() {
    current = null;
    mark(null);
    const q = new URLSearchParams();
    if (auditFilters.since) q.set("since", auditFilters.since);
    if (auditFilters.action) q.set("action", auditFilters.action);
    let data;
    try { data = await api("GET", `/api/audit?${q}`); }
    catch (e) {
      clear(paper).append(h("header", {class: "doc-head"}, h("h2", {}, "Audit log")), h("p", {class: "note error"}, e.message));
      return;
    }
    if (location.hash !== "#audit") return;
    renderAudit(data);
  }

  function verifyLine(v) {
    if (v.error) return h("p", {class: "audit-verify bad", role: "status"}, `The chain cannot be checked: ${v.error}`);
    const head = v.head || {};
    const parts = [`${v.lines} line${v.lines === 1 ? "" : "s"}`, `head seq ${head.seq || 0}${head.hash ? ` (${short(head.hash)})` : ""}`];
    return h("p", {class: `audit-verify ${v.ok ? "ok" : "bad"}`, role: "status"},
      h("strong", {class: "audit-signed"}, v.signed ? "signed" : "UNSIGNED"), ` \u00b7 ${parts.join(" \u00b7 ")} \u00b7 `,
      v.ok ? "the chain holds" : `BROKEN at line ${v.bad.line}${v.bad.seq !== null && v.bad.seq !== undefined ? ` (seq ${v.bad.seq})` : ""}: ${v.bad.why}`);
  }

  function auditDetails(r) {
    const rest = Object.entries(r).filter(([k]) => !AUDIT_OWN.has(k));
    return rest.length ? JSON.stringify(Object.fromEntries(rest)) : "";
  }

  function renderAudit(data) {
    const v = data.verify || {};
    const since = h("input", {type: "text", id: "audit-since", inputmode: "numeric", placeholder: "seq", value: auditFilters.since});
    const action = h("input", {type: "text", id: "audit-action", placeholder: "e.g. session.commit or review", value: auditFilters.action});
    const form = h("form", {class: "audit-filter", onsubmit: (e) => {
      e.preventDefault();
      auditFilters = {since: since.value.trim(), action: action.value.trim()};
      showAudit();
    }},
      h("label", {for: "audit-since"}, "From seq"), since, h("label", {for: "audit-action"}, "Action"), action,
      h("button", {class: "button small", type: "submit"}, "Show"));
    const rows = data.records || [];
    const table = h("table", {class: "ledger audit"},
      h("thead", {}, h("tr", {}, h("th", {}, "Seq"), h("th", {}, "When"), h("th", {}, "Actor"), h("th", {}, "Action"),
        h("th", {}, "Session"), h("th", {}, "Details"))),
      h("tbody", {}, rows.map((r) => h("tr", {dataset: {seq: r.seq}},
        h("td", {class: "hash"}, String(r.seq)),
        h("td", {class: "cause"}, typeof r.ts === "number" ? when(r.ts) : String(r.ts || "")),
        h("td", {class: "cause"}, String(r.actor || "")),
        h("td", {class: "hash audit-action"}, String(r.action || "")),
        h("td", {class: "cause"}, r.sid ? h("a", {href: `/console#${r.sid}`}, String(r.sid)) : "", r.target ? h("div", {class: "muted small mono"}, String(r.target)) : null),
        h("td", {class: "cause audit-details mono"}, auditDetails(r), r.mac ? h("div", {class: "muted small"}, `mac ${short(r.mac)}`) : null)))));
    clear(paper).append(
      h("header", {class: "doc-head"}, h("h2", {}, "Audit log"),
        h("span", {class: `pill ${v.ok ? "state-committed" : "state-pending"}`}, v.error ? "unreadable" : v.ok ? "verified" : "broken")),
      verifyLine(v),
      form,
      data.more ? h("p", {class: "muted small"}, `Showing the newest ${rows.length} of ${data.total} matching lines; narrow with From seq.`) : null,
      rows.length ? h("div", {class: "table-wrap"}, table) : h("p", {class: "muted"}, "No line matches."));
  }

  /* -- wiring ----------------------------------------------------------------------------------------- */
  register.addEventListener("click", (e) => {
    const row = e.target.closest(".reg-row");
    if (!row) return;
    e.preventDefault();
    history.replaceState(null, "", `#${row.dataset.sid}`);
    show(row.dataset.sid);
  });
  document.addEventListener("keydown", (e) => {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || blame.open) return;
    if (/^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName)) return;
    if (e.key === "j" || e.key === "ArrowDown") { e.preventDefault(); move(1); }
    else if (e.key === "k" || e.key === "ArrowUp") { e.preventDefault(); move(-1); }
    else if (e.key === "Enter" && current && e.target === register) { e.preventDefault(); show(current); paper.focus(); }
  });
  $("blame-close").addEventListener("click", () => blame.close());
  window.addEventListener("hashchange", () => {
    const sid = location.hash.slice(1);
    if (sid === "audit") showAudit();
    else if (SID_RE.test(sid) && sid !== current) show(sid);
  });

  paper.setAttribute("tabindex", "-1");
  /* who is signed in first (with accounts on, what they may change shapes the dossier) */
  ACCOUNTS.load().then((me) => {
    ACCOUNTS.topbar(document.querySelector(".topnav"));
    /* the audit log: admins and viewers (an operator reads their own sessions' dossiers) */
    if (me.accounts && me.role === "operator") $("audit-link").hidden = true;
    const first = location.hash.slice(1);
    if (first === "audit") showAudit();
    else if (SID_RE.test(first)) show(first);
    else if (rows().length) show(rows()[0].dataset.sid);
  });
})();
