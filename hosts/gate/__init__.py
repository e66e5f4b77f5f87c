"""The release gate: the disk census, the erase certificates, the cleaning policy and the health parsers."""
