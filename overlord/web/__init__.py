"""`overlord ui`: the chat workspace (/) and the console (/console), served by the standard
library's http.server, calling overlord.ops in-process.

    server.py    the threaded HTTP server: routing, pages, static files, security headers
    security.py  the launch token, the cookie, the Host / Origin guards, the CSP nonce
    api.py       the JSON API over overlord.ops (sessions, actions, blame, settings, models,
                 the content gate, reviews, revert, the audit log); per-file diffs come from
                 overlord.ops.patch (staged) and ops.committed_diff (committed)
    chats.py     conversations: agent runs in threads, their live events (server-sent events);
                 Stop sets the run's ops.Cancel, which the provider HTTP layer honours
    reviews.py   second-model reviews (ops.review) in threads, their state for the pages to poll
    settings.py  the workspace's settings (per-provider profiles), validated, stored 0600;
                 each account's own in users/<name>/ui.json
    roles.py     who may call each route (the rules TABLE in server.py names), ownership
    accounts.py  sign-in and out (password, single sign-on), whoami, the accounts API, your
                 own password and script tokens
    pages.py     the HTML templates, filled with escaped values and a per-response nonce
    static/      the pages' CSS and JavaScript, as files (no build step, nothing fetched)

The single-threaded helper that opens sessions and runs commands for this threaded server is
overlord/ops/launcher.py (the daemon and the MCP server use it too).
"""
