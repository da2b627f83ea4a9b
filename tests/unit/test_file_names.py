"""Only broker/datadir.py spells a file name (its header lists every name under the data and the
run directory); every other shipped module takes names from it, and a planted one is found.

What counts as spelling a file name, in a module's code (docstrings and comments are prose):

1. a string literal, or an f-string's text, that is a file name with one of the broker's
   suffixes (``acls.json``, ``worker-{}.ipc``, ``.lock``, ``*.conf``...);
2. a literal path part: an argument of ``os.path.join`` (after the first), ``Path(...)`` or
   ``joinpath``, or the right side of ``/`` (``Path(d) / "stats"``);
3. a literal program name handed to what names a program's files (its role lock, its stats
   file): ``enter_program``, ``claim_program``, ``StatsFile``, ``stats_file``, ``role_lock_name``;
4. a literal suffix handed to ``worker_file`` or ``worker_id_of``;
5. a module constant whose name says it is one (``*_FILE``, ``*_DIR``, ``*_SUFFIX``...) bound
   to a literal.

Absolute paths (``/proc/...``) are the system's, not ours; shared-memory and abstract socket
names (shm/region.py, the doorbells) are not in either directory. tests/ and bench/ are not shipped.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("tailrace", "shm", "client", "broker", "persistence", "actors", "router", "ops", "spark_bridge")
OWNER = "broker/datadir.py"

# Known spellings outside datadir.py, each to be moved there and removed from this list (then
# the test fails if it comes back). None left: the worker's went with its split (worker_role).
ALLOWED: set[tuple[str, str]] = set()

SUFFIXES = ("json", "log", "lock", "sock", "bell", "ipc", "pid", "conf", "index", "msgpack", "key", "key_secret", "tmp")
FILE_NAME = re.compile(r"^[\w.{}<>*-]*\.(" + "|".join(SUFFIXES) + r")$")
PATH_PART = re.compile(r"^[\w.{}-]+$")
NAMING_CALLS = {"enter_program", "claim_program", "StatsFile", "stats_file", "role_lock_name"}
SUFFIX_CALLS = {"worker_file", "worker_id_of"}
CONSTANT_NAME = re.compile(r"_(FILE|DIR|SUFFIX|LOCK|BELL|SOCKET|CONF|KEY)$")


def _text(node) -> str | None:
    """A literal's text; an f-string's with ``{}`` for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def spelled(source: str) -> list[tuple[int, str]]:
    """(line, text) of each file name the module's code spells."""
    tree = ast.parse(source)
    prose = {id(n.body[0].value) for n in ast.walk(tree)
             if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
             and n.body and isinstance(n.body[0], ast.Expr)}
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []

    def part(node):
        text = _text(node)
        if text is not None and not text.startswith("/") and PATH_PART.match(text):
            found.append((node.lineno, text))

    for n in ast.walk(tree):
        if id(n) in prose or id(n) in inside_fstrings:
            continue
        text = _text(n)
        if text is not None and not text.startswith("/") and FILE_NAME.match(text):
            found.append((n.lineno, text))
        elif isinstance(n, ast.Call):
            name = _call_name(n)
            if name in ("join", "joinpath", "Path", "PurePath"):
                for a in n.args[1:] if name == "join" else n.args:
                    part(a)
            elif name in NAMING_CALLS | SUFFIX_CALLS:
                for a in n.args[1:] if name in {"enter_program", "claim_program", "StatsFile", "stats_file", "worker_id_of"} else n.args:
                    part(a)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            part(n.right)
    for n in tree.body:
        if isinstance(n, ast.Assign) and _text(n.value) is not None:
            for target in n.targets:
                if isinstance(target, ast.Name) and CONSTANT_NAME.search(target.id):
                    found.append((n.lineno, _text(n.value)))
    return sorted(set(found))


def shipped_modules(root: Path):
    for folder in SHIPPED:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else ():
            if not path.is_symlink() and "__pycache__" not in path.parts:
                yield path.relative_to(root).as_posix(), path


def offenders(root: Path) -> list[str]:
    out = []
    for rel, path in shipped_modules(root):
        if rel == OWNER:
            continue
        for line, text in spelled(path.read_text()):
            if (rel, text) not in ALLOWED:
                out.append(f"{rel}:{line}: {text!r}")
    return out


def test_no_shipped_module_but_datadir_spells_a_file_name():
    assert offenders(ROOT) == [], "name these in broker/datadir.py and import them"


def test_datadir_itself_spells_the_names_the_others_take():
    names = {text for _line, text in spelled((ROOT / OWNER).read_text())}
    assert {"topics.json", "acls.json", "quotas.json", "log_starts.json", ".tmp", "stats", "auth"} <= names


def test_the_allow_list_holds_only_spellings_still_there():
    for rel, text in ALLOWED:
        assert text in {t for _l, t in spelled((ROOT / rel).read_text())}, f"{rel} no longer spells {text!r}: drop it from ALLOWED"


@pytest.mark.parametrize("where, planted", [
    ("router/topics.py", 'CATALOG = "topics.json"'),
    ("broker/acl.py", 'def _p(d):\n    return os.path.join(d, "auth", "acls.json")'),
    ("ops/serve.py", 'def _p(d):\n    return Path(d) / "stats"'),
    ("persistence/journal.py", 'def _p(w):\n    return f"worker-{w}.bell"'),
    ("router/server.py", 'def _p(s):\n    return StatsFile(s.ipc_path(), "router")'),
    ("broker/settings.py", 'def _p(w):\n    return datadir.worker_file(w, "pid")'),
    ("client/producer.py", 'STATE_DIR = "state"'),
])
def test_a_planted_file_name_is_found(tmp_path, where, planted):
    folder = where.split("/")[0]  # a copy of the planted module's folder: the others are not read
    shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    assert offenders(tmp_path) == []
    target = tmp_path / where
    target.write_text(target.read_text() + f"\n\n{planted}  # planted by the test\n")
    found = offenders(tmp_path)
    assert found and all(f.startswith(where + ":") for f in found), found


def test_prose_and_system_paths_are_not_file_names():
    source = '"""Rules live in acls.json."""\nERR = "give the NAME.key_secret file"\nP = Path("/proc/self/status")\n'
    assert spelled(source) == []
