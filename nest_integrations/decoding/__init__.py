"""``NestDecoder`` and the step loop it runs: one generation's state, the row scheduler, the
batching service, the output contract (``NestOutput``, spans, renderers) and a chat
session over one decoder.

Imports ``retrieval``, ``store``, ``policy``, ``corpus``, ``model`` and ``core``.
"""
