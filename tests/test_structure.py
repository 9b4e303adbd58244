"""The shape of the package: rlcore's import graph (every import, including type-only and function-local ones)
has no circle, its folders import one way, no mode imports another, and the top (rlcore.trainer) is imported by
nothing."""
import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "rlcore"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The rlcore modules `path` imports anywhere in its body (a `from rlcore import x` of a submodule
    counts as importing rlcore.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or ({node.module} & modules)
    return found - {module_name(path)}


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in files}
    return {module_name(p): imports(p, modules) for p in files}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path a -> b -> ... -> a), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_the_trainer():
    edges = graph()
    assert len(edges) > 20 and "rlcore.run" in edges["rlcore.train.update"]  # the walk sees real imports
    assert sorted(m for m, deps in edges.items() if "rlcore.trainer" in deps) == []


def test_import_graph_has_no_circle():
    assert cycle(graph()) is None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check finds one


def test_the_core_never_imports_an_rl_algorithm():
    """Deleting an algorithm's file leaves the core importable (tests/test_deletable.py runs it for real):
    no module outside rlcore.algorithms imports one, anywhere (function-local imports included), and the
    algorithms import none of each other. (SFT is the warm start of the tiny tasks, not an RL algorithm.)"""
    edges = graph()
    rl = {f"rlcore.algorithms.{name}" for name in ("grpo", "ppo", "reinforce_pp", "gspo", "cispo", "distill")}
    assert rl <= set(edges)
    assert {m: sorted(d & rl) for m, d in edges.items() if d & rl} == {}


def unit(module: str) -> str:
    """The folder (or top-level module) a module belongs to: rlcore.modes.stream.turns -> rlcore.modes."""
    return ".".join(module.split(".")[:2])


def folder_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, deps in edges.items():
        folders.setdefault(unit(module), set()).update(unit(d) for d in deps if unit(d) != unit(module))
    return folders


def test_folders_import_one_way():
    """No folder imports one that imports it, directly or through others: each folder (and each top-level module)
    sits at one height, and a reader can learn the package from the bottom up (docs/files.md's tree lists it so)."""
    folders = folder_edges(graph())
    assert {"rlcore.config", "rlcore.rollout", "rlcore.modes", "rlcore.train", "rlcore.models"} <= set(folders)
    assert "rlcore.config" in folders["rlcore.rollout"]  # the walk sees imports between folders
    assert cycle(folders) is None
    # the check sees a circle through folders: rollout.collect -> run, and run -> rollout.turns
    assert cycle(folder_edges({"rlcore.rollout.collect": {"rlcore.run"}, "rlcore.run": {"rlcore.rollout.turns"},
                               "rlcore.rollout.turns": set()})) == ["rlcore.rollout", "rlcore.run", "rlcore.rollout"]


def test_the_readme_lists_the_folders_from_the_bottom_up():
    """The file tree (docs/files.md) names rlcore's folders in an order where each imports only those listed before
    it."""
    readme = (ROOT / "docs" / "files.md").read_text()
    tree = readme[readme.index("├── rlcore/"):readme.index("├── benchmarks/")]
    listed = ["rlcore." + m.group(1) for m in re.finditer(r"^│   [├└]── (\w+)(?:/|\.py)", tree, re.M)]
    folders = folder_edges(graph())
    folders.pop("rlcore")  # the package's own __init__, which imports nothing
    assert set(listed) == set(folders)
    assert {f: sorted(d for d in deps if listed.index(d) > listed.index(f)) for f, deps in folders.items()
            if any(listed.index(d) > listed.index(f) for d in deps)} == {}


MODES = {"colocated": {"rlcore.modes.colocated"}, "split": {"rlcore.modes.split"},
         "stream": {"rlcore.modes.stream", "rlcore.modes.stream.engine_side", "rlcore.modes.stream.trainer_side",
                    "rlcore.modes.stream.turns", "rlcore.modes.stream.agents", "rlcore.modes.stream.lag"}}


def test_no_mode_imports_another():
    """Colocated, split and streaming each import only what lies below all of them (rlcore.modes.loop, .transfer,
    .offpolicy and the stages): what two modes share lives below both."""
    edges = graph()
    assert set().union(*MODES.values()) <= set(edges)
    crossing = {m: sorted(d for d in edges[m] if d in others)
                for mode, own in MODES.items() for m in own
                for others in [set().union(*(o for name, o in MODES.items() if name != mode))]
                if edges[m] & others}
    assert crossing == {}


def test_a_file_over_300_lines_says_why_at_its_top():
    """A reader can hold a file: none in rlcore/ is over ~300 lines unless its docstring says why it is one file."""
    long = {str(p.relative_to(ROOT)): ast.get_docstring(ast.parse(p.read_text())) or ""
            for p in sorted(PACKAGE.rglob("*.py")) if len(p.read_text().splitlines()) > 300}
    assert len(long) >= 1  # the walk finds files (rlcore/models/build.py is one)
    assert sorted(f for f, doc in long.items() if "Why one file of" not in doc) == []
