/* Running it for real: the usage meter in the rail (GET /api/usage), Settings -> Notifications
   for administrators (/api/webhooks...), and the inspector's cost line and Export link.
   Every value from the server goes into text nodes or attributes; nothing assigns innerHTML.
   A bar is a <progress> of what is left, its class saying how much (meter-ok, meter-amber under
   a quarter, meter-red under a tenth) and its text saying the same in words. */
"use strict";

const RUNNING = (() => {
  const {h, clear, api, ago} = OV;
  const $ = (id) => document.getElementById(id);
  const AMBER = 0.25, RED = 0.10;
  const REFRESH_MS = 30000;
  const PROVIDER_LABELS = {anthropic: "Anthropic", openai: "OpenAI", azure: "Azure OpenAI",
                           "openai-compatible": "OpenAI-compatible", gemini: "Gemini"};
  const BUCKETS = [["tokens", "Tokens/min"], ["input_tokens", "Input tokens/min"],
                   ["output_tokens", "Output tokens/min"], ["requests", "Requests/min"]];

  function num(v) {
    if (v === null || v === undefined || v === "") return null;
    const n = typeof v === "number" ? v : Number(v);
    return Number.isFinite(n) ? n : null;
  }

  const count = (n) => Math.round(n).toLocaleString("en-US");
  const usd = (n) => `$${n < 0.01 && n > 0 ? n.toFixed(4) : n.toFixed(2)}`;      /* the meter's */
  const usdFine = (n) => `$${n < 1 && n > 0 ? n.toFixed(4) : n.toFixed(2)}`;     /* a session's (as the CLI) */

  /* how much is left, in a class and in words */
  function level(left, limit) {
    if (limit === null || limit <= 0) return {cls: left > 0 ? "meter-ok" : "meter-red", words: left > 0 ? "" : "none left"};
    const f = Math.max(0, left) / limit;
    if (f <= 0) return {cls: "meter-red", words: "none left"};
    if (f < RED) return {cls: "meter-red", words: "under a tenth left"};
    if (f < AMBER) return {cls: "meter-amber", words: "under a quarter left"};
    return {cls: "meter-ok", words: ""};
  }

  /* a reset as the provider said it: an instant (Anthropic's RFC 3339), or a duration (OpenAI's "6m0s") */
  function resetText(reset) {
    if (reset === null || reset === undefined || reset === "") return "";
    const s = String(reset);
    if (/^\d{4}-\d\d-\d\dT/.test(s)) {
      const t = Date.parse(s);
      if (Number.isFinite(t)) {
        const secs = Math.round((t - Date.now()) / 1000);
        const at = new Date(t).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"});
        return secs > 0 ? `resets at ${at} (in ${secs < 120 ? `${secs} s` : `${Math.round(secs / 60)} min`})` : `reset at ${at}`;
      }
    }
    const n = num(s);
    return n !== null ? `resets in ${n} s` : `resets in ${s}`;
  }

  function bar(value, max, cls, label) {
    return h("progress", {class: `meter-bar ${cls}`, value: String(Math.max(0, value)), max: String(max > 0 ? max : 1),
                          "aria-label": label});
  }

  /* one rate bucket of one provider's reading */
  function rateRow(provider, key, label, bucket) {
    const limit = bucket ? num(bucket.limit) : null, left = bucket ? num(bucket.remaining) : null;
    const row = h("li", {class: "meter-row", dataset: {meter: `${provider}:${key}`}});
    if (limit === null && left !== null) {        /* what is left, without the limit it is of */
      row.classList.add("meter-partial");
      const reset = resetText(bucket.reset);
      OV.append(row, [h("span", {class: "meter-label"}, label), h("span", {class: "meter-text"}, `${count(left)} left`),
                      h("span", {class: "meter-note"}, "the provider did not state the limit", reset ? ` \u00b7 ${reset}` : null)]);
      return row;
    }
    if (limit === null || left === null) {
      row.classList.add("meter-none");
      row.append(h("span", {class: "meter-label"}, label), h("span", {class: "meter-text"}, "no reading yet"));
      return row;
    }
    const {cls, words} = level(left, limit);
    row.classList.add(cls);
    const reset = resetText(bucket.reset);
    const text = `${count(left)} of ${count(limit)} left`;
    OV.append(row, [h("span", {class: "meter-label"}, label), h("span", {class: "meter-text"}, text),
                    bar(left, limit, cls, `${label}: ${text}${words ? `, ${words}` : ""}`),
                    words || reset ? h("span", {class: "meter-note"},
                      words ? h("span", {class: "meter-words"}, words) : null, words && reset ? " \u00b7 " : null,
                      reset ? h("span", {class: "meter-reset"}, reset) : null) : null]);
    return row;
  }

  function providerBlock(provider, reading) {
    const name = PROVIDER_LABELS[provider] || provider;
    const when = reading.at ? ago(Date.parse(reading.at) / 1000) : "";
    const shown = BUCKETS.filter(([key]) => reading[key]);
    /* what the provider states: tokens (or input/output tokens) and requests; a missing one says so */
    const keys = shown.length ? shown : [];
    if (!reading.requests) keys.push(["requests", "Requests/min"]);
    if (!reading.tokens && !reading.input_tokens && !reading.output_tokens) keys.unshift(["tokens", "Tokens/min"]);
    const retry = num(reading.retry_after);
    return h("li", {class: "meter-provider", dataset: {provider}},
      h("p", {class: "meter-head"}, h("span", {class: "meter-name"}, name),
        when ? h("span", {class: "meter-when", title: reading.at}, `read ${when}`) : null),
      h("ul", {class: "meter-rows"}, keys.map(([key, label]) => rateRow(provider, key, label, reading[key]))),
      retry !== null ? h("p", {class: "meter-retry meter-red"}, `Told to wait: retry after ${retry} s`) : null);
  }

  /* where a budget line comes from (cost.budget_lines' source), in words */
  function sourceWords(source) {
    if (!source || source === "config") return "the machine's budget (overlord cost budget)";
    const m = /^account: (.+)$/.exec(source);
    if (m) return `the account ${m[1]} (overlord users budget ${m[1]})`;
    return source;
  }

  /* the ledger's spend today / this month against its line (and where the line comes from) */
  function spendRow(key, label, line) {
    line = line || {};
    const spent = num(line.spent) || 0, limit = num(line.limit);
    const row = h("li", {class: "meter-row meter-spend", dataset: {meter: key}});
    if (limit === null) {
      row.classList.add("meter-none");
      row.append(h("span", {class: "meter-label"}, label),
                 h("span", {class: "meter-text"}, `${usd(spent)} spent \u00b7 no budget line`));
      row.title = `No ${key}_usd line is set: overlord cost budget --${key}-usd X sets one`;
      return row;
    }
    const left = Math.max(0, limit - spent);
    const {cls, words} = level(limit - spent, limit);
    row.classList.add(cls);
    const source = `the ${key}_usd line of ${usd(limit)} is set by ${sourceWords(line.source)}`;
    row.title = source;
    const text = `${usd(left)} of ${usd(limit)} left`;
    OV.append(row, [h("span", {class: "meter-label"}, label), h("span", {class: "meter-text"}, text),
                    bar(left, limit, cls, `${label}: ${text}, ${usd(spent)} spent${words ? `, ${words}` : ""}; ${source}`),
                    h("span", {class: "meter-note"}, words ? h("span", {class: "meter-words"}, words) : null,
                      words ? " \u00b7 " : null, `${usd(spent)} spent`,
                      h("span", {class: "visually-hidden"}, `; ${source}`))]);
    return row;
  }

  /* -- the meter ------------------------------------------------------------------------------ */
  const meter = {timer: null, seq: 0};

  async function refresh() {
    const box = $("meter");
    if (!box) return;
    const seq = ++meter.seq;
    let data;
    try { data = await api("GET", "/api/usage"); }
    catch (e) {
      if (seq !== meter.seq) return;
      clear($("meter-rate")).append(h("li", {class: "meter-row meter-error muted small"}, `The meter could not be read: ${e.message}`));
      return;
    }
    if (seq !== meter.seq) return;
    draw(data || {});
  }

  function draw(data) {
    const rate = clear($("meter-rate")), spend = clear($("meter-spend"));
    const readings = Object.entries(data.rate || {}).filter(([, r]) => r && typeof r === "object");
    if (!readings.length) {
      rate.append(h("li", {class: "meter-provider meter-unread"},
        h("ul", {class: "meter-rows"}, rateRow("", "tokens", "Tokens/min", null), rateRow("", "requests", "Requests/min", null)),
        h("p", {class: "meter-hint"}, "A provider states its limits on its first reply.")));
    }
    for (const [provider, reading] of readings.sort(([a], [b]) => a.localeCompare(b))) rate.append(providerBlock(provider, reading));
    const s = data.spend || {};
    spend.append(spendRow("day", "Today", s.day), spendRow("month", "This month", s.month));
    $("meter").dataset.loaded = "1";
  }

  function start() {
    if (!$("meter")) return;
    refresh();
    clearInterval(meter.timer);
    meter.timer = setInterval(refresh, REFRESH_MS);
  }

  /* -- the inspector: the session's cost, and Export ------------------------------------------------ */
  function costText(cost) {
    if (!cost) return "";
    const tokens = num(cost.tokens) !== null ? num(cost.tokens)
      : (num(cost.input_tokens) || 0) + (num(cost.output_tokens) || 0) + (num(cost.cache_read_tokens) || 0) + (num(cost.cache_write_tokens) || 0);
    const dollars = num(cost.usd);
    const unpriced = (cost.unpriced || []).filter(Boolean);
    const calls = num(cost.calls);
    const parts = [`${count(tokens)} token${tokens === 1 ? "" : "s"}`];
    if (dollars !== null && (dollars > 0 || !unpriced.length)) parts.push(usdFine(dollars));
    if (unpriced.length) parts.push(`unpriced: ${unpriced.join(", ")}`);
    if (calls) parts.push(`${calls} model call${calls === 1 ? "" : "s"}`);
    return parts.join(" \u00b7 ");
  }

  function inspector(d) {
    const bar_ = $("session-bar");
    if (!bar_) return;
    if (!d) { bar_.hidden = true; return; }
    bar_.hidden = false;
    const line = $("session-cost");
    const c = d.cost, spent = c && ((num(c.tokens) || 0) > 0 || (num(c.calls) || 0) > 0 || (num(c.usd) || 0) > 0);
    line.textContent = spent ? `Cost: ${costText(c)}` : c ? "No model calls yet." : "";
    const link = $("export");
    link.href = `/api/session/${encodeURIComponent(d.meta.sid)}/export`;
    link.setAttribute("download", `${d.meta.sid}.ovl`);
    link.title = `Download ${d.meta.sid} as a signed .ovl bundle (overlord import FILE on another machine)`;
    const busy = !!d.running;
    link.classList.toggle("disabled", busy);
    link.setAttribute("aria-disabled", busy ? "true" : "false");
  }

  /* -- Settings -> Notifications (administrators) ------------------------------------------------------- */
  const notify = {data: null, seq: 0};

  function isAdmin() {
    const me = ACCOUNTS.me;
    return !me.accounts || me.role === "admin";
  }

  async function fillNotifications() {
    const box = $("s-notify");
    if (!box) return;
    const admin = isAdmin();
    box.hidden = $("nav-notify").hidden = !admin;
    if (!admin) return;
    const seq = ++notify.seq;
    for (const id of ["w-error", "w-status", "w-list-error", "w-base-status"]) $(id).textContent = "";
    let data;
    try { data = await api("GET", "/api/webhooks"); }
    catch (e) { if (seq === notify.seq) $("w-list-error").textContent = `The webhooks could not be read: ${e.message}`; return; }
    if (seq !== notify.seq) return;
    show(data);
    deliveries();
  }

  function show(data) {
    notify.data = data;
    const list = clear($("w-list"));
    if (!data.hooks.length) list.append(h("li", {class: "muted small hook-none"}, "No webhooks yet. Add one below."));
    for (const hook of data.hooks) list.append(hookRow(hook));
    const sel = $("w-on");
    if (!sel.options.length || sel.dataset.filled !== String(data.actions.length)) {
      const chosen = new Set(sel.options.length ? [...sel.selectedOptions].map((o) => o.value) : data.default_on);
      clear(sel).append(h("option", {value: "*", selected: chosen.has("*")}, "* (every act)"),
        ...data.actions.map((a) => h("option", {value: a, selected: chosen.has(a)}, a)));
      sel.dataset.filled = String(data.actions.length);
    }
    if (!$("w-format").options.length) {
      for (const f of data.formats) $("w-format").append(h("option", {value: f}, f === "json" ? "json (signed)" : f));
    }
    if (document.activeElement !== $("w-base-url")) $("w-base-url").value = data.base_url || "";
  }

  function hookRow(hook) {
    const status = h("p", {class: "hook-status small", role: "status"});
    const test = h("button", {class: "button ghost small", type: "button"}, "Test");
    const remove = h("button", {class: "button ghost small danger-text", type: "button"}, "Remove");
    const confirm = h("span", {class: "hook-confirm small", hidden: true});
    const on = (hook.on || []).length ? hook.on.join(", ") : "the default acts";
    const secret = !hook.secret ? "no secret" : hook.secret === "set" ? "secret set" : `secret from ${hook.secret}`;
    const row = h("li", {class: "hook-row", dataset: {hook: hook.name}},
      h("div", {class: "hook-line"},
        h("code", {class: "hook-name"}, hook.name),
        h("span", {class: "hook-host", title: hook.url}, hook.host || hook.url),
        h("span", {class: "pill hook-format"}, hook.format || "?"),
        h("span", {class: "pill hook-secret"}, secret),
        hook.allow_private ? h("span", {class: "pill hook-private", title: "may reach loopback and private addresses"}, "private allowed") : null,
        h("span", {class: "hook-actions"}, test, remove)),
      h("p", {class: "hook-on small"}, h("span", {class: "journal-label"}, "On: "), on),
      confirm, status);
    test.addEventListener("click", async () => {
      test.disabled = true;
      status.className = "hook-status small";
      status.textContent = "Sending a test\u2026";
      try {
        const r = await api("POST", `/api/webhooks/${encodeURIComponent(hook.name)}/test`, {});
        const o = r.outcome || {};
        status.classList.add(o.ok ? "ok" : "fail");
        status.textContent = outcomeText(o);
      } catch (e) {
        status.classList.add("fail");
        status.textContent = e.message;
      } finally { test.disabled = false; deliveries(); }
    });
    remove.addEventListener("click", () => {
      clear(confirm).append(`Remove the webhook ${hook.name}? `,
        h("button", {class: "button danger small", type: "button", onclick: () => removeHook(hook.name, status)}, "Remove"), " ",
        h("button", {class: "button ghost small", type: "button", onclick: () => { confirm.hidden = true; }}, "Keep"));
      confirm.hidden = false;
    });
    return row;
  }

  function outcomeText(o) {
    if (typeof o === "string") return o;
    const code = o.status || o.http_status || o.code;
    const took = num(o.ms) !== null ? ` in ${Math.round(num(o.ms))} ms` : num(o.seconds) !== null ? ` in ${num(o.seconds).toFixed(2)} s` : "";
    if (o.ok) return `Delivered${code ? `: HTTP ${code}` : ""}${took}.`;
    return `Not delivered${code ? `: HTTP ${code}` : ""}${o.error ? `${code ? " \u2014 " : ": "}${o.error}` : ""}${took}.`;
  }

  async function removeHook(name, status) {
    try { show(await api("DELETE", `/api/webhooks/${encodeURIComponent(name)}`)); $("w-status").textContent = `Removed ${name}.`; }
    catch (e) { status.textContent = e.message; }
  }

  const FIELDS = {"w-name": "w-name", "w-url": "w-url", "w-format": "w-format", "w-on": "w-on",
                  "w-secret": "w-secret", "w-private": "w-private"};

  function fieldError(id, message) {
    const slot = document.querySelector(`.field-error[data-for="${id}"]`) || $("w-error");
    slot.textContent = message;
    const input = $(id);
    if (input) { input.classList.add("invalid"); input.focus(); }
  }

  function clearFieldErrors() {
    for (const id of Object.keys(FIELDS)) {
      const slot = document.querySelector(`.field-error[data-for="${id}"]`);
      if (slot) slot.textContent = "";
      $(id).classList.remove("invalid");
    }
    $("w-error").textContent = "";
  }

  async function addHook() {
    clearFieldErrors();
    $("w-status").textContent = "";
    const name = $("w-name").value.trim(), url = $("w-url").value.trim();
    if (!name) return fieldError("w-name", "Name the webhook (e.g. team-slack).");
    if (!url) return fieldError("w-url", "Give the URL to post to.");
    const body = {name, url, format: $("w-format").value, on: [...$("w-on").selectedOptions].map((o) => o.value),
                  allow_private: $("w-private").checked};
    const secret = $("w-secret").value;
    if (secret) body.secret = secret;
    $("w-add").disabled = true;
    try {
      show(await api("POST", "/api/webhooks", body));
      $("w-status").textContent = `Added ${name}.`;
      for (const id of ["w-name", "w-url", "w-secret"]) $(id).value = "";
      $("w-private").checked = false;
    } catch (e) {
      const f = e.data && e.data.field;
      if (f && FIELDS[f]) fieldError(FIELDS[f], e.message);
      else if (/exists|named/i.test(e.message)) fieldError("w-name", e.message);
      else if (/secret/i.test(e.message)) fieldError("w-secret", e.message);
      else if (/url|address|host|scheme|http/i.test(e.message)) fieldError("w-url", e.message);
      else $("w-error").textContent = e.message;
    } finally { $("w-add").disabled = false; }
  }

  async function saveBaseUrl() {
    const status = $("w-base-status");
    status.textContent = "";
    $("w-base-error").textContent = "";
    try {
      show(await api("PUT", "/api/webhooks/base-url", {url: $("w-base-url").value.trim() || null}));
      status.textContent = notify.data.base_url ? `Links start with ${notify.data.base_url}.` : "No base URL: messages carry no link.";
    } catch (e) { $("w-base-error").textContent = e.message; }
  }

  async function deliveries() {
    const body = clear($("w-deliveries"));
    let data;
    try { data = await api("GET", "/api/webhooks/deliveries"); }
    catch (e) { body.append(h("tr", {}, h("td", {colspan: "4", class: "muted small"}, `The delivery log could not be read: ${e.message}`))); return; }
    const rows = data.deliveries || [];                  /* newest first */
    $("w-deliveries-none").hidden = rows.length > 0;
    for (const d of rows) {
      const ts = num(d.ts) !== null ? num(d.ts) : Date.parse(d.ts || d.at) / 1000;
      const entry = d.entry || {};
      const action = d.action || entry.action || "";
      const tries = num(d.attempts !== undefined ? d.attempts : d.attempt);
      body.append(h("tr", {class: `delivery ${d.ok ? "ok" : "fail"}`, dataset: {hook: d.hook || ""}},
        h("td", {class: "small"}, Number.isFinite(ts) ? new Date(ts * 1000).toLocaleString() : ""),
        h("td", {}, h("code", {}, d.hook || "?")),
        h("td", {class: "small"}, action, d.test ? " (test)" : ""),
        h("td", {class: `small delivery-outcome ${d.ok ? "ok" : "fail"}`}, outcomeText(d), tries ? ` (${tries} attempt${tries === 1 ? "" : "s"})` : "")));
    }
  }

  function wire() {
    if (!$("s-notify")) return;
    $("w-add").addEventListener("click", addHook);
    $("w-base-save").addEventListener("click", saveBaseUrl);
    $("w-refresh").addEventListener("click", deliveries);
    /* Enter in our inputs presses our button, never the Settings form's Save */
    for (const [id, button] of [["w-name", "w-add"], ["w-url", "w-add"], ["w-secret", "w-add"], ["w-base-url", "w-base-save"]]) {
      $(id).addEventListener("keydown", (e) => {
        if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); e.stopPropagation(); $(button).click(); }
      });
    }
  }

  wire();
  return {start, refresh, costText, inspector, fillNotifications};
})();
