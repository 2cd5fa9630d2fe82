"""The token datastore: keys encoded by the LM (and the precision they are encoded at), how
keys are stored and scored (codecs), shards written by separate workers, and the progress
of a long encoding.

Imports ``policy``, ``corpus``, ``model`` and ``core``.
"""
