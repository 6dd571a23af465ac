"""The service layer: every operation a face (CLI, web, daemon, MCP server) offers, implemented once.

Faces parse and render; they call these functions and nothing below them. Results are data
(dataclasses and dicts); errors are OverlordError subclasses carrying their exit code.

Names are loaded on first use (PEP 562), so a face pays only for the operations it calls:
`overlord --help` imports none of them, `overlord exec` only the engine's run path.
"""
import importlib
import sys
import types

_EXPORTS = {
    "audit": ("audit_checkpoint", "audit_key", "audit_show", "audit_status", "audit_verify", "audit_witness", "audit_witness_serve"),
    "agent": ("AgentResult", "agent", "keys_list", "keys_set", "models", "resume", "session_cost", "transcript"),
    "cancel": ("Cancel", "Cancelled"),
    "connectors": ("ApprovalRequest", "Decision", "approval_mode", "connector_list", "external_actions"),
    "countersign": ("Standing", "review", "reviews", "standing"),
    "check": ("CheckReport", "check"),
    "decide": ("CommitResult", "commit", "rollback"),
    "recovery": ("recover",),
    "peek": ("OPEN_STATES", "policy_stamp", "session_record"),
    "doctor": ("DoctorReport", "containment_layers", "doctor", "host_tool", "sessions"),
    "execute": ("Captured", "ExecResult", "RunResult", "command_cause", "enforcement", "exec_capture", "exec_in", "run", "captured"),
    "grants": ("crossed_grant", "load_manifest", "merge_grants", "parse_net_allow", "require_target", "resolve_target", "validate_grants"),
    "history": ("compare", "fork", "rewind", "savepoints"),
    "home": ("ensure_home", "ensure_user_dir", "home", "open_user_dir", "user_dir", "valid_user", "write_private_json"),
    "kept": ("committed_diff",),
    "policy": ("PolicyView", "policy_cap_preview", "policy_check", "policy_set", "policy_show"),
    "revert": ("revert",),
    "broker": ("BROKERED", "Broker", "Caller", "TOOL_SPECS", "ToolOutcome", "covered"),
    "memory": ("memory_accept", "memory_journal", "memory_proposals", "memory_show", "memory_user", "memory_user_add", "memory_user_set"),
    "skills": ("skill_add", "skill_new", "skill_remove", "skill_show", "skills_list"),
    # issue 16 (each module's owner keeps its line true)
    "cost": ("cost_budget", "cost_prices", "cost_report", "cost_set_price", "usage_meter"),
    "notify": ("webhook_add", "webhook_base_url", "webhook_deliveries", "webhook_list", "webhook_remove", "webhook_test"),
    "secrets": ("secrets_off", "secrets_set_command", "secrets_show", "secrets_test"),
    "gc": ("gc",),
    "bundle": ("bundle_key", "export_session", "import_bundle"),
    # issue 17 (ops/egress.py's owner keeps this line true)
    "egress": ("egress_report", "release_held", "drop_held", "held_waiting"),
    "review": ("KINDS", "reconcile", "LogRecord", "blame", "change_words", "describe", "diff", "get_session", "git_summary", "log", "resolve_sid", "syscalls", "traced", "unified"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'overlord.ops' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"overlord.ops.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


class _Ops(types.ModuleType):
    """Importing a submodule binds it on its package; where it shares a name with an
    operation (agent, check, review, revert) the operation keeps the name."""

    def __setattr__(self, name, value):
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Ops
