"""The in-tree home: kernels/, architectures/ and quantizers/ beside this file. It is the last
entry of the search path and is loaded exactly as a third party's home would be: from the path,
by what its plugins declare. Nothing imports these plugins by name."""

from pathlib import Path

HOME = Path(__file__).resolve().parent
