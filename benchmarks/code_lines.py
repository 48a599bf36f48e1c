"""Code lines of easyrl/ (or another tree), as cloc counts them for Python: lines holding a
token other than a comment, a docstring (module, class, function or attribute docstring) or
whitespace. Generated protobuf modules are left out.

    python benchmarks/code_lines.py [DIR] [--per-file]
"""

import argparse
import ast
import io
import tokenize
from pathlib import Path

from report import add_smoke

SMOKE_LINE = r"^\d+ code lines, \d+ physical lines, \d+ files"
"""The line a `--smoke` run must print (tests/test_benchmarks.py)."""
SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}


def docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every bare string statement (docstrings, attribute docstrings)."""
    lines: set[int] = set()
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        for stmt in node.body if isinstance(node, scopes) else []:
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def code_lines(path: Path) -> int:
    """The code lines of one Python file."""
    source = path.read_text()
    docs = docstring_lines(ast.parse(source))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in SKIP or token.type == tokenize.ENDMARKER:
            continue
        lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docs)
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("root", nargs="?", default="easyrl")
    parser.add_argument("--per-file", action="store_true")
    add_smoke(parser)  # the default run is seconds long already: --smoke changes nothing
    args = parser.parse_args()
    files = sorted(p for p in Path(args.root).rglob("*.py") if "_pb2" not in p.name)
    counts = {p: code_lines(p) for p in files}
    if args.per_file:
        for path, n in counts.items():
            print(f"{n:6d} {path}")
    physical = sum(len(p.read_text().splitlines()) for p in files)
    print(f"{sum(counts.values())} code lines, {physical} physical lines, {len(files)} files")


if __name__ == "__main__":
    main()
