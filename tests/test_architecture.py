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
            if not isinstance(node, ast.ImportFrom):
                continue
            names = [(node.module or "").split(".")[-1], *(alias.name for alias in node.names)]
            if "plugin" in names:
                importers.append(path.name)
    assert importers == []


def _layers() -> dict[str, int]:
    """Module -> rank of its layer in docs/design.md's table (0 is the top)."""
    text = (PACKAGE.parent / "docs" / "design.md").read_text()
    ranks: dict[str, int] = {}
    order: list[str] = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[1].startswith("`"):
            continue
        if cells[0] not in order:
            order.append(cells[0])
        for name in cells[1].replace("(", " ").replace(")", " ").replace("+", " ").split():
            if name.startswith("`") and name.endswith("`"):
                ranks[name.strip("`")] = order.index(cells[0])
    return ranks


def test_every_module_has_a_row_in_the_design_and_imports_only_its_own_layer_or_below():
    ranks = _layers()
    packages = {"__init__", "engines/__init__", "shapes/__init__"}
    modules = {str(p.relative_to(PACKAGE).with_suffix("")) for p in PACKAGE.rglob("*.py")} - packages
    assert modules <= set(ranks), f"modules without a row in docs/design.md: {sorted(modules - set(ranks))}"
    upward = []
    for path in PACKAGE.rglob("*.py"):
        me = str(path.relative_to(PACKAGE).with_suffix(""))
        if me not in ranks:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = "engines/" if me.startswith("engines/") and node.level == 1 else ""
            targets = [f"{base}{node.module}".replace(".", "/")] if node.module else [f"{base}{a.name}" for a in node.names]
            upward += [f"{me} -> {t}" for t in targets if t in ranks and ranks[t] < ranks[me]]
    assert upward == [], f"imports from a layer above: {upward}"
