"""JetStream: how noetl-stream talks to NATS, below any decision.

The connection (`connection`), the client's fast paths (`fastpath`: nats-py internals, checked once by
`require_client_internals`), the acks of published messages (`acks`), a turn's confirms (`confirm`),
publishing with stored message ids (`publish`), the streams' configurations (`streams`), the pull
consumer (`puller`), the controller's outbox (`outbox`), and the embedded nats-server (`embedded`, with
`_server_guard`, the process that stops it if its parent dies).

It imports `noetl_stream.protocol` and `noetl_stream.errors` only: never the controller, the worker, the
stores, the playbook language or an edge (the cli, the runtime, the client, the API).
"""
