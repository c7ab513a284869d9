"""Task keys as NoETL's playbooks write them, made canonical before a task's keys are checked.

* ``input:`` is ``args:`` on every kind (a workbook entry's too); given both, they are merged and
  ``input``'s keys win (workflow tasks are normalized earlier, in ``dialect.py``).
* ``pool`` and ``retry`` are accepted on any task and ignored, as NoETL does (a warning, code
  ``ignored-key``). A step's ``retry`` block stays rejected (legacy, 001 §16).
* http ``timeout``/``timeout_seconds`` (seconds) is ``spec.timeout``; ``verify_ssl`` is the task's own key.
* ``script: {uri, source: {type: inline, code}}`` is ``code:`` (python) or ``command:`` (postgres);
  ``type: file`` reads ``uri`` (a path relative to the playbook, shipped with it) and becomes
  ``script: {path}``; a source fetched over a network (``gcs``, ``http``, ``s3``, ...) is an error.
* Tool fields nested under ``spec`` (``spec: {url, code, input}``) fail in NoETL's engines too: an
  error that says to move them up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.diagnostics import Path
from noetl_stream.dsl.kinds import KindInfo

if TYPE_CHECKING:
    from noetl_stream.dsl.compiler import Compiler

IGNORED_ON_EVERY_KIND = {
    "pool": "a worker keeps its own connection pools",
    "retry": "retrying is task policy: spec.policy.rules with 'then: {do: retry, attempts: N}'",
}
"""Task keys NoETL accepts and ignores on any kind, with what to do instead."""
SCRIPT_KINDS = {"python": "code", "postgres": "command"}
"""Kinds that take NoETL's ``script:``, and the key its inline code is."""
HTTP_TIMEOUTS = ("timeout", "timeout_seconds")


def task_forms(
    c: Compiler, raw: dict[str, Any], path: Path, who: str, kind: str, info: KindInfo | None
) -> tuple[dict[str, Any], bool]:
    """``raw`` with NoETL's task forms made canonical (a new mapping when one was), and false when one of
    them is an error (reported)."""
    ok = True
    if "input" in raw:
        raw = _input_as_args(c, raw, path, who)
    for key in IGNORED_ON_EVERY_KIND:
        if key in raw and (info is None or key not in info.ignored):
            c.warn(
                (*path, key),
                f"{who}: '{key}' is accepted for NoETL's playbooks and ignored ({IGNORED_ON_EVERY_KIND[key]})",
                at_key=True,
                code="ignored-key",
            )
            raw = {k: v for k, v in raw.items() if k != key}
    if kind == "http" and any(k in raw for k in HTTP_TIMEOUTS):
        raw, good = _http_timeout(c, raw, path, who)
        ok = ok and good
    if kind in SCRIPT_KINDS and "script" in raw:
        raw, good = _script(c, raw, path, who, kind)
        ok = ok and good
    spec = raw.get("spec")
    if isinstance(spec, dict) and info is not None and info.keys is not None:
        ok = _nested_in_spec(c, spec, (*path, "spec"), who, kind, info) and ok
    return raw, ok


