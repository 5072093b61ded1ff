"""Issue 46, item 4: the library's layout limits, checked on the tree as it is.

* no library file (``marl/``, ``envs/``, ``seqmodels/``) above 900 lines and no function or
  method above 100 lines, kernels excluded (a file under a ``kernels`` folder or named for
  them, or one whose module docstring says it holds kernels: numba code, written for speed);
* marl/'s top level holds only ``__init__.py``, the ``python -m`` entry points and the two
  public import paths (``marl.whitening``, ``marl.advantages``).

Lines and functions are counted with ``ast`` (a function's lines: its ``def`` to its last
line, decorators left out).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("marl", "envs", "seqmodels")
FILE_LIMIT = 900
FUNCTION_LIMIT = 100
ENTRY_POINTS = {"train.py", "evaluate.py", "compare.py", "export.py"}
PUBLIC_PATHS = {"whitening.py", "advantages.py"}


def _is_kernel(path: Path, tree: ast.Module) -> bool:
    if "kernel" in path.relative_to(ROOT).as_posix().lower():
        return True
    doc = ast.get_docstring(tree) or ""
    return "kernel" in doc.lower()


def _library_files() -> list[tuple[Path, ast.Module, int]]:
    out = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            if not _is_kernel(path, tree):
                out.append((path, tree, len(source.splitlines())))
    return out


def test_no_library_file_or_function_is_too_long() -> None:
    files = _library_files()
    assert len(files) > 50  # the walk found the library
    long_files = [f"{p.relative_to(ROOT)}: {n}" for p, _, n in files if n > FILE_LIMIT]
    long_functions = [
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
        for p, tree, _ in files
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > FUNCTION_LIMIT
    ]
    assert not long_files, f"files above {FILE_LIMIT} lines: {long_files}"
    assert not long_functions, f"functions above {FUNCTION_LIMIT} lines: {long_functions}"


def test_the_kernel_rule_by_hand(tmp_path: Path) -> None:
    """A file is a kernel by its path or by its docstring, not by chance words elsewhere."""
    plain = ast.parse('"""Actors."""\nKERNEL = 1\n')
    said = ast.parse('"""Numba kernels for the step."""\n')
    assert not _is_kernel(ROOT / "marl" / "models" / "policies.py", plain)
    assert _is_kernel(ROOT / "marl" / "models" / "policies.py", said)
    assert _is_kernel(ROOT / "seqmodels" / "kernels" / "scan.py", plain)


def test_marl_top_level_holds_entry_points_and_public_paths_only() -> None:
    top = {p.name for p in (ROOT / "marl").glob("*.py")}
    assert top - {"__init__.py"} - ENTRY_POINTS - PUBLIC_PATHS == set()
    for name in ENTRY_POINTS:
        source = (ROOT / "marl" / name).read_text()
        assert '__name__ == "__main__"' in source, f"marl/{name} is no python -m entry point"
