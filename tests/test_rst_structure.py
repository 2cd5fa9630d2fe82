"""reStructuredText passages keep their structure: titles, directives and labels are never copied, code is code."""

from __future__ import annotations

import pytest

from nest_integrations.corpus.chunking import chunk_passages
from nest_integrations.corpus.markdown_structure import (
    copy_layout,
    looks_like_markdown,
    open_code_block,
    parse_blocks,
    past_markup_indent,
    section_ends_at,
    section_title,
    shows_text,
    start_allowed,
)
from nest_integrations.corpus.passages import Passage
from nest_integrations.corpus.rst_structure import announces_code, looks_like_rst, reads_as_code

SAMPLE = """.. _options:

=======
Options
=======

.. currentmodule:: click

Adding options to commands is done with the :func:`option` decorator.

Multiple Options
----------------

Options can be given more than once with ``multiple=True``:

.. code-block:: python
    :caption: echo.py

    @click.option('--message', '-m', multiple=True)
    def commit(message):
        click.echo(message)

.. note::

    The values arrive as a tuple.

.. click:example::

    @click.command()
    def hello():
        click.echo('Hi')

Run it from a shell::

    $ python echo.py -m foo -m bar

-   ``-m`` is the short name.
-   ``--message`` is the long one.

.. This comment is for the writers.
   It goes on here.

>>> 1 + 1
2
"""


def _blocks(text: str) -> list[tuple[str, str]]:
    return [(b.kind, text[b.start : b.end]) for b in parse_blocks(text)]


def test_blocks_have_their_kind_exact_range_and_heading_path():
    blocks = parse_blocks(SAMPLE)
    assert _blocks(SAMPLE) == [
        ("link_definition", ".. _options:"),
        ("heading", "=======\nOptions\n======="),
        ("directive", ".. currentmodule:: click"),
        ("paragraph", "Adding options to commands is done with the :func:`option` decorator."),
        ("heading", "Multiple Options\n----------------"),
        ("paragraph", "Options can be given more than once with ``multiple=True``:"),
        ("directive", ".. code-block:: python\n    :caption: echo.py"),
        ("code", "@click.option('--message', '-m', multiple=True)\n    def commit(message):\n        click.echo(message)"),
        ("directive", ".. note::"),
        ("paragraph", "The values arrive as a tuple."),
        ("directive", ".. click:example::"),
        ("code", "@click.command()\n    def hello():\n        click.echo('Hi')"),
        ("paragraph", "Run it from a shell::"),
        ("code", "$ python echo.py -m foo -m bar"),
        ("list_item", "-   ``-m`` is the short name."),
        ("list_item", "-   ``--message`` is the long one."),
        ("comment", ".. This comment is for the writers.\n   It goes on here."),
        ("code", ">>> 1 + 1\n2"),
    ]
    assert [(b.level, b.heading_path) for b in blocks if b.kind == "heading"] == [
        (1, ("Options",)), (2, ("Options", "Multiple Options"))
    ]
    assert blocks[-1].heading_path == ("Options", "Multiple Options")


def test_underlines_labels_and_directive_lines_are_hidden_and_titles_label_sections():
    layout = copy_layout(SAMPLE)
    assert layout is not None
    hidden = [SAMPLE[start:end] for start, end in layout.hidden]
    assert "=======\nOptions\n=======" in hidden and ".. _options:" in hidden
    assert ".. code-block:: python\n    :caption: echo.py" in hidden
    assert not any("multiple=True)" in piece or "arrive as a tuple" in piece for piece in hidden)
    at = SAMPLE.index("Options can be given")
    assert SAMPLE[slice(*section_title(SAMPLE, at))] == "Multiple Options"
    assert section_ends_at(SAMPLE, SAMPLE.index(":func:`option` decorator.") + len(":func:`option` decorator."))
    code = SAMPLE.index("def commit")
    assert start_allowed(SAMPLE, code) and not start_allowed(SAMPLE, code + 4), "code is copied from a line's start"


