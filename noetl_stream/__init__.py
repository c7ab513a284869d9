"""noetl-stream: a runtime for NoETL playbooks (noetl.io/v2) on NATS JetStream."""

__version__ = "0.1.0"

__all__ = ["__version__"]
