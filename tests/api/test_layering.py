"""mixgemm's import layering, read from the source with ``ast`` (function-local imports included, nothing imported):
no module imports a package of a higher layer, and no two modules import each other, directly or around a circle.

Layers, lowest first (a module may import its own layer and the ones below; circles are checked module by module):

* formats: the weight / activation formats and what needs nothing but them: the plain PyTorch references, the GGML
  block formats, the quantization algorithms (HQQ / GPTQ), the epilogue's clamp bounds and the input checks;
* tuning: the measured numbers and their lookup, which the registry reads to hand each kernel its config;
* kernels: the kernels, their host code and the registry;
* ops: the public ops (custom ops, dispatch, the compiled calls);
* nn: the modules (QuantLinear, experts, norms, siblings);
* api: checkpoints, distributed, integrations, evaluate, quantize_api and the package's own ``mixgemm`` namespace;
* top: bench, the demo and the command line.

An edge ``(importer, imported)`` in ALLOWED is a known violation kept with its reason; an allowed edge that no longer
exists fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_paths import ROOT

SRC = ROOT / "src"

LAYERS = {
    "formats": ("formats", "reference", "ggml", "quantize", "epilogue", "_checks"),
    "tuning": ("tuning",),
    "kernels": ("kernels",),
    "ops": ("ops",),
    "nn": ("nn",),
    "api": ("checkpoints", "distributed", "integrations", "evaluate", "quantize_api", ""),
    "top": ("bench", "demo", "__main__"),
}
RANK = {package: rank for rank, packages in enumerate(LAYERS.values()) for package in packages}

# (importer, imported) -> why it stays; empty: every upward import and circle found was fixed in place
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted((SRC / "mixgemm").rglob("*.py"))}


def _deepest_module(name: str) -> str:
    while name not in MODULES:
        if "." not in name:
            raise AssertionError(f"import of {name!r}, which is not a module of src/mixgemm")
        name = name.rsplit(".", 1)[0]
    return name


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The mixgemm modules one import statement names (``from pkg import sub`` names the submodule)."""
    if isinstance(node, ast.Import):
        return [_deepest_module(a.name) for a in node.names if a.name.split(".")[0] == "mixgemm"]
    if node.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base.split(".")[0] != "mixgemm":
        return []
    return [_deepest_module(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base) for a in node.names]


def _edges() -> dict[tuple[str, str], int]:
    """{(importer, imported): first line} over every import statement, at any depth of every module."""
    edges: dict[tuple[str, str], int] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(module, node):
                    if target != module:
                        edges.setdefault((module, target), node.lineno)
    return edges


EDGES = _edges()


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _rank(module: str) -> int:
    package = _package(module)
    if package not in RANK:
        raise AssertionError(f"{module}: package {package!r} has no layer in tests/api/test_layering.py's LAYERS")
    return RANK[package]


def _circles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module of the graph ``edges`` (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {m: [] for m in MODULES}
    for a, b in edges:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer():
    for module in MODULES:
        _rank(module)


def test_no_upward_import():
    upward = [f"{a} (line {line}) imports {b}: layer {_rank(a)} -> {_rank(b)}"
              for (a, b), line in sorted(EDGES.items()) if _rank(b) > _rank(a) and (a, b) not in ALLOWED]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circle():
    edges = [e for e in EDGES if e not in ALLOWED]
    circles = ["\n".join([", ".join(component)] + [f"  {a} (line {EDGES[a, b]}) -> {b}" for a, b in sorted(edges)
                                                     if a in component and b in component])
               for component in _circles(edges)]
    assert not circles, "import circles:\n" + "\n\n".join(circles)


def test_circle_finder_finds_circles():
    made_up = [("mixgemm.formats.weight", "mixgemm.formats.packing"), ("mixgemm.formats.packing", "mixgemm.epilogue"),
               ("mixgemm.epilogue", "mixgemm.formats.weight"), ("mixgemm.ops.matmul", "mixgemm.formats.weight")]
    assert _circles(made_up) == [["mixgemm.epilogue", "mixgemm.formats.packing", "mixgemm.formats.weight"]]


def test_allowed_edges_still_exist():
    gone = [f"{a} no longer imports {b}: take it out of ALLOWED" for a, b in ALLOWED if (a, b) not in EDGES]
    assert not gone, "\n".join(gone)


def test_reader_sees_function_local_and_relative_imports():
    tree = ast.parse("from . import weight\nfrom ..kernels import registry\ndef f():\n    import mixgemm.ops.matmul\n")
    found = [t for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
             for t in _imported("mixgemm.formats.packing", node)]
    assert found == ["mixgemm.formats.weight", "mixgemm.kernels.registry", "mixgemm.ops.matmul"]
