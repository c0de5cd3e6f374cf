"""Loading: the search path's homes, each plugin loaded and checked on its own and then against the
others (the op vocabulary, the kernel hierarchy), and the model opened with the architecture that
serves it."""
