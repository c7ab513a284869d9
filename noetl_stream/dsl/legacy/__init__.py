"""Legacy extensions: older NoETL DSL forms (000/004 and 002) translated to canonical v10 data.

Runs on the plain data of a playbook before it is validated, only when the ``legacy`` extension is
enabled (``executor.spec.extensions: [legacy]``, ``--legacy``, or by the caller). Every translated
construct gives a warning at its position; a construct without a faithful translation gives an
error that says why. The result is canonical data: ``migrate`` writes it back as YAML.
"""

from noetl_stream.dsl.legacy.translate import translate

__all__ = ["translate"]
