"""See README.md in this directory."""
