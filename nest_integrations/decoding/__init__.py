"""``NestDecoder`` and the step loop it runs: its per-step rules (``StepRules``) and the plan
an answer opens with, one generation's state, the row scheduler, the batching service, the
output contract (``NestOutput``, spans, renderers).

Imports ``retrieval``, ``store``, ``policy``, ``corpus``, ``model`` and ``core``.
"""
