"""Command-line tools: rad-info, rad-schemas."""
