"""Playbook compiler: YAML text -> normalized, validated ``Playbook``.

Pure: no I/O. Every problem is collected (not just the first) and reported as
``file:line:col: message (at yaml.path)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.checks import check_graph, check_templates
from noetl_stream.dsl.diagnostics import Diagnostic, Path, PlaybookError
from noetl_stream.dsl.kinds import COMMON_TASK_KEYS, kind_info, known_kinds
from noetl_stream.dsl.model import (
    Arc,
    Executor,
    KeychainEntry,
    Loop,
    LoopSpec,
    Metadata,
    Next,
    Playbook,
    Step,
    Task,
)
from noetl_stream.dsl.rules import parse_admit, parse_task_policy
from noetl_stream.dsl.source import SourceMap, load_yaml
from noetl_stream.dsl.templates import has_template


class CompileResult(msgspec.Struct, frozen=True):
    playbook: Playbook | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "error")

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity == "warning")


class Compiler:
    """One compilation. Holds the source map and the diagnostics found so far."""

    def __init__(self, smap: SourceMap, extensions: Iterable[str] = ()) -> None:
        self.smap = smap
        self.extensions = set(extensions)
        self.diagnostics: list[Diagnostic] = []

    # -- reporting --------------------------------------------------------------
    def error(self, path: Path, message: str, *, at_key: bool = False, code: str = "invalid") -> None:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=at_key, code=code))

    def warn(self, path: Path, message: str, *, at_key: bool = False, code: str = "warning") -> None:
        self.diagnostics.append(
            self.smap.diagnostic(path, message, severity="warning", at_key=at_key, code=code)
        )

    @staticmethod
    def is_template(value: Any) -> bool:
        return isinstance(value, str) and has_template(value)

    def unknown_keys(
        self, raw: dict[str, Any], allowed: Iterable[str], path: Path, who: str, what: str
    ) -> None:
        allowed = tuple(allowed)
        for k in raw:
            if k not in allowed:
                hint = V.suggest(str(k), allowed)
                self.error(
                    (*path, k), f"{who}: unknown {what} key '{k}'{hint}", at_key=True, code="unknown-key"
                )

    # -- root -------------------------------------------------------------------
    def compile(self, data: Any) -> Playbook | None:
        if isinstance(data, list):
            self.error(
                (),
                "a playbook is a mapping with apiVersion, kind, metadata and workflow; found a list "
                "(a bare workflow? put it under 'workflow:')",
            )
            if all(isinstance(item, dict) and "step" in item for item in data):
                self._workflow(data, [], base=(), fragment=True)
            return None
        if not isinstance(data, dict):
            self.error((), "a playbook is a mapping with apiVersion, kind, metadata and workflow")
            return None
        for k in data:
            if k in V.ROOT_KEYS:
                continue
            if k in V.DEPRECATED_ROOT:
                self.error(
                    (k,),
                    f"root '{k}' {V.NOT_V10}; {V.DEPRECATED_ROOT[k]}{V.LEGACY_HINT}",
                    at_key=True,
                    code="deprecated",
                )
            else:
                self.error(
                    (k,),
                    f"unknown root key '{k}'{V.suggest(str(k), V.ROOT_KEYS)} (allowed: "
                    f"{', '.join(V.ROOT_KEYS)})",
                    at_key=True,
                    code="unknown-key",
                )
        api = data.get("apiVersion")
        if api is None:
            self.error((), f"missing 'apiVersion' (must be '{V.API_VERSION}')", code="missing")
        elif api != V.API_VERSION:
            self.error(("apiVersion",), f"apiVersion must be '{V.API_VERSION}', got '{api}'")
        kind = data.get("kind")
        if kind is None:
            self.error((), f"missing 'kind' (must be '{V.KIND}')", code="missing")
        elif kind != V.KIND:
            self.error(("kind",), f"kind must be '{V.KIND}', got '{kind}'")
        metadata = self._metadata(data.get("metadata"))
        keychain = self._keychain(data.get("keychain"))
        executor = self._executor(data.get("executor"))
        exts = executor.spec.get("extensions") if executor else None
        if isinstance(exts, list):
            self.extensions.update(str(e) for e in exts)
        workload = data.get("workload", {})
        if workload is None:
            workload = {}
        if not isinstance(workload, dict):
            self.error(("workload",), "workload must be a mapping of input names to default values")
            workload = {}
        workbook = self._workbook(data.get("workbook"))
        steps = self._workflow(data.get("workflow"), keychain)
        if steps is None or metadata is None:
            return None
        playbook = Playbook(
            metadata=metadata,
            workflow=tuple(steps),
            keychain=tuple(keychain),
            executor=executor or Executor(),
            workload=workload,
            workbook=workbook,
            file=self.smap.file,
        )
        check_graph(self, playbook, data)
        check_templates(self, playbook, data)
        return playbook

    def _metadata(self, raw: Any) -> Metadata | None:
        if raw is None:
            self.error((), "missing 'metadata' (with 'name' and 'path')", code="missing")
            return None
        if not isinstance(raw, dict):
            self.error(("metadata",), "metadata must be a mapping with 'name' and 'path'")
            return None
        self.unknown_keys(raw, V.METADATA_KEYS, ("metadata",), "metadata", "metadata")
        ok = True
        for key in ("name", "path"):
            value = raw.get(key)
            if value is None:
                self.error(("metadata",), f"metadata: missing '{key}'", code="missing")
                ok = False
            elif not isinstance(value, str) or not value.strip():
                self.error(("metadata", key), f"metadata: '{key}' must be a non-empty string")
                ok = False
        labels = raw.get("labels", {})
        if not isinstance(labels, dict):
            self.error(("metadata", "labels"), "metadata: 'labels' must be a mapping")
            labels = {}
        if not ok:
            return None
        version = raw.get("version")
        desc = raw.get("description")
        return Metadata(
            name=raw["name"],
            path=raw["path"],
            version=None if version is None else str(version),
            description=None if desc is None else str(desc),
            labels={str(k): str(v) for k, v in labels.items()},
        )

    def _keychain(self, raw: Any) -> list[KeychainEntry]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            self.error(("keychain",), "keychain must be a list of {name, kind} declarations")
            return []
        out: list[KeychainEntry] = []
        seen: set[str] = set()
        for i, item in enumerate(raw):
            path: Path = ("keychain", i)
            if not isinstance(item, dict):
                self.error(path, "keychain entry must be a mapping with 'name' and 'kind'")
                continue
            name, kind = item.get("name"), item.get("kind")
            if not V.is_identifier(name):
                self.error(
                    path if name is None else (*path, "name"),
                    "keychain entry needs a 'name' that is an identifier"
                    if name is None
                    else f"keychain name {name!r} must be an identifier (letters, digits, '_')",
                )
                continue
            if not isinstance(kind, str) or not kind:
                self.error(
                    path, f"keychain entry '{name}' needs a 'kind' (e.g. postgres_credential, secret_manager)"
                )
                continue
            if name in seen:
                self.error((*path, "name"), f"keychain entry '{name}' is declared twice")
                continue
            seen.add(str(name))
            out.append(
                KeychainEntry(
                    name=str(name), kind=kind, config={k: v for k, v in item.items() if k not in ("name", "kind")}
                )
            )
        return out

    def _executor(self, raw: Any) -> Executor | None:
        if raw is None:
            return Executor()
        if not isinstance(raw, dict):
            self.error(("executor",), "executor must be a mapping (with optional 'kind' and 'spec')")
            return Executor()
        self.unknown_keys(raw, V.EXECUTOR_KEYS, ("executor",), "executor", "executor")
        spec = raw.get("spec", {}) or {}
        if not isinstance(spec, dict):
            self.error(("executor", "spec"), "executor: 'spec' must be a mapping")
            spec = {}
        policy = spec.get("policy")
        if policy is not None:
            if not isinstance(policy, dict):
                self.error(("executor", "spec", "policy"), "executor: spec.policy must be a mapping")
            else:
                for k in policy:
                    if k in V.CONTROL_KEYS:
                        self.error(
                            ("executor", "spec", "policy", k),
                            f"executor: control '{k}' is not allowed at "
                            "executor scope; task control belongs in a task's spec.policy.rules",
                            at_key=True,
                        )
                    elif k not in V.EXECUTOR_POLICY_KEYS:
                        self.warn(
                            ("executor", "spec", "policy", k),
                            f"executor: unknown policy key '{k}' "
                            f"(known: {', '.join(V.EXECUTOR_POLICY_KEYS)})",
                            at_key=True,
                        )
        exts = spec.get("extensions")
        if exts is not None:
            if not isinstance(exts, list) or not all(isinstance(e, str) for e in exts):
                self.error(
                    ("executor", "spec", "extensions"), "executor: spec.extensions must be a list of names"
                )
            else:
                for i, e in enumerate(exts):
                    if e not in V.EXTENSIONS:
                        self.error(
                            ("executor", "spec", "extensions", i),
                            f"executor: unknown extension '{e}' (known: {', '.join(V.EXTENSIONS)})",
                        )
                    elif e == "legacy":
                        self.error(
                            ("executor", "spec", "extensions", i),
                            "executor: the 'legacy' extension (translation of older DSL forms) is not "
                            "available in this version yet; rewrite the constructs as the other messages say",
                        )
        pool = spec.get("pool")
        if pool is not None and not V.is_identifier(str(pool).replace("-", "_")):
            self.error(("executor", "spec", "pool"), f"executor: pool name {pool!r} must be a simple name")
        kind = raw.get("kind")
        return Executor(kind=None if kind is None else str(kind), spec=spec)

    def _workbook(self, raw: Any) -> dict[str, Task]:
        if raw is None:
            return {}
        entries: list[tuple[Path, str, Any]] = []
        if isinstance(raw, dict):
            base: Path = ("workbook",)
            if set(raw) == {"tasks"} and isinstance(raw["tasks"], dict):
                raw, base = raw["tasks"], ("workbook", "tasks")
            for name, body in raw.items():
                entries.append(((*base, name), str(name), body))
        elif isinstance(raw, list):
            for i, item in enumerate(raw):
                path: Path = ("workbook", i)
                if not isinstance(item, dict) or "name" not in item:
                    self.error(path, "workbook entry must be a mapping with 'name' and 'tool' (or 'kind')")
                    continue
                body = item.get("tool", {k: v for k, v in item.items() if k != "name"})
                entries.append(((*path, "tool") if "tool" in item else path, str(item["name"]), body))
        else:
            self.error(
                ("workbook",),
                "workbook must be a mapping of template names to tasks, or a list of {name, tool}",
            )
            return {}
        out: dict[str, Task] = {}
        for path, name, body in entries:
            if not V.is_identifier(name):
                self.error(path, f"workbook template name {name!r} must be an identifier")
                continue
            if name in out:
                self.error(path, f"workbook template '{name}' is defined twice")
                continue
            if isinstance(body, dict):
                body = {k: v for k, v in body.items() if k != "name"}
            task = self._task(body, path, f"workbook '{name}'", name, set(), keychain_names=None)
            if task is not None:
                out[name] = task
        return out

    # -- workflow ---------------------------------------------------------------
    def _workflow(
        self, raw: Any, keychain: list[KeychainEntry], base: Path = ("workflow",), fragment: bool = False
    ) -> list[Step] | None:
        if raw is None:
            self.error((), "missing 'workflow' (a list of steps with a 'start' step)", code="missing")
            return None
        if not isinstance(raw, list) or not raw:
            self.error(base, "workflow must be a non-empty list of steps")
            return None
        names: dict[str, int] = {}
        for i, item in enumerate(raw):
            if isinstance(item, dict) and isinstance(item.get("step"), str):
                name = item["step"]
                if name in names:
                    self.error(
                        (*base, i, "step"),
                        f"step '{name}' is defined twice (first at workflow[{names[name]}])",
                        code="duplicate",
                    )
                else:
                    names[name] = i
        kc = {k.name for k in keychain}
        steps: list[Step] = []
        for i, item in enumerate(raw):
            step = self._step(item, (*base, i), set(names), kc)
            if step is not None:
                steps.append(step)
        if "start" not in names and not fragment:
            self.error(
                base,
                "workflow has no 'start' step (execution begins at the step named 'start')",
                code="no-start",
            )
        return steps

    def _step(self, raw: Any, path: Path, step_names: set[str], keychain: set[str]) -> Step | None:
        if not isinstance(raw, dict):
            self.error(path, "a step must be a mapping with a 'step' name")
            return None
        name = raw.get("step")
        if name is None:
            self.error(path, "step has no 'step' name", code="missing")
            return None
        if not isinstance(name, str) or not V.is_identifier(name):
            self.error(
                (*path, "step"),
                f"step name {name!r} must be an identifier (letters, digits, '_', not starting with a digit)",
            )
            return None
        who = f"step '{name}'"
        if name in V.RESERVED_NAMES:
            self.error((*path, "step"), f"{who}: the name '{name}' is reserved for a template scope")
        ok = True
        for k in raw:
            if k in V.STEP_KEYS:
                continue
            if k in V.DEPRECATED_STEP:
                self.error(
                    (*path, k),
                    f"{who}: '{k}' {V.NOT_V10}; {V.DEPRECATED_STEP[k]}{V.LEGACY_HINT}",
                    at_key=True,
                    code="deprecated",
                )
            else:
                self.error(
                    (*path, k),
                    f"{who}: unknown key '{k}'{V.suggest(str(k), V.STEP_KEYS)}",
                    at_key=True,
                    code="unknown-key",
                )
            ok = False
        if "tool" not in raw and "next" not in raw:
            self.error(path, f"{who}: a step needs 'tool' or 'next' (or both)", code="empty-step")
            ok = False
        desc = raw.get("desc")
        spec = raw.get("spec", {}) or {}
        admit = None
        failure_mode = "fail_fast"
        timeout_s: float | None = None
        if not isinstance(spec, dict):
            self.error((*path, "spec"), f"{who}: 'spec' must be a mapping")
            spec, ok = {}, False
        else:
            admit, failure_mode, timeout_s, good = self._step_spec(spec, (*path, "spec"), who)
            ok = ok and good
        loop = self._loop(raw["loop"], (*path, "loop"), who) if "loop" in raw else None
        if "loop" in raw and loop is None:
            ok = False
        tasks: tuple[Task, ...] = ()
        if "tool" in raw:
            parsed = self._pipeline(raw["tool"], (*path, "tool"), who, name, keychain)
            if parsed is None:
                ok = False
            else:
                tasks = tuple(parsed)
        nxt = None
        if "next" in raw:
            nxt = self._next(raw["next"], (*path, "next"), who, step_names)
            if nxt is None:
                ok = False
        if loop is not None and "tool" not in raw:
            self.error((*path, "loop"), f"{who}: a loop needs a 'tool' pipeline to run for each item")
            ok = False
        if not ok:
            return None
        line, col = self.smap.value(path)
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
            line=line,
            col=col,
        )

    def _step_spec(self, spec: dict[str, Any], path: Path, who: str) -> tuple[Any, str, float | None, bool]:
        ok = True
        if "next_mode" in spec:
            self.error(
                (*path, "next_mode"),
                f"{who}: 'spec.next_mode' {V.NOT_V10}; use next.spec.mode{V.LEGACY_HINT}",
                at_key=True,
                code="deprecated",
            )
            ok = False
        policy = spec.get("policy")
        admit = None
        failure_mode = "fail_fast"
        timeout_s: float | None = None
        if policy is None:
            return admit, failure_mode, timeout_s, ok
        ppath = (*path, "policy")
        if not isinstance(policy, dict):
            self.error(ppath, f"{who}: spec.policy must be a mapping (admit, lifecycle, failure)")
            return admit, failure_mode, timeout_s, False
        for k in policy:
            if k in V.CONTROL_KEYS:
                self.error(
                    (*ppath, k),
                    f"{who}: task control '{k}' is not allowed at step scope; put it in a "
                    "task's spec.policy.rules (003 §5.2)",
                    at_key=True,
                    code="control-at-step",
                )
                ok = False
            elif k not in V.STEP_POLICY_KEYS:
                self.error(
                    (*ppath, k),
                    f"{who}: unknown step policy key '{k}'{V.suggest(str(k), V.STEP_POLICY_KEYS)} "
                    f"(allowed: {', '.join(V.STEP_POLICY_KEYS)})",
                    at_key=True,
                    code="unknown-key",
                )
                ok = False
        if "admit" in policy:
            admit = parse_admit(self, policy["admit"], (*ppath, "admit"), who)
            ok = ok and admit is not None
        lifecycle = policy.get("lifecycle")
        if lifecycle is not None:
            if not isinstance(lifecycle, dict):
                self.error(
                    (*ppath, "lifecycle"), f"{who}: lifecycle must be a mapping (timeout_s, deadline_s)"
                )
                ok = False
            else:
                self.unknown_keys(lifecycle, V.LIFECYCLE_KEYS, (*ppath, "lifecycle"), who, "lifecycle")
                for key in V.LIFECYCLE_KEYS:
                    v = lifecycle.get(key)
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
                        self.error(
                            (*ppath, "lifecycle", key),
                            f"{who}: lifecycle.{key} must be a positive number of seconds, got {v!r}",
                        )
                        ok = False
                t = lifecycle.get("timeout_s")
                if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
                    timeout_s = float(t)
        failure = policy.get("failure")
        if failure is not None:
            if not isinstance(failure, dict):
                self.error((*ppath, "failure"), f"{who}: failure must be a mapping like {{mode: fail_fast}}")
                ok = False
            else:
                self.unknown_keys(failure, V.FAILURE_KEYS, (*ppath, "failure"), who, "failure")
                mode = failure.get("mode", "fail_fast")
                if mode not in V.FAILURE_MODES:
                    self.error(
                        (*ppath, "failure", "mode"),
                        f"{who}: failure.mode must be one of "
                        f"{V.one_of(V.FAILURE_MODES)}, got '{mode}'{V.suggest(str(mode), V.FAILURE_MODES)}",
                    )
                    ok = False
                else:
                    failure_mode = mode
        return admit, failure_mode, timeout_s, ok

    def _loop(self, raw: Any, path: Path, who: str) -> Loop | None:
        if not isinstance(raw, dict):
            self.error(path, f"{who}: 'loop' must be a mapping with 'in' and 'iterator'")
            return None
        ok = True
        for k in raw:
            if k in V.LOOP_KEYS:
                continue
            if k in ("mode", "max_in_flight", "exec"):
                where = "spec.policy.exec" if k == "exec" else f"spec.{k}"
                self.error((*path, k), f"{who}: loop '{k}' belongs under loop.{where}", at_key=True)
            else:
                self.error(
                    (*path, k),
                    f"{who}: unknown loop key '{k}'{V.suggest(str(k), V.LOOP_KEYS)}",
                    at_key=True,
                    code="unknown-key",
                )
            ok = False
        if "in" not in raw:
            self.error(
                path, f"{who}: loop needs 'in' (a list, or a template that renders to one)", code="missing"
            )
            ok = False
        elif not isinstance(raw["in"], (list, str)):
            self.error(
                (*path, "in"),
                f"{who}: loop 'in' must be a list or a template, got {type(raw['in']).__name__}",
            )
            ok = False
        elif isinstance(raw["in"], str) and not self.is_template(raw["in"]):
            self.error(
                (*path, "in"),
                f"{who}: loop 'in' is a plain string; write a template like "
                "'{{ workload.items }}' or a YAML list",
            )
            ok = False
        iterator = raw.get("iterator")
        if iterator is None:
            self.error(
                path,
                f"{who}: loop needs 'iterator' (the name of the item in iter.<iterator>)",
                code="missing",
            )
            ok = False
        elif not V.is_identifier(iterator):
            self.error((*path, "iterator"), f"{who}: loop iterator {iterator!r} must be an identifier")
            ok = False
        elif iterator in V.ITER_RESERVED:
            self.error(
                (*path, "iterator"),
                f"{who}: loop iterator '{iterator}' clashes with iter.{iterator}; choose another name",
            )
            ok = False
        spec = raw.get("spec", {}) or {}
        lspec = LoopSpec()
        if not isinstance(spec, dict):
            self.error((*path, "spec"), f"{who}: loop 'spec' must be a mapping")
            ok = False
            spec = {}
        else:
            mode = spec.get("mode", "sequential")
            if mode not in V.LOOP_MODES:
                self.error(
                    (*path, "spec", "mode"),
                    f"{who}: loop.spec.mode must be one of {V.one_of(V.LOOP_MODES)}, "
                    f"got '{mode}'{V.suggest(str(mode), V.LOOP_MODES)}",
                )
                ok = False
                mode = "sequential"
            mif = spec.get("max_in_flight")
            if mif is not None and not (
                (isinstance(mif, int) and not isinstance(mif, bool) and mif > 0) or self.is_template(mif)
            ):
                self.error(
                    (*path, "spec", "max_in_flight"),
                    f"{who}: loop.spec.max_in_flight must be a positive integer or a template, got {mif!r}",
                )
                ok = False
                mif = None
            policy = spec.get("policy", {}) or {}
            exec_ = "local"
            if not isinstance(policy, dict):
                self.error((*path, "spec", "policy"), f"{who}: loop.spec.policy must be a mapping")
                ok = False
            else:
                for k in policy:
                    if k in V.CONTROL_KEYS:
                        self.error(
                            (*path, "spec", "policy", k),
                            f"{who}: task control '{k}' is not allowed at loop "
                            "scope; put it in a task's spec.policy.rules",
                            at_key=True,
                            code="control-at-step",
                        )
                        ok = False
                    elif k not in V.LOOP_POLICY_KEYS:
                        self.warn(
                            (*path, "spec", "policy", k),
                            f"{who}: unknown loop policy key '{k}' (known: {', '.join(V.LOOP_POLICY_KEYS)})",
                            at_key=True,
                        )
                exec_ = policy.get("exec", "local")
                if exec_ not in V.LOOP_EXECS:
                    self.error(
                        (*path, "spec", "policy", "exec"),
                        f"{who}: loop.spec.policy.exec must be one of "
                        f"{V.one_of(V.LOOP_EXECS)}, got '{exec_}'{V.suggest(str(exec_), V.LOOP_EXECS)}",
                    )
                    ok = False
                    exec_ = "local"
            lspec = LoopSpec(mode=mode, max_in_flight=mif, exec=exec_)  # type: ignore[arg-type]
        if not ok:
            return None
        knobs = {k: v for k, v in spec.items() if k not in V.LOOP_SPEC_TYPED}
        return Loop(in_=raw["in"], iterator=str(iterator), spec=lspec, raw_spec=knobs)

    def _pipeline(
        self, raw: Any, path: Path, who: str, step_name: str, keychain: set[str]
    ) -> list[Task] | None:
        items: list[tuple[Path, Any, str | None]] = []
        if isinstance(raw, dict):
            if "kind" in raw:
                items.append(
                    (path, raw, raw.get("name") if isinstance(raw.get("name"), str) else f"{step_name}_task")
                )
            elif len(raw) == 1 and isinstance(next(iter(raw.values())), dict):
                label = next(iter(raw))
                self.warn(
                    (*path, label),
                    f"{who}: task '{label}' uses the label-as-key shape; write it as "
                    f"'- name: {label}' with 'kind: ...' (003 §7)",
                    at_key=True,
                    code="label-as-key",
                )
                items.append(((*path, label), raw[label], str(label)))
            else:
                self.error(path, f"{who}: 'tool' must be a task (with 'kind') or a list of tasks")
                return None
        elif isinstance(raw, list):
            if not raw:
                self.error(path, f"{who}: 'tool' is an empty list; give at least one task or remove 'tool'")
                return None
            for i, item in enumerate(raw):
                ipath = (*path, i)
                if (
                    isinstance(item, dict)
                    and "kind" not in item
                    and len(item) == 1
                    and isinstance(next(iter(item.values())), dict)
                ):
                    label = next(iter(item))
                    self.warn(
                        (*ipath, label),
                        f"{who}: task '{label}' uses the label-as-key shape; write it as "
                        f"'- name: {label}' with 'kind: ...' (003 §7)",
                        at_key=True,
                        code="label-as-key",
                    )
                    items.append(((*ipath, label), item[label], str(label)))
                elif isinstance(item, dict):
                    name = item.get("name")
                    items.append((ipath, item, name if name is not None else f"task_{i}"))
                else:
                    self.error(ipath, f"{who}: task {i} must be a mapping with 'kind'")
                    items.append((ipath, None, None))
        else:
            self.error(path, f"{who}: 'tool' must be a task (with 'kind') or a list of tasks")
            return None
        labels: set[str] = set()
        for ipath, _, label in items:
            if isinstance(label, str):
                if label in labels:
                    self.error(
                        ipath, f"{who}: task label '{label}' is used twice in this pipeline", code="duplicate"
                    )
                labels.add(label)
        tasks: list[Task] = []
        ok = True
        for ipath, body, label in items:
            if body is None:
                ok = False
                continue
            if isinstance(body, dict) and "name" in body and (ipath == path or isinstance(ipath[-1], int)):
                body = {k: v for k, v in body.items() if k != "name"}
            task = self._task(body, ipath, who, label, labels, keychain_names=keychain)
            if task is None:
                ok = False
            else:
                tasks.append(task)
        return tasks if ok else None

    def _task(
        self, raw: Any, path: Path, who: str, label: Any, labels: set[str], *, keychain_names: set[str] | None
    ) -> Task | None:
        if not isinstance(raw, dict):
            self.error(path, f"{who}: a task must be a mapping with 'kind'")
            return None
        if not isinstance(label, str) or not V.is_identifier(label):
            self.error(
                path if label is None else (*path, "name") if "name" in raw else path,
                f"{who}: task name {label!r} must be an identifier",
            )
            return None
        twho = f"{who} task '{label}'"
        if label in V.RESERVED_NAMES:
            self.error(path, f"{twho}: the name '{label}' is reserved for a template scope")
            return None
        kind = raw.get("kind")
        if kind is None:
            self.error(path, f"{twho}: missing 'kind' (one of {', '.join(known_kinds())})", code="missing")
            return None
        if not isinstance(kind, str):
            self.error((*path, "kind"), f"{twho}: 'kind' must be a string")
            return None
        info = kind_info(kind)
        ok = True
        if info is None and "custom_kinds" not in self.extensions:
            self.error(
                (*path, "kind"),
                f"{twho}: unknown tool kind '{kind}'{V.suggest(kind, known_kinds())} (known: "
                f"{', '.join(known_kinds())}; enable the 'custom_kinds' extension for others)",
                code="unknown-kind",
            )
            return None
        allowed = None if info is None or info.keys is None else COMMON_TASK_KEYS | info.keys
        for k in raw:
            if k in V.DEPRECATED_TASK:
                self.error(
                    (*path, k),
                    f"{twho}: '{k}' {V.NOT_V10}; {V.DEPRECATED_TASK[k]}{V.LEGACY_HINT}",
                    at_key=True,
                    code="deprecated",
                )
                ok = False
            elif allowed is not None and k not in allowed:
                hint = V.suggest(str(k), allowed)
                self.error(
                    (*path, k),
                    f"{twho}: unknown key '{k}' for kind '{kind}'{hint}",
                    at_key=True,
                    code="unknown-key",
                )
                ok = False
        if info is not None:
            for group in info.required_any:
                if not any(g in raw for g in group):
                    need = " or ".join(f"'{g}'" for g in group)
                    self.error(path, f"{twho}: kind '{kind}' needs {need}", code="missing")
                    ok = False
        spec = raw.get("spec", {}) or {}
        policy = None
        if not isinstance(spec, dict):
            self.error((*path, "spec"), f"{twho}: 'spec' must be a mapping")
            return None
        if "policy" in spec:
            policy = parse_task_policy(self, spec["policy"], (*path, "spec", "policy"), twho, labels)
            ok = ok and policy is not None
        auth = raw.get("auth")
        if (
            keychain_names is not None
            and isinstance(auth, str)
            and not self.is_template(auth)
            and auth not in keychain_names
        ):
            self.warn((*path, "auth"), f"{twho}: credential '{auth}' is not declared in the root keychain")
        if "args" in raw and not isinstance(raw["args"], (dict, str)):
            self.error((*path, "args"), f"{twho}: 'args' must be a mapping (or a template)")
            ok = False
        if not ok:
            return None
        line, col = self.smap.value(path)
        config = {k: v for k, v in raw.items() if k not in ("name", "kind", "spec")}
        return Task(name=label, kind=kind, config=config, spec=spec, policy=policy, line=line, col=col)

    def _next(self, raw: Any, path: Path, who: str, step_names: set[str]) -> Next | None:
        if isinstance(raw, (str, list)):
            shape = "a string" if isinstance(raw, str) else "a list"
            self.error(
                path,
                f"{who}: 'next' as {shape} {V.NOT_V10}; use a router object "
                f"'next: {{spec: {{mode: exclusive}}, arcs: [{{step: ...}}]}}'{V.LEGACY_HINT}",
                code="deprecated",
            )
            return None
        if not isinstance(raw, dict):
            self.error(path, f"{who}: 'next' must be a router object with 'arcs'")
            return None
        ok = True
        self.unknown_keys(raw, V.NEXT_KEYS, path, who, "next")
        if any(k not in V.NEXT_KEYS for k in raw):
            ok = False
        spec = raw.get("spec", {}) or {}
        mode = "exclusive"
        if not isinstance(spec, dict):
            self.error((*path, "spec"), f"{who}: next.spec must be a mapping")
            ok, spec = False, {}
        else:
            for k in spec:
                if k not in V.NEXT_SPEC_KEYS:
                    self.error(
                        (*path, "spec", k),
                        f"{who}: unknown next.spec key '{k}'{V.suggest(str(k), V.NEXT_SPEC_KEYS)}",
                        at_key=True,
                        code="unknown-key",
                    )
                    ok = False
            mode = spec.get("mode", "exclusive")
            if mode not in V.ROUTE_MODES:
                self.error(
                    (*path, "spec", "mode"),
                    f"{who}: next.spec.mode must be one of {V.one_of(V.ROUTE_MODES)}, "
                    f"got '{mode}'{V.suggest(str(mode), V.ROUTE_MODES)}",
                )
                ok, mode = False, "exclusive"
            policy = spec.get("policy")
            if isinstance(policy, dict):
                for k in policy:
                    if k in V.CONTROL_KEYS:
                        self.error(
                            (*path, "spec", "policy", k),
                            f"{who}: task control '{k}' is not allowed in a next router",
                            at_key=True,
                            code="control-at-step",
                        )
                        ok = False
        arcs_raw = raw.get("arcs", [])
        if arcs_raw is None:
            arcs_raw = []
        if not isinstance(arcs_raw, list):
            self.error((*path, "arcs"), f"{who}: next.arcs must be a list of {{step, when, args}}")
            return None
        arcs: list[Arc] = []
        for i, arc in enumerate(arcs_raw):
            apath = (*path, "arcs", i)
            if isinstance(arc, str):
                self.error(apath, f"{who}: arc must be a mapping like '{{step: {arc}}}'")
                ok = False
                continue
            if not isinstance(arc, dict):
                self.error(apath, f"{who}: arc must be a mapping with 'step'")
                ok = False
                continue
            for k in arc:
                if k == "expr":
                    self.error(
                        (*apath, k),
                        f"{who}: 'expr' {V.NOT_V10}; use 'when'{V.LEGACY_HINT}",
                        at_key=True,
                        code="deprecated",
                    )
                    ok = False
                elif k not in V.ARC_KEYS:
                    self.error(
                        (*apath, k),
                        f"{who}: unknown arc key '{k}'{V.suggest(str(k), V.ARC_KEYS)}",
                        at_key=True,
                        code="unknown-key",
                    )
                    ok = False
            target = arc.get("step")
            if target is None:
                self.error(apath, f"{who}: arc needs 'step' (the target step)", code="missing")
                ok = False
                continue
            if target not in step_names:
                self.error(
                    (*apath, "step"),
                    f"{who}: arc target '{target}' is not a step of this workflow"
                    f"{V.suggest(str(target), step_names)}",
                    code="unknown-target",
                )
                ok = False
            when = arc.get("when")
            if when is not None and not isinstance(when, (str, bool)):
                self.error((*apath, "when"), f"{who}: arc 'when' must be a template string or a boolean")
                ok = False
            args = arc.get("args")
            if args is not None and not isinstance(args, dict):
                self.error((*apath, "args"), f"{who}: arc 'args' must be a mapping")
                ok = False
            aspec = arc.get("spec", {}) or {}
            if not isinstance(aspec, dict):
                self.error((*apath, "spec"), f"{who}: arc 'spec' must be a mapping")
                ok = False
                aspec = {}
            arcs.append(Arc(step=str(target), when=when, args=args, spec=aspec))
        if not ok:
            return None
        return Next(arcs=tuple(arcs), mode=mode, spec=spec)  # type: ignore[arg-type]


def compile_playbook(text: str, file: str = "<playbook>", *, extensions: Iterable[str] = ()) -> CompileResult:
    """Compile playbook text. Never raises for bad input: problems come back as diagnostics."""
    try:
        data, smap = load_yaml(text, file)
    except PlaybookError as exc:
        return CompileResult(playbook=None, diagnostics=exc.diagnostics)
    return compile_data(data, smap, extensions=extensions)


def compile_data(data: Any, smap: SourceMap, *, extensions: Iterable[str] = ()) -> CompileResult:
    compiler = Compiler(smap, extensions)
    playbook = compiler.compile(data)
    diags = tuple(sorted(compiler.diagnostics, key=lambda d: (d.line, d.col, d.severity)))
    if any(d.severity == "error" for d in diags):
        playbook = None
    return CompileResult(playbook=playbook, diagnostics=diags)


def load_playbook(text: str, file: str = "<playbook>", *, extensions: Iterable[str] = ()) -> Playbook:
    """Compile or raise ``PlaybookError`` with every problem."""
    result = compile_playbook(text, file, extensions=extensions)
    if result.playbook is None:
        raise PlaybookError(result.diagnostics)
    return result.playbook
