"""noetl-stream: a runtime for NoETL playbooks (noetl.io/v2) on NATS JetStream.

The public Python API, importable from here::

    from noetl_stream import compile_playbook, local_runtime, request_for, submit

Each name is imported from its module when first used, so ``import noetl_stream.dsl`` (pure: no NATS,
no event loop) stays as light as it is.

The packages, by layer (docs/architecture.md draws who imports whom):

* `protocol`: the message formats (request, command, event, subjects, operations, their schemas).
* `jetstream`: talking to NATS (connection, fast paths, acks, confirms, publish, streams, puller,
  outbox, the embedded server).
* `dsl`: the playbook language (parse, compile, templates, policies, migration). Pure.
* `kv`: the stores in JetStream (history, snapshots, results, keychain, catalog, provisioning).
* `control`: the controller (intake, reducer, transitions, folding and commit).
* `dataplane`: the worker (commands, tools).
* `client`, `runtime`, `api`, `cli`: the edge (submitting and following, the processes, the REST
  API, the command line).

`errors`, `logs`, `tracing` and `loop` stay here, beside the layers: every layer uses them (the
exceptions the core names, structured logging, spans, the event loop), and they import no layer but
`protocol` (`tracing` reads event names).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noetl_stream.client.submit import request_for, submit
    from noetl_stream.client.tracking import Completions, RunSummary, follow
    from noetl_stream.dsl.compiler import CompileResult, compile_playbook
    from noetl_stream.jetstream.embedded import EmbeddedNats
    from noetl_stream.protocol.subjects import Topology
    from noetl_stream.runtime.local import Runtime, local_runtime

__version__ = "0.1.0"

_HOMES = {
    "CompileResult": "noetl_stream.dsl.compiler",
    "Completions": "noetl_stream.client.tracking",
    "EmbeddedNats": "noetl_stream.jetstream.embedded",
    "RunSummary": "noetl_stream.client.tracking",
    "Runtime": "noetl_stream.runtime.local",
    "Topology": "noetl_stream.protocol.subjects",
    "compile_playbook": "noetl_stream.dsl.compiler",
    "follow": "noetl_stream.client.tracking",
    "local_runtime": "noetl_stream.runtime.local",
    "request_for": "noetl_stream.client.submit",
    "submit": "noetl_stream.client.submit",
}

__all__ = [
    "CompileResult",
    "Completions",
    "EmbeddedNats",
    "RunSummary",
    "Runtime",
    "Topology",
    "__version__",
    "compile_playbook",
    "follow",
    "local_runtime",
    "request_for",
    "submit",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'noetl_stream' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
