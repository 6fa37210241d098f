"""Code small enough to hold in your head: no function over 80 lines, no class over 150, in the package and app.py
(each counted from its `def` or `class` line to its last, docstring and comments included)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 150


def _sizes() -> dict[tuple[str, str], tuple[int, int]]:
    """(file, qualified name) -> (lines, limit) for every function, method and class."""
    sizes = {}
    for file in [ROOT / "app.py", *sorted((ROOT / "assistgen").rglob("*.py"))]:
        name = str(file.relative_to(ROOT))

        def visit(node, prefix=""):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    limit = MAX_CLASS_LINES if isinstance(child, ast.ClassDef) else MAX_FUNCTION_LINES
                    sizes[name, prefix + child.name] = (child.end_lineno - child.lineno + 1, limit)
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)
        visit(ast.parse(file.read_text()))
    return sizes


def test_no_function_or_class_is_over_its_limit():
    sizes = _sizes()
    assert ("app.py", "build_demo") in sizes and ("assistgen/engine/decoding.py", "speculative_decode") in sizes
    over = {key: lines for key, (lines, limit) in sizes.items() if lines > limit}
    assert over == {}

