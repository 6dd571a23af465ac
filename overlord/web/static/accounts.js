/* Accounts in the browser: who is signed in (GET /api/whoami), Sign out, Settings -> Your
   account (your password, your script tokens) and, for admins, Settings -> Accounts.
   With accounts off (whoami says "accounts": false, or an older server has no whoami) nothing
   here shows: the launch-token operator sees the workspace exactly as before.
   Every value from the server goes into text nodes; nothing here assigns innerHTML. */
"use strict";

const ACCOUNTS = (() => {
  const {h, clear, api} = OV;
  const $ = (id) => document.getElementById(id);
  const me = {accounts: false, name: null, role: null, via: null, sso: false, loaded: false};
  const NAME_RE = /^[a-z][a-z0-9_.-]{0,31}$/;
  const ROLES = ["admin", "operator", "viewer"];
  const ROLE_LINES = {admin: "admin \u00b7 may do everything", operator: "operator \u00b7 works in their own conversations",
                      viewer: "viewer \u00b7 reads every record, changes nothing"};

  async function load() {
    try {
      const r = await api("GET", "/api/whoami");
      Object.assign(me, {accounts: !!(r && r.accounts), name: (r && r.name) || null, role: (r && r.role) || null,
                         via: (r && r.via) || null, sso: !!(r && r.sso)});
    } catch (e) {
      me.accounts = false;        /* accounts off, or a server without whoami: nothing changes */
    }
    me.loaded = true;
    if (me.accounts && me.role) document.body.dataset.role = me.role;
    else delete document.body.dataset.role;
    OV.signedIn = me.accounts && !!me.name;
    return me;
  }

  const isSso = (name) => typeof name === "string" && name.includes("@");

  function when(stamp) {
    if (stamp === null || stamp === undefined || stamp === "") return "";
    const t = typeof stamp === "number" ? stamp : Date.parse(stamp) / 1000;
    return Number.isFinite(t) ? OV.ago(t) : String(stamp);
  }

  function listOf(data, key) {
    if (Array.isArray(data)) return data;
    return (data && Array.isArray(data[key])) ? data[key] : [];
  }

  /* -- who is signed in, and Sign out ------------------------------------------------------------ */
  async function signOut(button, where) {
    if (button) button.disabled = true;
    OV.signedIn = false;               /* a read the sign-out answers 401 is no "expired" sign-in */
    try {
      await api("POST", "/api/logout", {});
    } catch (e) {
      if (e.status !== 401) {                         /* 401: already signed out */
        OV.signedIn = true;
        if (button) button.disabled = false;
        if (where) where.textContent = `Sign-out failed: ${e.message}`;
        return;
      }
    }
    location.assign("/login");
  }

  function roleLine() {
    return `${me.role || "?"}${isSso(me.name) ? " \u00b7 single sign-on" : ""}`;
  }

  /* the workspace's rail: avatar, name, role, Sign out */
  function rail() {
    const box = $("rail-user");
    if (!box) return;
    box.hidden = !OV.signedIn;
    if (!OV.signedIn) return;
    $("rail-user-avatar").textContent = me.name.slice(0, 1);
    $("rail-user-name").textContent = me.name;
    $("rail-user-name").title = me.name;
    $("rail-user-role").textContent = roleLine();
    $("sign-out").onclick = () => signOut($("sign-out"), $("rail-user-role"));
  }

  /* the console's top bar: the same, inline */
  function topbar(nav) {
    if (!OV.signedIn || !nav || $("topbar-user")) return;
    const out = h("button", {class: "button ghost small", id: "sign-out", type: "button"}, "Sign out");
    const line = h("span", {class: "topbar-user", id: "topbar-user"},
      h("span", {class: "avatar", "aria-hidden": "true"}, me.name.slice(0, 1)),
      h("span", {class: "rail-user-name", id: "topbar-user-name"}, me.name),
      h("span", {class: `pill role-${me.role}`, id: "topbar-user-role"}, me.role), out);
    out.addEventListener("click", () => signOut(out, $("topbar-user-role")));
    nav.append(line);
  }

  /* -- what the principal may do ---------------------------------------------------------------- */
  /* may this person write in the conversation? The server's word (`may_write`) wins; without it,
     the role decides (a viewer changes nothing; an operator only their own). */
  function mayWrite(...sources) {
    if (!me.accounts) return true;
    for (const s of sources) {
      if (s && typeof s.may_write === "boolean") return s.may_write;
      if (s && s.chat && typeof s.chat.may_write === "boolean") return s.chat.may_write;
    }
    if (me.role === "viewer") return false;
    const chat = sources.find((s) => s && s.sid);
    if (me.role === "operator" && chat && "owner" in chat && chat.owner !== me.name) return false;
    return true;
  }

  function mayStart() { return !me.accounts || me.role !== "viewer"; }

  /* a session the principal may change (commit, discard, rewind, fork, revert): from its meta */
  function mayChange(meta) {
    if (!me.accounts) return true;
    if (me.role === "admin") return true;
    if (me.role === "viewer") return false;
    return !!meta && meta.owner === me.name;
  }

  /* -- form helpers: an error next to its field ------------------------------------------------- */
  function fieldError(id, message) {
    const input = $(id);
    const slot = document.querySelector(`.field-error[data-for="${id}"]`);
    if (slot) slot.textContent = message;
    if (input) { input.classList.add("invalid"); input.focus(); }
  }

  function clearFields(ids) {
    for (const id of ids) {
      const slot = document.querySelector(`.field-error[data-for="${id}"]`);
      if (slot) slot.textContent = "";
      const input = $(id);
      if (input) input.classList.remove("invalid");
    }
  }

  /* which field a server refusal is about: its own "field" when it names one, else its words */
  function fieldOf(e, map, fallback) {
    const f = e.data && e.data.field;
    if (f && map[f]) return map[f];
    const text = String(e.message || "");
    for (const [re, id] of map._words || []) if (re.test(text)) return id;
    return fallback;
  }

  /* Enter in one of our inputs presses its button, never the Settings form's Save */
  function enterPresses(input, button) {
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); e.stopPropagation(); button.click(); }
    });
  }

  /* -- Settings -> Your account ------------------------------------------------------------------ */
  async function fillMe() {
    const box = $("s-me");
    if (!box) return;
    $("nav-me").hidden = box.hidden = !OV.signedIn;
    if (!OV.signedIn) return;
    clear($("me-who")).append("Signed in as ", h("strong", {}, me.name), ` \u00b7 ${ROLE_LINES[me.role] || me.role}`,
      isSso(me.name) ? " \u00b7 through single sign-on" : "");
    const sso = isSso(me.name);
    $("me-password-box").hidden = sso;
    $("me-sso-note").hidden = !sso;
    for (const id of ["me-old", "me-new", "me-new2"]) $(id).value = "";
    clearFields(["me-old", "me-new", "me-new2", "me-token-label"]);
    $("me-password-status").textContent = "";
    hideToken();
    await fillTokens();
  }

  function hideToken() {
    $("me-token-value").value = "";
    $("me-token-copied").textContent = "";
    $("me-token-shown").hidden = true;
  }

  const PASSWORD_FIELDS = {old: "me-old", new: "me-new", password: "me-new",
                           _words: [[/old|current|do not match|wrong|incorrect|locked|too many/i, "me-old"], [/password|short|long|weak/i, "me-new"]]};

  async function changePassword() {
    const old = $("me-old").value, fresh = $("me-new").value, again = $("me-new2").value;
    clearFields(["me-old", "me-new", "me-new2"]);
    $("me-password-status").textContent = "";
    if (!old) return fieldError("me-old", "Type your current password.");
    if (!fresh) return fieldError("me-new", "Type a new password.");
    if (fresh !== again) return fieldError("me-new2", "The two new passwords differ.");
    if (fresh === old) return fieldError("me-new", "The new password is the same as the current one.");
    const button = $("me-password-save");
    button.disabled = true;
    try {
      await api("POST", "/api/me/password", {old, new: fresh});
      for (const id of ["me-old", "me-new", "me-new2"]) $(id).value = "";
      $("me-password-status").textContent = "Password changed. Your other sign-ins have ended.";
    } catch (e) {
      fieldError(fieldOf(e, PASSWORD_FIELDS, e.status === 401 || e.status === 403 || e.status === 429 ? "me-old" : "me-new"), e.message);
    } finally { button.disabled = false; }
  }

  async function fillTokens() {
    const list = clear($("me-tokens"));
    let data;
    try { data = await api("GET", "/api/me/tokens"); }
    catch (e) { list.append(h("li", {class: "muted small"}, `Your tokens could not be read: ${e.message}`)); return; }
    const tokens = listOf(data, "tokens");
    if (!tokens.length) list.append(h("li", {class: "muted small token-none"}, "No script tokens yet."));
    for (const t of tokens) list.append(tokenRow(t));
  }

  function tokenRow(t) {
    const revoke = h("button", {class: "button ghost danger-text small", type: "button"}, "Revoke");
    const confirm = h("span", {class: "skill-confirm small", hidden: true});
    const error = h("p", {class: "field-error", role: "alert"});
    const row = h("li", {class: "token-row", dataset: {token: t.id}},
      h("div", {class: "token-line"},
        h("span", {class: "token-label"}, t.label || "no label"),
        h("code", {class: "token-id"}, t.id),
        h("span", {class: "token-meta"}, [t.created ? `made ${when(t.created)}` : null,
                                         t.used ? `last used ${when(t.used)}` : "never used"].filter(Boolean).join(" \u00b7 ")),
        h("span", {class: "token-actions"}, revoke)),
      confirm, error);
    const yes = h("button", {class: "button danger small", type: "button"}, "Revoke");
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      error.textContent = "";
      try {
        await api("DELETE", `/api/me/tokens/${encodeURIComponent(t.id)}`);
      } catch (e) { error.textContent = e.message; yes.disabled = false; return; }
      fillTokens();
    });
    revoke.addEventListener("click", () => {
      clear(confirm).append("Revoke this token? A script that uses it is refused from its next request. ", yes, " ",
        h("button", {class: "button ghost small", type: "button", onclick: () => { confirm.hidden = true; }}, "Keep"));
      confirm.hidden = false;
      yes.focus();
    });
    return row;
  }

  async function mintToken() {
    clearFields(["me-token-label"]);
    hideToken();
    const label = $("me-token-label").value.trim();
    const button = $("me-token-mint");
    button.disabled = true;
    try {
      const res = await api("POST", "/api/me/tokens", label ? {label} : {});
      $("me-token-value").value = res.token || "";
      $("me-token-shown").hidden = false;
      $("me-token-label").value = "";
      $("me-token-value").select();
      await fillTokens();
    } catch (e) {
      fieldError("me-token-label", e.message);
    } finally { button.disabled = false; }
  }

  async function copyToken() {
    const input = $("me-token-value");
    const done = (ok) => { $("me-token-copied").textContent = ok ? "Copied." : "Select it and copy it by hand."; };
    try {
      await navigator.clipboard.writeText(input.value);
      done(true);
    } catch (e) {
      input.select();
      let ok = false;
      try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
      done(ok);
    }
  }

  /* -- Settings -> Accounts (admins) ------------------------------------------------------------- */
  async function fillAccounts() {
    const box = $("s-accounts");
    if (!box) return;
    const admin = OV.signedIn && me.role === "admin";
    $("nav-accounts").hidden = box.hidden = !admin;
    if (!admin) return;
    clearFields(["a-name", "a-role", "a-password"]);
    $("a-error").textContent = "";
    await listAccounts();
  }

  async function listAccounts() {
    const list = clear($("a-list"));
    $("a-list-error").textContent = "";
    let data;
    try { data = await api("GET", "/api/users"); }
    catch (e) { $("a-list-error").textContent = `The accounts could not be read: ${e.message}`; return; }
    for (const u of listOf(data, "users")) list.append(accountRow(u));
  }

  function accountRow(u) {
    const self = u.name === me.name;
    const sso = !!u.sso || isSso(u.name);
    const edit = h("div", {class: "account-edit", hidden: true});
    const status = h("p", {class: "account-status", role: "status"});
    const buttons = [
      ["Change role", () => roleEditor(u, edit, status)],
      sso ? null : ["Reset password", () => passwordEditor(u, edit, status)],
      self ? null : ["Remove", () => removeConfirm(u, edit, status)],     /* another admin removes you */
    ].filter(Boolean).map(([label, fn]) => h("button", {class: `button ghost small${label === "Remove" ? " danger-text" : ""}`,
                                                        type: "button", onclick: fn}, label));
    const meta = [sso ? "single sign-on" : "password", u.created ? `added ${when(u.created)}` : null,
                  typeof u.tokens === "number" ? `${u.tokens} token${u.tokens === 1 ? "" : "s"}` : null].filter(Boolean).join(" \u00b7 ");
    return h("li", {class: `account-row${self ? " is-me" : ""}`, dataset: {account: u.name, role: u.role}},
      h("div", {class: "account-line"},
        h("span", {class: "account-name"}, u.name),
        self ? h("span", {class: "muted small"}, "(you)") : null,
        h("span", {class: `pill role-${u.role}`}, u.role),
        h("span", {class: "account-meta"}, meta),
        h("span", {class: "account-actions"}, buttons)),
      edit, status);
  }

  function editorError() { return h("p", {class: "field-error", role: "alert"}); }

  function openEditor(edit, status, ...children) {
    status.textContent = "";
    clear(edit).append(...children);
    edit.hidden = false;
  }

  function cancel(edit) {
    return h("button", {class: "button ghost small", type: "button", onclick: () => { edit.hidden = true; clear(edit); }}, "Cancel");
  }

  async function afterSelfChange() {
    try { await load(); } catch (e) { /* below */ }
    if (me.accounts && !me.name) { location.assign("/login"); return; }
    rail();
    await fillAccounts();
    await fillMe();
  }

  function roleEditor(u, edit, status) {
    const id = `a-role-${u.name}`;
    const select = h("select", {id, "aria-label": `the role of ${u.name}`},
      ROLES.map((r) => h("option", {value: r, selected: r === u.role}, r)));
    const error = editorError();
    const save = h("button", {class: "button primary small", type: "button"}, "Save role");
    save.addEventListener("click", async () => {
      error.textContent = "";
      select.classList.remove("invalid");
      if (select.value === u.role) { error.textContent = `${u.name} is already ${u.role}.`; select.classList.add("invalid"); return; }
      save.disabled = true;
      try {
        await api("PUT", `/api/users/${encodeURIComponent(u.name)}`, {role: select.value});
      } catch (e) { error.textContent = e.message; select.classList.add("invalid"); save.disabled = false; return; }
      const done = `${u.name} is now ${select.value}; their other sign-ins have ended.`;
      if (u.name === me.name) { await afterSelfChange(); return; }
      await listAccounts();
      const row = document.querySelector(`.account-row[data-account="${CSS.escape(u.name)}"] .account-status`);
      if (row) row.textContent = done;
    });
    openEditor(edit, status, h("div", {class: "field"},
      h("label", {for: id}, `New role for ${u.name}`),
      h("div", {class: "inline"}, select, save, cancel(edit)), error,
      u.name === me.name ? h("p", {class: "field-hint"}, "This is your own account: below admin you can no longer manage accounts.") : null));
    select.focus();
  }

  function passwordEditor(u, edit, status) {
    const id = `a-password-${u.name}`;
    const input = h("input", {id, type: "password", autocomplete: "new-password"});
    const error = editorError();
    const save = h("button", {class: "button primary small", type: "button"}, "Set password");
    enterPresses(input, save);
    save.addEventListener("click", async () => {
      error.textContent = "";
      input.classList.remove("invalid");
      if (!input.value) { error.textContent = "Type the new password."; input.classList.add("invalid"); input.focus(); return; }
      save.disabled = true;
      try {
        await api("PUT", `/api/users/${encodeURIComponent(u.name)}`, {password: input.value});
      } catch (e) { error.textContent = e.message; input.classList.add("invalid"); save.disabled = false; input.focus(); return; }
      edit.hidden = true;
      clear(edit);
      status.textContent = `The password of ${u.name} is reset; their sign-ins have ended.`;
    });
    openEditor(edit, status, h("div", {class: "field"},
      h("label", {for: id}, `New password for ${u.name}`),
      h("div", {class: "inline"}, input, save, cancel(edit)), error));
    input.focus();
  }

  function removeConfirm(u, edit, status) {
    const error = editorError();
    const yes = h("button", {class: "button danger small", type: "button"}, "Remove");
    yes.addEventListener("click", async () => {
      error.textContent = "";
      yes.disabled = true;
      try {
        await api("DELETE", `/api/users/${encodeURIComponent(u.name)}`);
      } catch (e) { error.textContent = e.message; yes.disabled = false; return; }
      if (u.name === me.name) { location.assign("/login"); return; }
      await listAccounts();
      $("a-status").textContent = `Removed ${u.name}.`;
    });
    openEditor(edit, status, h("div", {class: "skill-confirm small"},
      `Remove ${u.name}? Their sign-ins and tokens end at once; their conversations stay on record.`, " ", yes, " ", cancel(edit)), error);
    yes.focus();
  }

  const ADD_FIELDS = {name: "a-name", role: "a-role", password: "a-password",
                      _words: [[/password|passphrase/i, "a-password"], [/\brole\b|admin|operator|viewer/i, "a-role"],
                               [/name|exists|already|taken|account/i, "a-name"]]};

  async function addAccount() {
    const name = $("a-name").value.trim(), role = $("a-role").value, password = $("a-password").value;
    clearFields(["a-name", "a-role", "a-password"]);
    $("a-error").textContent = "";
    $("a-status").textContent = "";
    if (!name) return fieldError("a-name", "Name the account.");
    if (!NAME_RE.test(name)) return fieldError("a-name", "A name is lower-case letters, digits, '.', '_' or '-', starting with a letter (at most 32).");
    if (!ROLES.includes(role)) return fieldError("a-role", "Choose admin, operator or viewer.");
    if (!password) return fieldError("a-password", "Give the account a password.");
    const button = $("a-add");
    button.disabled = true;
    try {
      await api("POST", "/api/users", {name, role, password});
    } catch (e) {
      const field = fieldOf(e, ADD_FIELDS, null);
      if (field) fieldError(field, e.message);
      else $("a-error").textContent = e.message;
      return;
    } finally { button.disabled = false; }
    $("a-name").value = "";
    $("a-password").value = "";
    $("a-role").value = "operator";
    $("a-status").textContent = `Added ${name} (${role}).`;
    await listAccounts();
  }

  /* -- wiring (the workspace's Settings; the console has none of these elements) ----------------- */
  function wire() {
    if (!$("s-me")) return;
    $("me-password-save").addEventListener("click", changePassword);
    $("me-token-mint").addEventListener("click", mintToken);
    $("me-token-copy").addEventListener("click", copyToken);
    $("a-add").addEventListener("click", addAccount);
    for (const input of document.querySelectorAll("#s-me [data-enter], #s-accounts [data-enter]")) {
      enterPresses(input, $(input.dataset.enter));
    }
    const dialog = $("settings");
    if (dialog) dialog.addEventListener("close", hideToken);     /* a minted token is shown once */
  }
  wire();

  /* Settings opened: both sections, as the server says now */
  async function fillSettings() {
    await load();
    rail();
    await Promise.all([fillMe(), fillAccounts()]);
  }

  return {me, load, rail, topbar, signOut, mayWrite, mayStart, mayChange, fillSettings};
})();
