"""The boot path: ramdisk boots and their races, the boot media, the OS images and the DHCP configuration."""
