/* What both pages share: building DOM nodes, calling the API, safe markdown, diffs, labels.
   Model text is only ever placed in text nodes: nothing here assigns innerHTML. */
"use strict";

const OV = (() => {
  /* h("div", {class: "x", onclick: fn}, child, "text", [more]) -> an element */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
      else if (k === "class") el.className = v;
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  class ApiError extends Error {
    constructor(status, data) {
      super((data && data.error) || `HTTP ${status}`);
      this.status = status;
      this.data = data || {};
    }
  }

  async function api(method, path, body) {
    const init = {method, headers: {"Accept": "application/json"}, credentials: "same-origin"};
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (res.status === 401 && method === "GET" && OV.signedIn) {
      /* signed in a moment ago, not any more (signed out elsewhere, a password or role change,
         an idle expiry): back to the sign-in page, and here again after it */
      OV.signedIn = false;
      const next = location.pathname + location.search + location.hash;
      location.assign(`/login?${new URLSearchParams({error: "expired", next})}`);
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }

  /* -- markdown: a safe subset, built as nodes ------------------------------------------------ */
  const SAFE_URL = /^(https?:|mailto:)/i;

  function markdown(text) {
    const root = document.createDocumentFragment();
    const lines = String(text || "").replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/);
      if (fence) {
        const body = [];
        i++;
        while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
        i++;
        const code = h("code", fence[2] ? {"data-lang": fence[2]} : {}, body.join("\n"));
        root.append(h("pre", {}, code));
        continue;
      }
      if (!line.trim()) { i++; continue; }
      const heading = line.match(/^(#{1,6})\s+(.*?)\s*#*\s*$/);
      if (heading) {
        root.append(h("h" + heading[1].length, {}, inline(heading[2])));
        i++;
        continue;
      }
      if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) { root.append(h("hr")); i++; continue; }
      if (/^\s*>/.test(line)) {
        const body = [];
        while (i < lines.length && /^\s*>/.test(lines[i])) body.push(lines[i++].replace(/^\s*>\s?/, ""));
        root.append(h("blockquote", {}, markdown(body.join("\n"))));
        continue;
      }
      const item = line.match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
      if (item) {
        const ordered = /\d/.test(item[1]);
        const list = h(ordered ? "ol" : "ul");
        if (ordered && parseInt(item[1], 10) !== 1) list.setAttribute("start", String(parseInt(item[1], 10)));
        while (i < lines.length) {
          const m = lines[i].match(/^\s*([-*+]|\d{1,9}[.)])\s+(.*)$/);
          if (!m || /\d/.test(m[1]) !== ordered) break;
          const parts = [m[2]];
          i++;
          while (i < lines.length && lines[i].trim() && /^\s{2,}\S/.test(lines[i]) &&
                 !/^\s*([-*+]|\d{1,9}[.)])\s+/.test(lines[i])) parts.push(lines[i++].trim());
          list.append(h("li", {}, inline(parts.join(" "))));
        }
        root.append(list);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|>|([-*+]|\d{1,9}[.)])\s+)/.test(lines[i])) {
        para.push(lines[i++]);
      }
      if (!para.length) para.push(lines[i++]);
      const p = h("p");
      para.forEach((t, n) => { if (n) p.append(h("br")); p.append(inline(t)); });
      root.append(p);
    }
    return root;
  }

  const INLINE = [
    ["code", /`+/],
    ["image", /!\[([^\]\n]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
    ["link", /\[([^\]\n]+)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
    ["auto", /<((?:https?:\/\/|mailto:)[^>\s]+)>/],
    ["url", /\bhttps?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/],
    ["strong", /(\*\*|(?<!\w)__)(?=\S)([\s\S]*?\S)\1(?!\w)/],
    ["em", /(?<![\w*])(\*|_)(?=\S)([\s\S]*?\S)\1(?![\w*])/],
    ["del", /~~(?=\S)([\s\S]*?\S)~~/],
  ];

  function inline(text, depth) {
    depth = depth || 0;
    const frag = document.createDocumentFragment();
    let rest = String(text);
    while (rest) {
      let best = null;
      for (const [kind, re] of INLINE) {
        const m = re.exec(rest);
        if (m && (best === null || m.index < best.m.index)) best = {kind, m};
      }
      if (!best || depth > 4) { frag.append(rest); break; }
      const {kind, m} = best;
      if (m.index) frag.append(rest.slice(0, m.index));
      let consumed = m[0].length;
      if (kind === "code") {
        const tick = m[0];
        const end = rest.indexOf(tick, m.index + tick.length);
        if (end < 0) { frag.append(tick); }
        else {
          frag.append(h("code", {}, rest.slice(m.index + tick.length, end).replace(/^ (.*) $/, "$1")));
          consumed = end + tick.length - m.index;
        }
      } else if (kind === "image") {
        frag.append(`[image: ${m[1] || m[2]}]`);
      } else if (kind === "link") {
        frag.append(link(m[2], inline(m[1], depth + 1), m[0]));
      } else if (kind === "auto" || kind === "url") {
        const url = kind === "auto" ? m[1] : m[0];
        frag.append(link(url, url, m[0]));
      } else if (kind === "strong") {
        frag.append(h("strong", {}, inline(m[2], depth + 1)));
      } else if (kind === "em") {
        frag.append(h("em", {}, inline(m[2], depth + 1)));
      } else if (kind === "del") {
        frag.append(h("del", {}, inline(m[1], depth + 1)));
      }
      rest = rest.slice(m.index + consumed);
    }
    return frag;
  }

  /* A link only to the web or mail; anything else (javascript:, data:, ...) stays inert text. */
  function link(url, content, original) {
    if (!SAFE_URL.test(url)) return document.createTextNode(original);
    return h("a", {href: url, target: "_blank", rel: "noopener noreferrer nofollow"}, content);
  }

  /* -- diffs ------------------------------------------------------------------------------------ */
  const KIND_LETTER = {added: "A", modified: "M", deleted: "D", "replaced-dir": "R", "invalid-whiteout": "!"};

  function kindBadge(kind) {
    return h("span", {class: `kind kind-${kind}`, title: kind}, KIND_LETTER[kind] || "?");
  }

  function diffBody(d) {
    const wrap = h("div", {class: "diff-body"});
    if (d.summary) wrap.append(h("p", {class: "diff-summary"}, d.summary));
    if (!d.hunks || !d.hunks.length) {
      if (!d.summary) wrap.append(h("p", {class: "diff-summary"}, "no content change"));
      return wrap;
    }
    const diff = h("div", {class: "diff", role: "table", "aria-label": `diff of ${d.path}`});
    for (const hunk of d.hunks) {
      diff.append(h("div", {class: "diff-hunk"}, hunk.header));
      const m = hunk.header.match(/^@@ -(\d+)(?:,\d+)? \+(\d+)/);
      let a = m ? +m[1] : 0, b = m ? +m[2] : 0;
      for (const [tag, text] of hunk.lines) {
        const cls = tag === "+" ? "add" : tag === "-" ? "del" : "ctx";
        const left = tag === "+" ? "" : a++;
        const right = tag === "-" ? "" : b++;
        diff.append(h("div", {class: `diff-line ${cls}`, role: "row"},
          h("span", {class: "num"}, left), h("span", {class: "num"}, right),
          h("span", {class: "text"}, text)));
      }
    }
    if (d.truncated) diff.append(h("div", {class: "diff-cut"}, "the rest of this diff is left out (too long to show)"));
    wrap.append(diff);
    return wrap;
  }

  function fileDiff(d, id) {
    return h("details", {class: "file-diff", open: true, id},
      h("summary", {}, kindBadge(d.kind), h("span", {class: "path"}, d.path), delta(d),
        d.summary && d.summary.startsWith("metadata only") ? null : metaNotes(d)),
      diffBody(d));
  }

  /* A change's metadata in words (mode, owner, ACL, xattr, type): "mode 0644 → 4644 (setuid)".
     What adds privilege (setuid, setgid, a file capability, an ACL) is marked. */
  function metaNotes(c) {
    const notes = c.notes || [];
    if (!notes.length) return null;
    const privileged = (c.privileged || []).length > 0;
    return h("span", {class: `meta-notes${privileged ? " privileged" : ""}`,
                      title: privileged ? `adds ${c.privileged.join(", ")}: commit asks before it lands` : null},
      notes.join(" \u00b7 "));
  }

  /* The words of a commit refused for privileged modes (the API's `privileged` list). */
  function privilegeText(data) {
    const list = data.privileged || [];
    const what = (p) => `${p.path} (${(p.notes && p.notes.length ? p.notes : p.adds).join(", ")})`;
    if (!list.length) return ` ${data.error}`;
    const shown = list.slice(0, 5).map(what).join("; ");
    return ` This session adds privileges a commit never grants silently: ${shown}` +
      (list.length > 5 ? ` and ${list.length - 5} more` : "") + ".";
  }

  function delta(d) {
    if (!d.added && !d.removed) return null;
    return h("span", {class: "delta"},
      d.added ? h("span", {class: "plus"}, `+${d.added}`) : null, d.added && d.removed ? " " : null,
      d.removed ? h("span", {class: "minus"}, `\u2212${d.removed}`) : null);
  }

  /* -- labels ----------------------------------------------------------------------------------- */
  function causeText(c) {
    if (!c) return "";
    if (c.kind === "agent") {
      if (c.event === "open") return "the agent opened the session";
      const where = [c.turn !== undefined ? `turn ${c.turn}` : null, c.call ? `call ${c.call}` : null].filter(Boolean).join(", ");
      return `${c.summary || c.tool || "agent"}${where ? ` (${where})` : ""}`;
    }
    if (c.command) return c.command;
    return c.kind || JSON.stringify(c);
  }

  function short(hash) { return hash ? hash.slice(0, 12) : "\u2014"; }

  function ago(stamp) {
    if (!stamp) return "";
    const s = Math.max(0, Date.now() / 1000 - stamp);
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return new Date(stamp * 1000).toLocaleDateString();
  }

  function stateLabel(state) {
    return {"rolled-back": "rolled back", "timed-out": "timed out"}[state] || state || "";
  }

  const SID_RE = /^\d{8}-\d{6}-[0-9a-f]{6}$/;

  /* -- the content gate: what Commit will be told about the change -------------------------------- */
  const SEVERITY_WORDS = {block: "blocks the commit", countersign: "needs a countersignature", warn: "warning"};

  function gateView(checks) {
    if (!checks) return null;
    if (checks.error) return h("p", {class: "inline-error gate-error"}, checks.error);
    const found = checks.findings || [];
    if (!found.length) return h("p", {class: "muted small gate-clear"}, "The content gate found nothing to flag in this change.");
    return h("ul", {class: "findings", "aria-label": "content gate findings"}, found.map((f) =>
      h("li", {class: `finding sev-${f.severity}`},
        h("span", {class: `sev sev-${f.severity}`}, SEVERITY_WORDS[f.severity] || f.severity),
        h("span", {class: "finding-kind"}, f.kind),
        h("span", {class: "finding-path mono"}, f.line ? `${f.path}:${f.line}` : f.path),
        h("span", {class: "finding-what"}, f.what))));
  }

  /* -- the countersignature: a second model's verdicts on the change ------------------------------ */
  const VERDICT_WORDS = {approve: "Approved", reject: "Rejected", "no-verdict": "No verdict"};

  function standingText(v) {
    if (v.fresh === true) {
      if (v.verdict === "approve") return v.partial ? "fresh, but it saw only part of the change: it does not countersign" : "fresh: it countersigns this change";
      return v.verdict === "reject" ? "fresh: it blocks a plain commit" : "fresh";
    }
    if (v.fresh === false) return "stale: the change moved since it was reviewed";
    return "on record";
  }

  function verdictView(v) {
    const list = (xs) => (xs || []).join(", ");
    const sel = v.selection && ((v.selection.only || []).length || (v.selection.drop || []).length)
      ? [(v.selection.only || []).length ? `only ${list(v.selection.only)}` : null,
         (v.selection.drop || []).length ? `dropping ${list(v.selection.drop)}` : null].filter(Boolean).join(", ") : null;
    return h("li", {class: `verdict verdict-${v.verdict}`, dataset: {n: v.n, fresh: String(v.fresh)}},
      h("div", {class: "verdict-head"},
        h("span", {class: `verdict-badge ${v.verdict}`}, VERDICT_WORDS[v.verdict] || v.verdict),
        h("span", {class: `verdict-standing ${v.fresh === true ? "fresh" : v.fresh === false ? "stale" : ""}`}, standingText(v)),
        h("span", {class: "verdict-who"}, `#${v.n} \u00b7 ${v.reviewer || "?"}${v.ts ? ` \u00b7 ${ago(v.ts)}` : ""}`)),
      v.reason ? h("p", {class: "verdict-reason"}, v.reason) : null,
      v.verdict === "reject" && (v.paths || []).length ? h("p", {class: "verdict-note"}, `Paths it names: ${list(v.paths)}`) : null,
      v.partial ? h("p", {class: "verdict-partial"}, `Partial view: it did not see ${list(v.unseen) || "part of the diff"} whole, so an approval here never countersigns.`) : null,
      (v.read || []).length ? h("p", {class: "verdict-note"}, `${v.partial ? "It read" : "Complete: it read what the dossier left out"} whole: ${list(v.read)}`) : null,
      v.same_model ? h("p", {class: "verdict-same"}, `Reviewed by the agent's own model${v.agent ? ` (${v.agent})` : ""}: the person chose so, and the record says it.`) : null,
      sel ? h("p", {class: "verdict-note"}, `Reviewed a selection: ${sel}`) : null);
  }

  const watching = new Map();       /* sid -> what to call when its review ends (the latest panel's) */

  /* While a review runs, ask for its state every 700 ms; done() once it has ended. */
  function watchReview(sid, done) {
    const known = watching.has(sid);
    watching.set(sid, done);
    if (known) return;
    const tick = async () => {
      let r = null;
      try { r = await api("GET", `/api/session/${sid}/reviews`); } catch (e) { r = null; }
      if (r && r.reviewing && r.reviewing.running) { setTimeout(tick, 700); return; }
      const call = watching.get(sid);
      watching.delete(sid);
      call(r);
    };
    setTimeout(tick, 400);
  }

  /* The countersignature block: who the second model is, the check button, the review under way,
     and every verdict, newest first. onChange() redraws the page after a review ends. */
  function countersignPanel(d, opts) {
    const cs = d.countersign || {}, run = d.reviewing, sid = d.meta.sid;
    const reviews = (d.reviews || []).slice().reverse();
    const status = h("p", {class: "review-status", role: "status"});
    const error = h("p", {class: "inline-error review-error", role: "alert", hidden: true});
    const same = h("input", {type: "checkbox", id: `same-model-${opts.where}`});
    const sameLabel = cs.same_as_agent ? h("label", {class: "small same-model", for: `same-model-${opts.where}`}, same,
      ` Review with the agent's own model (${cs.agent}) anyway: the verdict will say so`) : null;
    const button = h("button", {class: "button small review-button", type: "button"}, "Second-model check");
    const busy = run && run.running;
    const ready = () => d.staged && !d.running && cs.reviewer && !busy && (!cs.same_as_agent || same.checked);
    button.disabled = !ready();
    same.addEventListener("change", () => { button.disabled = !ready(); });
    if (!d.staged) status.append(reviews.length ? "The session is decided; these verdicts are its record." : "No second-model review was given for this session.");
    else if (busy) status.append(`Reviewing with ${run.reviewer}\u2026 the verdict appears here when it is given.`);
    else if (!cs.reviewer) status.append(`No second model is named yet: choose one under Settings \u2192 Countersignature${opts.where === "console" ? " in the workspace" : ""}.`);
    else if (cs.same_as_agent) status.append(`The second model in Settings (${cs.reviewer}) is the agent's own; the check is refused unless you tick the box below.`);
    else status.append(`The check asks ${cs.reviewer} to review exactly this change; its verdict is bound to what it saw.`);
    if (run && !run.running && run.error) { error.append(`The last review failed: ${run.error}`); error.hidden = false; }
    button.addEventListener("click", async () => {
      button.disabled = true;
      error.hidden = true;
      try {
        await api("POST", `/api/session/${sid}/review`, same.checked ? {same_model: true} : {});
      } catch (e) {
        clear(error).append(e.message);
        error.hidden = false;
        button.disabled = !ready();
        return;
      }
      clear(status).append(`Reviewing with ${cs.reviewer}\u2026 the verdict appears here when it is given.`);
      watchReview(sid, () => opts.onChange());
    });
    if (busy) watchReview(sid, () => opts.onChange());
    return h("div", {class: "countersign-panel"},
      d.staged ? h("div", {class: "review-row"}, button, sameLabel) : null, status, error,
      reviews.length ? h("ol", {class: "verdicts", "aria-label": "second-model verdicts, newest first"}, reviews.map(verdictView)) : null);
  }

  return {signedIn: false, h, append, clear, api, ApiError, markdown, inline, kindBadge, fileDiff, diffBody, delta,
          metaNotes, privilegeText, causeText, short, ago, stateLabel, SID_RE, gateView, verdictView,
          countersignPanel};
})();