def test_a_literal_blocks_marker_written_alone_is_hidden():
    """docutils shows nothing of a ``::`` paragraph: copied, it read as a stray ``::`` above the code."""
    text = "To achieve this, run ``borg create`` within the mountpoint:\n\n::\n\n    cd /mnt/rootfs\n    borg create repo::backup .\n"
    layout = copy_layout(text)
    marker = text.index("\n::\n") + 1
    assert layout is not None and (marker, marker + 2) in layout.hidden
    assert not start_allowed(text, marker) and not shows_text(text, marker, marker + 2)
    assert [b.kind for b in parse_blocks(text)] == ["paragraph", "directive", "code"]
    assert start_allowed(text, text.index("cd /mnt")), "the code below it is still code"


def test_a_paragraphs_closing_colons_show_as_docutils_shows_them():
    """A paragraph that announces a literal block ends in ``::``, which docutils shows as one colon
    after text ("try:") and not at all after white space ("as follows"). Copied as written, the
    answer read "For most POSIX-like systems, try::" above its example."""
    text = (
        "For most POSIX-like systems, try::\n\n    $ borg create repo::arch ~\n\n"
        "Prune it as follows ::\n\n    $ borg prune --keep-daily 7 repo\n"
    )
    layout = copy_layout(text)
    assert layout is not None
    hidden = [text[start:end] for start, end in layout.hidden]
    assert hidden == [":", " ::"], hidden
    after_text = text.index("try::") + 4
    assert shows_text(text, after_text - 1, after_text) and not shows_text(text, after_text, after_text + 1)
    assert [b.kind for b in parse_blocks(text)] == ["paragraph", "code", "paragraph", "code"]
    code = next(b for b in parse_blocks(text) if b.kind == "code")
    assert text[code.start : code.end] == "$ borg create repo::arch ~", "code keeps its colons"


def test_a_generated_sections_markers_are_hidden_comments_and_a_footnotes_note_is_text():
    """cog marks the lines it generates with ``.. [[[cog ...]]]`` and ``.. [[[end]]]``: comments to
    docutils, which shows nothing of them (copied, "``.. [[[end]]] (sum: xPc0F1izoA)``" ended an
    answer). A footnote's note, ``.. [1] ...``, is text."""
    text = (
        "Options\n=======\n\n.. [[[cog show_help('run') ]]]\n\nRun it with ``--branch``.\n\n"
        ".. [[[end]]] (sum: xPc0F1izoA)\n\n.. [1] This failsafe can fail.\n"
    )
    kinds = [(b.kind, text[b.start : b.end]) for b in parse_blocks(text)]
    assert kinds[1:] == [
        ("comment", ".. [[[cog show_help('run') ]]]"), ("paragraph", "Run it with ``--branch``."),
        ("comment", ".. [[[end]]] (sum: xPc0F1izoA)"), ("paragraph", ".. [1] This failsafe can fail."),
    ]


def test_a_code_tabs_body_is_code():
    """sphinx-tabs writes one example a language (``.. code-tab:: ini``): its body is code though
    it reads as no Python (``[coverage:run]``)."""
    text = ".. tabs::\n\n    .. code-tab:: ini\n        :caption: setup.cfg\n\n        [coverage:run]\n        branch = True\n"
    assert announces_code(".. code-tab:: ini")
    assert [b.kind for b in parse_blocks(text)][-1] == "code"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SAMPLE, True),
        ("Title\n=====\n\nText.", True),
        ("Example::\n\n    x = 1\n", True),
        (".. versionadded:: 8.0", True),
        ("Hello world\n---\n\nThe underline is shorter than the title and than four characters.", False),
        ("Plain prose: a colon, a ratio 2::3, and an ellipsis...", False),
        ("A sentence.\n.. and a comment line for the writers", True),
        ("Isaac Newton was an English mathematician.\n\nHe was born in 1643.", False),
    ],
)
def test_which_texts_read_as_rst(text, expected):
    assert looks_like_rst(text) is expected
    assert (copy_layout(text) is not None) is expected


