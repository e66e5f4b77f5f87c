"""Who may call the console: API tokens (stored hashed), their authentication, and the service users
automation holds them for."""
