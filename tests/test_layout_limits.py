"""Issue 46, item 4: the library's layout limits, checked on the tree as it is.

* no library file (``marl/``, ``envs/``, ``seqmodels/``) above 900 lines and no function or
  method above 100 lines, kernels excluded: a file under a ``kernels`` folder or named for
  them, and a numba-compiled function (``@njit``, ``@numba.jit``, ...: code written for
  speed, where splitting costs a call the compiler may not inline). A docstring that merely
  mentions kernels exempts nothing;
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
NUMBA_DECORATORS = {"njit", "jit", "vectorize", "guvectorize", "stencil", "cfunc"}


def _is_kernel_file(path: Path) -> bool:
    return "kernel" in path.relative_to(ROOT).as_posix().lower()


def _is_numba_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = ast.unparse(target)
        if name.split(".")[0] == "numba" or name.split(".")[-1] in NUMBA_DECORATORS:
            return True
    return False


def _library_files() -> list[tuple[Path, ast.Module, int]]:
    out = []
    for package in LIBRARY:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not _is_kernel_file(path):
                source = path.read_text()
                out.append((path, ast.parse(source), len(source.splitlines())))
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
        and not _is_numba_function(node)
    ]
    assert not long_files, f"files above {FILE_LIMIT} lines: {long_files}"
    assert not long_functions, f"functions above {FUNCTION_LIMIT} lines: {long_functions}"


def test_the_kernel_rule_by_hand() -> None:
    """A file is a kernel by its path, a function by its numba decorator; prose exempts nothing."""
    assert _is_kernel_file(ROOT / "seqmodels" / "kernels" / "scan.py")
    assert _is_kernel_file(ROOT / "marl" / "core" / "kernels" / "whitening_numba.py")
    assert not _is_kernel_file(ROOT / "marl" / "core" / "whitening.py")  # "one kernel" in prose
    source = (
        "import numba\nfrom numba import njit\n"
        "@njit(cache=True)\ndef a(x):\n    return x\n"
        "@numba.njit\ndef b(x):\n    return x\n"
        "@numba.vectorize(['f8(f8)'])\ndef c(x):\n    return x\n"
        "@functools.cache\ndef d(x):\n    return x\n"
        "def e(x):\n    '''A numba kernel, by its docstring only.'''\n    return x\n"
    )
    functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    assert {name for name, node in functions.items() if _is_numba_function(node)} == {"a", "b", "c"}


def test_marl_top_level_holds_entry_points_and_public_paths_only() -> None:
    top = {p.name for p in (ROOT / "marl").glob("*.py")}
    assert top - {"__init__.py"} - ENTRY_POINTS - PUBLIC_PATHS == set()
    for name in ENTRY_POINTS:
        source = (ROOT / "marl" / name).read_text()
        assert '__name__ == "__main__"' in source, f"marl/{name} is no python -m entry point"
