"""The shape of the package: the loop (rlcore.trainer) sits on top of the stages, and rlcore's import graph
(every import, including type-only and function-local ones) has no circle."""
import ast
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
