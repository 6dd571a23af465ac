/* The recorded network (--net proxy): a session's egress log as a table and its held requests
   as a list, for the workspace's inspector and the console's dossier (GET
   /api/session/<sid>/egress). Commit sends the ids ticked here as `release`; the rest are
   dropped. Every host, path, method, header and preview was chosen by the sandboxed program
   or a remote server: each goes into a text node (OV.h), never into innerHTML. */
"use strict";

const EGRESS = (() => {
  const {h, api} = OV;

  const bytes = (n) => n === null || n === undefined ? "" : n < 1024 ? `${n} B`
    : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
  const time = (ts) => typeof ts === "number" ? new Date(ts * 1000).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"}) : "";
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

  /* the session's egress report, or null (another network, or it cannot be read) */
  async function load(sid, grants) {
    if (!grants || grants.net !== "proxy") return null;
    try { return await api("GET", `/api/session/${sid}/egress`); } catch (e) { return {error: e.message}; }
  }

  function summary(r) {
    const s = r.summary || {};
    const allow = r.allow && r.allow.length ? `allowlist: ${r.allow.join(", ")}` : "no allowlist: every public host, recorded";
    return h("p", {class: "egress-summary small"},
      `${plural(s.connections || 0, "connection")} \u00b7 ${s.refused || 0} refused \u00b7 ${bytes(s.bytes_up || 0)} up \u00b7 ${bytes(s.bytes_down || 0)} down \u00b7 ${plural(s.held || 0, "held request")} \u00b7 ${allow}${r.hold_writes ? " \u00b7 side-effecting requests held" : ""}`);
  }

  /* the table: time, host, port, method, path, allowed, status, bytes up/down, command */
  function table(r) {
    if (r.error) return h("p", {class: "inline-error"}, `The egress log could not be read: ${r.error}`);
    const rows = r.connections || [];
    const out = [summary(r)];
    if (!rows.length) {
      out.push(h("p", {class: "muted small egress-none"}, "No connection yet."));
      return out;
    }
    if ((r.summary || {}).connections > rows.length) out.push(h("p", {class: "muted small"}, `Showing the newest ${rows.length}.`));
    out.push(h("div", {class: "table-wrap"}, h("table", {class: "ledger egress"},
      h("thead", {}, h("tr", {}, ["Time", "Host", "Port", "Method", "Path", "Allowed", "Status", "Up", "Down", "Command"].map((x) => h("th", {}, x)))),
      h("tbody", {}, rows.map((c) => h("tr", {class: c.allowed ? (c.held ? "egress-held" : null) : "egress-refused",
                                              title: c.reason || null},
        h("td", {class: "egress-time"}, time(c.ts)),
        h("td", {class: "egress-host mono"}, c.host || ""),
        h("td", {class: "egress-port"}, c.port === null ? "" : String(c.port)),
        h("td", {class: "egress-method mono"}, c.method || "(garbage)"),
        h("td", {class: "egress-path mono"}, c.path === null ? (c.method === "CONNECT" ? "(tunnel)" : "") : c.path),
        h("td", {class: "egress-allowed"}, c.allowed ? "yes" : "refused", !c.allowed && c.reason ? h("span", {class: "egress-reason small"}, ` \u2014 ${c.reason}`) : null),
        h("td", {class: "egress-status"}, c.status === null ? "" : String(c.status), c.held ? h("span", {class: "small"}, ` held ${c.held}`) : null),
        h("td", {class: "egress-up"}, bytes(c.bytes_up)),
        h("td", {class: "egress-down"}, bytes(c.bytes_down)),
        h("td", {class: "egress-cause small"}, c.layer === null ? "" : `@${c.layer} `, c.cause || "")))))));
    return out;
  }

  const STATE_WORDS = {held: "held", released: "released", dropped: "dropped", failed: "failed"};

  function stateText(q) {
    if (q.state === "released") return `released: ${q.status === null ? "sent" : q.status}`;
    if (q.state === "failed") return `failed: ${q.error || "not sent"}`;
    return STATE_WORDS[q.state] || q.state;
  }

  /* the held requests; `choose`: a checkbox per request still held (the person ticks what
     Commit sends), unticked by default -- nothing leaves unless a person says so */
  function held(r, choose) {
    const list = (r && r.held) || [];
    if (!list.length) return null;
    const waiting = list.filter((q) => q.state === "held");
    return h("div", {class: "held"},
      choose && waiting.length ? h("p", {class: "small held-hint"},
        "Tick the requests Commit should send once the files land, in this order; the rest are dropped. Discard drops them all.") : null,
      h("ul", {class: "held-list"}, list.map((q) => {
        const box = choose && q.state === "held"
          ? h("input", {type: "checkbox", class: "held-check", id: `held-${q.id}`, value: q.id, "aria-label": `send ${q.id} at commit`})
          : null;
        return h("li", {class: `held-row held-${q.state}`, dataset: {id: q.id}},
          h("div", {class: "held-line"}, box,
            h("label", {for: box ? `held-${q.id}` : null, class: "held-what"},
              h("span", {class: "held-id mono"}, q.id), " ",
              h("span", {class: "held-method mono"}, q.method || ""), " ",
              h("span", {class: "held-url mono"}, q.url || ""), " ",
              h("span", {class: "held-size muted small"}, `(${bytes(q.bytes)})`)),
            h("span", {class: "held-state small"}, stateText(q))),
          h("details", {class: "held-details"}, h("summary", {class: "small"}, "Headers and body"),
            h("table", {class: "held-headers"}, h("tbody", {}, (q.headers || []).map(([k, v]) =>
              h("tr", {}, h("th", {class: "mono"}, k), h("td", {class: "mono"}, v))))),
            q.preview ? h("pre", {class: "held-preview"}, q.preview) : h("p", {class: "muted small"}, q.bytes ? "" : "No body."),
            q.cause ? h("p", {class: "muted small"}, `made by ${q.layer === null ? "" : `@${q.layer} `}${q.cause}`) : null));
      })));
  }

  /* the ids ticked in a held list, in the list's order */
  function chosen(root) {
    return [...root.querySelectorAll(".held-check")].filter((x) => x.checked).map((x) => x.value);
  }

  /* what a commit did with them (its answer's `held`), in words */
  function outcome(result) {
    if (!result) return null;
    const sent = result.released || [], dropped = result.dropped || [];
    return h("div", {class: "held-outcome", role: "status"},
      sent.length ? h("ul", {class: "held-released"}, sent.map((q) => h("li", {},
        h("span", {class: "mono"}, q.id), ` ${q.method || ""} `, h("span", {class: "mono"}, q.url || ""), " \u2192 ",
        q.state === "released" ? `sent, ${q.status === null ? "no status" : `status ${q.status}`}` : `failed: ${q.error || "not sent"}`))) : null,
      h("p", {class: "small held-dropped"}, sent.length ? "" : "Nothing was sent. ",
        dropped.length ? `Dropped: ${dropped.join(", ")}.` : "Nothing was dropped."));
  }

  return {load, table, held, chosen, outcome, bytes};
})();
