"""docs/ and the README say what the code does: every setting documented, every link inside the repository and
resolving, every command real, the host life cycle and the flows as the code declares them."""
import argparse
import re
from pathlib import Path

import pytest
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
SETTINGS = [ROOT / "vmetal_console" / name for name in ("settings.py", "settings_api.py", "settings_console.py",
                                                        "settings_signin.py")]
# Names made in the lab's QEMU user network, the example proxy name and loopback: addresses, not sites.
LOCAL_HOSTS = {"127.0.0.1", "localhost", "10.0.2.2", "10.0.2.3", "console.example.com", ""}


def example_host(host: str) -> bool:
    """A name under example.com (RFC 2606), or an address of the provisioning network the docs use as their example
    (DHCP_RANGE's default subnet, 172.22.0.0/24): what a reader replaces with their own."""
    return host.endswith(".example.com") or host.startswith("172.22.0.")


def text(page: Path) -> str:
    return page.read_text()


def settings_read() -> set[str]:
    """Every environment variable the settings modules read, by any of the ways they read one."""
    source = "\n".join(path.read_text() for path in SETTINGS)
    names = set(re.findall(r"""(?:environ\.get|env_float|env_bool|from_environment)\(\s*["']([A-Z][A-Z0-9_]+)["']""",
                           source))
    names |= set(re.findall(r"""environ\[["']([A-Z][A-Z0-9_]+)["']\]""", source))
    keys = (ROOT / "core" / "keys.py").read_text()
    names |= set(re.findall(r'"([A-Z_]+)"', keys.split("REQUIRED = ", 1)[1].split("\n", 1)[0]))
    return names


def test_every_environment_variable_the_settings_read_is_documented_in_operations():
    names = settings_read()
    assert {"DATABASE_URL", "SECRET_KEY", "AGENT_LISTEN", "MAX_REQUEST_BODY_MB", "CONSOLE_PAGE_SIZE"} <= names
    operations = text(DOCS / "operations.md")
    assert not sorted(name for name in names if f"`{name}`" not in operations)


def test_the_docs_index_names_every_page_of_docs():
    index = text(DOCS / "README.md")
    pages = {page.name for page in DOCS.glob("*.md")} - {"README.md"}
    assert pages >= {"architecture.md", "operations.md", "lab.md", "security.md", "api.md", "manifests.md",
                     "benchmarks.md"}
    assert not sorted(name for name in pages if f"]({name})" not in index)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository_and_every_relative_link_resolves(page):
    body = text(page)
    links = re.findall(r"\]\(([^)\s]+)\)", body) + re.findall(r"<(https?://[^>]+)>", body)
    assert links or page.name != "README.md"
    outside = [link for link in links if re.match(r"[a-z][a-z0-9+.-]*:", link)]
    assert not outside, f"{page.name} links out of the repository"
    broken = [link for link in links if not (page.parent / link.split("#", 1)[0]).exists()]
    assert not broken, f"{page.name}: links to nothing"
    # A URL written out (in a command, an example) names this machine, the lab's VMs or the example proxy only.
    hosts = re.findall(r"https?://([^/:\s`'\"<>)]*)", body)
    assert not sorted({host for host in hosts if host not in LOCAL_HOSTS and not example_host(host)})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_manage_py_command_the_docs_show_exists(page):
    named = set(re.findall(r"manage\.py ([a-z][a-z-]*)", text(page)))
    assert not sorted(named - set(get_commands()))


def markdown_table(body: str, header: str) -> list[list[str]]:
    """The rows of the table whose header line is `header`, each a list of its cells."""
    lines = body.splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_life_cycle_table_is_the_transition_table():
    from hosts.lifecycle import TRANSITIONS

    rows = markdown_table(text(DOCS / "architecture.md"), "| from | to |")
    documented = {ticked(state)[0]: set(ticked(to)) for state, to in rows}
    assert documented == {str(state): {str(to) for to in targets} for state, targets in TRANSITIONS.items()}


def test_the_flows_table_lists_every_flow_with_its_steps_in_order():
    from hosts.lifecycle import FLOWS

    rows = markdown_table(text(DOCS / "architecture.md"), "| flow | state | steps, in order |")
    documented = {ticked(name)[0]: (ticked(state)[0], ticked(steps)) for name, state, steps in rows}
    assert documented == {name: (str(flow.state), [step.name for step in flow.steps]) for name, flow in FLOWS.items()}


