"""The package's import order, read from the source (no imports executed).

bertzoo's subpackages form layers; each imports only from its own package
and from layers below it:

    version, utils, datasets -> layers -> text -> saving -> models
        -> compression, convert, export -> cli -> __main__, bertzoo/__init__.py

(`Task.export` reaches `bertzoo.export` through the writer that package
registers in `bertzoo.models.serving`, not through an import.)

A new upward import, an import cycle between modules, a function-level
bertzoo import (the usual way a cycle is hidden) or a private Keras /
TensorFlow access outside `bertzoo.utils.private_api` fails here, naming the
file and line.
"""

import ast
import collections
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bertzoo"

LAYERS = (
    ("version", "utils", "datasets"),
    ("layers",),
    ("text",),
    ("saving",),
    ("models",),
    ("compression", "convert", "export"),
    ("cli",),
    ("__main__", "__init__"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

PRIVATE_MODULES = ("keras.src", "tensorflow.python", "tensorflow.core")
# Underscore attributes of Keras/TensorFlow objects that bertzoo reads only
# through `bertzoo.utils.private_api`.
PRIVATE_ATTRIBUTES = {
    "_flatten_layers",
    "_kernel",
    "_learning_rate",
    "_compile_metrics",
    "_momentums",
    "_velocities",
    "_get_variable_index",
    "_tracker",
    "_layers",
    "_dtype_policy",
}
# Private Keras attributes a layer must not set even on itself.
PRIVATE_SELF_ATTRIBUTES = {"_convert_input_args", "_allow_non_tensor_positional_args", "_dtype_policy"}
PRIVATE_API = "bertzoo.utils.private_api"


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def subpackage(module):
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def parse_modules():
    return {module_name(path): (path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))}


def bertzoo_imports(tree):
    """`[(line, imported name, at module level?)]` of a module's bertzoo imports;
    `from a.b import c` gives `a.b.c` (a module or a name in one, see `resolve`)."""
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bertzoo":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "bertzoo"]
        else:
            continue
        found += [(node.lineno, name, id(node) in top_level) for name in names]
    return found


def resolve(name, modules):
    """The module an imported name lives in: `bertzoo.text.BertTokenizer` ->
    `bertzoo.text`, `bertzoo.convert.tf1` -> itself."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_graph(modules):
    """`{module: {imported bertzoo modules}}`."""
    graph = collections.defaultdict(set)
    for module, (_, tree) in modules.items():
        for _, name, _ in bertzoo_imports(tree):
            target = resolve(name, modules)
            if target != module:
                graph[module].add(target)
    return graph


def find_cycles(graph):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(set(graph) | {t for targets in graph.values() for t in targets}):
        if node not in index:
            visit(node)
    return cycles


@pytest.fixture(scope="module")
def modules():
    return parse_modules()


def test_every_subpackage_has_a_layer(modules):
    unknown = {subpackage(m) for m in modules} - set(RANK)
    assert not unknown, f"Add these subpackages to LAYERS in {__file__}: {sorted(unknown)}"


def test_imports_only_go_down_the_layers(modules):
    upward = []
    for module, (path, tree) in modules.items():
        source = subpackage(module)
        for line, name, _ in bertzoo_imports(tree):
            target = subpackage(resolve(name, modules))
            if target != source and RANK[target] >= RANK[source]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({source}) imports {name} ({target})")
    assert not upward, "Imports that go up or sideways in the package order:\n" + "\n".join(upward)


def test_no_import_cycles_between_modules(modules):
    cycles = find_cycles(import_graph(modules))
    assert not cycles, f"Import cycles: {cycles}"


def test_no_function_level_bertzoo_imports(modules):
    hidden = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} inside a function"
        for path, tree in modules.values()
        for line, name, top in bertzoo_imports(tree)
        if not top
    ]
    assert not hidden, "Import bertzoo modules at module level:\n" + "\n".join(hidden)


def test_private_keras_and_tensorflow_only_through_private_api(modules):
    found = []
    for module, (path, tree) in modules.items():
        if module == PRIVATE_API:
            continue
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if any(name == p or name.startswith(p + ".") for p in PRIVATE_MODULES):
                    found.append(f"{where}:{node.lineno} imports {name}")
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES | PRIVATE_SELF_ATTRIBUTES:
                # `self._x` on bertzoo's own classes is fine, unless Keras owns `_x`.
                on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                if not on_self or node.attr in PRIVATE_SELF_ATTRIBUTES:
                    found.append(f"{where}:{node.lineno} reads .{node.attr}")
    assert not found, f"Private Keras/TensorFlow access outside {PRIVATE_API}:\n" + "\n".join(found)


# The checks above must be able to fail: run them on planted graphs.


def test_find_cycles_reports_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_bertzoo_imports_sees_function_level_and_package_imports():
    tree = ast.parse(
        "from bertzoo.text import BertTokenizer\n"
        "from bertzoo import export\n"
        "def f():\n"
        "    from bertzoo.models.task import Task\n"
    )
    assert bertzoo_imports(tree) == [
        (1, "bertzoo.text.BertTokenizer", True),
        (2, "bertzoo.export", True),
        (4, "bertzoo.models.task.Task", False),
    ]
    modules = {"bertzoo": None, "bertzoo.text": None, "bertzoo.export": None, "bertzoo.models.task": None}
    assert resolve("bertzoo.text.BertTokenizer", modules) == "bertzoo.text"
    assert resolve("bertzoo.export", modules) == "bertzoo.export"
    assert resolve("bertzoo.__version__", modules) == "bertzoo"


def test_pyproject_lists_every_package_setuptools_must_install():
    # `packages` in pyproject.toml is written by hand (the presets folder
    # sits outside bertzoo/), so a new subpackage left off it would be
    # missing from a regular (non-editable) install.
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {module_name(init.parent / "__init__.py") for init in PACKAGE.rglob("__init__.py")}
    assert set(config["packages"]) == on_disk | {"bertzoo.builtin_presets"}
    assert config["package-dir"]["bertzoo.builtin_presets"] == "presets"
    assert (PACKAGE.parent / "presets" / "__init__.py").is_file()
    assert config["package-data"]["bertzoo.builtin_presets"] == ["*.json"]


def test_the_top_level_all_lists_the_public_names():
    import inspect

    import bertzoo

    public = {n for n in dir(bertzoo) if not n.startswith("_") and not inspect.ismodule(getattr(bertzoo, n))}
    listed = set(bertzoo.__all__)
    assert public | {"compression", "convert", "export", "__version__"} == listed
    assert len(listed) == len(bertzoo.__all__)