def test_a_directive_body_is_code_when_it_reads_as_code():
    assert reads_as_code("    @click.command()\n    def hello():\n        pass\n")
    assert reads_as_code("    $ restic init --repo /srv\n")
    assert not reads_as_code("    The values arrive as a tuple, in the order given.\n")
    assert not reads_as_code("    Deprecated\n"), "a lone word parses as Python but is no code"


def test_a_copy_past_a_directive_opens_at_its_prose_bodys_text_but_keeps_codes_indentation():
    text = ".. seealso::\n\n    Need help? See the upgrading page.\n\n.. code-block:: console\n\n    $ pip install x\n"
    after_note, after_code = text.index("::") + 2, text.index("console") + 7
    assert past_markup_indent(text, after_note) == text.index("Need"), "prose indented by the directive's syntax"
    assert past_markup_indent(text, after_code) == after_code, "code keeps its indentation"
    assert past_markup_indent(text, text.index(" help")) == text.index(" help"), "no line break: nothing to skip"


def test_a_code_directive_announces_the_code_below_it():
    assert announces_code(".. code-block:: console") and announces_code("   .. code:: bash") and announces_code(".. doctest::")
    assert not announces_code(".. note:: Keep the key safe.") and not announces_code(".. include:: cache.rst")
    assert not announces_code("Run the code-block below::"), "a paragraph, not a directive"
    assert announces_code("::") and announces_code("  ::  "), "a literal block's marker standing alone"


def test_chunks_of_an_rst_file_hide_their_underlines_and_directives():
    """reStructuredText is chunked by sentences like prose; each chunk is read on its own text."""
    doc = Passage(id="options", text=SAMPLE, metadata={"source": "docs/options.rst"})
    chunks = chunk_passages([doc], max_words=40)
    assert len(chunks) > 1
    for chunk in chunks:
        assert doc.text[chunk.doc_char_start : chunk.doc_char_end] == chunk.text
        layout = copy_layout(chunk.text)
        assert layout is not None, chunk.text
        assert not chunk.text.startswith("code-block::"), "a directive is never cut after its dots"
        shown = "".join(chunk.text[a:b] for a, b in _visible_ranges(chunk.text, layout.hidden))
        assert not any(marks in shown for marks in ("----", "====", ".. code-block::", ".. _options:", ".. This comment"))


