"""The recipe reference, generated from the code that reads each recipe section.

:func:`field_docs` lists the fields of a dataclass (the keys of a ``TypedDict``, the parameters of
a function) as :class:`FieldDoc`: name, type as written in the annotation, default as JSON writes
it ("required" where there is none, "optional" for a ``TypedDict`` key that may be left out; a
``default_factory`` is called) and description. A field's description is its trailing
``# comment``, with the comment-only lines directly below it, or its entry in the class
docstring's Google-style ``Attributes:`` section (a function's ``Args:``), one field per entry; a
field that a subclass redeclares without one keeps its base class's. A field without a
description is an error, as is a field described twice or an entry that names no field.

In the docs, the ``recipe-fields`` directive renders one such list as a table (no ids, so the same
field may appear in several tables of a page)::

    ```{recipe-fields} scratchformer.training.trainer.TrainConfig
    :prefix: train.
    ```

Options: ``:prefix:`` goes before every name; ``:fields:`` / ``:exclude:`` (comma-separated) show
only / leave out those fields; ``:defaults:``, a JSON object or a dotted path to a dict (a module
constant, or a dataclass field whose default is a dict), gives the defaults shown where the task's
differ from the class's; ``:default-text:`` (``name=words; name=words``) shows defaults as words,
e.g. "from the data". After the table of a recipe class (one with ``METRICS``), a line names the
values ``train.best_metric`` may take. Any error fails the build (``sphinx-build -W``).

Sphinx is imported only in :func:`setup`: the extraction runs without it (the tests use it).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import typing
from collections.abc import Callable
from typing import Any

__all__ = [
    "FieldDoc",
    "OPTIONAL",
    "REQUIRED",
    "block_rows",
    "directive_blocks",
    "field_docs",
    "resolve",
    "table_rows",
]

REQUIRED = "required"  # the default shown for a field the recipe must give
OPTIONAL = "optional"  # the default shown for a TypedDict key that may be left out

Declared = dict[str, tuple[str | None, str | None]]  # name -> (annotation as written, description)


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One row of the reference. ``default`` is JSON text (``default_is_json``), or words:
    :data:`REQUIRED`, :data:`OPTIONAL` or those of ``:default-text:``."""

    name: str
    type: str
    default: str
    description: str
    default_is_json: bool = True


def resolve(path: str) -> Any:
    """The object a dotted path names: ``package.module.Name`` or ``package.module.Class.attribute``
    (the name of a dataclass's field gives its ``dataclasses.Field``)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:split])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and (module + ".").startswith(e.name + "."):  # no such module: try a shorter prefix
                continue
            raise
        for name in parts[split:]:
            fields = {f.name: f for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else {}
            obj = fields[name] if name in fields else getattr(obj, name)
        return obj
    raise ImportError(f"{path}: no module in this dotted path")


def to_json(value: Any) -> str:
    """A default as a recipe's JSON would write it (a dataclass instance, e.g. a default
    ``TrainConfig``, is an object with every field at its default: ``{}``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "{}"
    return json.dumps(value)