def test_every_in_progress_state_has_its_deadline_row_with_its_failure_state():
    from hosts.lifecycle import STATE_FAILURE

    rows = markdown_table(text(DOCS / "architecture.md"), "| state | flow | deadline | then |")
    documented = {ticked(state)[0]: ticked(then)[0] for state, _flow, _deadline, then in rows}
    assert documented == {str(state): str(failure) for state, failure in STATE_FAILURE.items()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_of_the_repository_the_docs_name_exists(page):
    """A file named in `code` (agent/seed.py, claims/steps.py) is there. Lines quoted with `>` are the paths the
    lead corrects at a merge, and what lives under var/ is made at run time."""
    tops = {path.name for path in ROOT.iterdir() if path.is_dir()} - {"var", ".venv"}
    lines = [line for line in text(page).splitlines() if not line.lstrip().startswith(">")]
    named = set(re.findall(r"`([a-z_]+/[A-Za-z0-9_./-]+\.(?:py|md|yaml|txt|toml|sh|ini))`", "\n".join(lines)))
    named = {path for path in named if path.split("/", 1)[0] in tops}
    assert not sorted(path for path in named if not (ROOT / path).exists())


def test_every_fault_the_lab_offers_is_in_the_lab_page():
    from lab.site import FAULTS

    rows = markdown_table(text(DOCS / "lab.md"), "| fault | what the server does | target |")
    assert sorted(ticked(row[0])[0] for row in rows) == sorted(FAULTS)


def test_every_kind_apply_accepts_is_in_the_manifests_page_with_its_fields():
    from manifests.apply import BMH_SPEC, DYNAMIC_FIELDS, KINDS, NODE_TYPE_FIELDS, STATIC_FIELDS

    rows = markdown_table(text(DOCS / "manifests.md"), "| apiVersion | kind | spec fields |")
    documented = {(ticked(version)[0], ticked(kind)[0]) for version, kind, _fields in rows if ticked(version)}
    assert documented == KINDS
    fields = {ticked(kind)[0]: set(ticked(cell)) for _version, kind, cell in rows}
    assert fields["NodeType"] >= NODE_TYPE_FIELDS - {"name"}
    assert fields["BareMetalHost"] >= BMH_SPEC & {"bmc", "bootMACAddress", "online", "rootDeviceHints",
                                                   "automatedCleaningMode", "description"}
    assert fields["vcluster.yaml"] >= STATIC_FIELDS | DYNAMIC_FIELDS


def shown_invocations(body: str) -> list[tuple[str, str]]:
    """Each `manage.py COMMAND …` the page shows (in `code` or a code block), with what follows it on its line."""
    spans = [span.replace("\n", " ") for span in re.findall(r"`([^`]*manage\.py [^`]*)`", body)]
    spans += [line for line in body.splitlines() if "manage.py " in line and not line.lstrip().startswith("|")]
    shown = []
    for span in spans:
        for part in span.split("manage.py ")[1:]:
            name, _, rest = part.partition(" ")
            shown.append((name.strip("`),.;:"), rest.split("`")[0].split(" #")[0]))
    return shown


def parser_options(parser: argparse.ArgumentParser) -> set[str]:
    """The options a command takes, its sub-commands' (`token create`, `workload submit`) included."""
    options = set()
    for action in parser._actions:
        options.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                options |= parser_options(sub)
    return options


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_option_the_docs_give_a_manage_py_command_is_one_it_takes(page):
    from django.core.management import load_command_class

    commands = get_commands()
    unknown = []
    for name, rest in shown_invocations(text(page)):
        if name not in commands:
            continue  # the test above names it
        options = parser_options(load_command_class(commands[name], name).create_parser("manage.py", name))
        unknown += [f"{name} {flag}" for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest) if flag not in options]
    assert not sorted(set(unknown))


def test_the_layering_in_architecture_names_every_app_and_every_layer_of_the_contract():
    block = text(DOCS / "architecture.md").split("## The apps and the layering", 1)[1].split("```", 2)[1]
    named = {line.split()[0] for line in block.splitlines() if line.strip()} | set(re.findall(r"^\w+ : (\w+)", block,
                                                                                               flags=re.M))
    apps = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert not sorted(apps - named)
    contract = (ROOT / ".importlinter").read_text().split("[importlinter:contract:layers]", 1)[1].split("\n[", 1)[0]
    layers = contract.split("layers =", 1)[1].split()
    assert not sorted({layer for layer in layers if layer != ":"} - named)


def test_the_numeric_defaults_in_operations_are_the_ones_the_settings_give():
    source = "\n".join(path.read_text() for path in SETTINGS)
    defaults = dict(re.findall(r"""(?:environ\.get|env_float)\(\s*"([A-Z][A-Z0-9_]+)",\s*"?([0-9.]+)"?\)""", source))
    assert {"AGENT_LISTENER_THREADS", "POOL_MAX_NODES", "DRAIN_DEADLINE_S"} <= set(defaults)
    checked, wrong = 0, []
    for row in markdown_table_all(text(DOCS / "operations.md"), "| variable | default | what |"):
        names, default = ticked(row[0]), row[1]
        if len(names) == 1 and names[0] in defaults and re.fullmatch(r"[0-9.]+", default):
            checked += 1
            if float(default) != float(defaults[names[0]]):
                wrong.append(f"{names[0]}: {default}, not {defaults[names[0]]}")
    assert checked > 50  # the tables are read at all
    assert not wrong


def markdown_table_all(body: str, header: str) -> list[list[str]]:
    """The rows of every table whose header line is `header`."""
    rows, rest = [], body
    while f"\n{header}\n" in rest:
        rest = rest.split(f"\n{header}\n", 1)[1]
        rows += markdown_table(f"{header}\n{rest}", header)
    return rows
