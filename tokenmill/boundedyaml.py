"""YAML read with limits, for files someone else wrote (dataset cards) and our own configs.

``yaml.safe_load`` builds no objects but plain ones, yet a few hundred bytes of anchors and
aliases (a "billion laughs": ``a1: &a1 [*a0, *a0, ...]``, each level ten times the last)
stand for 10^8 strings or more: walking or printing the result exhausts memory. The
:class:`BoundedLoader` counts what the document stands for *with every alias expanded*
while it composes the node graph, before anything is constructed, and refuses a document
over :data:`MAX_EXPANDED_NODES` nodes (a long string weighs one
node per 100 characters), nested deeper than :data:`MAX_DEPTH`, or holding a
recursive alias. Its cost is linear in the document's size (each node is measured once).
A mapping that names one key twice is refused too: PyYAML keeps the last silently, so a
datamix (or a card's ``license:``) could say two things and be read as one.
A top-level helper: it imports nothing from tokenmill's packages.
"""

from __future__ import annotations

from typing import Any

import yaml

#: Most nodes a document may stand for once every alias is expanded.
MAX_EXPANDED_NODES = 1_000_000
#: Deepest nesting of sequences and mappings.
MAX_DEPTH = 200


class YamlLimitError(ValueError):
    """A YAML document stands for more than the limits allow (size, aliases, depth)."""


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses documents over the limits (:class:`YamlLimitError`)
    instead of building them."""

    max_nodes = MAX_EXPANDED_NODES
    max_depth = MAX_DEPTH

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise YamlLimitError(f"nested deeper than {self.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        _expanded_size(node, self.max_nodes)
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # keys a merge brings in may be overridden, as YAML allows
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (lines {first} and "
                    f"{key_node.start_mark.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Nodes under ``root`` counting each alias as a full copy of its anchor's node.

    Shared nodes are measured once (memoised by identity), so this is linear in the
    composed graph; a node reached again while it is being measured is a recursive alias.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            total = _own_size(node) + sum(sizes[id(c)] for c in _children(node))
            if total > limit:
                raise YamlLimitError(f"expands to more than {limit:,} nodes through its "
                                     "aliases")
            sizes[key] = total
            active.discard(key)
            continue
        if key in sizes:
            continue
        if key in active:
            raise YamlLimitError("holds a recursive alias (a value that contains itself)")
        active.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)
    return sizes[id(root)]


def _own_size(node: yaml.Node) -> int:
    """1 per node, and a long scalar weighs as one node per 100 characters (a megabyte
    string aliased a thousand times is a gigabyte)."""
    return 1 + (len(node.value) // 100 if isinstance(node, yaml.ScalarNode) else 0)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load(text: str, what: str) -> Any:
    """Parse one YAML document of ``text`` with :class:`BoundedLoader`.

    Args:
        text: the YAML source.
        what: the file it came from, for the error (``"data/README.md"``).

    Raises:
        YamlLimitError: ``"WHAT: YAML too large once expanded: ..."`` (one line).
        yaml.YAMLError: the text is not YAML.
    """
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 (a SafeLoader subclass)
    except YamlLimitError as e:
        raise YamlLimitError(f"{what}: YAML refused, too large or too deep once its "
                             f"aliases are expanded: {e}") from None
    except RecursionError:
        raise YamlLimitError(f"{what}: YAML refused: nested too deep") from None
