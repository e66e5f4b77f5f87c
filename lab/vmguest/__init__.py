"""What runs inside the lab's VM images (lab/vmimage.py copies these files in): /init, the DHCP client's script,
the agent's `reboot`, and the OS image's first boot (firstboot.py, importable here for its tests)."""
