"""Running: a resolved graph run step after step, behind one interface (executor.py) with one
implementation a domain: the host's (host.py) and a card's (device.py, with its memory and
stream); the rank's weights in the form each row reads, and the step inputs every step writes.
`open_executor` is the one place that chooses between them."""

from radiance.config import Config


def open_executor(graph, model, shard, buffers: dict, tables: dict, config: Config, link, peers, device):
    """The executor of the domain `graph` was resolved for: the card's when `device` is one, else
    the host's; each takes the rank's slice of the weights (radiance.engine.selection.shard) where
    it reads them: copied into this process, or mapped, to go to the card."""
    from .rank_weights import RankWeights

    sizes = (config.max_step_tokens, config.max_seqs, config.num_blocks * config.block_size, config.max_blocks)
    for resolution in graph.resolutions():  # init: after selection, before the weights load
        resolution.instantiate()
    if device is None:
        from .host import HostExecutor

        return HostExecutor(graph, buffers, tables, RankWeights(model, shard, link, load=True), *sizes, link, peers)
    from .device import DeviceExecutor

    return DeviceExecutor(graph, buffers, tables, RankWeights(model, shard, link, load=False), *sizes, link, peers,
                          device, graphs=config.graphs, chain=config.chain)
