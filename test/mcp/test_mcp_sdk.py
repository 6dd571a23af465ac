"""The official MCP Python SDK as the real client of `overlord mcp serve` over stdio: once in
its automatic mode (it probes server/discover and settles on the stateless 2026-07-28
revision) and once forcing the legacy handshake (mode="legacy": initialize, 2025-11-25),
driving a session from open_session to request_review on both backends, and `overlord log`
attributing every change to the client's tool call."""
import pytest

from conftest import tree
from mcplib import MODES, admit, attributed, drive, require_mcp, sdk, stdio_transport

require_mcp()


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

    attributed(home, backend, sid, name)


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
