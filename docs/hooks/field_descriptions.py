"""griffe extension: a pydantic field's ``Field(description=...)`` is its docstring on the API pages.

mkdocstrings shows a class attribute only with a docstring, and pydantic fields carry their
documentation in ``Field(description=...)`` (where pydantic's JSON schema and LangChain /
LlamaIndex read it too). This extension copies that description into the attribute's docstring
while the source is read, so every described field of a model (``NestOutput``, ``NestConfig``,
the LlamaIndex ``NestLLM``, ...) is listed with its description and no text is written twice.
The field's shown value becomes its default (the description is not repeated in a ``Field(...)``
call), and its labels say it is a field.

It reads the source statically: any call named ``Field`` counts (pydantic's own, or
``llama_index.core.bridge.pydantic.Field``), given as the value (``x: int = Field(...)``) or in
``Annotated[int, Field(...)]``; the description must be a string literal (implicitly
concatenated literals too). A field that has its own docstring keeps it. A description is
plain text (LangChain and LlamaIndex show it as such), so its ``&`` and ``<`` are written as
entities: ``'layer:<i>'`` must not turn into an HTML tag on the page.
"""

from __future__ import annotations

import ast
from typing import Any, Optional

from griffe import Attribute, Docstring, Extension


def _field_call(node: ast.AST) -> Optional[ast.Call]:
    """The ``Field(...)`` call of an annotated class-body assignment, in its value or in its
    ``Annotated[...]`` annotation; None when there is none."""
    if not isinstance(node, ast.AnnAssign):
        return None
    candidates = [node.value] if node.value is not None else []
    if isinstance(node.annotation, ast.Subscript) and isinstance(node.annotation.slice, ast.Tuple):
        candidates.extend(node.annotation.slice.elts)
    for candidate in candidates:
        if isinstance(candidate, ast.Call):
            function = candidate.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name == "Field":
                return candidate
    return None


def field_default(call: ast.Call) -> Optional[str]:
    """The source of a ``Field(...)`` call's default (its first argument or ``default=``); None
    when it has none (a required field, or one with a ``default_factory``)."""
    given = [keyword.value for keyword in call.keywords if keyword.arg == "default"] + call.args[:1]
    if not given or (isinstance(given[0], ast.Constant) and given[0].value is Ellipsis):
        return None
    return ast.unparse(given[0])


def field_description(node: ast.AST) -> Optional[str]:
    """The literal ``description=`` of the field assigned by ``node``, else None."""
    call = _field_call(node)
    for keyword in call.keywords if call is not None else []:
        if keyword.arg == "description":
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:  # an expression built at run time: nothing to show statically
                return None
            return value if isinstance(value, str) and value.strip() else None
    return None


class FieldDescriptions(Extension):
    """Give each described pydantic field without a docstring its description as docstring."""

    def on_attribute_instance(self, *, node: Any, attr: Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or not isinstance(node, ast.AST) or not attr.parent or not attr.parent.is_class:
            return
        description = field_description(node)
        if description is None:
            return
        attr.docstring = Docstring(description.replace("&", "&amp;").replace("<", "&lt;"), parent=attr)
        call = _field_call(node)
        if call is node.value:  # x: int = Field(...): show the default, not the call
            attr.value = field_default(call)
        attr.labels = {"pydantic-field"}
