"""The `taxes` command line."""
