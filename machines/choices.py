"""A machine's states and how its disks were dealt with at release."""
from core.choices import ColouredChoices


class MachineState(ColouredChoices):
    CREATING = "Creating", "Creating", "warning"  # asked of its provider, not yet running
    RUNNING = "Running", "Running", "success"
    STOPPED = "Stopped", "Stopped", "secondary"  # powered off on request
    FAILED = "Failed", "Failed", "danger"
    DELETING = "Deleting", "Deleting", "warning"  # release asked; waiting until every object made is gone
    GONE = "Gone", "Gone", "dark"


class DiskProof(ColouredChoices):
    """What proves a released machine's disks are not handed on: the console's own release gate (bare metal, an
    erase certificate), the machine's disks destroyed with it (a VM, a cloud VM), or the other cluster's cleaning."""
    CERTIFICATE = "certificate", "Erase certificate (release gate)", "success"
    DESTROYED = "destroyed", "Disks destroyed with the machine", "info"
    METAL3_CLEANING = "metal3-cleaning", "Cleaned by the Metal3 cluster (not verified here)", "warning"
    NONE = "none", "No cleaning (automatedCleaningMode: disabled)", "danger"
