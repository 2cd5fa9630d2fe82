"""mkdocs hook: the Sphinx markup in docstrings reads as Sphinx shows it.

The docstrings name other objects the Sphinx way (``:class:`NestOutput```,
``:meth:`~nest_integrations.langchain.NestVectorStore.save_local```); rendered as Markdown
they would show the role (``:class:``) in front of the code. This hook drops the role, and
for a ``~`` target keeps only the last component, as Sphinx displays it.

They also end the paragraph before a code example with ``::`` (``Example::``, then the
indented code), which Markdown renders as the paragraph and a code block; the hook shows the
``::`` as Sphinx does: one colon, or nothing for a ``::`` standing alone.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):<code>(~?)([^<]*)</code>")
_LITERAL_MARKER = re.compile(r"(<p>)?(\s*)::</p>(\s*<div class=\"highlight\">)")


def _plain(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def _literal_marker(match: re.Match) -> str:
    alone, space, block = match.groups()
    if alone:
        return block
    return ("</p>" if space else ":</p>") + block


def on_page_content(html, page, config, files):
    """Rewrite ``:role:<code>target</code>`` to ``<code>target</code>`` and a paragraph's ``::``
    before a code block to ``:`` (after a space: to nothing; a ``<p>::</p>`` goes)."""
    return _LITERAL_MARKER.sub(_literal_marker, _ROLE.sub(_plain, html))