def _parse(obj: Any) -> tuple[str, ast.ClassDef | ast.FunctionDef]:
    """The (dedented) source of a class or function and its AST node."""
    source = textwrap.dedent(inspect.getsource(obj))
    node = ast.parse(source).body[0]
    if not isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        raise TypeError(f"{obj!r}: expected a class or a function")
    return source, node


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (its comment without '#', whether the line holds nothing else)."""
    lines = source.splitlines()
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line = tok.start[0]
            found[line] = (tok.string.lstrip("#").strip(), not lines[line - 1][: tok.start[1]].strip())
    return found


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _section(docstring: str | None, headers: tuple[str, ...], owner: str) -> dict[str, str]:
    """A Google-style docstring section (``Attributes:``, ``Args:``): entry name -> text. An entry
    is ``name: text`` or ``name (type): text``, continued by the more indented lines below it."""
    lines = inspect.cleandoc(docstring or "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() in headers), None)
    if start is None:
        return {}
    header = lines[start].strip()
    body = []
    for line in lines[start + 1 :]:
        if line.strip() and _indent(line) <= _indent(lines[start]):
            break
        body.append(line)
    indent = min((_indent(line) for line in body if line.strip()), default=0)
    entries: dict[str, list[str]] = {}
    current = None
    for line in filter(str.strip, body):
        if _indent(line) > indent and current is not None:
            entries[current].append(line.strip())
            continue
        match = re.fullmatch(r"(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line.strip())
        if match is None:
            raise ValueError(
                f"{owner}: the {header} entry {line.strip()!r} is not 'name: description' "
                "(one field per entry)"
            )
        current = match.group(1)
        if current in entries:
            raise ValueError(f"{owner}: {current!r} has two {header} entries")
        entries[current] = [match.group(2)]
    return {name: " ".join(text).strip() for name, text in entries.items()}


def _own_fields(obj: Any) -> tuple[Declared, dict[str, str]]:
    """What a class body (or a function's signature) declares itself, and the entries of its
    docstring's section that name nothing it declares (a class may describe inherited fields)."""
    source, node = _parse(obj)
    owner = getattr(obj, "__qualname__", repr(obj))
    declared: Declared = {}
    if isinstance(node, ast.FunctionDef):
        documented = _section(ast.get_docstring(node), ("Args:", "Arguments:", "Parameters:"), owner)
        a = node.args
        for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
            annotation = ast.get_source_segment(source, arg.annotation) if arg.annotation else None
            declared[arg.arg] = (annotation, documented.pop(arg.arg, None))
        return declared, documented
    documented = _section(ast.get_docstring(node), ("Attributes:",), owner)
    comments = _comments(source)
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        name, last = stmt.target.id, stmt.end_lineno or stmt.lineno
        text = [comments[n][0] for n in range(stmt.lineno, last + 1) if n in comments and not comments[n][1]]
        n = last + 1
        while text and n in comments and comments[n][1]:  # comment-only lines continue a trailing one
            text.append(comments[n][0])
            n += 1
        comment, entry = " ".join(text).strip() or None, documented.pop(name, None)
        if comment and entry:
            raise ValueError(f"{owner}.{name}: described twice (a comment and an Attributes entry); keep one")
        declared[name] = (ast.get_source_segment(source, stmt.annotation), comment or entry)
    return declared, documented


def _classes(cls: type) -> list[type]:
    """``cls`` and the classes it inherits from that have Python source (not ``object``, ``dict``)."""
    return [c for c in cls.__mro__ if c.__module__ not in ("builtins", "typing")]


def _typeddict_classes(cls: type) -> list[type]:
    """A ``TypedDict`` and the ones it derives from, which only its class statement names. (A
    ``total=False`` TypedDict on a total one is how some keys are required under ``from __future__
    import annotations``: Python 3.11 loses ``Required[...]`` there.)"""
    _, node = _parse(cls)
    module = sys.modules[cls.__module__]
    found = [cls]
    for base in node.bases:
        parent = getattr(module, base.id, None) if isinstance(base, ast.Name) else None
        if isinstance(parent, type) and typing.is_typeddict(parent):
            found += _typeddict_classes(parent)
    return found


def _declarations(classes: list[type], names: list[str]) -> list[Declared]:
    """Each class's declarations, with the docstring entries it gives for inherited ``names``."""
    out = []
    for c in classes:
        declared, extra = _own_fields(c)
        unknown = sorted(set(extra) - set(names))
        if unknown:
            raise ValueError(f"{c.__qualname__}: the docstring describes {unknown}, which are no fields")
        out.append({**declared, **{name: (None, text) for name, text in extra.items()}})
    return out


def field_docs(obj: Any) -> list[FieldDoc]:
    """Every field of a dataclass, key of a ``TypedDict`` or parameter of a function, in order.

    Raises:
        ValueError: a field has no description (or two), or a docstring entry names no field.
    """
    rows = []
    if isinstance(obj, type) and dataclasses.is_dataclass(obj):
        fields = dataclasses.fields(obj)
        declared = _declarations(_classes(obj), [f.name for f in fields])
        for f in fields:
            annotation = next((d[f.name][0] for d in declared if d.get(f.name, (None,))[0]), None)
            description = next((d[f.name][1] for d in declared if d.get(f.name, (None, None))[1]), "")
            if f.default is not dataclasses.MISSING:
                default, is_json = to_json(f.default), True
            elif f.default_factory is not dataclasses.MISSING:
                default, is_json = to_json(f.default_factory()), True
            else:
                default, is_json = REQUIRED, False
            rows.append(FieldDoc(f.name, annotation or str(f.type), default, description, is_json))
    elif isinstance(obj, type) and typing.is_typeddict(obj):
        declared = _declarations(_typeddict_classes(obj), list(obj.__annotations__))
        for name in obj.__annotations__:
            annotation, description = next((d[name] for d in declared if name in d), (None, None))
            default = REQUIRED if name in obj.__required_keys__ else OPTIONAL  # type: ignore[attr-defined]
            rows.append(FieldDoc(name, annotation or "", default, description or "", False))
    elif inspect.isfunction(obj):
        parameters = [
            p
            for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        (declared_here,) = _declarations([obj], [p.name for p in parameters])
        for p in parameters:
            annotation, description = declared_here[p.name]
            default = REQUIRED if p.default is p.empty else to_json(p.default)
            is_json = p.default is not p.empty
            rows.append(FieldDoc(p.name, annotation or "", default, description or "", is_json))
    else:
        raise TypeError(f"{obj!r}: expected a dataclass, a TypedDict or a function")
    missing = [row.name for row in rows if not row.description]
    if missing:
        raise ValueError(
            f"{obj.__module__}.{obj.__qualname__}: no description for {missing} (give each a "
            "trailing '# comment' or an Attributes/Args entry)"
        )
    return rows


def _names(option: str | None) -> list[str] | None:
    return None if option is None else [n.strip() for n in option.split(",") if n.strip()]


def table_rows(
    target: str,
    prefix: str = "",
    fields: str | None = None,
    exclude: str | None = None,
    defaults: str | None = None,
    default_text: str | None = None,
) -> list[FieldDoc]:
    """The rows that one ``recipe-fields`` directive shows (its argument and options as written)."""
    rows = {row.name: row for row in field_docs(resolve(target))}
    shown, left_out = _names(fields), _names(exclude) or []
    for name in [*(shown or []), *left_out]:
        if name not in rows:
            raise ValueError(f"{target} has no field {name!r} (it has {list(rows)})")
    if defaults:
        given = json.loads(defaults) if defaults.lstrip().startswith("{") else resolve(defaults)
        if isinstance(given, dataclasses.Field):
            given = given.default if given.default_factory is dataclasses.MISSING else given.default_factory()
        if not isinstance(given, dict):
            raise TypeError(f":defaults: {defaults} is not a dict")
        for name, value in given.items():
            if name in rows:
                rows[name] = dataclasses.replace(rows[name], default=to_json(value), default_is_json=True)
    for item in filter(str.strip, (default_text or "").split(";")):
        name, _, words = (part.strip() for part in item.partition("="))
        if name not in rows or not words:
            raise ValueError(f":default-text: {item.strip()!r} is not 'field=words' for a field of {target}")
        rows[name] = dataclasses.replace(rows[name], default=words, default_is_json=False)
    names = shown if shown is not None else [name for name in rows if name not in left_out]
    return [dataclasses.replace(rows[name], name=prefix + name) for name in names]


def block_rows(target: str, options: dict[str, str]) -> list[FieldDoc]:
    """:func:`table_rows` for a directive's options as the page spells them (``default-text``)."""
    return table_rows(target, **{key.replace("-", "_"): value for key, value in options.items()})


def directive_blocks(markdown: str) -> list[tuple[str, dict[str, str]]]:
    """The ``recipe-fields`` directives of a MyST page, in order: (argument, {option: value})."""
    fence = re.compile(r"^(`{3,}|:{3,})\{recipe-fields\}\s+(\S+)\s*\n(.*?)^\1\s*$", re.M | re.S)
    return [
        (m.group(2), dict(re.findall(r"^:([\w-]+):[ \t]*(.*?)[ \t]*$", m.group(3), re.M)))
        for m in fence.finditer(markdown)
    ]


_INLINE = re.compile(r"(?::[\w:-]+:)?(``?)(.+?)\1")  # ``code``, `code`, :role:`target`


def _inline(text: str, nodes: Any) -> list[Any]:
    """A description's ``code``, `code` and :role:`~a.b.Name` as literals, the rest as text."""
    out: list[Any] = []
    at = 0
    for match in _INLINE.finditer(text):
        code = match.group(2)
        if match.group(0).startswith(":") and code.startswith("~"):
            code = code.rsplit(".", 1)[-1]
        out += [nodes.Text(text[at : match.start()]), nodes.literal(code, code)]
        at = match.end()
    return [*out, nodes.Text(text[at:])]


def _table(rows: list[FieldDoc], nodes: Any) -> Any:
    """Field | Type | Default | Description, as docutils nodes (no ids)."""
    table = nodes.table(classes=["recipe-fields", "colwidths-auto"])
    group = nodes.tgroup(cols=4)
    table += group
    group += [nodes.colspec(colwidth=1) for _ in range(4)]

    def row(cells: list[list[Any]]) -> Any:
        line = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *cell)
            line += entry
        return line

    head, body = nodes.thead(), nodes.tbody()
    head += row([[nodes.Text(title)] for title in ("Field", "Type", "Default", "Description")])
    for r in rows:
        default = (nodes.literal if r.default_is_json else nodes.emphasis)(r.default, r.default)
        body += row(
            [
                [nodes.literal(r.name, r.name)],
                [nodes.literal(r.type, r.type)] if r.type else [],
                [default],
                _inline(r.description, nodes),
            ]
        )
    group += [head, body]
    return table


def _directive() -> type:
    from docutils import nodes
    from docutils.parsers.rst import directives
    from sphinx.util.docutils import SphinxDirective

    class RecipeFields(SphinxDirective):
        """``{recipe-fields} dotted.path``: the table of that class's (or function's) fields."""

        required_arguments = 1
        option_spec: typing.ClassVar[dict[str, Callable[[str], Any]]] = dict.fromkeys(
            ("prefix", "fields", "exclude", "defaults", "default-text"), directives.unchanged
        )

        def run(self) -> list[Any]:
            target = self.arguments[0]
            try:
                rows = block_rows(target, self.options)
                obj = resolve(target)
            except (ImportError, AttributeError, KeyError, TypeError, ValueError) as e:
                where = "" if target in str(e) else f" {target}"
                raise self.error(f"recipe-fields{where}: {e}") from None
            for c in _classes(obj) if isinstance(obj, type) else [obj]:
                path = inspect.getsourcefile(c)
                if path:
                    self.env.note_dependency(path)  # a changed comment rebuilds the page
            out = [_table(rows, nodes)]
            metrics = getattr(obj, "METRICS", None)
            if isinstance(obj, type) and metrics:
                para = nodes.paragraph(
                    "",
                    "",
                    nodes.literal("train.best_metric", "train.best_metric"),
                    nodes.Text(" is one of this task's evaluation metrics: "),
                )
                for i, metric in enumerate(metrics):
                    para += [nodes.Text(", ")] if i else []
                    para += nodes.literal(json.dumps(metric), json.dumps(metric))
                para += nodes.Text(".")
                out.append(para)
            return out

    return RecipeFields


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("recipe-fields", _directive())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
