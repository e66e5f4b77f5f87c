"""Every Celery task the product sends by name is a registered task: each name given to task_send or
task_send_on_commit is a constant of some app's task_names module (never a literal), every such constant names
a registered task, and so does every entry of the beat schedule."""
import ast
import importlib
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings

from vmetal_console.celery import app as celery_app

ROOT = Path(__file__).resolve().parent.parent
SENDERS = {"task_send", "task_send_on_commit"}
PLUMBING = {ROOT / "core" / "tasks.py"}  # where task_send itself is defined


def product_apps() -> list:
    """The installed apps whose code is in this repository."""
    return [config for config in apps.get_app_configs() if Path(config.path).resolve().is_relative_to(ROOT)]


def task_names_modules() -> dict[str, object]:
    """{module name: module} of every product app's task_names."""
    found = {}
    for config in product_apps():
        if (Path(config.path) / "task_names.py").exists():
            found[f"{config.name}.task_names"] = importlib.import_module(f"{config.name}.task_names")
    return found


def constants(module) -> dict[str, str]:
    return {name: value for name, value in vars(module).items() if name.isupper() and isinstance(value, str)}


def registered() -> set[str]:
    celery_app.autodiscover_tasks(force=True)  # every installed app's tasks module, as a worker finds them
    return set(celery_app.tasks)


def product_files() -> list[Path]:
    files = set()
    for config in product_apps():
        for path in Path(config.path).resolve().rglob("*.py"):
            if "migrations" not in path.parts and path not in PLUMBING:
                files.add(path)
    return sorted(files)


def _package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def sends(path: Path, package: str | None = None) -> list[tuple[int, str | None, str]]:
    """(line, the task name it resolves to or None, how it is written) for each task_send call in a file of
    `package` (by default the one it sits in). A name resolves when it is `task_names.X` or `X` imported from a
    task_names module."""
    package = _package_of(path) if package is None else package
    tree = ast.parse(path.read_text(), str(path))
    modules, names = {}, {}  # local alias → task_names module; local name → (module, constant)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _absolute(node, package)
            for alias in node.names:
                local = alias.asname or alias.name
                if alias.name == "task_names":
                    modules[local] = f"{source}.task_names"
                elif source.endswith(".task_names"):
                    names[local] = (source, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.endswith(".task_names"):
                    modules[alias.asname or alias.name] = alias.name
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if func not in SENDERS or not node.args:
            continue
        first = node.args[0]
        written, resolved = ast.unparse(first), None
        if isinstance(first, ast.Attribute) and ast.unparse(first.value) in modules:
            resolved = (modules[ast.unparse(first.value)], first.attr)
        elif isinstance(first, ast.Name) and first.id in names:
            resolved = names[first.id]
        value = None
        if resolved is not None:
            value = getattr(importlib.import_module(resolved[0]), resolved[1], None)
        found.append((node.lineno, value, written))
    return found


def test_the_finder_reads_constants_and_refuses_literals(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from core import tasks\nfrom core.tasks import task_send\nfrom claims import task_names\n"
                      "from claims.task_names import RECONCILE_POOLS as R\nfrom . import task_names as names\n"
                      "task_send(task_names.RECONCILE_POOLS)\ntask_send(R)\n"
                      "tasks.task_send_on_commit(names.PLACE_GROUP_AGAIN)\ntask_send('claims.tasks.x')\n")
    assert sends(sample, package="claims") == [
        (6, "claims.tasks.reconcile_pools", "task_names.RECONCILE_POOLS"), (7, "claims.tasks.reconcile_pools", "R"),
        (8, "claims.tasks.place_group_again", "names.PLACE_GROUP_AGAIN"), (9, None, "'claims.tasks.x'")]


@pytest.mark.parametrize("path", [p for p in product_files() if sends(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_task_sent_is_named_by_a_task_names_constant_and_registered(path):
    tasks = registered()
    wrong = [f"line {line}: {written}" + (" is not a constant of a task_names module" if value is None
                                          else f" = {value!r} is no registered task")
             for line, value, written in sends(path) if value is None or value not in tasks]
    assert wrong == []


@pytest.mark.parametrize("module", sorted(task_names_modules()))
def test_every_declared_task_name_is_a_registered_task(module):
    declared = constants(task_names_modules()[module])
    assert declared, f"{module} declares no task name"
    assert {name: value for name, value in declared.items() if value not in registered()} == {}


def test_the_apps_that_offer_tasks_declare_their_names():
    tasks = {name for name in registered() if not name.startswith("celery.")}
    declared = {value for module in task_names_modules().values() for value in constants(module).values()}
    assert sorted(tasks - declared) == []


def test_every_beat_entry_names_a_registered_task():
    tasks = registered()
    assert settings.CELERY_BEAT_SCHEDULE
    assert {key: entry["task"] for key, entry in settings.CELERY_BEAT_SCHEDULE.items()
            if entry["task"] not in tasks} == {}
