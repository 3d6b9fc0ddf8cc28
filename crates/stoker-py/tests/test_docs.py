"""The README's and docs/'s code blocks run as written against the demo data, and their links
resolve.

Per Markdown file, in document order and in one interpreter: ```python blocks are executed,
and each line of a ```sh block that starts with ``stoker `` runs in a shell (the CLI of this
build on PATH), in a directory holding ``demo/`` (``stoker.demo("demo")``). A block that
cannot run here is marked on the line right before its fence with
``<!-- not run: REASON -->``. ```text blocks are output. ```rust blocks are compiled as
doctests of the ``stoker`` crate (crates/stoker/src/docs.rs includes every page), so they
must be ``rust,no_run`` or, marked, ``rust,ignore``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+)\s*([^`\s]*)\s*$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    not_run: Optional[str]

    @property
    def lang(self) -> str:
        return self.info.split(",")[0].lower()

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> List[Block]:
    out: List[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, ticks, info = m.group(1), m.group(2), m.group(3)
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        marker = NOT_RUN.match(lines[start - 1]) if start > 0 else None
        out.append(Block(page, start + 1, info, "\n".join(body) + "\n", marker.group(1) if marker else None))
        i += 1
    return out


def sh_runnable(code: str) -> bool:
    commands = [l.strip() for l in code.splitlines() if l.strip() and not l.strip().startswith("#")]
    return bool(commands) and all(c.startswith("stoker ") for c in commands)


def runnable(b: Block) -> bool:
    if b.not_run is not None or b.lang == "text":
        return False
    return b.lang == "python" or (b.lang in ("sh", "bash", "console") and sh_runnable(b.code))


def test_every_block_runs_or_says_why_not() -> None:
    problems = []
    for page in PAGES:
        for b in blocks(page):
            if b.lang == "rust":
                flags = set(b.info.split(",")[1:])
                if b.not_run is None and "no_run" not in flags:
                    problems.append(f"{b.where()}: a Rust block is a doctest; fence it rust,no_run")
                if b.not_run is not None and "ignore" not in flags:
                    problems.append(f"{b.where()}: a Rust block marked not run must be rust,ignore")
            elif b.lang == "":
                problems.append(f"{b.where()}: a fence without a language (python, sh, rust, text...)")
            elif not runnable(b) and b.not_run is None and b.lang != "text":
                problems.append(f"{b.where()}: a {b.lang} block that does not run here needs <!-- not run: REASON -->")
    assert not problems, "\n".join(problems)


def test_every_page_is_a_doctest_of_the_library() -> None:
    docs_rs = (ROOT / "crates" / "stoker" / "src" / "docs.rs").read_text()
    missing = [p.relative_to(ROOT).as_posix() for p in PAGES if f'"../../../{p.relative_to(ROOT).as_posix()}"' not in docs_rs]
    assert not missing, f"pages whose Rust blocks no doctest compiles (add them to docs.rs): {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.strip().lower().replace("`", "")
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(page: Path) -> set:
    seen: Dict[str, int] = {}
    out = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not in_fence:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_links_resolve() -> None:
    problems = []
    for page in PAGES:
        text = page.read_text()
        # Links inside code blocks and inline code are examples, not links.
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in LINK.findall(text):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http(s), mailto: not checked offline
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                problems.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading with that anchor in {dest.name}")
    assert not problems, "\n".join(problems)


RUNNER = r"""
import json, os, subprocess, sys, traceback
blocks = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for b in blocks:
    try:
        if b["lang"] == "python":
            exec(compile(b["code"], b["where"], "exec"), ns)
        else:
            for line in b["code"].splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                p = subprocess.run(line, shell=True, capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"`{line}` exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    except BaseException:
        print(f"FAILED at {b['where']}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(f"ok {b['where']}", flush=True)
"""


@pytest.fixture(scope="session")
def demo(tmp_path_factory) -> Path:
    import stoker

    root = tmp_path_factory.mktemp("docs-demo")
    stoker.demo(root / "demo")
    return root / "demo"


def _cli_dir() -> Path:
    exe = os.environ.get("STOKER_CLI", str(ROOT / "target" / "debug" / "stoker"))
    if not Path(exe).exists():
        pytest.skip(f"no stoker CLI at {exe} (cargo build -p stoker-cli, or set STOKER_CLI)")
    return Path(exe).parent


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_blocks_run(page: Path, demo: Path, tmp_path: Path) -> None:
    todo = [
        {"lang": "python" if b.lang == "python" else "sh", "code": b.code, "where": b.where()}
        for b in blocks(page)
        if runnable(b)
    ]
    if not todo:
        return
    shutil.copytree(demo, tmp_path / "demo")
    (tmp_path / "blocks.json").write_text(json.dumps(todo))
    (tmp_path / "runner.py").write_text(RUNNER)
    env = dict(os.environ, PATH=f"{_cli_dir()}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    p = subprocess.run(
        [sys.executable, "runner.py", "blocks.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    assert p.stdout.count("\nok ") + p.stdout.startswith("ok ") == len(todo), p.stdout
