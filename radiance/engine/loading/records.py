"""The in-engine records of a loaded plugin. One loader turns a .py and a .so into these, so the
rest of the engine never knows which it was."""

import types
from dataclasses import dataclass, field
from pathlib import Path

from radiance.abi import RadArchInfo, RadKernelInfo, RadOpSchema, RadPluginInfo, RadQuantizerInfo

from .homes import Candidate


@dataclass(eq=False)
class Row:
    plugin: "Plugin"
    index: int  # declaration order inside the plugin
    info: RadKernelInfo
    reference: bool
    concurrent: bool
    collective: int  # 0, or colour 1 / 2
    chain: bool
    tolerance: float | None = None  # rad_kernel_tolerance: its own agreement with libref; None: its op's

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def op(self) -> str:
        return self.info.op

    def __repr__(self):
        return f"Row({self.plugin.name}:{self.name})"


@dataclass(eq=False)
class Plugin:
    candidate: Candidate
    info: RadPluginInfo
    module: object
    reference: bool = False
    schemas: list[RadOpSchema] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    quantizers: list[RadQuantizerInfo] = field(default_factory=list)
    architectures: list[RadArchInfo] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def path(self) -> Path:
        return self.candidate.path

    def export(self, symbol: str):
        """An optional export, resolved by exact name; None when absent."""
        value = getattr(self.module, symbol, None)
        return value if callable(value) else None

    def close(self) -> None:
        close = self.export("rad_plugin_close")
        if close:
            close()

    def unload(self) -> None:
        """Let go of the plugin's code: a .so is closed (dlclose); a module stays imported. Only for
        a plugin the engine will not use (declined, refused): nothing of it may run afterwards."""
        if not isinstance(self.module, types.ModuleType):
            self.module.unload()

    def __repr__(self):
        return f"Plugin({self.name} at {self.path})"


class PluginRefused(Exception):
    """A plugin the engine will not use: one line naming the file and the reason."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


class PluginDeclined(Exception):
    """rad_plugin_open returned RAD_E_UNSUPPORTED: this machine is not the plugin's."""

    def __init__(self, path):
        super().__init__(f"{path}: declined this machine (rad_plugin_open returned RAD_E_UNSUPPORTED)")
        self.path = Path(path)
