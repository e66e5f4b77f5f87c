"""REST API (DRF) for tenants, pools, NodeProviders, NodeTypes, NodeEnvironments, OS images, tokens and apply;
`base` holds what every app's API shares."""
