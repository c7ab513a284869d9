"""The runtime: the processes noetl-stream runs, put together from the layers below.

An in-process runtime with an embedded nats-server, a controller and workers (`local`, what
``noetl-stream run`` and `noetl_stream.local_runtime` use); the long-running controller and worker
services (`services`: ``noetl-stream controller`` and ``worker``); worker processes kept running by a
supervisor (`supervisor`); tool plugins from installed packages' entry points (`plugins`).

It may import every layer but the command line (`noetl_stream.cli`), which starts it; nothing but the
command line imports it.
"""
