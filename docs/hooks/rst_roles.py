"""mkdocs hook: Sphinx cross-reference roles in docstrings read as plain code names.

The docstrings name other objects the Sphinx way (``:class:`NestOutput```,
``:meth:`~nest_integrations.langchain.NestVectorStore.save_local```); rendered as Markdown
they would show the role (``:class:``) in front of the code. This hook drops the role, and
for a ``~`` target keeps only the last component, as Sphinx displays it.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|const):<code>(~?)([^<]*)</code>")


def _plain(match: re.Match) -> str:
    tilde, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if tilde else target}</code>"


def on_page_content(html, page, config, files):
    """Rewrite ``:role:<code>target</code>`` to ``<code>target</code>``."""
    return _ROLE.sub(_plain, html)
