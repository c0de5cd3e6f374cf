"""The structs of rad_encoding.h: an encoding is data, not an enum."""

from ._cstruct import CStr, I32, I64, Ptr, cstruct


@cstruct
class RadPlane:
    name: CStr
    dtype: I32
    kind: I32
    block_rows: I64
    block_cols: I64
    rows: I64
    cols: I64


@cstruct
class RadEncoding:
    scheme: CStr = "plain"
    transform: CStr
    vec: I32 = 1
    n_planes: I32
    planes: Ptr = ()

    def plane(self, name):
        """The plane of that name, or None."""
        for plane in self.planes:
            if plane.name == name:
                return plane
        return None
