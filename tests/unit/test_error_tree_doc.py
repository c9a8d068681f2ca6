"""gateway/errors.py's module docstring draws the GatewayError tree: the drawing is the hierarchy.

Each line of the drawing is ``<indent><branches><Name>  <http>  <grpc>  <what>``; the branches
(``│   `` / ``    `` per ancestor, then ``├── `` or ``└── ``) give the depth, so a line's parent
is the nearest line above it one level up. Every GatewayError subclass defined in gateway.errors
must be drawn exactly once, under its real direct parent, with the HTTP status and gRPC code its
instances carry ("any" for one whose constructor takes them); the exceptions there that are not
GatewayErrors are named below the tree as such.
"""
from __future__ import annotations

import inspect
import re

import gateway.errors as errors
from gateway.errors import GatewayError

ROOT = "GatewayError"
# After the docstring's own indent: the ancestors' continuation columns, the branch, the name,
# the HTTP status and the gRPC code (or "any"), then free text.
LINE = re.compile(r"(?P<rails>(?:│   |    )*)(?P<branch>├── |└── )(?P<name>[A-Za-z]\w*)\s+"
                  r"(?P<http>\d{3}|any)\s+(?P<grpc>[A-Z][A-Z_]*|any)(?:\s+\S.*)?")


class Node:
    def __init__(self, name: str, depth: int, parent: str | None, http: str, grpc: str, last: bool,
                 rails: str) -> None:
        self.name, self.depth, self.parent, self.http, self.grpc = name, depth, parent, http, grpc
        self.last = last  # drawn with '└── '
        self.rails = rails  # one '│   ' or '    ' per ancestor below the root


def _drawing() -> tuple[list[Node], str]:
    """The drawn nodes (root first), and the docstring's text after the drawing."""
    doc = errors.__doc__
    assert doc is not None
    lines = doc.splitlines()
    roots = [i for i, line in enumerate(lines) if line.strip() == ROOT]
    assert len(roots) == 1, f"the docstring should have one line that is just {ROOT!r}"
    at = roots[0]
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    nodes = [Node(ROOT, 0, None, "", "", True, "")]
    stack = [nodes[0]]  # stack[d]: the latest node drawn at depth d
    i = at + 1
    while i < len(lines) and lines[i].strip():
        line = lines[i]
        assert line.startswith(indent), f"tree line not indented as its root: {line!r}"
        m = LINE.fullmatch(line[len(indent):].rstrip())
        assert m, f"tree line not of the form '<branches>Name  http  grpc  what': {line!r}"
        depth = len(m["rails"]) // 4 + 1
        assert depth <= len(stack), f"{m['name']} is drawn deeper than under any class above it"
        del stack[depth:]
        nodes.append(Node(m["name"], depth, stack[depth - 1].name, m["http"], m["grpc"], m["branch"] == "└── ",
                          m["rails"]))
        stack.append(nodes[-1])
        i += 1
    return nodes, "\n".join(lines[i:])


def _classes() -> dict[str, type[BaseException]]:
    return {name: obj for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}


def _status(cls: type[GatewayError]) -> tuple[str, str]:
    params = inspect.signature(cls.__init__).parameters
    http = "any" if "http_status" in params else str(cls.http_status)
    grpc = "any" if "grpc_code" in params else cls.grpc_code
    return http, grpc


def test_every_gateway_error_is_drawn_once_under_its_parent_with_its_codes():
    nodes, _ = _drawing()
    names = [n.name for n in nodes]
    assert len(names) == len(set(names)), f"drawn more than once: {sorted({n for n in names if names.count(n) > 1})}"
    drawn = {n.name: n for n in nodes}
    real = {name: cls for name, cls in _classes().items() if issubclass(cls, GatewayError)}
    assert set(drawn) == set(real), (f"missing from the drawing: {sorted(set(real) - set(drawn))}; "
                                     f"drawn but no GatewayError here: {sorted(set(drawn) - set(real))}")
    for name, cls in real.items():
        if cls is GatewayError:
            continue
        node = drawn[name]
        (base,) = cls.__bases__
        assert node.parent == base.__name__, f"{name} is drawn under {node.parent}, its parent is {base.__name__}"
        assert (node.http, node.grpc) == _status(cls), f"{name}: drawn {node.http} {node.grpc}, is {_status(cls)}"


def test_branches_mark_the_last_child():
    """'└── ' marks a parent's last child; below a class, a '│   ' column runs on exactly while
    that class has siblings still to come."""
    nodes, _ = _drawing()
    ancestors: list[Node] = []  # ancestors[d - 1]: the node at depth d above the current line
    for i, node in enumerate(nodes[1:], 1):
        del ancestors[node.depth - 1:]
        want = "".join("    " if a.last else "│   " for a in ancestors)
        assert node.rails == want, f"{node.name}: rails {node.rails!r}, its ancestors' siblings want {want!r}"
        ancestors.append(node)
        later_sibling = False
        for after in nodes[i + 1:]:
            if after.depth < node.depth:
                break
            if after.depth == node.depth and after.parent == node.parent:
                later_sibling = True
                break
        assert node.last is not later_sibling, f"{node.name}: '└── ' must mark exactly a parent's last child"


def test_exceptions_that_are_not_gateway_errors_are_named_as_such():
    _, after = _drawing()
    others = sorted(name for name, cls in _classes().items() if not issubclass(cls, GatewayError))
    assert others, "gateway.errors defines exceptions that are not GatewayErrors (ListenError, ConfigError)"
    assert "not gatewayerror" in after.lower(), "below the tree, say which exceptions are not GatewayErrors"
    for name in others:
        assert re.search(rf"\b{name}\b", after), f"{name} is not a GatewayError; say so below the tree"


def test_the_parser_sees_a_misplaced_class():
    """The drawing's parser itself: a line moved one level up gets the grandparent."""
    line = "    │   ├── LimitExceeded     400  INVALID_ARGUMENT   text"
    m = LINE.fullmatch(line[4:])
    assert m and len(m["rails"]) // 4 + 1 == 2 and m["name"] == "LimitExceeded"
    m = LINE.fullmatch("├── LimitExceeded     400  INVALID_ARGUMENT   text")
    assert m and len(m["rails"]) // 4 + 1 == 1
