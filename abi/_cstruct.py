"""One declaration, two faces: a dataclass for Python plugins and a ctypes layout for the C ABI.

A struct is declared once with annotated fields (`name: CStr`, `priority: I32`); `@cstruct` turns it
into a dataclass (every field defaulted, so plugins pass keywords) and attaches `.ctype`, the
ctypes.Structure with the C layout, which the mirror test compares with gcc's offsets.
A field `X` with a sibling `n_X` is an array: `n_X` is filled from `len(X)` when left at 0.
"""

import ctypes
import dataclasses
import typing
from typing import Annotated, Any, Callable

I32 = Annotated[int, ctypes.c_int32]
U32 = Annotated[int, ctypes.c_uint32]
I64 = Annotated[int, ctypes.c_int64]
U64 = Annotated[int, ctypes.c_uint64]
F64 = Annotated[float, ctypes.c_double]
CStr = Annotated[str, ctypes.c_char_p]
Ptr = Annotated[Any, ctypes.c_void_p]  # an object in Python, a pointer in C
Fn = Annotated[Callable | None, ctypes.c_void_p]


def Dims(ctype, n):
    return Annotated[tuple, ctype * n]


def Embedded(struct):
    """A struct held by value (a @cstruct class)."""
    return Annotated[Any, struct.ctype]


_DEFAULTS = {int: 0, float: 0.0, str: "", tuple: ()}


def cstruct(cls):
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = []
    for name, hint in hints.items():
        python_type, ctype = typing.get_args(hint)
        default = cls.__dict__.get(name, _DEFAULTS.get(python_type))
        fields.append((name, hint, dataclasses.field(default=default)))
        if name in cls.__dict__:
            delattr(cls, name)
    counted = [(name, "n_" + name) for name, _, _ in fields if "n_" + name in hints]
    own_post_init = cls.__dict__.get("__post_init__")

    def __post_init__(self):
        for seq, count in counted:
            value = getattr(self, seq)
            value = () if value is None else tuple(value) if isinstance(value, list) else value
            setattr(self, seq, value)
            if getattr(self, count) == 0:
                setattr(self, count, len(value))
        if own_post_init:
            own_post_init(self)

    for name, hint, field in fields:
        setattr(cls, name, field.default)
    cls.__post_init__ = __post_init__
    cls = dataclasses.dataclass(cls)
    cls.ctype = type(cls.__name__, (ctypes.Structure,),
                     {"_fields_": [(name, typing.get_args(hint)[1]) for name, hint, _ in fields]})
    return cls
