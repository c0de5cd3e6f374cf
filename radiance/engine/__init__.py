"""The engine core: homes, plugin loading, the op vocabulary and row selection."""
