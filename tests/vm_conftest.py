"""The VM artefacts (lab/vmimage.py: the agent ramdisk, its ISO, the OS image), built once per test session and
cached by content hash under VM_IMAGE_CACHE: what the tests that boot QEMU use."""
import shutil

import pytest

from lab import vmimage


@pytest.fixture(scope="session")
def images() -> vmimage.Build:
    if shutil.which("qemu-system-x86_64") is None:
        pytest.fail("qemu-system-x86_64 is not installed: .ci/run installs qemu-system-x86 (and ipxe-qemu)")
    result = vmimage.build(list(vmimage.TARGETS))
    print(f"vm images: built {result.built or 'nothing'}, reused {result.reused or 'nothing'} in "
          f"{result.seconds:.1f} s ({result.directory})")
    return result
