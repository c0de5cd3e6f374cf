"""The rank process: bind one card (or none), probe facts, execute the resolved graph."""
