"""The layout's rules (docs/ARCHITECTURE.md), checked on the source: no import cycle among
musegen's modules, counting imports inside functions; no module over 500 lines; the metrics
know no tokenizer's internals; the model imports nothing above it, and the precision policy
nothing of the model."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "musegen"
MAX_LINES = 500
# What the model may import from outside musegen/model/: the errors and the device's facts, which
# import nothing of musegen but each other.
BELOW_THE_MODEL = {"musegen", "musegen.errors", "musegen.choices", "musegen.device"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(name: str) -> set[str]:
    """The musegen modules that importing `name` runs, or that its functions import when called
    (`if TYPE_CHECKING:` blocks run never and are left out). Importing a.b.c runs a and a.b too;
    a module's own packages are left out, as Python has them running already."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in MODULES and not (name == candidate or name.startswith(candidate + ".")):
                found.add(candidate)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            add(source)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in MODULES:  # `from package import module`
                    add(submodule)
                elif name.startswith(source + "."):  # a name defined by an enclosing package
                    found.add(source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_musegen_modules():
    graph = {name: imported_modules(name) for name in MODULES}
    assert graph["musegen.cli"], "the import graph found no imports: the parser is broken"
    assert cycles(graph) == []


@pytest.mark.parametrize("name", sorted(MODULES), ids=str)
def test_no_module_is_longer_than_500_lines(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)}: {lines} lines"


def test_no_evaluation_module_imports_a_tokenizer_module():
    for name in MODULES:
        if name.startswith(("musegen.evaluation", "musegen.metrics")):
            imports = imported_modules(name)
            inside = sorted(m for m in imports if m.startswith("musegen.tokenizers."))
            assert inside in ([], ["musegen.tokenizers.base"]), f"{name} imports {inside}"


def test_metrics_are_pure_so_training_may_import_them():
    """musegen.metrics measures notes and losses; the runners in musegen.evaluation load
    checkpoints and sample. Training imports metrics, so metrics import no runner, no generation,
    no checkpoint and no training."""
    above = ("musegen.evaluation", "musegen.generation", "musegen.training", "musegen.checkpoint", "musegen.studio")
    for name in MODULES:
        if name.startswith("musegen.metrics"):
            wrong = sorted(m for m in imported_modules(name) if m.startswith(above))
            assert wrong == [], f"{name} imports {wrong}"
    for name in MODULES:
        if name.startswith("musegen.training"):
            assert not [m for m in imported_modules(name) if m.startswith("musegen.evaluation")], name


def test_the_model_imports_nothing_above_it():
    """The caller chooses the precision and passes it down (musegen.generation.precision): the
    model needs no policy, so no arrow runs from musegen/model/ back up."""
    for name in MODULES:
        if name.startswith("musegen.model"):
            above = sorted(
                m for m in imported_modules(name) if not m.startswith("musegen.model") and m not in BELOW_THE_MODEL
            )
            assert above == [], f"{name} imports {above}"
    for name in BELOW_THE_MODEL - {"musegen"}:
        assert imported_modules(name) <= BELOW_THE_MODEL, f"{name} imports {imported_modules(name)}"


def test_the_precision_policy_imports_nothing_of_the_model():
    """musegen.precision times and caches what its callers build; it runs no step itself."""
    assert not [m for m in imported_modules("musegen.precision") if m.startswith("musegen.model")]


def test_importing_the_model_runs_no_precision_policy():
    """In a fresh interpreter, as a user's script would: the model alone loads no musegen.precision."""
    check = "import sys, musegen.model.transformer; print(*(m for m in sys.modules if m.startswith('musegen')))"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = loaded.stdout.split()
    assert "musegen.model.transformer" in modules and "musegen.precision" not in modules
    assert all(m.startswith("musegen.model") or m in BELOW_THE_MODEL for m in modules), modules


def test_the_command_line_builds_its_help_without_torch():
    """`musegen --help` and `musegen sample --help` take their options from the declarations in
    musegen.generation.settings; loading torch there costs seconds before any help is shown."""
    check = "import sys, musegen.cli.sample, musegen.cli.evaluate; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


HISTORY = re.compile(r"\b[Ii]ssues? #?\d+\b|\(#\d+\)|\b(?:second|third|fourth|fifth) round\b")


def test_code_and_reference_docs_narrate_no_history():
    """Issue numbers and rounds belong in commit messages and docs/experiments/, not in the code
    or the reference docs a user reads."""
    texts = [*(ROOT / "musegen").rglob("*.py"), *(ROOT / "musegen").rglob("*.md"), ROOT / "README.md"]
    texts += [p for p in (ROOT / "docs").rglob("*.md") if "experiments" not in p.relative_to(ROOT / "docs").parts]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts for m in HISTORY.finditer(p.read_text())]
    assert found == []
