"""The controller's pure core: ``(state, event) -> (state, effects)``.

`reducer` folds one input event into an execution's state (`state`) and returns what to publish
(`effects`): the step transitions (`transitions`), routing (`routing`), loops (`loops`, `items`), the
scope a step renders in (`runcontext`, `byref`), the keychain check (`keychaincheck`) and the compiled
playbook (`plan`, `plans`). Nothing here does I/O, waits, reads a clock of its own or knows NATS: the
import contract ``control/core is pure`` (pyproject.toml) keeps asyncio, nats, the KV layer and the
rest of `control` out, so replaying the same events always folds to the same state.
"""
