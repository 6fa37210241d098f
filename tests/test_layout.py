"""The package's import graph: no cycles, each layer imports only the layers below it, and the engine reached from
`generate` stays free of everything above it."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "assistgen"
# bottom to top; "config" (the environment, read once) sits below everything; "choices" (the shared vocabulary of
# requests) sits beside the engine, below the models; "views" (a result's words and charts, for the page and the
# command line alike) sits between the values (comparison) and the front ends (app, tools)
LAYERS = ["config", "engine", "choices", "models", "comparison", "views", "app", "tools"]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module ("assistgen.engine.kv") -> what it imports: a module of the package by its dotted name, anything
    else as "ext:" and its top-level package. Every import statement counts, those inside functions too."""
    graph = {}
    for file in PACKAGE.rglob("*.py"):
        name, names = _module(file), set()
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
                names |= {prefix} if node.module else {f"{prefix}.{a.name}" for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module if node.module.startswith("assistgen") else "ext:" + node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                names |= {a.name if a.name.startswith("assistgen") else "ext:" + a.name.split(".")[0]
                          for a in node.names}
        graph[name] = names
    return graph


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for name in graph.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_package_has_no_import_cycles():
    graph = _imports()
    local = {m: {n for n in names if n in graph} for m, names in graph.items()}
    assert "assistgen.tools.bench" in local["assistgen.tools.cli"]   # the graph is really read
    assert "assistgen.models.loading" in local["assistgen.models.prepare"]
    cycles = sorted((a, b) for a in local for b in local[a] if a in _reached(local, b))
    assert cycles == []


def test_each_layer_imports_only_the_layers_below_it():
    upward = []
    for module, names in _imports().items():
        for name in names:
            here, there = _layer(module), _layer(name)
            if here and there and LAYERS.index(there) > LAYERS.index(here):
                upward.append((module, name))
    assert upward == []


def test_the_engine_imports_no_ui_catalog_cli_or_plotting():
    reached = _reached(_imports(), "assistgen.engine.decoding")
    assert {"ext:torch", "assistgen.engine.kv", "assistgen.engine.drafting", "assistgen.engine.schedules"} <= reached
    assert reached.isdisjoint({"ext:gradio", "ext:matplotlib", "ext:yaml"})
    assert {_layer(name) for name in reached if name.startswith("assistgen")} == {"engine"}


def test_the_front_ends_share_the_views_and_only_the_views_draw():
    """The command line words and draws results with the page's own views, without importing the page; below the
    views, nothing draws."""
    graph = _imports()
    assert "assistgen.views.text" in graph["assistgen.tools.cli"]
    assert "assistgen.views.plots" in graph["assistgen.app.render"]
    assert [(m, n) for m, names in graph.items() for n in names
            if _layer(m) == "tools" and _layer(n) == "app"] == []
    drawing = {m for m, names in graph.items() if "ext:matplotlib" in names}
    below = {m for m in drawing if _layer(m) and LAYERS.index(_layer(m)) < LAYERS.index("views")}
    assert below == set() and "assistgen.views.plots" in drawing