def _visible_ranges(text: str, hidden: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    ranges, at = [], 0
    for start, end in hidden:
        ranges.append((at, start))
        at = end
    return ranges + [(at, len(text))]


def test_a_chunk_cut_inside_an_indented_directive_ends_each_code_body_where_its_indentation_does():
    """A chunk's first line has lost its indentation: the code body ends where it dedents, so the
    prose and the next directive after it are read as such, not as code."""
    text = (
        ".. code-block:: bash\n\n            eval \"$(_FOO_COMPLETE=bash_source foo)\"\n\n"
        "        Source the file in ``~/.bashrc``.\n\n        .. code-block:: bash\n\n            . ~/.foo-complete.bash\n"
    )
    assert _blocks(text) == [
        ("directive", ".. code-block:: bash"),
        ("code", 'eval "$(_FOO_COMPLETE=bash_source foo)"'),
        ("paragraph", "Source the file in ``~/.bashrc``."),
        ("directive", ".. code-block:: bash"),
        ("code", ". ~/.foo-complete.bash"),
    ]


def test_a_text_that_opens_inside_an_indented_code_block_reads_it_as_code():
    """A chunk cut inside a literal block opens with its indented lines, and neither the ``::``
    nor a directive above them: they are code when they read as code (a shell comment in them is
    no heading to hide), prose after them is read as such; an indented note's body stays text."""
    text = (
        "        # Custom options\n        __envelope__ = {\"single\": None}\n\n"
        "        def get_envelope_key(self, many):\n            return self.__envelope__\n\n"
        "Raising errors\n--------------\n\nHooks may raise a ``ValidationError``.\n"
    )
    assert looks_like_rst(text)
    assert _blocks(text) == [
        ("code", text[8 : text.index("\n\nRaising")]),
        ("heading", "Raising errors\n--------------"),
        ("paragraph", "Hooks may raise a ``ValidationError``."),
    ]
    note = "    Note that even if a parameter does not allow multiple values, Click\n    will still accept it.\n"
    assert [kind for kind, _ in _blocks(note)] == ["paragraph"]


def test_a_chunk_cut_inside_a_literal_block_is_inside_it_when_read_after_the_chunk_before():
    """Shell lines without a prompt read as text on their own; after the chunk that announces
    them (a ``::`` paragraph, a console directive cut off with a line of its output), they are the
    block's code up to where their indentation ends, and the prose after them is not."""
    shell = "    sudo cp borg /usr/local/bin/borg\n    sudo chmod 755 /usr/local/bin/borg\n\nThen run ``borg``.\n"
    inside = shell.index("chmod")
    assert open_code_block(shell, inside) is None
    assert open_code_block(shell, inside, lead="Drop the binary into your ``PATH``::\n\n") == (4, shell.index("\n\nThen"))
    assert open_code_block(shell, shell.index("run"), lead="Drop the binary into your ``PATH``::\n\n") is None
    output = "     ID     User\n    ----------------\n    *eb78040b  kasimir\n"
    lead = ".. code-block:: console\n\n    $ restic key list\n    enter password for repository:\n\n"
    assert open_code_block(output, output.index("kasimir")) is None
    assert open_code_block(output, output.index("kasimir"), lead=lead) == (0, len(output) - 1)
    assert open_code_block(output, output.index("kasimir"), lead="Some prose here.\n\n") is None


def test_a_tilde_underline_is_a_title_not_a_markdown_code_fence():
    text = "Installing\n==========\n\nDependencies\n~~~~~~~~~~~~\n\n.. note::\n\n  Old systems need a newer Python.\n"
    assert not looks_like_markdown(text) and looks_like_rst(text)
    assert [kind for kind, _ in _blocks(text)] == ["heading", "heading", "directive", "paragraph"]
    assert looks_like_markdown("Some code:\n\n~~~\nx = 1\n~~~\n"), "a tilde fence after a blank line stays a fence"


def test_a_wrapped_reference_target_is_not_an_html_tag():
    """A reference wrapped at its space puts ``<target>`` first on a line; an overlined title
    above it is then read as a title, not copied as "=====Major changes in 5.0"."""
    text = (
        "====================\nMajor changes in 5.0\n====================\n\n"
        "This is not a complete list. See the :ref:`complete change history\n<changes>` for all the details.\n\n"
        "Open Questions\n--------------\n\n- How to support SQL access to data?\n"
    )
    assert not looks_like_markdown(text) and looks_like_rst(text)
    assert [kind for kind, _ in _blocks(text)] == ["heading", "paragraph", "heading", "list_item"]
    assert looks_like_markdown("Some text.\n<details>\nMore.\n</details>\n"), "an HTML tag opening a line stays Markdown"


def test_an_overlined_title_opening_a_text_is_a_title():
    """A document's first chunk often shows nothing but its overlined title: its adornment lines
    are markup a reader never sees, not text to copy."""
    text = "************\nREST Backend\n************\n\nRestic can interact with HTTP Backend that respects the following REST\nAPI.\n"
    assert looks_like_rst(text)
    assert [kind for kind, _ in _blocks(text)] == ["heading", "paragraph"]
    assert not looks_like_rst("****\nNot a title\n====\n\nThe overline and the underline differ.\n")


def test_a_backtick_underline_is_a_title_and_a_fence_under_a_code_line_is_a_fence():
    """reStructuredText underlines a title with any punctuation, backticks too; a Markdown fence
    is three backticks, also right under a line of text or code."""
    text = ".. click:example::\n\n    @cli.command()\n    def clone():\n        pass\n\nInterleaved Commands\n````````````````````\n\nWhile not relevant here.\n"
    assert not looks_like_markdown(text) and looks_like_rst(text)
    assert [kind for kind, _ in _blocks(text)] == ["directive", "code", "heading", "paragraph"]
    assert looks_like_markdown("Example:\n```\nx = 1\n```\n") and looks_like_markdown("  })\n```\n\nAfter the code.\n")


def test_a_chunk_that_starts_inside_a_run_of_link_targets_hides_the_targets():
    """A chunker can cut between a target's name and its URL: the URL line opens the chunk, and
    the targets under it are markup all the same, not the rest of a paragraph."""
    text = "https://pkg.example.org/search?token=borg\n.. _Homebrew: https://formulae.brew.sh/formula/borgbackup\n.. _Ubuntu PPA: https://launchpad.net/borgbackup\n\nPlease ask package maintainers to build a package.\n"
    assert [kind for kind, _ in _blocks(text)] == ["paragraph", "link_definition", "paragraph"]
    assert all(".. _" not in t for kind, t in _blocks(text) if kind == "paragraph")


TABLE = """Packages
========

=========  =======  ==========================
Name       Tool     Command
=========  =======  ==========================
Alpine     apk      ``apk add borgbackup``
Debian     apt      ``apt install borgbackup``

Fedora     dnf      ``dnf install borgbackup``
=========  =======  ==========================

After the table.
"""
BORDER = "=========  =======  =========================="


def test_a_simple_table_shows_its_cells_but_not_its_borders():
    """A simple table's border lines are markup like a title's underline: hidden inside the one
    table block (its body may hold a blank line), the rows are text, the title stays a title."""
    assert _blocks(TABLE) == [
        ("heading", "Packages\n========"),
        ("table", TABLE[TABLE.index(BORDER) : TABLE.rindex(BORDER) + len(BORDER)]),
        ("paragraph", "After the table."),
    ]
    layout = copy_layout(TABLE)
    assert layout is not None
    assert [TABLE[start:end] for start, end in layout.hidden] == ["Packages\n========", BORDER, BORDER, BORDER]
    shown = "".join(TABLE[a:b] for a, b in _visible_ranges(TABLE, layout.hidden))
    assert "====" not in shown and "Debian     apt      ``apt install borgbackup``" in shown
    assert "Fedora     dnf" in shown and "Name       Tool     Command" in shown
    row = TABLE.index("Alpine")
    assert start_allowed(TABLE, row) and not start_allowed(TABLE, TABLE.index(BORDER))
    assert not shows_text(TABLE, TABLE.index(BORDER), TABLE.index(BORDER) + len(BORDER)) and shows_text(TABLE, row, row + 6)
    assert TABLE[slice(*section_title(TABLE, row))] == "Packages"


def test_a_table_alone_or_cut_reads_as_rst_and_its_rows_are_no_titles():
    """A chunk of nothing but a table is reStructuredText; one cut inside a table begins with a
    row, and a row over a border (`Name ... \\n=====  ====`) is no underlined title."""
    alone = TABLE[TABLE.index(BORDER) :]
    assert looks_like_rst(alone) and [kind for kind, _ in _blocks(alone)] == ["table", "paragraph"]
    cut = TABLE[TABLE.index("Name") :]
    assert [kind for kind, _ in _blocks(cut)] == ["table", "paragraph"]
    assert not any(b.kind == "heading" for b in parse_blocks(cut))
    assert [cut[start:end] for start, end in copy_layout(cut).hidden] == [BORDER, BORDER]
    spanned = "=====  =====  ======\n   Inputs     Output\n------------  ------\n  A      B    A or B\n=====  =====  ======\nFalse  False  False\n=====  =====  ======\n"
    assert [spanned[start:end] for start, end in copy_layout(spanned).hidden] == [
        "=====  =====  ======", "------------  ------", "=====  =====  ======", "=====  =====  ======"
    ]
    tail = BORDER + "\n\nAfter the table.\n"
    assert _blocks(tail) == [("rule", BORDER), ("paragraph", "After the table.")], "a table's bottom border alone is hidden"
