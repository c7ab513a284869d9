"""Parsing of one workflow step: its keys, its step-scope spec (admission, lifecycle) and its loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.model import Loop, LoopSpec, Step, Task
from noetl_stream.dsl.router import parse_next
from noetl_stream.dsl.rules import parse_admit
from noetl_stream.dsl.speckeys import warn_unknown
from noetl_stream.dsl.tasks import parse_pipeline

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler


def parse_step(c: Compiler, raw: Any, path: Path, step_names: set[str], keychain: set[str]) -> Step | None:
    if not isinstance(raw, dict):
        c.error(path, "a step must be a mapping with a 'step' name")
        return None
    name = raw.get("step")
    if name is None:
        hint = " (a step is named with 'step:', not 'name:')" if "name" in raw else ""
        c.error(path, f"step has no 'step' name{hint}", code="missing")
        return None
    if not isinstance(name, str) or not V.is_identifier(name):
        c.error(
            (*path, "step"),
            f"step name {name!r} must be an identifier (letters, digits, '_', not starting with a digit)",
        )
        return None
    who = f"step '{name}'"
    if name in V.RESERVED_NAMES:
        c.error((*path, "step"), f"{who}: the name '{name}' is reserved for a template scope")
    ok = True
    for k in raw:
        if k in V.STEP_KEYS:
            continue
        if k in V.DEPRECATED_STEP:
            c.error(
                (*path, k),
                f"{who}: '{k}' {V.NOT_V10}; {V.DEPRECATED_STEP[k]}{c.legacy_hint(k in V.LEGACY_STEP)}",
                at_key=True,
                code="deprecated",
            )
        elif k == "kind":
            kind = raw[k] if isinstance(raw[k], str) else "..."
            c.error(
                (*path, k),
                f"{who}: unknown key 'kind': a step's tasks go under 'tool' (tool: {{kind: {kind}, ...}})",
                at_key=True,
                code="unknown-key",
            )
        else:
            c.error(
                (*path, k),
                f"{who}: unknown key '{k}'{V.key_hint(str(k), V.STEP_KEYS, V.DEPRECATED_STEP)}",
                at_key=True,
                code="unknown-key",
            )
        ok = False
    if "tool" not in raw and "next" not in raw and name == "start":
        # (any other step without either is a terminal step: check_graph wants an arc to lead to it)
        c.error(
            path,
            f"{who}: a step needs 'tool' or 'next' (or both); a step with neither ends the branch that "
            "reaches it, and 'start' with neither would run nothing",
            code="empty-step",
        )
        ok = False
    desc = raw.get("desc")
    if desc is not None and not isinstance(desc, str):
        c.error((*path, "desc"), f"{who}: 'desc' must be a string, got {V.type_name(desc)}")
        ok = False
    spec = {} if raw.get("spec") is None else raw["spec"]
    admit = None
    failure_mode = "fail_fast"
    timeout_s: float | None = None
    deadline_s: float | None = None
    if not isinstance(spec, dict):
        c.error((*path, "spec"), f"{who}: 'spec' must be a mapping")
        spec, ok = {}, False
    else:
        admit, failure_mode, timeout_s, deadline_s, good = _step_spec(c, spec, (*path, "spec"), who)
        ok = ok and good
    loop = parse_loop(c, raw["loop"], (*path, "loop"), who) if "loop" in raw else None
    if "loop" in raw and loop is None:
        ok = False
    tasks: tuple[Task, ...] = ()
    if "tool" in raw:
        parsed = parse_pipeline(c, raw["tool"], (*path, "tool"), who, name, keychain)
        if parsed is None:
            ok = False
        else:
            tasks = tuple(parsed)
    nxt = None
    if "next" in raw:
        nxt = parse_next(c, raw["next"], (*path, "next"), who, step_names)
        if nxt is None:
            ok = False
    if loop is not None and "tool" not in raw:
        c.error((*path, "loop"), f"{who}: a loop needs a 'tool' pipeline to run for each item", at_key=True)
        ok = False
    result_store, good = (
        _output(c, raw.get("output"), (*path, "output"), who) if "output" in raw else (None, True)
    )
    ok = ok and good
    step_input = raw.get("input")
    if "input" in raw and not isinstance(step_input, dict):
        c.error((*path, "input"), f"{who}: 'input' must be a mapping of names to values (templates)")
        ok = False
    if not ok:
        return None
    line, col = c.smap.value(path)
    return Step(
        name=name,
        desc=None if desc is None else str(desc),
        spec=spec,
        admit=admit,
        loop=loop,
        tasks=tasks,
        next=nxt,
        failure_mode=failure_mode,  # type: ignore[arg-type]
        timeout_s=timeout_s,
        deadline_s=deadline_s,
        input=step_input,
        result_store=result_store,
        line=line,
        col=col,
    )


def _output(c: Compiler, raw: Any, path: Path, who: str) -> tuple[str | None, bool]:
    """NoETL's ``output: {store: {kind}, output_select: [...]}``: where to keep a large result. Results
    stay inline here; with ``store`` the result gets a ``_ref`` (docs/semantics.md); a warning says so."""
    if not isinstance(raw, dict):
        c.error(path, f"{who}: 'output' must be a mapping like {{store: {{kind: kv}}, output_select: [...]}}")
        return None, False
    if not c.unknown_keys(raw, ("store", "output_select"), path, who, "output"):
        return None, False
    store = raw.get("store")
    kind = store.get("kind") if isinstance(store, dict) else store
    if "store" in raw and not isinstance(kind, str):
        c.error((*path, "store"), f"{who}: output 'store' must be a mapping with a 'kind' (kv, object, ...)")
        return None, False
    c.warn(
        path,
        f"{who}: 'output' is NoETL's storage hint, accepted and ignored: the result stays inline whole"
        + (" (output_select keeps every field)" if "output_select" in raw else "")
        + (" and gets a '_ref' naming it" if "store" in raw else ""),
        at_key=True,
        code="ignored-key",
    )
    return (kind if isinstance(kind, str) else None), True


def _step_spec(
    c: Compiler, spec: dict[str, Any], path: Path, who: str
) -> tuple[Any, str, float | None, float | None, bool]:
    ok = True
    if "next_mode" in spec:
        c.error(
            (*path, "next_mode"),
            f"{who}: 'spec.next_mode' {V.NOT_V10}; use next.spec.mode{c.legacy_hint()}",
            at_key=True,
            code="deprecated",
        )
        ok = False
    policy = spec.get("policy")
    admit = None
    failure_mode = "fail_fast"
    timeout_s: float | None = None
    deadline_s: float | None = None
    if policy is None:
        return admit, failure_mode, timeout_s, deadline_s, ok
    ppath = (*path, "policy")
    if not isinstance(policy, dict):
        c.error(ppath, f"{who}: spec.policy must be a mapping (admit, lifecycle, failure)")
        return admit, failure_mode, timeout_s, deadline_s, False
    for k in policy:
        if k in V.CONTROL_KEYS:
            c.error(
                (*ppath, k),
                f"{who}: task control '{k}' is not allowed at step scope; put it in a "
                "task's spec.policy.rules (003 §5.2)",
                at_key=True,
                code="control-at-step",
            )
            ok = False
        elif k not in V.STEP_POLICY_KEYS:
            c.error(
                (*ppath, k),
                f"{who}: unknown step policy key '{k}'{V.key_hint(str(k), V.STEP_POLICY_KEYS)}",
                at_key=True,
                code="unknown-key",
            )
            ok = False
    if "admit" in policy:
        admit = parse_admit(c, policy["admit"], (*ppath, "admit"), who)
        ok = ok and admit is not None
    lifecycle = policy.get("lifecycle")
    if lifecycle is not None:
        if not isinstance(lifecycle, dict):
            c.error((*ppath, "lifecycle"), f"{who}: lifecycle must be a mapping (timeout_s, deadline_s)")
            ok = False
        else:
            c.unknown_keys(lifecycle, V.LIFECYCLE_KEYS, (*ppath, "lifecycle"), who, "lifecycle")
            for key in V.LIFECYCLE_KEYS:
                v = lifecycle.get(key)
                if v is not None and not V.is_seconds(v, positive=True):
                    c.error(
                        (*ppath, "lifecycle", key),
                        f"{who}: lifecycle.{key} must be a positive number of seconds, got {v!r}",
                    )
                    ok = False
            t = lifecycle.get("timeout_s")
            if V.is_seconds(t, positive=True):
                timeout_s = float(t)
            d = lifecycle.get("deadline_s")
            if V.is_seconds(d, positive=True):
                deadline_s = float(d)
    failure = policy.get("failure")
    if failure is not None:
        if not isinstance(failure, dict):
            c.error((*ppath, "failure"), f"{who}: failure must be a mapping like {{mode: fail_fast}}")
            ok = False
        else:
            c.unknown_keys(failure, V.FAILURE_KEYS, (*ppath, "failure"), who, "failure")
            mode = failure.get("mode", "fail_fast")
            if mode not in V.FAILURE_MODES:
                c.error(
                    (*ppath, "failure", "mode"),
                    f"{who}: failure.mode must be one of "
                    f"{V.one_of(V.FAILURE_MODES)}, got '{mode}'{V.suggest(str(mode), V.FAILURE_MODES)}",
                )
                ok = False
            else:
                failure_mode = mode
    return admit, failure_mode, timeout_s, deadline_s, ok


def parse_loop(c: Compiler, raw: Any, path: Path, who: str) -> Loop | None:
    if not isinstance(raw, dict):
        c.error(path, f"{who}: 'loop' must be a mapping with 'in' and 'iterator'")
        return None
    ok = True
    for k in raw:
        if k in V.LOOP_KEYS:
            continue
        if k in ("mode", "max_in_flight", "exec"):
            where = "spec.policy.exec" if k == "exec" else f"spec.{k}"
            c.error((*path, k), f"{who}: loop '{k}' belongs under loop.{where}", at_key=True)
        else:
            c.error(
                (*path, k),
                f"{who}: unknown loop key '{k}'{V.key_hint(str(k), V.LOOP_KEYS)}",
                at_key=True,
                code="unknown-key",
            )
        ok = False
    cursor = _is_cursor(raw)
    if cursor:
        ok = _cursor(c, raw, path, who) and ok
    elif "cursor" in raw:
        c.error(
            (*path, "cursor"),
            f"{who}: 'cursor' is read by a cursor loop only: add 'spec: {{mode: cursor}}' (or loop over 'in')",
            at_key=True,
        )
        ok = False
    elif "in" not in raw:
        c.error(
            path,
            f"{who}: loop needs 'in' (a list, or a template that renders to one)",
            at_key=True,
            code="missing",
        )
        ok = False
    elif not isinstance(raw["in"], (list, str)):
        c.error(
            (*path, "in"),
            f"{who}: loop 'in' must be a list or a template, got {V.type_name(raw['in'])}",
        )
        ok = False
    elif isinstance(raw["in"], str) and not c.is_template(raw["in"]):
        c.error(
            (*path, "in"),
            f"{who}: loop 'in' is a plain string; write a template like "
            "'{{ workload.items }}' or a YAML list",
        )
        ok = False
    iterator = raw.get("iterator")
    if iterator is None:
        c.error(
            path,
            f"{who}: loop needs 'iterator' (the name of the item in iter.<iterator>)",
            at_key=True,
            code="missing",
        )
        ok = False
    elif not V.is_identifier(iterator):
        c.error((*path, "iterator"), f"{who}: loop iterator {iterator!r} must be an identifier")
        ok = False
    elif iterator in V.ITER_RESERVED:
        c.error(
            (*path, "iterator"),
            f"{who}: loop iterator '{iterator}' clashes with iter.{iterator}; choose another name",
        )
        ok = False
    spec = {} if raw.get("spec") is None else raw["spec"]
    lspec = LoopSpec()
    if not isinstance(spec, dict):
        c.error((*path, "spec"), f"{who}: loop 'spec' must be a mapping")
        ok = False
        spec = {}
    else:
        parsed = _loop_spec(c, spec, (*path, "spec"), who)
        if parsed is None:
            ok = False
        else:
            lspec = parsed
    if not ok:
        return None
    knobs = {k: v for k, v in spec.items() if k not in V.LOOP_SPEC_TYPED}
    return Loop(
        in_=raw.get("in"), iterator=str(iterator), spec=lspec, raw_spec=knobs, cursor=raw.get("cursor")
    )


def _is_cursor(raw: dict[str, Any]) -> bool:
    spec = raw.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    return (isinstance(spec, dict) and spec.get("mode") == "cursor") or (
        isinstance(policy, dict) and policy.get("mode") == "cursor"
    )


def _cursor(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> bool:
    """A cursor loop (NoETL's ``spec.mode: cursor``): ``cursor: {kind: postgres, auth, claim}``, no ``in``."""
    ok = True
    if "in" in raw:
        c.error(
            (*path, "in"),
            f"{who}: a cursor loop takes its items from its claim, not from 'in': remove 'in' "
            "(or the cursor mode)",
            at_key=True,
            code="conflict",
        )
        ok = False
    cursor = raw.get("cursor")
    if not isinstance(cursor, dict):
        c.error(
            (*path, "cursor") if "cursor" in raw else path,
            f"{who}: a cursor loop needs 'cursor: {{kind: postgres, auth, claim}}' (the claim query "
            "returns the rows of one frame)",
            at_key=True,
            code="missing" if "cursor" not in raw else "invalid",
        )
        return False
    ok = c.unknown_keys(cursor, V.CURSOR_KEYS, (*path, "cursor"), who, "cursor") and ok
    if cursor.get("kind") != "postgres":
        c.error(
            (*path, "cursor", "kind") if "kind" in cursor else (*path, "cursor"),
            f"{who}: a cursor loop claims its rows with 'kind: postgres', got {cursor.get('kind')!r}",
            at_key="kind" not in cursor,
        )
        ok = False
    claim = cursor.get("claim")
    if not isinstance(claim, str) or not claim.strip():
        c.error(
            (*path, "cursor", "claim") if "claim" in cursor else (*path, "cursor"),
            f"{who}: the cursor needs 'claim', the SQL that claims a frame of rows and returns them "
            "(UPDATE ... RETURNING ...)",
            at_key="claim" not in cursor,
            code="missing",
        )
        ok = False
    auth = cursor.get("auth")
    if auth is not None and not isinstance(auth, str):
        c.error((*path, "cursor", "auth"), f"{who}: cursor 'auth' must name a credential")
        ok = False
    return ok


def _loop_spec(c: Compiler, spec: dict[str, Any], path: Path, who: str) -> LoopSpec | None:
    """``mode`` and ``max_in_flight`` sit in loop.spec (001 §8.1); 003 §5.3 also allows them in
    loop.spec.policy, next to ``exec``. Either place works; both places with different values is an error."""
    ok = True
    policy = {} if spec.get("policy") is None else spec["policy"]
    if not isinstance(policy, dict):
        c.error((*path, "policy"), f"{who}: loop.spec.policy must be a mapping")
        policy, ok = {}, False
    for k in policy:
        if k in V.CONTROL_KEYS:
            c.error(
                (*path, "policy", k),
                f"{who}: task control '{k}' is not allowed at loop scope; put it in a task's spec.policy.rules",
                at_key=True,
                code="control-at-step",
            )
            ok = False
        elif k not in V.LOOP_POLICY_KEYS:
            warn_unknown(c, k, (*path, "policy", k), who, "loop.spec.policy", V.LOOP_POLICY_KEYS)
    values: dict[str, tuple[Path, Any]] = {}
    for key in ("mode", "max_in_flight"):
        if key in spec and key in policy and spec[key] != policy[key]:
            c.error(
                (*path, "policy", key),
                f"{who}: loop {key} is given twice with different values (loop.spec.{key} and "
                f"loop.spec.policy.{key}); keep one",
                at_key=True,
            )
            ok = False
        if key in spec:
            values[key] = ((*path, key), spec[key])
        elif key in policy:
            values[key] = ((*path, "policy", key), policy[key])
    mode: Any = "sequential"
    if "mode" in values:
        mpath, mode = values["mode"]
        if mode not in V.LOOP_MODES:
            c.error(
                mpath,
                f"{who}: loop mode must be one of {V.one_of(V.LOOP_MODES)}, "
                f"got {mode!r}{V.suggest(str(mode), V.LOOP_MODES)}",
            )
            ok, mode = False, "sequential"
    mif: Any = None
    if "max_in_flight" in values:
        mpath, mif = values["max_in_flight"]
        if not ((isinstance(mif, int) and not isinstance(mif, bool) and mif > 0) or c.is_template(mif)):
            c.error(mpath, f"{who}: loop max_in_flight must be a positive integer or a template, got {mif!r}")
            ok, mif = False, None
    exec_ = policy.get("exec", "local")
    if exec_ not in V.LOOP_EXECS:
        c.error(
            (*path, "policy", "exec"),
            f"{who}: loop.spec.policy.exec must be one of "
            f"{V.one_of(V.LOOP_EXECS)}, got {exec_!r}{V.suggest(str(exec_), V.LOOP_EXECS)}",
        )
        ok, exec_ = False, "local"
    frame_rows: int | None = None
    frame = spec.get("frame")
    if mode == "cursor":
        if exec_ != "local":
            c.error(
                (*path, "policy", "exec"),
                f"{who}: a cursor loop runs on one worker (exec: local): its claims are queries, and the "
                "controller runs none",
            )
            ok = False
        frame_rows, good = _frame(c, frame, (*path, "frame"), who)
        ok = ok and good
    elif frame is not None:
        c.error(
            (*path, "frame"), f"{who}: loop 'frame' is read by a cursor loop only (mode: cursor)", at_key=True
        )
        ok = False
    if not ok:
        return None
    return LoopSpec(mode=mode, max_in_flight=mif, exec=exec_, frame_max_rows=frame_rows)


def _frame(c: Compiler, frame: Any, path: Path, who: str) -> tuple[int | None, bool]:
    """``spec.frame: {max_rows}`` of a cursor loop (rows per claim)."""
    if frame is None:
        return None, True
    if not isinstance(frame, dict):
        c.error(path, f"{who}: loop 'frame' must be a mapping like {{max_rows: 100}}")
        return None, False
    if not c.unknown_keys(frame, V.FRAME_KEYS, path, who, "frame"):
        return None, False
    rows = frame.get("max_rows")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        c.error((*path, "max_rows"), f"{who}: frame max_rows must be a whole number >= 1, got {rows!r}")
        return None, False
    return rows, True
