"""REST API (DRF) for tenants, pools, NodeProviders, NodeTypes, NodeEnvironments and OS images."""
