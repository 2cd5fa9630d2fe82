"""``NestDecoder`` and the step loop it runs: the preparation of each generation and its copy plan,
the mixer, the span proposer and the span verifier each row applies at every step, one
generation's state, the row scheduler, the batching service, teacher-forced scoring, the output
contract (``NestOutput``, spans, renderers).

Imports ``retrieval``, ``store``, ``policy``, ``corpus``, ``model`` and ``core``.
"""
