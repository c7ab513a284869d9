"""The client: what a program that is not the runtime does with it.

Submitting an execution request (`submit`: from a playbook and its attachments, a retry of a failed
execution), following executions by their events (`tracking`), and showing them as they go: a run's
progress lines (`progress`) and an execution's timeline (`timeline`).

It imports the message formats (`noetl_stream.protocol`), publishing (`noetl_stream.jetstream`), the
playbook compiler (`noetl_stream.dsl`), and for a retry the stored history (`noetl_stream.kv`) and the
controller's replay (`noetl_stream.control.replay`); never the worker, the runtime, the API or the
command line. The runtime, the API and the command line use it.
"""
