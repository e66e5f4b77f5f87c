"""The BMC: the Redfish client (no Django inside) and the one factory that makes a host's client."""
