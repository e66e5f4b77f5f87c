"""Reading manifests: multi-document YAML with the line of every key, and errors that name
the file, the document and the line."""
from dataclasses import dataclass, field
from typing import Any

import math
import re

import yaml

Path = tuple


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 numbers: 52:54:00:12:34:56 is a MAC address, not a base-60 integer."""


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


class ManifestError(Exception):
    def __init__(self, file: str, document: int | None, line: int | None, message: str):
        self.file, self.document, self.line, self.message = file, document, line, message
        where = file
        if document is not None:
            where += f": document {document}"
        if line is not None:
            where += f" (line {line})"
        super().__init__(f"{where}: {message}")


class Invalid(Exception):
    """A problem at a path inside one document; the caller adds file, document and line."""

    def __init__(self, path: Path, message: str):
        self.path, self.message = tuple(path), message
        super().__init__(message)


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

    def error(self, exc: Invalid) -> ManifestError:
        prefix = f"{dotted(exc.path)}: " if exc.path else ""
        return ManifestError(self.file, self.index, self.line_of(exc.path), prefix + exc.message)


def load_documents(text: str, file: str, *, line_offset: int = 0, index: int | None = None) -> list[Document]:
    """Parse every document of a YAML stream; empty documents are skipped."""
    loader = Loader(text)
    docs = []
    position = 0
    try:
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
        line = mark.line + 1 + line_offset if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        document = index or (text.count("\n---", 0, mark.index if mark else 0) + 1 if mark else None)
        raise ManifestError(file, document, line, f"not valid YAML: {problem}") from None
    finally:
        loader.dispose()
    return docs


def _walk(node, path: Path, lines: dict, file: str, index: int, offset: int) -> None:
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            key = key_node.value
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
