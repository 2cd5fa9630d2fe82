"""``NestIndex`` (corpus, retrievers and token datastore saved as one folder), a vector
store's binding to an LM and its calibrations, the Ray build and resumable JSONL jobs.

Imports every layer below the integrations.
"""
