"""The package layout, enforced by parsing every import of ``tokenmill/`` with :mod:`ast`.

Imports go one way only,

    top-level helpers (tokenmill/atomic.py, cliargs.py, errors.py, raysession.py, storage.py,
                       objectcache.py, suffixarray.py, ...)
      < tokenizers < manifests < pipeline, ngram < train < cli.py

A module imports its own package and the layers below it; ``pipeline`` and ``ngram`` never
import each other. Every import counts: module-level and deferred ones inside functions,
``import x``, ``from x import y``, relative imports, ``importlib.import_module("...")`` with a
constant name, and imports under ``if TYPE_CHECKING:``. Besides the layers:

* no module imports a private name (``_x``) or a private module from another package, nor
  reaches one through an imported module (``kb._helper``);
* no ``except ModuleNotFoundError`` / ``except ImportError`` wraps an import of tokenmill's
  own modules (own modules are never optional);
* no test uses ``pytest.importorskip`` on tokenmill's own modules.

Each test prints every violation as ``path:line: what`` and fails naming them all.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "tokenmill"

#: Layer of each part of the package (the second component of a module name).
LAYERS: dict[str, int] = {
    "": 0,  # tokenmill/__init__.py
    "atomic": 0,
    "cliargs": 0,
    "boundedyaml": 0,
    "outputlock": 0,
    "storage": 0,
    "objectcache": 0,
    "errors": 0,
    "failures": 0,
    "raysession": 0,
    "suffixarray": 0,
    "tablecache": 0,
    "tokenizers": 1,
    "manifests": 2,
    "pipeline": 3,
    "ngram": 3,
    "train": 4,
    "cli": 5,
    "__main__": 5,
}
#: Same-layer packages that must not import each other.
SIBLINGS = {frozenset({"pipeline", "ngram"})}
OPTIONAL_IMPORT_ERRORS = {"ModuleNotFoundError", "ImportError"}


@dataclass(frozen=True)
class Import:
    """One import of a tokenmill module found in a file."""

    line: int
    target: str  # the tokenmill module imported, e.g. "tokenmill.manifests.shards"
    name: str | None  # the attribute imported from it (``from target import name``), if any


def module_name(path: Path, root: Path = REPO) -> str:
    """``tokenmill/pipeline/units.py`` -> ``tokenmill.pipeline.units`` (``__init__`` dropped)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The part of tokenmill a module belongs to: ``tokenmill.ngram.index`` -> ``ngram``,
    ``tokenmill.atomic`` -> ``atomic``, ``tokenmill`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Checker:
    """Collects the tokenmill imports of source files and checks them against the rules.

    Args:
        modules: every module name of the package (to tell ``from a import b`` of a
            submodule ``a.b`` from the import of a name ``b`` defined in ``a``).
    """

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    # ---------------------------------------------------------------- collecting imports
    def _resolve_from(self, importer: str, is_pkg: bool, node: ast.ImportFrom) -> str | None:
        if node.level == 0:
            return node.module
        base = importer.split(".") if is_pkg else importer.split(".")[:-1]
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def imports(self, importer: str, is_pkg: bool, tree: ast.AST) -> list[Import]:
        """Every import of a tokenmill module anywhere in ``tree`` (deferred ones included)."""
        out: list[Import] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [Import(node.lineno, a.name, None) for a in node.names
                        if a.name.split(".")[0] == "tokenmill"]
            elif isinstance(node, ast.ImportFrom):
                mod = self._resolve_from(importer, is_pkg, node)
                if not mod or mod.split(".")[0] != "tokenmill":
                    continue
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    if sub in self.modules:
                        out.append(Import(node.lineno, sub, None))
                    else:
                        out.append(Import(node.lineno, mod, a.name))
            elif isinstance(node, ast.Call) and _dynamic_import_name(node):
                name = _dynamic_import_name(node)
                if name and name.split(".")[0] == "tokenmill":
                    out.append(Import(node.lineno, name, None))
        return sorted(out, key=lambda i: i.line)

    def aliases(self, importer: str, is_pkg: bool, tree: ast.AST) -> dict[str, str]:
        """Local names bound to tokenmill modules by imports (file-wide, all scopes)."""
        out: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != "tokenmill":
                        continue
                    if a.asname:
                        out[a.asname] = a.name
                    else:
                        out["tokenmill"] = "tokenmill"
            elif isinstance(node, ast.ImportFrom):
                mod = self._resolve_from(importer, is_pkg, node)
                if not mod or mod.split(".")[0] != "tokenmill":
                    continue
                for a in node.names:
                    if f"{mod}.{a.name}" in self.modules:
                        out[a.asname or a.name] = f"{mod}.{a.name}"
        return out

    # ---------------------------------------------------------------- the rules
    def layer_violations(self, importer: str, imports: list[Import]) -> list[tuple[int, str]]:
        own = package_of(importer)
        out: list[tuple[int, str]] = []
        if own not in LAYERS:
            return [(1, f"{importer} is in no layer (add '{own}' to LAYERS in "
                        "tests/test_layers.py if it is a new package)")]
        for imp in imports:
            pkg = package_of(imp.target)
            if pkg == own:
                continue
            if pkg not in LAYERS:
                out.append((imp.line, f"imports {imp.target}, which is in no layer"))
            elif LAYERS[pkg] > LAYERS[own]:
                out.append((imp.line, f"{own or 'tokenmill'} (layer {LAYERS[own]}) imports "
                                      f"{imp.target} from layer {LAYERS[pkg]} above it"))
            elif frozenset({own, pkg}) in SIBLINGS:
                out.append((imp.line, f"{own} imports {imp.target}: {own} and {pkg} must "
                                      "not import each other"))
        return out

    def private_violations(self, importer: str, imports: list[Import], aliases: dict[str, str],
                           tree: ast.AST) -> list[tuple[int, str]]:
        own = package_of(importer)
        out: list[tuple[int, str]] = []
        for imp in imports:
            if package_of(imp.target) == own:
                continue
            priv = [p for p in imp.target.split(".")[1:] if is_private(p)]
            if priv:
                out.append((imp.line, f"imports private module {imp.target} of another package"))
            elif imp.name and is_private(imp.name):
                out.append((imp.line, f"imports private name {imp.name} from {imp.target}"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not is_private(node.attr):
                continue
            chain = _dotted(node.value)
            if not chain or chain[0] not in aliases:
                continue
            mod = ".".join([aliases[chain[0]], *chain[1:]])
            if mod in self.modules and package_of(mod) != own:
                out.append((node.lineno, f"uses private name {mod}.{node.attr} of another "
                                         "package"))
        return sorted(out)

    def optional_import_violations(self, importer: str, is_pkg: bool,
                                   tree: ast.AST) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            caught = {n for h in node.handlers for n in _exception_names(h.type)}
            caught &= OPTIONAL_IMPORT_ERRORS
            if not caught:
                continue
            body = ast.Module(body=node.body, type_ignores=[])
            for imp in self.imports(importer, is_pkg, body):
                out.append((imp.line, f"import of own module {imp.target} wrapped in "
                                      f"`except {'/'.join(sorted(caught))}` (line "
                                      f"{node.handlers[0].lineno}); own modules are never "
                                      "optional"))
        return out


def _dynamic_import_name(node: ast.Call) -> str | None:
    """The constant module name of ``importlib.import_module("x")`` / ``__import__("x")``."""
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    if called not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _exception_names(node: ast.AST | None) -> list[str]:
    if node is None:
        return ["BaseException"]
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _exception_names(e)]
    chain = _dotted(node)
    return [chain[-1]] if chain else []


# -------------------------------------------------------------------------- the package
def _package_files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _checker() -> Checker:
    return Checker({module_name(p) for p in _package_files()})


def _report(kind: str, violations: list[str]) -> None:
    for v in violations:
        print(v)
    assert not violations, f"{len(violations)} {kind}:\n" + "\n".join(violations)


def _each_module():
    ck = _checker()
    for path in _package_files():
        mod = module_name(path)
        tree = _parse(path)
        is_pkg = path.name == "__init__.py"
        yield ck, path.relative_to(REPO), mod, is_pkg, tree


def test_imports_go_down_the_layers() -> None:
    found = []
    for ck, rel, mod, is_pkg, tree in _each_module():
        for line, msg in ck.layer_violations(mod, ck.imports(mod, is_pkg, tree)):
            found.append(f"{rel}:{line}: {msg}")
    _report("imports against the layer order", found)


def test_no_private_names_across_packages() -> None:
    found = []
    for ck, rel, mod, is_pkg, tree in _each_module():
        imps = ck.imports(mod, is_pkg, tree)
        for line, msg in ck.private_violations(mod, imps, ck.aliases(mod, is_pkg, tree), tree):
            found.append(f"{rel}:{line}: {msg}")
    _report("private names used across packages", found)


def test_own_modules_are_never_optional() -> None:
    found = []
    ck = _checker()
    for path in _package_files() + sorted((REPO / "tests").rglob("*.py")):
        mod = module_name(path)
        tree = _parse(path)
        for line, msg in ck.optional_import_violations(mod, path.name == "__init__.py", tree):
            found.append(f"{path.relative_to(REPO)}:{line}: {msg}")
    _report("optional imports of own modules", found)


def test_no_importorskip_of_own_modules() -> None:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(_parse(path)):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name != "importorskip" or not node.args:
                continue
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).split(".")[0] == "tokenmill":
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: "
                             f"pytest.importorskip({arg.value!r}) of an own module; import it")
    _report("importorskip of own modules", found)


# -------------------------------------------------------------------------- the checker itself
_FAKE = {"tokenmill", "tokenmill.atomic", "tokenmill.tokenizers", "tokenmill.tokenizers.legality",
         "tokenmill.manifests", "tokenmill.manifests.shards", "tokenmill.pipeline",
         "tokenmill.pipeline.units", "tokenmill.ngram", "tokenmill.ngram.index",
         "tokenmill.train", "tokenmill.train.data", "tokenmill.train._impl", "tokenmill.cli"}


def _check(module: str, src: str, is_pkg: bool = False) -> list[str]:
    ck = Checker(_FAKE)
    tree = ast.parse(src)
    imps = ck.imports(module, is_pkg, tree)
    found = ck.layer_violations(module, imps)
    found += ck.private_violations(module, imps, ck.aliases(module, is_pkg, tree), tree)
    found += ck.optional_import_violations(module, is_pkg, tree)
    return [f"{line}: {msg}" for line, msg in found]


def test_checker_flags_upward_deferred_relative_and_dynamic_imports() -> None:
    src = (
        "import os\n"
        "from tokenmill.atomic import atomic_open\n"           # down: fine
        "def f():\n"
        "    from tokenmill.train.data import MixLoader\n"      # deferred, up
        "    from ..pipeline import units\n"                   # relative, up
        "    import tokenmill.cli\n"                           # up
        "    importlib.import_module('tokenmill.ngram.index')\n"  # dynamic, up
    )
    got = _check("tokenmill.manifests.mix", src)
    assert [g.split(":")[0] for g in got] == ["4", "5", "6", "7"], got
    assert "tokenmill.pipeline.units" in got[1]


def test_checker_flags_siblings_and_allows_own_package_and_lower_layers() -> None:
    assert len(_check("tokenmill.ngram.counts", "from tokenmill.pipeline import units\n")) == 1
    assert len(_check("tokenmill.pipeline.units", "import tokenmill.ngram.index as ix\n")) == 1
    ok = ("from . import units\nfrom tokenmill.manifests.shards import read\n"
          "from tokenmill.tokenizers import legality\nimport tokenmill.atomic\n"
          "from tokenmill import __version__\n")
    assert _check("tokenmill.pipeline.executor", ok) == []
    assert _check("tokenmill.cli", "from tokenmill.train import data\n") == []


def test_checker_flags_private_names_and_modules_across_packages() -> None:
    src = ("from tokenmill.train.data import _key\n"
           "from tokenmill.train import _impl\n"
           "from tokenmill.tokenizers import legality as lg\n"
           "x = lg._helper\n"
           "y = lg.public\n")
    got = _check("tokenmill.train.loop", src)
    assert [g.split(":")[0] for g in got] == ["4"], got  # own package's private names: fine
    got = _check("tokenmill.cli", src)
    assert [g.split(":")[0] for g in got] == ["1", "2", "4"], got


def test_checker_flags_optional_own_imports_only() -> None:
    src = ("try:\n    import numba\nexcept ImportError:\n    numba = None\n"
           "try:\n    from tokenmill.ngram import index\nexcept (ModuleNotFoundError, OSError):\n"
           "    index = None\n")
    got = _check("tokenmill.train.loop", src)
    assert len(got) == 1 and got[0].startswith("6:") and "ModuleNotFoundError" in got[0], got
