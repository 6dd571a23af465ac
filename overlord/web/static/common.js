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

  return {h, append, clear, api, ApiError, markdown, inline, kindBadge, fileDiff, diffBody, delta,
          metaNotes, privilegeText, causeText, short, ago, stateLabel, SID_RE};
})();
