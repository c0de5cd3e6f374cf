"""Reference collectives for a single rank. Across ranks they need the engine's peer buffers,
which the multi-process runtime provides; until then a world larger than one is refused."""

from radiance.abi import RAD_E_UNSUPPORTED, RAD_OK, RadArgs, rad_args_geti

from . import dense


def _world(a) -> int:
    return a.peers.world_size if a.peers is not None else 1


def all_reduce(a):
    return RAD_OK if _world(a) == 1 else RAD_E_UNSUPPORTED


def all_gather(a):
    if _world(a) != 1:
        return RAD_E_UNSUPPORTED
    x, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = x[:m]
    return RAD_OK


def all_reduce_add_rmsnorm(a):
    """The chain it replaces, row after row: all_reduce, add, rmsnorm."""
    x, residual, w, y = a.t
    for launch, operands in ((all_reduce, (x,)), (dense.add, (residual, x, residual)), (dense.rmsnorm, (residual, w, y))):
        status = launch(RadArgs(t=operands, params=a.params, peers=a.peers))
        if status != RAD_OK:
            return status
    return RAD_OK
