"""The plugins rad-convert uses, found on the search path through the Registry (never imported by
name): the quantisers a recipe names, and the architectures whose import hooks say how a family's
checkpoints are read. No kernel library is loaded."""

from radiance.abi import KIND_FOLDERS, RAD_PLUGIN_ARCH, RAD_PLUGIN_QUANT
from radiance.engine.loading.registry import Registry

from .families import Family
from .quantizers import Quantizer


class Plugins:
    """by_name: {quantiser name: Quantizer}; families: the architectures with import hooks, in
    search-path order; refused: the quantiser plugins refused (for a recipe's errors)."""

    def __init__(self, radiance_home: str | None = None):
        self._registry = Registry(radiance_home, kernels="", kinds=(RAD_PLUGIN_ARCH, RAD_PLUGIN_QUANT))
        self.by_name = {name: Quantizer(info, plugin) for name, (info, plugin) in self._registry.quantizers.items()}
        self.refused = [str(refusal) for refusal in self._registry.refused
                        if KIND_FOLDERS[RAD_PLUGIN_QUANT] in refusal.path.parts]
        self.families = [Family(info, plugin) for plugin in self._registry.plugins[RAD_PLUGIN_ARCH]
                         for info in plugin.architectures if info.takes is not None]

    def close(self):
        self._registry.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
