"""Whether a model drafts with its own multi-token-prediction heads (rad_arch.h, RAD_MTP_SUFFIX):
unless config.mtp is False (--no-mtp), where no --draft-model is given, and the model's family
declares heads that this model carries (the heads' architecture checks and declares from its
container: weights present, heads used). open_ranks then opens SpeculativeRanks over them."""

from radiance.abi import RAD_MTP_SUFFIX, RAD_PLUGIN_ARCH
from radiance.config import Config
from radiance.engine.loading.model import ModelError, open_model
from radiance.engine.loading.registry import Registry
from radiance.log import get_logger
from radiance.weights.container_reader import open_container

log = get_logger("radiance.speculative")
OPS = ("mtp_couple_propose", "mtp_couple_verify")


def mtp_heads(config: Config) -> str | None:
    """The architecture of the model's MTP heads where they draft, else None (a line in the log
    says why a model that carries them decodes without them)."""
    if config.mtp is False or config.draft_model is not None:
        return None
    with open_container(config.model) as container:
        name = container.architecture + RAD_MTP_SUFFIX
    # the architectures alone: a launching process loads no kernel library (tests/test_launch.py)
    # unless the heads run in it
    architectures = Registry(config.radiance_home, kinds=(RAD_PLUGIN_ARCH,))
    try:
        if name not in architectures.architectures:
            return None
        try:  # the heads' check first: a model without them is told apart before any plane is read
            open_model(config, architectures, name).close()
        except ModelError as error:
            log.debug("no MTP heads: %s", error)
            return None
    finally:
        architectures.close()
    if config.pp > 1:
        log.warning("%s carries MTP heads: not used with --pp %d (a verify step's logits come back from rank 0, "
                    "and with stages only the last stage has them)", config.model, config.pp)
        return None
    if config.micro_batches > 1:
        log.warning("%s carries MTP heads: not used with --micro-batches %d (the heads read the hidden state of "
                    "one part only)", config.model, config.micro_batches)
        return None
    registry = Registry(config.radiance_home, config.kernels)
    try:
        missing = [op for op in OPS if op not in registry.ops]
    finally:
        registry.close()
    if missing:
        log.warning("%s carries MTP heads, but no loaded kernel library declares op '%s' (plugins/spechub, "
                    "docs/PLUGINS.md): decoding without them", config.model, missing[0])
        return None
    return name
