"""mkdocs hook: the repository's ``results/`` folder is part of the site.

Measurements stay in ``results/`` at the repository root, where the commands write them. The
pages link to them as ``../results/...``, a path that also holds when the Markdown is read in the
repository. This hook adds every file under ``results/`` to the site at ``results/...`` and
rewrites those links to match, so mkdocs resolves them and ``--strict`` fails on a link to a
result that does not exist.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = "results"


def on_files(files, config):
    """Add each file under ``<repo>/results`` as ``results/<path>`` (Markdown becomes a page)."""
    repo = Path(config.config_file_path).parent
    for path in sorted((repo / RESULTS).rglob("*")):
        if path.is_file():
            files.append(File(path.relative_to(repo).as_posix(), str(repo), config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown, page, config, files):
    """Rewrite ``../results/`` links (out of ``docs/``) to the copy inside the site."""
    depth = page.file.src_uri.count("/")
    return markdown.replace("](" + "../" * (depth + 1) + RESULTS + "/", "](" + "../" * depth + RESULTS + "/")
