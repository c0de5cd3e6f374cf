"""rad-convert --verify: every plane's size against what its encoding's geometry gives, and its
checksum against the bytes. The header itself is validated by opening (Container)."""

from radiance.weights.container_reader import Container
from radiance.weights.planes import plane_nbytes


def verify(path) -> list[str]:
    """One line per bad plane ("weight 'x' plane 'codes': ..."); empty when the file is sound.
    A header that cannot be read raises ContainerError."""
    problems = []
    with Container(path) as container:
        for weight in container.weights:
            shape = container.shape(weight)
            matrix = tuple(shape) if len(shape) == 2 else (1, shape[0])
            for plane in container.encoding(weight).planes:
                stored = container.plane_nbytes(weight, plane.name)
                try:
                    expected = plane_nbytes(plane, matrix)
                except ValueError as error:
                    problems.append(f"weight {weight!r} plane {plane.name!r}: {error}")
                    continue
                if stored != expected:
                    problems.append(f"weight {weight!r} plane {plane.name!r}: {stored} bytes, its encoding "
                                    f"over {list(shape)} gives {expected}")
        problems += [f"weight {weight!r} plane {plane!r}: checksum fails" for weight, plane in container.verify()]
    return problems
