"""The protocol: the messages noetl-stream puts on NATS and what names them.

The execution request, the command, the event (`wire`), the event names (`events`), the subjects,
streams, consumers and buckets of an installation (`subjects`), the read API's operations
(`operations`), the JSON Schemas generated from them (`schemas`), the JSON values they carry
(`jsonvalue`), the worker events carried inside a boundary's message (`carried`) and the decoding of
stored bytes (`decoding`).

It imports only `noetl_stream.errors` and, for the step and task definitions a command carries, the
playbook model (`noetl_stream.dsl.model`): never NATS, the controller, the worker, the stores or an edge
(the cli, the runtime, the client, the API). Everything else may import it.
"""
