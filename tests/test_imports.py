"""The package has no import cycles.

Every module's imports of the package's own modules (at module level and
inside functions; not those under `if TYPE_CHECKING:`) form a graph, read
from the source with `ast`; a strongly connected component of more than one
module is a cycle. A package `__init__` importing its own submodules is fine
as long as none of them imports it back.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "keras_transformers"


def module_files(package: Path) -> dict[str, Path]:
    """`{dotted module name: file}` of every module under `package`."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
    return name == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST):
    """Every import statement at any depth, outside `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules) -> str | None:
    """`name`, or the closest enclosing module of it, if it is ours."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module name of `from <base> import ...` in `module`."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def imports_of(module: str, path: Path, modules) -> set[str]:
    """The package's modules that `module` (at `path`) imports."""
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _from_base(node, module, path.name == "__init__.py")
            names = [f"{base}.{alias.name}" for alias in node.names]
        found.update(_known(name, modules) for name in names)
    return found - {None, module}


def import_graph(package: Path) -> dict[str, set[str]]:
    """`{module: the package's modules it imports}` for every module."""
    modules = module_files(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(component: list[str], graph, files) -> str:
    """The files of a cycle and the imports between them."""
    root = PACKAGE.parent
    name = {m: files[m].relative_to(root).as_posix() for m in component}
    edges = [
        f"    {name[a]} -> {name[b]}"
        for a in component
        for b in sorted(graph[a])
        if b in name
    ]
    return "\n".join([f"  {len(component)} files: {', '.join(name.values())}", *edges])


def test_no_import_cycles():
    graph = import_graph(PACKAGE)
    files = module_files(PACKAGE)
    found = cycles(graph)
    report = "\n".join(describe(component, graph, files) for component in found)
    assert not found, f"Import cycles in keras_transformers:\n{report}"


def test_cycles_are_found(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    sources = {
        "__init__.py": "from pkg.a import f\n",  # a package importing its own
        "a.py": "from pkg import b\nfrom pkg.c import g\n",
        "b.py": "def f():\n    from pkg.a import f\n",  # function level: a cycle
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "sub/__init__.py": "from .d import h\n",
        "sub/d.py": "from . import h\nfrom ..c import g\n",  # relative: sub <-> d
    }
    for name, text in sources.items():
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.c"] == set()
    assert graph["pkg.sub.d"] == {"pkg.sub", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.sub", "pkg.sub.d"]]
