"""No import circles in `easyrl/`.

Every module under easyrl/ is parsed (not imported); its imports are collected wherever they
stand, module level or deferred inside a function, except under `if TYPE_CHECKING:` (never run).
An import names the module it loads: `from easyrl.a import b` is `easyrl.a.b` where that is a
module, else `easyrl.a`; relative imports are resolved against the importing package. An
import of the module's own package (`easyrl.algorithms.ppo.agent` importing
`easyrl.algorithms.ppo`) is an edge like any other: with the package's `__init__` importing
the module back (even deferred, in `build`), which module finishes loading first depends on
which one a caller imports first. A circle is a strongly connected component of the graph;
the test names one circle of each, and the component's modules.
"""

import ast
from collections import deque
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "easyrl"


def _module_names(root: Path) -> dict[str, Path]:
    """{dotted module name: file} of every module under `root` (a package `a/__init__.py` is
    `a`)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an `if` test is `TYPE_CHECKING` or `typing.TYPE_CHECKING`."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node of `tree`, at any depth, but those under
    `if TYPE_CHECKING:` (their `else:` branch is kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imported(module: str, is_package: bool, node, modules) -> set[str]:
    """The easyrl modules that import `node` in `module` loads (the targets of its edges)."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        # `from a import b`: the submodule a.b where b is one, else the module a itself.
        candidates = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    found = set()
    for name in candidates:
        while name and name not in modules:  # `import a.b.c` of an attribute path: its module
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the modules of the package it imports (deferred imports included)}."""
    modules = _module_names(root)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        targets = set()
        for node in _import_nodes(tree):
            targets |= _imported(name, is_package, node, modules)
        graph[name] = targets - {name}
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_cycle(graph: dict[str, set[str]], start: str) -> list[str]:
    """The shortest path start -> ... -> start in `graph` (breadth first)."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(graph[node]):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if node != start else [start, start]
            if succ not in parent:
                parent[succ] = node
                queue.append(succ)
    return []


def test_the_package_has_no_import_circle():
    graph = import_graph()
    circles = [
        f"{' -> '.join(shortest_cycle(graph, c[0]))} (component: {', '.join(c)})"
        for c in strongly_connected(graph)
    ]
    assert not circles, "import circles in easyrl/:\n" + "\n".join(circles)


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


@pytest.mark.parametrize(
    "files, circle",
    [
        (  # deferred, relative, and `from package import submodule`
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "def f():\n    from . import b\n",
                "pkg/b.py": "from pkg.sub import c\n",
                "pkg/sub/__init__.py": "",
                "pkg/sub/c.py": "from ..a import f\n",
            },
            "pkg.a -> pkg.b -> pkg.sub.c -> pkg.a",
        ),
        (  # a package's __init__ importing its module, which imports the package back
            {
                "pkg/__init__.py": "",
                "pkg/shared.py": "from pkg.algo import Thing\n",
                "pkg/algo/__init__.py": "from .agent import Thing\n",
                "pkg/algo/agent.py": "import pkg.shared\nThing = 1\n",
            },
            "pkg.algo -> pkg.algo.agent -> pkg.shared -> pkg.algo",
        ),
    ],
)
def test_a_circle_is_found_and_named(tmp_path, files, circle):
    graph = import_graph(_write(tmp_path, files))
    components = strongly_connected(graph)
    assert [" -> ".join(shortest_cycle(graph, c[0])) for c in components] == [circle]


def test_a_module_importing_its_own_package_that_imports_it_back_is_a_circle(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/algo/__init__.py": "def build():\n    from .agent import Agent\n",
        "pkg/algo/agent.py": "from pkg.algo import build\nimport pkg\nAgent = 1\n",
    }
    graph = import_graph(_write(tmp_path, files))
    assert graph["pkg.algo.agent"] == {"pkg", "pkg.algo"}
    assert [shortest_cycle(graph, c[0]) for c in strongly_connected(graph)] == [
        ["pkg.algo", "pkg.algo.agent", "pkg.algo"]
    ]


def test_a_module_importing_a_sibling_its_package_also_imports_is_no_circle(tmp_path):
    files = {  # the fix for the circle above: what the agent needs moves to a sibling module
        "pkg/__init__.py": "",
        "pkg/algo/__init__.py": "from .params import P\ndef build():\n    from .agent import A\n",
        "pkg/algo/params.py": "P = 1\n",
        "pkg/algo/agent.py": "from pkg.algo.params import P\nA = P\n",
    }
    graph = import_graph(_write(tmp_path, files))
    assert graph["pkg.algo"] == {"pkg.algo.params", "pkg.algo.agent"}
    assert graph["pkg.algo.agent"] == {"pkg.algo.params"}
    assert strongly_connected(graph) == []


def test_imports_under_type_checking_are_not_edges(tmp_path):
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
        "pkg/b.py": "import pkg.a\n",
    }
    graph = import_graph(_write(tmp_path, files))
    assert graph["pkg.a"] == set() and graph["pkg.b"] == {"pkg.a"}
    assert strongly_connected(graph) == []


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def documented_layers() -> dict[str, int]:
    """{top-level package or module of easyrl: its layer} from docs/architecture.md's
    ```layers block."""
    text = ARCHITECTURE.read_text()
    block = text.split("```layers\n", 1)[1].split("```", 1)[0]
    layers = {}
    for line in block.splitlines():
        level, *names = line.split()
        layers.update(dict.fromkeys(names, int(level)))
    return layers


def test_imports_run_down_the_documented_layers():
    """No module imports one of a higher layer (docs/architecture.md, "Layers"), and every
    top-level part of the package has a layer."""
    layers = documented_layers()

    def top(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "easyrl"

    graph = import_graph(PACKAGE)
    unplaced = sorted({top(m) for m in graph} - set(layers))
    assert not unplaced, f"not in docs/architecture.md's layers: {unplaced}"
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if layers[top(a)] < layers[top(b)]
    )
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
