"""A later step's tasks see the values of large results wherever a reference sits: in any iteration
of a distributed loop's result, nested in arc args, and inside a large result list that holds one."""

from __future__ import annotations

from helpers import playbook

from noetl_stream.runtime.local import Runtime

BIG = 300_000
"""Above the default inline limit (256 KiB): the result travels by reference."""

# Iteration `big` returns a large string, the others a small mapping; `after` describes what it sees.
DISTRIBUTED = """
- step: start
  next: {arcs: [{step: L}]}
- step: L
  loop:
    in: "{{ workload.xs }}"
    iterator: x
    spec: {mode: parallel, policy: {exec: distributed}}
  tool:
    - name: t
      kind: python
      args: {x: "{{ iter.x }}", big: "{{ workload.big }}", size: "{{ workload.size }}"}
      code: |
        result = ("y" * size) if x == big else {"small": x}
  next:
    arcs:
      - step: after
        when: "{{ event.name == 'loop.done' }}"
        args: {res: "{{ event.result }}"}
- step: after
  tool:
    kind: python
    args: {L: "{{ L }}", res: "{{ args.res }}"}
    code: |
      def d(v):
          return len(v) if isinstance(v, str) else v
      result = {"L": [d(v) for v in L], "res": [d(v) for v in res]}
"""


async def test_a_large_result_of_any_distributed_iteration_reaches_the_next_step_as_its_value(
    runtime: Runtime,
) -> None:
    for big in (0, 2):
        summary = await runtime.run_playbook(
            playbook(DISTRIBUTED, workload={"xs": [0, 1, 2], "big": big, "size": BIG}), timeout=60
        )
        assert summary.status == "success", summary.error
        expected = [BIG if x == big else {"small": x} for x in (0, 1, 2)]
        assert summary.result == {"L": expected, "res": expected}, f"big={big}"


async def test_a_large_list_holding_a_reference_reaches_the_next_step_as_values(runtime: Runtime) -> None:
    # Iterations of 200 kB stay inline, the 300 kB one is stored by reference: the assembled list is
    # above the message limit, so it is stored by reference too, with the iteration's reference inside.
    text = DISTRIBUTED.replace('{"small": x}', '"s" * 200_000')
    summary = await runtime.run_playbook(
        playbook(text, workload={"xs": [0, 1, 2, 3], "big": 3, "size": BIG}), timeout=60
    )
    assert summary.status == "success", summary.error
    expected = [200_000, 200_000, 200_000, BIG]
    assert summary.result == {"L": expected, "res": expected}


async def test_a_reference_nested_in_arc_args_reaches_the_task_as_its_value(runtime: Runtime) -> None:
    text = playbook(
        """
        - step: start
          tool:
            kind: python
            code: |
              result = "z" * 300000
          next:
            arcs:
              - step: after
                args:
                  nested: {inner: "{{ event.result }}"}
                  listed: ["small", "{{ event.result }}"]
                  deep: [{a: [{b: "{{ event.result }}"}]}]
        - step: after
          tool:
            kind: python
            args: {a: "{{ args }}"}
            code: |
              result = {
                  "nested": len(a["nested"]["inner"]),
                  "listed": [a["listed"][0], len(a["listed"][1])],
                  "deep": len(a["deep"][0]["a"][0]["b"]),
              }
        """
    )
    summary = await runtime.run_playbook(text, timeout=60)
    assert summary.status == "success", summary.error
    assert summary.result == {"nested": 300000, "listed": ["small", 300000], "deep": 300000}
