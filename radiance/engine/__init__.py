"""The engine core, in three floors: `loading` (plugins from the search path and the model, checked),
`selection` (one rank's share of the graph and the row that runs each node, band by band, fused
where a library serves a chain) and `running` (that resolved graph run step after step, on the
host or on a card)."""
