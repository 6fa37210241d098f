"""The package's import graph: no cycles, and the engine reached from `generate` stays free of the layers above it."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "assistgen"


def _imports() -> dict[str, set[str]]:
    """Module -> what it imports, every import statement counted (those inside functions too): a module of the
    package by its name ("kv"), anything else by its top-level package ("torch")."""
    graph = {}
    for file in PACKAGE.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                parts = node.module.split(".")
                names.add(parts[1] if parts[0] == "assistgen" else "ext:" + parts[0])
            elif isinstance(node, ast.Import):
                names |= {"ext:" + a.name.split(".")[0] for a in node.names}
        graph[file.stem] = names
    return graph


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for name in graph.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_the_package_has_no_import_cycles():
    graph = _imports()
    local = {m: {n for n in names if n in graph} for m, names in graph.items()}
    assert "bench" in local["cli"] and "loading" in local["prepare"]   # the graph is really read
    cycles = sorted((a, b) for a in local for b in local[a] if a in _reached(local, b))
    assert cycles == []


def test_the_engine_imports_no_ui_catalog_cli_or_plotting():
    graph = _imports()
    reached = _reached(graph, "decoding")
    assert {"ext:torch", "kv", "drafting", "schedules", "sampling"} <= reached
    assert reached.isdisjoint({"ext:gradio", "ext:matplotlib", "ext:yaml", "catalog", "cli", "bench", "service",
                               "render", "app"})
