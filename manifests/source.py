"""Reading manifests: multi-document YAML with the line of every key, and errors that name
the file, the document and the line. What a text may cost is bounded while it is composed, before any
Python object is built: nesting depth, and nodes with every alias expanded (an "alias bomb" of a few hundred
bytes would otherwise stand for billions of nodes)."""
import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from core.errors import LocatedError

Path = tuple

MAX_DEPTH = 100  # nesting levels; real manifests use about 10
MAX_NODES = 250_000  # per file, aliases expanded: about 4,000 BareMetalHosts with their Secrets


class LimitExceeded(yaml.MarkedYAMLError):
    """A text that is valid YAML but costs more than the console reads."""


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 numbers (52:54:00:12:34:56 is a MAC address, not a base-60 integer) and
    limits: nesting depth, and nodes counted with each alias expanded, as Kubernetes' YAML reader refuses
    "excessive aliasing". PyYAML's composer gives an alias the anchored node itself, so composing costs
    nothing; the cost comes later, in whatever walks the data. Here each anchor's expanded size is known
    when its node is complete, and an alias adds it to the count."""

    def __init__(self, stream):
        super().__init__(stream)
        self.nodes = 0  # in the whole stream
        self.depth = 0
        self.sizes: dict[str, int] = {}  # anchor → nodes it stands for, aliases in it expanded

    def fetch_flow_collection_start(self, TokenClass):
        # Refused while scanning: PyYAML's scanner looks up to 1024 characters ahead, at a cost that grows
        # with the flow depth, before the composer sees the first "[".
        if self.flow_level >= MAX_DEPTH:
            raise LimitExceeded(None, None, f"nested deeper than {MAX_DEPTH} levels", self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def compose_document(self):
        self.sizes = {}  # anchors are per document
        return super().compose_document()

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors and event.anchor not in self.sizes:
                raise LimitExceeded(None, None, f"alias *{event.anchor} is inside its own anchor (a recursive node)",
                                    event.start_mark)
            self._count(self.sizes.get(event.anchor, 0), event.start_mark, alias=True)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise LimitExceeded(None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        before = self.nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if event.anchor is not None:
            self.sizes[event.anchor] = self.nodes - before
        return node

    def _count(self, n: int, mark, alias: bool = False) -> None:
        self.nodes += n
        if self.nodes > MAX_NODES:
            problem = (f"excessive aliasing: the aliases expand to more than {MAX_NODES} nodes" if alias
                       else f"more than {MAX_NODES} nodes")
            raise LimitExceeded(None, None, problem, mark)


Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?([0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                             list("-+0123456789"))
Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


class ManifestError(LocatedError):
    """A manifest that cannot be applied: file, document and line, and why."""


class Invalid(Exception):
    """A problem at a path inside one document; the caller adds file, document and line. `more`: further
    problems of the same document, reported with it."""

    def __init__(self, path: Path, message: str, more: "list[Invalid]" = ()):
        self.path, self.message, self.more = tuple(path), message, list(more)
        super().__init__(message)

    @classmethod
    def all(cls, problems: "list[Invalid]") -> "Invalid":
        """One Invalid that reports every one of `problems` (each with its own `more`), in order."""
        flat = [p for problem in problems for p in (problem, *problem.more)]
        return cls(flat[0].path, flat[0].message, more=flat[1:])

    def problems(self) -> "list[Invalid]":
        return [self, *self.more]


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass
class Document:
    file: str
    index: int  # 1-based position in its file
    line: int  # 1-based line where it starts
    data: Any
    lines: dict = field(default_factory=dict)  # path → 1-based line
    line_offset: int = 0

    def line_of(self, path: Path) -> int:
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path] + self.line_offset
            path = path[:-1]
        return self.line + self.line_offset

    def error(self, exc: Invalid, outer: Path = ()) -> ManifestError:
        """`outer`: the path of this document inside another (a vcluster.yaml inside a VirtualClusterInstance),
        named in the messages; lines are this document's own."""
        located = [(self.line_of(p.path), f"{dotted(outer + p.path)}: {p.message}" if outer + p.path else p.message)
                   for p in exc.problems()]
        return ManifestError(self.file, self.index, *located[0], more=located[1:])


def read_sources(names: list[str], stdin) -> list[tuple[str, str]]:
    """The files named on a command line (`-` is standard input) as [(name, text), ...], for apply and delete.
    Raises OSError with the file's name in `filename`."""
    sources = []
    for name in names:
        if name == "-":
            sources.append((name, stdin.read()))
            continue
        with open(name, encoding="utf-8") as fh:
            sources.append((name, fh.read()))
    return sources


