"""The ``noetl-stream`` command line: the edge where a person or a script meets the runtime.

`main` is the click group and `entry` the console script (``noetl-stream``, ``python -m noetl_stream``),
both in `noetl_stream.cli.main`; what the commands share (exit codes, options, the topology, running
on a NATS connection) is in `noetl_stream.cli.common`; each family of commands has its module
(`run`, `validate`, `migrate`, `inspect`, `controls`, `catalog`, `keychain`, `services`), which
registers its commands on `main` when imported here.

The command line may import every layer (the runtime, the client, the API, the controller's read side,
the stores); no layer imports it (import-linter: "nothing imports the edge").
"""

from noetl_stream.cli import catalog, controls, inspect, keychain, migrate, run, services, validate
from noetl_stream.cli.main import entry, main

__all__ = [
    "catalog",
    "controls",
    "entry",
    "inspect",
    "keychain",
    "main",
    "migrate",
    "run",
    "services",
    "validate",
]
