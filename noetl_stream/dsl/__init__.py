"""The playbook DSL: parse, normalize, validate, render templates, evaluate policies. Pure."""

from noetl_stream.dsl.compiler import CompileResult, compile_playbook, load_playbook
from noetl_stream.dsl.diagnostics import Diagnostic, PlaybookError
from noetl_stream.dsl.inflight import MaxInFlightError, loop_max_in_flight
from noetl_stream.dsl.kinds import known_kinds, register_kind
from noetl_stream.dsl.layering import deep_merge, effective_task_spec
from noetl_stream.dsl.model import (
    Admit,
    Arc,
    Loop,
    LoopSpec,
    Next,
    Playbook,
    Rule,
    Step,
    Task,
    TaskPolicy,
    Then,
)
from noetl_stream.dsl.policy import admit, backoff_delay, decide, route
from noetl_stream.dsl.templates import RenderError, evaluate_when, render_value

__all__ = [
    "Admit",
    "Arc",
    "CompileResult",
    "Diagnostic",
    "Loop",
    "LoopSpec",
    "MaxInFlightError",
    "Next",
    "Playbook",
    "PlaybookError",
    "RenderError",
    "Rule",
    "Step",
    "Task",
    "TaskPolicy",
    "Then",
    "admit",
    "backoff_delay",
    "compile_playbook",
    "decide",
    "deep_merge",
    "effective_task_spec",
    "evaluate_when",
    "known_kinds",
    "load_playbook",
    "loop_max_in_flight",
    "register_kind",
    "render_value",
    "route",
]
