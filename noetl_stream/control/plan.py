"""A compiled playbook prepared for the controller: graph, indexes, what each step reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from noetl_stream.dsl.graph import Graph, build_graph
from noetl_stream.dsl.model import Playbook, Step
from noetl_stream.dsl.scope import names_read_by_step


@dataclass(frozen=True)
class Plan:
    playbook: Playbook
    content_hash: str
    text: str
    graph: Graph
    steps: dict[str, Step] = field(default_factory=dict)
    reads: dict[str, frozenset[str]] = field(default_factory=dict)
    pool: str = "default"

    @classmethod
    def build(cls, playbook: Playbook, text: str, content_hash: str, default_pool: str = "default") -> Plan:
        steps = {s.name: s for s in playbook.workflow}
        reads = {s.name: names_read_by_step(s) & steps.keys() for s in playbook.workflow}
        pool = str(playbook.executor.spec.get("pool") or default_pool)
        return cls(
            playbook=playbook,
            content_hash=content_hash,
            text=text,
            graph=build_graph(playbook),
            steps=steps,
            reads={k: frozenset(v) for k, v in reads.items()},
            pool=pool,
        )
