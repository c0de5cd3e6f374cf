"""Import this first in a bench script meant for a machine where radiance is not installed (the
lent card machines): it maps the checkout's folders under `radiance.` as pyproject's package-dir
does, for this process and, through PYTHONPATH, for every process it starts."""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = f'''__path__ = [{str(ROOT / "radiance")!r}, {str(ROOT)!r}]  # radiance.<folder> -> the checkout's folders
exec(compile(open(__path__[0] + "/__init__.py").read(), __path__[0] + "/__init__.py", "exec"))
'''


def install_shim() -> str:
    folder = Path(tempfile.gettempdir()) / "radiance-shim" / "radiance"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text(SHIM)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder.parent)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    sys.path.insert(0, str(folder.parent))
    return str(folder.parent)


SHIM_PATH = install_shim()
