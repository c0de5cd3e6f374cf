"""A model as the engine sees it before any rank: the container, the architecture plugin that
serves it, its checked hyper-parameters and the declared graph of one step."""

from dataclasses import dataclass

from radiance.abi import RAD_MTP_SUFFIX, RadArchInfo, RadGraphDecl, RadWeightInfo
from radiance.config import Config
from radiance.weights.container_format import ContainerError
from radiance.weights.container_reader import Container, open_container
from radiance.weights.labels import format_label

from .registry import Registry


# Planes this small are checked against their checksums whenever a model is opened: the norms and
# the smallest scales, little in all, whose damage would not show as an error but as wrong text.
CHECKED_PLANE_BYTES = 16 << 10


class ModelError(ValueError):
    """The model cannot be served: one line naming the file and what is wrong."""


@dataclass
class Model:
    path: str
    container: Container
    architecture: RadArchInfo
    hyper: dict
    weights: dict  # name -> RadWeightInfo
    graph: RadGraphDecl

    def close(self) -> None:
        self.container.close()


def weight_infos(container: Container) -> dict:
    infos = {}
    for name in container.weights:
        shape = container.shape(name)
        rows, cols = (1, shape[0]) if len(shape) == 1 else shape
        infos[name] = RadWeightInfo(name=name, rows=rows, cols=cols, format=format_label(container.encoding(name)))
    return infos


def check_small_planes(container: Container) -> None:
    """ContainerError naming the first small plane whose bytes fail their checksum."""
    failed = container.verify(max_plane_bytes=CHECKED_PLANE_BYTES)
    if failed:
        more = f" (and {len(failed) - 1} more plane{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
        weight, plane = failed[0]
        raise ContainerError(f"{container.path}: weight {weight!r} plane {plane!r} fails its checksum{more}: the "
                             f"file is damaged ('rad-convert --verify {container.path}' checks every plane)")


def open_model(config: Config, registry: Registry, architecture: str | None = None, card: bool = False) -> Model:
    """Open, check and declare config.model, with what the engine decides (the activation dtype, the
    KV block size, the KV cache's type) added to what the container says. `architecture`: the one
    that declares the graph, where not the container's (its MTP heads: launch/mtp.py). `card`: the
    graph is for a card's rows (the cache's type follows: Config.kv_cache_type)."""
    path = config.model
    container = open_container(path)
    try:
        name = architecture or container.architecture
        entry = registry.architectures.get(name)
        if entry is None:
            # a family's MTP heads (rad_arch.h) serve no container of their own
            served = ", ".join(sorted(a for a in registry.architectures if not a.endswith(RAD_MTP_SUFFIX))) or "none"
            raise ModelError(f"{path}: architecture '{name}' is served by no plugin on the "
                             f"search path (served: {served})")
        architecture = entry[0]
        hyper = {**container.hyper, "activation_dtype": config.activation_dtype, "block_size": config.block_size,
                 "kv_cache_dtype": config.kv_cache_type(card)}
        reason = architecture.check(hyper)
        if reason:
            raise ModelError(f"{path}: {architecture.name}: {reason}")
        check_small_planes(container)
        weights = weight_infos(container)
        graph = architecture.declare(hyper, weights)
        if isinstance(graph, str):
            raise ModelError(f"{path}: {architecture.name}: {graph}")
        return Model(path, container, architecture, hyper, weights, graph)
    except BaseException:
        container.close()
        raise
