"""A compiled playbook prepared for the controller: graph, indexes, what each step reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from noetl_stream.dsl.graph import Graph, build_graph
from noetl_stream.dsl.model import Playbook, Step
from noetl_stream.dsl.scope import names_read_by_step
from noetl_stream.dsl.templates import has_template


@dataclass(frozen=True)
class Plan:
    playbook: Playbook
    content_hash: str
    text: str
    graph: Graph
    steps: dict[str, Step] = field(default_factory=dict)
    reads: dict[str, frozenset[str]] = field(default_factory=dict)
    pool: str = "default"
    workbook_refs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Workbook templates each step uses."""
    playbook_refs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Child playbook paths each step runs (literal paths only), and its tasks' script files: a step with
    any gets the request's attachments."""
    keychain_readers: frozenset[str] = frozenset()
    """Steps whose templates read ``keychain`` or whose tasks name a declared entry in ``auth`` (or give a
    template there, which may render to one): their commands carry the playbook's keychain declarations
    (the worker resolves them)."""
    scoped_routes: frozenset[str] = frozenset()
    """Steps whose routing renders something (an arc's ``when``, ``args`` or ``set``): only their boundaries
    need a template scope (building one copies the workload and every result so far)."""

    @classmethod
    def build(cls, playbook: Playbook, text: str, content_hash: str, default_pool: str = "default") -> Plan:
        steps = {s.name: s for s in playbook.workflow}
        all_reads = {s.name: names_read_by_step(s) for s in playbook.workflow}
        reads = {name: names & steps.keys() for name, names in all_reads.items()}
        readers = {name for name, names in all_reads.items() if "keychain" in names}
        declared = {k.name for k in playbook.keychain}
        pool = str(playbook.executor.spec.get("pool") or default_pool)
        workbook_refs: dict[str, tuple[str, ...]] = {}
        playbook_refs: dict[str, tuple[str, ...]] = {}
        for s in playbook.workflow:
            wb = [str(t.config.get("task") or t.name) for t in s.tasks if t.kind == "workbook"]
            workbook_refs[s.name] = tuple(n for n in wb if n in playbook.workbook)
            tasks = list(s.tasks) + [playbook.workbook[n] for n in workbook_refs[s.name]]
            if any(_may_name(t.config.get("auth"), declared) for t in tasks):
                readers.add(s.name)  # `auth: <declared entry>`: the worker resolves it like a template's
            playbook_refs[s.name] = tuple(
                str(t.config["path"])
                for t in tasks
                if t.kind == "playbook" and isinstance(t.config.get("path"), str)
            ) + tuple(  # a task's script file (`script: {path}`) is shipped the same way
                str(t.config["script"]["path"])
                for t in tasks
                if isinstance(t.config.get("script"), dict)
                and isinstance(t.config["script"].get("path"), str)
            )
        scoped = {
            s.name
            for s in playbook.workflow
            if s.next is not None and any(a.when is not None or a.args or a.set_ctx for a in s.next.arcs)
        }
        return cls(
            keychain_readers=frozenset(readers),
            scoped_routes=frozenset(scoped),
            workbook_refs=workbook_refs,
            playbook_refs=playbook_refs,
            playbook=playbook,
            content_hash=content_hash,
            text=text,
            graph=build_graph(playbook),
            steps=steps,
            reads={k: frozenset(v) for k, v in reads.items()},
            pool=pool,
        )

    def pool_of(self, step: Step, request_pool: str | None) -> str:
        """Where `step` runs: its own ``spec.pool``, else the request's, else the playbook's
        (``executor.spec.pool``, else the controller's default)."""
        return str(step.spec.get("pool") or request_pool or self.pool)


def _may_name(auth: object, declared: set[str]) -> bool:
    """Whether a task's ``auth`` names a declared keychain entry: literally, or as a template that renders
    to a name (``auth: "{{ pg_auth }}"``), which only the worker knows."""
    if not isinstance(auth, str) or not declared:
        return False
    return auth in declared or has_template(auth)
