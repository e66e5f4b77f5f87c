"""The agent that runs on real servers carries no lab code: it imports nothing of the lab, and its code (docstrings
and comments aside) defines no lab hardware, names no lab fault and reads no lab setting. The lab supplies its
simulated servers through the agent's hardware interface (`--hardware MODULE:CALLABLE`), and that works."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import grimp

from agent.hardware import Hardware, HardwareError, LinuxHardware, load_hardware
from lab.hardware import LAB_HARDWARE, LabHardware
from lab.site import FAULTS

ROOT = Path(__file__).resolve().parents[1]
AGENT = ROOT / "agent"


def _words(identifier: str) -> set[str]:
    """`is_lab` → {"is", "lab"}; `LabHardware` → {"lab", "hardware"}; `labels` stays one word."""
    return {w.lower() for part in identifier.split("_") for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", part)}


def lab_code(source: str, filename: str = "<source>") -> list[str]:
    """What of the lab a module's code holds: identifiers with the word "lab", lab fault names and lab settings
    in its strings (docstrings excepted: saying what the lab does is not doing it)."""
    tree = ast.parse(source, filename)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.name, node.asname or ""]
        found += [f"{filename}:{node.lineno}: name {name}" for name in names if "lab" in _words(name)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            hits = [fault for fault in FAULTS if fault in text]
            hits += [word for word in ("lab:", "VMETAL_LAB", "lab.") if word in text]
            found += [f"{filename}:{node.lineno}: string {text[:60]!r} ({', '.join(hits)})" for _ in hits[:1]]
    return found


def test_the_scan_sees_lab_code():
    planted = '''
class LabHardware:
    is_lab = True

    def erase_fault(self, disk):
        """Docstrings may say erase-skips-region."""
        if disk.fault == "erase-skips-region":
            return os.environ["VMETAL_LAB_PROFILE"]


def load(spec):
    return spec.startswith("lab:")
'''
    found = lab_code(planted)
    assert any("name LabHardware" in f for f in found) and any("name is_lab" in f for f in found)
    assert any("'erase-skips-region'" in f for f in found) and any("VMETAL_LAB" in f for f in found)
    assert any("'lab:'" in f for f in found)
    assert not any(":6:" in f for f in found)  # the docstring
    assert lab_code("labels = node.labels\nAVAILABLE = 'label'\n") == []


def test_the_agent_defines_no_lab_hardware_names_no_lab_fault_and_reads_no_lab_setting():
    found = []
    for path in sorted(AGENT.rglob("*.py")):
        found += lab_code(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []


def test_the_agent_imports_nothing_of_the_lab():
    graph = grimp.build_graph("agent", "lab", include_external_packages=False, cache_dir=None)
    agent_modules = {m for m in graph.modules if m == "agent" or m.startswith("agent.")}
    assert not {(m, i) for m in agent_modules for i in graph.find_modules_directly_imported_by(m)
                if i == "lab" or i.startswith("lab.")}


def test_the_lab_supplies_its_hardware_through_the_agents_interface(tmp_path):
    profile = tmp_path / "hardware.json"
    profile.write_text(json.dumps({"system": {"serial": "LAB-1"}, "ram_mib": 1024,
                                   "nics": [{"name": "eth0", "mac": "52:54:00:00:00:01"}],
                                   "disks": [{"name": "nvme0n1", "path": "nvme0n1.img", "size_bytes": 1 << 20,
                                              "type": "nvme", "serial": "S1"}], "gpus": []}))
    hardware = load_hardware(LAB_HARDWARE, str(profile))
    assert isinstance(hardware, LabHardware) and isinstance(hardware, Hardware)
    assert [(d.name, d.size_bytes) for d in hardware.disks()] == [("nvme0n1", 1 << 20)]
    assert not hardware.reboots and LinuxHardware.reboots
    assert isinstance(load_hardware("linux"), LinuxHardware)
    for spec, said in (("lab:/x.json", "has no attribute"), ("lab.hardware:Nope", "Nope"),
                       ("json:loads", "gave dict, not a Hardware")):
        try:
            load_hardware(spec, "{}")
        except HardwareError as exc:
            assert said.lower() in str(exc).lower(), exc
        else:
            raise AssertionError(f"{spec} was accepted")
    proc = subprocess.run([sys.executable, "-m", "agent", "--print-inventory", "--hardware", LAB_HARDWARE,
                           "--hardware-arg", str(profile)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    inventory = json.loads(proc.stdout)
    assert inventory["system"]["serial"] == "LAB-1" and inventory["disks"][0]["serial"] == "S1"