def _input_as_args(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> dict[str, Any]:
    given, args = raw["input"], raw.get("args")
    if args is None:
        return {("args" if k == "input" else k): v for k, v in raw.items()}
    if not isinstance(args, dict) or not isinstance(given, dict):
        which = "input" if not isinstance(given, dict) else "args"
        c.error(
            (*path, which),
            f"{who}: 'input' and 'args' are merged (input's keys win), so both must be mappings; "
            f"'{which}' is not: keep one",
            at_key=True,
        )
        return {k: v for k, v in raw.items() if k != "input"}
    return {**{k: v for k, v in raw.items() if k != "input"}, "args": {**args, **given}}


def _http_timeout(c: Compiler, raw: dict[str, Any], path: Path, who: str) -> tuple[dict[str, Any], bool]:
    """``timeout: 10`` / ``timeout_seconds: 10`` -> ``spec.timeout: 10`` (seconds for connect and read)."""
    given = [k for k in HTTP_TIMEOUTS if k in raw]
    given_spec = raw.get("spec")
    spec: dict[str, Any] = given_spec if isinstance(given_spec, dict) else {}
    key = given[0]
    value = raw[key]
    if len(given) > 1 or "timeout" in spec:
        other = given[1] if len(given) > 1 else "spec.timeout"
        c.error(
            (*path, given[-1] if len(given) > 1 else key),
            f"{who}: '{key}' and '{other}' both give the request's timeout: keep one (spec.timeout)",
            at_key=True,
            code="conflict",
        )
        return {k: v for k, v in raw.items() if k not in HTTP_TIMEOUTS}, False
    if not V.is_seconds(value):
        c.error(
            (*path, key),
            f"{who}: '{key}' must be a number of seconds, got {value!r} (a template is not rendered there)",
        )
        return {k: v for k, v in raw.items() if k not in HTTP_TIMEOUTS}, False
    c.warn(
        (*path, key),
        f"{who}: '{key}:' is NoETL's spelling of 'spec.timeout:' (seconds, for connecting and for reading)",
        at_key=True,
        code="dialect",
    )
    out = {k: v for k, v in raw.items() if k not in HTTP_TIMEOUTS}
    out["spec"] = {**spec, "timeout": value}
    return out, True


NETWORK_SOURCES = ("gcs", "http", "https", "s3", "url")


def _script(c: Compiler, raw: dict[str, Any], path: Path, who: str, kind: str) -> tuple[dict[str, Any], bool]:
    """NoETL's ``script: {uri, source: {type, ...}}`` in place of the kind's code key."""
    spath: Path = (*path, "script")
    script = raw["script"]
    code_key = SCRIPT_KINDS[kind]
    source = script.get("source") if isinstance(script, dict) else None
    kind_of = source.get("type") if isinstance(source, dict) else None
    if not isinstance(source, dict) or not isinstance(kind_of, str):
        c.error(
            spath,
            f"{who}: 'script' must be {{uri, source: {{type: inline|file, ...}}}} (the code inline in "
            f"source.code, or a file named by uri)",
        )
        return raw, False
    rest = {k: v for k, v in raw.items() if k != "script"}
    if kind_of == "inline":
        code = source.get("code")
        if not isinstance(code, str):
            c.error(
                (*spath, "source"), f"{who}: an inline script needs its text in 'source.code'", at_key=True
            )
            return raw, False
        if code_key in raw:
            return raw, True  # both: the kind's exclusive keys report it
        c.warn(
            spath,
            f"{who}: an inline 'script:' is NoETL's spelling of '{code_key}:' (write the text as "
            f"'{code_key}: |')",
            at_key=True,
            code="dialect",
        )
        return {**rest, code_key: code}, True
    if kind_of == "file":
        uri = script.get("uri", source.get("path"))
        if not isinstance(uri, str) or not uri or c.is_template(uri) or "://" in uri:
            c.error(
                spath,
                f"{who}: a file script needs 'uri', the path of the file relative to the playbook "
                f"(shipped with it), got {uri!r}",
                at_key=True,
            )
            return raw, False
        return {**rest, "script": {"path": uri}}, True
    if kind_of in NETWORK_SOURCES:
        c.error(
            (*spath, "source", "type"),
            f"{who}: a script fetched over a network (source type '{kind_of}') is not supported: put "
            f"the text in '{code_key}' (or in a file shipped with the playbook: source type 'file')",
        )
        return raw, False
    c.error(
        (*spath, "source", "type"),
        f"{who}: script source type must be 'inline' or 'file', got {kind_of!r}",
    )
    return raw, False


def _nested_in_spec(
    c: Compiler, spec: dict[str, Any], path: Path, who: str, kind: str, info: KindInfo
) -> bool:
    """Tool fields written under ``spec`` (``spec: {url: ...}``): no engine reads them there."""
    nested = nested_spec_keys(spec, info, kind)
    for key in spec:
        if key in nested:
            c.error(
                (*path, key),
                f"{who}: '{key}' is a field of the task, not of its spec: move it up, beside 'kind' "
                "(spec holds the policy and knobs such as timeout)",
                at_key=True,
                code="misplaced",
            )
    return not nested


def nested_spec_keys(spec: dict[str, Any], info: KindInfo | None, kind: str) -> set[str]:
    """The keys of ``spec`` `_nested_in_spec` reports (the spec-key check does not warn about them too)."""
    if info is None or info.keys is None:
        return set()
    keys = set(info.keys) | {"args", "input", "code"}
    knobs = set(V.TOOL_SPEC_KEYS.get(kind, ())) | set(V.TASK_SPEC_KEYS) | {"pool"}
    return {k for k in spec if k in keys and k not in knobs}
