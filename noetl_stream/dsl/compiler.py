"""Playbook compiler: YAML text -> normalized, validated ``Playbook``.

Pure: no I/O. Every problem is collected (not just the first) and reported as
``file:line:col: message (at yaml.path)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from noetl_stream.dsl import vocabulary as V
from noetl_stream.dsl.canonical import LEGACY, declared_extensions, expand
from noetl_stream.dsl.checks import (
    check_cycle_entries,
    check_cycles,
    check_graph,
    check_names,
    check_numbers,
    check_templates,
)
from noetl_stream.dsl.diagnostics import Diagnostic, Path, PlaybookError
from noetl_stream.dsl.model import Executor, KeychainEntry, Metadata, Playbook, Step, Task
from noetl_stream.dsl.semantics import check_failure_reentry, check_failure_routes
from noetl_stream.dsl.source import SourceMap, load_yaml
from noetl_stream.dsl.speckeys import check_spec_keys, warn_unknown
from noetl_stream.dsl.steps import parse_step
from noetl_stream.dsl.tasks import parse_task
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
        self.workbook_names: set[str] = set()
        """The root workbook's template names, once parsed (``kind: workbook`` tasks refer to them)."""
        self.fragment = False
        """The document is a list of steps, not a playbook (its steps are checked all the same)."""

    # -- reporting --------------------------------------------------------------
    def error(self, path: Path, message: str, *, at_key: bool = False, code: str = "invalid") -> None:
        self.diagnostics.append(self.smap.diagnostic(path, message, at_key=at_key, code=code))

    def warn(self, path: Path, message: str, *, at_key: bool = False, code: str = "warning") -> None:
        self.diagnostics.append(
            self.smap.diagnostic(path, message, severity="warning", at_key=at_key, code=code)
        )

    def legacy_hint(self, translated: bool = True) -> str:
        """What to add after "not part of v10": how to have the construct translated, when the legacy
        extension ``translated`` it (at this place); that it cannot be, when the extension is on."""
        if LEGACY in self.extensions:
            return V.LEGACY_NOT_A_PLAYBOOK if translated and self.fragment else V.LEGACY_UNTRANSLATED
        return V.LEGACY_HINT + V.LEGACY_HOW if translated else ""

    def in_workflow(self, path: Path) -> bool:
        """Whether ``path`` is inside a workflow step (where the legacy extension translates)."""
        return bool(path) and (path[0] == "workflow" or (self.fragment and isinstance(path[0], int)))

    @staticmethod
    def is_template(value: Any) -> bool:
        return isinstance(value, str) and has_template(value)

    def unknown_keys(
        self, raw: dict[str, Any], allowed: Iterable[str], path: Path, who: str, what: str = ""
    ) -> bool:
        """Report every key of ``raw`` not in ``allowed``; true when there was none."""
        allowed = tuple(allowed)
        ok = True
        for k in raw:
            if k not in allowed:
                ok = False
                hint = V.key_hint(str(k), allowed)
                label = f"{what} key" if what else "key"
                self.error((*path, k), f"{who}: unknown {label} '{k}'{hint}", at_key=True, code="unknown-key")
        return ok

    def ignored_keys(self, raw: dict[str, Any], path: Path, where: str) -> tuple[str, ...]:
        """Warn about the keys of ``raw`` that NoETL's playbooks give at ``where`` and nothing reads
        (``metadata.tags``, ``executor.profile``, ...); their names."""
        known = V.IGNORED_KEYS[where]
        place = "" if where == "root" else f"{where}."
        for k in raw:
            if k in known:
                self.warn(
                    (*path, k),
                    f"'{place}{k}' is accepted for NoETL's playbooks and ignored",
                    at_key=True,
                    code="ignored-key",
                )
        return known

    # -- root -------------------------------------------------------------------
    def compile(self, data: Any) -> Playbook | None:
        if not isinstance(data, dict):
            listed = (
                isinstance(data, list)
                and bool(data)
                and all(isinstance(i, dict) and "step" in i for i in data)
            )
            what = "a list of steps" if listed else f"a {V.type_name(data)}"
            self.error(
                (),
                f"this document is {what}, not a playbook: a playbook is a mapping with apiVersion, kind, "
                "metadata and workflow"
                + (" (put the steps under 'workflow:')" if listed else "")
                + ("; the legacy extension translates only a playbook" if LEGACY in self.extensions else ""),
                code="not-a-playbook",
            )
            if listed:
                self.fragment = True
                self._workflow(data, [], base=(), fragment=True)
            return None
        self.ignored_keys(data, (), "root")
        for k in data:
            if k in V.ROOT_KEYS or k in V.IGNORED_KEYS["root"]:
                continue
            if k in V.DEPRECATED_ROOT:
                self.error(
                    (k,),
                    f"root '{k}' {V.NOT_V10}; {V.DEPRECATED_ROOT[k]}{self.legacy_hint(k in V.LEGACY_ROOT)}",
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
        metadata = self._metadata(data.get("metadata"), "metadata" in data)
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
        self.workbook_names = set(workbook) | _names(data.get("workbook"))
        steps = self._workflow(data.get("workflow"), keychain, present="workflow" in data)
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
        check_cycles(self, playbook, data)
        check_failure_routes(self, playbook, data)
        check_failure_reentry(self, playbook, data)
        check_cycle_entries(self, playbook, data)
        check_names(self, playbook, data)
        check_templates(self, playbook, data)
        check_spec_keys(self, playbook, data)
        return playbook

    def _metadata(self, raw: Any, present: bool) -> Metadata | None:
        if raw is None:
            if present:
                self.error(("metadata",), "metadata is empty; it needs 'name' and 'path'", at_key=True)
            else:
                self.error((), "missing 'metadata' (with 'name' and 'path')", code="missing")
            return None
        if not isinstance(raw, dict):
            self.error(("metadata",), "metadata must be a mapping with 'name' and 'path'")
            return None
        self.unknown_keys(
            raw,
            (*V.METADATA_KEYS, *self.ignored_keys(raw, ("metadata",), "metadata")),
            ("metadata",),
            "metadata",
        )
        ok = True
        for key in ("name", "path"):
            value = raw.get(key)
            if value is None:
                self.error(("metadata",), f"metadata: missing '{key}'", at_key=True, code="missing")
                ok = False
            elif not isinstance(value, str) or not value.strip():
                self.error(("metadata", key), f"metadata: '{key}' must be a non-empty string")
                ok = False
        labels = raw.get("labels", {})
        if not isinstance(labels, dict):
            self.error(("metadata", "labels"), "metadata: 'labels' must be a mapping")
            labels = {}
        for key, types in (("version", (str, int, float)), ("description", (str,))):
            value = raw.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                what = "a string or a number" if key == "version" else "a string"
                self.error(("metadata", key), f"metadata: '{key}' must be {what}, got {V.type_name(value)}")
                ok = False
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
        seen: dict[str, int] = {}
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
                    path if kind is None else (*path, "kind"),
                    f"keychain entry '{name}' needs a 'kind' (e.g. postgres_credential, secret_manager)"
                    if kind is None
                    else f"keychain entry '{name}': 'kind' must be a non-empty string, got {kind!r}",
                )
                continue
            if name in seen:
                self.error(
                    (*path, "name"),
                    f"keychain entry '{name}' is declared twice (first at line {seen[name]})",
                    code="duplicate",
                )
                continue
            seen[str(name)] = self.smap.value((*path, "name"))[0]
            out.append(
                KeychainEntry(
                    name=str(name),
                    kind=kind,
                    config={k: v for k, v in item.items() if k not in ("name", "kind")},
                )
            )
        return out

    def _executor(self, raw: Any) -> Executor | None:
        if raw is None:
            return Executor()
        if not isinstance(raw, dict):
            self.error(("executor",), "executor must be a mapping (with optional 'kind' and 'spec')")
            return Executor()
        self.unknown_keys(
            raw,
            (*V.EXECUTOR_KEYS, *self.ignored_keys(raw, ("executor",), "executor")),
            ("executor",),
            "executor",
        )
        spec = {} if raw.get("spec") is None else raw["spec"]
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
                        warn_unknown(
                            self,
                            k,
                            ("executor", "spec", "policy", k),
                            "executor",
                            "executor.spec.policy",
                            V.EXECUTOR_POLICY_KEYS,
                        )
                limits = policy.get("limits")
                size = limits.get("max_payload_bytes") if isinstance(limits, dict) else None
                if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
                    self.error(
                        ("executor", "spec", "policy", "limits", "max_payload_bytes"),
                        f"executor: limits.max_payload_bytes must be a positive integer (bytes), got {size!r}",
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
        pool = spec.get("pool")
        if pool is not None and not V.is_identifier(str(pool).replace("-", "_")):
            self.error(("executor", "spec", "pool"), f"executor: pool name {pool!r} must be a simple name")
        kind = raw.get("kind")
        if kind is not None and not isinstance(kind, str):
            self.error(("executor", "kind"), f"executor: 'kind' must be a string, got {V.type_name(kind)}")
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
                for k in item if "tool" in item else ():
                    if k not in ("name", "tool"):
                        self.warn(
                            (*path, k),
                            f"workbook '{item['name']}': '{k}' beside 'tool' is ignored"
                            + (" (NoETL's 'assert' is documentation only)" if k == "assert" else ""),
                            at_key=True,
                            code="ignored-key",
                        )
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
            task = parse_task(self, body, path, f"workbook '{name}'", name, set(), keychain_names=None)
            if task is not None:
                out[name] = task
        return out

    # -- workflow ---------------------------------------------------------------
    def _workflow(
        self,
        raw: Any,
        keychain: list[KeychainEntry],
        base: Path = ("workflow",),
        fragment: bool = False,
        present: bool = True,
    ) -> list[Step] | None:
        if raw is None and not present:
            self.error((), "missing 'workflow' (a list of steps with a 'start' step)", code="missing")
            return None
        if not isinstance(raw, list) or not raw:
            what = "empty" if raw is None or raw == [] else f"a {V.type_name(raw)}"
            self.error(base, f"workflow must be a non-empty list of steps, got {what}", at_key=True)
            return None
        names: dict[str, int] = {}
        for i, item in enumerate(raw):
            if isinstance(item, dict) and isinstance(item.get("step"), str):
                name = item["step"]
                if name in names:
                    first = self.smap.value((*base, names[name], "step"))[0]
                    self.error(
                        (*base, i, "step"),
                        f"step '{name}' is defined twice (first at line {first})",
                        code="duplicate",
                    )
                else:
                    names[name] = i
        kc = {k.name for k in keychain}
        steps: list[Step] = []
        for i, item in enumerate(raw):
            step = parse_step(self, item, (*base, i), set(names), kc)
            if step is not None:
                steps.append(step)
        if "start" not in names and not fragment:
            self.error(
                base,
                "workflow has no 'start' step (execution begins at the step named 'start')",
                at_key=True,
                code="no-start",
            )
        return steps


def _names(raw: Any) -> set[str]:
    """Every template name the workbook declares, compiled or not (so a broken one is not also "undefined")."""
    if isinstance(raw, dict):
        inner = raw["tasks"] if set(raw) == {"tasks"} and isinstance(raw["tasks"], dict) else raw
        return {str(k) for k in inner}
    if isinstance(raw, list):
        return {str(i["name"]) for i in raw if isinstance(i, dict) and "name" in i}
    return set()


def compile_playbook(text: str, file: str = "<playbook>", *, extensions: Iterable[str] = ()) -> CompileResult:
    """Compile playbook text. Never raises for bad input: problems come back as diagnostics."""
    try:
        data, smap = load_yaml(text, file)
    except PlaybookError as exc:
        return CompileResult(playbook=None, diagnostics=exc.diagnostics)
    return compile_data(data, smap, extensions=extensions)


def compile_data(data: Any, smap: SourceMap, *, extensions: Iterable[str] = ()) -> CompileResult:
    """Compile authored data: legacy translation (when enabled), sugar and dialect first, then validation."""
    exts = set(extensions) | declared_extensions(data)
    pre = expand(data, smap, exts)
    compiler = Compiler(pre.smap, exts)
    compiler.diagnostics.extend(pre.diagnostics)
    playbook = compiler.compile(pre.data)
    if isinstance(pre.data, dict):  # last: a place a check above refused already is not named again
        check_numbers(compiler, pre.data)
    unique = list(dict.fromkeys(compiler.diagnostics))
    diags = tuple(sorted(unique, key=lambda d: (d.line, d.col, d.severity)))
    if any(d.severity == "error" for d in diags):
        playbook = None
    return CompileResult(playbook=playbook, diagnostics=diags)


def load_playbook(text: str, file: str = "<playbook>", *, extensions: Iterable[str] = ()) -> Playbook:
    """Compile or raise ``PlaybookError`` with every problem."""
    result = compile_playbook(text, file, extensions=extensions)
    if result.playbook is None:
        raise PlaybookError(result.diagnostics)
    return result.playbook
