"""The house rules of docs/architecture.md, read from the code's own imports and definitions.

Every import counts: at module level, inside functions, under TYPE_CHECKING.
"""

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "specgen"

# Higher imports lower, never the reverse; a folder's modules may import each other.
RANK = {
    "__main__": 95, "cli": 90, "api": 85, "bench": 80, "serve": 70, "session": 60, "decode": 50,
    "drafters": 40, "heads": 35, "engine": 30, "policy": 25, "rules": 20, "models": 20, "apps": 20, "plan": 10,
    "errors": 0, "notes": 0,
    "": 0,
}
# the drafters' classes: built in specgen/drafters/build.py only
DRAFTER_CLASSES = ("PromptLookup", "SuffixDrafter", "DraftModel", "TranslatedDraftModel", "WithLookup", "HeadsDrafter")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The specgen modules `name` imports (a `from X import y` of a submodule counts y)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("specgen")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if not base.startswith("specgen"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_folder_has_a_rank():
    assert {_folder(m) for m in MODULES} <= set(RANK), "a new folder: give it a place in RANK and docs/architecture.md"


def test_no_import_runs_up_a_layer():
    upward = [f"{a} -> {b}" for a, deps in GRAPH.items() for b in deps
              if _folder(a) != _folder(b) and RANK[_folder(a)] <= RANK[_folder(b)]]
    assert not upward


def test_no_import_circle():
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the path, 2 done
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(GRAPH[m]):
            if state[d] == 1:
                circles.append(" -> ".join(path[path.index(d):] + [d]))
            elif state[d] == 0:
                visit(d, path + [d])
        state[m] = 2

    for m in MODULES:
        if state[m] == 0:
            visit(m, [m])
    assert not circles


def test_files_stay_small_and_the_top_level_stays_short():
    big = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not big
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 7, top


def _calls(name: str) -> list[str]:
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return hits


@pytest.mark.parametrize("cls", DRAFTER_CLASSES)
def test_drafters_are_built_in_one_place(cls):
    places = {p.split(":")[0] for p in _calls(cls)}
    # a translated draft drives a DraftModel of its own vocabulary inside itself
    allowed = {"specgen/drafters/build.py"} | ({"specgen/drafters/translated.py"} if cls == "DraftModel" else set())
    assert places <= allowed and "specgen/drafters/build.py" in places, places


POLICY_CLASSES = ("Policy", "FixedK", "Heuristic", "CostAware")
# names that hold a drafter or a policy (a variable, an argument, an attribute)
_HOLDERS = ("drafter", "policy", "model_drafter", "lookup_drafter")


def _holds_drafter_or_policy(node) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return name in _HOLDERS or name.endswith(("_drafter", "_policy"))


def _probes() -> list[str]:
    """isinstance(x, <a drafter or policy class>), and getattr/hasattr on something
    that holds a drafter or a policy: asking what an object is instead of what it declares."""
    classes = set(DRAFTER_CLASSES) | set(POLICY_CLASSES) | {"Drafter"}
    hits = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if node.func.id == "isinstance" and len(node.args) == 2:
                named = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                if any(isinstance(c, ast.Name) and c.id in classes for c in named):
                    hits.append(where)
            elif node.func.id in ("getattr", "hasattr") and _holds_drafter_or_policy(node.args[0]):
                hits.append(where)
    return hits


def test_capabilities_are_declared_not_probed():
    assert len(_calls("hasattr")) <= 1, _calls("hasattr")
    assert not _probes()


def test_the_probe_check_can_fail(tmp_path, monkeypatch):
    """The check above finds each kind of probe it polices (so its silence means something)."""
    (tmp_path / "specgen").mkdir()
    (tmp_path / "specgen" / "x.py").write_text(
        "def f(policy, gen, d):\n"
        "    a = isinstance(policy, CostAware)\n"
        "    b = getattr(gen.policy, 'name', 'fixed')\n"
        "    c = hasattr(self.drafter, 'trees')\n"
        "    e = isinstance(d, (int, WithLookup))\n"
        "    ok = getattr(gen.target, 'kv_unified', False)\n")
    import sys

    monkeypatch.setattr(sys.modules[__name__], "PKG", tmp_path / "specgen")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [h.rsplit(":", 1)[1] for h in _probes()] == ["2", "3", "4", "5"]


MAX_PARAMS, MAX_LINES = 8, 80


def _shapes(root: Path) -> tuple[list[str], list[str]]:
    """Constructors over MAX_PARAMS parameters (self not counted), and functions over
    MAX_LINES lines outside cli/ (the commands' bodies, which read as their --help)."""
    wide, long_ = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for f in node.body:
                    if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                        n = len(f.args.args) - 1 + len(f.args.kwonlyargs)
                        if n > MAX_PARAMS:
                            wide.append(f"{rel}:{node.name} {n}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "cli" not in rel.parts:
                if node.end_lineno - node.lineno + 1 > MAX_LINES:
                    long_.append(f"{rel}:{node.name}")
    return wide, long_


def test_constructors_stay_narrow_and_functions_short():
    wide, long_ = _shapes(PKG)
    assert not wide
    assert not long_


def test_the_shape_check_can_fail(tmp_path):
    (tmp_path / "specgen").mkdir()
    args = ", ".join(f"a{i}" for i in range(MAX_PARAMS))
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "specgen" / "x.py").write_text(
        f"class Ok:\n    def __init__(self, {args}): pass\n"
        f"class Wide:\n    def __init__(self, {args}, *, one_more=1): pass\n"
        f"def long():\n{body}\n")
    assert _shapes(tmp_path / "specgen") == (["specgen/x.py:Wide 9"], ["specgen/x.py:long"])


def test_one_place_resolves_what_to_speculate():
    """The drafting kinds are named once (specgen/plan.py's Kind): the session does not spell them."""
    session = (PKG / "session.py").read_text()
    assert session.count('"suffix"') <= 1
    assert not re.search(r'mode\s*==\s*"(lookup|suffix|draft|heads|plain)"', (PKG / "serve" / "setup.py").read_text())
