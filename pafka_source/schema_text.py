"""Spark's DDL-like schema strings (``"id long, url string"``) as Arrow schemas, without Spark.

:func:`parse_schema` gives the Arrow schema a Spark write of the same schema would create
(``types.topic_schema_from_spark``): ``timestamp`` is microseconds in UTC, arrays, maps and
structs are nullable inside as Spark makes them, ``NOT NULL`` makes a column non-nullable.
:func:`schema_text` writes an Arrow schema back in the same words. The ``pafka`` command
imports this module, so it never imports PySpark.
"""

from __future__ import annotations

import re

import pyarrow as pa

from tier_store import InvalidArgument

# Spark's names for each simple type, with their aliases.
_SIMPLE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "bool": pa.bool_(),
    "byte": pa.int8(), "tinyint": pa.int8(),
    "short": pa.int16(), "smallint": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(),
    "long": pa.int64(), "bigint": pa.int64(),
    "float": pa.float32(), "real": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(), "binary": pa.binary(), "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = ("decimal", "dec", "numeric")
_CHARS = ("varchar", "char")  # Spark keeps them as strings in a DataFrame's schema

ALLOWED_TYPES = ("long/bigint, int/integer, short/smallint, byte/tinyint, float/real, double, "
                 "string, binary, boolean, date, timestamp, timestamp_ntz, decimal(p,s), "
                 "array<T>, map<K,V>, struct<name: T, ...>")

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|(\S))")