def load_documents(text: str, file: str, *, line_offset: int = 0, index: int | None = None) -> list[Document]:
    """Parse every document of a YAML stream; empty documents are skipped."""
    loader = None
    docs = []
    position = 0
    try:
        loader = Loader(text)  # its reader refuses a NUL or another control character at once
        while loader.check_node():
            node = loader.get_node()
            position += 1
            if node is None:
                continue
            lines: dict = {}
            _walk(node, (), lines, file, index or position, line_offset)
            data = loader.construct_document(node)
            if data is None:
                continue
            docs.append(Document(file=file, index=index or position, line=node.start_mark.line + 1, data=data,
                                 lines=lines, line_offset=line_offset))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        at = mark.index if mark else getattr(exc, "position", None)  # a ReaderError (a NUL...) has a position
        if mark:
            line = mark.line + 1 + line_offset
        else:
            line = text.count("\n", 0, at) + 1 + line_offset if at is not None else None
        if isinstance(exc, yaml.reader.ReaderError):
            problem = f"unacceptable character #x{exc.character:04x}"
        else:
            problem = getattr(exc, "problem", None) or str(exc)
        document = index or (text.count("\n---", 0, at) + 1 if at is not None else None)
        message = problem if isinstance(exc, LimitExceeded) else f"not valid YAML: {problem}"
        raise ManifestError(file, document, line, message) from None
    finally:
        if loader is not None:
            loader.dispose()
    return docs


def load_value(text: str, file: str = "value") -> Any:
    """One YAML document (a console form's mapping or list), read as manifests are, within the same limits;
    None when the text holds none."""
    docs = load_documents(text, file)
    if len(docs) > 1:
        raise ManifestError(file, docs[1].index, docs[1].line, "one YAML document expected")
    return docs[0].data if docs else None


def _walk(node, path: Path, lines: dict, file: str, index: int, offset: int) -> None:
    if isinstance(node, yaml.ScalarNode) and "\x00" in node.value:
        # PostgreSQL stores no NUL in text or jsonb; YAML writes one as "\0" or "\x00".
        raise ManifestError(file, index, node.start_mark.line + 1 + offset,
                            f"{dotted(path) or 'the document'}: contains a NUL character (\\0)")
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if isinstance(key, str) and "\x00" in key:
                raise ManifestError(file, index, key_node.start_mark.line + 1 + offset,
                                    f"{dotted(path) or 'the document'}: a key contains a NUL character (\\0)")
            if key in seen:
                raise ManifestError(file, index, key_node.start_mark.line + 1 + offset,
                                    f"{dotted(path + (key,))}: duplicate key")
            seen.add(key)
            lines[path + (key,)] = key_node.start_mark.line + 1
            _walk(value_node, path + (key,), lines, file, index, offset)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, file, index, offset)


class Reader:
    """Typed access to a mapping inside a document, raising Invalid with the exact path."""

    def __init__(self, value: Any, path: Path = ()):
        self.value, self.path = value, tuple(path)

    def mapping(self, allowed: set[str] | None = None, required: tuple[str, ...] = ()) -> "Reader":
        if not isinstance(self.value, dict):
            raise Invalid(self.path, f"must be a mapping, not {_kind(self.value)}")
        if allowed is not None:
            unknown = sorted(set(map(str, self.value)) - allowed)
            if unknown:
                raise Invalid(self.path + (unknown[0],), f"unknown field; expected one of {', '.join(sorted(allowed))}")
        for key in required:
            if self.value.get(key) in (None, ""):
                raise Invalid(self.path + (key,), "required field is missing")
        return self

    def has(self, key: str) -> bool:
        return isinstance(self.value, dict) and self.value.get(key) is not None

    def child(self, key: str, default: Any = None) -> "Reader":
        value = self.value.get(key) if isinstance(self.value, dict) else None
        return Reader(default if value is None else value, self.path + (key,))

    def items(self) -> list["Reader"]:
        if not isinstance(self.value, list):
            raise Invalid(self.path, f"must be a list, not {_kind(self.value)}")
        return [Reader(v, self.path + (i,)) for i, v in enumerate(self.value)]

    def str(self, key: str, default: str = "", required: bool = False) -> str:
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None or value == "":
            if required:
                raise Invalid(self.path + (key,), "required field is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise Invalid(self.path + (key,), f"must be a string, not {_kind(value)}")
        return str(value)

    def int(self, key: str, default: int | None = None, required: bool = False) -> int | None:
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None:
            if required:
                raise Invalid(self.path + (key,), "required field is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise Invalid(self.path + (key,), f"must be an integer, not {_kind(value)}")
        return value

    def number(self, key: str, default: "float | None" = None) -> "int | float | None":
        """An integer or a decimal number, finite (YAML's .inf and .nan are not numbers here)."""
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Invalid(self.path + (key,), f"must be a number, not {_kind(value)}")
        if not math.isfinite(value):
            raise Invalid(self.path + (key,), f"must be a finite number, not {value}")
        return value

    def choice(self, key: str, choices, default: str = "") -> str:
        value = self.str(key, default=default)
        if value and value not in choices:
            raise Invalid(self.path + (key,), f"{value!r} is not one of {', '.join(choices)}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None:
            return default
        if not isinstance(value, bool):
            raise Invalid(self.path + (key,), f"must be true or false, not {_kind(value)}")
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise Invalid(self.path + (key,), f"must be a mapping of strings, not {_kind(value)}")
        out = {}
        for k, v in value.items():
            if isinstance(v, bool) or v is None or not isinstance(v, (str, int, float)):
                raise Invalid(self.path + (key, k), f"must be a string, not {_kind(v)}")
            out[str(k)] = str(v)
        return out

    def list(self, key: str) -> list:
        value = self.value.get(key) if isinstance(self.value, dict) else None
        if value is None:
            return []
        if not isinstance(value, list):
            raise Invalid(self.path + (key,), f"must be a list, not {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)
