"""Selection: one rank's share of the declared graph (the TP plan applied), and for every node the
row that serves each band of its ranged extent, with the fused rows that replace a chain where
their library serves every link of it."""
