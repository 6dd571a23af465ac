"""The official MCP Python SDK as the real client of `overlord mcp serve` over stdio: once in
its automatic mode (it probes server/discover and settles on the stateless 2026-07-28
revision) and once forcing the legacy handshake (mode="legacy": initialize, 2025-11-25),
driving a session from open_session to request_review on both backends, and `overlord log`
attributing every change to the client's tool call."""
import json

import pytest

from conftest import Ovl, tree
from mcplib import admit, grants, sdk, stdio_transport

pytest.importorskip("mcp")

TOOLS = ["open_session", "exec", "read_file", "write_file", "edit_file", "list_dir", "search",
         "diff", "savepoints", "rewind", "request_review", "rollback"]
MODES = [("auto", "2026-07-28"), ("legacy", "2025-11-25")]


async def drive(client, backend, version):
    """open_session -> exec -> write_file -> edit_file -> read_file -> diff -> savepoints ->
    rewind -> request_review; returns (sid, what each step said)."""
    assert client.protocol_version == version
    assert client.server_info.name == "overlord"
    listed = await client.list_tools()
    assert [t.name for t in listed.tools] == TOOLS          # and deliberately no commit tool
    assert all("session" in t.input_schema["required"] for t in listed.tools[1:])

    async def call(name, **arguments):
        result = await client.call_tool(name, arguments)
        assert not result.is_error, (name, result.content)
        return result.structured_content, result.content[0].text

    opened, text = await call("open_session", **grants(backend))
    sid = opened["session"]
    assert sid in text and "request_review" in text
    ran, text = await call("exec", session=sid,
                           command="echo made > made.txt; echo out; echo err >&2; exit 3")
    assert (ran["exit_code"], ran["stdout"], ran["stderr"], ran["savepoint"]) == (3, "out\n", "err\n", 0)
    assert "exit code: 3" in text
    wrote, _ = await call("write_file", session=sid, path="notes/n.txt", content="one\ntwo\n")
    assert wrote["savepoint"] == 1
    edited, _ = await call("edit_file", session=sid, path="notes/n.txt", old="two", new="three")
    assert edited["savepoint"] == 2
    _, text = await call("read_file", session=sid, path="notes/n.txt")
    assert text == "one\nthree\n"
    _, text = await call("search", session=sid, pattern="thr+ee")
    assert "notes/n.txt:2:three" in text
    changed, text = await call("diff", session=sid)
    assert {c["path"] for c in changed["changes"]} >= {"made.txt", "notes/n.txt"}
    assert "added  made.txt" in text.splitlines()
    points, _ = await call("savepoints", session=sid)
    assert [(p["layer"], p["caused_by"]["tool"]) for p in points["savepoints"]] == \
        [(0, "exec"), (1, "write_file"), (2, "edit_file")]
    rewound, _ = await call("rewind", session=sid, to=1)
    assert rewound["dropped"] == 1
    _, text = await call("read_file", session=sid, path="notes/n.txt")
    assert text == "one\ntwo\n"                      # as write_file left it
    asked, text = await call("request_review", session=sid)
    assert asked["needs_review"]["face"] == "mcp"
    return sid


@pytest.mark.parametrize("mode, version", MODES)
def test_the_sdk_drives_a_session_from_open_session_to_request_review(home, target, backend,
                                                                       tmp_path, mode, version):
    admit(home, target, backend)
    before = tree(target)
    name = f"sdk-{mode}"
    with open(tmp_path / "server.err", "w") as errlog:
        sid = sdk(stdio_transport(home, target, backend, errlog), mode, name,
                  lambda client: drive(client, backend, version))
    err = (tmp_path / "server.err").read_text()
    assert "Traceback" not in err, err
    assert tree(target) == before                    # staged, never committed

    ovl = Ovl(home, backend)
    log = json.loads(ovl("log", sid, "--json", check=0).out)
    causes = {c["path"]: c["caused_by"] for c in log["changes"]}
    made, notes = causes["made.txt"], causes["notes/n.txt"]
    assert {k: made[k] for k in ("kind", "tool", "client", "summary")} == {
        "kind": "mcp", "tool": "exec", "client": name,
        "summary": "exec(echo made > made.txt; echo out; echo err >&2; exit 3)"}
    assert {k: notes[k] for k in ("kind", "tool", "client", "summary")} == {
        "kind": "mcp", "tool": "write_file", "client": name, "summary": "write_file(notes/n.txt)"}
    assert made["call"].isdigit() and notes["call"].isdigit() and made["call"] != notes["call"]

    meta = json.loads((home / "sessions" / sid / "meta.json").read_text())
    assert meta["state"] == "pending"
    assert meta["broker"] == {"face": "mcp", "client": name}
    assert {k: meta["needs_review"][k] for k in ("face", "client")} == {"face": "mcp", "client": name}
    if backend == "kernel":                          # unasked: jailed and offline
        assert (meta["grants"]["jail"], meta["grants"]["net"]) == (True, "none")
    acts = [json.loads(line) for line in (home / "audit.jsonl").read_text().splitlines()]
    assert any(a["action"] == "session.needs_review" and a.get("sid") == sid for a in acts)


def test_an_uncovered_folder_refuses_open_session_naming_the_policy_file(home, target, tmp_path):
    """No `targets` rule: the call is a tool error (isError) that names the file; nothing opens."""
    before = tree(target)

    async def body(client):
        result = await client.call_tool("open_session", {})
        assert result.is_error
        return result.content[0].text
    with open(tmp_path / "server.err", "w") as errlog:
        text = sdk(stdio_transport(home, target, None, errlog), "auto", "sdk-denied", body)
    assert str(home / "policy.json") in text and '"targets"' in text and str(target) in text
    assert not (home / "sessions").exists() or not list((home / "sessions").iterdir())
    assert tree(target) == before
