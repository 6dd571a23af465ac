/* The sign-in page. The form works without this script (it posts to /api/login and the server
   answers with a redirect); the script only fills in what the URL knows: where to go next,
   the error line for ?error=, and the single sign-on button when GET /api/whoami says "sso". */
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const ERRORS = {
    "1": "That name and password do not match. Try again.",
    locked: "Too many failed sign-ins: wait a minute, then try again.",
    sso: "Single sign-on did not complete. Try again, or use your name and password.",
    expired: "Your sign-in has ended. Sign in again.",
  };
  const q = new URLSearchParams(location.search);

  /* a path on this server only: "/x", never "//host", "/\host" or a scheme */
  function local(path) {
    return typeof path === "string" && path.startsWith("/") && !path.startsWith("//") &&
      !path.includes("\\") && !/[\u0000-\u001f\u007f]/.test(path) && path.length <= 2000;
  }

  /* the page asked for (this page stands in for it), else ?next=, else what the server said */
  let next = $("signin-next").value || "/";
  if (location.pathname !== "/login") next = location.pathname + location.search + location.hash;
  else if (local(q.get("next"))) next = q.get("next") + (location.hash || "");
  if (!local(next)) next = "/";
  $("signin-next").value = next;
  $("sso-button").href = `/sso/start?${new URLSearchParams({next})}`;

  const err = $("signin-error");
  const code = q.get("error");
  if (!err.dataset.error && code && location.pathname === "/login") {
    err.textContent = ERRORS[code] || "Sign-in failed. Try again.";
    err.dataset.error = ERRORS[code] ? code : "other";
    err.hidden = false;
  }

  async function whoami() {
    try {
      const res = await fetch("/api/whoami", {headers: {"Accept": "application/json"}, credentials: "same-origin"});
      if (!res.ok) return;
      const me = await res.json();
      if (me && me.sso) $("signin-sso").hidden = false;
      /* already signed in (another tab did it): straight on */
      if (me && me.accounts && me.name && location.pathname === "/login") location.replace(next);
    } catch (e) { /* the form still works */ }
  }
  whoami();

  $("signin-form").addEventListener("submit", () => {
    $("signin-submit").disabled = true;
    $("signin-submit").textContent = "Signing in\u2026";
  });
  window.addEventListener("pageshow", () => {        /* back from the next page: usable again */
    $("signin-submit").disabled = false;
    $("signin-submit").textContent = "Sign in";
  });
  if (!$("signin-error").hidden) $("signin-password").focus();
})();
