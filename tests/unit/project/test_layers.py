"""The package's layers hold (ghostedit/__init__.py lists them): no module imports from a layer above its own, at
the top of a file or inside a function."""
import ast
from pathlib import Path

from conftest import REPO

# bottom to top; a module's layer is the first whose prefixes match its name under ghostedit/
LAYERS = (
    ("base", ("errors", "paths", "device", "tensors", "pinned", "images", "masks", "pillow_resize", "metrics",
              "telemetry", "quiet", "downloads", "lora_files", "lora_formats")),
    ("kernels", ("kernels",)),
    ("diffsynth_patches", ("diffsynth_patches",)),
    ("models", ("models",)),
    ("parallel", ("parallel",)),
    ("optimize", ("optimize",)),
    ("config", ("config", "loras", "figures")),
    ("engine", ("engine",)),
    ("arguments", ("arguments",)),
    ("front", ("bench", "cli", "ui", "__main__")),
)
PACKAGE = REPO / "ghostedit"


def layer(module: str) -> int:
    name = module.removeprefix("ghostedit").removeprefix(".")
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return index
    raise KeyError(f"{module} is in no layer: add it to ghostedit/__init__.py's list and LAYERS here")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str):
    """(module imported, line) for each import of the package's own modules in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("ghostedit"):
                names = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
                yield from ((each, node.lineno) for each in names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names if alias.name.startswith("ghostedit."))


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name == "ghostedit":   # the package's face: its public names
            continue
        for target, line in imported(path, name):
            if target != "ghostedit" and layer(target) > layer(name):
                upward.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_every_module_is_in_a_layer():
    for path in PACKAGE.rglob("*.py"):
        if module_name(path) != "ghostedit":
            layer(module_name(path))
