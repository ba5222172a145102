"""Every ``PDJIT_*`` environment variable pdjit reads is a documented setting: the README's
"Environment variables" table lists exactly the variables the sources name, each with what it
does and why a user would set it.

The names are read from the sources as text: every ``PDJIT_...`` word of a Python module under
``src/pdjit``, and the ``getenv`` calls of the C runtime's files, less the C runtime's own
identifiers (status codes, dtype codes, macros of ``aot/c`` and of the C text ``aot/csource.py``
writes).
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "pdjit"
_NAME = re.compile(r"\bPDJIT_[A-Z][A-Z0-9_]*\b")


def _c_identifiers() -> set:
    """The C runtime's names: those of its headers, the macros its ``.c`` files define, and
    those of the C text ``aot/csource.py`` writes."""
    c = PKG / "aot" / "c"
    names = set(_NAME.findall((PKG / "aot" / "csource.py").read_text()))
    for p in c.glob("*.h"):
        names |= set(_NAME.findall(p.read_text()))
    for p in c.glob("*.c"):
        names |= set(re.findall(r"#define\s+(PDJIT_[A-Z0-9_]+)", p.read_text()))
    return names


def read_by_the_sources() -> set:
    names = set()
    for p in PKG.rglob("*.py"):
        if p.name != "csource.py":
            names |= set(_NAME.findall(p.read_text()))
    for p in (PKG / "aot" / "c").iterdir():
        if p.suffix == ".c":
            names |= set(re.findall(r'getenv\("(PDJIT_[A-Z0-9_]+)"\)', p.read_text()))
    return names - _c_identifiers()


def readme_table() -> dict:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Environment variables"):]
    section = section[:section.index("\n### ", 1)]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`PDJIT_"):
            continue
        for name in _NAME.findall(cells[0]):
            rows[name] = cells[1:]
    return rows


def test_the_readme_documents_every_variable_the_sources_read():
    table = readme_table()
    read = read_by_the_sources()
    assert {"PDJIT_CACHE_DIR", "PDJIT_STRICT", "PDJIT_NUM_THREADS"} <= read   # the scan works
    assert "PDJIT_OK" not in read and "PDJIT_FREE_SLOTS" not in read           # C names are not
    assert sorted(read - set(table)) == [], "read by pdjit, not in the README's table"
    assert sorted(set(table) - read) == [], "in the README's table, read nowhere"
    for name, (effect, why) in table.items():
        assert effect and why, f"{name}: the table says what it does and why one sets it"
