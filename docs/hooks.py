"""MkDocs hooks: the parts of the documentation that are generated from the code at build time.

A page asks for a generated part with a pair of comments, each on a line of its own; what lies between
them is what a reader of the Markdown file sees on the code host (a pointer to the built page), and the
build replaces it:

* ``<!-- generated: config-keys -->`` ... ``<!-- /generated -->``: the table of every setting, from :mod:`autobatch.settings.docs`
  (the same metadata that makes ``--help``, ``autobatch init`` and the settings' checks);
* ``<!-- generated: starter-toml -->``: the file ``autobatch init`` writes, from the same metadata;
* ``<!-- generated: layers -->``: the package's layers as declared in ``pyproject.toml``
  (``[tool.autobatch.layers] order``, bottom first), a Mermaid picture of the imports between its
  top-level packages (read with :mod:`ast` from ``autobatch/**/*.py``), and a table of every module
  with the first line of its docstring.

Nothing here imports torch: the settings' modules are plain Python, and the layers are read from the
source text. An unknown placeholder is an error, so a typo fails ``mkdocs build --strict``.

The same file holds :class:`SphinxRoles`, a griffe extension that mkdocstrings loads (``mkdocs.yml``):
the docstrings are written with Sphinx roles (``:class:`~x.Y```) and ``::`` literal blocks, which it
turns into Markdown code spans and blocks before the API reference renders them.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project supports Python 3.9
    import tomli as tomllib

try:
    from griffe import Extension
except ImportError:  # pragma: no cover - griffe comes with mkdocstrings
    Extension = object  # type: ignore[misc,assignment]

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "autobatch"
PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z-]+) -->\n.*?^<!-- /generated -->$", re.M | re.S)
ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")


# --- docstrings: Sphinx roles to Markdown ----------------------------------------------------------


def sphinx_to_markdown(text: str) -> str:
    """Sphinx roles as code spans (``~`` keeps the last name), ``::`` literal-block markers as colons."""
    text = ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)
    text = re.sub(r"^[ \t]*::[ \t]*$", "", text, flags=re.M)
    return re.sub(r"(\S)::[ \t]*$", r"\1:", text, flags=re.M)


class SphinxRoles(Extension):  # type: ignore[misc,valid-type]
    """A griffe extension: every docstring through :func:`sphinx_to_markdown`."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if getattr(obj, "docstring", None) is not None:
            obj.docstring.value = sphinx_to_markdown(obj.docstring.value)


# --- the settings -----------------------------------------------------------------------------------


def config_keys() -> str:
    from autobatch.settings.docs import render_markdown_table

    return render_markdown_table()


def starter_toml() -> str:
    from autobatch.settings.docs import render_starter_toml

    return "```toml\n" + render_starter_toml() + "```\n"


# --- the layers ---------------------------------------------------------------------------------------


def declared_layers(pyproject: Path = ROOT / "pyproject.toml") -> list[tuple[list[str], str]]:
    """The layers, bottom first, each with the comment that follows it in ``pyproject.toml`` (if any)."""
    text = pyproject.read_text(encoding="utf-8")
    order = tomllib.loads(text)["tool"]["autobatch"]["layers"]["order"]
    comments: dict[tuple[str, ...], str] = {}
    for line in text.splitlines():
        match = re.match(r"\s*\[(.*?)\],?\s*#\s*(.+)$", line)
        if match:
            names = tuple(re.findall(r'"([^"]+)"', match.group(1)))
            comments[names] = match.group(2).strip()
    return [(list(names), comments.get(tuple(names), "")) for names in order]


