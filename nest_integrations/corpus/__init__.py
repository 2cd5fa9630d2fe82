"""Documents as passages: ``Passage``, the loaders, offset-exact chunking, and the Markdown
structure of a document (what may be copied, where a copy may start).

Imports only ``core``.
"""
