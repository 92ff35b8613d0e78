"""Reads the subset of the NATS server configuration format that deploy/'s nats.conf files use.

    parse(text) -> dict        blocks `name { ... }`, lists `[ ... ]`, `key: value` (or `=`, or a
                               space), `#` comments; entries end at a newline, `,` or `;`
    size_bytes(value) -> int   8MB, 9GB, 512Mi (binary), 1M, 1000K (decimal), or a plain number
    duration_seconds(value)    30s, 2m, 1h, 500ms, or a number of seconds

Scalars stay strings except booleans and plain integers; sizes and durations are converted by
the helpers, with NATS's own units (checked against nats-server 2.9.10: `1M` is 1000000 bytes,
`1MB`, `1Mi` and `1MiB` are 1048576). Anything outside the subset raises ValueError, so that a
check never reads a file it only half understands.
"""

from __future__ import annotations

import re
from typing import Any

_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(I?B?|IB)", re.IGNORECASE)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_BARE_END = "\n,;#}]"


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def error(self, message: str) -> ValueError:
        line = self.text.count("\n", 0, self.at) + 1
        return ValueError(f"line {line}: {message}")

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def skip(self, newlines: bool) -> None:
        """Skips blanks and comments (and newlines and separators when asked)."""
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == "#":
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            elif char in " \t\r" or (newlines and char in "\n,;"):
                self.at += 1
            else:
                return

    def key(self) -> str:
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*").match(self.text, self.at)
        if not match:
            raise self.error(f"expected a key at {self.text[self.at:self.at + 20]!r}")
        self.at = match.end()
        return match.group()

    def block(self, closing: str) -> dict:
        entries: dict[str, Any] = {}
        while True:
            self.skip(newlines=True)
            if self.peek() == closing:
                self.at += 1
                return entries
            if not self.peek():
                raise self.error(f"missing {closing!r}")
            key = self.key()
            self.skip(newlines=False)
            if self.peek() in ":=":
                self.at += 1
                self.skip(newlines=False)
            if key in entries:
                raise self.error(f"{key} set twice")
            entries[key] = self.value()

    def items(self) -> list:
        values = []
        while True:
            self.skip(newlines=True)
            if self.peek() == "]":
                self.at += 1
                return values
            if not self.peek():
                raise self.error("missing ']'")
            values.append(self.value())

    def value(self) -> Any:
        char = self.peek()
        if char == "{":
            self.at += 1
            return self.block("}")
        if char == "[":
            self.at += 1
            return self.items()
        if char in "\"'":
            end = self.text.find(char, self.at + 1)
            if end < 0:
                raise self.error("unterminated string")
            value, self.at = self.text[self.at + 1:end], end + 1
            return value
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in _BARE_END:
            self.at += 1
        word = self.text[start:self.at].strip()
        if not word:
            raise self.error("expected a value")
        if word.lower() in ("true", "false"):
            return word.lower() == "true"
        return int(word) if word.isdigit() else word


def parse(text: str) -> dict:
    reader = _Reader(text + "\n}")
    entries = reader.block("}")
    if reader.at != len(reader.text):
        raise reader.error("unmatched '}'")
    return entries


def size_bytes(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = _SIZE.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a NATS size")
    number, unit, binary = int(match.group(1)), match.group(2).upper(), match.group(3)
    power = " KMGT".index(unit) if unit else 0
    return number * (1024 if binary or not unit else 1000) ** power


def duration_seconds(value: Any) -> float:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    match = _DURATION.fullmatch(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a NATS duration")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:]:
        with open(path) as file:
            print(path, parse(file.read()))
