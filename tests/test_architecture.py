"""The layers as docs/design.md draws them: `plugin.py` is a list of hooks, and nothing imports it."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_llmperf"


def test_plugin_py_is_a_list_of_hooks():
    tree = ast.parse((PACKAGE / "plugin.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions and all(name.startswith("pytest_") or name.startswith("_") for name in functions), functions
    helpers = [name for name in functions if name.startswith("_")]
    assert len(helpers) <= 1, f"logic belongs in the module named for it, not in plugin.py: {helpers}"


def test_imports_go_one_way_nothing_imports_the_hook_layer():
    importers = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "plugin":
                importers.append(path.name)
            elif isinstance(node, ast.ImportFrom) and any(alias.name == "plugin" for alias in node.names):
                importers.append(path.name)
    assert importers == []
