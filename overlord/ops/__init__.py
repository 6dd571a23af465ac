"""The service layer: every operation a face (CLI, web, daemon) offers, implemented once.

Faces parse and render; they call these functions and nothing below them. Results are data
(dataclasses and dicts); errors are OverlordError subclasses carrying their exit code.
"""
from overlord.ops.audit import (audit_checkpoint, audit_key, audit_show, audit_status, audit_verify,
                                audit_witness, audit_witness_serve)
from overlord.ops.agent import AgentResult, agent, keys_list, keys_set, models, resume, transcript
from overlord.ops.countersign import Standing, review, reviews, standing
from overlord.ops.check import CheckReport, check
from overlord.ops.decide import CommitResult, commit, recover, rollback
from overlord.ops.doctor import DoctorReport, containment_layers, doctor, sessions
from overlord.ops.execute import (Captured, ExecResult, RunResult, command_cause, enforcement, exec_capture,
                                  exec_in, run)
from overlord.ops.grants import (crossed_grant, load_manifest, merge_grants, require_target,
                                 resolve_target, validate_grants)
from overlord.ops.history import compare, fork, rewind, savepoints
from overlord.ops.kept import committed_diff
from overlord.ops.policy import PolicyView, policy_cap_preview, policy_check, policy_set, policy_show
from overlord.ops.revert import revert
from overlord.ops.review import (KINDS, LogRecord, blame, change_words, describe, diff, get_session, log,
                                 resolve_sid, syscalls, traced, unified)

__all__ = [
    "audit_checkpoint", "audit_key", "audit_show", "audit_status", "audit_verify", "audit_witness",
    "audit_witness_serve",
    "AgentResult", "agent", "keys_list", "keys_set", "models", "resume", "transcript",
    "Standing", "review", "reviews", "standing",
    "CheckReport", "check",
    "CommitResult", "commit", "recover", "rollback",
    "DoctorReport", "containment_layers", "doctor", "sessions",
    "Captured", "ExecResult", "RunResult", "command_cause", "enforcement", "exec_capture", "exec_in", "run",
    "crossed_grant", "load_manifest", "merge_grants", "require_target", "resolve_target",
    "validate_grants",
    "compare", "fork", "rewind", "savepoints", "revert", "committed_diff",
    "PolicyView", "policy_cap_preview", "policy_check", "policy_set", "policy_show",
    "KINDS", "LogRecord", "blame", "change_words", "describe", "diff", "get_session", "log", "resolve_sid",
    "syscalls", "traced", "unified",
]