class _Parser:
    """Recursive descent over the tokens of one schema string."""

    def __init__(self, text: str):
        self.text = text
        self.column = ""  # the column being parsed, for errors
        self.tokens: list[tuple[str, str, int]] = []  # (kind, value, position)
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:  # only trailing blanks are left
                break
            quoted, word, number, other = m.groups()
            start = m.start(m.lastindex or 0)
            if quoted is not None:
                self.tokens.append(("name", quoted[1:-1].replace("``", "`"), start))
            elif word is not None:
                self.tokens.append(("word", word, start))
            elif number is not None:
                self.tokens.append(("number", number, start))
            else:
                if other == "`":
                    self.fail(start, "a backquoted name is not closed")
                self.tokens.append(("symbol", other, start))
            pos = m.end()
        self.at = 0

    def fail(self, pos: int, problem: str) -> None:
        where = f"column {self.column!r}" if self.column else "the schema"
        near = self.text[pos:pos + 20]
        at = f"at character {pos + 1} ({near!r})" if near.strip() else "at the end"
        raise InvalidArgument(f"schema {self.text!r}: {where} {at}: {problem}; types "
                              f"allowed: {ALLOWED_TYPES}")

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "", len(self.text))

    def take(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.at += 1
        return tok

    def expect(self, symbol: str) -> None:
        kind, value, pos = self.take()
        if (kind, value) != ("symbol", symbol):
            self.fail(pos, f"expected {symbol!r}, found {value or 'the end'!r}")

    def word_is(self, *words: str) -> bool:
        kind, value, _ = self.peek()
        return kind == "word" and value.lower() in words

    def fields(self, close: str | None) -> list[pa.Field]:
        """``name [:] type [NOT NULL], ...`` up to ``close`` (None: the end)."""
        out: list[pa.Field] = []
        outer = self.column
        while True:
            kind, name, pos = self.take()
            if kind not in ("word", "name"):
                self.fail(pos, f"expected a column name, found {name or 'the end'!r}")
            self.column = f"{outer}.{name}" if outer else name
            if any(f.name == name for f in out):
                self.fail(pos, f"column {name!r} appears twice")
            if self.peek()[:2] == ("symbol", ":"):
                self.take()
            type_ = self.type_()
            nullable = True
            if self.word_is("not"):
                self.take()
                kind, value, pos = self.take()
                if value.lower() != "null":
                    self.fail(pos, "expected NULL after NOT")
                nullable = False
            if self.word_is("comment"):
                self.fail(self.peek()[2], "COMMENT is not kept by a topic's schema; remove it")
            out.append(pa.field(name, type_, nullable=nullable))
            kind, value, pos = self.peek()
            if (kind, value) == ("symbol", ","):
                self.take()
                continue
            if close is None and kind == "end" or (kind, value) == ("symbol", close):
                self.take()
                self.column = outer
                return out
            self.fail(pos, f"expected ',' or {close or 'the end'!r} after the column's type, "
                           f"found {value!r}")

    def type_(self) -> pa.DataType:
        kind, value, pos = self.take()
        word = value.lower()
        if kind != "word":
            self.fail(pos, f"expected a type, found {value or 'the end'!r}")
        if word in _SIMPLE:
            return _SIMPLE[word]
        if word in _DECIMAL:
            precision, scale = 10, 0  # Spark's default decimal
            if self.peek()[:2] == ("symbol", "("):
                self.take()
                precision = self.number(1, 38, "precision")
                if self.peek()[:2] == ("symbol", ","):
                    self.take()
                    scale = self.number(0, precision, "scale (at most the precision)")
                self.expect(")")
            return pa.decimal128(precision, scale)
        if word in _CHARS:
            self.expect("(")
            self.number(1, 2**31 - 1, "length")
            self.expect(")")
            return pa.string()
        if word == "array":
            self.expect("<")
            item = self.type_()
            self.expect(">")
            return pa.list_(pa.field("element", item, nullable=True))
        if word == "map":
            self.expect("<")
            key = self.type_()
            self.expect(",")
            value_type = self.type_()
            self.expect(">")
            return pa.map_(pa.field("key", key, nullable=False),
                           pa.field("value", value_type, nullable=True))
        if word == "struct":
            self.expect("<")
            if self.peek()[:2] == ("symbol", ">"):
                self.take()
                return pa.struct([])
            return pa.struct(self.fields(">"))
        self.fail(pos, f"unknown type {value!r}")
        raise AssertionError  # fail() raised

    def number(self, low: int, high: int, what: str) -> int:
        kind, value, pos = self.take()
        if kind != "number" or not low <= int(value) <= high:
            self.fail(pos, f"expected a {what} from {low} to {high}, found {value or 'the end'!r}")
        return int(value)


def parse_schema(text: str) -> pa.Schema:
    """The Arrow schema of Spark DDL text such as ``"id long, url string NOT NULL"`` (or
    ``"struct<id: long, ...>"``); :class:`InvalidArgument` names the column, the place in the
    text and the types allowed."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgument("the schema is empty: give columns as \"name type, ...\", e.g. "
                              f"\"id long, url string\"; types allowed: {ALLOWED_TYPES}")
    p = _Parser(text)
    if p.word_is("struct") and p.at + 1 < len(p.tokens) and p.tokens[1][1] == "<":
        p.take()
        p.take()
        fields = p.fields(">")
        kind, value, pos = p.take()
        if kind != "end":
            p.fail(pos, f"unexpected {value!r} after the struct")
    else:
        fields = p.fields(None)
    return pa.schema(fields)


# -- back to text ------------------------------------------------------------------------------
def _name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else \
        "`" + name.replace("`", "``") + "`"


def type_text(t: pa.DataType) -> str:
    """Spark's name of Arrow type ``t`` (Arrow's own for a type Spark has no name for)."""
    for name in ("boolean", "tinyint", "smallint", "int", "bigint", "float", "double", "string",
                 "binary", "date", "timestamp", "timestamp_ntz"):
        if _SIMPLE[name].equals(t):
            return name
    if pa.types.is_large_string(t):
        return "string"
    if pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{type_text(t.value_type)}>"
    if pa.types.is_map(t):
        return f"map<{type_text(t.key_type)},{type_text(t.item_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(_field_text(t.field(i), ": ")
                                     for i in range(t.num_fields)) + ">"
    return str(t)


def _field_text(f: pa.Field, sep: str = " ") -> str:
    return f"{_name(f.name)}{sep}{type_text(f.type)}" + ("" if f.nullable else " NOT NULL")


def schema_text(schema: pa.Schema) -> str:
    """``schema`` as Spark DDL text, as :func:`parse_schema` reads it."""
    return ", ".join(_field_text(f) for f in schema)


__all__ = ["ALLOWED_TYPES", "parse_schema", "schema_text", "type_text"]
