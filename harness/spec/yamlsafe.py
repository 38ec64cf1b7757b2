"""YAML as specs and the known-differences file are read: yaml.SafeLoader (nothing is
constructed but plain data), refusing anchors and aliases, duplicate keys and deep nesting."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

MAX_DEPTH = 64  # nesting of a spec document (the shipped specs reach 5)


class Refused(Exception):
    """YAML that parses but that a spec may not use, at a line."""

    def __init__(self, mark: yaml.Mark, message: str):
        super().__init__(f"line {mark.line + 1}: {message}")


class SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader that also refuses anchors and aliases (a few lines of aliases
    expand to billions of nodes), duplicate keys (the last one silently won) and nesting
    deeper than MAX_DEPTH (the composer recurses: 20,000 '[' overflowed the stack)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if getattr(event, "anchor", None) is not None:  # an alias, or a node that defines one
            sigil = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise Refused(event.start_mark, f"YAML anchors and aliases are not allowed in a spec ({sigil}{event.anchor})")
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<:`, merged by the safe constructor
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the safe constructor refuses it
            if key in seen:
                raise Refused(key_node.start_mark, f"duplicate key {key!r}")
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_yaml(text: str) -> Any:
    """The document, or Refused (with its line) or yaml.YAMLError / ValueError."""
    return yaml.load(text, Loader=SpecLoader)  # noqa: S506 (a safe loader)
