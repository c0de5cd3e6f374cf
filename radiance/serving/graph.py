"""/graph, as the specification names it: the declared graph (the architecture's nodes, before
fusion and sharding) and which declarations the run phase issued: rank 0's resolved graph, one line
per node and band with its winning row, each with the number of steps that ran in its band; and
the same summed per op and band."""

from radiance.abi import RAD_EXTENT_SEQS, RAD_EXTENT_SLOTS, RAD_EXTENT_TOKENS, RAD_PLUGIN_ARCH

EXTENTS = {RAD_EXTENT_TOKENS: "tokens", RAD_EXTENT_SEQS: "seqs", RAD_EXTENT_SLOTS: "slots"}


def declared_nodes(graph) -> list[dict]:
    """The declared graph's nodes (a RadGraphDecl) as JSON."""
    return [{"index": index, "node": node.name, "op": node.op, "extent": EXTENTS.get(node.extent, str(node.extent)),
             "params": dict(node.params), "operands": list(node.operands), "split": node.split}
            for index, node in enumerate(graph.nodes)]


def open_declared(config) -> list[dict]:
    """The declared graph of config's model, for /graph whatever ranks run it: the architecture
    plugin declares it again here (no weight is read; no kernel library is opened, as the launching
    process's check before spawning opens none)."""
    from radiance.engine.loading.model import open_model
    from radiance.engine.loading.registry import Registry

    registry = Registry(config.radiance_home, kinds=(RAD_PLUGIN_ARCH,))
    try:
        model = open_model(config, registry)
        try:
            return declared_nodes(model.graph)
        finally:
            model.close()
    finally:
        registry.close()


def parse_line(line: str) -> dict:
    node, op, band, row = line.split("|")
    lo, hi = (int(value) for value in band.strip("[]").split(","))
    return {"node": node, "op": op, "band": [lo, hi], "row": row}


def graph_report(lines: list[str], declared: list[dict], shapes: dict, *, model: str, world: int,
                 digest: str | None) -> dict:
    extent_of = {node["node"]: node["extent"] for node in declared}
    issued, ops = [], {}
    for line in lines:
        entry = parse_line(line)
        names = entry["node"].split("+")
        extent = extent_of.get(names[0], "tokens")
        lo, hi = entry["band"]
        entry["extent"] = extent
        entry["steps"] = sum(count for (tokens, seqs), count in shapes.items()
                             if lo <= (seqs if extent == "seqs" else tokens) <= hi)
        if len(names) > 1:
            entry["replaces"] = names  # a fused row issued in place of this declared chain
        issued.append(entry)
        key = (entry["op"], lo, hi, entry["row"])
        summary = ops.setdefault(key, {"op": entry["op"], "band": [lo, hi], "row": entry["row"], "nodes": 0,
                                       "steps": entry["steps"]})
        summary["nodes"] += 1
    return {"model": model, "world": world, "digest": digest, "steps": sum(shapes.values()),
            "step_shapes": [{"tokens": tokens, "seqs": seqs, "steps": count}
                            for (tokens, seqs), count in sorted(shapes.items())],
            "declared": declared, "issued": issued, "ops": list(ops.values())}


def graph_text(report: dict) -> str:
    """The report as a person reads it: the op/band table, then every issued line."""
    out = [f"model {report['model']}  world {report['world']}  digest {report['digest']}  steps {report['steps']}",
           f"declared: {len(report['declared'])} nodes; issued: {len(report['issued'])} node bands", "",
           f"{'op':<28}{'band':<14}{'row':<44}{'nodes':>6}{'steps':>9}"]
    for op in report["ops"]:
        band = f"[{op['band'][0]}, {op['band'][1]}]"
        out.append(f"{op['op']:<28}{band:<14}{op['row']:<44}{op['nodes']:>6}{op['steps']:>9}")
    out += ["", "declared graph:"]
    out += [f"  {node['index']:>4} {node['node']:<36}{node['op']:<24}{node['extent']}" for node in report["declared"]]
    out += ["", "issued:"]
    for entry in report["issued"]:
        band = f"[{entry['band'][0]}, {entry['band'][1]}]"
        out.append(f"  {entry['node']:<44}{entry['op']:<28}{band:<14}{entry['row']:<44}{entry['steps']:>9}")
    return "\n".join(out) + "\n"