def unit_of(path: Path) -> str:
    """The top-level package or module of autobatch/ that ``path`` belongs to."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def units_imported(path: Path, tree: ast.Module) -> set[str]:
    """The top-level names of autobatch/ that one file imports (at module level or inside functions)."""
    own = module_name(path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the file's package
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [module] if module != "autobatch" else [f"autobatch.{a.name}" for a in node.names]
        else:
            continue
        found.update(n.split(".")[1] for n in names if n.startswith("autobatch."))
    return found


def first_line(tree: ast.Module) -> str:
    doc = ast.get_docstring(tree) or ""
    paragraph = doc.strip().split("\n\n")[0]
    line = " ".join(paragraph.split())
    return sphinx_to_markdown(line).replace("``", "`")


def read_package() -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
    """Per top-level name: its modules (dotted name -> first docstring line), and the names it imports."""
    modules: dict[str, dict[str, str]] = defaultdict(dict)
    imports: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        unit = unit_of(path)
        modules[unit][module_name(path)] = first_line(tree)
        imports[unit] |= units_imported(path, tree) - {unit}
    return dict(modules), dict(imports)


def reduced(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports less those another path of imports already implies (the picture's edges)."""

    def reaches(start: str, goal: str, skip: tuple[str, str]) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in imports.get(node, ()):
                if (node, nxt) == skip or nxt in seen:
                    continue
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    return {u: {v for v in vs if not reaches(u, v, (u, v))} for u, vs in imports.items()}


def node_id(unit: str) -> str:
    return "u_" + unit.strip("_")


def layers_markdown() -> str:
    layers = declared_layers()
    modules, imports = read_package()
    rank = {unit: index for index, (names, _) in enumerate(layers) for unit in names}
    present = [(names, note) for names, note in layers]
    unlayered = sorted(set(modules) - set(rank))

    lines = ["```mermaid", "flowchart TB"]
    for index in reversed(range(len(present))):
        names, note = present[index]
        title = f"layer {index}" + (f": {note}" if note else "")
        lines.append(f'  subgraph L{index}["{_mermaid_text(title)}"]')
        lines.append("    direction LR")
        for unit in names:
            label = unit if unit in modules else f"{unit} (not yet in the code)"
            lines.append(f'    {node_id(unit)}["{_mermaid_text(label)}"]')
        lines.append("  end")
    for unit in unlayered:
        lines.append(f'  {node_id(unit)}["{_mermaid_text(unit + " (no layer)")}"]')
    for unit, targets in sorted(reduced(imports).items()):
        for target in sorted(targets):
            arrow = "-.->" if rank.get(target, -1) > rank.get(unit, -1) else "-->"
            lines.append(f"  {node_id(unit)} {arrow} {node_id(target)}")
    lines.append("```")

    lines += [
        "",
        "An arrow reads *imports*. The picture leaves out an import that a chain of other arrows already "
        "implies; the tables below list every one. A dotted arrow would be an import up a layer, which "
        "the layer rule forbids.",
        "",
    ]
    if unlayered:
        lines += [
            "!!! warning",
            f"    Not in any declared layer: {', '.join(f'`{u}`' for u in unlayered)}.",
            "",
        ]
    for index in reversed(range(len(present))):
        names, note = present[index]
        lines += [f"### Layer {index}" + (f": {note}" if note else ""), ""]
        for unit in names:
            lines += _unit_table(unit, modules.get(unit, {}), imports.get(unit, set()), rank)
    return "\n".join(lines) + "\n"


def _unit_table(unit: str, mods: dict[str, str], uses: set[str], rank: dict[str, int]) -> list[str]:
    if not mods:
        return [f"**`{unit}`**: declared, not yet in the code.", ""]
    shown = ", ".join(
        f"`{u}`" + (" (**up a layer**)" if rank.get(u, -1) > rank.get(unit, -1) else "") for u in sorted(uses)
    )
    out = [f"**`{unit}`** imports {shown or 'nothing else of autobatch'}.", ""]
    out += ["| module | what it holds |", "| --- | --- |"]
    out += [f"| `{name}` | {text.replace('|', '/') or '-'} |" for name, text in sorted(mods.items())]
    return [*out, ""]


def _mermaid_text(text: str) -> str:
    return text.replace('"', "'").replace("`", "").replace(";", ",")


# --- the hook -------------------------------------------------------------------------------------------

GENERATORS = {"config-keys": config_keys, "starter-toml": starter_toml, "layers": layers_markdown}


def on_config(config: Any) -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown generated part {name!r}")
        return GENERATORS[name]()

    out = PLACEHOLDER.sub(generate, markdown)
    if "<!-- generated:" in out:
        raise ValueError(f"{page.file.src_path}: a generated part without its closing <!-- /generated -->")
    return out
